// runtime.cpp — the CUDA runtime API on the CPU: device memory, copies, errors, streams, events.
//
// The declarations are the CUDA headers' own (cuda_runtime_api.h), so the emulator's functions
// have exactly CUDA's signatures and error codes. "Device" memory is host memory from
// posix_memalign (256-byte aligned, as cudaMalloc's), recorded in a table so that copies can
// check their pointers the way a GPU would reject them: a cudaMemcpyHostToDevice whose
// destination is not device memory fails here too, with a message saying which pointer.
//
// Launches and copies are synchronous; streams and events exist so that code written for a GPU
// runs unchanged (an event records the host clock). Errors are per host thread, like CUDA's:
// cudaGetLastError returns the latest and resets it. Unlike a GPU's, a failed kernel does not
// poison the context: later calls work.
#include <omp.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>

#include "emu.h"
#include "traffic.h"

struct CUstream_st {
    int unused = 0;
};
struct CUevent_st {
    std::chrono::steady_clock::time_point time;
    bool recorded = false;
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

cudaError_t copy(const char* call, void* dst, const void* src, std::size_t count, cudaMemcpyKind kind) {
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
        device_to_host_copies++;
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
    std::memmove(dst, src, count);
    return cudaSuccess;
}

cudaError_t fill(const char* call, void* p, int value, std::size_t count) {
    if (count == 0) return cudaSuccess;
    const std::string bad = check_side(call, "destination", p, count, true);
    if (!bad.empty()) return set_error(cudaErrorInvalidValue, bad);
    std::memset(p, value, count);
    return cudaSuccess;
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

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
    return kiln::emu::copy("cudaMemcpy", dst, src, count, kind);
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t) {
    return kiln::emu::copy("cudaMemcpyAsync", dst, src, count, kind);
}
cudaError_t cudaMemset(void* p, int value, size_t count) { return kiln::emu::fill("cudaMemset", p, value, count); }
cudaError_t cudaMemsetAsync(void* p, int value, size_t count, cudaStream_t) {
    return kiln::emu::fill("cudaMemsetAsync", p, value, count);
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

// --- streams and events: everything has already happened ------------------------------------------
cudaError_t cudaStreamCreate(cudaStream_t* stream) {
    if (!stream) return set_error(cudaErrorInvalidValue, "cudaStreamCreate: null pointer");
    *stream = new CUstream_st;
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned) { return cudaStreamCreate(stream); }
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    delete stream;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamQuery(cudaStream_t) { return cudaSuccess; }

cudaError_t cudaEventCreate(cudaEvent_t* event) {
    if (!event) return set_error(cudaErrorInvalidValue, "cudaEventCreate: null pointer");
    *event = new CUevent_st;
    return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned) { return cudaEventCreate(event); }
cudaError_t cudaEventDestroy(cudaEvent_t event) {
    delete event;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t) {
    if (!event) return set_error(cudaErrorInvalidResourceHandle, "cudaEventRecord: null event");
    event->time = std::chrono::steady_clock::now();
    event->recorded = true;
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    return event ? cudaSuccess : set_error(cudaErrorInvalidResourceHandle, "cudaEventSynchronize: null event");
}
cudaError_t cudaEventQuery(cudaEvent_t event) {
    return event ? cudaSuccess : set_error(cudaErrorInvalidResourceHandle, "cudaEventQuery: null event");
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
    if (!ms || !start || !end) return set_error(cudaErrorInvalidValue, "cudaEventElapsedTime: null argument");
    if (!start->recorded || !end->recorded)
        return set_error(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: an event was never recorded");
    *ms = std::chrono::duration<float, std::milli>(end->time - start->time).count();
    return cudaSuccess;
}
