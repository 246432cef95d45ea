// elementwise.h — the kernels that touch each element once: fill, add, mul, axpy, scale, the
// activations (ReLU and ReLU6, GELU) and dropout, declared once for both backends (core/backend.h):
// src/ops/cpu/elementwise.cpp ↔ cuda/elementwise.cu. (The dtype conversions, also elementwise,
// are declared in core/convert.h, since Tensor::to runs them.)
//
// T is float, f16 or bf16 (core/dtype.h): each kernel reads elements into float, computes in
// float and rounds once when it stores a T. Scalars (alpha, value, s, cap) are float whatever T
// is. n = the element count.
#pragma once
#include <cstdint>

#include "core/backend.h"

namespace kiln {

// x[i] = value
KILN_KERNEL(fill, template <typename T> void fill(T* x, int64_t n, float value));
// y = a + b
KILN_KERNEL(add, template <typename T> void add(const T* a, const T* b, T* y, int64_t n));
// y = a ⊙ b (y may be a)
KILN_KERNEL(mul, template <typename T> void mul(const T* a, const T* b, T* y, int64_t n));
// y += alpha·x
KILN_KERNEL(axpy, template <typename T> void axpy(float alpha, const T* x, T* y, int64_t n));
// x *= s
KILN_KERNEL(scale, template <typename T> void scale(T* x, int64_t n, float s));

// ReLU with an upper bound (ops.h relu): cap = +∞ for ReLU, 6 for ReLU6.
//   y = min(max(x, 0), cap)          dx = dy · [0 < y < cap]
KILN_KERNEL(relu_forward, template <typename T> void relu_forward(const T* x, T* y, int64_t n, float cap));
KILN_KERNEL(relu_backward,
            template <typename T> void relu_backward(const T* y, const T* dy, T* dx, int64_t n, float cap));

// GELU, exact (erf) form, PyTorch's default:
//   y = x · Φ(x) = x/2 · (1 + erf(x / √2))        dy/dx = Φ(x) + x · φ(x),  φ(x) = e^(−x²/2) / √(2π)
KILN_KERNEL(gelu_forward, template <typename T> void gelu_forward(const T* x, T* y, int64_t n));
KILN_KERNEL(gelu_backward, template <typename T> void gelu_backward(const T* x, const T* dy, T* dx, int64_t n));

// Inverted dropout. Element i is kept when its uniform number u_i ≥ drop_p, where
//   u_i = Rng::to_unit(splitmix64(seed_hash ^ splitmix64(first + i)))   (= Rng::at(first + i))
// so the mask is a pure function of (seed, counter, i): any thread count, any device, same mask.
//   mask[i] = kept ? 1 : 0        y = x · mask / (1 − drop_p)       (y = 0 when drop_p = 1)
//   dx = dy · mask / (1 − drop_p)
KILN_KERNEL(dropout_forward, template <typename T> void dropout_forward(const T* x, T* y, uint8_t* mask, int64_t n,
                                                                        float drop_p, uint64_t seed_hash,
                                                                        uint64_t first));
KILN_KERNEL(dropout_backward,
            template <typename T> void dropout_backward(const T* dy, const uint8_t* mask, T* dx, int64_t n,
                                                        float drop_p));

// The templates above that both backends define, for the kernel files' explicit instantiations
// (the float types): KILN_ELEMENTWISE_KERNELS(KILN_INSTANTIATE_FLOAT);
#define KILN_ELEMENTWISE_KERNELS(X)                                                                 \
    X(fill); X(add); X(mul); X(axpy); X(scale); X(relu_forward); X(relu_backward); X(gelu_forward); \
    X(gelu_backward); X(dropout_forward); X(dropout_backward)

}  // namespace kiln
