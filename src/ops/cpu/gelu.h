// gelu.h — GELU's arithmetic on the CPU, for the GELU kernels (elementwise.cpp) and for batch
// norm with GELU fused after it (norm.cpp): one definition, so the two give the same bits.
//
//   y = x·Φ(x),  Φ(x) = (1 + erf(x/√2)) / 2;   dy/dx = Φ(x) + x·φ(x),  φ(x) = exp(−x²/2) / √(2π)
//
// Why not std::erf and std::exp: they are calls into libm, one element at a time, and they
// were most of GELU's cost (a CIFAR step spent ~15% of its time there). The functions below are
// plain arithmetic on one float, so the compiler inlines them and the loops run 16 elements per
// instruction (AVX-512). Both are accurate to better than 1e-6 absolute, far below what float
// training notices (std::erf itself is off by up to ~6e-8). Without FMA contraction (ISO C++17:
// g++'s -ffp-contract=off) a vector lane and a scalar call give the same bits.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>

namespace kiln::cpu {

// erf(x) as a rational function of x² (Eigen's fast erf, minimax on [−4, 4]):
//   erf(x) ≈ x · p(x²) / q(x²)     max |error| 3.3e-7;  for |x| ≥ 4, erf(x) = ±1 in float.
inline float erf_approx(float x) {
    x = std::min(std::max(x, -4.0f), 4.0f);  // NaN stays NaN
    const float z = x * x;
    float p = -2.72614225801306e-10f;  // Horner's rule, highest power first
    p = p * z + 2.77068142495902e-08f;
    p = p * z - 2.10102402082508e-06f;
    p = p * z - 5.69250639462346e-05f;
    p = p * z - 7.34990630326855e-04f;
    p = p * z - 2.95459980854025e-03f;
    p = p * z - 1.60960333262415e-02f;
    float q = -1.45660718464996e-05f;
    q = q * z - 2.13374055278905e-04f;
    q = q * z - 1.68282697438203e-03f;
    q = q * z - 7.37332916720468e-03f;
    q = q * z - 1.42647390514189e-02f;
    return x * p / q;
}

// exp(t) for t ≤ 0 (Cephes' expf): split t = k·ln2 + r with k an integer and |r| ≤ ln2/2, so
//   exp(t) = 2^k · exp(r),   exp(r) ≈ 1 + r + r²·(a polynomial of degree 5)   (rel. error < 1e-7)
// and 2^k is built directly in the exponent bits of a float. Below t = −87, 2^k would leave
// the normal floats; exp(−87) ≈ 1.6e-38 is 0 for any use here. A NaN t is taken as −87 too:
// int32_t(k) of a NaN k is undefined behaviour (GELU's x·φ(x) is NaN for a NaN x either way).
inline float exp_nonpositive(float t) {
    t = t > -87.0f ? t : -87.0f;
    // k = round(t / ln2): adding 1.5·2^23 pushes the fraction bits out (round to nearest)
    const float k = (t * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    const float r = (t - k * 0.693145751953125f) - k * 1.42860682030941723e-6f;  // ln2 in two parts
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const int32_t bits = (int32_t(k) + 127) << 23;  // the float 2^k: exponent field k + 127
    float two_k;
    std::memcpy(&two_k, &bits, sizeof two_k);
    return p * two_k;
}

// GELU(x) and its derivative GELU'(x) at one value.
inline float gelu(float x) {
    constexpr float kInvSqrt2 = 0.70710678118654752f;
    return 0.5f * x * (1.0f + erf_approx(x * kInvSqrt2));
}
inline float gelu_grad(float x) {
    constexpr float kInvSqrt2 = 0.70710678118654752f, kInvSqrt2Pi = 0.39894228040143268f;
    const float cdf = 0.5f * (1.0f + erf_approx(x * kInvSqrt2));
    const float pdf = kInvSqrt2Pi * exp_nonpositive(-0.5f * x * x);
    return cdf + x * pdf;
}

// The two GELU loops in f32, over one block (f32_blocks.h): y = GELU(x) and dx = dy · GELU'(x).
// y may be x.
inline void gelu_block(const float* x, float* y, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) y[i] = gelu(x[i]);
}

inline void gelu_backward_block(const float* x, const float* dy, float* dx, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * gelu_grad(x[i]);
}

}  // namespace kiln::cpu
