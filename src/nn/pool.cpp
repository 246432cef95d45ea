// pool.cpp — MaxPool2d, AvgPool2d, GlobalAvgPool: the layers' checks (which name the layer), the
// cache, and the calls to the pooling ops of ops/cnn.h, which run the kernels of the input's
// device (ops/cpu/pool.cpp or cuda/pool.cu).
#include "nn/pool.h"

#include "ops/cnn.h"

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
}

// The window must fit the input: checked here too, so that the error names the layer.
Pool2dArgs args_of(const Shape& s, int64_t kernel, int64_t stride, int64_t padding, const std::string& layer) {
    KILN_CHECK(s[2] + 2 * padding >= kernel && s[3] + 2 * padding >= kernel, layer, ": a ", kernel, "x", kernel,
               " window does not fit the input ", s.str(), " with padding ", padding);
    return Pool2dArgs{kernel, stride, padding};
}

// dy: the forward output's shape, on the device the forward ran on.
void check_dy(const Tensor& dy, const Shape& want, Device device, const std::string& layer) {
    KILN_CHECK(dy.shape() == want, layer, ": dy should be ", want.str(), " (the forward output) but is ", dy.desc());
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
    Tensor argmax;
    Tensor y = maxpool2d(x, args_of(x.shape(), kernel, stride, padding, name()), &argmax);
    if (keeps_cache()) {
        argmax_ = argmax;
        in_shape_ = x.shape();
    }
    return y;
}

Tensor MaxPool2d::backward(const Tensor& dy) {
    KILN_CHECK(argmax_.defined(), name(), ": backward without a training-mode forward");
    check_dy(dy, argmax_.shape(), argmax_.device(), name());
    Tensor dx = maxpool2d_backward(dy, argmax_, in_shape_, args_of(in_shape_, kernel, stride, padding, name()));
    argmax_ = Tensor();
    return dx;
}

// y and its argmax (i32, kept).
LayerMemory MaxPool2d::memory(const Shape& in, Device) const {
    KILN_CHECK(in.ndim == 4, name(), ": expected input [N, C, H, W], got ", in.str());
    LayerMemory m;
    m.output = pool2d_output_shape(in, args_of(in, kernel, stride, padding, name()));
    m.saved.push_back(TensorSpec{m.output, DType::I32});
    return m;
}

// ---- AvgPool2d -------------------------------------------------------------------------------
AvgPool2d::AvgPool2d(int64_t k, int64_t s, int64_t pad, std::string name)
    : Module(std::move(name)), kernel(k), stride(s == 0 ? k : s), padding(pad) {
    check_pool_args(this->name(), kernel, stride, padding);
}

Tensor AvgPool2d::forward(const Tensor& x) {
    check_input(x, name());
    Tensor y = avgpool2d(x, args_of(x.shape(), kernel, stride, padding, name()));
    if (keeps_cache()) {
        in_shape_ = x.shape();
        in_device_ = x.device();
    }
    return y;
}

Tensor AvgPool2d::backward(const Tensor& dy) {
    KILN_CHECK(in_shape_.ndim == 4, name(), ": backward without a training-mode forward");
    const Pool2dArgs a = args_of(in_shape_, kernel, stride, padding, name());
    check_dy(dy, pool2d_output_shape(in_shape_, a), in_device_, name());
    Tensor dx = avgpool2d_backward(dy, in_shape_, a);
    in_shape_ = Shape();
    return dx;
}

// y only.
LayerMemory AvgPool2d::memory(const Shape& in, Device) const {
    KILN_CHECK(in.ndim == 4, name(), ": expected input [N, C, H, W], got ", in.str());
    LayerMemory m;
    m.output = pool2d_output_shape(in, args_of(in, kernel, stride, padding, name()));
    return m;
}

// ---- GlobalAvgPool ---------------------------------------------------------------------------
Tensor GlobalAvgPool::forward(const Tensor& x) {
    check_input(x, name());
    KILN_CHECK(x.size(2) * x.size(3) > 0, name(), ": empty planes in ", x.desc());
    Tensor y = global_avgpool(x);
    if (keeps_cache()) {
        in_shape_ = x.shape();
        in_device_ = x.device();
    }
    return y;
}

Tensor GlobalAvgPool::backward(const Tensor& dy) {
    KILN_CHECK(in_shape_.ndim == 4, name(), ": backward without a training-mode forward");
    check_dy(dy, Shape{in_shape_[0], in_shape_[1]}, in_device_, name());
    Tensor dx = global_avgpool_backward(dy, in_shape_);
    in_shape_ = Shape();
    return dx;
}

// y [N, C] only.
LayerMemory GlobalAvgPool::memory(const Shape& in, Device) const {
    KILN_CHECK(in.ndim == 4, name(), ": expected input [N, C, H, W], got ", in.str());
    LayerMemory m;
    m.output = Shape{in[0], in[1]};
    return m;
}

}  // namespace kiln
