// emu.h — the CUDA kernel emulator's device side: what a .cu kernel sees when g++ compiles it.
//
// Do not include this directly; include "kiln_cuda.h", which picks nvcc's CUDA or this.
//
// How it works (README.md beside this file says more):
//   - The CUDA headers' host parts give the real types: dim3, uint3, cudaError_t, __half,
//     __nv_bfloat16 and the runtime API declarations (cudaMalloc, ...). emu.cpp and
//     runtime.cpp implement those runtime functions on the CPU.
//   - A launch runs every thread block: blocks in parallel on OpenMP threads, and the
//     threads of one block as fibers (small stacks, cooperative switches) on one OS thread.
//     A kernel that never synchronises runs each thread as a plain call: no fiber at all.
//   - threadIdx/blockIdx/blockDim/gridDim are per-OS-thread variables that the scheduler
//     sets before it runs a thread. __shared__ is `static thread_local`: all fibers of a
//     block run on one OS thread, so they share it, and other blocks (other OS threads)
//     have their own copy. The scheduler finds these arrays in the symbol table (symbols.h)
//     to poison and race-check them.
//   - __syncthreads() and the warp collectives (__shfl*_sync, __ballot_sync, ...) switch to
//     the block's scheduler, which resumes the other threads until all have arrived.
//   - The schedule (in order, reversed, shuffled) decides the order threads run between
//     barriers; a missing barrier gives a different result under another schedule.
#pragma once

#if defined(__CUDACC__)
#error "cuda/emu/emu.h is the g++ side; nvcc builds use the real CUDA runtime (include kiln_cuda.h)"
#endif

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>
#include <type_traits>
#include <utility>

// --- qualifiers ------------------------------------------------------------------------------
// The CUDA headers define __global__, __device__, __host__, __forceinline__ and __constant__
// for host compilers (empty or plain attributes). Shared memory needs a real meaning:
// one copy per block, i.e. per OS thread running the block. Both carry an ABI tag, which the
// compiler writes into the symbol's name (`_ZZ...E2AsB11kiln_shared`, `_Z...B11kiln_kernel...`)
// and nothing else: the scheduler finds every __shared__ array in the symbol table by it
// (symbols.cpp), and tells a kernel's own from those of the __device__ functions it may call.
#undef __shared__
#define __shared__ static thread_local __attribute__((abi_tag("kiln_shared")))
#undef __global__
#define __global__ __attribute__((abi_tag("kiln_kernel")))
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif

// --- built-in variables ----------------------------------------------------------------------
// __thread (not thread_local): plain TLS without an init guard, so reading threadIdx.x costs
// one load. The scheduler rewrites them before it resumes a thread.
extern __thread uint3 threadIdx;
extern __thread uint3 blockIdx;
extern __thread dim3 blockDim;
extern __thread dim3 gridDim;
inline constexpr int warpSize = 32;

namespace kiln::emu {

// The order in which the threads of a block run between two barriers.
enum class Schedule { InOrder, Reverse, Shuffle };

// Chooses the schedule for later launches (all host threads). The default comes from the
// environment: KILN_EMU_SCHEDULE=inorder|reverse|shuffle, KILN_EMU_SEED=<n> for shuffle.
void set_schedule(Schedule schedule, std::uint64_t seed = 1);
Schedule schedule();
std::uint64_t schedule_seed();
const char* schedule_name(Schedule schedule);

// Sets a schedule for one scope (a test), then puts the previous one back.
class ScopedSchedule {
public:
    explicit ScopedSchedule(Schedule s, std::uint64_t seed = 1)
        : old_(schedule()), old_seed_(schedule_seed()) {
        set_schedule(s, seed);
    }
    ~ScopedSchedule() { set_schedule(old_, old_seed_); }
    ScopedSchedule(const ScopedSchedule&) = delete;
    ScopedSchedule& operator=(const ScopedSchedule&) = delete;

private:
    Schedule old_;
    std::uint64_t old_seed_;
};

// The race detector (off by default: it compares shared memory at every switch). Between two
// __syncthreads(), two threads of a block that write the same byte of shared memory (dynamic or
// a static __shared__ array), not through an atomic, fail the launch with a message naming the
// kernel, the block, the array, the byte offset and both threads, as compute-sanitizer's
// racecheck reports on a GPU; so do two blocks that write the same byte of the device memory a
// kernel's pointer argument points into (blocks then run one at a time). It compares memory
// before and after each stretch a thread (or block) runs, so it sees writes that change a
// byte (write-write races), not reads. KILN_EMU_RACECHECK=1 switches it on.
void set_racecheck(bool on);
bool racecheck();

// Switches the race detector on or off for one scope (a test), then puts it back.
class ScopedRacecheck {
public:
    explicit ScopedRacecheck(bool on) : old_(racecheck()) { set_racecheck(on); }
    ~ScopedRacecheck() { set_racecheck(old_); }
    ScopedRacecheck(const ScopedRacecheck&) = delete;
    ScopedRacecheck& operator=(const ScopedRacecheck&) = delete;

private:
    bool old_;
};

// The multiprocessors (SMs) the emulated device reports (cudaGetDeviceProperties,
// cudaDeviceGetAttribute): by default KILN_EMU_MULTIPROCESSORS from the environment, else the
// OpenMP threads, which run its blocks. A test sets a GPU's count (an H200's 132) to run the code
// paths that depend on it, such as the GEMMs' tile shapes and split-K's slices and workspace; 0
// restores the default. Returns the previous setting (0: the default).
int set_multiprocessors(int count);
int multiprocessors();

// Sets the count for one scope (a test), then puts the previous one back.
class ScopedMultiprocessors {
public:
    explicit ScopedMultiprocessors(int count) : old_(set_multiprocessors(count)) {}
    ~ScopedMultiprocessors() { set_multiprocessors(old_); }
    ScopedMultiprocessors(const ScopedMultiprocessors&) = delete;
    ScopedMultiprocessors& operator=(const ScopedMultiprocessors&) = delete;

private:
    int old_;
};

// --- memory traffic: what a GPU's memory system does with each warp's accesses -----------------------
// Code compiled for tracing (the Makefile's TRACE_FLAGS: clang's AddressSanitizer instrumentation
// with kiln's callbacks, cuda/emu/traffic.cpp) reports every load and store; the emulator groups
// the lanes of each warp of 32 threads as the hardware issues them — lane l's n-th execution of an
// instruction with every other lane's n-th of the same instruction — and counts, per launch:
//   global memory (cudaMalloc'd)  requests (warp instructions) and the 32-byte sectors they touch:
//                                 4 sectors per request for 32 consecutive floats, 32 when each
//                                 lane's float lies in another sector (ncu: sectors/request)
//   shared memory                 requests and wavefronts: 32 banks of 4 bytes serve one
//                                 wavefront each; lanes reading different words of one bank need
//                                 one wavefront per word (a bank conflict), the same word is a
//                                 broadcast. 8-byte accesses go by half-warps, 16-byte ones by
//                                 quarter-warps (128 bytes a wavefront); ideal = the wavefronts
//                                 with no conflict, so conflicts = wavefronts - ideal
// Off (the default), and in code not compiled for tracing, nothing is counted. A warp's requests
// are complete at each __syncthreads() and at the block's end, where they are counted; lanes are
// matched by their n-th execution of each instruction since the last barrier (lanes that take
// different paths between barriers are matched in that order, which can pair accesses a GPU
// would issue apart). Atomics and wmma's fragment loads and stores are not counted; ldmatrix
// (mma.h) is, as each lane's 16-byte row.
struct AccessCounts {
    std::uint64_t requests = 0;
    std::uint64_t sectors = 0;     // global memory: 32-byte sectors; shared memory: wavefronts
    std::uint64_t ideal = 0;       // shared memory: the wavefronts without bank conflicts
    std::uint64_t bytes = 0;       // what the lanes asked for
};
struct LaunchTraffic {
    std::string kernel;            // the launch macro's name
    dim3 grid, block;
    AccessCounts global_load, global_store, shared_load, shared_store;
    bool traced = false;           // the kernel reported accesses: it was compiled for tracing
};
void set_traffic(bool on);
bool traffic_on();
// The launches counted since the last call, in launch order (then forgotten).
std::vector<LaunchTraffic> take_traffic();

// Counts the launches of one scope, then puts the switch back.
class ScopedTraffic {
public:
    explicit ScopedTraffic(bool on = true) : old_(traffic_on()) { set_traffic(on); }
    ~ScopedTraffic() { set_traffic(old_); }
    ScopedTraffic(const ScopedTraffic&) = delete;
    ScopedTraffic& operator=(const ScopedTraffic&) = delete;

private:
    bool old_;
};

// Emulator code that a traced kernel compiles in but whose memory accesses are not the kernel's
// own instructions (an atomic's compare-and-swap loop, wmma's warp-wide loads run by one lane):
// left out of the counts above (clang's no_sanitize; the traced build is clang's).
#if defined(__clang__)
#define KILN_EMU_UNTRACED __attribute__((no_sanitize("address")))
#else
#define KILN_EMU_UNTRACED
#endif

// Atomics tell the race detector the bytes they touch (an atomic is not a race); one test of a
// per-OS-thread flag when it is off.
extern __thread bool racecheck_running;
void note_atomic(const void* address, std::size_t bytes);
template <typename T>
inline void atomic_hook(const T* address) {
    if (__builtin_expect(racecheck_running, 0)) note_atomic(address, sizeof(T));
}

// The poison byte of fresh device memory (cudaMalloc) and of dynamic shared memory at the start
// of every block: 0xFF bytes read as NaN in f32 (0xFFFFFFFF), f16 and bf16 (0xFFFF), -1 in ints.
inline constexpr unsigned char kPoisonByte = 0xFF;

// The cudaMalloc allocation that holds p: its first byte and size; {nullptr, 0} if none.
struct DeviceAllocation {
    unsigned char* at = nullptr;
    std::size_t bytes = 0;
};
DeviceAllocation device_allocation(const void* p);

// How many copies from device to host memory (cudaMemcpy and cudaMemcpyAsync) the program has
// made: on a GPU each synchronous one is a wait for every kernel queued before it (a training
// loop's loss read back, train/loss_log.h). Tests count them; the GPU has no such counter.
std::uint64_t copies_to_host();

// How many kernels the emulator has run (each kernel of a replayed graph counts) and how many
// graphs it has launched (cudaGraphLaunch): what a profiler's timeline (nsys) shows on a GPU.
// With a captured training step, a step is one graph launch that runs the step's kernels.
std::uint64_t kernels_run();
std::uint64_t graph_launches();

// --- stream capture (runtime.cpp) ------------------------------------------------------------
// Whether any stream is capturing into a CUDA Graph now; whether a capture forbids an unsafe call
// (an allocation, a synchronous copy, a wait) on this thread (CUDA's capture modes); whether a
// blocking stream captures, which forbids work on the legacy stream (runtime.cpp says more).
bool capture_running();
bool capture_forbids_here();
bool legacy_stream_blocked();
// While `stream` captures: records `node` (run at every cudaGraphLaunch of the graph) and returns
// true; otherwise false, and the caller runs its operation now.
bool capture_node(cudaStream_t stream, const char* name, std::function<void()> node);
// A call a GPU refuses while a capture runs: invalidates every running capture (its
// cudaStreamEndCapture fails) and fails with `code` and a message naming `call` and `why`.
cudaError_t refuse_during_capture(cudaError_t code, const std::string& call, const char* why);

// The emulator's explanation of the latest failed CUDA call or launch on this host thread
// (which kernel, block and thread, what went wrong); empty after a call that succeeded
// without error ever having been set.
std::string last_error_detail();

// Records an error as the CUDA runtime does (cudaGetLastError returns it) with an explanation.
cudaError_t set_error(cudaError_t code, std::string detail);

// --- launch ------------------------------------------------------------------------------------
// A kernel launch hands the emulator a type-erased "run one thread" function and the
// argument block it reads, like CUDA's parameter buffer.
using ThreadFn = void (*)(const void* args);

// The kernel's pointer arguments to non-const data, the memory it may write: the race detector
// watches the allocations they point into (the first kMax of them).
struct WritableArgs {
    static constexpr int kMax = 8;
    const void* at[kMax] = {};
    int arg[kMax] = {};  // which argument, from 0
    int n = 0;
};
template <typename P>
void collect_writable(const P& param, int arg, WritableArgs& out) {
    if constexpr (std::is_pointer_v<P> && !std::is_const_v<std::remove_pointer_t<P>>)
        if (param && out.n < WritableArgs::kMax) out.at[out.n] = param, out.arg[out.n++] = arg;
}

void launch(const char* name, const void* kernel, dim3 grid, dim3 block, std::size_t shared_bytes,
            ThreadFn run_thread, const void* args, const WritableArgs& writable);

// The dynamic shared memory of the running block (the size given at launch).
void* dynamic_shared_memory();

// What KILN_LAUNCH(kernel, grid, block, shared)(args...) builds: the arguments are converted
// to the kernel's parameter types once, then every thread calls the kernel with a copy.
template <typename... Params>
class Launch {
public:
    Launch(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t shared)
        : name_(name), kernel_(kernel), grid_(grid), block_(block), shared_(shared) {}

    template <typename... Args>
    void operator()(Args&&... args) const {
        static_assert(sizeof...(Args) == sizeof...(Params),
                      "kernel launched with a different number of arguments than it takes");
        if (capture_running()) {  // a capturing stream records the launch; the legacy stream may refuse it
            auto frame = std::make_shared<const Frame>(
                Frame{kernel_, std::tuple<std::decay_t<Params>...>(std::forward<Args>(args)...)});
            const Launch self = *this;
            if (capture_node(stream_, name_, [self, frame] { self.run(*frame); })) return;
            if (!stream_ && legacy_stream_blocked()) {
                refuse_during_capture(cudaErrorStreamCaptureImplicit, std::string("kernel ") + name_,
                                      "a launch on the legacy stream would wait for the capturing stream");
                return;
            }
            run(*frame);
            return;
        }
        run(Frame{kernel_, std::tuple<std::decay_t<Params>...>(std::forward<Args>(args)...)});
    }
    void with_stream(cudaStream_t stream) { stream_ = stream; }

private:
    struct Frame {
        void (*kernel)(Params...);
        std::tuple<std::decay_t<Params>...> params;
    };
    template <typename Tuple, std::size_t... I>
    static void collect_all_writable(const Tuple& params, WritableArgs& out, std::index_sequence<I...>) {
        (collect_writable(std::get<I>(params), static_cast<int>(I), out), ...);
    }
    void run(const Frame& frame) const {
        WritableArgs writable;
        if (racecheck()) collect_all_writable(frame.params, writable, std::index_sequence_for<Params...>{});
        launch(name_, reinterpret_cast<const void*>(kernel_), grid_, block_, shared_, &run_thread, &frame, writable);
    }
    static void run_thread(const void* p) {
        const Frame& f = *static_cast<const Frame*>(p);
        std::apply(f.kernel, f.params);  // the kernel takes its parameters by value: a copy each
    }

    const char* name_;
    void (*kernel_)(Params...);
    dim3 grid_, block_;
    std::size_t shared_;
    cudaStream_t stream_ = nullptr;  // the legacy default stream
};

template <typename... Params>
Launch<Params...> make_launch(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block,
                              std::size_t shared_bytes, cudaStream_t stream = nullptr) {
    Launch<Params...> l(name, kernel, grid, block, shared_bytes);
    l.with_stream(stream);
    return l;
}

// --- collectives (implemented in emu.cpp) --------------------------------------------------------
enum class WarpOp : unsigned char {
    SyncWarp, ShflIdx, ShflUp, ShflDown, ShflXor, Ballot, Any, All,
    ReduceAdd, ReduceMinI, ReduceMaxI, ReduceMinU, ReduceMaxU, ReduceAnd, ReduceOr, ReduceXor,
    MatchAny, Call,
};
const char* warp_op_name(WarpOp op);
// Every lane in `mask` must make the same call; returns this lane's result. `value` holds the
// lane's operand bits, `arg` the source lane / delta / xor mask, `width` the shuffle width.
std::uint64_t warp_collective(WarpOp op, unsigned mask, std::uint64_t value, int arg, int width);

// A warp-wide operation that needs every lane's data at once (wmma's load, store and mma,
// wmma.h): each of the 32 lanes passes its own WarpCall; when the last one arrives, `run` is
// called once with all 32 (in lane order) while the lanes wait. The lanes must agree on `run`
// (one function per operation and fragment type) and on `args`.
struct WarpCall {
    const char* name;                      // for messages: "wmma::load_matrix_sync"
    void (*run)(WarpCall* const* lanes);   // lanes[0..31]
    std::uintptr_t args[3];                // what every lane must pass alike: pointer, ldm, layout
    void* out;                             // this lane's result fragment (nullptr for a store)
    const void* in[3];                     // this lane's operand fragments
};
// Every lane of the warp must call it (a partial warp or a missing lane fails the launch).
void warp_call(WarpCall& call);
// How many WarpCalls have run, over all launches so far: tests check with it that a path used
// the tensor cores.
std::uint64_t warp_calls_run();

enum class BarrierOp : unsigned char { Sync, Count, And, Or };
int block_barrier(BarrierOp op, int predicate);

template <typename T>
std::uint64_t to_bits(T v) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>,
                  "warp shuffles move values of at most 8 bytes");
    std::uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    return bits;
}
template <typename T>
T from_bits(std::uint64_t bits) {
    T v;
    std::memcpy(&v, &bits, sizeof(T));
    return v;
}
template <typename T>
T shuffle(WarpOp op, unsigned mask, T var, int arg, int width) {
    return from_bits<T>(warp_collective(op, mask, to_bits(var), arg, width));
}

}  // namespace kiln::emu

// --- runtime C++ overloads ----------------------------------------------------------------------
// cuda_runtime.h declares these templates for nvcc only; code written for CUDA calls them.
template <class T>
cudaError_t cudaFuncSetAttribute(T* kernel, cudaFuncAttribute attr, int value) {
    return ::cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), attr, value);
}
template <class T>
cudaError_t cudaMemcpyToSymbol(const T& symbol, const void* src, size_t count, size_t offset = 0,
                               cudaMemcpyKind kind = cudaMemcpyHostToDevice) {
    return ::cudaMemcpyToSymbol(static_cast<const void*>(&symbol), src, count, offset, kind);
}
template <class T>
cudaError_t cudaMemcpyFromSymbol(void* dst, const T& symbol, size_t count, size_t offset = 0,
                                 cudaMemcpyKind kind = cudaMemcpyDeviceToHost) {
    return ::cudaMemcpyFromSymbol(dst, static_cast<const void*>(&symbol), count, offset, kind);
}

// --- barriers and warp collectives -----------------------------------------------------------
inline void __syncthreads() { kiln::emu::block_barrier(kiln::emu::BarrierOp::Sync, 0); }
inline int __syncthreads_count(int p) { return kiln::emu::block_barrier(kiln::emu::BarrierOp::Count, p); }
inline int __syncthreads_and(int p) { return kiln::emu::block_barrier(kiln::emu::BarrierOp::And, p); }
inline int __syncthreads_or(int p) { return kiln::emu::block_barrier(kiln::emu::BarrierOp::Or, p); }

inline void __syncwarp(unsigned mask = 0xffffffffu) {
    kiln::emu::warp_collective(kiln::emu::WarpOp::SyncWarp, mask, 0, 0, warpSize);
}
unsigned __activemask();

template <typename T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize) {
    return kiln::emu::shuffle(kiln::emu::WarpOp::ShflIdx, mask, var, src_lane, width);
}
template <typename T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
    return kiln::emu::shuffle(kiln::emu::WarpOp::ShflUp, mask, var, static_cast<int>(delta), width);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
    return kiln::emu::shuffle(kiln::emu::WarpOp::ShflDown, mask, var, static_cast<int>(delta), width);
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize) {
    return kiln::emu::shuffle(kiln::emu::WarpOp::ShflXor, mask, var, lane_mask, width);
}

inline unsigned __ballot_sync(unsigned mask, int pred) {
    return static_cast<unsigned>(kiln::emu::warp_collective(kiln::emu::WarpOp::Ballot, mask, pred != 0, 0, warpSize));
}
inline int __any_sync(unsigned mask, int pred) {
    return static_cast<int>(kiln::emu::warp_collective(kiln::emu::WarpOp::Any, mask, pred != 0, 0, warpSize));
}
inline int __all_sync(unsigned mask, int pred) {
    return static_cast<int>(kiln::emu::warp_collective(kiln::emu::WarpOp::All, mask, pred != 0, 0, warpSize));
}
template <typename T>
unsigned __match_any_sync(unsigned mask, T value) {
    return static_cast<unsigned>(kiln::emu::warp_collective(kiln::emu::WarpOp::MatchAny, mask, kiln::emu::to_bits(value), 0, warpSize));
}

// sm_80 warp reductions: the signed and unsigned min/max differ, the sum and bit operations don't.
#define KILN_EMU_WARP_REDUCE(name, T, op)                                                      \
    inline T name(unsigned mask, T value) {                                                    \
        return kiln::emu::from_bits<T>(kiln::emu::warp_collective(                             \
            kiln::emu::WarpOp::op, mask, kiln::emu::to_bits(value), 0, warpSize));             \
    }
KILN_EMU_WARP_REDUCE(__reduce_add_sync, unsigned, ReduceAdd)
KILN_EMU_WARP_REDUCE(__reduce_add_sync, int, ReduceAdd)
KILN_EMU_WARP_REDUCE(__reduce_min_sync, unsigned, ReduceMinU)
KILN_EMU_WARP_REDUCE(__reduce_min_sync, int, ReduceMinI)
KILN_EMU_WARP_REDUCE(__reduce_max_sync, unsigned, ReduceMaxU)
KILN_EMU_WARP_REDUCE(__reduce_max_sync, int, ReduceMaxI)
KILN_EMU_WARP_REDUCE(__reduce_and_sync, unsigned, ReduceAnd)
KILN_EMU_WARP_REDUCE(__reduce_or_sync, unsigned, ReduceOr)
KILN_EMU_WARP_REDUCE(__reduce_xor_sync, unsigned, ReduceXor)
#undef KILN_EMU_WARP_REDUCE

// Fences: blocks run on real OS threads, so a device-wide fence is a real one.
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_signal_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

// --- atomics ----------------------------------------------------------------------------------
// Blocks run in parallel on OS threads, so these are real hardware atomics. Threads of one
// block never interleave inside one (fibers switch only at barriers and collectives).
#define KILN_EMU_ATOMIC(name, T, builtin)                                                      \
    KILN_EMU_UNTRACED inline T name(T* address, T val) {                                     \
        kiln::emu::atomic_hook(address);                                                       \
        return builtin(address, val, __ATOMIC_SEQ_CST);                                        \
    }
KILN_EMU_ATOMIC(atomicAdd, int, __atomic_fetch_add)
KILN_EMU_ATOMIC(atomicAdd, unsigned, __atomic_fetch_add)
KILN_EMU_ATOMIC(atomicAdd, unsigned long long, __atomic_fetch_add)
KILN_EMU_ATOMIC(atomicSub, int, __atomic_fetch_sub)
KILN_EMU_ATOMIC(atomicSub, unsigned, __atomic_fetch_sub)
KILN_EMU_ATOMIC(atomicAnd, int, __atomic_fetch_and)
KILN_EMU_ATOMIC(atomicAnd, unsigned, __atomic_fetch_and)
KILN_EMU_ATOMIC(atomicAnd, unsigned long long, __atomic_fetch_and)
KILN_EMU_ATOMIC(atomicOr, int, __atomic_fetch_or)
KILN_EMU_ATOMIC(atomicOr, unsigned, __atomic_fetch_or)
KILN_EMU_ATOMIC(atomicOr, unsigned long long, __atomic_fetch_or)
KILN_EMU_ATOMIC(atomicXor, int, __atomic_fetch_xor)
KILN_EMU_ATOMIC(atomicXor, unsigned, __atomic_fetch_xor)
KILN_EMU_ATOMIC(atomicXor, unsigned long long, __atomic_fetch_xor)
KILN_EMU_ATOMIC(atomicExch, int, __atomic_exchange_n)
KILN_EMU_ATOMIC(atomicExch, unsigned, __atomic_exchange_n)
KILN_EMU_ATOMIC(atomicExch, unsigned long long, __atomic_exchange_n)
#undef KILN_EMU_ATOMIC

// The rest are compare-and-swap loops: new = f(old), retried until no other block interfered.
namespace kiln::emu {
template <typename T, typename F>
KILN_EMU_UNTRACED T atomic_update(T* address, F f) {
    atomic_hook(address);
    T old;
    __atomic_load(address, &old, __ATOMIC_RELAXED);
    T desired = f(old);
    while (!__atomic_compare_exchange(address, &old, &desired, true, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
        desired = f(old);
    return old;
}
}  // namespace kiln::emu

inline float atomicAdd(float* a, float v) { return kiln::emu::atomic_update(a, [v](float o) { return o + v; }); }
inline double atomicAdd(double* a, double v) { return kiln::emu::atomic_update(a, [v](double o) { return o + v; }); }
KILN_EMU_UNTRACED inline float atomicExch(float* a, float v) { kiln::emu::atomic_hook(a); float old; __atomic_exchange(a, &v, &old, __ATOMIC_SEQ_CST); return old; }

#define KILN_EMU_ATOMIC_MINMAX(T)                                                                              \
    inline T atomicMax(T* a, T v) { return kiln::emu::atomic_update(a, [v](T o) { return o < v ? v : o; }); } \
    inline T atomicMin(T* a, T v) { return kiln::emu::atomic_update(a, [v](T o) { return v < o ? v : o; }); }
KILN_EMU_ATOMIC_MINMAX(int)
KILN_EMU_ATOMIC_MINMAX(unsigned)
KILN_EMU_ATOMIC_MINMAX(long long)
KILN_EMU_ATOMIC_MINMAX(unsigned long long)
#undef KILN_EMU_ATOMIC_MINMAX

// atomicInc/atomicDec wrap as CUDA's do: ((old >= limit) ? 0 : old + 1), ((old == 0 || old > limit) ? limit : old - 1).
inline unsigned atomicInc(unsigned* a, unsigned limit) {
    return kiln::emu::atomic_update(a, [limit](unsigned o) { return o >= limit ? 0u : o + 1; });
}
inline unsigned atomicDec(unsigned* a, unsigned limit) {
    return kiln::emu::atomic_update(a, [limit](unsigned o) { return (o == 0 || o > limit) ? limit : o - 1; });
}

#define KILN_EMU_ATOMIC_CAS(T)                                                                  \
    KILN_EMU_UNTRACED inline T atomicCAS(T* a, T compare, T val) {                              \
        kiln::emu::atomic_hook(a);                                                              \
        __atomic_compare_exchange_n(a, &compare, val, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST); \
        return compare; /* holds the old value whether or not the swap happened */              \
    }
KILN_EMU_ATOMIC_CAS(int)
KILN_EMU_ATOMIC_CAS(unsigned)
KILN_EMU_ATOMIC_CAS(unsigned long long)
KILN_EMU_ATOMIC_CAS(unsigned short)
#undef KILN_EMU_ATOMIC_CAS

// --- math intrinsics -------------------------------------------------------------------------
// The fast-math intrinsics are the precise host functions here (the GPU's are less accurate,
// so compare kernels with a tolerance). glibc declares some of these names (__expf, ...)
// without exporting them; the inline C definitions below match those declarations.
extern "C" {
inline float __expf(float x) noexcept { return expf(x); }
inline float __exp10f(float x) noexcept { return powf(10.0f, x); }
inline float __logf(float x) noexcept { return logf(x); }
inline float __log2f(float x) noexcept { return log2f(x); }
inline float __log10f(float x) noexcept { return log10f(x); }
inline float __powf(float x, float y) noexcept { return powf(x, y); }
inline float __sinf(float x) noexcept { return sinf(x); }
inline float __cosf(float x) noexcept { return cosf(x); }
inline float __tanf(float x) noexcept { return tanf(x); }
}
inline void __sincosf(float x, float* s, float* c) { *s = sinf(x); *c = cosf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return sqrtf(x); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float __saturatef(float x) { return x > 0.0f ? (x < 1.0f ? x : 1.0f) : 0.0f; }  // NaN -> 0
inline int __float2int_rn(float x) { return static_cast<int>(lrintf(x)); }
inline int __float2int_rz(float x) { return static_cast<int>(x); }
inline int __float2int_rd(float x) { return static_cast<int>(floorf(x)); }
inline int __float2int_ru(float x) { return static_cast<int>(ceilf(x)); }
inline unsigned __float2uint_rn(float x) { return static_cast<unsigned>(lrintf(x)); }
inline float __int2float_rn(int x) { return static_cast<float>(x); }
inline float __uint2float_rn(unsigned x) { return static_cast<float>(x); }
inline int __float_as_int(float x) { return kiln::emu::from_bits<int>(kiln::emu::to_bits(x)); }
inline unsigned __float_as_uint(float x) { return kiln::emu::from_bits<unsigned>(kiln::emu::to_bits(x)); }
inline float __int_as_float(int x) { return kiln::emu::from_bits<float>(kiln::emu::to_bits(x)); }
inline float __uint_as_float(unsigned x) { return kiln::emu::from_bits<float>(kiln::emu::to_bits(x)); }

inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll(static_cast<unsigned long long>(x)); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned __brev(unsigned x) {
    unsigned r = 0;
    for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
    return r;
}
inline int __mulhi(int a, int b) { return static_cast<int>((static_cast<long long>(a) * b) >> 32); }
inline unsigned __umulhi(unsigned a, unsigned b) {
    return static_cast<unsigned>((static_cast<unsigned long long>(a) * b) >> 32);
}
inline int __mul24(int a, int b) { return a * b; }
inline unsigned __umul24(unsigned a, unsigned b) { return a * b; }

// __dp4a (sm_61 and later; PTX dp4a.s32.s32 and dp4a.u32.u32): a dot product of four bytes,
//   c + a0·b0 + a1·b1 + a2·b2 + a3·b3,    ai = byte i of srcA (bits 8i .. 8i + 7), bi likewise,
// bytes signed for int operands, unsigned for unsigned ones. The GPU adds in a 32-bit register,
// so the sum wraps modulo 2^32; here it is taken in 64 bits (no signed overflow, which would be
// undefined in C++) and wrapped on the way out.
namespace kiln::emu {
inline int byte_of(int word, int i) { return static_cast<int8_t>(static_cast<uint32_t>(word) >> (8 * i)); }
inline unsigned byte_of(unsigned word, int i) { return (word >> (8 * i)) & 0xffu; }
}  // namespace kiln::emu
inline int __dp4a(int srcA, int srcB, int c) {
    int64_t s = c;
    for (int i = 0; i < 4; ++i) s += int64_t(kiln::emu::byte_of(srcA, i)) * kiln::emu::byte_of(srcB, i);
    return static_cast<int>(static_cast<uint32_t>(s));  // modulo 2^32, as the GPU's adder
}
inline unsigned __dp4a(unsigned srcA, unsigned srcB, unsigned c) {
    for (int i = 0; i < 4; ++i) c += kiln::emu::byte_of(srcA, i) * kiln::emu::byte_of(srcB, i);  // unsigned: wraps
    return c;
}
// The vector overloads: .x is byte 0, .w byte 3.
inline int __dp4a(char4 srcA, char4 srcB, int c) {
    return __dp4a(kiln::emu::from_bits<int>(kiln::emu::to_bits(srcA)),
                  kiln::emu::from_bits<int>(kiln::emu::to_bits(srcB)), c);
}
inline unsigned __dp4a(uchar4 srcA, uchar4 srcB, unsigned c) {
    return __dp4a(kiln::emu::from_bits<unsigned>(kiln::emu::to_bits(srcA)),
                  kiln::emu::from_bits<unsigned>(kiln::emu::to_bits(srcB)), c);
}

// Device code calls min/max unqualified, on ints and floats alike.
#define KILN_EMU_MINMAX(T)                                    \
    inline T min(T a, T b) { return b < a ? b : a; }          \
    inline T max(T a, T b) { return a < b ? b : a; }
KILN_EMU_MINMAX(int)
KILN_EMU_MINMAX(unsigned)
KILN_EMU_MINMAX(long long)
KILN_EMU_MINMAX(unsigned long long)
#undef KILN_EMU_MINMAX
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }

// __ldg reads through the read-only cache on a GPU; here it is a plain load.
template <typename T>
inline T __ldg(const T* p) { return *p; }
