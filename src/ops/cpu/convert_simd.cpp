// convert_simd.cpp — the f16/bf16 ↔ f32 run kernels: portable, AVX2 + F16C, and AVX-512; and
// the bf16 pair interleave of the AVX512-BF16 GEMM (see convert_simd.h).
//
// The vector kernels are compiled for their instruction set one function at a time
// (KILN_TARGET_AVX2, KILN_TARGET_AVX512), so the library still builds for any x86-64 (make SAN=1
// has no -march) and never runs them on a CPU that lacks it: convert_kernel hands them out only
// for a level the CPU supports.
#include "ops/cpu/convert_simd.h"

#include <cstring>

#include "core/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KILN_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define KILN_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx2,fma,f16c")))
#endif

namespace kiln::cpu {
namespace {

// ---- portable: dtype.h's conversion, one element at a time ---------------------------------
template <typename From, typename To>
void convert_portable(const From* x, To* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = To(float(x[i]));
}

#if defined(KILN_TARGET_AVX2)
// ---- AVX2 + F16C: 8 elements per step -----------------------------------------------------------
// Each block kernel converts in[0..8) to out[0..8).

// f16 → f32. vcvtph2ps gives the exact value of every finite f16 (subnormals included) and
// keeps ±inf; a NaN it returns quiet (mantissa bit 22 set), while dtype.h keeps a signalling
// NaN's bits as they are, so the lanes whose exponent is all ones (inf, NaN) take dtype.h's
// formula instead:  sign << 16 | 0x7f800000 | mantissa << 13.
KILN_TARGET_AVX2 inline void f16_to_f32_x8(const f16* in, float* out) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in));
    const __m256 hw = _mm256_cvtph_ps(h);
    const __m256i u = _mm256_cvtepu16_epi32(h);  // 8 lanes of 32 bits, the f16 in the low 16
    const __m256i exp_mask = _mm256_set1_epi32(0x7c00);
    const __m256i special = _mm256_cmpeq_epi32(_mm256_and_si256(u, exp_mask), exp_mask);
    const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x8000)), 16);
    const __m256i mant = _mm256_slli_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x3ff)), 13);
    const __m256i kept = _mm256_or_si256(_mm256_or_si256(sign, mant), _mm256_set1_epi32(0x7f800000));
    _mm256_storeu_ps(out, _mm256_blendv_ps(hw, _mm256_castsi256_ps(kept), _mm256_castsi256_ps(special)));
}

// f32 → f16. vcvtps2ph rounds to nearest even (overflow to ±inf at 65520, subnormal results
// exact to 2^-24) as dtype.h does; a NaN it truncates, keeping payload bits, while dtype.h
// returns the one quiet NaN sign | 0x7e00. So NaN lanes become sign | 0x7fc00000 first, the
// f32 quiet NaN whose conversion is sign | 0x7e00.
KILN_TARGET_AVX2 inline void f32_to_f16_x8(const float* in, f16* out) {
    __m256 v = _mm256_loadu_ps(in);
    const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    const __m256 sign = _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(int32_t(0x80000000u))));
    const __m256 quiet = _mm256_or_ps(sign, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)));
    v = _mm256_blendv_ps(v, quiet, nan);
    const __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), h);
}

// bf16 → f32: the 16 bits become the top half of the f32, exactly.
KILN_TARGET_AVX2 inline void bf16_to_f32_x8(const bf16* in, float* out) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in));
    const __m256i u = _mm256_slli_epi32(_mm256_cvtepu16_epi32(b), 16);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), u);
}

// f32 → bf16, dtype.h's f32_to_bf16 in 8 lanes:
//   NaN (|u| > 0x7f800000):  u >> 16 | 0x0040              (kept quiet)
//   otherwise:               (u + 0x7fff + (u >> 16 & 1)) >> 16   (round to nearest even)
KILN_TARGET_AVX2 inline void f32_to_bf16_x8(const float* in, bf16* out) {
    const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in));
    const __m256i abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    const __m256i nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));  // both ≥ 0 as int32
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd)), 16);
    const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x0040));
    const __m256i r = _mm256_blendv_epi8(rounded, quiet, nan);  // 8 × 32 bits, each < 2^16
    // Pack to 16 bits: packus works within each 128-bit half ([r0-3 r0-3 | r4-7 r4-7]), so
    // gather quarters 0 and 2 into the low half.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(packed));
}

// A run of n: whole blocks of 8, then the last n % 8 through a zero-padded block.
template <typename From, typename To, void (*Block)(const From*, To*)>
KILN_TARGET_AVX2 void convert_by_8(const From* x, To* y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) Block(x + i, y + i);
    if (i == n) return;
    From in[8] = {};
    To out[8];
    std::memcpy(in, x + i, static_cast<size_t>(n - i) * sizeof(From));
    Block(in, out);
    std::memcpy(y + i, out, static_cast<size_t>(n - i) * sizeof(To));
}

template <typename From, typename To> struct Avx2;
template <> struct Avx2<f16, float> { static constexpr auto run = convert_by_8<f16, float, f16_to_f32_x8>; };
template <> struct Avx2<float, f16> { static constexpr auto run = convert_by_8<float, f16, f32_to_f16_x8>; };
template <> struct Avx2<bf16, float> { static constexpr auto run = convert_by_8<bf16, float, bf16_to_f32_x8>; };
template <> struct Avx2<float, bf16> { static constexpr auto run = convert_by_8<float, bf16, f32_to_bf16_x8>; };

// ---- AVX-512: 16 elements per step ----------------------------------------------------------------
// The AVX2 kernels' formulas in 16 lanes, with mask registers for their blends: 1.7× the AVX2
// kernels' rate on runs in L1 or L2, 1.15× on runs from memory (f16 → f32 on a Zen 5 core).
// The zero-masked forms of the intrinsics, every lane kept (`all`): the plain ones start from an
// undefined vector, which GCC 12 reports as "may be used uninitialized".
constexpr __mmask16 all = 0xffff;
KILN_TARGET_AVX512 inline __m512i set1(uint32_t x) { return _mm512_set1_epi32(int32_t(x)); }
KILN_TARGET_AVX512 inline __m512i widen_16(const void* in) {  // 16 × 16 bits, zero-extended
    return _mm512_maskz_cvtepu16_epi32(all, _mm256_loadu_si256(static_cast<const __m256i*>(in)));
}

// f16 → f32, as f16_to_f32_x8.
KILN_TARGET_AVX512 inline void f16_to_f32_x16(const f16* in, float* out) {
    const __m512 hw = _mm512_maskz_cvtph_ps(all, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in)));
    const __m512i u = widen_16(in);
    const __mmask16 special = _mm512_cmpeq_epi32_mask(_mm512_and_si512(u, set1(0x7c00)), set1(0x7c00));
    const __m512i sign = _mm512_maskz_slli_epi32(all, _mm512_and_si512(u, set1(0x8000)), 16);
    const __m512i mant = _mm512_maskz_slli_epi32(all, _mm512_and_si512(u, set1(0x3ff)), 13);
    const __m512i kept = _mm512_or_si512(_mm512_or_si512(sign, mant), set1(0x7f800000));
    _mm512_storeu_ps(out, _mm512_mask_blend_ps(special, hw, _mm512_castsi512_ps(kept)));
}

// f32 → f16, as f32_to_f16_x8.
KILN_TARGET_AVX512 inline void f32_to_f16_x16(const float* in, f16* out) {
    const __m512 v = _mm512_loadu_ps(in);
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    const __m512i quiet = _mm512_or_si512(_mm512_and_si512(_mm512_castps_si512(v), set1(0x80000000u)), set1(0x7fc00000));
    const __m512 w = _mm512_mask_blend_ps(nan, v, _mm512_castsi512_ps(quiet));
    const __m256i h = _mm512_maskz_cvtps_ph(all, w, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), h);
}

// bf16 → f32, as bf16_to_f32_x8: each bf16 in the high half of its lane.
KILN_TARGET_AVX512 inline __m512i bf16_high_x16(const bf16* in) { return _mm512_maskz_slli_epi32(all, widen_16(in), 16); }
KILN_TARGET_AVX512 inline void bf16_to_f32_x16(const bf16* in, float* out) { _mm512_storeu_si512(out, bf16_high_x16(in)); }

// f32 → bf16, as f32_to_bf16_x8; vpmovdw packs the 16 results (each < 2^16) to 16 bits.
KILN_TARGET_AVX512 inline void f32_to_bf16_x16(const float* in, bf16* out) {
    const __m512i u = _mm512_loadu_si512(in);
    const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, set1(0x7fffffff)), set1(0x7f800000));
    const __m512i high = _mm512_maskz_srli_epi32(all, u, 16);
    const __m512i odd = _mm512_and_si512(high, set1(1));
    const __m512i rounded = _mm512_maskz_srli_epi32(all, _mm512_add_epi32(u, _mm512_add_epi32(set1(0x7fff), odd)), 16);
    const __m512i r = _mm512_mask_blend_epi32(nan, rounded, _mm512_or_si512(high, set1(0x0040)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm512_maskz_cvtepi32_epi16(all, r));
}

// A run of n: whole blocks of 16, then the rest (fewer than 16) by the AVX2 kernel.
template <typename From, typename To, void (*Block)(const From*, To*)>
KILN_TARGET_AVX512 void convert_by_16(const From* x, To* y, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) Block(x + i, y + i);
    Avx2<From, To>::run(x + i, y + i, n - i);
}

template <typename From, typename To> struct Avx512;
template <> struct Avx512<f16, float> { static constexpr auto run = convert_by_16<f16, float, f16_to_f32_x16>; };
template <> struct Avx512<float, f16> { static constexpr auto run = convert_by_16<float, f16, f32_to_f16_x16>; };
template <> struct Avx512<bf16, float> { static constexpr auto run = convert_by_16<bf16, float, bf16_to_f32_x16>; };
template <> struct Avx512<float, bf16> { static constexpr auto run = convert_by_16<float, bf16, f32_to_bf16_x16>; };
#endif

// ---- bf16 pairs: slots[j] = x0[j] | x1[j] << 16 -----------------------------------------------
void interleave_portable(const bf16* x0, const bf16* x1, int64_t n, float* slots) {
    for (int64_t j = 0; j < n; ++j) {
        const uint32_t v = x0[j].bits | (x1 ? uint32_t(x1[j].bits) << 16 : 0u);
        std::memcpy(slots + j, &v, sizeof v);
    }
}

#if defined(KILN_TARGET_AVX512)
// 16 slots a vector: x0's bf16 zero-extended to 32 bits, x1's in the high halves (bf16 → f32's
// widening); the rest (fewer than 16) one at a time. (A slot at a time, this copy took 4% of a
// bf16 training step of the CIFAR net on a Zen 5.)
KILN_TARGET_AVX512 void interleave_avx512(const bf16* x0, const bf16* x1, int64_t n, float* slots) {
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        const __m512i high = x1 ? bf16_high_x16(x1 + j) : _mm512_setzero_si512();
        _mm512_storeu_si512(slots + j, _mm512_or_si512(widen_16(x0 + j), high));
    }
    interleave_portable(x0 + j, x1 ? x1 + j : nullptr, n - j, slots + j);
}
#endif

// A kernel is asked for at a level this CPU supports (its instructions would fault otherwise).
void check_level(const char* who, CpuLevel level) {
    KILN_CHECK(level <= detected_cpu_level(), who, ": level ", cpu_level_name(level),
               " is above what this CPU supports (", cpu_level_name(detected_cpu_level()),
               "); pass cpu_level()");
}

}  // namespace

template <typename From, typename To>
ConvertKernel<From, To> convert_kernel(CpuLevel level) {
    static_assert(has_convert_kernel<From, To>, "convert_kernel: f16/bf16 <-> f32 only");
    check_level("convert_kernel", level);
    switch (level) {
        case CpuLevel::Amx:  // AMX is for products; for conversions it is an avx512 CPU
        case CpuLevel::Avx512:
#if defined(KILN_TARGET_AVX512)
            return {Avx512<From, To>::run, "avx512"};
#endif
        case CpuLevel::Avx2:
#if defined(KILN_TARGET_AVX2)
            return {Avx2<From, To>::run, std::is_same_v<From, f16> || std::is_same_v<To, f16> ? "avx2-f16c" : "avx2"};
#endif
        case CpuLevel::Portable: break;
    }
    return {convert_portable<From, To>, "portable"};
}

InterleaveKernel interleave_kernel(CpuLevel level) {
    check_level("interleave_kernel", level);
#if defined(KILN_TARGET_AVX512)
    if (level >= CpuLevel::Avx512) return {interleave_avx512, "avx512"};
#endif
    return {interleave_portable, "portable"};
}

template ConvertKernel<f16, float> convert_kernel<f16, float>(CpuLevel);
template ConvertKernel<float, f16> convert_kernel<float, f16>(CpuLevel);
template ConvertKernel<bf16, float> convert_kernel<bf16, float>(CpuLevel);
template ConvertKernel<float, bf16> convert_kernel<float, bf16>(CpuLevel);

}  // namespace kiln::cpu
