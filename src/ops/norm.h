// norm.h — batch normalization (chapter 06) and layer normalization: the kernels' contract,
// declared once for both backends (core/backend.h; src/ops/cpu/norm.cpp ↔ cuda/norm.cu), then
// the ops on tensors that check their arguments and dispatch to those kernels. The layers
// (nn/norm.h) call the ops.
//
// T, the type of x, y, dy and dx, is float, f16 or bf16; gamma, beta, the statistics and their
// gradients stay float (cuDNN's rule for half inputs; the ops check it: check_f32_args). Sums are
// taken in double, each result rounded to T once. Every kernel gives the same bits on every run
// and, on the CPU, any thread count: a channel's (or row's) sums belong to one thread or block,
// added in a fixed order.
//
// Each op casts its inputs to its autocast class's type (ops/autocast.h: batch norm Input, layer
// norm F32), checks its arguments once (the error names the op and the tensor), takes its outputs
// from the current allocator (Category::Activation) and runs the kernel of the tensors' device.
#pragma once
#include <cstdint>
#include <initializer_list>

#include "core/backend.h"
#include "core/tensor.h"
#include "ops/autocast.h"
#include "ops/check.h"
#include "ops/params.h"

namespace kiln {


// ==== the kernels: batch normalization (BatchNormParams: ops/params.h) =====================
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

// ==== the kernels: max pooling 2×2 fused in front of batch norm (MaxPool2x2: ops/params.h) ====
// The batch norm above with, as its input, the 2×2 max-pool (stride 2) of x [N, C, H, W], each
// window's max taken as the statistics' first pass reads it; p describes the pooled tensor
// [N, C, P, Q] (S = P·Q):
//   pooled[n, c, p, q] = max over dh, dw ∈ {0, 1} of x[n, c, 2p + dh, 2q + dw]
//                        (the first on ties, a NaN wins: max pooling's rule, ops/pool.h)
//   window[n, c, p, q] = 2·dh + dw of that max (u8)
//   y = batchnorm_forward_train's y (with p.gelu, z) of pooled, its statistics, running statistics
// pooled (the batch norm's input) and window are what the backward needs. The bits are those of
// maxpool2d_forward then batchnorm_forward_train.
KILN_KERNEL(maxpool2x2_batchnorm_forward_train,
            template <typename T> void maxpool2x2_batchnorm_forward_train(
                const T* x, const float* gamma, const float* beta, T* pooled, uint8_t* window, T* y,
                float* running_mean, float* running_var, float* save_mean, float* save_invstd,
                const BatchNormParams& p, const MaxPool2x2& pool));
// Evaluation: batchnorm_forward_eval of the pool of x (nothing kept).
KILN_KERNEL(maxpool2x2_batchnorm_forward_eval,
            template <typename T> void maxpool2x2_batchnorm_forward_eval(
                const T* x, const float* gamma, const float* beta, const float* running_mean,
                const float* running_var, T* y, const BatchNormParams& p, const MaxPool2x2& pool));
// dx [N, C, H, W] (overwritten): g, batchnorm_backward's dx for pooled (with p.gelu dy is dz), goes
// to each window's winner as max pooling's backward adds it into a zeroed plane (0 + g: a −0
// becomes +0), and every other place of x gets 0 — each window's three others and an odd H's
// last row, an odd W's last column. No pooled-sized gradient, no zero-fill pass of its own.
KILN_KERNEL(maxpool2x2_batchnorm_backward,
            template <typename T> void maxpool2x2_batchnorm_backward(
                const T* dy, const T* pooled, const uint8_t* window, const float* gamma, const float* beta,
                const float* save_mean, const float* save_invstd, T* dx, float* dgamma, float* dbeta,
                const BatchNormParams& p, const MaxPool2x2& pool));

// ==== the kernels: layer normalization ======================================================
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
    X(maxpool2x2_batchnorm_forward_train); X(maxpool2x2_batchnorm_forward_eval);  \
    X(maxpool2x2_batchnorm_backward); X(layernorm_forward); X(layernorm_backward)


// ==== the ops on tensors ===================================================================
// ---- batch normalization (autocast class Input) -------------------------------------------
// x [N, C, ...] normalized per channel C over the other dimensions (the kernels above have the
// formulas). gamma, beta, running statistics: f32 [C], whatever x's dtype.
// Training: batch statistics; updates running_mean and running_var; fills *save_mean and
// *save_invstd ([C]) and, if not null, *saved_x (x as the kernel read it) for the backward pass.
// gelu: return GELU(y), GELU fused after the normalization (nn/fuse.h), in the same kernel.
Tensor batchnorm_train(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& running_mean,
                       Tensor& running_var, float eps, float momentum, Tensor* save_mean, Tensor* save_invstd,
                       Tensor* saved_x = nullptr, bool gelu = false);

// Evaluation: the running statistics.
Tensor batchnorm_eval(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                      const Tensor& running_var, float eps, bool gelu = false);

// Returns dx; dgamma and dbeta accumulate. gelu_beta: the forward ran with gelu, dy is the
// gradient of GELU(y), and y is recomputed from x, the statistics, gamma and this beta.
Tensor batchnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& save_mean,
                          const Tensor& save_invstd, Tensor& dgamma, Tensor& dbeta, const Tensor* gelu_beta = nullptr);

// ---- max pooling 2×2 (stride 2, no padding) fused in front of batch norm (nn/fuse.h) -------
// x [N, C, H, W] (H, W ≥ 2) → batchnorm_train of its max-pool [N, C, H/2, W/2] (gelu: then GELU),
// one kernel, the bits of maxpool2d then batchnorm_train. Fills *save_mean, *save_invstd and,
// for the backward, *pooled (the pool, x's dtype) and *window (u8 [N, C, H/2, W/2]: each
// window's winner, 2·dh + dw).
Tensor maxpool2x2_batchnorm_train(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& running_mean,
                                  Tensor& running_var, float eps, float momentum, Tensor* save_mean,
                                  Tensor* save_invstd, Tensor* pooled, Tensor* window, bool gelu = false);

// Evaluation: the running statistics.
Tensor maxpool2x2_batchnorm_eval(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                                 const Tensor& running_var, float eps, bool gelu = false);

// Returns dx [N, C, H, W] (x_shape, the forward's input); dgamma and dbeta accumulate; gelu_beta
// as for batchnorm_backward.
Tensor maxpool2x2_batchnorm_backward(const Tensor& dy, const Tensor& pooled, const Tensor& window, const Shape& x_shape,
                                     const Tensor& gamma, const Tensor& save_mean, const Tensor& save_invstd,
                                     Tensor& dgamma, Tensor& dbeta, const Tensor* gelu_beta = nullptr);

// ---- layer normalization (autocast class F32) ---------------------------------------------
// x [..., D] normalized over its last dimension, one row of D values at a time (the kernels
// above have the formulas); gamma, beta: f32 [D]. Fills *save_mean and *save_invstd (f32 [R], one
// per row: R is the product of x's other dimensions) and, if not null, *saved_x (x as the kernel
// read it: f32 under autocast) for the backward pass.
Tensor layernorm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor* save_mean,
                 Tensor* save_invstd, Tensor* saved_x = nullptr);

// Returns dx; dgamma and dbeta accumulate.
Tensor layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& save_mean,
                          const Tensor& save_invstd, Tensor& dgamma, Tensor& dbeta);

}  // namespace kiln


#ifdef KILN_DEFINE_OPS  // compiled once, in src/ops/ops.cpp (see there)
namespace kiln {

// ---- batch normalization ----------------------------------------------------------------
namespace detail {

// x [N, C, ...] as [N, C, S]; each per-channel tensor must be f32 [C] (check_f32_args).
BatchNormParams batchnorm_params(const Tensor& x, std::initializer_list<Arg> per_channel, float eps,
                                 const char* op) {
    check_f32_args(op, {x, "x"}, per_channel);
    KILN_CHECK(x.ndim() >= 2, op, ": 'x' should be [N, C, ...] but is ", x.desc());
    BatchNormParams p;
    p.N = x.size(0), p.C = x.size(1), p.S = 1;
    for (int d = 2; d < x.ndim(); d++) p.S *= x.size(d);
    p.eps = eps;
    KILN_CHECK(p.N > 0 && p.C > 0 && p.S > 0, op, ": 'x' is empty: ", x.desc());
    for (const Arg& a : per_channel) check_shape(a.t, Shape{p.C}, op, a.name);
    return p;
}

// The forward's sizes and checks: gamma, beta and the running statistics f32 [C].
BatchNormParams batchnorm_forward_params(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                         const Tensor& running_mean, const Tensor& running_var, float eps, bool gelu,
                                         const char* op) {
    BatchNormParams p = batchnorm_params(
        x, {{gamma, "gamma"}, {beta, "beta"}, {running_mean, "running_mean"}, {running_var, "running_var"}}, eps, op);
    p.gelu = gelu;
    return p;
}

// The backward's sizes and checks, x the batch norm's input: dy x's shape, the per-channel
// tensors f32 [C]; with gelu_beta (GELU fused after it) beta too, and p.gelu.
BatchNormParams batchnorm_backward_params(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                          const Tensor& save_mean, const Tensor& save_invstd, const Tensor& dgamma,
                                          const Tensor& dbeta, const Tensor* gelu_beta, const char* op) {
    check_shape(dy, x.shape(), op, "dy");
    BatchNormParams p = batchnorm_params(x,
                                         {{gamma, "gamma"},
                                          {save_mean, "save_mean"},
                                          {save_invstd, "save_invstd"},
                                          {dgamma, "dgamma"},
                                          {dbeta, "dbeta"}},
                                         0.0f, op);
    if (gelu_beta) batchnorm_params(x, {{*gelu_beta, "beta"}}, 0.0f, op);
    p.gelu = gelu_beta != nullptr;
    return p;
}

// Training needs M = N·S > 1 values per channel (the unbiased running variance divides by M − 1).
void check_batch_statistics(const BatchNormParams& p, const Tensor& x, const char* op) {
    KILN_CHECK(p.N * p.S > 1, op, ": training needs more than one value per channel, got 'x' ", x.desc(),
               " (use a batch of at least 2, or eval())");
}

// x [N, C, H, W] with a 2×2 window fitting: the fused pool's sizes, and p's S made the pooled P·Q.
MaxPool2x2 pool2x2_of(const Tensor& x, BatchNormParams& p, const char* op) {
    KILN_CHECK(x.ndim() == 4 && x.size(2) >= 2 && x.size(3) >= 2, op,
               ": 'x' should be [N, C, H, W] with H, W ≥ 2 (a 2x2 window must fit) but is ", x.desc());
    p.S = (x.size(2) / 2) * (x.size(3) / 2);
    return MaxPool2x2{x.size(2), x.size(3)};
}

Shape pooled2x2_shape(const Shape& x) { return Shape{x[0], x[1], x[2] / 2, x[3] / 2}; }

}  // namespace detail

Tensor batchnorm_train(const Tensor& x_in, const Tensor& gamma, const Tensor& beta, Tensor& running_mean,
                       Tensor& running_var, float eps, float momentum, Tensor* save_mean, Tensor* save_invstd,
                       Tensor* saved_x, bool gelu) {
    const char* op = "batchnorm_train";
    const Tensor x = AmpCast(CastPolicy::Input, x_in.dtype()).input(x_in);
    const Device d = check_args(op, {{x, "x"}});
    BatchNormParams p = detail::batchnorm_forward_params(x, gamma, beta, running_mean, running_var, eps, gelu, op);
    p.momentum = momentum;
    detail::check_batch_statistics(p, x, op);
    Tensor y = Tensor::empty(x.shape(), x.dtype(), d, Category::Activation);
    *save_mean = Tensor::empty({p.C}, DType::F32, d, Category::Activation);
    *save_invstd = Tensor::empty({p.C}, DType::F32, d, Category::Activation);
    dispatch(d, x.dtype(), [&](auto be, auto tag) {
        using T = decltype(tag);
        kernel::batchnorm_forward_train(be, x.data<T>(), gamma.data<float>(), beta.data<float>(), y.data<T>(),
                                        running_mean.data<float>(), running_var.data<float>(), save_mean->data<float>(),
                                        save_invstd->data<float>(), p);
    });
    if (saved_x) *saved_x = x;
    return y;
}

Tensor batchnorm_eval(const Tensor& x_in, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                      const Tensor& running_var, float eps, bool gelu) {
    const char* op = "batchnorm_eval";
    const Tensor x = AmpCast(CastPolicy::Input, x_in.dtype()).input(x_in);
    const Device d = check_args(op, {{x, "x"}});
    const BatchNormParams p =
        detail::batchnorm_forward_params(x, gamma, beta, running_mean, running_var, eps, gelu, op);
    Tensor y = Tensor::empty(x.shape(), x.dtype(), d, Category::Activation);
    dispatch(d, x.dtype(), [&](auto be, auto tag) {
        using T = decltype(tag);
        kernel::batchnorm_forward_eval(be, x.data<T>(), gamma.data<float>(), beta.data<float>(),
                                       running_mean.data<float>(), running_var.data<float>(), y.data<T>(), p);
    });
    return y;
}

Tensor batchnorm_backward(const Tensor& dy_in, const Tensor& x_in, const Tensor& gamma,
                          const Tensor& save_mean, const Tensor& save_invstd, Tensor& dgamma, Tensor& dbeta,
                          const Tensor* gelu_beta) {
    const char* op = "batchnorm_backward";
    const AmpCast amp(CastPolicy::Input, x_in.dtype());
    const Tensor x = amp.input(x_in), dy = amp.input(dy_in);
    const Device d = check_args(op, {{dy, "dy"}, {x, "x"}});
    const BatchNormParams p =
        detail::batchnorm_backward_params(dy, x, gamma, save_mean, save_invstd, dgamma, dbeta, gelu_beta, op);
    Tensor dx = Tensor::empty(x.shape(), x.dtype(), d, Category::Activation);
    dispatch(d, x.dtype(), [&](auto be, auto tag) {
        using T = decltype(tag);
        kernel::batchnorm_backward(be, dy.data<T>(), x.data<T>(), gamma.data<float>(),
                                   gelu_beta ? gelu_beta->data<float>() : nullptr, save_mean.data<float>(),
                                   save_invstd.data<float>(), dx.data<T>(), dgamma.data<float>(), dbeta.data<float>(),
                                   p);
    });
    return dx;
}

// ---- max pooling 2×2 fused in front of batch norm ------------------------------------------
Tensor maxpool2x2_batchnorm_train(const Tensor& x_in, const Tensor& gamma, const Tensor& beta, Tensor& running_mean,
                                  Tensor& running_var, float eps, float momentum, Tensor* save_mean,
                                  Tensor* save_invstd, Tensor* pooled, Tensor* window, bool gelu) {
    const char* op = "maxpool2x2_batchnorm_train";
    const Tensor x = AmpCast(CastPolicy::Input, x_in.dtype()).input(x_in);
    const Device d = check_args(op, {{x, "x"}});
    BatchNormParams p = detail::batchnorm_forward_params(x, gamma, beta, running_mean, running_var, eps, gelu, op);
    p.momentum = momentum;
    const MaxPool2x2 pool = detail::pool2x2_of(x, p, op);
    detail::check_batch_statistics(p, x, op);
    const Shape pooled_shape = detail::pooled2x2_shape(x.shape());
    Tensor y = Tensor::empty(pooled_shape, x.dtype(), d, Category::Activation);
    *pooled = Tensor::empty(pooled_shape, x.dtype(), d, Category::Activation);
    *window = Tensor::empty(pooled_shape, DType::U8, d, Category::Activation);
    *save_mean = Tensor::empty({p.C}, DType::F32, d, Category::Activation);
    *save_invstd = Tensor::empty({p.C}, DType::F32, d, Category::Activation);
    dispatch(d, x.dtype(), [&](auto be, auto tag) {
        using T = decltype(tag);
        kernel::maxpool2x2_batchnorm_forward_train(be, x.data<T>(), gamma.data<float>(), beta.data<float>(),
                                                   pooled->data<T>(), window->data<uint8_t>(), y.data<T>(),
                                                   running_mean.data<float>(), running_var.data<float>(),
                                                   save_mean->data<float>(), save_invstd->data<float>(), p, pool);
    });
    return y;
}

Tensor maxpool2x2_batchnorm_eval(const Tensor& x_in, const Tensor& gamma, const Tensor& beta,
                                 const Tensor& running_mean, const Tensor& running_var, float eps, bool gelu) {
    const char* op = "maxpool2x2_batchnorm_eval";
    const Tensor x = AmpCast(CastPolicy::Input, x_in.dtype()).input(x_in);
    const Device d = check_args(op, {{x, "x"}});
    BatchNormParams p = detail::batchnorm_forward_params(x, gamma, beta, running_mean, running_var, eps, gelu, op);
    const MaxPool2x2 pool = detail::pool2x2_of(x, p, op);
    Tensor y = Tensor::empty(detail::pooled2x2_shape(x.shape()), x.dtype(), d, Category::Activation);
    dispatch(d, x.dtype(), [&](auto be, auto tag) {
        using T = decltype(tag);
        kernel::maxpool2x2_batchnorm_forward_eval(be, x.data<T>(), gamma.data<float>(), beta.data<float>(),
                                                  running_mean.data<float>(), running_var.data<float>(), y.data<T>(),
                                                  p, pool);
    });
    return y;
}

Tensor maxpool2x2_batchnorm_backward(const Tensor& dy_in, const Tensor& pooled_in, const Tensor& window,
                                     const Shape& x_shape, const Tensor& gamma, const Tensor& save_mean,
                                     const Tensor& save_invstd, Tensor& dgamma, Tensor& dbeta,
                                     const Tensor* gelu_beta) {
    const char* op = "maxpool2x2_batchnorm_backward";
    const AmpCast amp(CastPolicy::Input, pooled_in.dtype());
    const Tensor pooled = amp.input(pooled_in), dy = amp.input(dy_in);
    const Device d = check_args(op, {{dy, "dy"}, {pooled, "pooled"}});
    KILN_CHECK(x_shape.ndim == 4 && x_shape[2] >= 2 && x_shape[3] >= 2, op,
               ": the input shape should be [N, C, H, W] with H, W ≥ 2 but is ", x_shape.str());
    check_shape(pooled, detail::pooled2x2_shape(x_shape), op, "pooled");
    check_shape(window, pooled.shape(), op, "window");
    check_dtype(window, DType::U8, op, "window");
    check_same_device(pooled, window, op);
    const BatchNormParams p =
        detail::batchnorm_backward_params(dy, pooled, gamma, save_mean, save_invstd, dgamma, dbeta, gelu_beta, op);
    const MaxPool2x2 pool{x_shape[2], x_shape[3]};
    Tensor dx = Tensor::empty(x_shape, pooled.dtype(), d, Category::Activation);
    dispatch(d, pooled.dtype(), [&](auto be, auto tag) {
        using T = decltype(tag);
        kernel::maxpool2x2_batchnorm_backward(be, dy.data<T>(), pooled.data<T>(), window.data<uint8_t>(),
                                              gamma.data<float>(), gelu_beta ? gelu_beta->data<float>() : nullptr,
                                              save_mean.data<float>(), save_invstd.data<float>(), dx.data<T>(),
                                              dgamma.data<float>(), dbeta.data<float>(), p, pool);
    });
    return dx;
}

// ---- layer normalization ----------------------------------------------------------------
namespace detail {

// x [..., D] as R rows of D values; the per-column tensors (gamma and its kin) must be [D].
struct Rows {
    int64_t R, D;
};

Rows layernorm_rows(const Tensor& x, std::initializer_list<Arg> per_column, const char* op) {
    KILN_CHECK(x.ndim() >= 1 && x.size(x.ndim() - 1) > 0, op, ": 'x' should be [..., D] with D > 0 but is ",
               x.desc());
    const Rows rows{x.numel() / x.size(x.ndim() - 1), x.size(x.ndim() - 1)};
    for (const Arg& a : per_column) check_shape(a.t, Shape{rows.D}, op, a.name);
    return rows;
}

}  // namespace detail

Tensor layernorm(const Tensor& x_in, const Tensor& gamma, const Tensor& beta, float eps, Tensor* save_mean,
                 Tensor* save_invstd, Tensor* saved_x) {
    const char* op = "layernorm";
    const Tensor x = AmpCast(CastPolicy::F32, x_in.dtype()).input(x_in);
    const Device d = check_args(op, {{x, "x"}});
    check_f32_args(op, {x, "x"}, {{gamma, "gamma"}, {beta, "beta"}});
    const detail::Rows rows = detail::layernorm_rows(x, {{gamma, "gamma"}, {beta, "beta"}}, op);
    Tensor y = Tensor::empty(x.shape(), x.dtype(), d, Category::Activation);
    *save_mean = Tensor::empty(Shape{rows.R}, DType::F32, d, Category::Activation);
    *save_invstd = Tensor::empty(Shape{rows.R}, DType::F32, d, Category::Activation);
    dispatch(d, x.dtype(), [&](auto be, auto tag) {
        using T = decltype(tag);
        kernel::layernorm_forward(be, x.data<T>(), gamma.data<float>(), beta.data<float>(), y.data<T>(),
                                  save_mean->data<float>(), save_invstd->data<float>(), rows.R, rows.D, eps);
    });
    if (saved_x) *saved_x = x;
    return y;
}

Tensor layernorm_backward(const Tensor& dy_in, const Tensor& x_in, const Tensor& gamma,
                          const Tensor& save_mean, const Tensor& save_invstd, Tensor& dgamma, Tensor& dbeta) {
    const char* op = "layernorm_backward";
    const AmpCast amp(CastPolicy::F32, x_in.dtype());
    const Tensor x = amp.input(x_in), dy = amp.input(dy_in);
    const Device d = check_args(op, {{dy, "dy"}, {x, "x"}});
    check_f32_args(op, {x, "x"},
                   {{gamma, "gamma"}, {save_mean, "save_mean"}, {save_invstd, "save_invstd"}, {dgamma, "dgamma"},
                    {dbeta, "dbeta"}});
    check_shape(dy, x.shape(), op, "dy");
    const detail::Rows rows = detail::layernorm_rows(x, {{gamma, "gamma"}, {dgamma, "dgamma"}, {dbeta, "dbeta"}}, op);
    check_shape(save_mean, Shape{rows.R}, op, "save_mean");
    check_shape(save_invstd, Shape{rows.R}, op, "save_invstd");
    Tensor dx = Tensor::empty(x.shape(), x.dtype(), d, Category::Activation);
    dispatch(d, x.dtype(), [&](auto be, auto tag) {
        using T = decltype(tag);
        kernel::layernorm_backward(be, dy.data<T>(), x.data<T>(), gamma.data<float>(), save_mean.data<float>(),
                                   save_invstd.data<float>(), dx.data<T>(), dgamma.data<float>(), dbeta.data<float>(),
                                   rows.R, rows.D);
    });
    return dx;
}

}  // namespace kiln
#endif  // KILN_DEFINE_OPS
