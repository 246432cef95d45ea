// pool.h — the pooling kernels (chapters 03 and 05), declared once for both backends
// (core/backend.h): src/ops/cpu/pool.cpp ↔ cuda/pool.cu. Sizes in Pool2dParams (ops/params.h).
// T is float, f16 or bf16; sums in float, each result rounded to T once; no atomics, so every
// result is the same on every run and, on the CPU, any thread count.
#pragma once
#include <cstdint>

#include "core/backend.h"
#include "ops/params.h"

namespace kiln {

// y = max over the window (padding counts as −inf; NaN wins, like PyTorch).
// argmax [N, C, P, Q] = ih·W + iw of the maximum inside its (n, c) plane (first one on ties).
KILN_KERNEL(maxpool2d_forward,
            template <typename T> void maxpool2d_forward(const T* x, T* y, int32_t* argmax, const Pool2dParams& p));
// dx = 0, then dx[n, c, argmax] += dy[n, c, p, q]  (dx [N, C, H, W] is overwritten)
KILN_KERNEL(maxpool2d_backward, template <typename T> void maxpool2d_backward(const T* dy, const int32_t* argmax,
                                                                              T* dx, const Pool2dParams& p));

// y = (Σ over the window of x) / (KH·KW)   — padding counts as 0 and is counted in the
// divisor (PyTorch's count_include_pad = true).   dx[i] = Σ over windows holding i of dy/(KH·KW)
// (dx overwritten)
KILN_KERNEL(avgpool2d_forward, template <typename T> void avgpool2d_forward(const T* x, T* y, const Pool2dParams& p));
KILN_KERNEL(avgpool2d_backward,
            template <typename T> void avgpool2d_backward(const T* dy, T* dx, const Pool2dParams& p));

// [N·C planes of S values] → [N·C]:   y = mean of the plane;   dx = dy / S on the whole plane.
KILN_KERNEL(global_avgpool_forward,
            template <typename T> void global_avgpool_forward(const T* x, T* y, int64_t NC, int64_t S));
KILN_KERNEL(global_avgpool_backward,
            template <typename T> void global_avgpool_backward(const T* dy, T* dx, int64_t NC, int64_t S));

// The templates above that both backends define, for the kernel files' explicit instantiations
// (the float types): KILN_POOL_KERNELS(KILN_INSTANTIATE_FLOAT);
#define KILN_POOL_KERNELS(X)                                                                  \
    X(maxpool2d_forward); X(maxpool2d_backward); X(avgpool2d_forward); X(avgpool2d_backward); \
    X(global_avgpool_forward); X(global_avgpool_backward)

}  // namespace kiln
