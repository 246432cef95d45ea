// conv.cpp — Conv2d: its parameters, the layer's checks (which name the layer), the cache, and
// the calls to the ops conv2d and conv2d_backward (ops/conv.h), which size the workspace and run
// the kernels of the input's device: src/ops/cpu/conv.cpp (which explains im2col, the direct
// paths and the threads) or cuda/conv.cu (im2col + GEMM and the implicit GEMM).
#include "nn/conv.h"

#include <cmath>

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
Conv2dArgs args_of(const Conv2d& m) {
    Conv2dArgs a;
    a.stride = m.options.stride, a.padding = m.options.padding, a.dilation = m.options.dilation;
    a.groups = m.options.groups, a.workspace_limit = m.workspace_limit;
    return a;
}
}  // namespace

// y, the parameters, x kept, and the workspace of each pass as conv2d and conv2d_backward take it.
LayerMemory Conv2d::memory(const Shape& in, Device device) const {
    LayerMemory m;
    m.output = output_shape(in);
    m.parameters.push_back(Shape{out_channels, in_channels / options.groups, kernel_h, kernel_w});
    if (bias.value.defined()) m.parameters.push_back(Shape{out_channels});
    m.keeps_input = true;
    Conv2dParams p;
    p.N = in[0], p.C = in[1], p.H = in[2], p.W = in[3];
    p.O = out_channels, p.KH = kernel_h, p.KW = kernel_w;
    p.stride = options.stride, p.padding = options.padding, p.dilation = options.dilation, p.groups = options.groups;
    m.forward_workspace = conv2d_workspace(p, device, true, workspace_limit).bytes();
    m.backward_workspace = conv2d_workspace(p, device, false, workspace_limit).bytes();
    m.backward_scratch = conv2d_backward_scratch(p, device);
    return m;
}

Tensor Conv2d::forward(const Tensor& x) {
    check_defined(x, name().c_str(), "input");
    output_shape(x.shape());                                          // checks x's shape, naming the layer
    check_on_device(weight.value, x.device(), name(), "the weight");  // the layer runs on x's device
    return conv2d(x, weight.used(), bias.used(), args_of(*this), keeps_cache() ? &x_ : nullptr);
}

Tensor Conv2d::backward(const Tensor& dy) {
    KILN_CHECK(x_.defined(), name(), ": backward without a training-mode forward");
    const Shape out = output_shape(x_.shape());
    KILN_CHECK(dy.shape() == out, name(), ": dy should be ", out.str(), " (the forward output) but is ", dy.desc());
    check_on_device(dy, x_.device(), name(), "dy");
    // dw += Σ_n dy_n ⋆ x_n,  db += Σ dy;  dx = conv_transpose(dy, w) unless no one needs it (e.g. the
    // first layer: dx would be dL/d(image), which no one reads).
    Tensor dx = conv2d_backward(x_, weight.used(), dy, weight.grad, bias.grad, input_needs_grad, args_of(*this));
    x_ = Tensor();  // the cache is spent
    return dx;
}

void set_conv_workspace_limit(Module& model, int64_t bytes) {
    KILN_CHECK(bytes > 0, "the convolution workspace limit must be positive, got ", bytes, " bytes");
    for (auto& [name, m] : model.named_modules())
        if (auto* conv = dynamic_cast<Conv2d*>(m)) conv->workspace_limit = bytes;
}

}  // namespace kiln
