// norm.h — normalization layers: batch normalization (chapter 06), BatchNorm2d for
// [N, C, H, W] and BatchNorm1d for [N, C] (or [N, C, L]); and layer normalization, LayerNorm,
// over the last dimension. Each layer checks its input (the error names the layer), calls the ops
// of ops/norm.h, which run the kernels of the input's device (src/ops/cpu/norm.cpp or
// cuda/norm.cu), and keeps its cache for backward. The classes, then their members, defined under
// KILN_DEFINE_LAYERS and compiled once, in src/nn/nn.cpp.
//
// Letters: N = batch, C = channels, S = H·W (1 for [N, C]), M = N·S values per channel;
// D = LayerNorm's normalized size, R = the rows of D values it normalizes.
#pragma once
#include <cstdint>
#include <string>

#include "nn/module.h"
#include "ops/norm.h"

namespace kiln {

// Training (batch statistics, per channel over its M values):
//   mean = Σ x / M      var = Σ (x − mean)² / M   (biased, used to normalize)
//   y = weight · (x − mean) / sqrt(var + eps) + bias
//   running_mean = (1 − momentum) · running_mean + momentum · mean
//   running_var  = (1 − momentum) · running_var  + momentum · var · M / (M − 1)   (unbiased)
// Evaluation: y = weight · (x − running_mean) / sqrt(running_var + eps) + bias
// PyTorch's conventions: eps 1e-5, momentum 0.1, running_mean 0 and running_var 1 at the
// start, weight 1 and bias 0. backward (training mode):
//   dbias += Σ dy    dweight += Σ dy · x̂    dx = weight / (M·σ) · (M·dy − Σ dy − x̂ · Σ dy · x̂)
// with x̂ = (x − mean)/σ, σ = sqrt(var + eps). The cache is the input x and the per-channel
// mean and 1/σ (x̂ is recomputed, so no extra activation-sized tensor is kept).
class BatchNorm : public Module {
public:
    Tensor forward(const Tensor& x) override;
    Tensor backward(const Tensor& dy) override;
    // y [N, C, ...]: 4·N·C·S bytes; keeps x and the per-channel mean and 1/σ (2 · 4·C bytes);
    // parameters weight and bias, 2 · 4·C bytes (+ as much gradient), and the running statistics,
    // 2 · 4·C bytes more (buffers: no gradient, no optimizer state); dx [N, C, ...].
    LayerMemory memory(const Shape& in, Device device) const override;

    Parameter weight, bias;             // [C]: the affine scale and shift ("weight", "bias")
    Tensor running_mean, running_var;   // [C]: buffers ("running_mean", "running_var"): model
                                        // state, saved in checkpoints, not learned
    int64_t num_features;
    float eps = 1e-5f, momentum = 0.1f;
    // GELU fused after the normalization (nn/fuse.h sets it): the layer returns z = GELU(y),
    // one kernel each way, and its backward takes dz. It keeps what it kept before (x and the
    // statistics) and recomputes y, so the GELU layer it replaces no longer keeps y.
    bool gelu = false;
    // Max pooling 2×2 (stride 2) fused in front of the normalization (nn/fuse.h sets it, for a
    // BatchNorm2d after a MaxPool2d(2)): the layer takes the pool's input [N, C, H, W] and
    // normalizes its pool [N, C, H/2, W/2], one kernel each way, and its backward returns the
    // pool input's gradient. It keeps the pool (its own input, as before) and each window's
    // winner as one byte: the MaxPool2d it replaces kept an i32 index per value.
    bool pool2x2 = false;

protected:
    // ranks: the input ranks this layer accepts (4 for 2d; 2 or 3 for 1d).
    BatchNorm(int64_t channels, int min_rank, int max_rank, std::string name);

private:
    // x [N, C, ...] as the layer's checks want it (with pool2x2 the pool's input [N, C, H, W]).
    void check_input(const Tensor& x) const;

    int min_rank_, max_rank_;
    Tensor x_, save_mean_, save_invstd_;  // the cache for backward (with pool2x2, x_ is the pool)
    Tensor window_;                        // with pool2x2: each window's winner, u8 [N, C, H/2, W/2]
    Shape in_shape_;                       // with pool2x2: the pool's input shape
};

// x [N, C, H, W]
class BatchNorm2d : public BatchNorm {
public:
    explicit BatchNorm2d(int64_t channels, std::string name = "bn") : BatchNorm(channels, 4, 4, std::move(name)) {}
};

// x [N, C] (or [N, C, L], like PyTorch)
class BatchNorm1d : public BatchNorm {
public:
    explicit BatchNorm1d(int64_t features, std::string name = "bn") : BatchNorm(features, 2, 3, std::move(name)) {}
};

#ifdef KILN_DEFINE_LAYERS  // compiled once, in src/nn/nn.cpp (see there)
// ---- BatchNorm: the layer's checks (which name the layer), the cache, the ops ---------------
BatchNorm::BatchNorm(int64_t channels, int min_rank, int max_rank, std::string name)
    : Module(std::move(name)), num_features(channels), min_rank_(min_rank), max_rank_(max_rank) {
    KILN_CHECK(channels > 0, this->name(), ": BatchNorm needs at least one channel, got ", channels);
    add_parameter("weight", weight, Tensor::ones({channels}, DType::F32, Device::CPU, Category::Parameter));
    add_parameter("bias", bias, Tensor::zeros({channels}, DType::F32, Device::CPU, Category::Parameter));
    // Buffers are counted with the parameters: they are part of the model (and its checkpoint).
    running_mean = Tensor::zeros({channels}, DType::F32, Device::CPU, Category::Parameter);
    running_var = Tensor::ones({channels}, DType::F32, Device::CPU, Category::Parameter);
    add_buffer("running_mean", running_mean);
    add_buffer("running_var", running_var);
}

void BatchNorm::check_input(const Tensor& x) const {
    check_defined(x, name().c_str(), "input");
    if (pool2x2) {
        KILN_CHECK(x.ndim() == 4 && x.size(1) == num_features && x.size(2) >= 2 && x.size(3) >= 2, name(),
                   ": with max pooling 2x2 fused in front, expected input [N, C, H, W] with C = ", num_features,
                   " and H, W ≥ 2, got ", x.desc());
        return;
    }
    const char* want = min_rank_ == 4 ? "[N, C, H, W]" : "[N, C] or [N, C, L]";
    KILN_CHECK(x.ndim() >= min_rank_ && x.ndim() <= max_rank_ && x.size(1) == num_features, name(),
               ": expected input ", want, " with C = ", num_features, ", got ", x.desc());
}

Tensor BatchNorm::forward(const Tensor& x) {
    check_input(x);
    const Device d = x.device();
    check_on_device(weight.value, d, name(), "weight");
    check_on_device(bias.value, d, name(), "bias");
    check_on_device(running_mean, d, name(), "running_mean");
    check_on_device(running_var, d, name(), "running_var");
    if (!training()) {
        return pool2x2 ? maxpool2x2_batchnorm_eval(x, weight.used(), bias.used(), running_mean, running_var, eps, gelu)
                       : batchnorm_eval(x, weight.used(), bias.used(), running_mean, running_var, eps, gelu);
    }
    int64_t values_per_channel = x.size(0);
    for (int i = 2; i < x.ndim(); i++) values_per_channel *= pool2x2 ? x.size(i) / 2 : x.size(i);
    KILN_CHECK(values_per_channel > 1, name(), ": training needs more than one value per channel, got input ",
               x.desc(), pool2x2 ? " (pooled 2x2)" : "", " (use a batch of at least 2, or eval())");
    Tensor mean, invstd;  // this batch's per-channel statistics, [C]
    Tensor y, pooled, window;
    if (pool2x2) {
        y = maxpool2x2_batchnorm_train(x, weight.used(), bias.used(), running_mean, running_var, eps, momentum, &mean,
                                       &invstd, &pooled, &window, gelu);
    } else {
        y = batchnorm_train(x, weight.used(), bias.used(), running_mean, running_var, eps, momentum, &mean, &invstd,
                            &pooled, gelu);
    }
    if (keeps_cache()) {  // under a NoGradScope: batch statistics all the same, but no cache
        x_ = pooled;
        window_ = window;
        in_shape_ = x.shape();
        save_mean_ = mean;
        save_invstd_ = invstd;
    }
    return y;
}

Tensor BatchNorm::backward(const Tensor& dy) {
    KILN_CHECK(x_.defined(), name(), ": backward without a training-mode forward");
    KILN_CHECK(dy.shape() == x_.shape(), name(), ": dy should be ", x_.shape().str(), " (the forward output) but is ",
               dy.desc());
    const Device d = x_.device();
    check_on_device(dy, d, name(), "dy");
    check_on_device(weight.grad, d, name(), "weight.grad");
    check_on_device(bias.grad, d, name(), "bias.grad");
    const Tensor* beta = gelu ? &bias.used() : nullptr;  // with GELU fused, beta recomputes y
    Tensor dx = window_.defined() ? maxpool2x2_batchnorm_backward(dy, x_, window_, in_shape_, weight.used(), save_mean_,
                                                                  save_invstd_, weight.grad, bias.grad, beta)
                                  : batchnorm_backward(dy, x_, weight.used(), save_mean_, save_invstd_, weight.grad,
                                                       bias.grad, beta);
    x_ = save_mean_ = save_invstd_ = window_ = Tensor();
    return dx;
}

// y, x kept, mean and 1/σ per channel kept; weight, bias, running_mean, running_var. With pool2x2
// y is the pool's shape, and the pool and its windows' winners (u8) are kept in x's place.
LayerMemory BatchNorm::memory(const Shape& in, Device) const {
    LayerMemory m;
    if (pool2x2) {
        KILN_CHECK(in.ndim == 4 && in[1] == num_features && in[2] >= 2 && in[3] >= 2, name(),
                   ": with max pooling 2x2 fused in front, expected input [N, C, H, W] with C = ", num_features,
                   " and H, W ≥ 2, got ", in.str());
        m.output = Shape{in[0], in[1], in[2] / 2, in[3] / 2};
        m.saved = {TensorSpec{m.output}, TensorSpec{m.output, DType::U8}};
    } else {
        KILN_CHECK(in.ndim >= min_rank_ && in.ndim <= max_rank_ && in[1] == num_features, name(), ": expected input ",
                   min_rank_ == 4 ? "[N, C, H, W]" : "[N, C] or [N, C, L]", " with C = ", num_features, ", got ",
                   in.str());
        m.output = in;
        m.keeps_input = true;
    }
    m.parameters = {Shape{num_features}, Shape{num_features}};
    m.buffers = {Shape{num_features}, Shape{num_features}};
    m.saved.push_back(TensorSpec{Shape{num_features}});
    m.saved.push_back(TensorSpec{Shape{num_features}});
    return m;
}
#endif  // KILN_DEFINE_LAYERS

// LayerNorm (PyTorch's nn.LayerNorm(D), elementwise_affine): each row of D values — x [..., D],
// every dimension but the last is a row — is normalized over its own values; there are no
// batch statistics, so training and evaluation compute the same thing.
//   mean = Σ_d x_d / D      var = Σ_d (x_d − mean)² / D   (biased)      σ = sqrt(var + eps)
//   x̂_d = (x_d − mean) / σ      y_d = weight_d · x̂_d + bias_d
// backward: with g_d = weight_d · dy_d (= dL/dx̂_d) and sums over the row's D values,
//   dx_d = (1/σ) · (g_d − Σ g / D − x̂_d · Σ g·x̂ / D)
//   dweight_d += Σ_rows dy_d · x̂_d        dbias_d += Σ_rows dy_d
// (x̂ depends on x_d directly, through the mean — the Σ g / D term — and through σ — the
// x̂ · Σ g·x̂ / D term.) eps 1e-5, weight 1 and bias 0 at the start, as in PyTorch. The cache is
// x and each row's mean and 1/σ; x̂ is recomputed.
class LayerNorm : public Module {
public:
    explicit LayerNorm(int64_t normalized_size, std::string name = "ln", float eps = 1e-5f);
    Tensor forward(const Tensor& x) override;
    Tensor backward(const Tensor& dy) override;
    // y [..., D]: 4·R·D bytes; keeps x and each row's mean and 1/σ (2 · 4·R bytes); parameters
    // weight and bias, 2 · 4·D bytes (+ as much gradient); dx [..., D].
    LayerMemory memory(const Shape& in, Device device) const override;

    Parameter weight, bias;  // [D]: the affine scale and shift
    int64_t normalized_size;
    float eps;

private:
    Tensor x_, save_mean_, save_invstd_;  // the cache for backward (x_ as the op read it: f32 under autocast)
};

#ifdef KILN_DEFINE_LAYERS  // compiled once, in src/nn/nn.cpp (see there)
// ---- LayerNorm ------------------------------------------------------------------------------
LayerNorm::LayerNorm(int64_t D, std::string name, float eps_)
    : Module(std::move(name)), normalized_size(D), eps(eps_) {
    KILN_CHECK(D > 0, this->name(), ": LayerNorm needs a normalized size of at least 1, got ", D);
    add_parameter("weight", weight, Tensor::ones({D}, DType::F32, Device::CPU, Category::Parameter));
    add_parameter("bias", bias, Tensor::zeros({D}, DType::F32, Device::CPU, Category::Parameter));
}

Tensor LayerNorm::forward(const Tensor& x) {
    check_defined(x, name().c_str(), "input");
    KILN_CHECK(x.ndim() >= 1 && x.size(x.ndim() - 1) == normalized_size, name(), ": expected input [..., ",
               normalized_size, "], got ", x.desc());
    check_on_device(weight.value, x.device(), name(), "weight");
    check_on_device(bias.value, x.device(), name(), "bias");
    Tensor mean, invstd;
    Tensor y = layernorm(x, weight.used(), bias.used(), eps, &mean, &invstd, keeps_cache() ? &x_ : nullptr);
    if (keeps_cache()) {
        save_mean_ = mean;
        save_invstd_ = invstd;
    }
    return y;
}

Tensor LayerNorm::backward(const Tensor& dy) {
    KILN_CHECK(x_.defined(), name(), ": backward without a training-mode forward");
    KILN_CHECK(dy.shape() == x_.shape(), name(), ": dy should be ", x_.shape().str(), " (the forward output) but is ",
               dy.desc());
    check_on_device(dy, x_.device(), name(), "dy");
    Tensor dx = layernorm_backward(dy, x_, weight.used(), save_mean_, save_invstd_, weight.grad, bias.grad);
    x_ = save_mean_ = save_invstd_ = Tensor();
    return dx;
}

// y, x kept, mean and 1/σ per row kept (R = the elements / D); weight and bias.
LayerMemory LayerNorm::memory(const Shape& in, Device) const {
    KILN_CHECK(in.ndim >= 1 && in[in.ndim - 1] == normalized_size, name(), ": expected input [..., ",
               normalized_size, "], got ", in.str());
    const int64_t rows = in.numel() / normalized_size;
    LayerMemory m;
    m.output = in;
    m.parameters = {Shape{normalized_size}, Shape{normalized_size}};
    m.keeps_input = true;
    m.saved = {TensorSpec{Shape{rows}}, TensorSpec{Shape{rows}}};
    return m;
}
#endif  // KILN_DEFINE_LAYERS

}  // namespace kiln
