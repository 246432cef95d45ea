// gemm_tile_body.h — the one body of the GEMM micro-kernel (gemm_tile.h), included by
// gemm_tile_avx512.cpp, gemm_tile_avx2.cpp and gemm_tile_portable.cpp. Each defines, before
// including it, KILN_TILE_ISA (512, 256 or 0: the vector type) and KILN_TILE_KERNEL (the name
// of the MicroKernel to define), after a `#pragma GCC target` for its instruction set.
// gemm_tile_avx512bf16.cpp also defines KILN_TILE_BF16_PAIRS: its panels hold pairs of bf16 and
// each step of the k loop is a vdpbf16ps instead of an FMA (see vstep). gemm_tile_avx512_narrow16.cpp,
// _narrow32.cpp and _narrow48.cpp define KILN_TILE_NV (1, 2 or 3: vectors per tile row, 16, 32
// or 48 columns) and
// KILN_TILE_NAME for AVX-512 kernels narrower than the 6×64 one.
#include "ops/cpu/gemm_tile.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#if KILN_TILE_ISA != 0
#include <immintrin.h>
#endif

namespace kiln::cpu {
namespace {

// ---- SIMD: the vector operations the micro-kernel needs ---------------------------------
// VL floats per vector, NV vectors per tile row: NR = NV·VL columns.
#if KILN_TILE_ISA == 512
using vec = __m512;
constexpr int VL = 16;
#ifdef KILN_TILE_NV
constexpr const char* kName = KILN_TILE_NAME;
constexpr int NV = KILN_TILE_NV;  // for narrow products (gemm_tile.h, micro_kernel(level, N))
#else
constexpr const char* kName = "avx512";
constexpr int NV = 4;  // 6×4 = 24 accumulators + 4 B vectors + 1 broadcast of the 32 zmm
#endif
inline vec vzero() { return _mm512_setzero_ps(); }
inline vec vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, vec v) { _mm512_storeu_ps(p, v); }
inline vec vbroadcast(float x) { return _mm512_set1_ps(x); }
inline vec vfma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }  // a*b + c
inline vec vmul(vec a, vec b) { return _mm512_mul_ps(a, b); }
// The first n lanes of a vector (n ≤ VL), for a partial tile's last columns: the other lanes are
// neither read nor written, so nothing past C's last column is touched (and cannot fault).
using vmask = __mmask16;
inline vmask first_lanes(int n) { return vmask((1u << n) - 1); }
inline vec vload_first(const float* p, vmask m) { return _mm512_maskz_loadu_ps(m, p); }
inline void vstore_first(float* p, vec v, vmask m) { _mm512_mask_storeu_ps(p, m, v); }
#elif KILN_TILE_ISA == 256
using vec = __m256;
constexpr const char* kName = "avx2-fma";
constexpr int VL = 8;
constexpr int NV = 2;  // 6×2 = 12 accumulators + 2 B vectors + 1 broadcast of the 16 ymm
inline vec vzero() { return _mm256_setzero_ps(); }
inline vec vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, vec v) { _mm256_storeu_ps(p, v); }
inline vec vbroadcast(float x) { return _mm256_set1_ps(x); }
inline vec vfma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
inline vec vmul(vec a, vec b) { return _mm256_mul_ps(a, b); }
using vmask = __m256i;  // a lane is on when its sign bit is set
inline vmask first_lanes(int n) { return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)); }
inline vec vload_first(const float* p, vmask m) { return _mm256_maskload_ps(p, m); }
inline void vstore_first(float* p, vec v, vmask m) { _mm256_maskstore_ps(p, m, v); }
#else
typedef float vec __attribute__((vector_size(16)));  // SSE, NEON, ...: 4 floats
constexpr const char* kName = "vectors";
constexpr int VL = 4;
constexpr int NV = 2;  // 6×2 = 12 accumulators: fits 16 registers
inline vec vzero() { return vec{}; }
inline vec vload(const float* p) {
    vec v;
    std::memcpy(&v, p, sizeof v);  // unaligned-safe; compiles to one vector load
    return v;
}
inline void vstore(float* p, vec v) { std::memcpy(p, &v, sizeof v); }
inline vec vbroadcast(float x) { return vec{} + x; }
inline vec vfma(vec a, vec b, vec c) { return a * b + c; }  // fused where the target has FMA (kFused)
inline vec vmul(vec a, vec b) { return a * b; }
#endif

#if KILN_TILE_ISA != 0 || defined(__FMA__)
constexpr bool kFused = true;
#else
constexpr bool kFused = false;  // a * b + c rounds twice
#endif

// One step of the k loop: acc += a·b, lane by lane.
#if defined(KILN_TILE_BF16_PAIRS) && KILN_TILE_ISA == 512
// Here each 32-bit lane of a and b holds two bf16, the values of k and k+1 (gemm.cpp, "bf16 pairs"),
// and vdpbf16ps computes acc + (a_hi·b_hi + a_lo·b_lo): the products are exact in f32 (8-bit
// significands), the two additions round, and subnormal inputs and results are flushed to zero.
// One instruction does 32 multiply-adds where an f32 FMA does 16.
constexpr const char* kStepName = "avx512-bf16";
constexpr bool kStepFused = false;  // not the bits of the f32 kernels
inline vec vstep(vec a, vec b, vec acc) { return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b); }
#else
constexpr const char* kStepName = kName;
constexpr bool kStepFused = kFused;
inline vec vstep(vec a, vec b, vec acc) { return vfma(a, b, acc); }
#endif

constexpr int MR = kTileRows;
constexpr int NR = NV * VL;
static_assert(NR % 8 == 0, "pack_b_panels (gemm.cpp) packs a transposed f16 or bf16 B 8 columns at a time");

// ---- Storing the tile --------------------------------------------------------------------------
//   C = alpha·acc            when beta == 0 (C is not read: it may hold NaN)
//   C = alpha·acc + C        when beta == 1 (the second and later KC-blocks), one fused step
//   C = alpha·acc + beta·C   otherwise
// The tile goes from the registers straight to C, a vector at a time: the rows of C are ldc
// floats apart, so each row is NV vector loads and stores. (Done as a scalar loop after the
// kernel, through a buffer, this store took a fifth of a CIFAR net's training step.) A partial
// tile (the last rows or columns of C) stores its first out.rows rows, and in each the lanes of
// its first out.cols columns, masked (vstore_first); element by element through a buffer, as it
// was, it took longer than the tile's product when k is short: 48×48×48 ran at a third of
// 64×64×64's rate, every one of its tiles 48 columns wide (one Zen 5 core).
// The portable kernel stores every tile through a buffer, element by element, with the same
// arithmetic: whether the compiler fuses its vectors' a·b + c there is the compiler's choice
// (measured: it did in the k loop, not in the store), and the element loop's std::fma is not.
// load() reads C's values; it is not called when beta == 0.
template <typename Load>
inline vec store_value(vec acc, vec alpha, float beta, Load load) {
    if (beta == 0.0f) return vmul(alpha, acc);
    if (beta == 1.0f) return vfma(alpha, acc, load());
    return vfma(vbroadcast(beta), load(), vmul(alpha, acc));
}

#if KILN_TILE_ISA == 0
// The scalar twin of vfma: the same rounding as the vectors.
inline float sfma(float a, float b, float c) {
    if constexpr (kFused) return std::fma(a, b, c);
    return a * b + c;
}

inline float store_value(float acc, float alpha, float beta, float c) {
    if (beta == 0.0f) return alpha * acc;
    if (beta == 1.0f) return sfma(alpha, acc, c);
    return sfma(beta, c, alpha * acc);
}

// The tile's elements in C: tile[i·NR + j] holds acc.
void store_elements(const float* tile, const TileOut& out) {
    for (int i = 0; i < out.rows; ++i)
        for (int j = 0; j < out.cols; ++j) {
            float& c = out.C[i * out.ldc + j];
            c = store_value(tile[i * NR + j], out.alpha, out.beta, out.beta == 0.0f ? 0.0f : c);
        }
}
#endif

// ---- The tile's product ------------------------------------------------------------------------
// Where the kernel reads its operands: element (i, k) of A at A[i·a_row + k·a_k], row k of B's NR
// columns at B[k·b_k]. Packed panels (gemm.cpp, "Packing"): a_row = 1, a_k = MR, b_k = NR, known
// to the compiler, which then folds them into the loads' addresses. In place (gemm.cpp, "Small
// products"): the caller's strides, and rows past out.rows read the last row again (there may be
// no memory past it; the rows computed from it are never stored).
struct PackedPanels {
    static constexpr int64_t a_row = 1, a_k = MR, b_k = NR;
    static constexpr bool in_place = false;
};
struct InPlace {
    int64_t a_row, a_k, b_k;
    static constexpr bool in_place = true;
};

// acc[MR×NR] = Σ_k A[i, k] ⊗ B[k, 0..NR), k = 0, 1, ..., kc-1 in order, then stored into C's first
// out.rows rows and out.cols columns as above. (With bf16 pairs, k counts pairs.) The same sums
// in the same order whatever the layout, so packed and in place give the same bits.
// The loops over i and j are unrolled completely, so acc lives in registers; k is unrolled
// by 4, which saves the loop's own instructions (they compete with the FMAs for issue slots).
template <typename Layout>
[[gnu::always_inline]] inline void tile_product(int64_t kc, const float* __restrict A, const float* __restrict B,
                                                Layout at, const TileOut& out) {
    const float* a[MR];  // row i of the tile's A
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) a[i] = A + (Layout::in_place ? std::min(i, out.rows - 1) : i) * at.a_row;
    vec acc[MR][NV];
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
        for (int j = 0; j < NV; ++j) acc[i][j] = vzero();
#pragma GCC unroll 4
    for (int64_t k = 0; k < kc; ++k) {
        vec b[NV];
#pragma GCC unroll 4
        for (int j = 0; j < NV; ++j) b[j] = vload(B + k * at.b_k + j * VL);
#pragma GCC unroll 16
        for (int i = 0; i < MR; ++i) {
            const vec ai = vbroadcast(a[i][k * at.a_k]);
#pragma GCC unroll 4
            for (int j = 0; j < NV; ++j) acc[i][j] = vstep(ai, b[j], acc[i][j]);
        }
    }
    // The store, written out here: passing acc to a function by reference made the compiler keep
    // it in memory (a spill in the k loop, measured).
#if KILN_TILE_ISA != 0
    // Read once: out could alias C as far as the compiler knows, so each store would reload it.
    float* const C = out.C;
    const int64_t ldc = out.ldc;
    const float beta = out.beta;
    const vec va = vbroadcast(out.alpha);
    if (out.rows == MR && out.cols == NR) {  // the common case: plain loads and stores, no masks
#pragma GCC unroll 16
        for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
            for (int j = 0; j < NV; ++j) {
                float* c = C + i * ldc + j * VL;
                vstore(c, store_value(acc[i][j], va, beta, [c] { return vload(c); }));
            }
        return;
    }
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
        if (i == out.rows) return;
#pragma GCC unroll 4
        for (int j = 0; j < NV; ++j) {
            const int lanes = std::min(out.cols - j * VL, VL);
            if (lanes <= 0) break;
            const vmask m = first_lanes(lanes);
            float* c = C + i * ldc + j * VL;
            vstore_first(c, store_value(acc[i][j], va, beta, [c, m] { return vload_first(c, m); }), m);
        }
    }
#else
    alignas(64) float tile[MR * NR];
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
        for (int j = 0; j < NV; ++j) vstore(tile + i * NR + j * VL, acc[i][j]);
    store_elements(tile, out);
#endif
}

void multiply(int64_t kc, const float* Ap, const float* Bp, const TileOut& out) {
    tile_product(kc, Ap, Bp, PackedPanels{}, out);
}

void multiply_in_place(int64_t kc, const float* A, int64_t a_row, int64_t a_k, const float* B, int64_t ldb,
                       const TileOut& out) {
    tile_product(kc, A, B, InPlace{a_row, a_k, ldb}, out);
}

// ---- Packing a transposed B -------------------------------------------------------------------
// One micro-panel of op(B) = Bᵀ:  Bp[k·NR + j] = B[j·ldb + k]  for j < n (n ≤ NR), k < kc.
// Column j of the panel is a contiguous row of B, but it lands in the panel NR floats apart: copied
// element by element, that is one load and one store per float, and with NR = 64 the stores of a
// column go to kc different cache lines. So the vector kernels cut the panel into 8×8 blocks: 8 rows
// of B, 8 floats of each, transposed in registers, stored as 8 runs of 8 floats: 8 vector stores per
// 64 floats instead of 64 scalar ones. A pure copy: the bits of the panel do not depend on the path.
#if KILN_TILE_ISA != 0
// r[i] = row i (8 floats)  ->  r[t] = element t of the 8 rows, in registers.
inline void transpose_8x8(__m256 r[8]) {
    __m256 t[8], u[8];
    // Pairs of rows interleaved: t[0] = r0[0] r1[0] r0[1] r1[1] | r0[4] r1[4] r0[5] r1[5], ...
#pragma GCC unroll 4
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    // Quads: u[0] = r0..r3 [0] | r0..r3 [4], u[1] = [1] | [5], u[2] = [2] | [6], u[3] = [3] | [7];
    // u[4..7] the same for r4..r7.
#pragma GCC unroll 2
    for (int h = 0; h < 8; h += 4) {
        u[h + 0] = _mm256_shuffle_ps(t[h], t[h + 2], _MM_SHUFFLE(1, 0, 1, 0));
        u[h + 1] = _mm256_shuffle_ps(t[h], t[h + 2], _MM_SHUFFLE(3, 2, 3, 2));
        u[h + 2] = _mm256_shuffle_ps(t[h + 1], t[h + 3], _MM_SHUFFLE(1, 0, 1, 0));
        u[h + 3] = _mm256_shuffle_ps(t[h + 1], t[h + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    // Halves joined: element c and c + 4 of all 8 rows.
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
        r[c] = _mm256_permute2f128_ps(u[c], u[c + 4], 0x20);
        r[c + 4] = _mm256_permute2f128_ps(u[c], u[c + 4], 0x31);
    }
}

// dst[t·ld_dst + i] = src[i·ld_src + t] for i, t < 8.
inline void transpose_8x8(const float* src, int64_t ld_src, float* dst, int64_t ld_dst) {
    __m256 r[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * ld_src);
    transpose_8x8(r);
#pragma GCC unroll 8
    for (int t = 0; t < 8; ++t) _mm256_storeu_ps(dst + t * ld_dst, r[t]);
}
#endif

// B may be bf16 pairs seen as 32-bit words (gemm.cpp, "bf16 pairs"), at any 2-byte boundary: the
// elements are copied as 4 bytes (memcpy), never read as float objects.
inline void copy_word(const float* src, float* dst) { std::memcpy(dst, src, sizeof(float)); }

void pack_b_transposed(int64_t kc, const float* B, int64_t ldb, int64_t n, float* Bp) {
    int64_t j = 0;
#if KILN_TILE_ISA != 0
    for (; j + 8 <= n; j += 8) {
        int64_t k = 0;
        for (; k + 8 <= kc; k += 8) transpose_8x8(B + j * ldb + k, ldb, Bp + k * NR + j, NR);
        for (; k < kc; ++k)
            for (int64_t i = 0; i < 8; ++i) copy_word(B + (j + i) * ldb + k, Bp + k * NR + j + i);
    }
#endif
    for (; j < n; ++j)
        for (int64_t k = 0; k < kc; ++k) copy_word(B + j * ldb + k, Bp + k * NR + j);
}

// ---- Packing a row-major A ----------------------------------------------------------------------
// One full micro-panel of op(A) = A:  Ap[k·MR + i] = A[i·lda + k]  for i < MR, k < kc: the same
// transpose, MR = 6 rows at a time. The vector kernels load 8 floats of each of the 6 rows (two
// zero rows make it 8×8), transpose, and store element t of the rows, 6 floats, at Ap + (k+t)·6:
// as 8-float stores in order of t, each overwriting the 2 extra floats of the one before, the last
// as 4 + 2. (Element by element, packing A took 8% of a 1024³ product on one Zen 4 core.) As
// pack_b_transposed, A may be bf16 pairs seen as 32-bit words: a pure copy of bits.
void pack_a_rows(int64_t kc, const float* A, int64_t lda, float* Ap) {
    int64_t k = 0;
#if KILN_TILE_ISA != 0
    static_assert(MR == 6, "pack_a_rows stores 6 floats per k");
    for (; k + 8 <= kc; k += 8) {
        __m256 r[8];
#pragma GCC unroll 6
        for (int i = 0; i < MR; ++i) r[i] = _mm256_loadu_ps(A + i * lda + k);
        r[6] = r[7] = _mm256_setzero_ps();
        transpose_8x8(r);
        float* dst = Ap + k * MR;
#pragma GCC unroll 7
        for (int t = 0; t < 7; ++t) _mm256_storeu_ps(dst + t * MR, r[t]);
        _mm_storeu_ps(dst + 7 * MR, _mm256_castps256_ps128(r[7]));
        _mm_storel_pi(reinterpret_cast<__m64*>(dst + 7 * MR + 4), _mm256_extractf128_ps(r[7], 1));
    }
#endif
    for (; k < kc; ++k)
        for (int i = 0; i < MR; ++i) copy_word(A + i * lda + k, Ap + k * MR + i);
}

}  // namespace

extern const MicroKernel KILN_TILE_KERNEL{kStepName, NR, kStepFused, multiply, multiply_in_place, pack_b_transposed,
                                          pack_a_rows};

}  // namespace kiln::cpu
