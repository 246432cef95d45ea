// convert_simd.h — f16/bf16 ↔ f32 conversion of a run of elements, with the CPU's vector
// instructions when it has them (chapter 09).
//
// dtype.h converts one element at a time with integer code that every compiler and nvcc
// accept. A run of them (a tensor's .to(DType), the GEMM's packing of f16/bf16 panels and its
// store of C) goes faster 8 at a time:
//   f16 → f32   F16C  vcvtph2ps  (_mm256_cvtph_ps)
//   f32 → f16   F16C  vcvtps2ph  (_mm256_cvtps_ph, round to nearest even)
//   bf16 → f32  AVX2  a 16-bit shift left: bf16 is the top half of an f32
//   f32 → bf16  AVX2  dtype.h's rounding, 8 lanes at once: u + 0x7fff + (bit 16 of u), >> 16,
//                     a NaN kept quiet instead
// Each converts 8 or 16 elements in a few instructions where the portable code takes a branchy
// integer routine per element.
// Every kernel gives dtype.h's bits for every input (tests/test_convert.cpp checks all
// 65536 f16 and bf16 patterns, and f32 inputs of every exponent, ties, subnormals, ±0, ±inf,
// NaNs and millions of random ones), so which one ran never changes a result.
//
// convert_kernel<From, To>(level) returns the best kernel at or below `level` (a level this
// CPU supports: cpu_level() or below): at avx512 and amx the same formulas 16 lanes a step.
//
// One more copy of 16-bit words lives here, beside the bf16 → f32 widening it is made of: the
// bf16 pairs of the AVX512-BF16 GEMM (gemm.cpp), two rows of bf16 interleaved into one row of
// 32-bit slots (interleave_kernel).
#pragma once
#include <cstdint>
#include <type_traits>

#include "core/cpu_features.h"
#include "core/dtype.h"

namespace kiln::cpu {

// y[i] = To(x[i]) for i < n, on the calling thread.
template <typename From, typename To>
struct ConvertKernel {
    void (*run)(const From* x, To* y, int64_t n);
    const char* name;  // "portable", "avx2-f16c" (the f16 kernels), "avx2" (the bf16 ones), "avx512"
};

// Defined for the four pairs (f16, float), (float, f16), (bf16, float), (float, bf16).
template <typename From, typename To>
ConvertKernel<From, To> convert_kernel(CpuLevel level);

// Whether convert_kernel has a vector kernel for the pair From → To.
template <typename From, typename To>
constexpr bool has_convert_kernel =
    (std::is_same_v<From, float> && (std::is_same_v<To, f16> || std::is_same_v<To, bf16>)) ||
    (std::is_same_v<To, float> && (std::is_same_v<From, f16> || std::is_same_v<From, bf16>));

// Two rows of bf16 as one row of pairs, on the calling thread:
//   slots[j] = x0[j].bits | x1[j].bits << 16   for j < n   (x1 null: the high halves 0)
// written as 32-bit words through a float*, the type of the GEMM's panels. The vdpbf16ps kernel
// multiplies such pairs; gemm.cpp packs B's rows (and a transposed A's) with this kernel.
using Interleave = void (*)(const bf16* x0, const bf16* x1, int64_t n, float* slots);
struct InterleaveKernel {
    Interleave run;
    const char* name;  // "portable" or "avx512"
};
InterleaveKernel interleave_kernel(CpuLevel level);

// Running f32 code over f16/bf16 data: g++ leaves a loop that converts element by element scalar
// (GELU in bf16 ran 7 times slower than in f32 so), so a kernel widens its inputs into floats,
// runs its f32 loop and narrows the result, each conversion by the CPU's kernel. f32_blocks.h
// does it a block at a time for the elementwise kernels; the max pool and F32Plane (f32_blocks.h)
// a plane at a time.
// widened: x[0, n) as floats in out (n of them), which it returns. narrow_into: out[i] = T(y[i]).
template <typename T>
const float* widened(const T* x, int64_t n, float* out) {
    convert_kernel<T, float>(cpu_level()).run(x, out, n);
    return out;
}

template <typename T>
void narrow_into(const float* y, int64_t n, T* out) {
    convert_kernel<float, T>(cpu_level()).run(y, out, n);
}

}  // namespace kiln::cpu
