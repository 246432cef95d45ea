// norm.cpp — BatchNorm2d / BatchNorm1d: checks, the cache, and the kernels of the input's device
// (ops/cpu/norm.cpp or cuda/norm.cu). The twins take the same arguments, so each call picks one:
//   (x.device() == Device::CUDA ? cuda::f : cpu::f)(arguments)
#include "nn/norm.h"

#include "ops/cpu/cnn_ops.h"
#include "ops/cuda_ops.h"

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

namespace {
cpu::BatchNormParams params_of(const Shape& s, float eps, float momentum) {
    cpu::BatchNormParams p;
    p.N = s[0], p.C = s[1], p.S = 1;
    for (int d = 2; d < s.ndim; d++) p.S *= s[d];
    p.eps = eps, p.momentum = momentum;
    return p;
}
}  // namespace

Tensor BatchNorm::forward(const Tensor& x) {
    check_defined(x, name().c_str(), "input");
    const char* want = min_rank_ == 4 ? "[N, C, H, W]" : "[N, C] or [N, C, L]";
    KILN_CHECK(x.ndim() >= min_rank_ && x.ndim() <= max_rank_ && x.size(1) == num_features, name(),
               ": expected input ", want, " with C = ", num_features, ", got ", x.desc());
    KILN_CHECK(x.dtype() == DType::F32, name(), ": needs an f32 tensor, got ", x.desc());
    const Device d = x.device();
    check_on_device(weight.value, d, name(), "weight");
    check_on_device(bias.value, d, name(), "bias");
    check_on_device(running_mean, d, name(), "running_mean");
    check_on_device(running_var, d, name(), "running_var");
    const cpu::BatchNormParams p = params_of(x.shape(), eps, momentum);
    Tensor y = Tensor::empty(x.shape(), DType::F32, d, Category::Activation);
    if (!training()) {
        (d == Device::CUDA ? cuda::batchnorm_forward_eval : cpu::batchnorm_forward_eval)(
            x.data<float>(), weight.value.data<float>(), bias.value.data<float>(), running_mean.data<float>(),
            running_var.data<float>(), y.data<float>(), p);
        return y;
    }
    KILN_CHECK(p.N * p.S > 1, name(), ": training needs more than one value per channel, got input ", x.desc(),
               " (use a batch of at least 2, or eval())");
    Tensor mean = Tensor::empty({p.C}, DType::F32, d, Category::Activation);
    Tensor invstd = Tensor::empty({p.C}, DType::F32, d, Category::Activation);
    (d == Device::CUDA ? cuda::batchnorm_forward_train : cpu::batchnorm_forward_train)(
        x.data<float>(), weight.value.data<float>(), bias.value.data<float>(), y.data<float>(),
        running_mean.data<float>(), running_var.data<float>(), mean.data<float>(), invstd.data<float>(), p);
    x_ = x;
    save_mean_ = mean;
    save_invstd_ = invstd;
    return y;
}

Tensor BatchNorm::backward(const Tensor& dy) {
    KILN_CHECK(x_.defined(), name(), ": backward without a training-mode forward");
    KILN_CHECK(dy.shape() == x_.shape() && dy.dtype() == DType::F32, name(), ": dy should be f32",
               x_.shape().str(), " (the forward output) but is ", dy.desc());
    const Device d = x_.device();
    check_on_device(dy, d, name(), "dy");
    check_on_device(weight.grad, d, name(), "weight.grad");
    check_on_device(bias.grad, d, name(), "bias.grad");
    const cpu::BatchNormParams p = params_of(x_.shape(), eps, momentum);
    Tensor dx = Tensor::empty(x_.shape(), DType::F32, d, Category::Activation);
    (d == Device::CUDA ? cuda::batchnorm_backward : cpu::batchnorm_backward)(
        dy.data<float>(), x_.data<float>(), weight.value.data<float>(), save_mean_.data<float>(),
        save_invstd_.data<float>(), dx.data<float>(), weight.grad.data<float>(), bias.grad.data<float>(), p);
    x_ = save_mean_ = save_invstd_ = Tensor();
    return dx;
}

}  // namespace kiln
