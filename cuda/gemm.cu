// gemm.cu — matrix multiply on the GPU: the twin of cpu::gemm (src/ops/cpu/gemm.h), same
// arguments, same element types, every pointer device memory.
//
//   C[M,N] = alpha · op(A)[M,K] · op(B)[K,N] + beta · C[M,N]          all row-major
//   op(A) = A (M×K, row stride lda) or Aᵀ (A stored K×M);  op(B) = B (K×N) or Bᵀ (B stored N×K)
//   beta == 0: C is overwritten, never read.  alpha == 0 or K == 0: C = beta·C, A and B unread.
//
// Three versions, from naive to tuned (declared in gemm_versions.h; the chapter,
// lessons/04-cuda-kernels/README.md, walks through them), and chapter 09's tensor-core version:
//
//   version 1  gemm_naive_kernel   block (16, 16), grid (ceil(N/16), ceil(M/16)): one thread per
//              C element, a K-long dot product from global memory. Each element of A is read by
//              N threads and each element of B by M threads: memory-bound at any size.
//   version 2  gemm_smem_kernel    same shape; the block walks K in 16-wide steps, each step
//              loading a 16×16 tile of op(A) and one of op(B) into shared memory (one element
//              per thread, coalesced), a barrier, 16 multiply-adds from shared memory, a barrier.
//              Global reads drop 16×.
//   version 3  gemm_tiled          (the engine's) a BM×BN tile of C per
//              block, a TM×TN patch of it per thread held in registers. Per BK-wide step the
//              block stages a BM×BK tile of op(A) and a BK×BN tile of op(B) in shared memory;
//              each thread then loads TM values of A and TN values of B into registers and does
//              TM·TN multiply-adds with them: TM·TN/(TM+TN) FMAs per shared-memory load
//              instead of 1/2 in version 2. Two shapes:
//                128×128 tiles, BK 8, 8×8 per thread, 256 threads   when there are ≥ 256 such
//                                                                   tiles (big GEMMs)
//                 64×64 tiles, BK 32, 8×4 per thread, 128 threads   otherwise (the MLP's
//                                                                   64×512: more blocks)
//              (BK 32 and 128 threads also halve, twice, the barriers the emulator must run.)
//              grid = (ceil(N/BN), min(ceil(M/BM), 65535)); blocks loop over row tiles beyond.
//   version 5  gemm_wmma_kernel    T = f16 or bf16: version 3's staging (as T, not float), but
//              the products run on the tensor cores: a 64×64 tile of C per block of 4 warps,
//              each warp a 32×32 patch as 2×2 wmma fragments of 16×16×16, products and sums in
//              float (nvcuda::wmma; the emulator's cuda/emu/wmma.h). BK 32, 128 threads.
//              cuda::gemm<f16/bf16> uses it when M, N and K are all ≥ 16 (wmma_fits), else
//              version 3; cuda::gemm<float> is always version 3, whatever the shape.
//
// Element types: A, B and C hold T = float, f16 or bf16 (a template parameter of every kernel).
// The tiles are loaded converted to float (load_a, load_b; version 5 keeps them in T, which the
// tensor cores read), the products are summed in float registers (fragments), and C is rounded
// to T once, on the store (store_c): f32 accumulation for every T.
//
// Every version handles any M, N, K (partial tiles are padded with zeros in shared memory and
// masked on the store) and all four transpose combinations (a template parameter each, so
// the inner loops carry no branches). Loads are arranged so that consecutive threads read
// consecutive addresses whichever way A and B are stored.
//
// Build and run: part of the engine; `make test T='[cuda][gemm]'` checks versions 1 to 3
// against the CPU, `make test T='[wmma]'` version 5; the kernel lab (cuda/lab/gemm.cu,
// `make lab`) runs them beside two more versions, and on a GPU (`make CUDA=1 lab`) times them
// against cuBLAS.
#include "common.cuh"
#include "gemm_tiles.cuh"
#include "tensor_tiles.cuh"
#include "gemm_versions.h"
#include "ops/kernels/gemm.h"

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
                KILN_UNROLL
                for (int i = 0; i < TM; i++) {
                    KILN_UNROLL
                    for (int j = 0; j < TN; j++) acc[i][j] += a[i] * b[j];
                }
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

// ---- version 6: warp tiling and double buffering (the engine's) ------------------------------------
// Version 3's register blocking, with each warp's lanes packed into one 64×32 (or 32×32) patch
// of the block tile, and the next step's tiles loaded into registers while this step's are
// multiplied (two stages of shared memory, one barrier per step). The tile itself is
// detail::fma_tile (gemm_tiles.cuh, which the convolutions share); this kernel gives it the
// GEMM's loaders and epilogue. Blocks loop over row tiles beyond gridDim.y, and block z of the
// grid sums only k in [z·k_slice, (z+1)·k_slice) into its own C at C + z·c_slice (split-K; one
// slice is the plain product). vec_a, vec_b, vec_c: the launcher's verdict on 4-element vector
// access to A, B and C (detail::vector_chunks).
template <class S, bool TA, bool TB, typename T, typename CT>
__global__ void __launch_bounds__(S::kThreads, 256 / S::kThreads * 2)
    gemm_warp_tiled(int64_t M, int64_t N, int64_t K, float alpha, const T* A, int64_t lda, const T* B, int64_t ldb,
                    float beta, CT* C, int64_t ldc, int64_t k_slice, int64_t c_slice, bool vec_a, bool vec_b,
                    bool vec_c) {
    __shared__ detail::FmaStages<S> stages;
    const int64_t col0 = int64_t(blockIdx.x) * S::BN, tiles_m = (M + S::BM - 1) / S::BM;
    const int64_t k_begin = int64_t(blockIdx.z) * k_slice, k_end = K < k_begin + k_slice ? K : k_begin + k_slice;
    C += int64_t(blockIdx.z) * c_slice;
    for (int64_t tile = blockIdx.y; tile < tiles_m; tile += gridDim.y) {
        const int64_t row0 = tile * S::BM;
        detail::GemmLoaderA<S, TA, T> la(A, lda, M, k_end, row0, vec_a);
        detail::GemmLoaderB<S, TB, T> lb(B, ldb, N, k_end, col0, vec_b);
        detail::GemmEpilogue<CT> out{C, ldc, M, N, row0, col0, alpha, beta, vec_c};
        detail::fma_tile<S>(la, lb, k_begin, k_end, stages, out);
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

// ---- version 7: the tensor cores by mma.sync, T = f16 or bf16 (the engine's) -------------------------
// Version 6's loop (loaders, two stages, one barrier per step) with the products on the tensor
// cores: detail::mma_tile (tensor_tiles.cuh) feeds mma.sync.m16n8k16 from shared memory with
// ldmatrix, each warp a 64×32 (or 32×32) patch of 16×8 blocks, sums in f32. Each tile keeps its
// matrix's contiguous dimension in shared memory (A as [m][k] unless TA, B as [n][k] if TB), so
// every global load is a 16-byte vector (vec_a, vec_b) and ldmatrix transposes where needed.
// Compared with version 5 (wmma): the fragments' layout is known, so nothing round-trips
// through shared memory on the way out, and the next step's tiles load during this one's mma.
template <class S, bool TA, bool TB, typename T>
__global__ void __launch_bounds__(S::kThreads)
    gemm_tensor_cores(int64_t M, int64_t N, int64_t K, float alpha, const T* A, int64_t lda, const T* B, int64_t ldb,
                      float beta, T* C, int64_t ldc, bool vec_a, bool vec_b) {
    __shared__ detail::MmaStages<S> stages;
    const int64_t col0 = int64_t(blockIdx.x) * S::BN, tiles_m = (M + S::BM - 1) / S::BM;
    for (int64_t tile = blockIdx.y; tile < tiles_m; tile += gridDim.y) {
        const int64_t row0 = tile * S::BM;
        detail::MmaGemmLoaderA<S, TA, T> la(A, lda, M, K, row0, vec_a);
        detail::MmaGemmLoaderB<S, TB, T> lb(B, ldb, N, K, col0, vec_b);
        detail::GemmEpilogue<T> out{C, ldc, M, N, row0, col0, alpha, beta, false};
        detail::mma_tile<S, T>(la, lb, 0, K, stages, out);
    }
}

// ---- version 8: version 7 with a deeper pipeline of asynchronous copies (sm_80+) -------------------
// For rows that allow 16-byte chunks (leading dimensions and pointers aligned to 8 values, the
// contiguous dimensions multiples of 8): the tiles go from global to shared memory by cp.async,
// without passing through registers, kStages steps ahead:
//
//      issue steps 0 .. kStages−2, a commit group each
//      for each step t:   wait until step t's group has landed (at most kStages−2 in flight); barrier
//                         issue step t + kStages − 1 into stage (t − 1) % kStages (read in step t−1,
//                         which every warp finished before the barrier); commit
//                         mma on stage t % kStages
// The stages live in dynamic shared memory (kStages × 18.5 KiB at 128×128×32: past the 48 KiB a
// kernel gets without asking, so the launcher raises the limit).
template <class S, int kStages, bool TA, bool TB, typename T>
__global__ void __launch_bounds__(S::kThreads)
    gemm_tensor_cores_async(int64_t M, int64_t N, int64_t K, float alpha, const T* A, int64_t lda, const T* B,
                            int64_t ldb, float beta, T* C, int64_t ldc) {
    KILN_DYNAMIC_SHARED(uint16_t, smem);
    uint16_t* As = smem;                            // kStages × kAElems
    uint16_t* Bs = smem + kStages * S::kAElems;     // kStages × kBElems
    const detail::MmaWarp<S, T> warp;
    const int64_t col0 = int64_t(blockIdx.x) * S::BN, tiles_m = (M + S::BM - 1) / S::BM, steps = (K + S::BK - 1) / S::BK;
    for (int64_t tile = blockIdx.y; tile < tiles_m; tile += gridDim.y) {
        const int64_t row0 = tile * S::BM;
        const detail::MmaGemmLoaderA<S, TA, T> la(A, lda, M, K, row0, true);
        const detail::MmaGemmLoaderB<S, TB, T> lb(B, ldb, N, K, col0, true);
        const auto issue = [&](int64_t step) {
            if (step < steps) {
                const int stage = int(step % kStages);
                detail::copy_async(la, step * S::BK, As + stage * S::kAElems);
                detail::copy_async(lb, step * S::BK, Bs + stage * S::kBElems);
            }
            detail::cp_async_commit();  // an empty group past the end keeps the count in step
        };
        float acc[S::MI][S::NI][4] = {};
        for (int s = 0; s < kStages - 1; s++) issue(s);
        for (int64_t t = 0; t < steps; t++) {
            detail::cp_async_wait<kStages - 2>();
            __syncthreads();
            issue(t + kStages - 1);
            const int stage = int(t % kStages);
            warp.multiply(As + stage * S::kAElems, Bs + stage * S::kBElems, acc);
        }
        detail::cp_async_wait<0>();
        __syncthreads();  // the next row tile's copies overwrite the stages
        detail::GemmEpilogue<T> out{C, ldc, M, N, row0, col0, alpha, beta, false};
        warp.store(acc, out);
    }
}

// C = beta·C (0 when beta == 0, even where C held NaN): the alpha == 0 or K == 0 case.
template <typename T>
__global__ void gemm_scale_c_kernel(int64_t M, int64_t N, float beta, T* C, int64_t ldc) {
    const int64_t total = M * N;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
        T* c = &C[(i / N) * ldc + i % N];
        *c = T(beta == 0.0f ? 0.0f : beta * float(*c));
    }
}

// ---- launchers ------------------------------------------------------------------------------------
namespace {

// Handles the cases that launch no GEMM kernel; returns true when nothing is left to do.
template <typename T>
bool gemm_trivial(int64_t M, int64_t N, int64_t K, float alpha, float beta, T* C, int64_t ldc) {
    if (M == 0 || N == 0) return true;
    if (alpha != 0.0f && K != 0) return false;
    constexpr auto gemm_scale_c = gemm_scale_c_kernel<T>;
    const dim3 grid(detail::blocks_for(M * N)), block(detail::kBlock);
    KILN_LAUNCH(gemm_scale_c, grid, block, 0)(M, N, beta, C, ldc);
    KILN_CHECK_LAUNCH(gemm_scale_c, grid, block);
    return true;
}

unsigned grid_rows(int64_t tiles) { return unsigned(std::min<int64_t>(tiles, 65535)); }

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

// Version 6 on grid (ceil(N/BN), ceil(M/BM), slices) with C's type CT (T, or float for
// split-K's partial sums).
template <class S, bool TA, bool TB, typename T, typename CT>
void warp_tiled_as(int64_t M, int64_t N, int64_t K, float alpha, const T* A, int64_t lda, const T* B, int64_t ldb,
                   float beta, CT* C, int64_t ldc, int64_t slices, int64_t k_slice, int64_t c_slice) {
    constexpr auto gemm_warp_tiled_shape = gemm_warp_tiled<S, TA, TB, T, CT>;
    const bool vec_a = detail::vector_chunks(A, lda, TA ? M : K), vec_b = detail::vector_chunks(B, ldb, TB ? K : N);
    const bool vec_c = detail::vector_chunks(C, ldc, N) && c_slice % 4 == 0;
    const dim3 grid(unsigned((N + S::BN - 1) / S::BN), grid_rows((M + S::BM - 1) / S::BM), unsigned(slices));
    const dim3 block(S::kThreads);
    KILN_LAUNCH(gemm_warp_tiled_shape, grid, block, 0)(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, k_slice, c_slice,
                                                        vec_a, vec_b, vec_c);
    KILN_CHECK_LAUNCH(gemm_warp_tiled_shape, grid, block);
}

// Version 6's shape: 128×128 tiles when there are at least two of them per SM (an SM holds two
// such blocks at once), else 64×64 (four times the blocks, so that a smaller product still
// fills the GPU).
bool big_tiles_fill(int64_t M, int64_t N) {
    using Big = detail::FmaBig;
    return ((M + Big::BM - 1) / Big::BM) * ((N + Big::BN - 1) / Big::BN) >= 2 * detail::multiprocessors();
}

template <bool TA, bool TB, typename T>
void warp_tiled(int64_t M, int64_t N, int64_t K, float alpha, const T* A, int64_t lda, const T* B, int64_t ldb,
                float beta, T* C, int64_t ldc) {
    if (big_tiles_fill(M, N))
        warp_tiled_as<detail::FmaBig, TA, TB>(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, 1, K, 0);
    else
        warp_tiled_as<detail::FmaSmall, TA, TB>(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, 1, K, 0);
}

// Split-K, S slices of k_slice: pass 1, version 6's 64×64 tiles on grid (N/64, M/64, S), slice s
// into partial[s] = op(A)[:, slice s] · op(B)[slice s, :] (M×N floats, alpha 1, beta 0); pass 2,
// gemm_sum_slices_kernel, C = alpha · Σ_s partial[s] + beta · C.
template <bool TA, bool TB, typename T>
void split_k(int64_t M, int64_t N, int64_t K, float alpha, const T* A, int64_t lda, const T* B, int64_t ldb,
             float beta, T* C, int64_t ldc, int64_t S, int64_t k_slice) {
    detail::Workspace ws(size_t(S * M * N) * sizeof(float));
    float* partial = ws.as<float>();
    warp_tiled_as<detail::FmaSmall, TA, TB>(M, N, K, 1.0f, A, lda, B, ldb, 0.0f, partial, N, S, k_slice, M * N);
    constexpr auto gemm_sum_slices = detail::gemm_sum_slices_kernel<T>;
    const dim3 grid2(detail::blocks_for(M * N)), block2(detail::kBlock);
    KILN_LAUNCH(gemm_sum_slices, grid2, block2, 0)(partial, S, M, N, alpha, beta, C, ldc);
    KILN_CHECK_LAUNCH(gemm_sum_slices, grid2, block2);
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

// Version 7 with 128×128 tiles (8 warps of 64×32) when they fill the GPU twice over, else 64×64
// (4 warps of 32×32); BK 32.
template <bool TA, bool TB, typename T>
void mma_tiles(int64_t M, int64_t N, int64_t K, float alpha, const T* A, int64_t lda, const T* B, int64_t ldb,
               float beta, T* C, int64_t ldc) {
    const bool vec_a = detail::vector_chunks8(A, lda, TA ? M : K), vec_b = detail::vector_chunks8(B, ldb, TB ? K : N);
    const auto launch = [&](auto shape) {
        using S = decltype(shape);
        constexpr auto gemm_mma = gemm_tensor_cores<S, TA, TB, T>;
        const dim3 grid(unsigned((N + S::BN - 1) / S::BN), grid_rows((M + S::BM - 1) / S::BM)), block(S::kThreads);
        KILN_LAUNCH(gemm_mma, grid, block, 0)(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, vec_a, vec_b);
        KILN_CHECK_LAUNCH(gemm_mma, grid, block);
    };
    if (big_tiles_fill(M, N)) launch(detail::MmaShape<128, 128, 32, 2, 4, !TA, TB>{});
    else launch(detail::MmaShape<64, 64, 32, 2, 2, !TA, TB>{});
}

// The engine's rule for f16 and bf16: the tensor cores when every dimension fills at least one
// 16-wide block; below that (a matrix-vector product, K < 16) most of each 16×8×16 step would
// multiply padding, and version 6 does the few products instead.
bool tensor_cores_fit(int64_t M, int64_t N, int64_t K) { return M >= 16 && N >= 16 && K >= 16; }

template <typename T>
using GemmFn = void (*)(int64_t, int64_t, int64_t, float, const T*, int64_t, const T*, int64_t, float, T*, int64_t);

// One instantiation per (trans_a, trans_b), picked at run time.
template <typename T>
GemmFn<T> pick(GemmFn<T> nn, GemmFn<T> nt, GemmFn<T> tn, GemmFn<T> tt, bool trans_a, bool trans_b) {
    return trans_a ? (trans_b ? tt : tn) : (trans_b ? nt : nn);
}

// Version 8's launch: 128×128×32 tiles of 8 warps, kStages stages; rows that do not allow
// 16-byte chunks go to version 7.
template <int kStages, bool TA, bool TB, typename T>
void async_tiles(int64_t M, int64_t N, int64_t K, float alpha, const T* A, int64_t lda, const T* B, int64_t ldb,
                 float beta, T* C, int64_t ldc) {
    if (!detail::vector_chunks8(A, lda, TA ? M : K) || !detail::vector_chunks8(B, ldb, TB ? K : N))
        return mma_tiles<TA, TB>(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    using S = detail::MmaShape<128, 128, 32, 2, 4, !TA, TB>;
    constexpr auto gemm_mma_async = gemm_tensor_cores_async<S, kStages, TA, TB, T>;
    const int bytes = int(kStages * (S::kAElems + S::kBElems) * sizeof(uint16_t));
    KILN_CUDA_CHECK(cudaFuncSetAttribute(gemm_mma_async, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    const dim3 grid(unsigned((N + S::BN - 1) / S::BN), grid_rows((M + S::BM - 1) / S::BM)), block(S::kThreads);
    KILN_LAUNCH(gemm_mma_async, grid, block, size_t(bytes))(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    KILN_CHECK_LAUNCH(gemm_mma_async, grid, block);
}

}  // namespace

template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const T* A, int64_t lda,
          const T* B, int64_t ldb, float beta, T* C, int64_t ldc) {
    if (gemm_trivial(M, N, K, alpha, beta, C, ldc)) return;
    if constexpr (!std::is_same_v<T, float>) {
        if (tensor_cores_fit(M, N, K))
            return pick<T>(mma_tiles<false, false>, mma_tiles<false, true>, mma_tiles<true, false>,
                           mma_tiles<true, true>, trans_a, trans_b)(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    }
    pick<T>(warp_tiled<false, false>, warp_tiled<false, true>, warp_tiled<true, false>, warp_tiled<true, true>,
            trans_a, trans_b)(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// Two 128-thread blocks per SM keep every SM busy while one block waits at a barrier or for
// memory; a slice of at least kMinSlice values of k keeps the partial sums few against the work
// (a slice writes M·N partials, which pass 2 reads back, for M·N·k_slice multiply-adds).
constexpr int64_t kMinSlice = 256;

int64_t gemm_split_k_slices(int64_t M, int64_t N, int64_t K) {
    const int64_t tiles = ((M + 63) / 64) * ((N + 63) / 64), wanted = 2 * detail::multiprocessors();
    if (tiles >= wanted) return 1;
    return std::max<int64_t>(1, std::min(wanted / tiles, K / kMinSlice));
}

template <typename T>
void gemm_split_k(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const T* A,
                  int64_t lda, const T* B, int64_t ldb, float beta, T* C, int64_t ldc) {
    const int64_t S = std::is_same_v<T, float> && M > 0 && N > 0 ? gemm_split_k_slices(M, N, K) : 1;
    if (S == 1 || alpha == 0.0f) return gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    if constexpr (std::is_same_v<T, float>) {
        // Slices of whole BK = 32 steps, so every slice but the last runs full tiles; S is
        // recounted from the rounded length (no slice is empty).
        const int64_t k_slice = ((K + S - 1) / S + 31) / 32 * 32;
        using Fn = void (*)(int64_t, int64_t, int64_t, float, const T*, int64_t, const T*, int64_t, float, T*,
                            int64_t, int64_t, int64_t);
        const Fn fn = trans_a ? (trans_b ? split_k<true, true, T> : split_k<true, false, T>)
                              : (trans_b ? split_k<false, true, T> : split_k<false, false, T>);
        fn(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, (K + k_slice - 1) / k_slice, k_slice);
    }
}

namespace lab {

template <typename T>
void gemm_tensor_cores_async(int stages, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                             const T* A, int64_t lda, const T* B, int64_t ldb, float beta, T* C, int64_t ldc) {
    KILN_CHECK(stages == 3 || stages == 4, "gemm version 8 runs 3 or 4 stages, not ", stages);
    if (gemm_trivial(M, N, K, alpha, beta, C, ldc)) return;
    if (stages == 3)
        return pick<T>(async_tiles<3, false, false>, async_tiles<3, false, true>, async_tiles<3, true, false>,
                       async_tiles<3, true, true>, trans_a, trans_b)(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    pick<T>(async_tiles<4, false, false>, async_tiles<4, false, true>, async_tiles<4, true, false>,
            async_tiles<4, true, true>, trans_a, trans_b)(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

template <typename T>
void gemm_naive(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const T* A,
                int64_t lda, const T* B, int64_t ldb, float beta, T* C, int64_t ldc) {
    if (gemm_trivial(M, N, K, alpha, beta, C, ldc)) return;
    pick<T>(naive<false, false>, naive<false, true>, naive<true, false>, naive<true, true>, trans_a, trans_b)(
        M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

template <typename T>
void gemm_smem(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const T* A,
               int64_t lda, const T* B, int64_t ldb, float beta, T* C, int64_t ldc) {
    if (gemm_trivial(M, N, K, alpha, beta, C, ldc)) return;
    pick<T>(smem<false, false>, smem<false, true>, smem<true, false>, smem<true, true>, trans_a, trans_b)(
        M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

template <typename T>
void gemm_register_tiled(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const T* A,
                         int64_t lda, const T* B, int64_t ldb, float beta, T* C, int64_t ldc) {
    if (gemm_trivial(M, N, K, alpha, beta, C, ldc)) return;
    pick<T>(tiled<false, false>, tiled<false, true>, tiled<true, false>, tiled<true, true>, trans_a, trans_b)(
        M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

template <typename T>
void gemm_wmma(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const T* A,
               int64_t lda, const T* B, int64_t ldb, float beta, T* C, int64_t ldc) {
    if (gemm_trivial(M, N, K, alpha, beta, C, ldc)) return;
    pick<T>(tensor_cores<false, false>, tensor_cores<false, true>, tensor_cores<true, false>, tensor_cores<true, true>,
            trans_a, trans_b)(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace lab

KILN_INSTANTIATE_FLOAT(gemm);
KILN_INSTANTIATE_FLOAT(gemm_split_k);
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
                                    int64_t, float, T*, int64_t);                                             \
    template void lab::gemm_tensor_cores_async<T>(int, bool, bool, int64_t, int64_t, int64_t, float, const T*, \
                                                  int64_t, const T*, int64_t, float, T*, int64_t);
KILN_GEMM_WMMA(f16)
KILN_GEMM_WMMA(bf16)
#undef KILN_GEMM_WMMA

}  // namespace kiln::cuda
