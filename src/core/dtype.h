// dtype.h — element types of a tensor, their C++ types, and the conversions between them.
//
//   f32  IEEE 754 single: 1 sign, 8 exponent, 23 mantissa bits   float   (kiln's default)
//   f16  IEEE 754 half:   1 sign, 5 exponent, 10 mantissa bits   f16     (max 65504, mixed precision)
//   bf16 "brain float":   1 sign, 8 exponent,  7 mantissa bits   bf16    (f32's range, less precision)
//   i8, i32, u8           integers (quantized weights, labels, raw pixels)
//
// f16 and bf16 are structs holding the 16 bits: storage only, no arithmetic. A kernel reads an
// element into a float, computes in float, and rounds once when it stores (llm.c's floatX):
//     y[i] = T(float(a[i]) + float(b[i]));        // T = float, f16 or bf16
// so one kernel source serves the three types, and for T = float the casts vanish.
//
// The conversions round to nearest, ties to even, and keep inf, NaN and subnormals what they
// are. They are written once, here, with integer operations only, so host code, CUDA device
// code (nvcc) and the kernel emulator (g++) all round the same way. (A GPU has instructions
// for them, __float2half_rn and friends, which round the same way; these are plain integer
// code that works everywhere and is never the bottleneck of a kernel that moves memory.)
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/error.h"

// Functions that device code calls too: __host__ __device__ for nvcc, plain functions for g++
// (the same definition as core/rng.h's).
#if defined(__CUDACC__)
#define KILN_HOST_DEVICE __host__ __device__
#else
#define KILN_HOST_DEVICE
#endif

namespace kiln {

enum class DType : uint8_t { F32, F16, BF16, I8, I32, U8 };

size_t dtype_size(DType t);       // bytes per element: 4, 2, 2, 1, 4, 1
const char* dtype_name(DType t);  // "f32", "f16", ...

// What a floating-point type holds (chapter 09's table), read off its bit patterns — sign, E
// exponent bits with bias 2^(E-1) − 1, M mantissa bits — through the conversions below:
//   max            exponent 2^E − 2, mantissa all ones:  (2 − 2^-M) · 2^bias
//   min_normal     exponent 1, mantissa 0:              2^(1 − bias)
//   min_subnormal  exponent 0, mantissa 1:              2^(1 − bias − M)
//   epsilon        the gap between 1 and the next value: 2^-M (rounding errs by half of it, u)
struct FloatFormat {
    int exponent_bits, mantissa_bits;
    double max, min_normal, min_subnormal, epsilon;
};
FloatFormat float_format(DType t);  // f32, f16 or bf16; other types throw

// ---- bits of a float -----------------------------------------------------------------------
KILN_HOST_DEVICE inline uint32_t bits_of(float x) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(x);
#else
    uint32_t u;
    std::memcpy(&u, &x, 4);
    return u;
#endif
}

KILN_HOST_DEVICE inline float float_of(uint32_t u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float x;
    std::memcpy(&x, &u, 4);
    return x;
#endif
}

// ---- f32 <-> f16 -----------------------------------------------------------------------------
// f32 = (-1)^s · 1.m · 2^(e-127); f16 = (-1)^s · 1.m · 2^(e-15), 10 mantissa bits.
//   |x| ≥ 65520            -> inf (65504 is the largest f16; halfway to 65536 rounds up)
//   2^-14 ≤ |x| < 65520    -> normal: drop 13 mantissa bits, round to nearest even
//   |x| < 2^-14            -> subnormal: m · 2^-24, rounded to nearest even (may become 0)
//   NaN stays NaN (quiet, top mantissa bit set); inf stays inf.
KILN_HOST_DEVICE inline uint16_t f32_to_f16(float x) {
    const uint32_t u = bits_of(x);
    const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
    const uint32_t abs = u & 0x7fffffffu;
    if (abs >= 0x7f800000u)                                   // inf or NaN
        return uint16_t(sign | (abs > 0x7f800000u ? 0x7e00u : 0x7c00u));
    if (abs >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // ≥ 65520: overflow to inf
    if (abs >= 0x38800000u) {                                 // normal f16 range (≥ 2^-14)
        const uint32_t mant_round = abs + 0xfffu + ((abs >> 13) & 1u);  // round to nearest even
        return uint16_t(sign | ((mant_round - 0x38000000u) >> 13));    // rebias exponent 127 -> 15
    }
    // Subnormal f16: value = abs_f32 / 2^-24 rounded to an integer (ties to even).
    const float scaled = float_of(abs) * 16777216.0f;         // × 2^24, exact (power of two)
    uint32_t whole = uint32_t(scaled);
    const float frac = scaled - float(whole);
    if (frac > 0.5f || (frac == 0.5f && (whole & 1u))) whole++;
    return uint16_t(sign | whole);                            // whole = 1024 becomes the smallest normal
}

KILN_HOST_DEVICE inline float f16_to_f32(uint16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0x1f) return float_of(sign | 0x7f800000u | (mant << 13));  // inf / NaN
    if (exp == 0) {                                                     // zero / subnormal
        const float v = float(mant) * (1.0f / 16777216.0f);             // m · 2^-24, exact
        return sign ? -v : v;
    }
    return float_of(sign | ((exp + 112u) << 23) | (mant << 13));        // rebias 15 -> 127
}

// ---- f32 <-> bf16 ----------------------------------------------------------------------------
// Keep the top 16 bits, rounding the dropped 16 to nearest even. Same exponent range as f32,
// so subnormals stay subnormal and only values near FLT_MAX round up to inf.
KILN_HOST_DEVICE inline uint16_t f32_to_bf16(float x) {
    uint32_t u = bits_of(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x0040u);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return uint16_t(u >> 16);
}

KILN_HOST_DEVICE inline float bf16_to_f32(uint16_t b) { return float_of(uint32_t(b) << 16); }

// ---- f32 -> tf32 (the tensor cores' f32 operands: cuda/tensor_tiles.cuh, the trainers' --tf32) ----
// PTX's cvt.rna.tf32.f32: keep the top 19 bits (sign, 8 exponent, 10 mantissa), rounding the
// dropped 13 to nearest, ties away from zero. In sign-magnitude bits that is: add half of the
// kept unit (0x1000), clear the 13 — a carry out of the mantissa moves into the exponent
// (1.99999988 -> 2, the largest finite values -> inf). Infinities are tf32 already; a NaN stays a
// NaN (its quiet bit set: clearing its low bits alone could leave infinity's). The result is an
// f32 whose low 13 bits are zero.
KILN_HOST_DEVICE inline float f32_to_tf32(float x) {
    const uint32_t u = bits_of(x), magnitude = u & 0x7fffffffu;
    if (magnitude > 0x7f800000u) return float_of((u & 0xffffe000u) | 0x00400000u);
    if (magnitude == 0x7f800000u) return x;
    return float_of((u + 0x1000u) & 0xffffe000u);
}

// ---- the 16-bit float types ------------------------------------------------------------------
// T(x) rounds a float to T, float(t) widens exactly. Both explicit, so that no f16 is ever
// silently computed with as a float (or a float silently rounded).
struct f16 {
    uint16_t bits;
    f16() = default;
    KILN_HOST_DEVICE explicit f16(float x) : bits(f32_to_f16(x)) {}
    KILN_HOST_DEVICE explicit operator float() const { return f16_to_f32(bits); }
};

struct bf16 {
    uint16_t bits;
    bf16() = default;
    KILN_HOST_DEVICE explicit bf16(float x) : bits(f32_to_bf16(x)) {}
    KILN_HOST_DEVICE explicit operator float() const { return bf16_to_f32(bits); }
};

// ---- each dtype's C++ type -------------------------------------------------------------------
template <typename T> struct dtype_of;
template <> struct dtype_of<float>   { static constexpr DType value = DType::F32; };
template <> struct dtype_of<f16>     { static constexpr DType value = DType::F16; };
template <> struct dtype_of<bf16>    { static constexpr DType value = DType::BF16; };
template <> struct dtype_of<int8_t>  { static constexpr DType value = DType::I8; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::I32; };
template <> struct dtype_of<uint8_t> { static constexpr DType value = DType::U8; };

template <typename T>
constexpr bool is_float_type = std::is_same_v<T, float> || std::is_same_v<T, f16> || std::is_same_v<T, bf16>;

// Calls f(T{}) with T the C++ type of dtype t (float, f16, bf16, int8_t, int32_t, uint8_t), so
// that a kernel template can be picked at run time in one place:
//     visit_dtype(x.dtype(), [&](auto tag) { using T = decltype(tag); kernel(x.data<T>(), ...); });
// FloatsOnly = true instantiates f for the float types only (kernels that exist only for them);
// an integer dtype then fails. Callers check dtypes first, with a message naming the tensor.
template <bool FloatsOnly = false, typename F>
decltype(auto) visit_dtype(DType t, F&& f) {
    switch (t) {
        case DType::F32: return f(float{});
        case DType::F16: return f(f16{});
        case DType::BF16: return f(bf16{});
        default: break;
    }
    if constexpr (!FloatsOnly) {
        switch (t) {
            case DType::I8: return f(int8_t{});
            case DType::I32: return f(int32_t{});
            case DType::U8: return f(uint8_t{});
            default: break;
        }
    }
    KILN_FAIL("visit_dtype: no kernel for dtype ", dtype_name(t));
}

// Explicit instantiation lists for the kernel files: X(T) for each float type, and X(From, To)
// for every pair of the six element types.
#define KILN_FOR_EACH_FLOAT_TYPE(X) X(float) X(::kiln::f16) X(::kiln::bf16)
#define KILN_FOR_EACH_TYPE_PAIR(X)                                                   \
    KILN_TYPE_PAIRS_FROM_(X, float) KILN_TYPE_PAIRS_FROM_(X, ::kiln::f16)             \
    KILN_TYPE_PAIRS_FROM_(X, ::kiln::bf16) KILN_TYPE_PAIRS_FROM_(X, int8_t)           \
    KILN_TYPE_PAIRS_FROM_(X, int32_t) KILN_TYPE_PAIRS_FROM_(X, uint8_t)
#define KILN_TYPE_PAIRS_FROM_(X, From)                                               \
    X(From, float) X(From, ::kiln::f16) X(From, ::kiln::bf16) X(From, int8_t) X(From, int32_t) X(From, uint8_t)

// ---- converting one element: cast<To>(x) ------------------------------------------------------
// To a float type: through f32, rounded to nearest even (f16 and bf16 widen to f32 exactly,
// so f16 -> bf16 rounds once).
// To an integer type: NaN -> 0; otherwise rounded to the nearest integer, ties to even (2.5 -> 2,
// 3.5 -> 4, -0.5 -> 0), then saturated to the type's range (300 -> 127 for i8, -inf -> 0 for u8),
// as quantization wants; never the C cast, which truncates and is undefined out of range.
template <typename T> struct int_range;
template <> struct int_range<int8_t>  { static constexpr double lo = -128.0, hi = 127.0; };
template <> struct int_range<uint8_t> { static constexpr double lo = 0.0, hi = 255.0; };
template <> struct int_range<int32_t> { static constexpr double lo = -2147483648.0, hi = 2147483647.0; };

// x rounded to the nearest integer, ties to even (rint in the default rounding mode).
KILN_HOST_DEVICE inline double round_half_even(double x) {
#if defined(__CUDA_ARCH__)
    return rint(x);
#else
    return std::rint(x);
#endif
}

template <typename To, typename From>
KILN_HOST_DEVICE To cast(From x) {
    if constexpr (is_float_type<To>) {
        return To(float(x));
    } else {
        double v;
        if constexpr (std::is_arithmetic_v<From>) v = double(x);
        else v = double(float(x));  // f16, bf16
        if (v != v) return To(0);   // NaN
        if (v <= int_range<To>::lo) return To(int_range<To>::lo);
        if (v >= int_range<To>::hi) return To(int_range<To>::hi);
        return To(round_half_even(v));
    }
}

}  // namespace kiln
