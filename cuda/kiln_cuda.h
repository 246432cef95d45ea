// kiln_cuda.h — the one header every .cu file includes. The same kernel source builds two ways:
//
//   nvcc (make CUDA=1)        the real CUDA runtime; kernels run on the GPU
//   g++ -x c++ (make)         kiln's kernel emulator (cuda/emu/): each block's threads run as
//                             fibers on a CPU thread, blocks in parallel on OpenMP threads
//
// What a .cu file uses from here:
//   KILN_LAUNCH(kernel, grid, block, shared_bytes)(args...);   kernel<<<grid, block, shared_bytes, s>>>(args...)
//                                             on kiln's launch stream s (below: the legacy stream,
//                                             or the capturing one during a CUDA Graph capture)
//   KILN_LAUNCH_STREAM(kernel, grid, block, shared_bytes, stream)(args...);
//   KILN_CHECK_LAUNCH(kernel, grid, block);   after every launch: throws kiln::Error naming the
//                                             kernel, its shapes, the CUDA error and what to try;
//                                             with KILN_SYNC_LAUNCHES=1 in the environment it
//                                             also waits for the kernel to finish (below)
//                                             (the two macros also time each kernel by CUDA
//                                             events while kernel timing is on: below)
//   KILN_CUDA_CHECK(cudaMemcpy(...));         any runtime call: throws kiln::Error on failure
//   KILN_DYNAMIC_SHARED(float, smem);         in a kernel: `extern __shared__ float smem[];`
//                                             (all dynamic shared arrays of a kernel alias one
//                                             buffer, its size the launch's shared_bytes)
//   nvcuda::wmma::fragment, load_matrix_sync, mma_sync, ...   tensor cores (<mma.h>, or the
//                                             emulator's cuda/emu/wmma.h)
//
// A kernel template with several arguments needs a name without a comma for the macros:
//   constexpr auto gemm_64x64 = gemm_tiled<64, 64>;  KILN_LAUNCH(gemm_64x64, grid, block, 0)(...);
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>

#include "core/error.h"

#include <cuda_runtime.h>  // nvcc's, or the host declarations the emulator implements

namespace kiln::cuda_detail {

// ---- kernel timing (src/core/cuda_memory.h set_kernel_timing; --time-report on cuda) -------------
// While it is on, KILN_LAUNCH records a CUDA event on the launch's stream before the kernel and
// KILN_CHECK_LAUNCH one after it (a launch without a check is closed by the next launch).
// Off: one relaxed atomic load per launch.
inline std::atomic<bool>& kernel_timing() {
    static std::atomic<bool> on{false};
    return on;
}
void kernel_timing_start(const char* kernel, cudaStream_t stream);  // cuda/kernel_times.cu
void kernel_timing_stop();
// ---- TF32 for f32 products (src/core/cuda_memory.h set_tf32; the trainers' --tf32) --------------
// On: the f32 GEMM and implicit-GEMM convolutions run on the tensor cores with operands rounded to
// tf32 (cuda/tensor_tiles.cuh). Off (the default): f32 on the CUDA cores, every bit as before.
inline std::atomic<bool>& tf32() {
    static std::atomic<bool> on{false};
    return on;
}
// ---- the stream every KILN_LAUNCH goes to, and the launches counted -----------------------------
// kiln launches its kernels, device-to-device copies and fills on the legacy default stream
// (nullptr), which orders them with every synchronous copy — except while a CUDA Graph is being
// captured (cuda/graph.cu, --cuda-graph): then on the capturing stream, which records them
// instead of running them (the legacy stream cannot capture).
inline std::atomic<cudaStream_t>& launch_stream_slot() {
    static std::atomic<cudaStream_t> s{nullptr};
    return s;
}
inline cudaStream_t launch_stream() { return launch_stream_slot().load(std::memory_order_relaxed); }
// The kernel launches the host has made (KILN_LAUNCH), captured ones included: per training step
// what --time-report prints as the launch count (a replayed graph launches none of its kernels
// from the host). One relaxed atomic add per launch.
inline std::atomic<int64_t>& host_launches() {
    static std::atomic<int64_t> n{0};
    return n;
}
inline void launch_begins(const char* kernel, cudaStream_t stream) {
    host_launches().fetch_add(1, std::memory_order_relaxed);
    if (kernel_timing().load(std::memory_order_relaxed)) kernel_timing_start(kernel, stream);
}
inline void launch_ends() {
    if (kernel_timing().load(std::memory_order_relaxed)) kernel_timing_stop();
}

}  // namespace kiln::cuda_detail

#if defined(__CUDACC__)

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>  // nvcuda::wmma, the tensor cores' warp-level matrix API

#define KILN_LAUNCH(kernel, grid, block, shared_bytes)                           \
    ::kiln::cuda_detail::launch_begins(#kernel, ::kiln::cuda_detail::launch_stream()), \
        kernel<<<(grid), (block), (shared_bytes), ::kiln::cuda_detail::launch_stream()>>>
#define KILN_LAUNCH_STREAM(kernel, grid, block, shared_bytes, stream) \
    ::kiln::cuda_detail::launch_begins(#kernel, (stream)), kernel<<<(grid), (block), (shared_bytes), (stream)>>>
// One unsigned char array under one name for every kernel, so templates and kernels in one file
// never declare `extern __shared__` arrays of conflicting types.
#define KILN_DYNAMIC_SHARED(type, name)                                    \
    extern __shared__ __align__(16) unsigned char kiln_dynamic_shared_[]; \
    type* const name = reinterpret_cast<type*>(kiln_dynamic_shared_)

namespace kiln::cuda_detail {
inline std::string emulator_detail() { return {}; }
}  // namespace kiln::cuda_detail

#else  // g++: the emulator

#include "emu/emu.h"
#include "emu/wmma.h"  // the emulator's nvcuda::wmma
#include "emu/mma.h"   // the emulator's ldmatrix and mma.sync (PTX)

#define KILN_LAUNCH(kernel, grid, block, shared_bytes)                           \
    ::kiln::cuda_detail::launch_begins(#kernel, ::kiln::cuda_detail::launch_stream()), \
        ::kiln::emu::make_launch(#kernel, kernel, (grid), (block), (shared_bytes),     \
                                 ::kiln::cuda_detail::launch_stream())
#define KILN_LAUNCH_STREAM(kernel, grid, block, shared_bytes, stream) \
    ::kiln::cuda_detail::launch_begins(#kernel, (stream)),           \
        ::kiln::emu::make_launch(#kernel, kernel, (grid), (block), (shared_bytes), (stream))
#define KILN_DYNAMIC_SHARED(type, name) \
    type* const name = static_cast<type*>(::kiln::emu::dynamic_shared_memory())

namespace kiln::cuda_detail {
inline std::string emulator_detail() {
    std::string d = ::kiln::emu::last_error_detail();
    return d.empty() ? d : " [emulator: " + d + "]";
}
}  // namespace kiln::cuda_detail

#endif

namespace kiln::cuda_detail {

// ---- KILN_SYNC_LAUNCHES=1: blame an asynchronous fault on its kernel ---------------------------
// A launch returns before its kernel runs. A kernel that reads out of bounds is reported by the
// next call that waits for the GPU (a cudaMemcpy, the loss read back), which names that call and
// not the kernel. With KILN_SYNC_LAUNCHES=1, KILN_CHECK_LAUNCH calls cudaDeviceSynchronize after
// every launch, so the fault surfaces at the launch that made it (slow: the CPU waits for every
// kernel; for debugging only). Read once, at the first launch; read_sync_launches_env() reads it
// again (the tests). Off: one relaxed atomic load per launch.
inline bool sync_launches_env() {
    const char* v = std::getenv("KILN_SYNC_LAUNCHES");
    return v && std::strcmp(v, "1") == 0;
}
inline std::atomic<bool>& sync_launches() {
    static std::atomic<bool> on{sync_launches_env()};
    return on;
}
inline void read_sync_launches_env() { sync_launches().store(sync_launches_env()); }
// How many launches have waited for their kernel (the tests check that the switch is honoured).
inline std::atomic<int64_t>& launch_syncs() {
    static std::atomic<int64_t> n{0};
    return n;
}

// The launch's error, or with KILN_SYNC_LAUNCHES=1 the kernel's own (after it has finished).
inline cudaError_t launch_status() {
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess || !sync_launches().load(std::memory_order_relaxed)) return e;
    launch_syncs()++;
    return cudaDeviceSynchronize();
}

// A kernel's fault found by a later call: what to set to find the kernel.
inline const char* async_fault_hint(cudaError_t e) {
    const bool kernel_fault = e == cudaErrorLaunchFailure || e == cudaErrorIllegalAddress ||
                              e == cudaErrorMisalignedAddress || e == cudaErrorIllegalInstruction ||
                              e == cudaErrorAssert;
    return kernel_fault && !sync_launches().load() ? ". A kernel launched earlier may have made this fault: run again "
                                                      "with KILN_SYNC_LAUNCHES=1 to have it reported at its launch"
                                                    : "";
}

// A call refused because a CUDA Graph was being captured (--cuda-graph): what a captured step may
// not do.
inline const char* capture_hint(cudaError_t e) {
    const bool capture = e == cudaErrorStreamCaptureUnsupported || e == cudaErrorStreamCaptureImplicit ||
                         e == cudaErrorStreamCaptureInvalidated;
    return capture ? ". A CUDA Graph was being captured (--cuda-graph): a captured step must not read a value back "
                     "to the host, wait for the GPU or allocate device memory; run without --cuda-graph, or leave "
                     "out the option that reads back (a GradScaler, clipping)"
                   : "";
}

inline std::string dim_str(dim3 d) {
    std::ostringstream os;
    os << "(" << d.x << ", " << d.y << ", " << d.z << ")";
    return os.str();
}

// What to try, by error: the most common causes first.
inline const char* launch_hint(cudaError_t e) {
    switch (e) {
    case cudaErrorInvalidConfiguration:
        return "a block holds 1 to 1024 threads (block.z <= 64) and every grid dimension is >= 1 "
               "(grid.y, grid.z <= 65535); check the launch arithmetic, e.g. (n + 255) / 256 is 0 "
               "when n is 0";
    case cudaErrorInvalidValue:
        return "check the dynamic shared memory size (48 KiB unless raised with "
               "cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes)) "
               "and the kernel's arguments";
    case cudaErrorLaunchOutOfResources:
        return "use fewer threads per block, or fewer registers (__launch_bounds__)";
    default:
        return "run the kernel on the emulator (make, without CUDA=1) under `make test SAN=1` to "
               "find a bad memory access, and with KILN_EMU_SCHEDULE=reverse or shuffle to expose "
               "a missing __syncthreads(); on a GPU, compute-sanitizer";
    }
}

inline std::string launch_failure(const char* kernel, dim3 grid, dim3 block, cudaError_t e) {
    std::ostringstream os;
    os << "kernel " << kernel << " <<<grid " << dim_str(grid) << ", block " << dim_str(block)
       << ">>> failed: " << cudaGetErrorString(e) << " (" << cudaGetErrorName(e) << ")"
       << emulator_detail() << ". Try: " << launch_hint(e) << async_fault_hint(e) << capture_hint(e);
    return os.str();
}

}  // namespace kiln::cuda_detail

#define KILN_CUDA_CHECK(call)                                                                \
    do {                                                                                     \
        const cudaError_t kiln_cuda_err_ = (call);                                           \
        if (kiln_cuda_err_ != cudaSuccess)                                                   \
            KILN_FAIL(#call, " failed: ", cudaGetErrorString(kiln_cuda_err_), " (",          \
                      cudaGetErrorName(kiln_cuda_err_), ")",                                 \
                      ::kiln::cuda_detail::emulator_detail(),                                \
                      ::kiln::cuda_detail::async_fault_hint(kiln_cuda_err_),                 \
                      ::kiln::cuda_detail::capture_hint(kiln_cuda_err_));                    \
    } while (0)

#define KILN_CHECK_LAUNCH(kernel, grid, block)                                                  \
    do {                                                                                        \
        ::kiln::cuda_detail::launch_ends();                                                     \
        const cudaError_t kiln_cuda_err_ = ::kiln::cuda_detail::launch_status();                \
        if (kiln_cuda_err_ != cudaSuccess)                                                      \
            KILN_FAIL(::kiln::cuda_detail::launch_failure(#kernel, dim3(grid), dim3(block),     \
                                                          kiln_cuda_err_));                     \
    } while (0)
