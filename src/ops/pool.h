// pool.h — pooling (chapters 03 and 05): the kernels' contract, declared once for both backends
// (core/backend.h; src/ops/cpu/pool.cpp ↔ cuda/pool.cu), then the ops on tensors that check
// their arguments and dispatch to those kernels: declared here, defined at the end of this file
// and compiled once, in src/ops/ops.cpp (KILN_DEFINE_OPS). The layers (nn/pool.h) call the ops.
//
// T is float, f16 or bf16; sums in float, each result rounded to T once; no atomics, so every
// result is the same on every run and, on the CPU, any thread count. Sizes in Pool2dParams
// (ops/params.h).
//
// Each op casts its inputs to its autocast class's type (ops/autocast.h: Input), checks its
// arguments once (the error names the op and the tensor), takes its outputs from the current
// allocator (Category::Activation) and runs the kernel of the tensors' device.
#pragma once
#include <cstdint>

#include "core/backend.h"
#include "core/tensor.h"
#include "ops/autocast.h"
#include "ops/check.h"
#include "ops/params.h"

namespace kiln {

// ==== the kernels ============================================================================
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


// ==== the ops on tensors (autocast class Input) =============================================
// Square K×K windows; x [N, C, H, W] → [N, C, P, Q].
struct Pool2dArgs {
    int64_t kernel = 1, stride = 1, padding = 0;
};

// [N, C, P, Q] for an input [N, C, H, W] (checks that a window fits).
Shape pool2d_output_shape(const Shape& x_shape, const Pool2dArgs& a);

// y = max over each window; *argmax (i32 [N, C, P, Q]) gets where each maximum came from.
Tensor maxpool2d(const Tensor& x, const Pool2dArgs& a, Tensor* argmax);

// dx [N, C, H, W] (x_shape): dy scattered to the argmax positions.
Tensor maxpool2d_backward(const Tensor& dy, const Tensor& argmax, const Shape& x_shape, const Pool2dArgs& a);

// y = mean over each window (padding counts as 0 and is counted).
Tensor avgpool2d(const Tensor& x, const Pool2dArgs& a);

Tensor avgpool2d_backward(const Tensor& dy, const Shape& x_shape, const Pool2dArgs& a);

// [N, C, H, W] → [N, C]: the mean of each plane; backward spreads dy / (H·W) over it.
Tensor global_avgpool(const Tensor& x);

Tensor global_avgpool_backward(const Tensor& dy, const Shape& x_shape);

}  // namespace kiln


#ifdef KILN_DEFINE_OPS  // compiled once, in src/ops/ops.cpp (see there)
namespace kiln {

namespace detail {

// The kernel's sizes for an input shape [N, C, H, W], checked: a window must fit the input.
Pool2dParams pool_params(const Shape& s, const Pool2dArgs& a, const char* op) {
    KILN_CHECK(s.ndim == 4, op, ": 'x' should be [N, C, H, W] but is ", s.str());
    KILN_CHECK(a.kernel > 0 && a.stride > 0 && a.padding >= 0, op, ": kernel ", a.kernel, " and stride ", a.stride,
               " must be ≥ 1, padding ", a.padding, " ≥ 0");
    Pool2dParams p;
    p.N = s[0], p.C = s[1], p.H = s[2], p.W = s[3];
    p.KH = p.KW = a.kernel, p.stride = a.stride, p.padding = a.padding;
    KILN_CHECK(p.H + 2 * a.padding >= a.kernel && p.W + 2 * a.padding >= a.kernel, op, ": a ", a.kernel, "x",
               a.kernel, " window does not fit the input ", s.str(), " with padding ", a.padding);
    return p;
}

Shape pooled_shape(const Pool2dParams& p) { return Shape{p.N, p.C, p.P(), p.Q()}; }

}  // namespace detail

Shape pool2d_output_shape(const Shape& x_shape, const Pool2dArgs& a) {
    return detail::pooled_shape(detail::pool_params(x_shape, a, "pool2d_output_shape"));
}

Tensor maxpool2d(const Tensor& x_in, const Pool2dArgs& a, Tensor* argmax) {
    const Tensor x = AmpCast(CastPolicy::Input, x_in.dtype()).input(x_in);
    const Device d = check_args("maxpool2d", {{x, "x"}});
    const Pool2dParams p = detail::pool_params(x.shape(), a, "maxpool2d");
    Tensor y = Tensor::empty(detail::pooled_shape(p), x.dtype(), d, Category::Activation);
    *argmax = Tensor::empty(y.shape(), DType::I32, d, Category::Activation);
    dispatch(d, x.dtype(), [&](auto be, auto tag) {
        using T = decltype(tag);
        kernel::maxpool2d_forward(be, x.data<T>(), y.data<T>(), argmax->data<int32_t>(), p);
    });
    return y;
}

Tensor maxpool2d_backward(const Tensor& dy_in, const Tensor& argmax, const Shape& x_shape, const Pool2dArgs& a) {
    const char* op = "maxpool2d_backward";
    const Tensor dy = AmpCast(CastPolicy::Input, dy_in.dtype()).input(dy_in);
    const Device d = check_args(op, {{dy, "dy"}});
    const Pool2dParams p = detail::pool_params(x_shape, a, op);
    check_shape(dy, detail::pooled_shape(p), op, "dy");
    check_shape(argmax, detail::pooled_shape(p), op, "argmax");
    check_dtype(argmax, DType::I32, op, "argmax");
    check_same_device(dy, argmax, op);
    Tensor dx = Tensor::empty(x_shape, dy.dtype(), d, Category::Activation);
    dispatch(d, dy.dtype(), [&](auto be, auto tag) {
        using T = decltype(tag);
        kernel::maxpool2d_backward(be, dy.data<T>(), argmax.data<int32_t>(), dx.data<T>(), p);
    });
    return dx;
}

Tensor avgpool2d(const Tensor& x_in, const Pool2dArgs& a) {
    const Tensor x = AmpCast(CastPolicy::Input, x_in.dtype()).input(x_in);
    const Device d = check_args("avgpool2d", {{x, "x"}});
    const Pool2dParams p = detail::pool_params(x.shape(), a, "avgpool2d");
    Tensor y = Tensor::empty(detail::pooled_shape(p), x.dtype(), d, Category::Activation);
    dispatch(d, x.dtype(), [&](auto be, auto tag) {
        using T = decltype(tag);
        kernel::avgpool2d_forward(be, x.data<T>(), y.data<T>(), p);
    });
    return y;
}

Tensor avgpool2d_backward(const Tensor& dy_in, const Shape& x_shape, const Pool2dArgs& a) {
    const char* op = "avgpool2d_backward";
    const Tensor dy = AmpCast(CastPolicy::Input, dy_in.dtype()).input(dy_in);
    const Device d = check_args(op, {{dy, "dy"}});
    const Pool2dParams p = detail::pool_params(x_shape, a, op);
    check_shape(dy, detail::pooled_shape(p), op, "dy");
    Tensor dx = Tensor::empty(x_shape, dy.dtype(), d, Category::Activation);
    dispatch(d, dy.dtype(), [&](auto be, auto tag) {
        using T = decltype(tag);
        kernel::avgpool2d_backward(be, dy.data<T>(), dx.data<T>(), p);
    });
    return dx;
}

Tensor global_avgpool(const Tensor& x_in) {
    const Tensor x = AmpCast(CastPolicy::Input, x_in.dtype()).input(x_in);
    const Device d = check_args("global_avgpool", {{x, "x"}});
    KILN_CHECK(x.ndim() == 4 && x.size(2) * x.size(3) > 0,
               "global_avgpool: 'x' should be [N, C, H, W] with H·W > 0 but is ", x.desc());
    const int64_t NC = x.size(0) * x.size(1), S = x.size(2) * x.size(3);
    Tensor y = Tensor::empty({x.size(0), x.size(1)}, x.dtype(), d, Category::Activation);
    dispatch(d, x.dtype(), [&](auto be, auto tag) {
        using T = decltype(tag);
        kernel::global_avgpool_forward(be, x.data<T>(), y.data<T>(), NC, S);
    });
    return y;
}

Tensor global_avgpool_backward(const Tensor& dy_in, const Shape& x_shape) {
    const char* op = "global_avgpool_backward";
    const Tensor dy = AmpCast(CastPolicy::Input, dy_in.dtype()).input(dy_in);
    const Device d = check_args(op, {{dy, "dy"}});
    KILN_CHECK(x_shape.ndim == 4 && x_shape[2] * x_shape[3] > 0, op,
               ": the input shape should be [N, C, H, W] with H·W > 0 but is ", x_shape.str());
    check_shape(dy, Shape{x_shape[0], x_shape[1]}, op, "dy");
    const int64_t NC = x_shape[0] * x_shape[1], S = x_shape[2] * x_shape[3];
    Tensor dx = Tensor::empty(x_shape, dy.dtype(), d, Category::Activation);
    dispatch(d, dy.dtype(), [&](auto be, auto tag) {
        using T = decltype(tag);
        kernel::global_avgpool_backward(be, dy.data<T>(), dx.data<T>(), NC, S);
    });
    return dx;
}

}  // namespace kiln
#endif  // KILN_DEFINE_OPS
