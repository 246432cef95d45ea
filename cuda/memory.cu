// memory.cu — device memory for the engine: the CUDA runtime calls behind src/core/cuda_memory.h
// (and src/core/cuda_stream.h's second stream and events).
//
// The allocators (src/core/allocator.cpp) take their device slabs and blocks from
// malloc_device and give them back with free_device; Tensor::to / copy_from / zeros use the
// copies and the memset. Nothing else in the engine talks to the CUDA runtime directly.
//
//   nvcc (make CUDA=1)   the real runtime: cudaMalloc, cudaMemcpy, ... on the GPU
//   g++  (make)          the same calls, answered by the kernel emulator (cuda/emu/runtime.cpp)
//
// Every call is checked with KILN_CUDA_CHECK (a kiln::Error naming the call and the CUDA
// error), except the two places where failure is an answer and not a bug:
//   malloc_device   returns nullptr when the device has no room, so the allocator can throw
//                   OutOfMemory with its report (what is using the memory, what to try);
//   free_device     ignores cudaErrorCudartUnloading: at program exit the runtime may be torn
//                   down before the last static allocator gives its blocks back.
#include <cstdio>
#include <cstring>
#include <mutex>

#include "core/cuda_memory.h"
#include "core/cuda_stream.h"
#include "kiln_cuda.h"

namespace kiln::cuda {

bool is_emulated() {
#if defined(__CUDACC__)
    return false;
#else
    return true;
#endif
}

// On a GPU the allocator's --mem-limit is not the only limit: the device itself may have less
// free memory (other processes, the CUDA context). A request larger than cudaMemGetInfo's free
// bytes is refused up front, and a cudaMalloc that fails anyway (fragmentation) is refused too;
// both return nullptr, which the allocator reports as out of memory on cuda.
// On the emulator the "device" is the host's RAM (its cudaMemGetInfo: physical memory minus
// what the emulated cudaMalloc holds), checked the same way — which also keeps a request larger
// than the machine away from malloc, where AddressSanitizer would abort instead of failing.
void* malloc_device(size_t bytes) {
    if (bytes == 0) bytes = 1;  // cudaMalloc(0) gives nullptr, which would read as "out of memory"
    size_t free_bytes = 0, total_bytes = 0;
    KILN_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    if (bytes > free_bytes) return nullptr;
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();  // clear it, or the next KILN_CHECK_LAUNCH would report it
        return nullptr;
    }
    KILN_CUDA_CHECK(e);
    return p;
}

void free_device(void* ptr) {
    if (!ptr) return;
    const cudaError_t e = cudaFree(ptr);
    if (e == cudaErrorCudartUnloading) {
        (void)cudaGetLastError();
        return;
    }
    KILN_CUDA_CHECK(e);
}

// Host memory read or written, or the host waiting for the device, during a CUDA Graph capture:
// refused naming the call (nothing runs during a capture, so there is nothing to read yet).
static void refuse_if_capturing(const char* what, size_t bytes) {
    KILN_CHECK(!capturing(), what, " (", bytes, " bytes) while a CUDA Graph is being captured (--cuda-graph): a captured "
               "step must not read a value back to the host (a loss, a GradScaler's inf/NaN check, a norm), copy "
               "from host memory or wait for the device; run without --cuda-graph, or leave out the option that does");
}

void copy_to_device(void* dst, const void* src, size_t bytes) {
    if (bytes == 0) return;
    refuse_if_capturing("a copy from host memory to the device", bytes);
    KILN_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}

void copy_to_host(void* dst, const void* src, size_t bytes) {
    if (bytes == 0) return;
    refuse_if_capturing("a read back to the host", bytes);
    KILN_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}

void copy_to_device_async(void* dst, const void* src, size_t bytes) {
    if (bytes == 0) return;
    KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, 0));
}

void copy_device_to_device(void* dst, const void* src, size_t bytes) {
    if (bytes == 0) return;
    // queued like a kernel (on the capturing stream during a CUDA Graph capture); a device-to-
    // device cudaMemcpy does not wait for the host either
    KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cuda_detail::launch_stream()));
}

void memset_device(void* dst, int value, size_t bytes) {
    if (bytes == 0) return;
    KILN_CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, cuda_detail::launch_stream()));
}

void* malloc_host(size_t bytes) {
    void* p = nullptr;
    const cudaError_t e = cudaMallocHost(&p, bytes == 0 ? 1 : bytes);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        return nullptr;
    }
    KILN_CUDA_CHECK(e);
    return p;
}

void free_host(void* ptr) {
    if (!ptr) return;
    const cudaError_t e = cudaFreeHost(ptr);
    if (e == cudaErrorCudartUnloading) {
        (void)cudaGetLastError();
        return;
    }
    KILN_CUDA_CHECK(e);
}

void memory_info(size_t* free_bytes, size_t* total_bytes) {
    size_t f = 0, t = 0;
    KILN_CUDA_CHECK(cudaMemGetInfo(&f, &t));
    if (free_bytes) *free_bytes = f;
    if (total_bytes) *total_bytes = t;
}

void synchronize() {
    refuse_if_capturing("a wait for the device (synchronize)", 0);
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
}

PinnedStaging::~PinnedStaging() {
    if (done_) {
        (void)cudaEventSynchronize(static_cast<cudaEvent_t>(done_));  // no copy may read freed memory
        (void)cudaEventDestroy(static_cast<cudaEvent_t>(done_));
    }
    if (buffer_) (void)cudaFreeHost(buffer_);
}

void PinnedStaging::begin(size_t bytes) {
    if (!done_) {
        cudaEvent_t e = nullptr;
        KILN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        done_ = e;
    }
    KILN_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(done_)));  // the last round has been copied
    if (bytes > capacity_) {
        if (buffer_) KILN_CUDA_CHECK(cudaFreeHost(buffer_));
        buffer_ = nullptr;
        KILN_CUDA_CHECK(cudaMallocHost(&buffer_, bytes));
        capacity_ = bytes;
    }
    used_ = 0;
    round_ = bytes;
}

void PinnedStaging::copy_to_device(void* dst, const void* src, size_t bytes) {
    KILN_CHECK(done_ && used_ + bytes <= round_, "PinnedStaging: a copy of ", bytes, " bytes past the ", round_,
               " bytes begin() was given (", used_, " used); call begin() with the round's total");
    if (bytes == 0) return;
    char* staged = static_cast<char*>(buffer_) + used_;
    std::memcpy(staged, src, bytes);
    KILN_CUDA_CHECK(cudaMemcpyAsync(dst, staged, bytes, cudaMemcpyHostToDevice, 0));
    KILN_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(done_), 0));
    used_ += bytes;
}

Event::Event() {
    cudaEvent_t e = nullptr;
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    event_ = e;
}

Event::~Event() { (void)cudaEventDestroy(static_cast<cudaEvent_t>(event_)); }

void Event::record() { KILN_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event_), cuda_detail::launch_stream())); }

void Event::synchronize() const {
    refuse_if_capturing("a wait for an event", 0);
    KILN_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event_)));
}

CopyStream::CopyStream() {
    cudaStream_t s = nullptr;
    KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    stream_ = s;
}

CopyStream::~CopyStream() {
    (void)cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));  // no copy may outlive its memory
    (void)cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

void CopyStream::wait(const Event& e) {
    KILN_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream_), static_cast<cudaEvent_t>(e.handle()), 0));
}

void CopyStream::record(Event& e) {
    KILN_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(e.handle()), static_cast<cudaStream_t>(stream_)));
}

void CopyStream::copy_to_host(void* dst, const void* src, size_t bytes) {
    if (bytes == 0) return;
    KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(stream_)));
}

void CopyStream::copy_to_device(void* dst, const void* src, size_t bytes) {
    if (bytes == 0) return;
    KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, static_cast<cudaStream_t>(stream_)));
}

void CopyStream::synchronize() { KILN_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_))); }

void launch_stream_wait(const Event& e) {
    KILN_CUDA_CHECK(cudaStreamWaitEvent(cuda_detail::launch_stream(), static_cast<cudaEvent_t>(e.handle()), 0));
}

bool capturing() { return cuda_detail::launch_stream() != nullptr; }
int64_t kernel_launches() { return cuda_detail::host_launches().load(); }

void read_sync_launches_env() { cuda_detail::read_sync_launches_env(); }
int64_t launch_syncs() { return cuda_detail::launch_syncs().load(); }

const char* emulator_note() {
    return is_emulated() ? "note: no GPU build — CUDA kernels run on kiln's emulator (slow, exact)" : nullptr;
}

void print_emulator_note_once() {
    static std::once_flag once;
    std::call_once(once, [] {
        if (const char* note = emulator_note()) std::printf("%s\n", note);
    });
}

}  // namespace kiln::cuda
