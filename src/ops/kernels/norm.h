// norm.h — batch normalization (chapter 06) and layer normalization, declared once for both
// backends (core/backend.h): src/ops/cpu/norm.cpp ↔ cuda/norm.cu.
//
// T, the type of x, y, dy and dx, is float, f16 or bf16; gamma, beta, the statistics and their
// gradients stay float (cuDNN's rule for half inputs). Sums are taken in double, each result
// rounded to T once. Every kernel gives the same bits on every run and, on the CPU, any thread
// count: a channel's (or row's) sums belong to one thread or block, added in a fixed order.
#pragma once
#include <cstdint>

#include "core/backend.h"
#include "ops/params.h"

namespace kiln {

// ==== batch normalization (BatchNormParams: ops/params.h) ===================================
// Training: batch statistics, two passes (mean, then Σ(x − mean)², in double):
//   mean = Σ x / M      var = Σ (x − mean)² / M      invstd = 1 / sqrt(var + eps)
//   y = gamma · (x − mean) · invstd + beta
//   running_mean = (1 − momentum) · running_mean + momentum · mean
//   running_var  = (1 − momentum) · running_var  + momentum · var · M / (M − 1)  (unbiased)
// save_mean, save_invstd [C] keep mean and invstd for the backward pass. M must be > 1.
// With p.gelu (GELU fused after it) every kernel here writes z = GELU(y) in place of y, and the
// backward takes dz: it recomputes y = gamma · x̂ + beta (rounded to T, as the stored y of the
// two separate layers was) and uses dy = dz · GELU'(y). The bits are those of batch norm then
// GELU run one after the other (the GELU of the same backend's elementwise kernels).
KILN_KERNEL(batchnorm_forward_train,
            template <typename T> void batchnorm_forward_train(const T* x, const float* gamma, const float* beta,
                                                               T* y, float* running_mean, float* running_var,
                                                               float* save_mean, float* save_invstd,
                                                               const BatchNormParams& p));
// Evaluation: y = gamma · (x − running_mean) / sqrt(running_var + eps) + beta
KILN_KERNEL(batchnorm_forward_eval,
            template <typename T> void batchnorm_forward_eval(const T* x, const float* gamma, const float* beta,
                                                              const float* running_mean, const float* running_var,
                                                              T* y, const BatchNormParams& p));
// With x̂ = (x − mean) · invstd recomputed from x and the saved statistics:
//   dbeta  += Σ dy        dgamma += Σ dy · x̂
//   dx = gamma · invstd / M · (M · dy − Σ dy − x̂ · Σ dy · x̂)
// dx is overwritten; dgamma and dbeta accumulate. beta is read only with p.gelu (may be null
// otherwise), and then dy is dz, the gradient of GELU's output.
KILN_KERNEL(batchnorm_backward,
            template <typename T> void batchnorm_backward(const T* dy, const T* x, const float* gamma,
                                                          const float* beta, const float* save_mean,
                                                          const float* save_invstd, T* dx, float* dgamma,
                                                          float* dbeta, const BatchNormParams& p));

// ==== layer normalization ===================================================================
// x [R, D]: R rows (every dimension but the last, flattened) of D values, each row normalized
// over its own D values (nn/norm.h has the derivation):
//   mean = Σ x / D      var = Σ (x − mean)² / D   (biased; two passes, in double)
//   invstd = 1 / sqrt(var + eps)      x̂ = (x − mean) · invstd      y = gamma · x̂ + beta
// gamma, beta [D]; save_mean, save_invstd [R] keep mean and invstd for the backward pass.
KILN_KERNEL(layernorm_forward,
            template <typename T> void layernorm_forward(const T* x, const float* gamma, const float* beta, T* y,
                                                         float* save_mean, float* save_invstd, int64_t R, int64_t D,
                                                         float eps));
// With x̂ recomputed from x and the saved statistics, and g = gamma · dy:
//   dx = invstd · (g − Σ_d g / D − x̂ · Σ_d g·x̂ / D)                (per row; overwritten)
//   dgamma += Σ_rows dy · x̂        dbeta += Σ_rows dy              (per column; accumulate)
KILN_KERNEL(layernorm_backward,
            template <typename T> void layernorm_backward(const T* dy, const T* x, const float* gamma,
                                                          const float* save_mean, const float* save_invstd, T* dx,
                                                          float* dgamma, float* dbeta, int64_t R, int64_t D));

// The templates above that both backends define, for the kernel files' explicit instantiations
// (the float types): KILN_NORM_KERNELS(KILN_INSTANTIATE_FLOAT);
#define KILN_NORM_KERNELS(X)                                                      \
    X(batchnorm_forward_train); X(batchnorm_forward_eval); X(batchnorm_backward); \
    X(layernorm_forward); X(layernorm_backward)

}  // namespace kiln
