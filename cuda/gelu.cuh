// gelu.cuh — GELU's arithmetic on the device, for the GELU kernels (elementwise.cu) and for batch
// norm with GELU fused after it (norm.cu): one definition, so the two give the same bits.
//
//   GELU(x) = x·Φ(x),  Φ(x) = (1 + erf(x/√2)) / 2
//   GELU'(x) = Φ(x) + x·φ(x),  φ(x) = exp(−x²/2) / √(2π)
#pragma once
#include <cmath>

namespace kiln::cuda {

__device__ inline float gelu(float x) {
    constexpr float kInvSqrt2 = 0.70710678118654752f;
    return 0.5f * x * (1.0f + erff(x * kInvSqrt2));
}

__device__ inline float gelu_grad(float x) {
    constexpr float kInvSqrt2 = 0.70710678118654752f, kInvSqrt2Pi = 0.39894228040143268f;
    const float cdf = 0.5f * (1.0f + erff(x * kInvSqrt2));
    const float pdf = kInvSqrt2Pi * expf(-0.5f * x * x);
    return cdf + x * pdf;
}

}  // namespace kiln::cuda
