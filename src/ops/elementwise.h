// elementwise.h — the ops that touch each element once (chapters 01 and 02; GELU and dropout
// from chapter 03 on): fill, add, mul, axpy, scale, the activations (ReLU and ReLU6, GELU) and
// dropout. The kernels' contract, declared once for both backends (core/backend.h;
// src/ops/cpu/elementwise.cpp ↔ cuda/elementwise.cu), then the ops on tensors that check their
// arguments and dispatch to those kernels: declared here, defined at the end of this file and
// compiled once, in src/ops/ops.cpp (KILN_DEFINE_OPS). (The dtype conversions, also elementwise,
// are declared in core/convert.h, since Tensor::to runs them.)
//
// T is float, f16 or bf16 (core/dtype.h): each kernel reads elements into float, computes in
// float and rounds once when it stores a T. Scalars (alpha, value, s, cap) are float whatever T
// is. n = the element count. Every tensor an op takes or returns has one dtype (an error names
// the tensor that differs), except dropout's mask, u8.
//
// Autocast (ops/autocast.h): add runs in the class Widest (a mixed pair in the wider type);
// relu, relu_backward, gelu, gelu_backward, dropout and dropout_backward in Input (x's own type);
// fill_, mul_into, axpy_, scale_ and relu_ (in place, or on tensors the caller owns) cast nothing.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <limits>

#include "core/backend.h"
#include "core/tensor.h"
#include "ops/autocast.h"
#include "ops/check.h"

namespace kiln {

// ==== the kernels ============================================================================
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

// ReLU with an upper bound (the op relu, below): cap = +∞ for ReLU, 6 for ReLU6.
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

// ==== the ops on tensors =====================================================================
void fill_(Tensor& x, float value);
Tensor add(const Tensor& a, const Tensor& b);                // a + b, same shapes
void mul_into(const Tensor& a, const Tensor& b, Tensor& y);  // y = a ⊙ b, same shapes (y may be a)
void axpy_(Tensor& y, float alpha, const Tensor& x);         // y += alpha·x
void scale_(Tensor& x, float s);                             // x *= s

// ReLU with an optional upper bound cap (> 0): y = min(max(x, 0), cap). The default, kNoCap (+∞),
// is plain ReLU; cap = 6 is ReLU6 (PyTorch's nn.ReLU6, hardtanh(0, 6)). A NaN x gives NaN on the CPU
// and 0 on CUDA (fmaxf), as ReLU always has.
// Backward reads the output y, not x: the gradient flows where 0 < y < cap, which for a non-NaN x
// is 0 < x < cap — PyTorch's hardtanh_backward, strict at both ends (dx = 0 at x = 0 and x = 6).
// With no cap the upper test is dropped, so an infinite y lets dy through, as PyTorch's ReLU does.
inline constexpr float kNoCap = std::numeric_limits<float>::infinity();
Tensor relu(const Tensor& x, float cap = kNoCap);          // min(max(x, 0), cap)
void relu_(Tensor& x, float cap = kNoCap);                 // x := min(max(x, 0), cap), in place
Tensor relu_backward(const Tensor& y, const Tensor& dy, float cap = kNoCap);  // dy · [0 < y < cap], y = relu's output

// GELU (the kernels above have the formula).
Tensor gelu(const Tensor& x, Tensor* saved_x = nullptr);  // x · Φ(x); *saved_x: x as read, for the backward
Tensor gelu_backward(const Tensor& x, const Tensor& dy);  // dy · (Φ(x) + x · φ(x))
// Inverted dropout with drop probability p; element i's coin is the counter-based stream's
// value first + i (core/rng.h). *mask (u8, x's shape) keeps which elements were kept.
Tensor dropout(const Tensor& x, float p, uint64_t seed_hash, uint64_t first, Tensor* mask);
Tensor dropout_backward(const Tensor& dy, const Tensor& mask, float p);

}  // namespace kiln


#ifdef KILN_DEFINE_OPS  // compiled once, in src/ops/ops.cpp (see there)
namespace kiln {

namespace detail {

void check_same_shape(const Tensor& a, const Tensor& b, const char* op) {
    KILN_CHECK(a.shape() == b.shape(), op, ": shapes differ: ", a.desc(), " and ", b.desc());
}

// cap: +∞ (ReLU) or a positive bound (ReLU6's 6); 0, a negative or a NaN bound is a mistake.
void check_cap(float cap, const char* op) {
    KILN_CHECK(cap > 0.0f, op, ": the upper bound cap must be positive (kNoCap for plain ReLU), got ", cap);
}

}  // namespace detail

void fill_(Tensor& x, float value) {
    check_args("fill_", {{x, "x"}});
    dispatch(x.device(), x.dtype(), [&](auto be, auto tag) {
        using T = decltype(tag);
        kernel::fill(be, x.data<T>(), x.numel(), value);
    });
}

Tensor add(const Tensor& a_in, const Tensor& b_in) {
    const AmpCast amp(CastPolicy::Widest, a_in.dtype(), b_in.dtype());  // mixed types: the wider
    const Tensor a = amp.input(a_in), b = amp.input(b_in);
    check_args("add", {{a, "a"}, {b, "b"}});
    detail::check_same_shape(a, b, "add");
    Tensor y = Tensor::empty(a.shape(), a.dtype(), a.device(), Category::Activation);
    dispatch(a.device(), a.dtype(), [&](auto be, auto tag) {
        using T = decltype(tag);
        kernel::add(be, a.data<T>(), b.data<T>(), y.data<T>(), a.numel());
    });
    return y;
}

void mul_into(const Tensor& a, const Tensor& b, Tensor& y) {
    check_args("mul_into", {{a, "a"}, {b, "b"}, {y, "y"}});
    detail::check_same_shape(a, b, "mul_into");
    detail::check_same_shape(a, y, "mul_into");
    dispatch(a.device(), a.dtype(), [&](auto be, auto tag) {
        using T = decltype(tag);
        kernel::mul(be, a.data<T>(), b.data<T>(), y.data<T>(), a.numel());
    });
}

void axpy_(Tensor& y, float alpha, const Tensor& x) {
    check_args("axpy_", {{y, "y"}, {x, "x"}});
    detail::check_same_shape(y, x, "axpy_");
    dispatch(y.device(), y.dtype(), [&](auto be, auto tag) {
        using T = decltype(tag);
        kernel::axpy(be, alpha, x.data<T>(), y.data<T>(), x.numel());
    });
}

void scale_(Tensor& x, float s) {
    check_args("scale_", {{x, "x"}});
    dispatch(x.device(), x.dtype(), [&](auto be, auto tag) {
        using T = decltype(tag);
        kernel::scale(be, x.data<T>(), x.numel(), s);
    });
}

Tensor relu(const Tensor& x_in, float cap) {
    const Tensor x = AmpCast(CastPolicy::Input, x_in.dtype()).input(x_in);
    check_args("relu", {{x, "x"}});
    detail::check_cap(cap, "relu");
    Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device(), Category::Activation);
    dispatch(x.device(), x.dtype(), [&](auto be, auto tag) {
        using T = decltype(tag);
        kernel::relu_forward(be, x.data<T>(), y.data<T>(), x.numel(), cap);
    });
    return y;
}

// The same kernel with its output over its input: each element is read before it is written.
void relu_(Tensor& x, float cap) {
    check_args("relu_", {{x, "x"}});
    detail::check_cap(cap, "relu_");
    dispatch(x.device(), x.dtype(), [&](auto be, auto tag) {
        using T = decltype(tag);
        kernel::relu_forward(be, x.data<T>(), x.data<T>(), x.numel(), cap);
    });
}

Tensor relu_backward(const Tensor& y_in, const Tensor& dy_in, float cap) {
    const AmpCast amp(CastPolicy::Input, y_in.dtype());
    const Tensor y = amp.input(y_in), dy = amp.input(dy_in);
    check_args("relu_backward", {{y, "y"}, {dy, "dy"}});
    detail::check_same_shape(y, dy, "relu_backward");
    detail::check_cap(cap, "relu_backward");
    Tensor dx = Tensor::empty(y.shape(), y.dtype(), y.device(), Category::Activation);
    dispatch(y.device(), y.dtype(), [&](auto be, auto tag) {
        using T = decltype(tag);
        kernel::relu_backward(be, y.data<T>(), dy.data<T>(), dx.data<T>(), y.numel(), cap);
    });
    return dx;
}

Tensor gelu(const Tensor& x_in, Tensor* saved_x) {
    const Tensor x = AmpCast(CastPolicy::Input, x_in.dtype()).input(x_in);
    const Device d = check_args("gelu", {{x, "x"}});
    Tensor y = Tensor::empty(x.shape(), x.dtype(), d, Category::Activation);
    dispatch(d, x.dtype(), [&](auto be, auto tag) {
        using T = decltype(tag);
        kernel::gelu_forward(be, x.data<T>(), y.data<T>(), x.numel());
    });
    if (saved_x) *saved_x = x;
    return y;
}

Tensor gelu_backward(const Tensor& x_in, const Tensor& dy_in) {
    const AmpCast amp(CastPolicy::Input, x_in.dtype());
    const Tensor x = amp.input(x_in), dy = amp.input(dy_in);
    const Device d = check_args("gelu_backward", {{x, "x"}, {dy, "dy"}});
    check_shape(dy, x.shape(), "gelu_backward", "dy");
    Tensor dx = Tensor::empty(x.shape(), x.dtype(), d, Category::Activation);
    dispatch(d, x.dtype(), [&](auto be, auto tag) {
        using T = decltype(tag);
        kernel::gelu_backward(be, x.data<T>(), dy.data<T>(), dx.data<T>(), x.numel());
    });
    return dx;
}

Tensor dropout(const Tensor& x_in, float p, uint64_t seed_hash, uint64_t first, Tensor* mask) {
    const Tensor x = AmpCast(CastPolicy::Input, x_in.dtype()).input(x_in);
    const Device d = check_args("dropout", {{x, "x"}});
    KILN_CHECK(p >= 0.0f && p <= 1.0f, "dropout: drop probability ", p, " is outside [0, 1]");
    Tensor y = Tensor::empty(x.shape(), x.dtype(), d, Category::Activation);
    *mask = Tensor::empty(x.shape(), DType::U8, d, Category::Activation);
    dispatch(d, x.dtype(), [&](auto be, auto tag) {
        using T = decltype(tag);
        kernel::dropout_forward(be, x.data<T>(), y.data<T>(), mask->data<uint8_t>(), x.numel(), p, seed_hash, first);
    });
    return y;
}

Tensor dropout_backward(const Tensor& dy_in, const Tensor& mask, float p) {
    const char* op = "dropout_backward";
    const Tensor dy = AmpCast(CastPolicy::Input, dy_in.dtype()).input(dy_in);
    const Device d = check_args(op, {{dy, "dy"}});
    check_shape(mask, dy.shape(), op, "mask");
    check_dtype(mask, DType::U8, op, "mask");
    check_same_device(dy, mask, op);
    Tensor dx = Tensor::empty(dy.shape(), dy.dtype(), d, Category::Activation);
    dispatch(d, dy.dtype(), [&](auto be, auto tag) {
        using T = decltype(tag);
        kernel::dropout_backward(be, dy.data<T>(), mask.data<uint8_t>(), dx.data<T>(), dy.numel(), p);
    });
    return dx;
}

}  // namespace kiln
#endif  // KILN_DEFINE_OPS
