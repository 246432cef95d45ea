// gemm_versions.cu — the teaching versions of the engine's matrix multiply (cuda/gemm.cu),
// declared in cuda/gemm_versions.h: the same arguments as cuda::gemm, every pointer device memory.
// The kernel lab (cuda/lab/gemm.cu) runs and times them beside the engine's versions, and the
// tests check them against the CPU; the engine itself never calls them, so no trainer links them
// (they are their own object in libkiln.a).
//
//   C[M,N] = alpha · op(A)[M,K] · op(B)[K,N] + beta · C[M,N]          all row-major
//   op(A) = A (M×K, row stride lda) or Aᵀ (A stored K×M);  op(B) = B (K×N) or Bᵀ (B stored N×K)
//   beta == 0: C is overwritten, never read.  alpha == 0 or K == 0: C = beta·C, A and B unread
//   (those cases are cuda::gemm's, which launches no product for them).
//
//   version 1  gemm_naive_kernel   block (16, 16), grid (ceil(N/16), ceil(M/16)): one thread per
//              C element, a K-long dot product from global memory. Each element of A is read by
//              N threads and each element of B by M threads: memory-bound at any size.
//   version 2  gemm_smem_kernel    same shape; the block walks K in 16-wide steps, each step
//              loading a 16×16 tile of op(A) and one of op(B) into shared memory (one element
//              per thread, coalesced), a barrier, 16 multiply-adds from shared memory, a barrier.
//              Global reads drop 16×.
//   version 3  gemm_tiled          a BM×BN tile of C per block, a TM×TN patch of it per thread
//              held in registers. Per BK-wide step the block stages a BM×BK tile of op(A) and a
//              BK×BN tile of op(B) in shared memory; each thread then loads TM values of A and TN
//              values of B into registers and does TM·TN multiply-adds with them: TM·TN/(TM+TN)
//              FMAs per shared-memory load instead of 1/2 in version 2. Two shapes:
//                128×128 tiles, BK 8, 8×8 per thread, 256 threads   when there are ≥ 256 such
//                                                                   tiles (big GEMMs)
//                 64×64 tiles, BK 32, 8×4 per thread, 128 threads   otherwise (more blocks)
//              grid = (ceil(N/BN), min(ceil(M/BM), 65535)); blocks loop over row tiles beyond.
//   version 5  gemm_wmma_kernel    T = f16 or bf16 (chapter 09): version 3's staging (as T, not
//              float), but the products run on the tensor cores: a 64×64 tile of C per block of
//              4 warps, each warp a 32×32 patch as 2×2 wmma fragments of 16×16×16, products and
//              sums in float (nvcuda::wmma; the emulator's cuda/emu/wmma.h). BK 32, 128 threads.
//
// Element types: A, B and C hold T = float, f16 or bf16 (a template parameter of every kernel).
// The tiles are loaded converted to float (load_a, load_b; version 5 keeps them in T, which the
// tensor cores read), the products are summed in float registers, and C is rounded to T once, on
// the store (store_c): f32 accumulation for every T. Every version handles any M, N, K (partial
// tiles are padded with zeros in shared memory and masked on the store) and all four transpose
// combinations (a template parameter each, so the inner loops carry no branches); loads are
// arranged so that consecutive threads read consecutive addresses whichever way A and B are stored.
//
// Build and run: `make test T='[cuda][gemm]'` checks versions 1 to 3 against the CPU,
// `make test T='[wmma]'` version 5; `make lab` runs them in the kernel lab (cuda/lab/gemm.cu),
// and on a GPU (`make CUDA=1 lab`) times them against cuBLAS.
#include <algorithm>
#include <type_traits>

#include "common.cuh"
#include "gemm_launch.cuh"
#include "gemm_versions.h"
#include "ops/gemm.h"

namespace kiln::cuda {

// op(A)[m,k] and op(B)[k,n] as floats (or as R: T itself for the tensor cores), or 0 outside the
// matrix (the padding of partial tiles).
template <bool TA, typename R = float, typename T>
__device__ __forceinline__ R load_a(const T* A, int64_t lda, int64_t M, int64_t K, int64_t m, int64_t k) {
    if (m >= M || k >= K) return R(0.0f);
    return R(TA ? A[k * lda + m] : A[m * lda + k]);
}
template <bool TB, typename R = float, typename T>
__device__ __forceinline__ R load_b(const T* B, int64_t ldb, int64_t K, int64_t N, int64_t k, int64_t n) {
    if (k >= K || n >= N) return R(0.0f);
    return R(TB ? B[n * ldb + k] : B[k * ldb + n]);
}

// c = alpha·acc + beta·c, reading c only when beta ≠ 0; rounded to T once
template <typename T>
__device__ __forceinline__ void store_c(T* c, float alpha, float acc, float beta) {
    *c = T(beta == 0.0f ? alpha * acc : alpha * acc + beta * float(*c));
}

// ---- version 1: one thread per C element --------------------------------------------------------
//   C[m,n] = alpha · Σ_k op(A)[m,k]·op(B)[k,n] + beta · C[m,n]      m = row, n = col of this thread
template <bool TA, bool TB, typename T>
__global__ void gemm_naive_kernel(int64_t M, int64_t N, int64_t K, float alpha, const T* A, int64_t lda,
                                  const T* B, int64_t ldb, float beta, T* C, int64_t ldc) {
    const int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    for (int64_t m = int64_t(blockIdx.y) * blockDim.y + threadIdx.y; m < M; m += int64_t(gridDim.y) * blockDim.y) {
        if (n >= N) continue;
        float acc = 0.0f;
        for (int64_t k = 0; k < K; k++) acc += load_a<TA>(A, lda, M, K, m, k) * load_b<TB>(B, ldb, K, N, k, n);
        store_c(&C[m * ldc + n], alpha, acc, beta);
    }
}

// ---- version 2: shared-memory tiles ---------------------------------------------------------------
constexpr int kTile = 16;

//   for each k0 = 0, 16, 32, ...:   As = op(A)[rows of the block, k0..k0+15]
//                                   Bs = op(B)[k0..k0+15, cols of the block]      barrier
//                                   acc += Σ_kk As[ty][kk]·Bs[kk][tx]              barrier
template <bool TA, bool TB, typename T>
__global__ void gemm_smem_kernel(int64_t M, int64_t N, int64_t K, float alpha, const T* A, int64_t lda,
                                 const T* B, int64_t ldb, float beta, T* C, int64_t ldc) {
    __shared__ float As[kTile][kTile + 1];  // As[m][k]; +1 column: a column read hits 16 banks, not 1
    __shared__ float Bs[kTile][kTile + 1];  // Bs[k][n]
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int64_t col0 = int64_t(blockIdx.x) * kTile;
    const int64_t tiles_m = (M + kTile - 1) / kTile;
    for (int64_t tile = blockIdx.y; tile < tiles_m; tile += gridDim.y) {
        const int64_t row0 = tile * kTile;
        float acc = 0.0f;
        for (int64_t k0 = 0; k0 < K; k0 += kTile) {
            // Coalesced: threadIdx.x walks the dimension that is contiguous in memory.
            if (TA) As[tx][ty] = load_a<TA>(A, lda, M, K, row0 + tx, k0 + ty);  // A stored K×M
            else As[ty][tx] = load_a<TA>(A, lda, M, K, row0 + ty, k0 + tx);     // A stored M×K
            if (TB) Bs[tx][ty] = load_b<TB>(B, ldb, K, N, k0 + tx, col0 + ty);  // B stored N×K
            else Bs[ty][tx] = load_b<TB>(B, ldb, K, N, k0 + ty, col0 + tx);     // B stored K×N
            __syncthreads();  // the tiles are complete
            KILN_UNROLL
            for (int kk = 0; kk < kTile; kk++) acc += As[ty][kk] * Bs[kk][tx];
            __syncthreads();  // everyone is done with them before the next step overwrites them
        }
        const int64_t m = row0 + ty, n = col0 + tx;
        if (m < M && n < N) store_c(&C[m * ldc + n], alpha, acc, beta);
    }
}

// Stages one BK-wide step: As[k][m] = op(A)[row0 + m, k0 + k] (BM·BK values) and
// Bs[k][n] = op(B)[k0 + k, col0 + n] (BK·BN values), as the arrays' element type (float, or T
// itself for the tensor cores), zeros outside the matrices. Each of the kThreads
// threads loads BM·BK/kThreads and BK·BN/kThreads values; consecutive threads take consecutive
// addresses of A and B as they are stored.
template <int BM, int BN, int BK, int kThreads, bool TA, bool TB, typename T, typename SA, typename SB>
__device__ __forceinline__ void load_tiles(const T* A, int64_t lda, const T* B, int64_t ldb, int64_t M, int64_t N,
                                           int64_t K, int64_t row0, int64_t col0, int64_t k0, SA& As, SB& Bs) {
    static_assert((BM * BK) % kThreads == 0 && (BN * BK) % kThreads == 0, "tile loads must divide evenly");
    using EA = std::remove_reference_t<decltype(As[0][0])>;
    using EB = std::remove_reference_t<decltype(Bs[0][0])>;
    const int tid = threadIdx.x;
    // (Not unrolled: each load carries 64-bit index arithmetic, and unrolling them all
    // costs registers that the accumulators need.)
    for (int r = 0; r < BM * BK / kThreads; r++) {
        const int e = tid + r * kThreads;
        const int m = TA ? e % BM : e / BK, k = TA ? e / BM : e % BK;
        As[k][m] = load_a<TA, EA>(A, lda, M, K, row0 + m, k0 + k);
    }
    for (int r = 0; r < BN * BK / kThreads; r++) {
        const int e = tid + r * kThreads;
        const int n = TB ? e / BK : e % BN, k = TB ? e % BK : e / BN;
        Bs[k][n] = load_b<TB, EB>(B, ldb, K, N, k0 + k, col0 + n);
    }
}

// ---- version 3: register blocking ------------------------------------------------------------------
// Thread (tx, ty) owns the TM×TN patch of the block's C tile at rows ty + i·(BM/TM) (strided:
// the warp's threads share a few rows, so an As read is a broadcast) and columns in groups of
// four: group g (g < TN/4) is columns g·4·TX + tx·4 + 0..3, TX = BN/TN threads across. A
// group's four values of Bs are neighbours on a 16-byte boundary: one float4 load (LDS.128)
// instead of four scalar ones (g++ turns it into one SIMD multiply-add per row on the
// emulator). The groups are interleaved rather than contiguous (tx·TN + j) for the banks:
// shared memory has 32 banks of 4 bytes, and contiguous columns put lane tx's word w at bank
// (tx·TN + w) mod 32 — lanes tx and tx + 32/TN on one bank, a 2-way (TN = 4) or 4-way (TN = 8)
// conflict that serializes the load. With groups, the 8 lanes of a quarter-warp (which a
// 16-byte load serves together) read 8 consecutive float4s: 32 different banks.
//
//   for each k0 = 0, BK, 2·BK, ...:
//       As[k][m] = op(A)[row0 + m, k0 + k]     BM·BK values, BM·BK/threads per thread
//       Bs[k][n] = op(B)[k0 + k, col0 + n]     BK·BN values                              barrier
//       for k in 0..BK-1:   a[i] = As[k][ty + i·BM/TM],  b[4g..4g+3] = Bs[k][g·4·TX + tx·4 ..+3]
//                           acc[i][j] += a[i]·b[j]          (TM·TN FMAs from TM + TN/4 loads) barrier
//   C[row0 + ty + i·BM/TM, col0 + column of j] = alpha·acc[i][j] + beta·C[...]
//
// Registers (nvcc -Xptxas -v): the 64×64 variant takes 168 to 255 per thread, most of them for
// the unrolled k loop's loads that nvcc hoists ahead. Capping it at 128 (__launch_bounds__ with
// 4 blocks per SM) makes ptxas spill 200 to 580 bytes per thread to local memory, worse than
// fewer resident blocks; fewer live values (warp tiling, a partly unrolled k loop) are the way.
//
// Split-K (gemm_split_k below): block z of the grid sums only k in [z·k_slice, (z+1)·k_slice) and
// writes its own C at C + z·c_slice. One slice (gridDim.z = 1, k_slice = K) is the plain product.
template <int BM, int BN, int BK, int TM, int TN, bool TA, bool TB, typename T, typename CT>
__global__ void __launch_bounds__((BM / TM) * (BN / TN))
    gemm_tiled(int64_t M, int64_t N, int64_t K, float alpha, const T* A, int64_t lda, const T* B,
               int64_t ldb, float beta, CT* C, int64_t ldc, int64_t k_slice, int64_t c_slice) {
    constexpr int kThreadsX = BN / TN, kThreadsY = BM / TM, kThreads = kThreadsX * kThreadsY;
    static_assert(TN % 4 == 0, "a thread's columns come in float4 groups");
    // Stored k-major, so a thread's TM (or TN) values for one k are in one row. The +4 padding
    // spreads the stores of the k-contiguous layouts over different banks and keeps each row a
    // multiple of 16 bytes, so the float4 groups of Bs stay aligned.
    __shared__ float As[BK][BM + 4];
    __shared__ __align__(16) float Bs[BK][BN + 4];
    const int tid = threadIdx.x;
    const int tx = tid % kThreadsX, ty = tid / kThreadsX;
    const int64_t col0 = int64_t(blockIdx.x) * BN;
    const int64_t tiles_m = (M + BM - 1) / BM;
    const int64_t k_begin = int64_t(blockIdx.z) * k_slice, k_end = K < k_begin + k_slice ? K : k_begin + k_slice;
    C += int64_t(blockIdx.z) * c_slice;
    for (int64_t tile = blockIdx.y; tile < tiles_m; tile += gridDim.y) {
        const int64_t row0 = tile * BM;
        float acc[TM][TN];
        KILN_UNROLL
        for (int i = 0; i < TM; i++) {
            KILN_UNROLL
            for (int j = 0; j < TN; j++) acc[i][j] = 0.0f;
        }
        for (int64_t k0 = k_begin; k0 < k_end; k0 += BK) {  // columns past k_end load as zeros
            load_tiles<BM, BN, BK, kThreads, TA, TB>(A, lda, B, ldb, M, N, k_end, row0, col0, k0, As, Bs);
            __syncthreads();
            KILN_UNROLL
            for (int k = 0; k < BK; k++) {
                float a[TM], b[TN];
                KILN_UNROLL
                for (int i = 0; i < TM; i++) a[i] = As[k][ty + i * kThreadsY];
                KILN_UNROLL
                for (int g = 0; g < TN / 4; g++) {
                    const float4 v = *reinterpret_cast<const float4*>(&Bs[k][g * 4 * kThreadsX + tx * 4]);
                    b[4 * g] = v.x, b[4 * g + 1] = v.y, b[4 * g + 2] = v.z, b[4 * g + 3] = v.w;
                }
                detail::outer_product_add(acc, a, b);
            }
            __syncthreads();
        }
        KILN_UNROLL
        for (int i = 0; i < TM; i++) {
            const int64_t m = row0 + ty + i * kThreadsY;
            KILN_UNROLL
            for (int j = 0; j < TN; j++) {
                const int64_t n = col0 + j / 4 * 4 * kThreadsX + tx * 4 + j % 4;  // group j / 4
                if (m < M && n < N) store_c(&C[m * ldc + n], alpha, acc[i][j], beta);
            }
        }
    }
}

// ---- version 5 (chapter 09): tensor cores (wmma), T = f16 or bf16 ------------------------------------
// A 64×64 tile of C per block of 4 warps; each warp multiplies 2×2 fragments of 16×16
// (detail::WmmaWarpTile, common.cuh) on the tensor cores, products and sums in float.
//
//   for each k0 = 0, 32, 64, ...:
//       As[k][m] = op(A)[row0 + m, k0 + k],  Bs[k][n] = op(B)[k0 + k, col0 + n]   as T   barrier
//       each warp: acc[i][j] += As-rows · Bs-columns of its 32×32 patch (wmma)          barrier
//   Cs = acc (store_matrix_sync), barrier;  C[row0 + m, col0 + n] = alpha·Cs[m][n] + beta·C[...]
// The accumulator's elements sit in the lanes in an unspecified order, so alpha, beta and the
// edge of the matrix are applied after the round trip through Cs, where each thread knows (m, n).
template <bool TA, bool TB, typename T>
__global__ void __launch_bounds__(detail::wmma_tile::kThreads)
    gemm_wmma_kernel(int64_t M, int64_t N, int64_t K, float alpha, const T* A, int64_t lda, const T* B, int64_t ldb,
                     float beta, T* C, int64_t ldc) {
    using namespace detail::wmma_tile;
    __shared__ __align__(32) T As[kBK][kLdA];
    __shared__ __align__(32) T Bs[kBK][kLdB];
    __shared__ __align__(32) float Cs[kBM][kLdC];
    const int64_t col0 = int64_t(blockIdx.x) * kBN;
    const int64_t tiles_m = (M + kBM - 1) / kBM;
    for (int64_t tile = blockIdx.y; tile < tiles_m; tile += gridDim.y) {
        const int64_t row0 = tile * kBM;
        detail::WmmaWarpTile<T> warp_tile;
        for (int64_t k0 = 0; k0 < K; k0 += kBK) {
            load_tiles<kBM, kBN, kBK, kThreads, TA, TB>(A, lda, B, ldb, M, N, K, row0, col0, k0, As, Bs);
            __syncthreads();
            warp_tile.mma(As, Bs);
            __syncthreads();
        }
        warp_tile.store(Cs);
        __syncthreads();
        for (int e = threadIdx.x; e < kBM * kBN; e += kThreads) {
            const int64_t m = row0 + e / kBN, n = col0 + e % kBN;
            if (m < M && n < N) store_c(&C[m * ldc + n], alpha, Cs[e / kBN][e % kBN], beta);
        }
        __syncthreads();  // Cs is rewritten for the next row tile
    }
}

// ---- launchers ------------------------------------------------------------------------------------
namespace {

// No product to compute: M or N zero (nothing to do), or alpha or K zero (C = beta·C). cuda::gemm
// does these without a GEMM kernel.
bool no_product(int64_t M, int64_t N, int64_t K, float alpha) { return M == 0 || N == 0 || alpha == 0.0f || K == 0; }

template <bool TA, bool TB, typename T>
void naive(int64_t M, int64_t N, int64_t K, float alpha, const T* A, int64_t lda, const T* B, int64_t ldb,
           float beta, T* C, int64_t ldc) {
    constexpr auto gemm_naive = gemm_naive_kernel<TA, TB, T>;
    const dim3 grid(unsigned((N + kTile - 1) / kTile), grid_rows((M + kTile - 1) / kTile)), block(kTile, kTile);
    KILN_LAUNCH(gemm_naive, grid, block, 0)(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    KILN_CHECK_LAUNCH(gemm_naive, grid, block);
}

template <bool TA, bool TB, typename T>
void smem(int64_t M, int64_t N, int64_t K, float alpha, const T* A, int64_t lda, const T* B, int64_t ldb,
          float beta, T* C, int64_t ldc) {
    constexpr auto gemm_smem = gemm_smem_kernel<TA, TB, T>;
    const dim3 grid(unsigned((N + kTile - 1) / kTile), grid_rows((M + kTile - 1) / kTile)), block(kTile, kTile);
    KILN_LAUNCH(gemm_smem, grid, block, 0)(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    KILN_CHECK_LAUNCH(gemm_smem, grid, block);
}

template <bool TA, bool TB, typename T>
void tiled(int64_t M, int64_t N, int64_t K, float alpha, const T* A, int64_t lda, const T* B, int64_t ldb,
           float beta, T* C, int64_t ldc) {
    constexpr auto gemm_128x128 = gemm_tiled<128, 128, 8, 8, 8, TA, TB, T, T>;
    constexpr auto gemm_64x64 = gemm_tiled<64, 64, 32, 8, 4, TA, TB, T, T>;
    const int64_t big_tiles = ((M + 127) / 128) * ((N + 127) / 128);
    if (big_tiles >= 256) {
        const dim3 grid(unsigned((N + 127) / 128), grid_rows((M + 127) / 128)), block(256);
        KILN_LAUNCH(gemm_128x128, grid, block, 0)(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, K, 0);
        KILN_CHECK_LAUNCH(gemm_128x128, grid, block);
    } else {
        const dim3 grid(unsigned((N + 63) / 64), grid_rows((M + 63) / 64)), block(128);
        KILN_LAUNCH(gemm_64x64, grid, block, 0)(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, K, 0);
        KILN_CHECK_LAUNCH(gemm_64x64, grid, block);
    }
}

template <bool TA, bool TB, typename T>
void tensor_cores(int64_t M, int64_t N, int64_t K, float alpha, const T* A, int64_t lda, const T* B, int64_t ldb,
                  float beta, T* C, int64_t ldc) {
    using namespace detail::wmma_tile;
    constexpr auto gemm_wmma = gemm_wmma_kernel<TA, TB, T>;
    const dim3 grid(unsigned((N + kBN - 1) / kBN), grid_rows((M + kBM - 1) / kBM)), block(kThreads);
    KILN_LAUNCH(gemm_wmma, grid, block, 0)(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    KILN_CHECK_LAUNCH(gemm_wmma, grid, block);
}

}  // namespace

namespace lab {

template <typename T>
void gemm_naive(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const T* A,
                int64_t lda, const T* B, int64_t ldb, float beta, T* C, int64_t ldc) {
    if (no_product(M, N, K, alpha)) return gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    pick<T>(naive<false, false>, naive<false, true>, naive<true, false>, naive<true, true>, trans_a, trans_b)(
        M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

template <typename T>
void gemm_smem(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const T* A,
               int64_t lda, const T* B, int64_t ldb, float beta, T* C, int64_t ldc) {
    if (no_product(M, N, K, alpha)) return gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    pick<T>(smem<false, false>, smem<false, true>, smem<true, false>, smem<true, true>, trans_a, trans_b)(
        M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

template <typename T>
void gemm_register_tiled(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const T* A,
                         int64_t lda, const T* B, int64_t ldb, float beta, T* C, int64_t ldc) {
    if (no_product(M, N, K, alpha)) return gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    pick<T>(tiled<false, false>, tiled<false, true>, tiled<true, false>, tiled<true, true>, trans_a, trans_b)(
        M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

template <typename T>
void gemm_wmma(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const T* A,
               int64_t lda, const T* B, int64_t ldb, float beta, T* C, int64_t ldc) {
    if (no_product(M, N, K, alpha)) return gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    pick<T>(tensor_cores<false, false>, tensor_cores<false, true>, tensor_cores<true, false>, tensor_cores<true, true>,
            trans_a, trans_b)(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace lab

#define KILN_GEMM(T)                                                                                          \
    template void lab::gemm_naive<T>(bool, bool, int64_t, int64_t, int64_t, float, const T*, int64_t,          \
                                     const T*, int64_t, float, T*, int64_t);                                  \
    template void lab::gemm_smem<T>(bool, bool, int64_t, int64_t, int64_t, float, const T*, int64_t,           \
                                    const T*, int64_t, float, T*, int64_t);                                   \
    template void lab::gemm_register_tiled<T>(bool, bool, int64_t, int64_t, int64_t, float, const T*, int64_t, \
                                              const T*, int64_t, float, T*, int64_t);
KILN_FOR_EACH_FLOAT_TYPE(KILN_GEMM)
#undef KILN_GEMM

#define KILN_GEMM_WMMA(T)                                                                                     \
    template void lab::gemm_wmma<T>(bool, bool, int64_t, int64_t, int64_t, float, const T*, int64_t, const T*,   \
                                    int64_t, float, T*, int64_t);
KILN_GEMM_WMMA(f16)
KILN_GEMM_WMMA(bf16)
#undef KILN_GEMM_WMMA

}  // namespace kiln::cuda
