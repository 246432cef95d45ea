// norm.cpp — BatchNorm2d / BatchNorm1d and LayerNorm: the layers' checks (which name the layer),
// the caches, and the calls to the normalization ops of ops/cnn.h, which run the kernels of the
// input's device (ops/cpu/norm.cpp or cuda/norm.cu).
#include "nn/norm.h"

#include "ops/cnn.h"

namespace kiln {

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

Tensor BatchNorm::forward(const Tensor& x) {
    check_defined(x, name().c_str(), "input");
    const char* want = min_rank_ == 4 ? "[N, C, H, W]" : "[N, C] or [N, C, L]";
    KILN_CHECK(x.ndim() >= min_rank_ && x.ndim() <= max_rank_ && x.size(1) == num_features, name(),
               ": expected input ", want, " with C = ", num_features, ", got ", x.desc());
    const Device d = x.device();
    check_on_device(weight.value, d, name(), "weight");
    check_on_device(bias.value, d, name(), "bias");
    check_on_device(running_mean, d, name(), "running_mean");
    check_on_device(running_var, d, name(), "running_var");
    if (!training()) return batchnorm_eval(x, weight.used(), bias.used(), running_mean, running_var, eps, gelu);
    int64_t values_per_channel = x.size(0);
    for (int i = 2; i < x.ndim(); i++) values_per_channel *= x.size(i);
    KILN_CHECK(values_per_channel > 1, name(), ": training needs more than one value per channel, got input ",
               x.desc(), " (use a batch of at least 2, or eval())");
    Tensor mean, invstd;  // this batch's per-channel statistics, [C]
    Tensor y = batchnorm_train(x, weight.used(), bias.used(), running_mean, running_var, eps, momentum, &mean, &invstd,
                               keeps_cache() ? &x_ : nullptr, gelu);
    if (keeps_cache()) {  // under a NoGradScope: batch statistics all the same, but no cache
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
    Tensor dx = batchnorm_backward(dy, x_, weight.used(), save_mean_, save_invstd_, weight.grad, bias.grad,
                                   gelu ? &bias.used() : nullptr);  // with GELU fused, beta recomputes y
    x_ = save_mean_ = save_invstd_ = Tensor();
    return dx;
}

// y, x kept, mean and 1/σ per channel kept; weight, bias, running_mean, running_var.
LayerMemory BatchNorm::memory(const Shape& in, Device) const {
    KILN_CHECK(in.ndim >= min_rank_ && in.ndim <= max_rank_ && in[1] == num_features, name(), ": expected input ",
               min_rank_ == 4 ? "[N, C, H, W]" : "[N, C] or [N, C, L]", " with C = ", num_features, ", got ", in.str());
    LayerMemory m;
    m.output = in;
    m.parameters = {Shape{num_features}, Shape{num_features}};
    m.buffers = {Shape{num_features}, Shape{num_features}};
    m.keeps_input = true;
    m.saved = {TensorSpec{Shape{num_features}}, TensorSpec{Shape{num_features}}};
    return m;
}

// ---- LayerNorm ---------------------------------------------------------------------------------
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

}  // namespace kiln
