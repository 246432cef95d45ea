// gemm.cu — matrix multiply on the GPU: the twin of cpu::gemm (src/ops/cpu/gemm.h), same
// arguments, same element types, every pointer device memory.
//
//   C[M,N] = alpha · op(A)[M,K] · op(B)[K,N] + beta · C[M,N]          all row-major
//   op(A) = A (M×K, row stride lda) or Aᵀ (A stored K×M);  op(B) = B (K×N) or Bᵀ (B stored N×K)
//   beta == 0: C is overwritten, never read.  alpha == 0 or K == 0: C = beta·C, A and B unread.
//
// The engine's versions (the kernel lab's numbers; the teaching versions 1, 2, 3 and 5 that lead
// to them are in cuda/lab/versions/gemm_versions.cu, and chapter 04's README walks through them):
//
//   version 6  gemm_warp_tiled     T = float (and f16/bf16 products too small for the tensor
//              cores): version 3's register blocking with each warp's lanes packed into one patch
//              of the block tile and the next step's tiles loaded during this one's products;
//              128×128 or 64×64 tiles by size. Split-K (gemm_split_k) runs it on slices of K.
//   version 7  gemm_tensor_cores   T = f16 or bf16 when M, N and K are all ≥ 16: version 6's loop
//              with the products on the tensor cores (mma.sync, fed by ldmatrix), sums in float.
//              T = float as well when TF32 is on (set_tf32, the trainers' --tf32; off by default):
//              operands rounded to tf32 (10 mantissa bits), mma.sync.m16n8k8.tf32, sums in float.
//   version 8  gemm_tensor_cores_async   version 7 with a deeper pipeline of asynchronous copies
//              (sm_80+); the lab's (cuda::lab::gemm_tensor_cores_async), not the engine's yet.
//
// Element types: A, B and C hold T = float, f16 or bf16; the products are summed in float and C
// is rounded to T once, on the store: f32 accumulation for every T. Every version handles any
// M, N, K and all four transpose combinations (a template parameter each).
//
// Build and run: part of the engine; `make test T='[cuda][gemm]'` checks it against the CPU,
// `make test T='[wmma]'` the 16-bit versions; the kernel lab (cuda/lab/gemm.cu, `make lab`) runs
// every version, and on a GPU (`make CUDA=1 lab`) times them against cuBLAS.
#include "common.cuh"
#include "core/cuda_memory.h"
#include "gemm_launch.cuh"
#include "gemm_tiles.cuh"
#include "tensor_tiles.cuh"
#include "gemm_versions.h"
#include "ops/gemm.h"

namespace kiln::cuda {

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

// Version 7 with 128×128 tiles (8 warps of 64×32) when they fill the GPU twice over, else 64×64
// (4 warps of 32×32); BK 32 (16 for TF32).
template <bool TA, bool TB, typename T>
void mma_tiles(int64_t M, int64_t N, int64_t K, float alpha, const T* A, int64_t lda, const T* B, int64_t ldb,
               float beta, T* C, int64_t ldc) {
    const bool vec_a = detail::vector_chunks16(A, lda, TA ? M : K), vec_b = detail::vector_chunks16(B, ldb, TB ? K : N);
    const auto launch = [&](auto shape) {
        using S = decltype(shape);
        constexpr auto gemm_mma = gemm_tensor_cores<S, TA, TB, T>;
        const dim3 grid(unsigned((N + S::BN - 1) / S::BN), grid_rows((M + S::BM - 1) / S::BM)), block(S::kThreads);
        KILN_LAUNCH(gemm_mma, grid, block, 0)(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, vec_a, vec_b);
        KILN_CHECK_LAUNCH(gemm_mma, grid, block);
    };
    if (big_tiles_fill(M, N)) launch(detail::MmaBig<T, !TA, TB>{});
    else launch(detail::MmaSmall<T, !TA, TB>{});
}

// The engine's rule for f16 and bf16, and for f32 with TF32 on: the tensor cores when every
// dimension fills at least one 16-wide block; below that (a matrix-vector product, K < 16) most
// of each mma step would multiply padding, and version 6 does the few products instead.
template <typename T>
bool tensor_cores_fit(int64_t M, int64_t N, int64_t K) {
    return (!std::is_same_v<T, float> || tf32_on()) && M >= 16 && N >= 16 && K >= 16;
}

// Version 8's launch: 128×128×32 tiles of 8 warps, kStages stages; rows that do not allow
// 16-byte chunks go to version 7.
template <int kStages, bool TA, bool TB, typename T>
void async_tiles(int64_t M, int64_t N, int64_t K, float alpha, const T* A, int64_t lda, const T* B, int64_t ldb,
                 float beta, T* C, int64_t ldc) {
    if (!detail::vector_chunks16(A, lda, TA ? M : K) || !detail::vector_chunks16(B, ldb, TB ? K : N))
        return mma_tiles<TA, TB>(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    using S = detail::MmaBig<T, !TA, TB>;
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
    if (tensor_cores_fit<T>(M, N, K))
        return pick<T>(mma_tiles<false, false>, mma_tiles<false, true>, mma_tiles<true, false>, mma_tiles<true, true>,
                       trans_a, trans_b)(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
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
    // (TF32 runs the tensor cores' tiles, which do not split K: gemm takes the product whole.)
    const bool split = std::is_same_v<T, float> && M > 0 && N > 0 && !tensor_cores_fit<T>(M, N, K);
    const int64_t S = split ? gemm_split_k_slices(M, N, K) : 1;
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

}  // namespace lab

void set_tf32(bool on) { cuda_detail::tf32().store(on); }
bool tf32_on() { return cuda_detail::tf32().load(std::memory_order_relaxed); }

KILN_INSTANTIATE_FLOAT(gemm);
KILN_INSTANTIATE_FLOAT(gemm_split_k);
#define KILN_GEMM_WMMA(T)                                                                                     \
    template void lab::gemm_tensor_cores_async<T>(int, bool, bool, int64_t, int64_t, int64_t, float, const T*, \
                                                  int64_t, const T*, int64_t, float, T*, int64_t);
KILN_GEMM_WMMA(f16)
KILN_GEMM_WMMA(bf16)
#undef KILN_GEMM_WMMA

}  // namespace kiln::cuda
