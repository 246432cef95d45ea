// emu.cpp — the kernel emulator's scheduler: launches, blocks, barriers and warp collectives.
//
// A launch checks its shape as CUDA does, then runs the grid's blocks on OpenMP threads. Each
// OS thread owns a Worker: the emulated threads of its current block, their fiber stacks
// (kept from launch to launch) and the block's barrier and warp state.
//
// Running a block:
//   1. Direct: each thread, in schedule order, is a plain call on the OS thread's stack. A
//      kernel without barriers or warp collectives never leaves this step, so it costs a
//      function call per thread.
//   2. When a thread calls __syncthreads() or a warp collective, it cannot return before the
//      other threads arrive. It records its arrival and runs the rest of the block itself:
//      the threads not started yet become fibers (run_rounds), each runs until it arrives at
//      a barrier or exits, and once the barrier is complete the waiting thread returns.
//   3. Whatever is still suspended when the direct threads are done runs in rounds: every
//      ready fiber, in schedule order, runs to its next barrier or to its end.
// Under the shuffled schedule every thread is a fiber from the start and each round has a new
// order, drawn from the seed and the block index (the same whatever the thread count).
//
// Checks (README.md): shared memory, dynamic and the kernel's static __shared__ arrays (found by
// symbols.h), is poisoned with NaN bytes at the start of every block; with the race detector on,
// the words each stretch of a thread changed are recorded until the next barrier, and a second
// thread changing one is a write-write race.
//
// With memory counting on (emu.h "memory traffic", traffic.cpp), the block's shared memory is
// handed to the launch's counter at its start, and every barrier and the block's end close the
// warps' requests recorded so far.
//
// A round in which nothing can run while threads wait is a deadlock: a thread exited while
// others wait at a barrier, or a warp collective's mask names a lane that never comes. The
// block stops, its waiting fibers are abandoned (no exception crosses a fiber; a thread that
// finds an error, and the direct thread, unwind on their own stacks), and the launch fails with
// cudaErrorLaunchFailure and a message naming the kernel, block and threads.
#include <omp.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "emu.h"
#include "fiber.h"
#include "symbols.h"
#include "traffic.h"

// The built-in variables: per OS thread, rewritten before each emulated thread runs.
__thread uint3 threadIdx;
__thread uint3 blockIdx;
__thread dim3 blockDim;
__thread dim3 gridDim;

namespace kiln::emu {

// --- schedule ------------------------------------------------------------------------------------
namespace {

struct ScheduleConfig {
    std::atomic<int> schedule{static_cast<int>(Schedule::InOrder)};
    std::atomic<std::uint64_t> seed{1};
    std::atomic<bool> racecheck{false};
};

ScheduleConfig& schedule_config() {
    static ScheduleConfig* config = [] {
        auto* c = new ScheduleConfig;
        if (const char* s = std::getenv("KILN_EMU_SCHEDULE"); s && *s) {
            const std::string v = s;
            if (v == "inorder") c->schedule = static_cast<int>(Schedule::InOrder);
            else if (v == "reverse") c->schedule = static_cast<int>(Schedule::Reverse);
            else if (v == "shuffle") c->schedule = static_cast<int>(Schedule::Shuffle);
            else KILN_FAIL("KILN_EMU_SCHEDULE='", v, "' is not one of inorder, reverse, shuffle");
        }
        if (const char* s = std::getenv("KILN_EMU_SEED"); s && *s) c->seed = std::strtoull(s, nullptr, 0);
        if (const char* s = std::getenv("KILN_EMU_RACECHECK"); s && *s) c->racecheck = std::string(s) != "0";
        return c;
    }();
    return *config;
}

}  // namespace

void set_schedule(Schedule s, std::uint64_t seed) {
    schedule_config().schedule = static_cast<int>(s);
    schedule_config().seed = seed;
}
void set_racecheck(bool on) { schedule_config().racecheck = on; }
bool racecheck() { return schedule_config().racecheck.load(); }
__thread bool racecheck_running = false;

Schedule schedule() { return static_cast<Schedule>(schedule_config().schedule.load()); }
std::uint64_t schedule_seed() { return schedule_config().seed.load(); }
const char* schedule_name(Schedule s) {
    switch (s) {
    case Schedule::InOrder: return "inorder";
    case Schedule::Reverse: return "reverse";
    case Schedule::Shuffle: return "shuffle";
    }
    return "?";
}

const char* warp_op_name(WarpOp op) {
    static const char* const names[] = {
        "__syncwarp", "__shfl_sync", "__shfl_up_sync", "__shfl_down_sync", "__shfl_xor_sync",
        "__ballot_sync", "__any_sync", "__all_sync", "__reduce_add_sync", "__reduce_min_sync",
        "__reduce_max_sync", "__reduce_min_sync", "__reduce_max_sync", "__reduce_and_sync",
        "__reduce_or_sync", "__reduce_xor_sync", "__match_any_sync", "a warp call"};
    return names[static_cast<int>(op)];
}

// --- per-kernel dynamic shared memory limit (cudaFuncSetAttribute) --------------------------------
namespace {

constexpr std::size_t kDefaultSharedLimit = 48 * 1024;  // CUDA's limit without an opt-in
constexpr std::size_t kMaxSharedOptIn = 227 * 1024;     // sm_90's largest opt-in

std::mutex& shared_limits_mutex() {
    static std::mutex m;
    return m;
}
std::map<const void*, std::size_t>& shared_limits() {
    static std::map<const void*, std::size_t> m;
    return m;
}
std::size_t shared_limit(const void* kernel) {
    std::lock_guard<std::mutex> lock(shared_limits_mutex());
    auto it = shared_limits().find(kernel);
    return it == shared_limits().end() ? kDefaultSharedLimit : it->second;
}

}  // namespace
}  // namespace kiln::emu

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
    using namespace kiln::emu;
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize)
        return cudaSuccess;  // the other attributes (carveout, ...) change nothing on a CPU
    if (value < 0 || static_cast<std::size_t>(value) > kMaxSharedOptIn)
        return set_error(cudaErrorInvalidValue,
                         "cudaFuncSetAttribute: " + std::to_string(value) +
                             " bytes of dynamic shared memory; the most a block can have is " +
                             std::to_string(kMaxSharedOptIn));
    std::lock_guard<std::mutex> lock(shared_limits_mutex());
    shared_limits()[func] = static_cast<std::size_t>(value);
    return cudaSuccess;
}

namespace kiln::emu {
namespace {

// --- one launch ------------------------------------------------------------------------------------
// An allocation the kernel may write (a pointer argument points into it), which the race detector
// compares before and after each block: per byte, the block that changed it since the launch began.
struct GlobalRegion {
    unsigned char* at;
    std::size_t bytes;
    int arg;                            // the first argument that points into it, from 0
    std::vector<unsigned char> before;  // as the running block found it
    std::vector<std::uint64_t> writer;  // 1 + the block (linear index) that changed it, or 0
    std::vector<unsigned char> atomic;  // touched by an atomic: not a race
};

struct LaunchState {
    const char* name;
    dim3 grid, block;
    std::size_t shared;
    const std::vector<StaticShared>* static_shared;  // the kernel's __shared__ arrays
    ThreadFn run_thread;
    const void* args;
    std::uint64_t id;
    unsigned nthreads;
    Schedule schedule;
    std::uint64_t seed;
    bool racecheck;
    std::vector<GlobalRegion> global;  // with the race detector on: the memory it may write
    traffic::Counter* traffic = nullptr;  // with counting on (emu.h "memory traffic")

    std::atomic<bool> failed{false};
    std::mutex mutex;
    std::string message;  // the first failure

    void fail(const std::string& why) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!failed.exchange(true)) message = why;
    }
};

std::string dim_str(dim3 d) {
    std::ostringstream os;
    os << "(" << d.x << ", " << d.y << ", " << d.z << ")";
    return os.str();
}
std::string dim_str(uint3 d) { return dim_str(dim3(d)); }

// Block b of the grid, counted x fastest.
uint3 block_of(dim3 grid, std::uint64_t b) {
    return uint3{static_cast<unsigned>(b % grid.x), static_cast<unsigned>((b / grid.x) % grid.y),
                 static_cast<unsigned>(b / (std::uint64_t(grid.x) * grid.y))};
}
std::string hex(unsigned v) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "0x%08x", v);
    return buf;
}

std::atomic<std::uint64_t> warp_call_count{0};  // WarpCalls run, all launches

// --- the emulated threads of a block ------------------------------------------------------------
enum class State : unsigned char { NotStarted, Running, Ready, AtBarrier, AtWarp, Exited };

struct Thread {
    Context ctx;
    void* asan_fake = nullptr;  // ASan's fake stack while suspended
    uint3 tid{};
    unsigned linear = 0;        // x + y * block.x + z * block.x * block.y; lane = linear % 32
    State state = State::NotStarted;
    bool direct = false;        // running as a plain call on the OS thread's stack
    // the collective it waits in
    BarrierOp barrier_op{};
    WarpOp op{};
    unsigned mask = 0;
    int arg = 0;
    int width = 32;
    std::uint64_t value = 0;
    std::uint64_t result = 0;
};

// A stretch of shared memory the checks cover: the dynamic shared memory or one static
// __shared__ array. The race detector numbers the bytes of all regions one after the other:
// this one's are first, first + 1, ..., first + bytes - 1.
struct SharedRegion {
    unsigned char* at;
    std::size_t bytes;
    std::size_t first;
    const StaticShared* array;  // nullptr for the dynamic shared memory
};

// Whether the n <= 8 bytes at a and b are equal: one 64-bit compare for a full run, so that an
// unchanged region costs a load and a compare per 8 bytes.
inline bool same_run(const unsigned char* a, const unsigned char* b, std::size_t n) {
    if (n < 8) return std::memcmp(a, b, n) == 0;
    std::uint64_t x, y;
    std::memcpy(&x, a, 8);
    std::memcpy(&y, b, 8);
    return x == y;
}

std::string region_name(const SharedRegion& r) {
    return r.array ? "__shared__ array " + r.array->name : "dynamic shared memory";
}

struct Warp {
    unsigned exists = 0;   // lanes the block has (the last warp may be partial)
    unsigned arrived = 0;  // lanes waiting in a collective
    unsigned exited = 0;
};

// Thrown to unwind a thread's kernel frames when its block fails, always on the stack it runs on
// (the OS thread's for the direct thread, its fiber's otherwise); caught in Worker::run_direct
// or Worker::fiber_main.
struct BlockAbort {};

void fiber_entry();

class Worker;
__thread Worker* tls_worker = nullptr;

#define KILN_EMU_INLINE inline __attribute__((always_inline))

class Worker {
public:
    ~Worker() {
        for (Stack& s : stacks_) free_stack(s);
        std::free(shared_);
    }

    bool run_block(LaunchState& L, std::uint64_t b);
    KILN_EMU_INLINE int barrier(BarrierOp op, int predicate);
    KILN_EMU_INLINE std::uint64_t warp(WarpOp op, unsigned mask, std::uint64_t value, int arg, int width);
    unsigned active_mask() const;
    void* shared() const { return shared_; }
    void note_atomic(const void* address, std::size_t bytes);
    void fiber_main();
    Thread* current() const { return current_; }

private:
    void prepare(LaunchState& L);
    void find_regions(const LaunchState& L);
    void begin_block(std::uint64_t b);
    bool run_direct(Thread& t);
    bool run_rounds(Thread* g);
    KILN_EMU_INLINE void resume(Thread& t);
    KILN_EMU_INLINE void suspend(Thread& t);
    KILN_EMU_INLINE void wait(Thread& t);
    KILN_EMU_INLINE void enter(Thread& t);
    void exit_thread(Thread& t);
    [[noreturn]] void abort_thread(Thread& t, const std::string& why);
    void fail(const std::string& why);
    void release_block();
    void release_warp(Thread& t);
    std::uint64_t lane_result(const Thread* lanes, unsigned lane, const Thread& t) const;
    std::string deadlock_message() const;
    std::string waiting_in(const Thread& t) const;
    void check_same_call(Thread& t, const Thread& u);
    KILN_EMU_INLINE void end_stretch(Thread& t);
    void snapshot_shared();
    void check_writes(const Thread& t);
    void forget_writers(unsigned lanes_of_warp, unsigned mask);
    unsigned order_index(unsigned k) const;
    void shuffle_order();

    friend void fiber_entry();

    LaunchState* launch_ = nullptr;
    std::uint64_t prepared_id_ = 0;
    unsigned n_ = 0;
    std::vector<Thread> threads_;
    std::vector<Stack> stacks_;
    std::vector<Warp> warps_;
    bool stacks_dirty_ = false;  // a failed block abandoned frames on them (ASan shadow)
    void* shared_ = nullptr;     // dynamic shared memory
    std::vector<SharedRegion> regions_;  // dynamic shared memory, then the static arrays
    std::size_t shared_bytes_ = 0;       // in all regions

    Thread* current_ = nullptr;
    Context os_ctx_;
    void* os_fake_ = nullptr;
    const void* os_bottom_ = nullptr;
    std::size_t os_size_ = 0;
    std::uintptr_t os_stack_lo_ = 0, os_stack_hi_ = 0;  // this OS thread's stack (the direct threads')

    unsigned live_ = 0;  // threads not exited
    unsigned at_barrier_ = 0;
    int acc_count_ = 0, acc_and_ = 1, acc_or_ = 0;  // __syncthreads_count/and/or, accumulating
    int res_count_ = 0, res_and_ = 1, res_or_ = 0;  // ... and of the barrier just released

    bool failed_ = false;
    std::string why_;

    std::vector<unsigned> order_;  // the shuffled schedule's order of this round
    std::uint64_t rng_ = 0;

    // The race detector, per byte of shared memory since the last barrier (bytes, not words: two
    // threads may write the two halves of a word of f16 values).
    std::vector<unsigned char> before_;  // shared memory as the running thread found it
    std::vector<std::int16_t> writer_;   // the thread (linear index, < 1024) that wrote it, or -1
    std::vector<unsigned char> atomic_;  // touched by an atomic: not a race
    std::string race_;                   // the first race found in this block
};

// Stacks lie a multiple of the page size apart, so their tops would all map to the same few
// L1 cache sets and evict each other at every switch; a different offset per thread
// ("cache colouring") spreads the hot top frames over the cache.
Stack colored(const Stack& s, unsigned i) {
    const std::size_t offset = (i % 64) * 64 + (i / 64 % 4) * 4096;
    return Stack{s.lo, s.size - offset};
}

Worker& worker() {
    static thread_local Worker w;
    tls_worker = &w;
    return w;
}

Worker& running_worker(const char* what) {
    if (!tls_worker || !tls_worker->current()) {
        std::fprintf(stderr, "kiln emu: %s called outside a kernel\n", what);
        std::abort();
    }
    return *tls_worker;
}

std::string thread_name(const Thread& t) { return "thread " + dim_str(t.tid); }

// What a thread waiting in a warp collective called: a WarpCall names itself.
const WarpCall& call_of(const Thread& t) { return *reinterpret_cast<const WarpCall*>(t.value); }
std::string op_name(const Thread& t) { return t.op == WarpOp::Call ? call_of(t).name : warp_op_name(t.op); }

// --- set-up ------------------------------------------------------------------------------------------
void Worker::prepare(LaunchState& L) {
    launch_ = &L;
    if (os_stack_hi_ == 0) {
        pthread_attr_t attr;
        void* lo = nullptr;
        std::size_t size = 0;
        if (pthread_getattr_np(pthread_self(), &attr) == 0) {
            pthread_attr_getstack(&attr, &lo, &size);
            pthread_attr_destroy(&attr);
        }
        os_stack_lo_ = reinterpret_cast<std::uintptr_t>(lo), os_stack_hi_ = os_stack_lo_ + size;
    }
    if (prepared_id_ == L.id) return;
    prepared_id_ = L.id;
    n_ = L.nthreads;
    if (threads_.size() < n_) threads_.resize(n_);
    for (unsigned i = 0; i < n_; ++i) {
        Thread& t = threads_[i];
        t.linear = i;
        t.tid = uint3{i % L.block.x, (i / L.block.x) % L.block.y, i / (L.block.x * L.block.y)};
    }
    warps_.assign((n_ + 31) / 32, Warp{});
    for (unsigned w = 0; w < warps_.size(); ++w) {
        const unsigned lanes = std::min(32u, n_ - 32 * w);
        warps_[w].exists = lanes == 32 ? ~0u : (1u << lanes) - 1;
    }
    while (stacks_.size() < n_) stacks_.push_back(make_stack(fiber_stack_size()));
    std::free(shared_);
    shared_ = nullptr;
    if (L.shared > 0) {
        if (posix_memalign(&shared_, 64, L.shared) != 0) {
            std::fprintf(stderr, "kiln emu: cannot allocate %zu bytes of shared memory\n", L.shared);
            std::abort();
        }
    }
    order_.resize(n_);
    find_regions(L);
    if (L.racecheck) before_.resize(shared_bytes_);
}

// The static arrays live in this OS thread's copy of the thread-local variables, at their
// distance from its threadIdx.
void Worker::find_regions(const LaunchState& L) {
    regions_.clear();
    shared_bytes_ = 0;
    auto add = [this](void* at, std::size_t bytes, const StaticShared* array) {
        regions_.push_back({static_cast<unsigned char*>(at), bytes, shared_bytes_, array});
        shared_bytes_ += bytes;
    };
    if (L.shared > 0) add(shared_, L.shared, nullptr);
    for (const StaticShared& a : *L.static_shared)
        add(reinterpret_cast<char*>(&threadIdx) + a.from_thread_idx, a.bytes, &a);
}

void Worker::begin_block(std::uint64_t b) {
    const LaunchState& L = *launch_;
    blockIdx = block_of(L.grid, b);
    blockDim = L.block;
    gridDim = L.grid;
    for (unsigned i = 0; i < n_; ++i) {
        threads_[i].state = State::NotStarted;
        threads_[i].direct = false;
        threads_[i].asan_fake = nullptr;
    }
    for (Warp& w : warps_) w.arrived = w.exited = 0;
    live_ = n_;
    at_barrier_ = 0;
    acc_count_ = 0, acc_and_ = 1, acc_or_ = 0;
    failed_ = false;
    why_.clear();
    current_ = nullptr;
    if (stacks_dirty_) {
        for (const Stack& s : stacks_) asan_unpoison(s);
        stacks_dirty_ = false;
    }
    // Poison: every block starts with shared memory as unwritten as on a GPU (NaN bytes), so
    // neither a read of a word no thread wrote nor the previous block's stale data can look right.
    for (const SharedRegion& r : regions_) std::memset(r.at, kPoisonByte, r.bytes);
    if (L.traffic) {
        std::vector<traffic::Span> shared;
        for (const SharedRegion& r : regions_) shared.push_back({reinterpret_cast<std::uintptr_t>(r.at), r.bytes});
        L.traffic->begin_block(shared);
    }
    racecheck_running = L.racecheck && (shared_bytes_ > 0 || !L.global.empty());
    race_.clear();
    if (racecheck_running) {
        writer_.assign(shared_bytes_, -1);
        atomic_.assign(shared_bytes_, 0);
        snapshot_shared();
    }
    if (L.schedule == Schedule::Shuffle) {
        for (unsigned i = 0; i < n_; ++i) order_[i] = i;
        rng_ = L.seed * 0x9E3779B97F4A7C15ull + b + 1;
    }
}

// --- running a block -------------------------------------------------------------------------------
bool Worker::run_block(LaunchState& L, std::uint64_t b) {
    prepare(L);
    begin_block(b);
    bool ok = true;
    if (L.schedule != Schedule::Shuffle) {
        for (unsigned k = 0; k < n_ && ok; ++k) {
            Thread& t = threads_[order_index(k)];
            if (t.state == State::NotStarted) ok = run_direct(t);
        }
    }
    if (ok && live_ > 0) ok = run_rounds(nullptr);
    if (L.traffic) L.traffic->end_block();
    current_ = nullptr;
    racecheck_running = false;
    if (ok && !race_.empty()) ok = false, why_ = race_;
    if (!ok) {
        stacks_dirty_ = true;
        L.fail("kernel " + std::string(L.name) + " <<<grid " + dim_str(L.grid) + ", block " +
               dim_str(L.block) + ">>>, block " + dim_str(blockIdx) + ": " + why_);
    }
    return ok;
}

unsigned Worker::order_index(unsigned k) const {
    switch (launch_->schedule) {
    case Schedule::InOrder: return k;
    case Schedule::Reverse: return n_ - 1 - k;
    case Schedule::Shuffle: return order_[k];
    }
    return k;
}

// Fisher-Yates with splitmix64: a fresh order for every round.
void Worker::shuffle_order() {
    for (unsigned i = n_; i > 1; --i) {
        std::uint64_t z = (rng_ += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        std::swap(order_[i - 1], order_[z % i]);
    }
}

// A thread runs in stretches: from enter() to its next barrier, collective or exit.
KILN_EMU_INLINE void Worker::enter(Thread& t) {
    current_ = &t;
    threadIdx = t.tid;
    t.state = State::Running;
    if (t.direct) {
        traffic::running_stack_lo = os_stack_lo_, traffic::running_stack_hi = os_stack_hi_;
    } else {
        const Stack& s = stacks_[t.linear];
        traffic::running_stack_lo = reinterpret_cast<std::uintptr_t>(s.lo);
        traffic::running_stack_hi = reinterpret_cast<std::uintptr_t>(s.lo) + s.size;
    }
}

KILN_EMU_INLINE void Worker::end_stretch(Thread& t) {
    if (racecheck_running) check_writes(t);
}

// --- the race detector -----------------------------------------------------------------------------
// The race detector's copy of shared memory, as the next stretch finds it. Only the scheduler
// writes shared memory between stretches: the poison, and a WarpCall (a wmma fragment stored).
void Worker::snapshot_shared() {
    for (const SharedRegion& r : regions_) std::memcpy(&before_[r.first], r.at, r.bytes);
}

// The bytes this stretch changed were written by t; one another thread wrote since the last
// barrier is a write-write race (unless an atomic touched it). Unchanged 8-byte runs are
// skipped; changed bytes are copied, so the copy is again what the next stretch finds.
void Worker::check_writes(const Thread& t) {
    for (const SharedRegion& r : regions_) {
        unsigned char* before = &before_[r.first];
        for (std::size_t run = 0; run < r.bytes; run += 8) {
            const std::size_t end = std::min(run + 8, r.bytes);
            if (same_run(r.at + run, before + run, end - run)) continue;
            for (std::size_t at = run; at < end; ++at) {
                const std::size_t b = r.first + at;
                if (r.at[at] == before[at]) continue;
                before[at] = r.at[at];
                if (atomic_[b]) continue;
                if (writer_[b] >= 0 && writer_[b] != static_cast<int>(t.linear) && race_.empty())
                    race_ = "race in " + region_name(r) + ": " + thread_name(threads_[writer_[b]]) + " and " + thread_name(t) +
                            " both write at byte offset " + std::to_string(at) +
                            " between two barriers, not through an atomic (add a __syncthreads() between the "
                            "writes, or leave the word to one thread)";
                writer_[b] = static_cast<std::int16_t>(t.linear);
            }
        }
    }
}

void Worker::note_atomic(const void* address, std::size_t bytes) {
    const auto* a = static_cast<const unsigned char*>(address);
    for (const SharedRegion& r : regions_)
        if (a >= r.at && a + bytes <= r.at + r.bytes) std::fill_n(&atomic_[r.first + std::size_t(a - r.at)], bytes, 1);
    for (GlobalRegion& r : launch_->global)
        if (a >= r.at && a + bytes <= r.at + r.bytes) std::fill_n(&r.atomic[std::size_t(a - r.at)], bytes, 1);
}

// A warp collective orders its lanes: their earlier writes no longer race with later ones.
void Worker::forget_writers(unsigned first_lane, unsigned mask) {
    for (std::int16_t& w : writer_)
        if (w >= static_cast<int>(first_lane) && w < static_cast<int>(first_lane + 32) &&
            ((mask >> (w - first_lane)) & 1u))
            w = -1;
}

void Worker::exit_thread(Thread& t) {
    end_stretch(t);
    t.state = State::Exited;
    t.direct = false;
    --live_;
    warps_[t.linear / 32].exited |= 1u << (t.linear % 32);
}

void Worker::fail(const std::string& why) {
    if (!failed_) why_ = why;
    failed_ = true;
}

bool Worker::run_direct(Thread& t) {
    t.direct = true;
    enter(t);
    try {
        launch_->run_thread(launch_->args);
    } catch (const BlockAbort&) {
        return false;
    } catch (const std::exception& e) {
        fail(thread_name(t) + " threw an exception: " + e.what());
        return false;
    } catch (...) {
        fail(thread_name(t) + " threw an exception");
        return false;
    }
    exit_thread(t);
    return true;
}

// Runs the ready fibers in rounds, in schedule order. g: the direct thread that waits (the
// rounds end when it is released), or nullptr (they end when every thread has exited).
bool Worker::run_rounds(Thread* g) {
    for (;;) {
        if (launch_->schedule == Schedule::Shuffle) shuffle_order();
        bool progress = false;
        for (unsigned k = 0; k < n_; ++k) {
            Thread& t = threads_[order_index(k)];
            if (&t == g || (t.state != State::Ready && t.state != State::NotStarted)) continue;
            resume(t);
            progress = true;
            if (failed_) return false;
            if (g && g->state == State::Ready) return true;
        }
        if (g ? g->state == State::Ready : live_ == 0) return true;
        if (!progress) {
            fail(deadlock_message());
            return false;
        }
    }
}

KILN_EMU_INLINE void Worker::resume(Thread& t) {
    const Stack& s = stacks_[t.linear];
    if (t.state == State::NotStarted) context_start(t.ctx, colored(s, t.linear), &fiber_entry);
    enter(t);
    asan_start_switch(&os_fake_, s.lo, s.size);
    context_switch(os_ctx_, t.ctx);
    asan_finish_switch(os_fake_, nullptr, nullptr);
}

KILN_EMU_INLINE void Worker::suspend(Thread& t) {
    asan_start_switch(&t.asan_fake, os_bottom_, os_size_);
    context_switch(t.ctx, os_ctx_);
    asan_finish_switch(t.asan_fake, nullptr, nullptr);
}

// After arriving at a barrier or collective: continue once it is released.
KILN_EMU_INLINE void Worker::wait(Thread& t) {
    if (t.direct) {
        if (t.state != State::Ready && !run_rounds(&t)) throw BlockAbort{};
        enter(t);  // the rounds ran other threads
    } else {
        suspend(t);  // even when already released, so that the others run first as scheduled
    }
}

// The failing thread unwinds its own stack (the message's temporaries in its frames are freed),
// to run_direct or fiber_main; the scheduler then sees the failure.
void Worker::abort_thread(Thread&, const std::string& why) {
    fail(why);
    throw BlockAbort{};
}

void Worker::fiber_main() {
    Thread& t = *current_;
    try {
        launch_->run_thread(launch_->args);
    } catch (const BlockAbort&) {
        return;  // abort_thread has recorded why
    } catch (const std::exception& e) {
        fail(thread_name(t) + " threw an exception: " + e.what());
        return;
    } catch (...) {
        fail(thread_name(t) + " threw an exception");
        return;
    }
    exit_thread(t);
}

// Every fiber starts here; on return from the kernel it switches away for good.
void fiber_entry() {
    Worker& w = *tls_worker;
    asan_finish_switch(nullptr, &w.os_bottom_, &w.os_size_);
    w.fiber_main();
    Thread& t = *w.current_;
    asan_start_switch(nullptr, w.os_bottom_, w.os_size_);
    context_switch(t.ctx, w.os_ctx_);
    std::abort();  // an exited fiber is never resumed
}

// --- __syncthreads ---------------------------------------------------------------------------------
KILN_EMU_INLINE int Worker::barrier(BarrierOp op, int predicate) {
    Thread& t = *current_;
    end_stretch(t);
    t.state = State::AtBarrier;
    t.barrier_op = op;
    acc_count_ += predicate != 0;
    acc_and_ &= predicate != 0;
    acc_or_ |= predicate != 0;
    if (++at_barrier_ == n_) release_block();
    wait(t);
    switch (op) {
    case BarrierOp::Count: return res_count_;
    case BarrierOp::And: return res_and_;
    case BarrierOp::Or: return res_or_;
    case BarrierOp::Sync: return 0;
    }
    return 0;
}

// Every thread of the block is at the barrier (an exited one never arrives: deadlock).
void Worker::release_block() {
    if (launch_->traffic) launch_->traffic->barrier();  // every warp's requests so far are whole
    res_count_ = acc_count_, res_and_ = acc_and_, res_or_ = acc_or_;
    acc_count_ = 0, acc_and_ = 1, acc_or_ = 0;
    at_barrier_ = 0;
    for (unsigned i = 0; i < n_; ++i) threads_[i].state = State::Ready;
    if (racecheck_running) {  // a barrier orders everything before it
        std::fill(writer_.begin(), writer_.end(), -1);
        std::fill(atomic_.begin(), atomic_.end(), 0);
    }
}

// --- warp collectives -------------------------------------------------------------------------------
KILN_EMU_INLINE std::uint64_t Worker::warp(WarpOp op, unsigned mask, std::uint64_t value, int arg, int width) {
    Thread& t = *current_;
    end_stretch(t);
    const unsigned lane = t.linear % 32;
    Warp& w = warps_[t.linear / 32];
    t.op = op;
    t.value = value;
    if (!((mask >> lane) & 1u))
        abort_thread(t, thread_name(t) + " (lane " + std::to_string(lane) + ") calls " + op_name(t) +
                            " with mask " + hex(mask) + ", which leaves out its own lane");
    if (width < 1 || width > 32 || (width & (width - 1)) != 0)
        abort_thread(t, thread_name(t) + " calls " + op_name(t) + " with width " + std::to_string(width) +
                            "; the width is a power of 2 from 1 to 32");
    if (op == WarpOp::Call && w.exists != ~0u)
        abort_thread(t, thread_name(t) + " calls " + op_name(t) + ", which needs all 32 lanes of a warp, but warp " +
                            std::to_string(t.linear / 32) + " of this block has only " +
                            std::to_string(__builtin_popcount(w.exists)) +
                            " threads: make the block's thread count a multiple of 32");
    t.mask = mask & w.exists;  // lanes past the block's last thread do not exist
    t.arg = arg;
    t.width = width;
    t.state = State::AtWarp;
    w.arrived |= 1u << lane;
    if ((w.arrived & t.mask) == t.mask) release_warp(t);
    wait(t);
    return t.result;
}

unsigned Worker::active_mask() const {
    const Warp& w = warps_[current_->linear / 32];
    return w.exists & ~w.exited;
}

// The last lane of the mask arrived (t): check all made the same call, compute every lane's
// result before any of them runs on (one may reach its next collective before another reads).
void Worker::release_warp(Thread& t) {
    Thread* lanes = &threads_[t.linear & ~31u];
    const unsigned mask = t.mask;
    for (unsigned j = 0; j < 32; ++j) {
        if (!((mask >> j) & 1u)) continue;
        const Thread& u = lanes[j];
        if (u.op != t.op || u.mask != mask)
            abort_thread(t, "the lanes of warp " + std::to_string(t.linear / 32) + " disagree: " + thread_name(u) +
                                " calls " + op_name(u) + " with mask " + hex(u.mask) + ", " + thread_name(t) +
                                " calls " + op_name(t) + " with mask " + hex(mask));
        if (t.op == WarpOp::Call) check_same_call(t, u);
    }
    if (t.op == WarpOp::Call) {  // run it once for the warp, while every lane waits
        WarpCall* calls[32];
        for (unsigned j = 0; j < 32; ++j) calls[j] = reinterpret_cast<WarpCall*>(lanes[j].value);
        calls[0]->run(calls);
        warp_call_count.fetch_add(1, std::memory_order_relaxed);
        if (racecheck_running) snapshot_shared();  // its writes belong to no thread's stretch
    }
    for (unsigned j = 0; j < 32; ++j)
        if ((mask >> j) & 1u) lanes[j].result = lane_result(lanes, j, t);
    for (unsigned j = 0; j < 32; ++j)
        if ((mask >> j) & 1u) lanes[j].state = State::Ready;
    warps_[t.linear / 32].arrived &= ~mask;
    if (racecheck_running) forget_writers(t.linear & ~31u, mask);
}

// Lanes u and t both wait in a WarpCall: it must be the same operation on the same fragment type
// (one run function for each) with the same arguments.
void Worker::check_same_call(Thread& t, const Thread& u) {
    const WarpCall &a = call_of(u), &b = call_of(t);
    if (a.run == b.run && a.args[0] == b.args[0] && a.args[1] == b.args[1] && a.args[2] == b.args[2]) return;
    const auto call = [](const WarpCall& c) {
        std::ostringstream os;
        os << c.name << "(pointer " << reinterpret_cast<const void*>(c.args[0]) << ", ldm " << c.args[1]
           << ", layout " << c.args[2] << ")";
        return os.str();
    };
    abort_thread(t, "the lanes of warp " + std::to_string(t.linear / 32) + " disagree: " + thread_name(u) + " calls " +
                        call(a) + ", " + thread_name(t) + " calls " + call(b) +
                        " (or another fragment type); every lane must make the same call (did one skip a call?) "
                        "with the same fragment type, pointer, ldm and layout");
}

// One lane's result. Shuffles follow PTX's shfl.sync: c packs the segment mask (32 - width)
// and the clamp; a source outside the lane's segment, or not in the mask, gives its own value.
std::uint64_t Worker::lane_result(const Thread* lanes, unsigned lane, const Thread& t) const {
    const unsigned mask = t.mask;
    auto in = [mask](unsigned j) { return ((mask >> j) & 1u) != 0; };
    switch (t.op) {
    case WarpOp::SyncWarp:
    case WarpOp::Call: return 0;
    case WarpOp::ShflIdx:
    case WarpOp::ShflUp:
    case WarpOp::ShflDown:
    case WarpOp::ShflXor: {
        const int seg = (32 - t.width) & 31;
        const int clamp = t.op == WarpOp::ShflUp ? 0 : 31;
        const int l = static_cast<int>(lane), b = lanes[lane].arg & 31;
        const int max_lane = (l & seg) | (clamp & ~seg), min_lane = l & seg;
        int j = l;
        bool ok = false;
        switch (t.op) {
        case WarpOp::ShflUp: j = l - b, ok = j >= max_lane; break;
        case WarpOp::ShflDown: j = l + b, ok = j <= max_lane; break;
        case WarpOp::ShflXor: j = l ^ b, ok = j <= max_lane; break;
        default: j = min_lane | (b & ~seg), ok = j <= max_lane; break;
        }
        if (!ok || !in(static_cast<unsigned>(j))) j = l;
        return lanes[j].value;
    }
    default: break;
    }
    // Reductions over the lanes of the mask.
    std::uint64_t ballot = 0, match = 0;
    std::uint32_t sum = 0, band = ~0u, bor = 0, bxor = 0;
    std::int32_t smin = INT32_MAX, smax = INT32_MIN;
    std::uint32_t umin = UINT32_MAX, umax = 0;
    for (unsigned j = 0; j < 32; ++j) {
        if (!in(j)) continue;
        const std::uint64_t v = lanes[j].value;
        const auto u = static_cast<std::uint32_t>(v);
        const auto s = static_cast<std::int32_t>(u);
        if (v != 0) ballot |= 1ull << j;
        if (v == lanes[lane].value) match |= 1ull << j;
        sum += u, band &= u, bor |= u, bxor ^= u;
        smin = std::min(smin, s), smax = std::max(smax, s);
        umin = std::min(umin, u), umax = std::max(umax, u);
    }
    switch (t.op) {
    case WarpOp::Ballot: return ballot;
    case WarpOp::Any: return ballot != 0;
    case WarpOp::All: return ballot == mask;
    case WarpOp::MatchAny: return match;
    case WarpOp::ReduceAdd: return sum;
    case WarpOp::ReduceAnd: return band;
    case WarpOp::ReduceOr: return bor;
    case WarpOp::ReduceXor: return bxor;
    case WarpOp::ReduceMinI: return static_cast<std::uint32_t>(smin);
    case WarpOp::ReduceMaxI: return static_cast<std::uint32_t>(smax);
    case WarpOp::ReduceMinU: return umin;
    case WarpOp::ReduceMaxU: return umax;
    default: return 0;
    }
}

// --- deadlock: say who waits for whom ---------------------------------------------------------------
std::string Worker::waiting_in(const Thread& t) const {
    if (t.state == State::AtBarrier) return "__syncthreads()";
    return op_name(t) + "(mask " + hex(t.mask) + ")";
}

std::string Worker::deadlock_message() const {
    const Thread* w = nullptr;
    for (unsigned i = 0; i < n_ && !w; ++i)
        if (threads_[i].state == State::AtBarrier || threads_[i].state == State::AtWarp) w = &threads_[i];
    if (!w) return "deadlock: no thread can run";
    const std::string who = thread_name(*w) + " waits in " + waiting_in(*w);
    // The thread it waits for: any not at the barrier, or a lane of the mask not in the call.
    for (unsigned i = 0; i < n_; ++i) {
        const Thread& u = threads_[i];
        const bool needed = w->state == State::AtBarrier
                                ? u.state != State::AtBarrier
                                : (i / 32 == w->linear / 32 && ((w->mask >> (i % 32)) & 1u) &&
                                   (u.state != State::AtWarp || u.mask != w->mask));
        if (!needed) continue;
        if (u.state == State::Exited)
            return who + " but " + thread_name(u) + " has already exited: every thread must reach the same " +
                   (w->state == State::AtBarrier ? "barriers (barrier divergence); do not return before a "
                                                   "__syncthreads(), guard the work with an if instead"
                                                 : "collective; its mask may name only lanes that call it");
        return who + " while " + thread_name(u) + " waits in " + waiting_in(u) +
               ": the threads disagree on which barrier or collective comes next";
    }
    return who + " forever (deadlock)";
}

// --- launch -----------------------------------------------------------------------------------------------
std::string check_shape(dim3 grid, dim3 block, std::size_t shared, const void* kernel, cudaError_t* code) {
    *code = cudaErrorInvalidConfiguration;
    const std::uint64_t threads = std::uint64_t(block.x) * block.y * block.z;
    if (threads == 0 || threads > 1024 || block.x > 1024 || block.y > 1024 || block.z > 64)
        return "block " + dim_str(block) + " has " + std::to_string(threads) +
               " threads; a block holds 1 to 1024 (x, y <= 1024, z <= 64)";
    if (grid.x == 0 || grid.y == 0 || grid.z == 0)
        return "grid " + dim_str(grid) + " has a zero dimension (was the problem size 0?)";
    if (grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535)
        return "grid " + dim_str(grid) + " is too large: x <= 2^31 - 1, y and z <= 65535";
    const std::size_t limit = shared_limit(kernel);
    if (shared > limit) {
        *code = cudaErrorInvalidValue;
        return std::to_string(shared) + " bytes of dynamic shared memory exceed the " + std::to_string(limit) +
               "-byte limit; raise it with cudaFuncSetAttribute(kernel, "
               "cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), up to " +
               std::to_string(kMaxSharedOptIn);
    }
    return {};
}

// --- the race detector in global memory --------------------------------------------------------------
// Copying the watched allocations before every block costs their size times the blocks; past
// this many bytes a launch is left unwatched (an elementwise kernel over 4 MiB has 4096 blocks of
// 256 threads: 16 GiB of copies). Outputs written by many blocks are small (partial sums, bins).
constexpr std::uint64_t kGlobalCheckBytes = std::uint64_t(1) << 26;

// The allocations the kernel's writable pointer arguments point into, each once.
void watch_writable(LaunchState& L, const WritableArgs& writable, std::uint64_t nblocks) {
    std::uint64_t bytes = 0;
    for (int i = 0; i < writable.n; ++i) {
        const DeviceAllocation d = device_allocation(writable.at[i]);
        const bool seen = std::any_of(L.global.begin(), L.global.end(),
                                      [&](const GlobalRegion& r) { return r.at == d.at; });
        if (!d.at || d.bytes == 0 || seen) continue;
        bytes += d.bytes;
        if (bytes * nblocks > kGlobalCheckBytes) return L.global.clear();
        L.global.push_back({d.at, d.bytes, writable.arg[i], std::vector<unsigned char>(d.bytes),
                            std::vector<std::uint64_t>(d.bytes, 0), std::vector<unsigned char>(d.bytes, 0)});
    }
}

void snapshot_global(LaunchState& L) {
    for (GlobalRegion& r : L.global) std::memcpy(r.before.data(), r.at, r.bytes);
}

// After block b ran: the bytes it changed are its; one an earlier block changed too is a race
// (unless an atomic touched it). Returns the first race, or "".
std::string check_global_writes(LaunchState& L, std::uint64_t b) {
    std::string race;
    for (GlobalRegion& r : L.global) {
        for (std::size_t run = 0; run < r.bytes; run += 8) {
            const std::size_t end = std::min(run + 8, r.bytes);
            if (same_run(r.at + run, r.before.data() + run, end - run)) continue;
            for (std::size_t at = run; at < end; ++at) {
                if (r.at[at] == r.before[at] || r.atomic[at]) continue;
                if (r.writer[at] != 0 && r.writer[at] != b + 1 && race.empty()) {
                    std::ostringstream os;
                    os << "race in global memory: block " << dim_str(block_of(L.grid, r.writer[at] - 1))
                       << " and block " << dim_str(block_of(L.grid, b)) << " both write byte offset " << at
                       << " of the " << r.bytes << "-byte allocation at " << static_cast<const void*>(r.at)
                       << " (argument " << r.arg << " points into it), not through an atomic (use an atomic, "
                       << "or give each block its own outputs)";
                    race = os.str();
                }
                r.writer[at] = b + 1;
            }
        }
    }
    return race;
}

}  // namespace

namespace {
std::atomic<std::uint64_t> kernels_launched{0};
}  // namespace

std::uint64_t kernels_run() { return kernels_launched.load(); }

void launch(const char* name, const void* kernel, dim3 grid, dim3 block, std::size_t shared_bytes,
            ThreadFn run_thread, const void* args, const WritableArgs& writable) {
    kernels_launched++;
    cudaError_t code = cudaSuccess;
    const std::string bad = check_shape(grid, block, shared_bytes, kernel, &code);
    if (!bad.empty()) {
        set_error(code, "kernel " + std::string(name) + " <<<grid " + dim_str(grid) + ", block " +
                            dim_str(block) + ">>>: " + bad);
        return;
    }
    static std::atomic<std::uint64_t> next_id{1};
    LaunchState L;
    L.name = name, L.grid = grid, L.block = block, L.shared = shared_bytes;
    L.static_shared = &static_shared_arrays(kernel);
    L.run_thread = run_thread, L.args = args, L.id = next_id++;
    L.nthreads = block.x * block.y * block.z;
    L.schedule = schedule(), L.seed = schedule_seed(), L.racecheck = racecheck();
    const auto nblocks = static_cast<std::int64_t>(std::uint64_t(grid.x) * grid.y * grid.z);
    if (L.racecheck) watch_writable(L, writable, static_cast<std::uint64_t>(nblocks));
    std::optional<traffic::Counter> counter;
    if (traffic_on()) L.traffic = &counter.emplace(name, grid, block);
    const int nt = omp_get_max_threads();
    // Dynamic scheduling: blocks may differ in cost; chunks keep the hand-out cheap. Watched
    // global memory is compared block by block, so those blocks run one at a time.
    const std::int64_t chunk = std::max<std::int64_t>(1, nblocks / (std::int64_t(nt) * 16));
#pragma omp parallel for schedule(dynamic, chunk) if (nblocks > 1 && nt > 1 && L.global.empty())
    for (std::int64_t b = 0; b < nblocks; ++b) {
        if (L.failed.load(std::memory_order_relaxed)) continue;  // a failed grid stops, as on a GPU
        if (!L.global.empty()) snapshot_global(L);
        const bool ok = worker().run_block(L, static_cast<std::uint64_t>(b));
        if (!ok || L.global.empty()) continue;
        const std::string race = check_global_writes(L, static_cast<std::uint64_t>(b));
        if (!race.empty())
            L.fail("kernel " + std::string(name) + " <<<grid " + dim_str(grid) + ", block " + dim_str(block) +
                   ">>>: " + race);
    }
    if (counter) counter->finish();
    if (L.failed) set_error(cudaErrorLaunchFailure, L.message);
}

void note_atomic(const void* address, std::size_t bytes) { running_worker("an atomic").note_atomic(address, bytes); }

void* dynamic_shared_memory() { return running_worker("dynamic shared memory").shared(); }

int block_barrier(BarrierOp op, int predicate) { return running_worker("__syncthreads()").barrier(op, predicate); }

std::uint64_t warp_collective(WarpOp op, unsigned mask, std::uint64_t value, int arg, int width) {
    return running_worker(warp_op_name(op)).warp(op, mask, value, arg, width);
}

std::uint64_t warp_calls_run() { return warp_call_count.load(); }

void warp_call(WarpCall& call) {
    running_worker(call.name).warp(WarpOp::Call, ~0u, reinterpret_cast<std::uintptr_t>(&call), 0, warpSize);
}

}  // namespace kiln::emu

unsigned __activemask() { return kiln::emu::running_worker("__activemask()").active_mask(); }
