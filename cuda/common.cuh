// common.cuh — what several kernel files share: the 1-D launch shape, an unroll hint that both
// compilers understand, the block reduction, device scratch memory from kiln's allocator, and
// the tensor-core (wmma) warp tile of the f16/bf16 GEMM and convolution.
//
// Letters: n = element count, t = threadIdx.x, T = blockDim.x.
#pragma once
#include <algorithm>
#include <cstdint>

#include "core/allocator.h"
#include "core/dtype.h"
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

// The current device's multiprocessors (SMs): 132 on an H100 or H200; on the emulator the OpenMP
// threads, or what a test sets (kiln::emu::ScopedMultiprocessors). The GEMMs size their grids by
// it, and split-K its workspace; asked at every call (an attribute look-up), so the memory
// model (train/memory_model.h) and the kernels always see the same count.
inline int64_t multiprocessors() {
    int device = 0, count = 0;
    KILN_CUDA_CHECK(cudaGetDevice(&device));
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    return int64_t(std::max(1, count));
}

struct SumOp {
    template <typename T>
    __device__ T operator()(T a, T b) const { return a + b; }
};
struct MaxOp {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct MinOp {
    __device__ long long operator()(long long a, long long b) const { return a < b ? a : b; }
};

// Reduces one value per lane of a warp (all 32 lanes present) to lane 0:
//   v = op(v, v of lane + 16), then + 8, 4, 2, 1     registers only: no shared memory, no barrier
// Lanes other than 0 end with partial results. The order is fixed by the lane alone.
template <typename V, typename Op>
__device__ V warp_reduce(V v, Op op) {
    for (int offset = 16; offset > 0; offset >>= 1) v = op(v, __shfl_down_sync(0xffffffffu, v, offset));
    return v;
}

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
        v = warp_reduce(op(sh[t], sh[t + 32]), op);
        if (t == 0) sh[0] = v;
    }
    __syncthreads();
    v = sh[0];
    __syncthreads();
    return v;
}

// Device scratch memory for one call (partial sums, per-row losses): core/allocator.h.
using ::kiln::Workspace;

// ---- tensor cores: one warp's share of a 64×64 tile (GEMM version 5, conv.cu) --------------------
// wmma's element type for kiln's 16-bit types: the same 16 bits under CUDA's name.
template <typename T> struct WmmaType;
template <> struct WmmaType<f16> { using type = __half; };
template <> struct WmmaType<bf16> { using type = __nv_bfloat16; };

// The block tile: BM×BN of the output, 4 warps (128 threads) of 32×32 each, K in steps of BK.
// Both inputs are staged in shared memory k-major, as gemm_tiled does:
//   As[k][m]  (BK × BM, row stride kLdA)    op(A)'s tile, read as a col_major matrix_a
//   Bs[k][n]  (BK × BN, row stride kLdB)    op(B)'s tile, read as a row_major matrix_b
//   Cs[m][n]  (BM × BN floats, kLdC)        the result, before alpha/beta and the masked store
// The padding (+8 elements, +4 floats) keeps every row a multiple of 16 bytes (wmma's ldm rule)
// and moves successive rows to other banks; fragments start at multiples of 16 rows and columns,
// so at 32-byte boundaries of the __align__(32) arrays (wmma's pointer rule).
namespace wmma_tile {
constexpr int kBM = 64, kBN = 64, kBK = 32, kThreads = 128;
constexpr int kLdA = kBM + 8, kLdB = kBN + 8, kLdC = kBN + 4;
}  // namespace wmma_tile

// Warp w (0..3) owns rows wm = (w / 2)·32 .. +31 and columns wn = (w % 2)·32 .. +31 of the
// block tile: 2×2 accumulator fragments of 16×16, in float.
//   mma:    for kk = 0, 16:  a[i] = As[kk..+15][wm + 16i ..+15]ᵀ,  b[j] = Bs[kk..+15][wn + 16j ..+15]
//                            acc[i][j] = a[i]·b[j] + acc[i][j]            (4 loads, 4 products)
//   store:  Cs[wm + 16i ..][wn + 16j ..] = acc[i][j]
// Every call is a warp-wide collective: all 32 lanes of each warp run these together.
template <typename T>
struct WmmaWarpTile {
    using W = typename WmmaType<T>::type;
    nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> acc[2][2];
    int wm, wn;

    __device__ WmmaWarpTile() : wm(int(threadIdx.x) / 64 * 32), wn(int(threadIdx.x) / 32 % 2 * 32) {
        KILN_UNROLL
        for (int i = 0; i < 2; i++) {
            KILN_UNROLL
            for (int j = 0; j < 2; j++) nvcuda::wmma::fill_fragment(acc[i][j], 0.0f);
        }
    }

    __device__ void mma(const T (*As)[wmma_tile::kLdA], const T (*Bs)[wmma_tile::kLdB]) {
        namespace wmma = nvcuda::wmma;
        KILN_UNROLL
        for (int kk = 0; kk < wmma_tile::kBK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, W, wmma::col_major> a[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, W, wmma::row_major> b[2];
            KILN_UNROLL
            for (int i = 0; i < 2; i++) {
                wmma::load_matrix_sync(a[i], reinterpret_cast<const W*>(&As[kk][wm + 16 * i]), wmma_tile::kLdA);
                wmma::load_matrix_sync(b[i], reinterpret_cast<const W*>(&Bs[kk][wn + 16 * i]), wmma_tile::kLdB);
            }
            KILN_UNROLL
            for (int i = 0; i < 2; i++) {
                KILN_UNROLL
                for (int j = 0; j < 2; j++) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
            }
        }
    }

    __device__ void store(float (*Cs)[wmma_tile::kLdC]) const {
        KILN_UNROLL
        for (int i = 0; i < 2; i++) {
            KILN_UNROLL
            for (int j = 0; j < 2; j++)
                nvcuda::wmma::store_matrix_sync(&Cs[wm + 16 * i][wn + 16 * j], acc[i][j], wmma_tile::kLdC,
                                                nvcuda::wmma::mem_row_major);
        }
    }
};

}  // namespace kiln::cuda::detail
