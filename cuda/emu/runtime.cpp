// runtime.cpp — the CUDA runtime API on the CPU: device memory, copies, errors, streams, events.
//
// The declarations are the CUDA headers' own (cuda_runtime_api.h), so the emulator's functions
// have exactly CUDA's signatures and error codes. "Device" memory is host memory from
// posix_memalign (256-byte aligned, as cudaMalloc's), recorded in a table so that copies can
// check their pointers the way a GPU would reject them: a cudaMemcpyHostToDevice whose
// destination is not device memory fails here too, with a message saying which pointer.
//
// Launches, and copies on the legacy stream or a blocking stream, run before they return; an event
// records the host clock. A stream created with cudaStreamNonBlocking is deferred: its copies,
// fills and event records are queued and run only when something waits for them (an event wait,
// a synchronize, a graph launched on that stream), the latest a GPU could run them, so that a
// missing cudaStreamWaitEvent reads what the copy has not written yet. (A kernel launched on such
// a stream still runs at once, ahead of the copies queued there: kiln launches none there.) Stream capture
// (cudaStreamBeginCapture) is real: while a stream captures, the kernels, copies and fills queued
// on it are recorded, not run, and cudaGraphLaunch runs the recorded list again; a call a GPU refuses during a capture
// (an allocation, a synchronous copy, a wait) is refused here with CUDA's code and a message
// naming the call, and the capture is invalidated (its cudaStreamEndCapture fails), as CUDA's
// default capture mode (cudaStreamCaptureModeGlobal) does. Errors are per host thread, like CUDA's:
// cudaGetLastError returns the latest and resets it. Unlike a GPU's, a failed kernel does not
// poison the context: later calls work.
#include <omp.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <set>
#include <thread>
#include <mutex>
#include <sstream>

#include "emu.h"
#include "traffic.h"

// One recorded operation of a captured stream: a kernel launch, a copy or a fill, run again at
// every cudaGraphLaunch. `name` is for messages.
struct CaptureNode {
    std::string name;
    std::function<void()> run;
};
// One operation queued on a deferred (non-blocking) stream: a copy or a fill (run), or the
// record-th record of an event (event).
struct QueuedOp {
    std::function<void()> run;
    cudaEvent_t event = nullptr;
    std::uint64_t record = 0;
};
struct CUstream_st {
    bool blocking = true;            // false: cudaStreamNonBlocking (no implicit order with the legacy stream)
    std::deque<QueuedOp> queued;     // a non-blocking stream's work not run yet, in order
    bool capturing = false;
    cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
    std::thread::id owner;           // the thread that began the capture
    std::string invalidated;         // why the capture can no longer succeed ("" while it can)
    std::vector<CaptureNode> nodes;  // what the capture recorded, in order
};
struct CUgraph_st {
    std::vector<CaptureNode> nodes;
};
struct CUgraphExec_st {
    std::vector<CaptureNode> nodes;
};
struct CUevent_st {
    std::chrono::steady_clock::time_point time;
    bool recorded = false;
    std::uint64_t records = 0;        // cudaEventRecord calls so far; a wait is for the latest
    cudaStream_t pending = nullptr;   // the deferred stream whose queue holds the latest record, if not run
};

namespace kiln::emu {
namespace {

thread_local cudaError_t last_error = cudaSuccess;
thread_local std::string last_detail;

// --- the device-memory table ------------------------------------------------------------------
std::mutex& memory_mutex() {
    static std::mutex m;
    return m;
}
std::map<std::uintptr_t, std::size_t>& allocations() {  // start -> bytes
    static std::map<std::uintptr_t, std::size_t> m;
    return m;
}
std::size_t& allocated_bytes() {
    static std::size_t n = 0;
    return n;
}
std::atomic<std::uint64_t> device_to_host_copies{0};
std::atomic<std::uint64_t> graphs_launched{0};

// --- stream capture ---------------------------------------------------------------------------
// The streams capturing now. A call that is unsafe during a capture (an allocation, a synchronous
// copy, a wait) fails on any thread while a capture in CUDA's global mode runs, on the capturing
// thread only in thread-local mode, never in relaxed mode. Work on the legacy stream, synchronous
// or not, fails while a blocking stream (created without cudaStreamNonBlocking) captures: the
// legacy stream would have to wait for it.
std::mutex& capture_mutex() {
    static std::mutex m;
    return m;
}
std::set<cudaStream_t>& capturing_streams() {
    static std::set<cudaStream_t> s;
    return s;
}
std::atomic<int> captures_running{0};

}  // namespace

bool capture_running() { return captures_running.load(std::memory_order_relaxed) > 0; }

namespace {
// Whether the capture on `s` forbids an unsafe call made on this thread now (the modes above).
bool forbids_here(cudaStream_t s) {
    return s->mode == cudaStreamCaptureModeGlobal ||
           (s->mode == cudaStreamCaptureModeThreadLocal && s->owner == std::this_thread::get_id());
}
}  // namespace

bool capture_forbids_here() {
    if (!capture_running()) return false;
    std::lock_guard<std::mutex> lock(capture_mutex());
    for (cudaStream_t s : capturing_streams())
        if (forbids_here(s)) return true;
    return false;
}

bool legacy_stream_blocked() {
    if (!capture_running()) return false;
    std::lock_guard<std::mutex> lock(capture_mutex());
    for (cudaStream_t s : capturing_streams())
        if (s->blocking) return true;
    return false;
}

// Refuses `call`: the captures it breaks are invalidated (their cudaStreamEndCapture fails) —
// those that forbid it on this thread, and with cudaErrorStreamCaptureImplicit the blocking ones
// — and the call fails with `code` and a message saying why.
cudaError_t refuse_during_capture(cudaError_t code, const std::string& call, const char* why) {
    std::string streams;
    {
        std::lock_guard<std::mutex> lock(capture_mutex());
        for (cudaStream_t s : capturing_streams()) {
            if (!forbids_here(s) && !(code == cudaErrorStreamCaptureImplicit && s->blocking)) continue;
            if (s->invalidated.empty()) s->invalidated = call;
            std::ostringstream os;
            os << (streams.empty() ? "" : ", ") << static_cast<const void*>(s);
            streams += os.str();
        }
    }
    return set_error(code, call + " while stream " + streams + " is being captured into a CUDA Graph: " + why +
                               "; the capture is invalidated (cudaStreamEndCapture will fail)");
}

bool capture_node(cudaStream_t stream, const char* name, std::function<void()> node) {
    if (!capture_running()) return false;
    std::lock_guard<std::mutex> lock(capture_mutex());
    if (!stream || !capturing_streams().count(stream)) return false;
    stream->nodes.push_back({name, std::move(node)});
    return true;
}

// --- deferred streams ----------------------------------------------------------------------------
// A non-blocking stream runs nothing when its work is queued: the queue runs, in order, up to what
// a caller waits for. One lock for every queue and every event's record state.
namespace {
std::mutex& queue_mutex() {
    static std::mutex m;
    return m;
}
std::set<cudaStream_t>& deferred_streams() {  // every live non-blocking stream
    static std::set<cudaStream_t> s;
    return s;
}
bool captures(cudaStream_t s) {
    if (!capture_running()) return false;
    std::lock_guard<std::mutex> lock(capture_mutex());
    return s->capturing;
}
bool defers(cudaStream_t s) { return s && !s->blocking && !captures(s); }

void mark_recorded(cudaEvent_t e, std::uint64_t record) {
    e->time = std::chrono::steady_clock::now();
    e->recorded = true;
    if (e->records == record) e->pending = nullptr;
}

// Runs `s`'s queue up to and including the record-th record of `e` (everything when e is null).
// The caller holds queue_mutex.
void run_until_locked(cudaStream_t s, cudaEvent_t e, std::uint64_t record) {
    while (!s->queued.empty()) {
        QueuedOp op = std::move(s->queued.front());
        s->queued.pop_front();
        if (op.run) op.run();
        if (op.event) mark_recorded(op.event, op.record);
        if (e && op.event == e && op.record == record) return;
    }
}

// Runs what the latest record of `e` waits for. The caller holds queue_mutex.
void run_to_event_locked(cudaEvent_t e) {
    if (e->pending) run_until_locked(e->pending, e, e->records);
}

// Everything queued on `stream` (a synchronize, a query, a graph launched on it).
void run_queued(cudaStream_t stream) {
    if (!stream) return;
    std::lock_guard<std::mutex> lock(queue_mutex());
    if (deferred_streams().count(stream)) run_until_locked(stream, nullptr, 0);
}
}  // namespace

std::vector<traffic::Span> traffic::device_allocations() {
    std::lock_guard<std::mutex> lock(memory_mutex());
    std::vector<Span> spans;
    spans.reserve(allocations().size());
    for (const auto& [at, bytes] : allocations()) spans.push_back({at, bytes});
    return spans;  // the map is ordered by address
}

DeviceAllocation device_allocation(const void* p) {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    std::lock_guard<std::mutex> lock(memory_mutex());
    auto it = allocations().upper_bound(a);
    if (it == allocations().begin()) return {};
    --it;
    if (a >= it->first + it->second && !(a == it->first && it->second == 0)) return {};
    return {reinterpret_cast<unsigned char*>(it->first), it->second};
}

namespace {

// The allocation holding [p, p + bytes), if any: 0 none, 1 inside one, -1 overruns its end.
int device_range(const void* p, std::size_t bytes, std::size_t* alloc_size = nullptr) {
    const DeviceAllocation d = device_allocation(p);
    if (!d.at) return 0;
    if (alloc_size) *alloc_size = d.bytes;
    return static_cast<const unsigned char*>(p) + bytes <= d.at + d.bytes ? 1 : -1;
}

std::string ptr_str(const void* p) {
    std::ostringstream os;
    os << p;
    return os.str();
}

// Checks one side of a copy: `want_device` says whether the kind names device memory there.
std::string check_side(const char* call, const char* side, const void* p, std::size_t bytes, bool want_device) {
    std::size_t size = 0;
    const int r = device_range(p, bytes, &size);
    if (want_device && r == 0)
        return std::string(call) + ": the " + side + " " + ptr_str(p) +
               " is not device memory from cudaMalloc (are the arguments or the copy kind swapped?)";
    if (want_device && r < 0)
        return std::string(call) + ": " + std::to_string(bytes) + " bytes from the " + side + " " + ptr_str(p) +
               " run past the end of its " + std::to_string(size) + "-byte device allocation";
    if (!want_device && r != 0)
        return std::string(call) + ": the " + side + " " + ptr_str(p) +
               " is device memory, but the copy kind says host memory";
    return {};
}

// Checks a copy's pointers against its kind, then (perform) copies.
cudaError_t copy(const char* call, void* dst, const void* src, std::size_t count, cudaMemcpyKind kind,
                 bool perform = true) {
    if (count == 0) return cudaSuccess;
    if (!dst || !src) return set_error(cudaErrorInvalidValue, std::string(call) + ": a null pointer");
    std::string bad;
    switch (kind) {
    case cudaMemcpyHostToDevice:
        bad = check_side(call, "destination", dst, count, true);
        if (bad.empty()) bad = check_side(call, "source", src, count, false);
        break;
    case cudaMemcpyDeviceToHost:
        bad = check_side(call, "source", src, count, true);
        if (bad.empty()) bad = check_side(call, "destination", dst, count, false);
        if (perform) device_to_host_copies++;
        break;
    case cudaMemcpyDeviceToDevice:
        bad = check_side(call, "destination", dst, count, true);
        if (bad.empty()) bad = check_side(call, "source", src, count, true);
        break;
    case cudaMemcpyHostToHost:
    case cudaMemcpyDefault: break;
    default: return set_error(cudaErrorInvalidMemcpyDirection, std::string(call) + ": unknown copy kind");
    }
    if (!bad.empty()) return set_error(cudaErrorInvalidValue, bad);
    if (perform) std::memmove(dst, src, count);
    return cudaSuccess;
}

cudaError_t fill(const char* call, void* p, int value, std::size_t count, bool perform = true) {
    if (count == 0) return cudaSuccess;
    const std::string bad = check_side(call, "destination", p, count, true);
    if (!bad.empty()) return set_error(cudaErrorInvalidValue, bad);
    if (perform) std::memset(p, value, count);
    return cudaSuccess;
}

const char* kind_name(cudaMemcpyKind kind) {
    switch (kind) {
    case cudaMemcpyHostToDevice: return "host to device";
    case cudaMemcpyDeviceToHost: return "device to host";
    case cudaMemcpyDeviceToDevice: return "device to device";
    default: return "host to host";
    }
}

// A copy or a fill, given as `check` (its arguments' checks) and `run` (both: run(true) performs
// it), on `stream`. Queued on a deferred (non-blocking) stream: checked now, run later. While a
// capture runs: queued on the capturing stream, it is recorded (checked now, run at each
// cudaGraphLaunch); a synchronous call, or one on the legacy stream (null), is
// refused as CUDA refuses it — the legacy stream waits for every blocking stream, a capturing one
// included, a dependency no graph can hold. Otherwise it runs now.
cudaError_t on_stream(const std::string& call, bool synchronous, cudaStream_t stream,
                      const std::function<cudaError_t(bool perform)>& op) {
    if (!synchronous && defers(stream)) {  // checked now, run when something waits for the stream
        if (const cudaError_t e = op(false); e != cudaSuccess) return e;
        std::lock_guard<std::mutex> lock(queue_mutex());
        stream->queued.push_back(QueuedOp{[op] { op(true); }, nullptr, 0});
        return cudaSuccess;
    }
    if (!capture_running()) return op(true);
    if (!synchronous && stream) {
        if (const cudaError_t e = op(false); e != cudaSuccess) return e;
        if (capture_node(stream, call.c_str(), [op] { op(true); })) return cudaSuccess;
    }
    if (legacy_stream_blocked() && (synchronous || !stream))
        return refuse_during_capture(cudaErrorStreamCaptureImplicit, call,
                                     "work on the legacy stream would wait for the capturing stream");
    if (synchronous && capture_forbids_here())
        return refuse_during_capture(cudaErrorStreamCaptureUnsupported, call,
                                     "a synchronous copy waits for the device, which a capture cannot record");
    return op(true);
}

std::size_t host_memory() {
    return static_cast<std::size_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace

cudaError_t set_error(cudaError_t code, std::string detail) {
    last_error = code;
    last_detail = std::move(detail);
    return code;
}

std::string last_error_detail() { return last_detail; }

std::uint64_t copies_to_host() { return device_to_host_copies.load(); }
std::uint64_t graph_launches() { return graphs_launched.load(); }

}  // namespace kiln::emu

using kiln::emu::set_error;

// --- errors --------------------------------------------------------------------------------------
cudaError_t cudaGetLastError() {
    const cudaError_t e = kiln::emu::last_error;
    kiln::emu::last_error = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError() { return kiln::emu::last_error; }

// CUDA's own strings for the codes the emulator (or code written for it) can meet.
#define KILN_EMU_ERRORS(X)                                                            \
    X(cudaSuccess, "no error")                                                        \
    X(cudaErrorInvalidValue, "invalid argument")                                      \
    X(cudaErrorMemoryAllocation, "out of memory")                                     \
    X(cudaErrorInitializationError, "initialization error")                           \
    X(cudaErrorInvalidConfiguration, "invalid configuration argument")                \
    X(cudaErrorInvalidPitchValue, "invalid pitch argument")                           \
    X(cudaErrorInvalidSymbol, "invalid device symbol")                                \
    X(cudaErrorInvalidDevicePointer, "invalid device pointer")                        \
    X(cudaErrorInvalidMemcpyDirection, "invalid copy direction for memcpy")           \
    X(cudaErrorInvalidDeviceFunction, "invalid device function")                      \
    X(cudaErrorNoDevice, "no CUDA-capable device is detected")                        \
    X(cudaErrorInvalidDevice, "invalid device ordinal")                               \
    X(cudaErrorInvalidResourceHandle, "invalid resource handle")                      \
    X(cudaErrorNotReady, "device not ready")                                          \
    X(cudaErrorIllegalAddress, "an illegal memory access was encountered")            \
    X(cudaErrorLaunchOutOfResources, "too many resources requested for launch")       \
    X(cudaErrorLaunchTimeout, "the launch timed out and was terminated")              \
    X(cudaErrorAssert, "device-side assert triggered")                                \
    X(cudaErrorIllegalInstruction, "an illegal instruction was encountered")          \
    X(cudaErrorMisalignedAddress, "misaligned address")                               \
    X(cudaErrorLaunchFailure, "unspecified launch failure")                           \
    X(cudaErrorNotSupported, "operation not supported")                               \
    X(cudaErrorIllegalState, "operation not permitted in the current state")                     \
    X(cudaErrorStreamCaptureUnsupported, "operation not permitted when stream is capturing")    \
    X(cudaErrorStreamCaptureInvalidated, "operation failed due to a previous error during capture") \
    X(cudaErrorStreamCaptureImplicit, "operation would make the legacy stream depend on a capturing blocking stream") \
    X(cudaErrorUnknown, "unknown error")

const char* cudaGetErrorString(cudaError_t error) {
#define X(code, text) \
    case code: return text;
    switch (error) { KILN_EMU_ERRORS(X) default: return "unrecognized error code"; }
#undef X
}

const char* cudaGetErrorName(cudaError_t error) {
#define X(code, text) \
    case code: return #code;
    switch (error) { KILN_EMU_ERRORS(X) default: return "cudaErrorUnknown"; }
#undef X
}

// --- device memory -------------------------------------------------------------------------------
cudaError_t cudaMalloc(void** ptr, size_t size) {
    if (!ptr) return set_error(cudaErrorInvalidValue, "cudaMalloc: the result pointer is null");
    *ptr = nullptr;
    if (kiln::emu::capture_forbids_here())
        return kiln::emu::refuse_during_capture(
            cudaErrorStreamCaptureUnsupported, "cudaMalloc (" + std::to_string(size) + " bytes)",
            "a graph does not allocate again when it is launched, so memory a captured step uses must exist before "
            "the capture");
    if (size == 0) return cudaSuccess;
    void* p = nullptr;
    if (posix_memalign(&p, 256, size) != 0)
        return set_error(cudaErrorMemoryAllocation, "cudaMalloc: the host cannot provide " + std::to_string(size) + " bytes");
    // Poison: a GPU hands out whatever the memory held; here every byte is 0xFF, which reads as
    // NaN in f32, f16 and bf16 (and -1 in ints), so a kernel reading memory nobody wrote yields NaN.
    std::memset(p, kiln::emu::kPoisonByte, size);
    std::lock_guard<std::mutex> lock(kiln::emu::memory_mutex());
    kiln::emu::allocations()[reinterpret_cast<std::uintptr_t>(p)] = size;
    kiln::emu::allocated_bytes() += size;
    *ptr = p;
    return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
    if (!ptr) return cudaSuccess;
    if (kiln::emu::capture_forbids_here())
        return kiln::emu::refuse_during_capture(cudaErrorStreamCaptureUnsupported, "cudaFree",
                                                "cudaFree waits for the device, which a capture cannot record");
    {
        std::lock_guard<std::mutex> lock(kiln::emu::memory_mutex());
        auto it = kiln::emu::allocations().find(reinterpret_cast<std::uintptr_t>(ptr));
        if (it == kiln::emu::allocations().end())
            return set_error(cudaErrorInvalidValue, "cudaFree: " + kiln::emu::ptr_str(ptr) +
                                                        " is not the start of a cudaMalloc allocation (freed twice?)");
        kiln::emu::allocated_bytes() -= it->second;
        kiln::emu::allocations().erase(it);
    }
    std::free(ptr);
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void** ptr, size_t size) {
    if (!ptr) return set_error(cudaErrorInvalidValue, "cudaMallocHost: the result pointer is null");
    if (posix_memalign(ptr, 256, size ? size : 1) != 0) {
        *ptr = nullptr;
        return set_error(cudaErrorMemoryAllocation, "cudaMallocHost: out of host memory");
    }
    return cudaSuccess;
}
cudaError_t cudaFreeHost(void* ptr) {
    std::free(ptr);
    return cudaSuccess;
}

namespace kiln::emu {
namespace {
cudaError_t copy_on(const char* call, bool synchronous, void* dst, const void* src, size_t count,
                    cudaMemcpyKind kind, cudaStream_t stream) {
    const std::string what = std::string(call) + " (" + kind_name(kind) + ", " + std::to_string(count) + " bytes)";
    return on_stream(what, synchronous, stream,
                     [=](bool perform) { return copy(call, dst, src, count, kind, perform); });
}
cudaError_t fill_on(const char* call, bool synchronous, void* p, int value, size_t count, cudaStream_t stream) {
    const std::string what = std::string(call) + " (" + std::to_string(count) + " bytes)";
    return on_stream(what, synchronous, stream, [=](bool perform) { return fill(call, p, value, count, perform); });
}
}  // namespace
}  // namespace kiln::emu

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
    return kiln::emu::copy_on("cudaMemcpy", true, dst, src, count, kind, nullptr);
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t stream) {
    return kiln::emu::copy_on("cudaMemcpyAsync", false, dst, src, count, kind, stream);
}
cudaError_t cudaMemset(void* p, int value, size_t count) {
    return kiln::emu::fill_on("cudaMemset", true, p, value, count, nullptr);
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t count, cudaStream_t stream) {
    return kiln::emu::fill_on("cudaMemsetAsync", false, p, value, count, stream);
}

// __constant__ and __device__ variables are ordinary globals in the emulator.
cudaError_t cudaMemcpyToSymbol(const void* symbol, const void* src, size_t count, size_t offset, cudaMemcpyKind) {
    std::memcpy(static_cast<char*>(const_cast<void*>(symbol)) + offset, src, count);
    return cudaSuccess;
}
cudaError_t cudaMemcpyFromSymbol(void* dst, const void* symbol, size_t count, size_t offset, cudaMemcpyKind) {
    std::memcpy(dst, static_cast<const char*>(symbol) + offset, count);
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
    const std::size_t all = kiln::emu::host_memory();
    std::lock_guard<std::mutex> lock(kiln::emu::memory_mutex());
    const std::size_t used = kiln::emu::allocated_bytes();
    if (total) *total = all;
    if (free) *free = used < all ? all - used : 0;
    return cudaSuccess;
}

// --- the one device ---------------------------------------------------------------------------------
cudaError_t cudaGetDeviceCount(int* count) {
    if (count) *count = 1;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
    if (device != 0)
        return set_error(cudaErrorInvalidDevice, "cudaSetDevice(" + std::to_string(device) + "): the emulator has device 0 only");
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
    if (device) *device = 0;
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() {
    if (kiln::emu::capture_forbids_here())
        return kiln::emu::refuse_during_capture(cudaErrorStreamCaptureUnsupported, "cudaDeviceSynchronize",
                                                "the host cannot wait for work that is recorded, not run");
    {
        std::lock_guard<std::mutex> lock(kiln::emu::queue_mutex());
        for (cudaStream_t s : kiln::emu::deferred_streams()) kiln::emu::run_until_locked(s, nullptr, 0);
    }
    // Launches finish before they return; like a GPU, report a kernel's failure here too.
    return kiln::emu::last_error == cudaErrorLaunchFailure ? cudaErrorLaunchFailure : cudaSuccess;
}
cudaError_t cudaDeviceReset() { return cudaSuccess; }

namespace kiln::emu {
namespace {
std::atomic<int> multiprocessors_set{0};  // 0: the OpenMP threads
}  // namespace

int set_multiprocessors(int count) { return multiprocessors_set.exchange(count > 0 ? count : 0); }
int multiprocessors() {
    const int set = multiprocessors_set.load();
    if (set > 0) return set;
    static const int from_env = [] {
        const char* v = std::getenv("KILN_EMU_MULTIPROCESSORS");
        return v ? std::atoi(v) : 0;
    }();
    return from_env > 0 ? from_env : omp_get_max_threads();
}
}  // namespace kiln::emu

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
    if (!prop || device != 0) return set_error(cudaErrorInvalidDevice, "cudaGetDeviceProperties: device 0 only");
    std::memset(prop, 0, sizeof *prop);
    std::strncpy(prop->name, "kiln CUDA emulator (CPU)", sizeof prop->name - 1);
    prop->totalGlobalMem = kiln::emu::host_memory();
    prop->sharedMemPerBlock = 48 * 1024;
    prop->sharedMemPerBlockOptin = 227 * 1024;
    prop->regsPerBlock = 65536;
    prop->warpSize = 32;
    prop->maxThreadsPerBlock = 1024;
    prop->maxThreadsDim[0] = 1024, prop->maxThreadsDim[1] = 1024, prop->maxThreadsDim[2] = 64;
    prop->maxGridSize[0] = 2147483647, prop->maxGridSize[1] = 65535, prop->maxGridSize[2] = 65535;
    prop->multiProcessorCount = kiln::emu::multiprocessors();
    prop->maxThreadsPerMultiProcessor = 2048;
    prop->major = 8, prop->minor = 0;
    return cudaSuccess;
}

// The attributes kiln asks for, as cudaGetDeviceProperties reports them.
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
    if (!value) return set_error(cudaErrorInvalidValue, "cudaDeviceGetAttribute: null pointer");
    cudaDeviceProp prop;
    if (const cudaError_t e = cudaGetDeviceProperties(&prop, device); e != cudaSuccess) return e;
    switch (attr) {
    case cudaDevAttrMultiProcessorCount: *value = prop.multiProcessorCount; break;
    case cudaDevAttrMaxThreadsPerBlock: *value = prop.maxThreadsPerBlock; break;
    case cudaDevAttrMaxThreadsPerMultiProcessor: *value = prop.maxThreadsPerMultiProcessor; break;
    case cudaDevAttrWarpSize: *value = prop.warpSize; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = int(prop.sharedMemPerBlock); break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = int(prop.sharedMemPerBlockOptin); break;
    case cudaDevAttrComputeCapabilityMajor: *value = prop.major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = prop.minor; break;
    default:
        return set_error(cudaErrorInvalidValue, "cudaDeviceGetAttribute: attribute " + std::to_string(int(attr)) +
                                                    " is not emulated (add it to cuda/emu/runtime.cpp)");
    }
    return cudaSuccess;
}

// --- streams and events ------------------------------------------------------------------------------
// A blocking stream's work has already happened; a non-blocking stream's waits in its queue until a
// synchronize, an event wait or a launch on it runs the queue up to what is waited for.
cudaError_t cudaStreamCreate(cudaStream_t* stream) {
    if (!stream) return set_error(cudaErrorInvalidValue, "cudaStreamCreate: null pointer");
    *stream = new CUstream_st;
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags) {
    if (const cudaError_t e = cudaStreamCreate(stream); e != cudaSuccess) return e;
    (*stream)->blocking = !(flags & cudaStreamNonBlocking);
    if (!(*stream)->blocking) {
        std::lock_guard<std::mutex> lock(kiln::emu::queue_mutex());
        kiln::emu::deferred_streams().insert(*stream);
    }
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    if (stream && stream->capturing)
        return set_error(cudaErrorIllegalState, "cudaStreamDestroy: the stream is capturing (end the capture first)");
    if (stream) {  // a GPU finishes a destroyed stream's work
        std::lock_guard<std::mutex> lock(kiln::emu::queue_mutex());
        kiln::emu::run_until_locked(stream, nullptr, 0);
        kiln::emu::deferred_streams().erase(stream);
    }
    delete stream;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    if (kiln::emu::capture_forbids_here())
        return kiln::emu::refuse_during_capture(cudaErrorStreamCaptureUnsupported, "cudaStreamSynchronize",
                                                "the host cannot wait for work that is recorded, not run");
    kiln::emu::run_queued(stream);
    return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t stream) {
    kiln::emu::run_queued(stream);  // asked, the emulator finishes it
    return cudaSuccess;
}
// The stream's later work waits for the event: here, whatever the event's latest record waits for
// on another (deferred) stream runs now.
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned) {
    if (!event) return set_error(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent: null event");
    std::lock_guard<std::mutex> lock(kiln::emu::queue_mutex());
    if (event->pending && event->pending != stream) kiln::emu::run_to_event_locked(event);
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
    if (!event) return set_error(cudaErrorInvalidValue, "cudaEventCreate: null pointer");
    *event = new CUevent_st;
    return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned) { return cudaEventCreate(event); }
cudaError_t cudaEventDestroy(cudaEvent_t event) {
    if (event) {  // no queue may keep a record of it
        std::lock_guard<std::mutex> lock(kiln::emu::queue_mutex());
        for (cudaStream_t s : kiln::emu::deferred_streams()) {
            std::uint64_t last = 0;
            for (const QueuedOp& op : s->queued)
                if (op.event == event) last = op.record;
            if (last) kiln::emu::run_until_locked(s, event, last);
        }
    }
    delete event;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    if (!event) return set_error(cudaErrorInvalidResourceHandle, "cudaEventRecord: null event");
    const bool deferred = kiln::emu::defers(stream);
    std::lock_guard<std::mutex> lock(kiln::emu::queue_mutex());
    const std::uint64_t record = ++event->records;
    if (deferred) {
        event->pending = stream;
        stream->queued.push_back(QueuedOp{{}, event, record});
    } else {
        kiln::emu::mark_recorded(event, record);
    }
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    if (kiln::emu::capture_forbids_here())
        return kiln::emu::refuse_during_capture(cudaErrorStreamCaptureUnsupported, "cudaEventSynchronize",
                                                "the host cannot wait for work that is recorded, not run");
    if (!event) return set_error(cudaErrorInvalidResourceHandle, "cudaEventSynchronize: null event");
    std::lock_guard<std::mutex> lock(kiln::emu::queue_mutex());
    kiln::emu::run_to_event_locked(event);
    return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t event) {
    if (!event) return set_error(cudaErrorInvalidResourceHandle, "cudaEventQuery: null event");
    std::lock_guard<std::mutex> lock(kiln::emu::queue_mutex());
    kiln::emu::run_to_event_locked(event);  // asked, the emulator finishes it
    return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
    if (!ms || !start || !end) return set_error(cudaErrorInvalidValue, "cudaEventElapsedTime: null argument");
    std::lock_guard<std::mutex> lock(kiln::emu::queue_mutex());
    kiln::emu::run_to_event_locked(start);
    kiln::emu::run_to_event_locked(end);
    if (!start->recorded || !end->recorded)
        return set_error(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: an event was never recorded");
    *ms = std::chrono::duration<float, std::milli>(end->time - start->time).count();
    return cudaSuccess;
}

// --- stream capture and graphs: record a stream's work, launch it again -----------------------------
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
    if (!stream)
        return set_error(cudaErrorStreamCaptureUnsupported,
                         "cudaStreamBeginCapture: the legacy default stream cannot capture; create a stream");
    std::lock_guard<std::mutex> lock(kiln::emu::capture_mutex());
    if (stream->capturing)
        return set_error(cudaErrorIllegalState, "cudaStreamBeginCapture: the stream is capturing already");
    stream->capturing = true;
    stream->mode = mode;
    stream->owner = std::this_thread::get_id();
    stream->invalidated.clear();
    stream->nodes.clear();
    kiln::emu::capturing_streams().insert(stream);
    kiln::emu::captures_running++;
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
    if (!graph) return set_error(cudaErrorInvalidValue, "cudaStreamEndCapture: null pointer");
    *graph = nullptr;
    std::lock_guard<std::mutex> lock(kiln::emu::capture_mutex());
    if (!stream || !stream->capturing)
        return set_error(cudaErrorIllegalState, "cudaStreamEndCapture: the stream is not capturing");
    stream->capturing = false;
    kiln::emu::capturing_streams().erase(stream);
    kiln::emu::captures_running--;
    std::vector<CaptureNode> nodes = std::move(stream->nodes);
    stream->nodes.clear();
    if (!stream->invalidated.empty())
        return set_error(cudaErrorStreamCaptureInvalidated,
                         "cudaStreamEndCapture: the capture was invalidated by " + stream->invalidated);
    *graph = new CUgraph_st{std::move(nodes)};
    return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
    if (!status) return set_error(cudaErrorInvalidValue, "cudaStreamIsCapturing: null pointer");
    std::lock_guard<std::mutex> lock(kiln::emu::capture_mutex());
    *status = !stream || !stream->capturing  ? cudaStreamCaptureStatusNone
              : stream->invalidated.empty() ? cudaStreamCaptureStatusActive
                                            : cudaStreamCaptureStatusInvalidated;
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
    if (!exec || !graph) return set_error(cudaErrorInvalidValue, "cudaGraphInstantiate: null argument");
    *exec = new CUgraphExec_st{graph->nodes};
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
    delete graph;
    return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
    delete exec;
    return cudaSuccess;
}

// Runs the recorded operations in order, as the one stream they were captured from ran them; a
// kernel's failure stops the graph and is returned (a GPU would report it at the next wait).
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
    if (!exec) return set_error(cudaErrorInvalidResourceHandle, "cudaGraphLaunch: null graph");
    if (kiln::emu::capture_running())
        return kiln::emu::refuse_during_capture(cudaErrorStreamCaptureUnsupported, "cudaGraphLaunch",
                                                "the emulator does not capture graph launches");
    kiln::emu::run_queued(stream);
    kiln::emu::graphs_launched++;
    for (const CaptureNode& node : exec->nodes) {
        node.run();
        if (const cudaError_t e = cudaPeekAtLastError(); e != cudaSuccess) return e;
    }
    return cudaSuccess;
}
