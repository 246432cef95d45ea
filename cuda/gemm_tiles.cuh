// gemm_tiles.cuh — the block tile that the engine's matrix products are built from: cuda::gemm
// (gemm.cu) and the convolutions' implicit GEMMs (conv.cu) share it, each with its own loaders
// (where a tile's values come from) and epilogue (where the results go).
//
//   C[m, n] = Σ_k A[m, k] · B[k, n]         for one BM×BN tile of C, k in [k_begin, k_end)
//
// This file holds the version on the CUDA cores (FMA), f32 arithmetic for every element type;
// tensor_tiles.cuh the tensor-core version (mma.sync) for f16 and bf16. The lab
// (cuda/lab/gemm.cu, versions 6 and 7) times them against cuBLAS.
//
// ---- the CUDA-core tile: warp tiling, double buffering ------------------------------------------
// A block of kThreads = 32·WARPS_M·WARPS_N threads computes a BM×BN tile of C. Its warps split the
// tile into WARPS_M × WARPS_N patches of WM×WN; each lane of a warp holds a TM×TN piece of its
// warp's patch in registers, as GM×GN groups of 4×4:
//
//      lane (lm, ln), lm = lane / kLanesN, ln = lane % kLanesN, owns
//          rows  wm0 + g·(WM/GM) + lm·4 + 0..3     g < GM
//          cols  wn0 + g·(WN/GN) + ln·4 + 0..3     g < GN
//
// Per step of BK along k the block stages the BM×BK tile of A and the BK×BN tile of B in shared
// memory, k-major (As[k][m], Bs[k][n]), so that a lane's 4 rows (or columns) for one k are one
// 16-byte load; then each lane, for each k, loads GM + GN float4s and does TM·TN multiply-adds.
// Why warps: the 32 lanes of a warp read As[k][...] and Bs[k][...] together; with the lanes
// packed into a compact WM×WN patch, one load instruction of the warp touches kLanesM (or
// kLanesN) consecutive float4s, at most 128 bytes: one shared-memory wavefront, the rest are
// broadcasts. (Version 3, cuda/lab/versions/gemm_versions.cu, spreads a warp's lanes over the whole block tile.)
//
// Double buffering: two stages of shared memory. While the block multiplies stage s, every
// thread already holds the next step's values in registers (loaded before the multiply-adds,
// so the global loads' latency hides behind them) and writes them into stage s^1 afterwards:
//
//      fetch(k_begin); stash(stage 0); barrier
//      for each step t:   if more: fetch(step t+1) into registers
//                         multiply stage t%2
//                         if more: stash the registers into stage (t+1)%2
//                         barrier                   (one per step: stage (t+1)%2 was last read
//                                                    in step t-1, before the previous barrier)
//
// Each C value is one float accumulator to which the products are added in the order k =
// k_begin, k_begin + 1, ..., k_end − 1: the same sum as version 3's and as a plain loop's, so
// switching between them changes no bit.
//
// Loaders: an object with
//      fetch(k0)   read this thread's share of the tile for k in [k0, k0 + BK) into its registers
//                  (zeros outside the matrix); called with k0 = k_begin, k_begin + BK, ... in order
//      stash(S)    write those registers into the stage S (float[BK][ld])
// Epilogue: store(m, n, v) receives the results v[0 .. count) of row m, columns n .. n + count − 1
// (4 here, 2 from the tensor cores); it checks m and n against the matrix itself.
#pragma once
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "common.cuh"

namespace kiln::cuda::detail {

template <int BM_, int BN_, int BK_, int WARPS_M, int WARPS_N, int GM_, int GN_>
struct FmaShape {
    static constexpr int BM = BM_, BN = BN_, BK = BK_;
    static constexpr int kWarpsM = WARPS_M, kWarpsN = WARPS_N, kThreads = 32 * WARPS_M * WARPS_N;
    static constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N;  // a warp's patch
    static constexpr int GM = GM_, GN = GN_, TM = 4 * GM_, TN = 4 * GN_;
    static constexpr int kLanesM = WM / TM, kLanesN = WN / TN;
    // The +4 keeps rows 16-byte aligned and moves successive k rows to other banks.
    static constexpr int kLdA = BM + 4, kLdB = BN + 4;
    static_assert(kLanesM * kLanesN == 32, "a warp's lanes tile its patch exactly");
    static_assert(WM % (GM * 4) == 0 && WN % (GN * 4) == 0 && BK % 4 == 0, "groups of 4 along every edge");
};

// The engine's two shapes (the lab, version 6, times them and others):
//   128×128, BK 8, 8 warps of 64×32, 8×8 per lane     big products
//    64×64,  BK 16, 4 warps of 32×32, 8×4 per lane    the rest (more blocks for small products)
using FmaBig = FmaShape<128, 128, 8, 2, 4, 2, 2>;
using FmaSmall = FmaShape<64, 64, 16, 2, 2, 2, 1>;

// ---- 4 consecutive elements ------------------------------------------------------------------------
// As float4, whatever the element type: one 16-byte (float) or 8-byte (f16, bf16) load. p must be
// aligned to 4 elements.
__device__ __forceinline__ float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
template <typename T>
__device__ __forceinline__ float4 load4(const T* p) {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    T v[4];
    static_assert(sizeof(v) == sizeof(u), "four 16-bit values in 8 bytes");
    memcpy(v, &u, sizeof(u));
    return make_float4(float(v[0]), float(v[1]), float(v[2]), float(v[3]));
}
__device__ __forceinline__ void write4(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }
template <typename T>
__device__ __forceinline__ void write4(T* p, float4 v) {
    const T t[4] = {T(v.x), T(v.y), T(v.z), T(v.w)};
    uint2 u;
    memcpy(&u, t, sizeof(u));
    *reinterpret_cast<uint2*>(p) = u;
}
__device__ __forceinline__ float& at(float4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }
__device__ __forceinline__ float at(const float4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

// ---- TF32: the tensor cores' f32 operands (tensor_tiles.cuh) ---------------------------------------------------------------------------------------
// cvt.rna.tf32.f32: v rounded to 10 mantissa bits (nearest, ties away from zero), as an f32 whose
// low 13 bits are zero.
__device__ __forceinline__ float tf32_round(float v) {
    uint32_t r;
#if defined(__CUDACC__)
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(v));
#else
    r = emu::ptx::cvt_rna_tf32(v);
#endif
    float out;
    memcpy(&out, &r, sizeof out);
    return out;
}
__device__ __forceinline__ float4 tf32_round(float4 v) {
    return make_float4(tf32_round(v.x), tf32_round(v.y), tf32_round(v.z), tf32_round(v.w));
}

// True when 4-element chunks along a matrix's contiguous dimension can be loaded as one vector:
// the rows start aligned (ld and the pointer) and the dimension is a whole number of chunks, so
// a chunk is either inside the matrix or wholly outside it. Host code.
template <typename T>
inline bool vector_chunks(const T* p, int64_t ld, int64_t contiguous_extent) {
    return ld % 4 == 0 && contiguous_extent % 4 == 0 && reinterpret_cast<uintptr_t>(p) % (4 * sizeof(T)) == 0;
}

// ---- the GEMM's loaders: one operand's tile from row-major storage ------------------------------------
// An operand tile is kOuter × BK values of op(X): A's BM rows (outer = m, kIsA) or B's BN columns
// (outer = n). The stored matrix X, leading dimension ld, is contiguous along k or along outer:
//   kKContig:    op(X)[outer, k] = X[outer·ld + k]     (A as it is; B transposed)
//   otherwise:   op(X)[outer, k] = X[k·ld + outer]     (A transposed; B as it is)
// It is read as chunks of kWidth values along X's contiguous dimension — 4 for the CUDA cores'
// float stages (fma_tile), 8 for the tensor cores' 16-bit ones (mma_tile: 16 bytes) — and thread
// t takes chunks t, t + kThreads, ...: consecutive threads read consecutive chunks of a stored row,
// so a warp's loads are whole 32-byte sectors. With `vec` (the launcher's verdict on X's rows,
// vector_chunks) a chunk is one vector load; without, kWidth loads one by one. Outside the matrix:
// zeros. stash writes the chunks into a stage: the CUDA cores' [k][outer] floats (a chunk along k
// is kWidth scalar stores down a column, along outer one float4), or the tensor cores' 16-bit
// tile, which keeps X's contiguous dimension (one 16-byte store; tensor_tiles.cuh).
template <typename T>
__device__ __forceinline__ uint16_t bits_of(T v) {
    uint16_t b;
    memcpy(&b, &v, sizeof(b));
    return b;
}

template <class S, bool kIsA_, bool kKContig, typename T, int kWidth>
struct OperandLoader {
    using Shape = S;
    static constexpr bool kIsA = kIsA_;
    using Chunk = std::conditional_t<kWidth == 4, float4, uint4>;  // 4 floats, or 8 values of 16 bits
    static constexpr int kOuter = kIsA_ ? S::BM : S::BN;
    static constexpr int kAcross = (kKContig ? S::BK : kOuter) / kWidth;  // chunks per stored row of the tile
    static constexpr int kPer = kOuter * S::BK / kWidth / S::kThreads;    // chunks per thread
    static_assert(kWidth == 4 || (kWidth == 8 && sizeof(T) == 2), "float chunks of 4, 16-bit chunks of 8");
    static_assert(kPer * S::kThreads * kWidth == kOuter * S::BK, "the tile's chunks divide among the threads");
    // The tile's own origin: X points at its first row (A) or column (B), outer counts from there,
    // and extent is what is left of M or N from there on. The block's offset lives in X, not in
    // a field of its own: one 64-bit value fewer for the compiler to keep through the loop, which
    // at gemm_warp_tiled's 128-register cap decides whether the 128×128 tiles spill.
    const T* X;
    int64_t ld, extent, k_end;  // k_end: the end of this block's k
    bool vec;
    Chunk r[kPer];

    // The block's tile starts at row (A) or column (B) outer0 of the matrix X, which has `extent`
    // of them.
    __device__ OperandLoader(const T* X_, int64_t ld_, int64_t extent_, int64_t k_end_, int64_t outer0, bool vec_)
        : X(kKContig ? X_ + outer0 * ld_ : X_ + outer0), ld(ld_), extent(extent_ - outer0), k_end(k_end_), vec(vec_) {}

    // Where this thread's chunk c lies in the tile: its first value's (outer, k).
    __device__ static void place(int c, int& outer, int& k) {
        const int e = int(threadIdx.x) + c * S::kThreads;
        const int along = e % kAcross * kWidth, other = e / kAcross;
        outer = kKContig ? other : along, k = kKContig ? along : other;
    }
    // Value i of a chunk at (outer, k) of the tile is inside the matrix.
    __device__ bool inside(int64_t outer, int64_t k, int i) const {
        return kKContig ? outer < extent && k + i < k_end : outer + i < extent && k < k_end;
    }
    __device__ const T* address(int64_t outer, int64_t k) const { return kKContig ? X + outer * ld + k : X + k * ld + outer; }

    __device__ void fetch(int64_t k0) {
        KILN_UNROLL
        for (int c = 0; c < kPer; c++) {
            int outer, kk;
            place(c, outer, kk);
            const int64_t k = k0 + kk;
            const T* p = address(outer, k);
            if constexpr (kWidth == 4) {
                float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (vec) {
                    if (inside(outer, k, 0)) v = load4(p);
                } else {
                    KILN_UNROLL
                    for (int i = 0; i < 4; i++)
                        if (inside(outer, k, i)) at(v, i) = float(p[i]);
                }
                r[c] = v;
            } else {
                uint4 v = make_uint4(0, 0, 0, 0);
                if (vec) {
                    if (inside(outer, k, 0)) v = *reinterpret_cast<const uint4*>(p);
                } else {
                    uint16_t h[8];
                    KILN_UNROLL
                    for (int i = 0; i < 8; i++) h[i] = inside(outer, k, i) ? bits_of(p[i]) : uint16_t(0);
                    memcpy(&v, h, sizeof(v));
                }
                r[c] = v;
            }
        }
    }

    // The CUDA cores' stage: float [BK][ld], k-major.
    template <int kLd>
    __device__ void stash(float (*stage)[kLd]) const {
        KILN_UNROLL
        for (int c = 0; c < kPer; c++) {
            int o, k;
            place(c, o, k);
            if (kKContig) {
                float4 v = r[c];
                KILN_UNROLL
                for (int i = 0; i < 4; i++) stage[k + i][o] = at(v, i);
            } else {
                *reinterpret_cast<float4*>(&stage[k][o]) = r[c];
            }
        }
    }
    // The tensor cores' stage, at S::a_index(m, k) or S::b_index(k, n): 16-bit values, or floats
    // rounded to tf32 (tf32_round).
    __device__ void stash(uint16_t* stage) const {
        KILN_UNROLL
        for (int c = 0; c < kPer; c++) {
            int o, k;
            place(c, o, k);
            *reinterpret_cast<uint4*>(&stage[kIsA ? S::a_index(o, k) : S::b_index(k, o)]) = r[c];
        }
    }
    __device__ void stash(float* stage) const {
        KILN_UNROLL
        for (int c = 0; c < kPer; c++) {
            int o, k;
            place(c, o, k);
            *reinterpret_cast<float4*>(&stage[kIsA ? S::a_index(o, k) : S::b_index(k, o)]) = tf32_round(r[c]);
        }
    }
};

// op(A) (BM × BK) and op(B) (BK × BN) of a GEMM on the CUDA cores (float chunks of 4).
template <class S, bool TA, typename T>
using GemmLoaderA = OperandLoader<S, true, !TA, T, 4>;
template <class S, bool TB, typename T>
using GemmLoaderB = OperandLoader<S, false, TB, T, 4>;

// ---- the multiply-adds of one stage ----------------------------------------------------------------
template <class S>
struct FmaLane {
    int wm0, wn0, lm, ln;  // the warp's patch and the lane's place in it
    __device__ FmaLane() {
        const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
        wm0 = warp / S::kWarpsN * S::WM, wn0 = warp % S::kWarpsN * S::WN;
        lm = lane / S::kLanesN, ln = lane % S::kLanesN;
    }
    // The tile row of the lane's row i (i < TM) and column of its column j (j < TN).
    __device__ int row(int i) const { return wm0 + i / 4 * (S::WM / S::GM) + lm * 4 + i % 4; }
    __device__ int col(int j) const { return wn0 + j / 4 * (S::WN / S::GN) + ln * 4 + j % 4; }

    //   acc[i][j] += As[k][row(i)] · Bs[k][col(j)]     k = 0, 1, ..., BK − 1
    __device__ void multiply(const float (*As)[S::kLdA], const float (*Bs)[S::kLdB], float (&acc)[S::TM][S::TN]) const {
        KILN_UNROLL
        for (int k = 0; k < S::BK; k++) {
            float a[S::TM], b[S::TN];
            KILN_UNROLL
            for (int g = 0; g < S::GM; g++) {
                const float4 v = *reinterpret_cast<const float4*>(&As[k][row(4 * g)]);
                a[4 * g] = v.x, a[4 * g + 1] = v.y, a[4 * g + 2] = v.z, a[4 * g + 3] = v.w;
            }
            KILN_UNROLL
            for (int g = 0; g < S::GN; g++) {
                const float4 v = *reinterpret_cast<const float4*>(&Bs[k][col(4 * g)]);
                b[4 * g] = v.x, b[4 * g + 1] = v.y, b[4 * g + 2] = v.z, b[4 * g + 3] = v.w;
            }
            KILN_UNROLL
            for (int i = 0; i < S::TM; i++) {
                KILN_UNROLL
                for (int j = 0; j < S::TN; j++) acc[i][j] += a[i] * b[j];
            }
        }
    }
};

// The shared memory of one block: two stages of each tile.
template <class S>
struct alignas(16) FmaStages {
    float As[2][S::BK][S::kLdA];
    float Bs[2][S::BK][S::kLdB];
};

// The double-buffered loop (see the header), for the CUDA cores' tile and the tensor cores':
// the loaders fill stage 0, then for each step of BK the next step's tiles are fetched before
// multiply(stage) and stashed into the other stage after it; one barrier per step.
template <int BK, class LoadA, class LoadB, class Stages, class Multiply>
__device__ void two_stages(LoadA& la, LoadB& lb, int64_t k_begin, int64_t k_end, Stages& sm, Multiply multiply) {
    if (k_begin >= k_end) return;
    la.fetch(k_begin), lb.fetch(k_begin);
    la.stash(sm.As[0]), lb.stash(sm.Bs[0]);
    __syncthreads();
    int stage = 0;
    for (int64_t k0 = k_begin; k0 < k_end; k0 += BK) {
        const bool more = k0 + BK < k_end;
        if (more) la.fetch(k0 + BK), lb.fetch(k0 + BK);
        multiply(stage);
        if (more) la.stash(sm.As[stage ^ 1]), lb.stash(sm.Bs[stage ^ 1]);
        __syncthreads();
        stage ^= 1;
    }
}

// The main loop (see the header): acc = Σ_{k in [k_begin, k_end)} A-tile · B-tile, then
// epilogue.store for every 4 columns of every row the lane owns. The caller's barrier state:
// none needed before; smem may be reused after this returns only past another __syncthreads().
template <class S, class LoadA, class LoadB, class Epilogue>
__device__ void fma_tile(LoadA& la, LoadB& lb, int64_t k_begin, int64_t k_end, FmaStages<S>& sm, Epilogue& out) {
    const FmaLane<S> lane;
    float acc[S::TM][S::TN];
    KILN_UNROLL
    for (int i = 0; i < S::TM; i++) {
        KILN_UNROLL
        for (int j = 0; j < S::TN; j++) acc[i][j] = 0.0f;
    }
    two_stages<S::BK>(la, lb, k_begin, k_end, sm,
                      [&](int stage) { lane.multiply(sm.As[stage], sm.Bs[stage], acc); });
    KILN_UNROLL
    for (int i = 0; i < S::TM; i++) {
        KILN_UNROLL
        for (int g = 0; g < S::GN; g++) {
            const float v[4] = {acc[i][4 * g], acc[i][4 * g + 1], acc[i][4 * g + 2], acc[i][4 * g + 3]};
            out.store(lane.row(i), lane.col(4 * g), v);
        }
    }
}

// ---- the GEMM's epilogue ------------------------------------------------------------------------------
//   C[row0 + m, col0 + n + i] = alpha · v[i] + beta · C     i < count  (C read only when beta ≠ 0;
//                                                          rounded to CT once)
// The tiles call store(m, n, v) with consecutive results v[0 .. count) of one row: 4 from the
// CUDA cores, 2 from the tensor cores (count a template parameter, so the loops unroll and the
// values stay in registers). 4 columns go in one vector store when C's rows allow it (vec),
// else one by one; both skip what lies outside M × N.
template <typename CT>
struct GemmEpilogue {
    CT* C;
    int64_t ldc, M, N, row0, col0;
    float alpha, beta;
    bool vec;

    __device__ float scaled(float v, const CT* c) const { return beta == 0.0f ? alpha * v : alpha * v + beta * float(*c); }
    template <int kCount>
    __device__ void store(int mt, int nt, const float (&v)[kCount]) {
        const int64_t m = row0 + mt, n = col0 + nt;
        if (m >= M) return;
        CT* c = C + m * ldc + n;
        if constexpr (kCount == 4) {
            if (vec && n + 3 < N) {
                const float4 old = beta != 0.0f ? load4(c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                float4 out;
                KILN_UNROLL
                for (int i = 0; i < 4; i++) at(out, i) = beta == 0.0f ? alpha * v[i] : alpha * v[i] + beta * at(old, i);
                write4(c, out);
                return;
            }
        }
        KILN_UNROLL
        for (int i = 0; i < kCount; i++)
            if (n + i < N) c[i] = CT(scaled(v[i], c + i));
    }
};

// ---- split-K's second pass (cuda::gemm_split_k, the convolutions' dw) ---------------------------------------------------------------------------
// C[m,n] = alpha · (Σ_s partial[s][m][n]) + beta · C[m,n], the S slices added in order s = 0, 1, ...:
// the same sum on every run (no atomics), one thread per element of C.
template <typename T>
__global__ void gemm_sum_slices_kernel(const float* partial, int64_t S, int64_t M, int64_t N, float alpha,
                                       float beta, T* C, int64_t ldc) {
    const int64_t MN = M * N;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < MN; i += int64_t(gridDim.x) * blockDim.x) {
        float acc = 0.0f;
        for (int64_t sl = 0; sl < S; sl++) acc += partial[sl * MN + i];
        T* c = &C[(i / N) * ldc + i % N];
        *c = T(beta == 0.0f ? alpha * acc : alpha * acc + beta * float(*c));
    }
}

}  // namespace kiln::cuda::detail
