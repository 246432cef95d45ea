// common.cuh — what several kernel files share: the 1-D launch shape, an unroll hint that both
// compilers understand, the block reduction, and device scratch memory from kiln's allocator.
//
// Letters: n = element count, t = threadIdx.x, T = blockDim.x.
#pragma once
#include <algorithm>
#include <cstdint>

#include "core/allocator.h"
#include "kiln_cuda.h"

// `#pragma unroll` is nvcc's; g++ (the emulator build) spells it `#pragma GCC unroll n` and
// warns about the other one, which -Werror makes an error.
#if defined(__CUDACC__)
#define KILN_UNROLL _Pragma("unroll")
#else
#define KILN_UNROLL _Pragma("GCC unroll 16")
#endif

namespace kiln::cuda::detail {

constexpr int kBlock = 256;  // threads per block of the 1-D kernels: 8 warps

// The 1-D grid for n elements: one thread per element up to max_blocks blocks; past that the
// kernels' grid-stride loops give each thread several elements (i, i + gridDim.x·T, ...).
// 1024 blocks of 256 threads (262,144 threads) already fill a big GPU (an H100 or H200 holds
// 132 SMs × 2048 threads), and on the emulator fewer threads doing more each costs less.
// Never 0 blocks: launches with n == 0 are skipped by the caller.
inline unsigned blocks_for(int64_t n, int block = kBlock, int64_t max_blocks = 1024) {
    return unsigned(std::max<int64_t>(1, std::min<int64_t>((n + block - 1) / block, max_blocks)));
}

struct SumOp {
    template <typename T>
    __device__ T operator()(T a, T b) const { return a + b; }
};
struct MaxOp {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// Reduces one value per thread to one value for the whole block, returned to every thread.
// T (blockDim.x) must be a power of two from 64 to 1024; `sh` is shared memory for T values.
//
//   stage 1, tree in shared memory:   for s = T/2, T/4, ..., 64:   sh[t] = op(sh[t], sh[t + s])
//                                     for t < s, then a barrier (the next step reads what other
//                                     threads wrote)
//   stage 2, warp shuffle:            the first warp folds the last 64 values into 32 registers,
//                                     then v = op(v, v of lane + 16, 8, 4, 2, 1): no shared
//                                     memory and no barrier, the 32 lanes exchange registers
//   broadcast:                        lane 0 writes the result to sh[0]; barrier; all read it;
//                                     barrier (so a following call cannot overwrite it early)
//
// The order of the operations is fixed by t alone, so a sum comes out bit-identical on every run.
template <typename V, typename Op>
__device__ V block_reduce(V v, V* sh, Op op) {
    const unsigned t = threadIdx.x;
    sh[t] = v;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 32; s >>= 1) {
        if (t < s) sh[t] = op(sh[t], sh[t + s]);
        __syncthreads();
    }
    if (t < 32) {
        v = op(sh[t], sh[t + 32]);
        for (int offset = 16; offset > 0; offset >>= 1) v = op(v, __shfl_down_sync(0xffffffffu, v, offset));
        if (t == 0) sh[0] = v;
    }
    __syncthreads();
    v = sh[0];
    __syncthreads();
    return v;
}

// Device scratch memory for one call (partial sums, per-row losses), from the CUDA pool
// allocator with Category::Workspace: it shows in memory reports, counts against --mem-limit,
// and after the first step it is a cached block, not a cudaMalloc.
class Workspace {
public:
    explicit Workspace(size_t bytes)
        : ptr_(pool_allocator(Device::CUDA).allocate(bytes, Category::Workspace)) {}
    ~Workspace() { pool_allocator(Device::CUDA).deallocate(ptr_); }
    Workspace(const Workspace&) = delete;
    Workspace& operator=(const Workspace&) = delete;
    template <typename T>
    T* as() const { return static_cast<T*>(ptr_); }

private:
    void* ptr_;
};

}  // namespace kiln::cuda::detail
