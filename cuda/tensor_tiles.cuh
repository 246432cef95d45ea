// tensor_tiles.cuh — the block tile of gemm_tiles.cuh on the tensor cores, for T = f16 and bf16,
// and for T = float as TF32 (cuda::set_tf32, off by default): the same loop (loaders fetch a step's tiles into registers while the previous step is
// multiplied, two stages of shared memory, one barrier per step), but the products are the
// tensor cores' mma.sync instructions, fed from shared memory by ldmatrix. Sums in f32.
//
//   C[m, n] = Σ_k A[m, k] · B[k, n]         one BM×BN tile, k in [k_begin, k_end)
//
// ---- the instructions (PTX, sm_80 and later) -------------------------------------------------------
//   mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32   D[16×8] = A[16×16]·B[16×8] + C, one warp:
//       each lane holds 4 registers of A (8 values), 2 of B (4 values), 4 floats of C and D, at
//       places PTX documents (cuda/emu/mma.h lists them; the emulator reproduces them)
//   ldmatrix.sync.aligned.m8n8.x4{.trans}.shared.b16       four 8×8 matrices of 16-bit values from
//       shared memory, each lane giving one row's address, into exactly those registers:
//       an A fragment is one ldmatrix.x4, two B fragments (16 columns) another
// Tensor cores read A by rows (k contiguous) and B by columns (k contiguous). When a tile sits in
// shared memory the other way (k-major: A as [k][m], B as [k][n]), the .trans form transposes
// each 8×8 matrix on the way, so the loaders keep each matrix's own contiguous dimension and the
// global loads stay 16-byte vectors: A_KC / B_KC in MmaShape say which way each tile lies.
//
// TF32 (T = float): the tiles stay f32 in shared memory (4 bytes a value, BK 16 for the same 64
// bytes of k per row), each value rounded once, by cvt.rna.tf32.f32, as it is stored there
// (tf32_round): without it the tensor cores would truncate (see cuda/emu/mma.h). Per k8 step:
//   mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32    D[16×8] = A[16×8]·B[8×8] + C
// with the same C/D places as m16n8k16's, so the accumulators and the epilogue are shared. Its
// fragments are read by plain 32-bit shared loads, not ldmatrix: ldmatrix's .trans moves 16-bit
// values, so it cannot transpose the k-major tiles (the convolutions' columns, dx's and dw's
// operands), and plain loads serve every layout with one code path. They are conflict-free when
// the 8 groups' × 4 threads' addresses fall in 32 different banks: a fragment load reads
// (outer g, k t) for g < 8, t < 4, i.e. word g·ld + t of a k-contiguous tile (ld = BK + 4 = 20:
// 20g mod 32 steps by 4 banks or more) or t·ld + g of a k-major one (ld = BM + 8 or BN + 8 ≡ 8
// mod 32: 8t + g) — hence the padding by layout (kPadKc, kPadOuter).
//
// ---- the tile ---------------------------------------------------------------------------------------
// kThreads = 32·WARPS_M·WARPS_N; warp w owns the WM×WN patch at (w / WARPS_N, w % WARPS_N), as
// MI × NI blocks of 16×8 (MI = WM/16, NI = WN/8), each one mma's D: acc[MI][NI][4] floats.
// Per k16 step of a stage: MI ldmatrix for A, NI/2 for B, MI·NI mma.
// 16-bit shared memory rows are padded by 8 values (16 bytes): the 8 row addresses of one
// ldmatrix matrix then fall in 8 different 16-byte bank groups (rows of 80 or 272 bytes: 5 or 17
// groups apart), so each ldmatrix is conflict-free.
//
// Loaders: as gemm_tiles.cuh's; their stash writes 16-bit values through S::a_index(m, k) /
// S::b_index(k, n). Epilogue: as gemm_tiles.cuh's, store(m, n, v) with two values: columns n, n + 1 of
// row m (n even within the tile); it checks m and n against the matrix.
#pragma once
#include <cstdint>

#include "common.cuh"
#include "gemm_tiles.cuh"

namespace kiln::cuda::detail {

// ---- the instructions -------------------------------------------------------------------------------
// One 16-bit type's name in PTX.
template <typename T> struct MmaKind;
template <> struct MmaKind<f16> {
#if !defined(__CUDACC__)
    static constexpr emu::ptx::MmaType type = emu::ptx::MmaType::F16;
#endif
};
template <> struct MmaKind<bf16> {
#if !defined(__CUDACC__)
    static constexpr emu::ptx::MmaType type = emu::ptx::MmaType::BF16;
#endif
};

// r = four 8×8 matrices of 16-bit values; this lane gives the address of one row (see above).
template <bool kTrans>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
#if defined(__CUDACC__)
    const unsigned s = unsigned(__cvta_generic_to_shared(row));
    if constexpr (kTrans)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(s));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(s));
#else
    emu::ptx::ldmatrix_x4(r, row, kTrans);
#endif
}

// d += a·b on the tensor cores: A 16×16, B 16×8 in T (f16 or bf16), d 16×8 floats.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(__CUDACC__)
    if constexpr (std::is_same_v<T, bf16>)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                     "{%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                     "{%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    emu::ptx::mma_m16n8k16(d, a, b, MmaKind<T>::type);
#endif
}

// ---- TF32 (tf32_round: gemm_tiles.cuh) ----------------------------------------------------------------
// d += a·b on the tensor cores: A 16×8, B 8×8 in tf32 (f32 bits, rounded by tf32_round), d 16×8 floats.
__device__ __forceinline__ void mma_1688_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(__CUDACC__)
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    emu::ptx::mma_m16n8k8_tf32(d, a, b);
#endif
}

// ---- the tile's shape and its shared memory ------------------------------------------------------
// E: a shared-memory value, uint16_t (f16 or bf16 bits) or float (tf32-rounded f32).
template <int BM_, int BN_, int BK_, int WARPS_M, int WARPS_N, bool A_KC_, bool B_KC_, typename E = uint16_t>
struct MmaShape {
    using Elem = E;
    static constexpr int BM = BM_, BN = BN_, BK = BK_;
    static constexpr int kWarpsM = WARPS_M, kWarpsN = WARPS_N, kThreads = 32 * WARPS_M * WARPS_N;
    static constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N, MI = WM / 16, NI = WN / 8;
    static constexpr bool A_KC = A_KC_, B_KC = B_KC_;  // A as [m][k], B as [n][k] (else k-major)
    // Padding (see the header): 16 bytes for ldmatrix's rows; for f32, 4 values on a k-contiguous
    // tile and 8 on a k-major one, for conflict-free fragment loads.
    static constexpr int kPadKc = sizeof(E) == 2 ? 8 : 4, kPadOuter = 8;
    static constexpr int kLdA = A_KC ? BK + kPadKc : BM + kPadOuter, kLdB = B_KC ? BK + kPadKc : BN + kPadOuter;
    static constexpr int kAElems = (A_KC ? BM : BK) * kLdA, kBElems = (B_KC ? BN : BK) * kLdB;
    static_assert(BK % 16 == 0 && WM % 16 == 0 && WN % 16 == 0, "whole mma blocks, B fragments in pairs");
    __device__ static int a_index(int m, int k) { return A_KC ? m * kLdA + k : k * kLdA + m; }
    __device__ static int b_index(int k, int n) { return B_KC ? n * kLdB + k : k * kLdB + n; }
};

// The engine's two shapes for element type T: 128×128 (8 warps of 64×32) or 64×64 (4 warps of
// 32×32), BK 64 bytes of k (32 16-bit values, 16 floats: two f32 stages stay under the 48 KiB of
// static shared memory).
template <typename T>
using MmaElem = std::conditional_t<sizeof(T) == 4, float, uint16_t>;
template <typename T, bool A_KC, bool B_KC>
using MmaBig = MmaShape<128, 128, 64 / int(sizeof(T)), 2, 4, A_KC, B_KC, MmaElem<T>>;
template <typename T, bool A_KC, bool B_KC>
using MmaSmall = MmaShape<64, 64, 64 / int(sizeof(T)), 2, 2, A_KC, B_KC, MmaElem<T>>;

// Two stages of each tile: 16-bit patterns (f16 or bf16 alike), or tf32-rounded floats.
template <class S>
struct alignas(16) MmaStages {
    typename S::Elem As[2][S::kAElems];
    typename S::Elem Bs[2][S::kBElems];
};

// ---- one warp's products ----------------------------------------------------------------------------
template <class S, typename T>
struct MmaWarp {
    int wm0, wn0, lane;
    __device__ MmaWarp() {
        const int warp = int(threadIdx.x) / 32;
        lane = int(threadIdx.x) % 32;
        wm0 = warp / S::kWarpsN * S::WM, wn0 = warp % S::kWarpsN * S::WN;
    }
    // The row this lane addresses for ldmatrix: lanes 8j..8j+7 give matrix j's rows 0..7.
    __device__ const uint16_t* a_row(const uint16_t* As, int mi, int kk) const {
        const int r = lane & 7, j_lo = (lane >> 3) & 1, j_hi = lane >> 4;
        const int m = wm0 + mi * 16 + j_lo * 8, k = kk + j_hi * 8;  // matrices: (m, k), (m+8, k), (m, k+8), (m+8, k+8)
        return As + (S::A_KC ? S::a_index(m + r, k) : S::a_index(m, k + r));
    }
    __device__ const uint16_t* b_row(const uint16_t* Bs, int ni, int kk) const {
        const int r = lane & 7, j_lo = (lane >> 3) & 1, j_hi = lane >> 4;
        const int n = wn0 + ni * 8 + j_hi * 8, k = kk + j_lo * 8;  // matrices: (k, n), (k+8, n), (k, n+8), (k+8, n+8)
        return Bs + (S::B_KC ? S::b_index(k, n + r) : S::b_index(k + r, n));
    }

    // The results to the epilogue, two a call: D's layout puts acc[mi][ni][0..1] at row
    // wm0 + 16·mi + g, columns wn0 + 8·ni + 2t and 2t + 1, and [2..3] 8 rows below (g = lane / 4,
    // t = lane % 4).
    template <class Epilogue>
    __device__ void store(float (&acc)[S::MI][S::NI][4], Epilogue& out) const {
        const int g = lane / 4, t = lane % 4;
        KILN_UNROLL
        for (int mi = 0; mi < S::MI; mi++) {
            KILN_UNROLL
            for (int ni = 0; ni < S::NI; ni++) {
                const int m = wm0 + mi * 16 + g, n = wn0 + ni * 8 + 2 * t;
                const float top[2] = {acc[mi][ni][0], acc[mi][ni][1]}, bottom[2] = {acc[mi][ni][2], acc[mi][ni][3]};
                out.store(m, n, top);
                out.store(m + 8, n, bottom);
            }
        }
    }

    //   acc[mi][ni] += A[rows of mi, k] · B[k, columns of ni]      k over the stage, 16 at a time
    //   (TF32: 8 at a time, multiply_tf32)
    __device__ void multiply(const typename S::Elem* As, const typename S::Elem* Bs,
                             float (&acc)[S::MI][S::NI][4]) const {
        if constexpr (std::is_same_v<T, float>) multiply_tf32(As, Bs, acc);
        else multiply_16bit(As, Bs, acc);
    }
    __device__ void multiply_16bit(const uint16_t* As, const uint16_t* Bs, float (&acc)[S::MI][S::NI][4]) const {
        KILN_UNROLL
        for (int kk = 0; kk < S::BK; kk += 16) {
            uint32_t a[S::MI][4], b[S::NI][2];
            KILN_UNROLL
            for (int mi = 0; mi < S::MI; mi++) ldmatrix_x4<!S::A_KC>(a[mi], a_row(As, mi, kk));
            KILN_UNROLL
            for (int ni = 0; ni < S::NI; ni += 2) {
                uint32_t r[4];
                ldmatrix_x4<!S::B_KC>(r, b_row(Bs, ni, kk));
                b[ni][0] = r[0], b[ni][1] = r[1], b[ni + 1][0] = r[2], b[ni + 1][1] = r[3];
            }
            KILN_UNROLL
            for (int mi = 0; mi < S::MI; mi++) {
                KILN_UNROLL
                for (int ni = 0; ni < S::NI; ni++) mma_16816<T>(acc[mi][ni], a[mi], b[ni]);
            }
        }
    }

    // The m16n8k8 fragments (cuda/emu/mma.h) by 32-bit shared loads, g = lane / 4, t = lane % 4:
    //   a[mi] = A[m + g, k + t], A[m + g + 8, k + t], A[m + g, k + t + 4], A[m + g + 8, k + t + 4]
    //   b[ni] = B[k + t, n + g], B[k + t + 4, n + g]          m = wm0 + 16·mi, n = wn0 + 8·ni
    __device__ void multiply_tf32(const float* As, const float* Bs, float (&acc)[S::MI][S::NI][4]) const {
        const int g = lane / 4, t = lane % 4;
        const auto bits = [](float v) {
            uint32_t r;
            memcpy(&r, &v, sizeof r);
            return r;
        };
        KILN_UNROLL
        for (int kk = 0; kk < S::BK; kk += 8) {
            uint32_t a[S::MI][4], b[S::NI][2];
            KILN_UNROLL
            for (int mi = 0; mi < S::MI; mi++) {
                const int m = wm0 + mi * 16 + g;
                a[mi][0] = bits(As[S::a_index(m, kk + t)]), a[mi][1] = bits(As[S::a_index(m + 8, kk + t)]);
                a[mi][2] = bits(As[S::a_index(m, kk + t + 4)]), a[mi][3] = bits(As[S::a_index(m + 8, kk + t + 4)]);
            }
            KILN_UNROLL
            for (int ni = 0; ni < S::NI; ni++) {
                const int n = wn0 + ni * 8 + g;
                b[ni][0] = bits(Bs[S::b_index(kk + t, n)]), b[ni][1] = bits(Bs[S::b_index(kk + t + 4, n)]);
            }
            KILN_UNROLL
            for (int mi = 0; mi < S::MI; mi++) {
                KILN_UNROLL
                for (int ni = 0; ni < S::NI; ni++) mma_1688_tf32(acc[mi][ni], a[mi], b[ni]);
            }
        }
    }
};

// The main loop (gemm_tiles.cuh's fma_tile, on the tensor cores), then the epilogue (MmaWarp::store).
template <class S, typename T, class LoadA, class LoadB, class Epilogue>
__device__ void mma_tile(LoadA& la, LoadB& lb, int64_t k_begin, int64_t k_end, MmaStages<S>& sm, Epilogue& out) {
    const MmaWarp<S, T> warp;
    float acc[S::MI][S::NI][4];
    KILN_UNROLL
    for (int mi = 0; mi < S::MI; mi++) {
        KILN_UNROLL
        for (int ni = 0; ni < S::NI; ni++) acc[mi][ni][0] = acc[mi][ni][1] = acc[mi][ni][2] = acc[mi][ni][3] = 0.0f;
    }
    two_stages<S::BK>(la, lb, k_begin, k_end, sm,
                      [&](int stage) { warp.multiply(sm.As[stage], sm.Bs[stage], acc); });
    warp.store(acc, out);
}

// ---- the GEMM's loaders for the tensor cores -------------------------------------------------------
// gemm_tiles.cuh's OperandLoader with chunks of 16 bytes (8 16-bit values, 4 floats), kept in
// shared memory along the stored matrix's contiguous dimension: A_KC = !TA, B_KC = TB.
template <class S, bool TA, typename T>
using MmaGemmLoaderA = OperandLoader<S, true, !TA, T, 16 / int(sizeof(T))>;
template <class S, bool TB, typename T>
using MmaGemmLoaderB = OperandLoader<S, false, TB, T, 16 / int(sizeof(T))>;

// ---- asynchronous copies (sm_80+): global → shared without registers ---------------------------------
//   cp.async.cg.shared.global [s], [g], 16, src_bytes    copies 16 bytes (src_bytes 16) or writes 16
//                                                         zero bytes (src_bytes 0), in the background
//   cp.async.commit_group                                 closes this thread's group of copies so far
//   cp.async.wait_group N                                 waits until at most N groups are in flight
// The emulator copies at once (a copy finished early is one a program cannot tell apart) and
// its commit and wait do nothing.
__device__ __forceinline__ void cp_async16(void* smem, const void* global, bool inside) {
#if defined(__CUDACC__)
    const unsigned s = unsigned(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(global), "r"(inside ? 16 : 0));
#else
    if (inside) memcpy(smem, global, 16);
    else memset(smem, 0, 16);
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDACC__)
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDACC__)
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

// A loader's tile for step k0 by cp.async, for rows that allow 16-byte chunks (vec): this thread's
// chunks, where fetch would read them, copied straight into the stage (zeros outside the matrix:
// an outside chunk's address is clamped to the tile's start, inside the matrix, which cp.async then
// does not read).
template <class Loader>
__device__ __forceinline__ void copy_async(const Loader& loader, int64_t k0, uint16_t* stage) {
    using S = typename Loader::Shape;
    KILN_UNROLL
    for (int c = 0; c < Loader::kPer; c++) {
        int o, k;
        Loader::place(c, o, k);
        const bool inside = loader.inside(o, k0 + k, 0);
        const void* p = inside ? loader.address(o, k0 + k) : loader.X;
        cp_async16(&stage[Loader::kIsA ? S::a_index(o, k) : S::b_index(k, o)], p, inside);
    }
}

// 16-byte chunks (8 16-bit values, or 4 floats: vector_chunks) along a matrix's contiguous
// dimension as vectors (host code).
template <typename T>
inline bool vector_chunks16(const T* p, int64_t ld, int64_t contiguous_extent) {
    if constexpr (sizeof(T) == 4) return vector_chunks(p, ld, contiguous_extent);
    static_assert(sizeof(T) == 2 || sizeof(T) == 4, "16-bit elements: 8 to a chunk; floats: 4");
    return ld % 8 == 0 && contiguous_extent % 8 == 0 && reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

}  // namespace kiln::cuda::detail
