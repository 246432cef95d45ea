// pool.h — pooling layers (chapter 03): MaxPool2d, AvgPool2d, GlobalAvgPool.
// They call the ops of ops/pool.h, whose kernels (src/ops/cpu/pool.cpp, cuda/pool.cu) the
// input's device picks. The classes, then their members, defined under KILN_DEFINE_LAYERS and
// compiled once, in src/nn/nn.cpp.
//
// Letters: N = batch, C = channels, H, W = input size, K = window size, P, Q = output size,
//   P = (H + 2·padding − K) / stride + 1,   Q likewise.
#pragma once
#include <cstdint>
#include <string>

#include "nn/module.h"
#include "ops/pool.h"

namespace kiln {

// y[n, c, p, q] = max over the K×K window at (p·stride − pad, q·stride − pad) of x[n, c, ·, ·]
// (padding counts as −inf). x [N, C, H, W] → y [N, C, P, Q]. stride 0 means stride = K.
// backward: dx[n, c, argmax] += dy[n, c, p, q] — the argmax indices [N, C, P, Q] (i32, the
// position ih·W + iw inside the plane) are saved by forward, one per output.
class MaxPool2d : public Module {
public:
    explicit MaxPool2d(int64_t kernel, int64_t stride = 0, int64_t padding = 0, std::string name = "maxpool");
    Tensor forward(const Tensor& x) override;
    Tensor backward(const Tensor& dy) override;
    // y [N, C, P, Q]: 4·N·C·P·Q bytes, and the argmax kept: as many i32, 4·N·C·P·Q bytes more
    // (x is not kept); dx [N, C, H, W] in backward.
    LayerMemory memory(const Shape& in, Device device) const override;
    int64_t kernel, stride, padding;

private:
    Tensor argmax_;  // i32 [N, C, P, Q]
    Shape in_shape_;
};

// y[n, c, p, q] = (1 / K²) Σ over the window of x (padding counts as 0 and is counted:
// PyTorch's count_include_pad = true). dx: each dy / K² spread over its window.
class AvgPool2d : public Module {
public:
    explicit AvgPool2d(int64_t kernel, int64_t stride = 0, int64_t padding = 0, std::string name = "avgpool");
    Tensor forward(const Tensor& x) override;
    Tensor backward(const Tensor& dy) override;
    // y [N, C, P, Q]: 4·N·C·P·Q bytes; nothing kept (backward needs only x's shape); dx [N, C, H, W].
    LayerMemory memory(const Shape& in, Device device) const override;
    int64_t kernel, stride, padding;

private:
    Shape in_shape_;
    Device in_device_ = Device::CPU;  // where the forward ran: dy must be there too
};

// [N, C, H, W] → [N, C]: y[n, c] = mean over H·W of x[n, c];  dx[n, c, ·, ·] = dy[n, c] / (H·W)
class GlobalAvgPool : public Module {
public:
    explicit GlobalAvgPool(std::string name = "global_avgpool") : Module(std::move(name)) {}
    Tensor forward(const Tensor& x) override;
    Tensor backward(const Tensor& dy) override;
    // y [N, C]: 4·N·C bytes; nothing kept; dx [N, C, H, W].
    LayerMemory memory(const Shape& in, Device device) const override;

private:
    Shape in_shape_;
    Device in_device_ = Device::CPU;  // where the forward ran: dy must be there too
};

#ifdef KILN_DEFINE_LAYERS  // compiled once, in src/nn/nn.cpp (see there)
// ---- the layers' checks (which name the layer), the caches, the ops of ops/pool.h ----------
namespace pool_layer {

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

}  // namespace pool_layer

// ---- MaxPool2d -------------------------------------------------------------------------------
MaxPool2d::MaxPool2d(int64_t k, int64_t s, int64_t pad, std::string name)
    : Module(std::move(name)), kernel(k), stride(s == 0 ? k : s), padding(pad) {
    pool_layer::check_pool_args(this->name(), kernel, stride, padding);
}

Tensor MaxPool2d::forward(const Tensor& x) {
    pool_layer::check_input(x, name());
    Tensor argmax;
    Tensor y = maxpool2d(x, pool_layer::args_of(x.shape(), kernel, stride, padding, name()), &argmax);
    if (keeps_cache()) {
        argmax_ = argmax;
        in_shape_ = x.shape();
    }
    return y;
}

Tensor MaxPool2d::backward(const Tensor& dy) {
    KILN_CHECK(argmax_.defined(), name(), ": backward without a training-mode forward");
    pool_layer::check_dy(dy, argmax_.shape(), argmax_.device(), name());
    Tensor dx =
        maxpool2d_backward(dy, argmax_, in_shape_, pool_layer::args_of(in_shape_, kernel, stride, padding, name()));
    argmax_ = Tensor();
    return dx;
}

// y and its argmax (i32, kept).
LayerMemory MaxPool2d::memory(const Shape& in, Device) const {
    KILN_CHECK(in.ndim == 4, name(), ": expected input [N, C, H, W], got ", in.str());
    LayerMemory m;
    m.output = pool2d_output_shape(in, pool_layer::args_of(in, kernel, stride, padding, name()));
    m.saved.push_back(TensorSpec{m.output, DType::I32});
    return m;
}

// ---- AvgPool2d -------------------------------------------------------------------------------
AvgPool2d::AvgPool2d(int64_t k, int64_t s, int64_t pad, std::string name)
    : Module(std::move(name)), kernel(k), stride(s == 0 ? k : s), padding(pad) {
    pool_layer::check_pool_args(this->name(), kernel, stride, padding);
}

Tensor AvgPool2d::forward(const Tensor& x) {
    pool_layer::check_input(x, name());
    Tensor y = avgpool2d(x, pool_layer::args_of(x.shape(), kernel, stride, padding, name()));
    if (keeps_cache()) {
        in_shape_ = x.shape();
        in_device_ = x.device();
    }
    return y;
}

Tensor AvgPool2d::backward(const Tensor& dy) {
    KILN_CHECK(in_shape_.ndim == 4, name(), ": backward without a training-mode forward");
    const Pool2dArgs a = pool_layer::args_of(in_shape_, kernel, stride, padding, name());
    pool_layer::check_dy(dy, pool2d_output_shape(in_shape_, a), in_device_, name());
    Tensor dx = avgpool2d_backward(dy, in_shape_, a);
    in_shape_ = Shape();
    return dx;
}

// y only.
LayerMemory AvgPool2d::memory(const Shape& in, Device) const {
    KILN_CHECK(in.ndim == 4, name(), ": expected input [N, C, H, W], got ", in.str());
    LayerMemory m;
    m.output = pool2d_output_shape(in, pool_layer::args_of(in, kernel, stride, padding, name()));
    return m;
}

// ---- GlobalAvgPool ---------------------------------------------------------------------------
Tensor GlobalAvgPool::forward(const Tensor& x) {
    pool_layer::check_input(x, name());
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
    pool_layer::check_dy(dy, Shape{in_shape_[0], in_shape_[1]}, in_device_, name());
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
#endif  // KILN_DEFINE_LAYERS

}  // namespace kiln
