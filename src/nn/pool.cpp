// pool.cpp — MaxPool2d, AvgPool2d, GlobalAvgPool: checks, then the kernels of the input's device
// (ops/cpu/pool.cpp or cuda/pool.cu). The twins take the same arguments, so each call picks one:
//   (x.device() == Device::CUDA ? cuda::f : cpu::f)(arguments)
#include "nn/pool.h"

#include "ops/cpu/cnn_ops.h"
#include "ops/cuda_ops.h"

namespace kiln {
namespace {

void check_pool_args(const std::string& layer, int64_t kernel, int64_t stride, int64_t padding) {
    KILN_CHECK(kernel > 0 && stride > 0 && padding >= 0, layer, ": kernel ", kernel, " and stride ", stride,
               " must be ≥ 1, padding ", padding, " ≥ 0");
    KILN_CHECK(2 * padding <= kernel, layer, ": padding ", padding, " must be at most half the kernel ", kernel,
               " (otherwise a window could lie wholly in the padding)");
}

void check_input(const Tensor& x, const std::string& layer) {
    check_defined(x, layer.c_str(), "input");
    KILN_CHECK(x.ndim() == 4, layer, ": expected input [N, C, H, W], got ", x.desc());
    KILN_CHECK(x.dtype() == DType::F32, layer, ": needs an f32 tensor, got ", x.desc());
}

cpu::Pool2dParams params_of(const Shape& s, int64_t kernel, int64_t stride, int64_t padding, const std::string& layer) {
    cpu::Pool2dParams p;
    p.N = s[0], p.C = s[1], p.H = s[2], p.W = s[3];
    p.KH = p.KW = kernel, p.stride = stride, p.padding = padding;
    KILN_CHECK(p.H + 2 * padding >= kernel && p.W + 2 * padding >= kernel, layer, ": a ", kernel, "x", kernel,
               " window does not fit the input ", s.str(), " with padding ", padding);
    return p;
}

// dy: the forward output's shape, f32, on the device the forward ran on.
void check_dy(const Tensor& dy, const Shape& want, Device device, const std::string& layer) {
    KILN_CHECK(dy.shape() == want, layer, ": dy should be ", want.str(), " (the forward output) but is ", dy.desc());
    KILN_CHECK(dy.dtype() == DType::F32, layer, ": dy must be f32, got ", dy.desc());
    check_on_device(dy, device, layer, "dy");
}

}  // namespace

// ---- MaxPool2d -------------------------------------------------------------------------------
MaxPool2d::MaxPool2d(int64_t k, int64_t s, int64_t pad, std::string name)
    : Module(std::move(name)), kernel(k), stride(s == 0 ? k : s), padding(pad) {
    check_pool_args(this->name(), kernel, stride, padding);
}

Tensor MaxPool2d::forward(const Tensor& x) {
    check_input(x, name());
    const cpu::Pool2dParams p = params_of(x.shape(), kernel, stride, padding, name());
    Tensor y = Tensor::empty({p.N, p.C, p.P(), p.Q()}, DType::F32, x.device(), Category::Activation);
    Tensor argmax = Tensor::empty(y.shape(), DType::I32, x.device(), Category::Activation);
    (x.device() == Device::CUDA ? cuda::maxpool2d_forward : cpu::maxpool2d_forward)(
        x.data<float>(), y.data<float>(), argmax.data<int32_t>(), p);
    if (training()) {
        argmax_ = argmax;
        in_shape_ = x.shape();
    }
    return y;
}

Tensor MaxPool2d::backward(const Tensor& dy) {
    KILN_CHECK(argmax_.defined(), name(), ": backward without a training-mode forward");
    check_dy(dy, argmax_.shape(), argmax_.device(), name());
    const cpu::Pool2dParams p = params_of(in_shape_, kernel, stride, padding, name());
    Tensor dx = Tensor::empty(in_shape_, DType::F32, dy.device(), Category::Activation);
    (dy.device() == Device::CUDA ? cuda::maxpool2d_backward : cpu::maxpool2d_backward)(
        dy.data<float>(), argmax_.data<int32_t>(), dx.data<float>(), p);
    argmax_ = Tensor();
    return dx;
}

// ---- AvgPool2d -------------------------------------------------------------------------------
AvgPool2d::AvgPool2d(int64_t k, int64_t s, int64_t pad, std::string name)
    : Module(std::move(name)), kernel(k), stride(s == 0 ? k : s), padding(pad) {
    check_pool_args(this->name(), kernel, stride, padding);
}

Tensor AvgPool2d::forward(const Tensor& x) {
    check_input(x, name());
    const cpu::Pool2dParams p = params_of(x.shape(), kernel, stride, padding, name());
    Tensor y = Tensor::empty({p.N, p.C, p.P(), p.Q()}, DType::F32, x.device(), Category::Activation);
    (x.device() == Device::CUDA ? cuda::avgpool2d_forward : cpu::avgpool2d_forward)(
        x.data<float>(), y.data<float>(), p);
    if (training()) {
        in_shape_ = x.shape();
        in_device_ = x.device();
    }
    return y;
}

Tensor AvgPool2d::backward(const Tensor& dy) {
    KILN_CHECK(in_shape_.ndim == 4, name(), ": backward without a training-mode forward");
    const cpu::Pool2dParams p = params_of(in_shape_, kernel, stride, padding, name());
    check_dy(dy, Shape{p.N, p.C, p.P(), p.Q()}, in_device_, name());
    Tensor dx = Tensor::empty(in_shape_, DType::F32, dy.device(), Category::Activation);
    (dy.device() == Device::CUDA ? cuda::avgpool2d_backward : cpu::avgpool2d_backward)(
        dy.data<float>(), dx.data<float>(), p);
    in_shape_ = Shape();
    return dx;
}

// ---- GlobalAvgPool ---------------------------------------------------------------------------
Tensor GlobalAvgPool::forward(const Tensor& x) {
    check_input(x, name());
    const int64_t N = x.size(0), C = x.size(1), S = x.size(2) * x.size(3);
    KILN_CHECK(S > 0, name(), ": empty planes in ", x.desc());
    Tensor y = Tensor::empty({N, C}, DType::F32, x.device(), Category::Activation);
    (x.device() == Device::CUDA ? cuda::global_avgpool_forward : cpu::global_avgpool_forward)(
        x.data<float>(), y.data<float>(), N * C, S);
    if (training()) {
        in_shape_ = x.shape();
        in_device_ = x.device();
    }
    return y;
}

Tensor GlobalAvgPool::backward(const Tensor& dy) {
    KILN_CHECK(in_shape_.ndim == 4, name(), ": backward without a training-mode forward");
    check_dy(dy, Shape{in_shape_[0], in_shape_[1]}, in_device_, name());
    Tensor dx = Tensor::empty(in_shape_, DType::F32, dy.device(), Category::Activation);
    const int64_t NC = in_shape_[0] * in_shape_[1], S = in_shape_[2] * in_shape_[3];
    (dy.device() == Device::CUDA ? cuda::global_avgpool_backward : cpu::global_avgpool_backward)(
        dy.data<float>(), dx.data<float>(), NC, S);
    in_shape_ = Shape();
    return dx;
}

}  // namespace kiln
