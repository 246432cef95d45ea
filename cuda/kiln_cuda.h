// kiln_cuda.h — the one header every .cu file includes. The same kernel source builds two ways:
//
//   nvcc (make CUDA=1)        the real CUDA runtime; kernels run on the GPU
//   g++ -x c++ (make)         kiln's kernel emulator (cuda/emu/): each block's threads run as
//                             fibers on a CPU thread, blocks in parallel on OpenMP threads
//
// What a .cu file uses from here:
//   KILN_LAUNCH(kernel, grid, block, shared_bytes)(args...);   kernel<<<grid, block, shared_bytes>>>(args...)
//   KILN_LAUNCH_STREAM(kernel, grid, block, shared_bytes, stream)(args...);
//   KILN_CHECK_LAUNCH(kernel, grid, block);   after every launch: throws kiln::Error naming the
//                                             kernel, its shapes, the CUDA error and what to try
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

#include <sstream>
#include <string>

#include "core/error.h"

#if defined(__CUDACC__)

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>  // nvcuda::wmma, the tensor cores' warp-level matrix API

#define KILN_LAUNCH(kernel, grid, block, shared_bytes) kernel<<<(grid), (block), (shared_bytes)>>>
#define KILN_LAUNCH_STREAM(kernel, grid, block, shared_bytes, stream) \
    kernel<<<(grid), (block), (shared_bytes), (stream)>>>
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

#define KILN_LAUNCH(kernel, grid, block, shared_bytes) \
    ::kiln::emu::make_launch(#kernel, kernel, (grid), (block), (shared_bytes))
#define KILN_LAUNCH_STREAM(kernel, grid, block, shared_bytes, stream) \
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
       << emulator_detail() << ". Try: " << launch_hint(e);
    return os.str();
}

}  // namespace kiln::cuda_detail

#define KILN_CUDA_CHECK(call)                                                                \
    do {                                                                                     \
        const cudaError_t kiln_cuda_err_ = (call);                                           \
        if (kiln_cuda_err_ != cudaSuccess)                                                   \
            KILN_FAIL(#call, " failed: ", cudaGetErrorString(kiln_cuda_err_), " (",          \
                      cudaGetErrorName(kiln_cuda_err_), ")",                                 \
                      ::kiln::cuda_detail::emulator_detail());                               \
    } while (0)

#define KILN_CHECK_LAUNCH(kernel, grid, block)                                                  \
    do {                                                                                        \
        const cudaError_t kiln_cuda_err_ = cudaGetLastError();                                  \
        if (kiln_cuda_err_ != cudaSuccess)                                                      \
            KILN_FAIL(::kiln::cuda_detail::launch_failure(#kernel, dim3(grid), dim3(block),     \
                                                          kiln_cuda_err_));                     \
    } while (0)
