// conv.cpp — Conv2d: argument checks, the workspace, and the calls to the kernels of the
// input's device: src/ops/cpu/conv.cpp (which explains im2col, the direct paths and the threads)
// or cuda/conv.cu (im2col + GEMM and the implicit GEMM), the same names and arguments.
#include "nn/conv.h"

#include <algorithm>
#include <cmath>

#include "ops/cpu/cnn_ops.h"
#include "ops/cuda_ops.h"

namespace kiln {

Conv2d::Conv2d(int64_t in, int64_t out, int64_t kernel, Rng& rng, ConvOptions opt, std::string name)
    : Conv2d(in, out, kernel, kernel, rng, opt, std::move(name)) {}

Conv2d::Conv2d(int64_t in, int64_t out, int64_t kh, int64_t kw, Rng& rng, ConvOptions opt, std::string name)
    : Module(std::move(name)), in_channels(in), out_channels(out), kernel_h(kh), kernel_w(kw), options(opt) {
    KILN_CHECK(in > 0 && out > 0 && kh > 0 && kw > 0, this->name(), ": Conv2d(", in, ", ", out, ", kernel ", kh, "x",
               kw, "): sizes must be positive");
    KILN_CHECK(opt.stride > 0 && opt.padding >= 0 && opt.dilation > 0 && opt.groups > 0, this->name(),
               ": stride ", opt.stride, " and dilation ", opt.dilation, " must be ≥ 1, padding ", opt.padding,
               " ≥ 0, groups ", opt.groups, " ≥ 1");
    KILN_CHECK(in % opt.groups == 0 && out % opt.groups == 0, this->name(), ": groups=", opt.groups,
               " must divide both in_channels=", in, " and out_channels=", out);
    const int64_t fan_in = in / opt.groups * kh * kw;
    const float bound = 1.0f / std::sqrt(float(fan_in));
    add_parameter("weight", weight,
                  Tensor::uniform({out, in / opt.groups, kh, kw}, -bound, bound, rng, Device::CPU, Category::Parameter));
    if (opt.bias)
        add_parameter("bias", bias, Tensor::uniform({out}, -bound, bound, rng, Device::CPU, Category::Parameter));
}

Shape Conv2d::output_shape(const Shape& in) const {
    KILN_CHECK(in.ndim == 4 && in[1] == in_channels, name(), ": expected input [N, ", in_channels,
               ", H, W], got ", in.str());
    const int64_t P = (in[2] + 2 * options.padding - options.dilation * (kernel_h - 1) - 1) / options.stride + 1;
    const int64_t Q = (in[3] + 2 * options.padding - options.dilation * (kernel_w - 1) - 1) / options.stride + 1;
    KILN_CHECK(in[2] + 2 * options.padding >= options.dilation * (kernel_h - 1) + 1 &&
                   in[3] + 2 * options.padding >= options.dilation * (kernel_w - 1) + 1 && P > 0 && Q > 0,
               name(), ": a ", kernel_h, "x", kernel_w, " kernel (dilation ", options.dilation,
               ") does not fit the input ", in.str(), " with padding ", options.padding,
               " (a smaller kernel, more padding, or fewer poolings before this layer)");
    return Shape{in[0], out_channels, P, Q};
}

namespace {

cpu::Conv2dParams params_of(const Conv2d& m, const Shape& in) {
    cpu::Conv2dParams p;
    p.N = in[0], p.C = in[1], p.H = in[2], p.W = in[3];
    p.O = m.out_channels, p.KH = m.kernel_h, p.KW = m.kernel_w;
    p.stride = m.options.stride, p.padding = m.options.padding, p.dilation = m.options.dilation;
    p.groups = m.options.groups;
    return p;
}

// Floats of workspace one image needs for a pass on a device: the CPU's direct paths need none,
// nor does the CUDA forward by implicit GEMM; every other pass unfolds images into columns.
int64_t col_floats_per_image(const cpu::Conv2dParams& p, Device device, bool forward) {
    if (device == Device::CPU) return cpu::conv2d_col_floats_per_image(p);
    if (forward && cuda::conv2d_algo(p) == cuda::ConvAlgo::ImplicitGemm) return 0;
    return cuda::conv2d_col_floats_per_image(p);
}

// The im2col columns for as many images as fit in `limit` bytes (at least one), on the layer's
// device: a Workspace tensor freed when the caller's pass ends. It comes from the device's pool
// even inside a step's arena scope: an arena would keep every layer's workspace until the step
// ends, while the pool hands the same block to the next layer.
Tensor column_workspace(const cpu::Conv2dParams& p, Device device, bool forward, int64_t limit, int64_t* images) {
    const int64_t per_image = col_floats_per_image(p, device, forward);
    *images = 0;
    if (per_image == 0 || p.N == 0) return Tensor();
    const int64_t per_image_bytes = per_image * int64_t(sizeof(float));
    *images = std::clamp<int64_t>(limit / per_image_bytes, 1, p.N);
    AllocatorScope from_pool(pool_allocator(device));
    return Tensor::empty({*images * per_image}, DType::F32, device, Category::Workspace);
}

float* ptr_or_null(Tensor& t) { return t.defined() ? t.data<float>() : nullptr; }

void check_f32(const Tensor& t, const std::string& layer, const char* what) {
    KILN_CHECK(t.dtype() == DType::F32, layer, ": ", what, " must be f32, got ", t.desc());
}

bool on_cuda(const Tensor& t) { return t.device() == Device::CUDA; }

}  // namespace

Tensor Conv2d::forward(const Tensor& x) {
    check_defined(x, name().c_str(), "input");
    const Shape out = output_shape(x.shape());
    check_f32(x, name(), "the input");
    check_on_device(weight.value, x.device(), name(), "the weight");  // the layer runs on x's device
    const cpu::Conv2dParams p = params_of(*this, x.shape());
    Tensor y = Tensor::empty(out, DType::F32, x.device(), Category::Activation);
    int64_t images = 0;
    Tensor col = column_workspace(p, x.device(), true, workspace_limit, &images);
    (on_cuda(x) ? cuda::conv2d_forward : cpu::conv2d_forward)(
        x.data<float>(), weight.value.data<float>(), bias.value.defined() ? bias.value.data<float>() : nullptr,
        y.data<float>(), p, ptr_or_null(col), images);
    if (training()) x_ = x;
    return y;
}

Tensor Conv2d::backward(const Tensor& dy) {
    KILN_CHECK(x_.defined(), name(), ": backward without a training-mode forward");
    const Shape out = output_shape(x_.shape());
    KILN_CHECK(dy.shape() == out, name(), ": dy should be ", out.str(), " (the forward output) but is ", dy.desc());
    check_f32(dy, name(), "dy");
    check_on_device(dy, x_.device(), name(), "dy");
    const cpu::Conv2dParams p = params_of(*this, x_.shape());
    int64_t images = 0;
    Tensor col = column_workspace(p, x_.device(), false, workspace_limit, &images);  // shared by the two passes
    // dw += Σ_n dy_n ⋆ x_n,  db += Σ dy
    (on_cuda(x_) ? cuda::conv2d_backward_weight : cpu::conv2d_backward_weight)(
        x_.data<float>(), dy.data<float>(), weight.grad.data<float>(),
        bias.value.defined() ? bias.grad.data<float>() : nullptr, p, ptr_or_null(col), images);
    if (!input_needs_grad) {  // e.g. the first layer: dx would be dL/d(image), which no one reads
        x_ = Tensor();
        return Tensor();
    }
    // dx = conv_transpose(dy, w)
    Tensor dx = Tensor::empty(x_.shape(), DType::F32, x_.device(), Category::Activation);
    (on_cuda(x_) ? cuda::conv2d_backward_data : cpu::conv2d_backward_data)(
        dy.data<float>(), weight.value.data<float>(), dx.data<float>(), p, ptr_or_null(col), images);
    x_ = Tensor();  // the cache is spent
    return dx;
}

}  // namespace kiln
