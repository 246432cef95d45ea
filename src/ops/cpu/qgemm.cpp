// qgemm.cpp — the int8 matrix products on the CPU (chapter 11), u8 × i8 → int32. The contract
// is in ops/quant.h, the paths' names and how one is picked in qgemm.h.
//
//   qgemm_u8s8: C[m, n] = Σ_k A[m, k] · B[n, k]   A u8 [M, K], B i8 [N, K] (a Linear's weight)
//   qgemm_s8u8: C[m, n] = Σ_k A[m, k] · B[k, n]   A i8 [M, K] (a conv's weight [O, C·KH·KW]),
//                                                 B u8 [K, N] (an image [C, H·W], or its im2col)
//
// The scheme is chapter 03's f32 GEMM (gemm.cpp): operands packed into the order a register
// micro-kernel reads them, blocks sized for the caches, threads on separate blocks of C. What
// changes is the inner product: integers, several k at once.
//
// ---- One instruction, several products -----------------------------------------------------
// An f32 FMA does one multiply-add per lane. The integer instructions multiply narrow values
// and add neighbouring products inside the instruction, so one 32-bit lane receives 2 or 4
// products of consecutive k:
//   vpmaddwd   i16 × i16 → i32:  lane = a0·b0 + a1·b1                          (AVX2)
//   vpmaddubsw u8 × i8 → i16:    lane = sat16(a0·b0 + a1·b1), 16 lanes          (AVX2)
//   vpdpbusd   u8 × i8 → i32:    lane += a0·b0 + a1·b1 + a2·b2 + a3·b3         (AVX-VNNI, AVX512-VNNI)
// So the packed operands keep k in groups of KG = 2 or 4 consecutive values, and the
// micro-kernel broadcasts one group of A (32 bits: 2 i16 or 4 u8) against a vector of B that
// holds one group for each of 8 (ymm) or 16 (zmm) columns of C:
//   Ap: panels of MR rows:      Ap[panel][g][i][q] = A[i0 + i, g·KG + q]     (0 past M and K)
//   Bp: panels of NR columns:   Bp[panel][g][j][q] = B[j0 + j, g·KG + q]     (0 past N and K)
//   tile[i][j] (int32, MR×NR, in registers) += Σ_q Ap[g][i][q] · Bp[g][j][q],  g = 0, 1, ...
// The zero padding adds 0·b or a·0: K, M and N need not be multiples of anything.
//
// ---- Weights first: qgemm_s8u8 ---------------------------------------------------------------
// A convolution's output is [O, P·Q]: a row per channel. As qgemm_u8s8 (pixels as the rows of
// A, the weight as B) the product gave it as Cᵀ, and the tile went into C column by column: a
// scalar store per element, each ldc apart, which on a Zen 4 took 8 times the micro-kernel's
// own time for a 1×1 conv of K = 24 (perf). So qgemm_s8u8 swaps the operands' places: the weight
// is A, broadcast a group at a time; the pixels are B, a vector of NR columns; each tile row is
// a run of one output channel, stored as vectors. The instructions take either order (vpdpbusd
// and vpmaddubsw want the u8 operand first, which is then the vector), the panels are the same
// (pack_panel), and B, stored [K, N], is packed by pack_panel_transposed: k runs down the rows.
//
// ---- The paths -------------------------------------------------------------------------------
//   portable      KG = 1, u8 and i8 as they are; plain C++ the compiler vectorizes as it can.
//   avx2-madd     KG = 2: A and B widened to i16 while packing (u8 zero-extended, i8 sign-
//                 extended, once per call), then vpmaddwd and vpaddd. Exact for every u8:
//                 |a0·b0 + a1·b1| ≤ 2·255·128 = 65280, far inside int32.
//   avx2-maddubs  KG = 4, u8 and i8 as they are: vpmaddubsw gives 16-bit sums of 2 products,
//                 vpmaddwd with a vector of ones adds neighbouring pairs into i32, vpaddd
//                 accumulates. Twice the products per instruction of avx2-madd and half the
//                 bytes, but the 16-bit sum SATURATES: with u8 up to 255 and i8 down to −128,
//                 2·255·127 = 64770 > 32767 (and 2·255·(−128) = −65280 < −32768). With A
//                 held to [0, 127] (PyTorch's reduce_range, what fbgemm does on CPUs without
//                 VNNI) it cannot: 2·127·127 = 32258 ≤ 32767 and 2·127·(−128) = −32512 ≥ −32768.
//                 qgemm_u8s8 takes it only when the caller promises a_max ≤ 127.
//   avx-vnni      KG = 4: vpdpbusd on ymm sums 4 u8 × i8 products straight into the i32 lane
//                 (no 16-bit intermediate, no saturation: the full u8 range, in one instruction).
//   avx512-vnni   the same on zmm: 16 lanes, NR = 32.
// Every path gives the same C: integer sums are exact whatever their order (while they fit
// in int32, which ops/quant.h's bound on K guarantees).
//
// ---- Blocking ----------------------------------------------------------------------------------
// B (a Linear's weight for qgemm_u8s8, one image's pixels for qgemm_s8u8) is packed whole, once
// per call. Then each thread takes blocks of MC rows of C and, for each KC-block of k:
// packs its MC×KC block of A (L2), and for each B panel (KC×NR, L1) sweeps the A panels,
// adding each finished tile into C (stored on the first KC-block, added on the later ones).
// KC is chosen so that a B panel's slice is 16 KiB, half of a 32 KiB L1; MC so that the A
// block is 256 KiB.
//
// ---- Threads -----------------------------------------------------------------------------------
// Rows of C are split into blocks of whole MR panels, at least 4 per thread when there are
// rows enough, handed out dynamically. A product below about a million multiply-adds, or one
// called from inside a parallel region (qconv2d runs one per image on each thread), runs on
// the calling thread. The result cannot depend on the thread count: every element is the same
// integer sum.
//
// ---- Speed -------------------------------------------------------------------------------------
// bench/bench_qgemm.cpp times these products against cpu::gemm<float> and the int8 convolutions
// against conv2d_forward<float> (`make bench`). Why int8 is faster: a CPU issues as many vpmaddwd
// or vpmaddubsw per cycle as f32 FMAs, but each multiplies 16 or 32 pairs against the FMA's 8;
// where a layer does little arithmetic per byte (a stem with K = 12, or 20 channels that fill
// three 8-row panels), the copies of im2col take that gain back. The VNNI paths were written for
// the machines that have them (Zen 4 and 5, Ice Lake and later) and are tested there by the same
// cases.
#include "ops/cpu/qgemm.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/cpu_features.h"
#include "core/error.h"
#include "core/parallel.h"
#include "ops/quant.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KILN_QGEMM_X86 1
// Compiled for these instruction sets one function at a time, so that the library still builds
// for any x86-64 (make SAN=1 has no -march); called only where the CPU has them.
#define KILN_TARGET_AVX2 __attribute__((target("avx2")))
#define KILN_TARGET_AVX_VNNI __attribute__((target("avx2,avxvnni")))
#define KILN_TARGET_AVX512_VNNI __attribute__((target("avx512f,avx512bw,avx512vnni")))
#endif

namespace kiln::cpu {
namespace {

// ---- Packing ------------------------------------------------------------------------------------
// One panel of L lines of X (rows of A, or rows of B: the columns of C), k in [0, kc), as
// `groups` groups of KG:
//   P[g][i][q] = T(X[i, g·KG + q])   for i < lines and g·KG + q < kc, 0 elsewhere
// S is u8 (A) or i8 (B); T the same type, or i16 (avx2-madd: widened here, once per call).
template <typename S, typename T, int KG>
inline void copy_group(const S* src, T* dst) {
    if constexpr (sizeof(S) == sizeof(T))
        std::memcpy(dst, src, KG);  // one 32-bit move for KG = 4
    else
        for (int q = 0; q < KG; ++q) dst[q] = T(src[q]);
}

template <typename S, typename T, int L, int KG>
void pack_panel(const void* src, int64_t ld, int64_t lines, int64_t kc, int64_t groups, void* out) {
    const S* X = static_cast<const S*>(src);
    T* P = static_cast<T*>(out);
    const int64_t whole = lines == L ? kc / KG : 0;  // groups of L lines and KG values: no tests
    for (int64_t g = 0; g < whole; ++g)
#pragma GCC unroll 8
        for (int i = 0; i < L; ++i, P += KG) copy_group<S, T, KG>(X + i * ld + g * KG, P);
    for (int64_t g = whole; g < groups; ++g) {  // the edges: lines past `lines`, k past kc
        const int64_t valid = std::clamp<int64_t>(kc - g * KG, 0, KG);  // this group's k below kc
        for (int i = 0; i < L; ++i, P += KG) {
            const S* src = X + i * ld + g * KG;
            if (i < lines && valid == KG)
                copy_group<S, T, KG>(src, P);
            else
                for (int q = 0; q < KG; ++q) P[q] = i < lines && q < valid ? T(src[q]) : T(0);
        }
    }
}

// The same panel from a transposed X, X[k·ld + i] (the L lines side by side along each k):
//   P[g][i][q] = T(X[(g·KG + q)·ld + i])
// qgemm_s8u8's B [K, N]: an image [C, H·W] as it lies (k = channel, line = pixel), or its im2col.
template <typename S, typename T, int L, int KG>
void pack_panel_transposed(const void* src, int64_t ld, int64_t lines, int64_t kc, int64_t groups, void* out) {
    const S* X = static_cast<const S*>(src);
    T* P = static_cast<T*>(out);
    const int64_t whole = lines == L ? kc / KG : 0;  // as pack_panel: no tests inside
    for (int64_t g = 0; g < whole; ++g, P += L * KG) {
        const S* x = X + g * KG * ld;
#pragma GCC unroll 4
        for (int q = 0; q < KG; ++q)
#pragma GCC unroll 8
            for (int i = 0; i < L; ++i) P[i * KG + q] = T(x[q * ld + i]);
    }
    for (int64_t g = whole; g < groups; ++g, P += L * KG)
        for (int i = 0; i < L; ++i)
            for (int q = 0; q < KG; ++q) {
                const int64_t k = g * KG + q;
                P[i * KG + q] = i < lines && k < kc ? T(X[k * ld + i]) : T(0);
            }
}

#if defined(KILN_QGEMM_X86)
// pack_panel_transposed<uint8_t, uint8_t, L, 4> (L = 16 or 32) with AVX2 for its whole groups:
// the four rows of a group are interleaved byte by byte into 4-byte groups,
//   P[g][i] = x[0][i] x[1][i] x[2][i] x[3][i]          (x[q] = X + (g·4 + q)·ld)
// by unpacking bytes then 16-bit pairs (within 128-bit lanes; for 32 columns the lanes are put
// back in order by a permute). The scalar loop took more than a third of LeNet's int8 inference.
template <int L>
KILN_TARGET_AVX2 void pack_u8_by_k_avx2(const void* src, int64_t ld, int64_t lines, int64_t kc, int64_t groups,
                                        void* out) {
    static_assert(L == 16 || L == 32, "pack_u8_by_k_avx2: 16 or 32 columns");
    const uint8_t* X = static_cast<const uint8_t*>(src);
    uint8_t* P = static_cast<uint8_t*>(out);
    const int64_t whole = lines == L ? kc / 4 : 0;
    for (int64_t g = 0; g < whole; ++g, P += L * 4) {
        const uint8_t* x = X + g * 4 * ld;
        if constexpr (L == 32) {
            // (loads written out: a lambda would not get this function's AVX2 target, and below -O2
            // g++ fails to inline the intrinsic into it)
            const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)),
                          b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + ld)),
                          c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 2 * ld)),
                          d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 3 * ld));
            const __m256i ab_lo = _mm256_unpacklo_epi8(a, b), ab_hi = _mm256_unpackhi_epi8(a, b);
            const __m256i cd_lo = _mm256_unpacklo_epi8(c, d), cd_hi = _mm256_unpackhi_epi8(c, d);
            // columns 0–3 | 16–19, 4–7 | 20–23, 8–11 | 24–27, 12–15 | 28–31
            const __m256i q0 = _mm256_unpacklo_epi16(ab_lo, cd_lo), q1 = _mm256_unpackhi_epi16(ab_lo, cd_lo);
            const __m256i q2 = _mm256_unpacklo_epi16(ab_hi, cd_hi), q3 = _mm256_unpackhi_epi16(ab_hi, cd_hi);
            __m256i* o = reinterpret_cast<__m256i*>(P);
            _mm256_storeu_si256(o + 0, _mm256_permute2x128_si256(q0, q1, 0x20));  // columns 0–7
            _mm256_storeu_si256(o + 1, _mm256_permute2x128_si256(q2, q3, 0x20));  // 8–15
            _mm256_storeu_si256(o + 2, _mm256_permute2x128_si256(q0, q1, 0x31));  // 16–23
            _mm256_storeu_si256(o + 3, _mm256_permute2x128_si256(q2, q3, 0x31));  // 24–31
        } else {
            const auto row = [&](int q) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + q * ld)); };
            const __m128i a = row(0), b = row(1), c = row(2), d = row(3);
            const __m128i ab_lo = _mm_unpacklo_epi8(a, b), ab_hi = _mm_unpackhi_epi8(a, b);
            const __m128i cd_lo = _mm_unpacklo_epi8(c, d), cd_hi = _mm_unpackhi_epi8(c, d);
            __m128i* o = reinterpret_cast<__m128i*>(P);
            _mm_storeu_si128(o + 0, _mm_unpacklo_epi16(ab_lo, cd_lo));  // columns 0–3
            _mm_storeu_si128(o + 1, _mm_unpackhi_epi16(ab_lo, cd_lo));  // 4–7
            _mm_storeu_si128(o + 2, _mm_unpacklo_epi16(ab_hi, cd_hi));  // 8–11
            _mm_storeu_si128(o + 3, _mm_unpackhi_epi16(ab_hi, cd_hi));  // 12–15
        }
    }
    if (whole < groups)  // a partial panel, or the last group of k
        pack_panel_transposed<uint8_t, uint8_t, L, 4>(X + whole * 4 * ld, ld, lines, kc - whole * 4, groups - whole, P);
}
#endif

// ---- Micro-kernels ------------------------------------------------------------------------------
// tile[i][j] = Σ over `groups` groups of Ap[g][i][·] · Bp[g][j][·]   (tile: MR×NR int32, row-major)
// The SIMD kernels' loops over i are unrolled completely, so that acc lives in registers.
// kU8B: B holds the u8 and A the i8 (qgemm_s8u8); otherwise A the u8 and B the i8.

// portable: KG = 1, the outer product of MR values of A and NR of B per k.
template <int MR, int NR, bool kU8B>
void tile_portable(int64_t groups, const void* ap, const void* bp, int32_t* tile) {
    using TA = std::conditional_t<kU8B, int8_t, uint8_t>;
    using TB = std::conditional_t<kU8B, uint8_t, int8_t>;
    const TA* A = static_cast<const TA*>(ap);
    const TB* B = static_cast<const TB*>(bp);
    int32_t acc[MR][NR] = {};
    for (int64_t k = 0; k < groups; ++k, A += MR, B += NR)
        for (int i = 0; i < MR; ++i)
            for (int j = 0; j < NR; ++j) acc[i][j] += int32_t(A[i]) * int32_t(B[j]);
    std::memcpy(tile, acc, sizeof acc);
}

#if defined(KILN_QGEMM_X86)
// The 32 bits of one group of A, to broadcast to every lane.
inline int32_t group_bits(const void* p) {
    int32_t v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

// avx2-madd and avx2-maddubs: NR = 16 = 2 ymm of 8 columns; a group of one line of A or B is 4
// bytes in both (2 i16, or 4 u8 / i8).
//   avx2-madd (KG = 2):     lane j += A[i][0]·B[j][0] + A[i][1]·B[j][1]     (vpmaddwd, vpaddd)
//   avx2-maddubs (KG = 4):  pairs = sat16(a0·b0 + a1·b1), sat16(a2·b2 + a3·b3)
//                                        (vpmaddubsw: u8 first, i8 second; A ≤ 127: header comment)
//                           lane j += pairs[0] + pairs[1]          (vpmaddwd with ones, vpaddd)
template <int MR, bool kMaddubs, bool kU8B>
KILN_TARGET_AVX2 void tile_avx2(int64_t groups, const void* ap, const void* bp, int32_t* tile) {
    const uint8_t* A = static_cast<const uint8_t*>(ap);
    const uint8_t* B = static_cast<const uint8_t*>(bp);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc[MR][2];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_si256();
    for (int64_t g = 0; g < groups; ++g, A += 4 * MR, B += 4 * 16) {
        const __m256i b[2] = {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(B)),
                              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(B + 32))};
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) {
            const __m256i a = _mm256_set1_epi32(group_bits(A + 4 * i));
#pragma GCC unroll 2
            for (int v = 0; v < 2; ++v) {
                const __m256i pairs = kU8B ? _mm256_maddubs_epi16(b[v], a) : _mm256_maddubs_epi16(a, b[v]);
                const __m256i sums = kMaddubs ? _mm256_madd_epi16(pairs, ones) : _mm256_madd_epi16(a, b[v]);
                acc[i][v] = _mm256_add_epi32(acc[i][v], sums);
            }
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 2
        for (int v = 0; v < 2; ++v) _mm256_storeu_si256(reinterpret_cast<__m256i*>(tile + i * 16 + 8 * v), acc[i][v]);
}

// avx-vnni: KG = 4 (u8, i8), NR = 16 = 2 ymm of 8 columns.
//   lane j += a0·b0 + a1·b1 + a2·b2 + a3·b3                (vpdpbusd: u8 first, i8 second)
template <int MR, bool kU8B>
KILN_TARGET_AVX_VNNI void tile_avx_vnni(int64_t groups, const void* ap, const void* bp, int32_t* tile) {
    const uint8_t* A = static_cast<const uint8_t*>(ap);
    const uint8_t* B = static_cast<const uint8_t*>(bp);
    __m256i acc[MR][2];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_si256();
    for (int64_t g = 0; g < groups; ++g, A += 4 * MR, B += 4 * 16) {
        const __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(B));
        const __m256i b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(B + 32));
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) {
            const __m256i a = _mm256_set1_epi32(group_bits(A + 4 * i));
            acc[i][0] = kU8B ? _mm256_dpbusd_avx_epi32(acc[i][0], b0, a) : _mm256_dpbusd_avx_epi32(acc[i][0], a, b0);
            acc[i][1] = kU8B ? _mm256_dpbusd_avx_epi32(acc[i][1], b1, a) : _mm256_dpbusd_avx_epi32(acc[i][1], a, b1);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 2
        for (int v = 0; v < 2; ++v) _mm256_storeu_si256(reinterpret_cast<__m256i*>(tile + i * 16 + 8 * v), acc[i][v]);
}

// avx512-vnni: KG = 4 (u8, i8), NR = 32 = 2 zmm of 16 columns; the same sums as avx-vnni.
template <int MR, bool kU8B>
KILN_TARGET_AVX512_VNNI void tile_avx512_vnni(int64_t groups, const void* ap, const void* bp, int32_t* tile) {
    const uint8_t* A = static_cast<const uint8_t*>(ap);
    const uint8_t* B = static_cast<const uint8_t*>(bp);
    __m512i acc[MR][2];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_si512();
    for (int64_t g = 0; g < groups; ++g, A += 4 * MR, B += 4 * 32) {
        const __m512i b0 = _mm512_loadu_si512(B);
        const __m512i b1 = _mm512_loadu_si512(B + 64);
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) {
            const __m512i a = _mm512_set1_epi32(group_bits(A + 4 * i));
            acc[i][0] = kU8B ? _mm512_dpbusd_epi32(acc[i][0], b0, a) : _mm512_dpbusd_epi32(acc[i][0], a, b0);
            acc[i][1] = kU8B ? _mm512_dpbusd_epi32(acc[i][1], b1, a) : _mm512_dpbusd_epi32(acc[i][1], a, b1);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 2
        for (int v = 0; v < 2; ++v) _mm512_storeu_si512(tile + i * 32 + 16 * v, acc[i][v]);
}
#endif

// ---- A path: its micro-kernel, tile and packing ---------------------------------------------------
using TileFn = void (*)(int64_t groups, const void* Ap, const void* Bp, int32_t* tile);
using PackFn = void (*)(const void* X, int64_t ld, int64_t lines, int64_t kc, int64_t groups, void* P);

struct Kernel {
    int mr, nr, kg;  // the tile of C, and k per group
    int bytes;       // of one packed value: 1 (u8, i8) or 2 (i16)
    TileFn tile;
    PackFn pack_a;   // MR lines of A [M, K]
    PackFn pack_b;   // NR lines of B: [N, K] (qgemm_u8s8), or [K, N] with b_by_k (qgemm_s8u8)
    bool b_by_k;
};
constexpr int kMaxTile = 8 * 32;  // MR·NR of the largest tile (avx512-vnni)

// The kernel of qgemm_u8s8 (A u8, B i8 [N, K]) or, with kU8B, of qgemm_s8u8 (A i8, B u8 [K, N]).
// TA, TB: the packed types of A and B (i16 for both on avx2-madd).
// A u8 B [K, N] packed as it is (KG = 4, 16 or 32 columns) takes the AVX2 packer: every path but
// the portable one and avx2-madd (which widens to i16) runs on a CPU with AVX2.
template <typename TA, typename TB, int MR, int NR, int KG, bool kU8B>
constexpr Kernel make_kernel(TileFn tile) {
    static_assert(MR * NR <= kMaxTile && sizeof(TA) == sizeof(TB));
    using SA = std::conditional_t<kU8B, int8_t, uint8_t>;  // A's stored type
    using SB = std::conditional_t<kU8B, uint8_t, int8_t>;
    PackFn pack_b = kU8B ? pack_panel_transposed<SB, TB, NR, KG> : pack_panel<SB, TB, NR, KG>;
#if defined(KILN_QGEMM_X86)
    if constexpr (kU8B && std::is_same_v<TB, uint8_t> && KG == 4 && (NR == 16 || NR == 32))
        if (tile != tile_portable<MR, NR, kU8B>) pack_b = pack_u8_by_k_avx2<NR>;
#endif
    return Kernel{MR, NR, KG, int(sizeof(TA)), tile, pack_panel<SA, TA, MR, KG>, pack_b, kU8B};
}

// MR: as many rows as the 16 ymm registers hold beside B's 2 vectors, the broadcast of A and
// the instructions' temporaries: 6×2 accumulators for vpdpbusd, 5×2 for vpmaddwd (one
// temporary), 4×2 for vpmaddubsw (two temporaries and the ones); 8×2 of the 32 zmm.
template <bool kU8B>
const Kernel& kernel_for(QgemmPath path) {
    using TA = std::conditional_t<kU8B, int8_t, uint8_t>;  // packed as stored (but avx2-madd)
    using TB = std::conditional_t<kU8B, uint8_t, int8_t>;
    static const Kernel portable = make_kernel<TA, TB, 4, 16, 1, kU8B>(tile_portable<4, 16, kU8B>);
#if defined(KILN_QGEMM_X86)
    static const Kernel madd = make_kernel<int16_t, int16_t, 5, 16, 2, kU8B>(tile_avx2<5, false, kU8B>);
    static const Kernel maddubs = make_kernel<TA, TB, 4, 16, 4, kU8B>(tile_avx2<4, true, kU8B>);
    static const Kernel avx_vnni = make_kernel<TA, TB, 6, 16, 4, kU8B>(tile_avx_vnni<6, kU8B>);
    static const Kernel avx512_vnni = make_kernel<TA, TB, 8, 32, 4, kU8B>(tile_avx512_vnni<8, kU8B>);
    switch (path) {
        case QgemmPath::Portable: break;
        case QgemmPath::Avx2Madd: return madd;
        case QgemmPath::Avx2Maddubs: return maddubs;
        case QgemmPath::AvxVnni: return avx_vnni;
        case QgemmPath::Avx512Vnni: return avx512_vnni;
    }
#endif
    KILN_CHECK(path == QgemmPath::Portable, "qgemm: the ", qgemm_path_name(path), " path is not compiled in (not x86)");
    return portable;
}

// ---- The blocked product ----------------------------------------------------------------------------
constexpr int64_t kBPanelSliceBytes = 16 << 10;  // a B panel's KC-slice: half of L1
constexpr int64_t kABlockBytes = 256 << 10;      // an MC×KC block of A: in L2
constexpr int64_t kParallelMinMacs = int64_t(1) << 20;  // below: the product on one thread
constexpr int64_t kParallelMinPack = int64_t(1) << 16;  // B values; below: packed on one thread

// Per-thread packing buffers, kept between calls (allocating them would cost more than a small
// product). OpenMP keeps its worker threads, so their buffers live on too.
thread_local std::vector<uint8_t> tls_a, tls_b;

uint8_t* reserve(std::vector<uint8_t>& buffer, int64_t bytes) {
    if (int64_t(buffer.size()) < bytes) buffer.resize(size_t(bytes));
    return buffer.data();
}

// ceil(n / d)
int64_t ceil_div(int64_t n, int64_t d) { return (n + d - 1) / d; }

// Threads for `work` (multiply-adds, values packed): one inside a parallel region or below `min_work`.
int threads_for(int64_t work, int64_t min_work) {
    return in_parallel() || work < min_work ? 1 : max_threads();
}

// B packed: ceil(N / NR) panels of groups·KG·NR values each, groups = ceil(K / KG).
int64_t b_panel_bytes(const Kernel& kn, int64_t K) { return ceil_div(K, kn.kg) * kn.kg * kn.nr * kn.bytes; }
int64_t packed_b_bytes(const Kernel& kn, int64_t N, int64_t K) { return ceil_div(N, kn.nr) * b_panel_bytes(kn, K); }

// B: 1-byte values, [N, K], or [K, N] for the kernels with b_by_k (panel jp starts at column jp·NR).
void pack_b(const Kernel& kn, int64_t N, int64_t K, const uint8_t* B, int64_t ldb, uint8_t* Bp) {
    const int64_t nr = kn.nr, panel = b_panel_bytes(kn, K);
    const int threads = threads_for(N * K, kParallelMinPack);
    const auto pack_panel = [&](int64_t jp) {
        kn.pack_b(kn.b_by_k ? B + jp * nr : B + jp * nr * ldb, ldb, std::min(nr, N - jp * nr), K, ceil_div(K, kn.kg),
                  Bp + jp * panel);
    };
    parallel_chunks(ceil_div(N, nr), pack_panel, threads > 1);
}

struct Product {
    int64_t M, N, K;
    const uint8_t* A;   // 1-byte values (u8 or i8), [M, K]
    int64_t lda;
    const uint8_t* Bp;  // B packed (pack_b)
    int32_t* C;
    int64_t ldc;
    int64_t groups;     // ceil(K / KG): the packed depth
    int64_t kc_groups;  // groups per KC-block
};

// The part of an MR×NR tile inside C: C[i, j] = tile[i][j] (store) or C[i, j] += tile[i][j]
// (add), a row's run of `cols` values at a time. (A store never reads C: with one KC-block, the
// common case, C is only written.)
void store_tile(const int32_t* tile, int nr, int64_t rows, int64_t cols, bool add, int32_t* C, int64_t ldc) {
    for (int64_t i = 0; i < rows; ++i) {
        const int32_t* t = tile + i * nr;
        int32_t* c = C + i * ldc;
        if (add)
            for (int64_t j = 0; j < cols; ++j) c[j] += t[j];
        else
            std::memcpy(c, t, size_t(cols) * sizeof(int32_t));
    }
}

// Rows [i0, i1) of C, on the calling thread (its own A buffer).
void multiply_rows(const Kernel& kn, const Product& p, int64_t i0, int64_t i1) {
    const int64_t mr = kn.mr, nr = kn.nr, kg = kn.kg, n_panels = ceil_div(p.N, nr);
    const int64_t a_panel_values = mr * p.kc_groups * kg;
    uint8_t* Ap = reserve(tls_a, ceil_div(i1 - i0, mr) * a_panel_values * kn.bytes);
    alignas(64) int32_t tile[kMaxTile];
    for (int64_t g0 = 0; g0 < p.groups; g0 += p.kc_groups) {
        const int64_t groups = std::min(p.kc_groups, p.groups - g0), k0 = g0 * kg;
        const int64_t kc = std::min(p.K - k0, groups * kg);  // the real k of this block
        for (int64_t i = i0; i < i1; i += mr)
            kn.pack_a(p.A + i * p.lda + k0, p.lda, std::min(mr, i1 - i), kc, groups,
                      Ap + (i - i0) / mr * a_panel_values * kn.bytes);
        for (int64_t jp = 0; jp < n_panels; ++jp) {
            const uint8_t* bp = p.Bp + (jp * p.groups + g0) * kg * nr * kn.bytes;
            const int64_t cols = std::min(nr, p.N - jp * nr);
            for (int64_t i = i0; i < i1; i += mr) {
                kn.tile(groups, Ap + (i - i0) / mr * a_panel_values * kn.bytes, bp, tile);
                store_tile(tile, kn.nr, std::min(mr, i1 - i), cols, g0 > 0, p.C + i * p.ldc + jp * nr, p.ldc);
            }
        }
    }
}

// C = A · B with B packed by pack_b.
void multiply(const Kernel& kn, int64_t M, int64_t N, int64_t K, const uint8_t* A, int64_t lda, const uint8_t* Bp,
              int32_t* C, int64_t ldc) {
    if (M == 0 || N == 0) return;
    if (K == 0) {
        for (int64_t i = 0; i < M; ++i)
            std::fill(C + i * ldc, C + i * ldc + N, 0);
        return;
    }
    const int64_t mr = kn.mr, groups = ceil_div(K, kn.kg);
    // KC: the fewest blocks whose B panel slice fits kBPanelSliceBytes, all of one size.
    const int64_t max_kc_groups = kBPanelSliceBytes / (kn.nr * kn.kg * kn.bytes);
    const int64_t kc_groups = ceil_div(groups, ceil_div(groups, max_kc_groups));
    const Product p{M, N, K, A, lda, Bp, C, ldc, groups, kc_groups};
    // MC: whole MR panels, the A block within kABlockBytes, and with threads at least 4 blocks
    // each when there are panels enough.
    const int threads = threads_for(M * N * K, kParallelMinMacs);
    const int64_t m_panels = ceil_div(M, mr);
    const int64_t max_mc_panels = std::max<int64_t>(1, kABlockBytes / (mr * kc_groups * kn.kg * kn.bytes));
    const int64_t blocks = std::min(m_panels, std::max(ceil_div(m_panels, max_mc_panels), int64_t(4) * threads));
    const int64_t mc = ceil_div(m_panels, blocks) * mr;
    const auto row_block = [&](int64_t b) { multiply_rows(kn, p, b * mc, std::min(M, (b + 1) * mc)); };
    parallel_chunks(ceil_div(M, mc), row_block, threads > 1);
}

// The arguments of qgemm_u8s8 (fn, its B [N, K]) or qgemm_s8u8 (B [K, N], b_by_k).
void check_args(const char* fn, int64_t M, int64_t N, int64_t K, const void* A, int64_t lda, const void* B,
                int64_t ldb, bool b_by_k, const int32_t* C, int64_t ldc) {
    KILN_CHECK(M >= 0 && N >= 0 && K >= 0, fn, ": negative size M=", M, " N=", N, " K=", K);
    KILN_CHECK(K <= 65792, fn, ": K=", K, " > 65792: the int32 sums of K products 255·(−128) could "
               "overflow; split k into parts and add their int32 results in int64");
    KILN_CHECK(lda >= K, fn, ": lda=", lda, " < K=", K, " (A is [M, K], read along k)");
    if (b_by_k)
        KILN_CHECK(ldb >= N, fn, ": ldb=", ldb, " < N=", N, " (B is [K, N], a row per k)");
    else
        KILN_CHECK(ldb >= K, fn, ": ldb=", ldb, " < K=", K, " (B is [N, K], read along k)");
    KILN_CHECK(ldc >= N, fn, ": ldc=", ldc, " < N=", N, ", the row length of C");
    KILN_CHECK(M * N == 0 || C != nullptr, fn, ": C is null for a ", M, "×", N, " result");
    KILN_CHECK(M * N * K == 0 || (A != nullptr && B != nullptr), fn, ": A or B is null (M=", M, " N=", N, " K=", K,
               ")");
}

// The path can run here, and on a u8 operand (named `u8`: A or B) up to u8_max.
void check_path(const char* fn, QgemmPath path, int32_t u8_max, const char* u8) {
    KILN_CHECK(u8_max >= 0 && u8_max <= 255, fn, ": ", u8, "'s largest value ", u8_max, " is not a u8 value: pass "
               "255, or 127 when ", u8, " was quantized with reduce_range");
    KILN_CHECK(qgemm_path_available(path), fn, ": this CPU (", cpu_features_line(), ") cannot run the ",
               qgemm_path_name(path), " path; qgemm_available_paths() lists those it can");
    KILN_CHECK(path != QgemmPath::Avx2Maddubs || u8_max <= kActQmaxReduced, fn, ": the avx2-maddubs path needs ", u8,
               " ≤ 127 (its 16-bit pair sums saturate above), but its largest value is ", u8_max, "; quantize ", u8,
               " with reduce_range, or take avx2-madd");
}

// Packs B into this thread's buffer, then C = A · B on the kernel kn.
void run(const Kernel& kn, int64_t M, int64_t N, int64_t K, const void* A, int64_t lda, const void* B, int64_t ldb,
         int32_t* C, int64_t ldc) {
    uint8_t* Bp = reserve(tls_b, packed_b_bytes(kn, N, K));
    pack_b(kn, N, K, static_cast<const uint8_t*>(B), ldb, Bp);
    multiply(kn, M, N, K, static_cast<const uint8_t*>(A), lda, Bp, C, ldc);
}

}  // namespace

const char* qgemm_path_name(QgemmPath path) {
    switch (path) {
        case QgemmPath::Portable: return "portable";
        case QgemmPath::Avx2Madd: return "avx2-madd";
        case QgemmPath::Avx2Maddubs: return "avx2-maddubs";
        case QgemmPath::AvxVnni: return "avx-vnni";
        case QgemmPath::Avx512Vnni: return "avx512-vnni";
    }
    return "?";
}

bool qgemm_path_available(QgemmPath path) {
    const CpuFeatures& f = cpu_features();
    const CpuLevel level = detected_cpu_level();
    switch (path) {
        case QgemmPath::Portable: return true;
        case QgemmPath::Avx2Madd:
        case QgemmPath::Avx2Maddubs: return level >= CpuLevel::Avx2;
        case QgemmPath::AvxVnni: return level >= CpuLevel::Avx2 && f.avx_vnni;
        case QgemmPath::Avx512Vnni: return level >= CpuLevel::Avx512 && f.avx512_vnni;
    }
    return false;
}

std::vector<QgemmPath> qgemm_available_paths() {
    std::vector<QgemmPath> paths;
    for (QgemmPath p : {QgemmPath::Portable, QgemmPath::Avx2Madd, QgemmPath::Avx2Maddubs, QgemmPath::AvxVnni,
                        QgemmPath::Avx512Vnni})
        if (qgemm_path_available(p)) paths.push_back(p);
    return paths;
}

QgemmPath qgemm_path(int32_t a_max) {
    const CpuFeatures& f = cpu_features();
    const CpuLevel level = cpu_level();
    if (level >= CpuLevel::Avx512 && f.avx512_vnni) return QgemmPath::Avx512Vnni;
    if (level >= CpuLevel::Avx2 && f.avx_vnni) return QgemmPath::AvxVnni;
    if (level >= CpuLevel::Avx2) return a_max <= kActQmaxReduced ? QgemmPath::Avx2Maddubs : QgemmPath::Avx2Madd;
    return QgemmPath::Portable;
}

void qgemm_u8s8_on(QgemmPath path, int64_t M, int64_t N, int64_t K, const uint8_t* A, int64_t lda,
                   const int8_t* B, int64_t ldb, int32_t* C, int64_t ldc, int32_t a_max) {
    check_args("qgemm_u8s8", M, N, K, A, lda, B, ldb, /*b_by_k=*/false, C, ldc);
    check_path("qgemm_u8s8", path, a_max, "A");
    run(kernel_for</*kU8B=*/false>(path), M, N, K, A, lda, B, ldb, C, ldc);
}

void qgemm_u8s8(int64_t M, int64_t N, int64_t K, const uint8_t* A, int64_t lda, const int8_t* B, int64_t ldb,
                int32_t* C, int64_t ldc, int32_t a_max) {
    qgemm_u8s8_on(qgemm_path(a_max), M, N, K, A, lda, B, ldb, C, ldc, a_max);
}

void qgemm_s8u8_on(QgemmPath path, int64_t M, int64_t N, int64_t K, const int8_t* A, int64_t lda,
                   const uint8_t* B, int64_t ldb, int32_t* C, int64_t ldc, int32_t b_max) {
    check_args("qgemm_s8u8", M, N, K, A, lda, B, ldb, /*b_by_k=*/true, C, ldc);
    check_path("qgemm_s8u8", path, b_max, "B");
    run(kernel_for</*kU8B=*/true>(path), M, N, K, A, lda, B, ldb, C, ldc);
}

void qgemm_s8u8(int64_t M, int64_t N, int64_t K, const int8_t* A, int64_t lda, const uint8_t* B, int64_t ldb,
                int32_t* C, int64_t ldc, int32_t b_max) {
    qgemm_s8u8_on(qgemm_path(b_max), M, N, K, A, lda, B, ldb, C, ldc, b_max);
}

const char* qgemm_path_for(int32_t a_max) { return qgemm_path_name(qgemm_path(a_max)); }

}  // namespace kiln::cpu
