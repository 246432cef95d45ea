// traffic.cpp — the emulator's memory counters (emu.h, "memory traffic"): each warp's global
// memory requests and the 32-byte sectors they touch, its shared memory requests and the
// wavefronts its bank conflicts cost, per kernel launch.
//
// Where the accesses come from: code compiled with the Makefile's TRACE_FLAGS, clang's
// AddressSanitizer instrumentation whose callbacks are renamed to __kiln_trace_* (defined at the
// end of this file) and left to kiln, with no shadow memory and no runtime library: every load and
// store calls __kiln_trace_loadN/storeN(address) first, every memcpy __kiln_trace_memcpy. At -O0
// each access the source writes stays one access of its own width: a float4 is one 16-byte load,
// as on a GPU, where an optimizer would have split it into scalars.
//
// How they are counted. A callback made by a kernel thread (the scheduler has one running on this
// OS thread, and counting is on for the launch) classifies the address: inside the block's shared
// memory (dynamic or a static __shared__ array), inside a cudaMalloc allocation (global memory),
// or neither (the thread's stack, its parameters: not counted). It then finds the warp request the
// access belongs to: a GPU issues one instruction for the 32 lanes of a warp at a time, so lane l's
// n-th execution of the instruction at return address pc goes with every other lane's n-th
// execution of it — the key (warp, pc, load or store, n), n counted from the last barrier (which
// brings every thread of the block together again). When every thread of the block has arrived
// at a barrier, or the block ends, each request is whole and is counted:
//   global  sectors = the distinct 32-byte-aligned blocks the lanes' bytes fall in
//   shared  by phases: lanes of 1- to 4-byte accesses all in one, 8-byte ones by half-warps, 16-byte
//           ones by quarter-warps (each phase then asks for at most 128 bytes, 32 banks × 4 bytes).
//           A phase takes as many wavefronts as the busiest bank has distinct 4-byte words asked of
//           it (two lanes reading one word share it: a broadcast); ideal = the phases with lanes.
#include "traffic.h"

#include <algorithm>
#include <atomic>
#include <unordered_map>

namespace kiln::emu {
namespace {

std::atomic<bool> counting_on{false};
std::mutex log_mutex;
std::vector<LaunchTraffic>& traffic_log() {
    static std::vector<LaunchTraffic> log;
    return log;
}

enum class Space : unsigned char { Global, Shared };

// One warp instruction's accesses: lane l's, if bit l of `lanes` is set, at[l] for bytes[l].
struct Request {
    std::uint32_t lanes = 0;
    Space space = Space::Global;
    std::uintptr_t at[32];
    std::uint32_t bytes[32];
};

// The distinct values of v (sorted in place).
std::size_t distinct(std::vector<std::uintptr_t>& v) {
    std::sort(v.begin(), v.end());
    return std::size_t(std::unique(v.begin(), v.end()) - v.begin());
}

// The sectors (32 bytes) a request's lanes touch.
std::uint64_t sectors_of(const Request& r, std::vector<std::uintptr_t>& scratch) {
    scratch.clear();
    for (unsigned l = 0; l < 32; ++l)
        if ((r.lanes >> l) & 1u)
            for (std::uintptr_t s = r.at[l] >> 5; s <= (r.at[l] + r.bytes[l] - 1) >> 5; ++s) scratch.push_back(s);
    return distinct(scratch);
}

// The wavefronts a shared memory request takes, and how many it would take without conflicts:
// per phase, the distinct 4-byte words its lanes ask for, counted by bank (word % 32).
void wavefronts_of(const Request& r, std::vector<std::uintptr_t>& words, std::uint64_t* wavefronts,
                   std::uint64_t* ideal) {
    std::uint32_t widest = 0;
    for (unsigned l = 0; l < 32; ++l)
        if ((r.lanes >> l) & 1u) widest = std::max(widest, r.bytes[l]);
    const unsigned lanes_per_phase = widest <= 4 ? 32 : widest <= 8 ? 16 : 8;
    for (unsigned first = 0; first < 32; first += lanes_per_phase) {
        words.clear();
        for (unsigned l = first; l < first + lanes_per_phase; ++l)
            if ((r.lanes >> l) & 1u)
                for (std::uintptr_t w = r.at[l] >> 2; w <= (r.at[l] + r.bytes[l] - 1) >> 2; ++w) words.push_back(w);
        if (words.empty()) continue;
        unsigned per_bank[32] = {};
        const std::size_t n = distinct(words);
        for (std::size_t i = 0; i < n; ++i) per_bank[words[i] % 32]++;
        *wavefronts += *std::max_element(per_bank, per_bank + 32);
        *ideal += 1;
    }
}

// What this OS thread records for the block it runs. Each access instruction (its return address
// and whether it stores) gets a slot, numbered in order of first sight. Thread t's n-th execution
// of slot s since the last barrier belongs to request n of its warp's queue for s: a barrier
// brings all the block's threads together again, so counting restarts there.
struct Recorder {
    traffic::Counter* counter = nullptr;  // null: not counting
    std::vector<traffic::Span> shared;
    const std::vector<traffic::Span>* global = nullptr;
    LaunchTraffic counts;  // this block's, so far
    bool traced = false;

    struct Queue {
        std::vector<Request> requests;
    };
    std::unordered_map<std::uint64_t, std::uint32_t> slot_of;  // (pc, store) -> slot
    std::vector<bool> slot_stores;
    std::uint64_t last_key = ~0ull;                            // the last instruction seen, and its slot
    std::uint32_t last_slot = 0;
    std::vector<std::vector<std::uint32_t>> executions;        // [thread][slot]: times run
    std::vector<std::vector<Queue>> queues;                    // [warp][slot]
    std::vector<std::uintptr_t> scratch;                       // one request's sectors or words

    void begin(unsigned threads) {
        last_global = {0, 0};
        slot_of.clear();
        slot_stores.clear();
        last_key = ~0ull;
        executions.assign(threads, {});
        queues.assign((threads + 31) / 32, {});
        counts = LaunchTraffic{};
        traced = false;
    }

    // The space an address lies in, or false if it is neither shared nor global memory. Shared
    // memory first: a static __shared__ array is thread-local, and an OS thread's thread-local
    // block lies inside its stack's mapping; then the thread's own stack (most accesses of -O0
    // code), which holds no device memory, is ruled out before the search of the allocations.
    bool classify(std::uintptr_t at, Space* space) {
        for (const traffic::Span& s : shared)
            if (at - s.at < s.bytes) return *space = Space::Shared, true;
        if (at - traffic::running_stack_lo < traffic::running_stack_hi - traffic::running_stack_lo) return false;
        if (at - last_global.at < last_global.bytes) return *space = Space::Global, true;
        auto it = std::upper_bound(global->begin(), global->end(), at,
                                   [](std::uintptr_t a, const traffic::Span& s) { return a < s.at; });
        if (it == global->begin()) return false;
        --it;
        if (at - it->at >= it->bytes) return false;
        last_global = *it;
        *space = Space::Global;
        return true;
    }
    traffic::Span last_global{0, 0};  // the allocation the last global access was in

    std::uint32_t slot(std::uintptr_t pc, bool store) {
        const std::uint64_t key = std::uint64_t(pc) << 1 | std::uint64_t(store);
        if (key == last_key) return last_slot;
        auto [it, fresh] = slot_of.try_emplace(key, std::uint32_t(slot_of.size()));
        if (fresh) slot_stores.push_back(store);
        last_key = key, last_slot = it->second;
        return last_slot;
    }

    void record(std::uintptr_t at, std::size_t bytes, bool store, std::uintptr_t pc) {
        traced = true;
        Space space;
        if (bytes == 0 || !classify(at, &space)) return;
        const unsigned linear = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
        const std::uint32_t s = slot(pc, store);
        std::vector<std::uint32_t>& runs = executions[linear];
        if (runs.size() <= s) runs.resize(s + 1, 0);
        std::vector<Queue>& warp = queues[linear / 32];
        if (warp.size() <= s) warp.resize(s + 1);
        Queue& q = warp[s];
        const std::uint32_t nth = runs[s]++;
        if (nth >= q.requests.size()) q.requests.resize(nth + 1);
        Request& r = q.requests[nth];
        r.lanes |= 1u << (linear % 32);
        r.space = space;
        r.at[linear % 32] = at;
        r.bytes[linear % 32] = std::uint32_t(bytes);
    }

    void count(const Request& r, bool store) {
        AccessCounts& c = r.space == Space::Global ? (store ? counts.global_store : counts.global_load)
                                                   : (store ? counts.shared_store : counts.shared_load);
        c.requests++;
        for (unsigned l = 0; l < 32; ++l)
            if ((r.lanes >> l) & 1u) c.bytes += r.bytes[l];
        if (r.space == Space::Global) c.sectors += sectors_of(r, scratch);
        else wavefronts_of(r, scratch, &c.sectors, &c.ideal);
    }

    // At a barrier or the block's end: every request recorded so far is whole; count them.
    void flush() {
        for (std::vector<Queue>& warp : queues)
            for (std::size_t s = 0; s < warp.size(); ++s) {
                Queue& q = warp[s];
                for (const Request& r : q.requests)
                    if (r.lanes) count(r, slot_stores[s]);
                q.requests.clear();
            }
        for (std::vector<std::uint32_t>& runs : executions) std::fill(runs.begin(), runs.end(), 0);
    }
};

// This OS thread's recorder, and the one recording now (null: none): a plain pointer, so that
// the callbacks' test costs one load (a thread_local object with a constructor would go through
// its initialization guard at every access).
Recorder& own_recorder() {
    static thread_local Recorder r;
    return r;
}
__thread Recorder* recording = nullptr;

void add(AccessCounts& to, const AccessCounts& c) {
    to.requests += c.requests, to.sectors += c.sectors, to.ideal += c.ideal, to.bytes += c.bytes;
}

}  // namespace

void set_traffic(bool on) { counting_on = on; }
bool traffic_on() { return counting_on.load(); }

std::vector<LaunchTraffic> take_traffic() {
    std::lock_guard<std::mutex> lock(log_mutex);
    std::vector<LaunchTraffic> out;
    out.swap(traffic_log());
    return out;
}

namespace traffic {

__thread std::uintptr_t running_stack_lo = 0, running_stack_hi = 0;

Counter::Counter(const char* kernel, dim3 grid, dim3 block) : allocations_(device_allocations()) {
    totals_.kernel = kernel, totals_.grid = grid, totals_.block = block;
}

void Counter::begin_block(const std::vector<Span>& shared) {
    Recorder& r = own_recorder();
    r.counter = this;
    r.shared = shared;
    r.global = &allocations_;
    r.begin(totals_.block.x * totals_.block.y * totals_.block.z);
    recording = &r;
}

void Counter::barrier() {
    if (recording && recording->counter == this) recording->flush();
}

void Counter::end_block() {
    Recorder* r = recording;
    if (!r || r->counter != this) return;
    r->flush();
    r->counter = nullptr;
    recording = nullptr;
    std::lock_guard<std::mutex> lock(mutex_);
    add(totals_.global_load, r->counts.global_load);
    add(totals_.global_store, r->counts.global_store);
    add(totals_.shared_load, r->counts.shared_load);
    add(totals_.shared_store, r->counts.shared_store);
    totals_.traced = totals_.traced || r->traced;
}

void Counter::finish() {
    std::lock_guard<std::mutex> lock(log_mutex);
    traffic_log().push_back(totals_);
}

}  // namespace traffic

namespace {
// A traced access: counted when a kernel thread made it while this OS thread's block is counted.
inline void trace(const void* at, std::size_t bytes, bool store, const void* pc) {
    if (Recorder* r = recording)
        r->record(reinterpret_cast<std::uintptr_t>(at), bytes, store, reinterpret_cast<std::uintptr_t>(pc));
}
}  // namespace

}  // namespace kiln::emu

// --- the callbacks traced code calls ------------------------------------------------------------------
// clang -fsanitize=address -mllvm -asan-memory-access-callback-prefix=__kiln_trace_ (the Makefile's
// TRACE_FLAGS) calls these before each access; the return address is the access's instruction.
#define KILN_TRACE_ACCESS(n)                                                                         \
    extern "C" void __kiln_trace_load##n(std::uintptr_t p) {                                         \
        kiln::emu::trace(reinterpret_cast<const void*>(p), n, false, __builtin_return_address(0));   \
    }                                                                                                \
    extern "C" void __kiln_trace_store##n(std::uintptr_t p) {                                        \
        kiln::emu::trace(reinterpret_cast<const void*>(p), n, true, __builtin_return_address(0));    \
    }
KILN_TRACE_ACCESS(1)
KILN_TRACE_ACCESS(2)
KILN_TRACE_ACCESS(4)
KILN_TRACE_ACCESS(8)
KILN_TRACE_ACCESS(16)
#undef KILN_TRACE_ACCESS

extern "C" void __kiln_trace_loadN(std::uintptr_t p, std::size_t n) {
    kiln::emu::trace(reinterpret_cast<const void*>(p), n, false, __builtin_return_address(0));
}
extern "C" void __kiln_trace_storeN(std::uintptr_t p, std::size_t n) {
    kiln::emu::trace(reinterpret_cast<const void*>(p), n, true, __builtin_return_address(0));
}
// A struct copied whole (a float4) is a memcpy at -O0: one load of its width and one store.
extern "C" void* __kiln_trace_memcpy(void* dst, const void* src, std::size_t n) {
    kiln::emu::trace(src, n, false, __builtin_return_address(0));
    kiln::emu::trace(dst, n, true, __builtin_return_address(0));
    return std::memcpy(dst, src, n);
}
extern "C" void* __kiln_trace_memmove(void* dst, const void* src, std::size_t n) {
    kiln::emu::trace(src, n, false, __builtin_return_address(0));
    kiln::emu::trace(dst, n, true, __builtin_return_address(0));
    return std::memmove(dst, src, n);
}
extern "C" void* __kiln_trace_memset(void* dst, int value, std::size_t n) {
    kiln::emu::trace(dst, n, true, __builtin_return_address(0));
    return std::memset(dst, value, n);
}

// Traced objects also call AddressSanitizer's own entry points: its start-up (a constructor), a
// version check and the hook before a function that does not return (a throw). Under make SAN=1
// the real AddressSanitizer provides them; otherwise they have nothing to do.
// (g++ says so by __SANITIZE_ADDRESS__, clang by __has_feature(address_sanitizer).)
#if defined(__SANITIZE_ADDRESS__)
#define KILN_REAL_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KILN_REAL_ASAN 1
#endif
#endif
#if !defined(KILN_REAL_ASAN)
extern "C" void __asan_init() {}
extern "C" void __asan_version_mismatch_check_v8() {}
extern "C" void __asan_handle_no_return() {}
#endif
