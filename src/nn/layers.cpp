// layers.cpp — Linear, ReLU and ReLU6, Flatten, Sequential, CrossEntropyLoss.
#include "nn/layers.h"

#include <algorithm>
#include <cmath>

#include "ops/loss.h"
#include "ops/ops.h"

namespace kiln {

// ---- Linear --------------------------------------------------------------------------------
Linear::Linear(int64_t in, int64_t out, Rng& rng, bool has_bias, std::string name)
    : Module(std::move(name)), in_features(in), out_features(out) {
    KILN_CHECK(in > 0 && out > 0, "Linear(", in, ", ", out, "): sizes must be positive");
    float bound = 1.0f / std::sqrt(float(in));
    add_parameter("weight", weight, Tensor::uniform({out, in}, -bound, bound, rng, Device::CPU, Category::Parameter));
    if (has_bias)
        add_parameter("bias", bias, Tensor::uniform({out}, -bound, bound, rng, Device::CPU, Category::Parameter));
}

namespace {

// x [..., in]: the rows of a Linear's input (every dimension but the last); fails naming the layer.
int64_t linear_rows(const Shape& x, int64_t in, const std::string& layer) {
    KILN_CHECK(x.ndim >= 2 && x[x.ndim - 1] == in, layer, ": expected input [N, ", in, "] or [..., ", in, "], got ",
               x.str(), " (a Flatten before it turns [N, C, H, W] into [N, C·H·W])");
    return x.numel() / in;
}

// `s` with its last dimension replaced by n.
Shape with_last(Shape s, int64_t n) {
    s.dims[s.ndim - 1] = n;
    return s;
}

}  // namespace

// [..., in] is [rows, in] to the op, and y goes back to [..., out] (views: no copy).
Tensor Linear::forward(const Tensor& x) {
    check_defined(x, name().c_str(), "the input");
    const int64_t rows = linear_rows(x.shape(), in_features, name());
    if (keeps_cache()) in_shape_ = x.shape();
    const Tensor y = linear(x.reshape({rows, in_features}), weight.used(), bias.used(), keeps_cache() ? &x_ : nullptr);
    return x.ndim() == 2 ? y : y.reshape(with_last(x.shape(), out_features));  // y = x · Wᵀ + b
}

// dW += dyᵀ · x,  db += Σ_n dy,  dx = dy · W unless no one reads it; the cache is spent.
Tensor Linear::backward(const Tensor& dy) {
    KILN_CHECK(x_.defined(), name(), ": backward without a training-mode forward");
    const Tensor dx = linear_backward(std::move(x_), weight.used(), dy.reshape({-1, out_features}), weight.grad,
                                      bias.grad, input_needs_grad);
    return dx.defined() && in_shape_.ndim != 2 ? dx.reshape(in_shape_) : dx;
}

// x [..., in] -> y [..., out]; weight [out, in], bias [out]; x kept; dx after x is let go.
LayerMemory Linear::memory(const Shape& in, Device) const {
    linear_rows(in, in_features, name());
    LayerMemory m;
    m.output = with_last(in, out_features);
    m.parameters.push_back(Shape{out_features, in_features});
    if (bias.value.defined()) m.parameters.push_back(Shape{out_features});
    m.keeps_input = true;
    m.releases_before_dx = true;
    return m;
}

// ---- ReLU, ReLU6 ---------------------------------------------------------------------------
CappedReLU::CappedReLU(Mode mode, float cap, std::string name) : Module(std::move(name)), mode(mode), cap_(cap) {}

ReLU::ReLU(Mode mode, std::string name) : CappedReLU(mode, kNoCap, std::move(name)) {}

ReLU6::ReLU6(Mode mode, std::string name) : CappedReLU(mode, 6.0f, std::move(name)) {}

Tensor CappedReLU::forward(const Tensor& x) {
    Tensor y = x;  // in place: y is x's bytes, overwritten
    if (mode == InPlace) relu_(y, cap_);
    else y = relu(x, cap_);
    if (keeps_cache()) y_ = y;
    return y;
}

Tensor CappedReLU::backward(const Tensor& dy) {
    KILN_CHECK(y_.defined(), name(), ": backward without a training-mode forward");
    Tensor y = y_;
    y_ = Tensor();
    if (!dy.defined()) return Tensor();  // no one needs dx (input_needs_grad below us is false)
    return relu_backward(y, dy, cap_);
}

// y [in] kept instead of x; in place, y is written over x (no y allocated).
LayerMemory CappedReLU::memory(const Shape& in, Device) const {
    LayerMemory m;
    m.output = in;
    m.in_place = mode == InPlace;
    m.keeps_output = true;
    return m;
}

// ---- Flatten -------------------------------------------------------------------------------
Tensor Flatten::forward(const Tensor& x) {
    KILN_CHECK(x.ndim() >= 2, name(), ": needs at least [N, ...], got ", x.desc());
    in_shape_ = x.shape();
    return x.reshape({x.size(0), -1});
}

// An undefined dy (no one needs dx: input_needs_grad below us is false) gives an undefined dx.
Tensor Flatten::backward(const Tensor& dy) { return dy.defined() ? dy.reshape(in_shape_) : Tensor(); }

// [N, ...] -> [N, rest], a view of x.
LayerMemory Flatten::memory(const Shape& in, Device) const {
    KILN_CHECK(in.ndim >= 2, name(), ": needs at least [N, ...], got ", in.str());
    LayerMemory m;
    m.output = Shape{in[0], in.numel() / std::max<int64_t>(in[0], 1)};
    m.output_is_view = true;
    return m;
}

// ---- Sequential ----------------------------------------------------------------------------
Tensor Sequential::forward(const Tensor& x) {
    Tensor h = x;
    for (const Child& c : children()) h = c.module->call(h);
    return h;
}

Tensor Sequential::backward(const Tensor& dy) {
    // Child i needs dL/d(its input) if our input needs it or a child before it has parameters.
    bool needed = input_needs_grad;
    for (const Child& c : children()) {
        c.module->input_needs_grad = needed;
        needed = needed || c.module->has_parameters();
    }
    Tensor g = dy;
    for (auto it = children().rbegin(); it != children().rend(); ++it) g = it->module->call_backward(g);
    return g;
}

// ---- CrossEntropyLoss ----------------------------------------------------------------------
// Labels [B, T] (a sequence's next tokens) as [B·T], the rows of logits [B·T, V].
static Tensor label_rows(const Tensor& labels) {
    return labels.defined() && labels.ndim() > 1 ? labels.reshape({-1}) : labels;
}

float CrossEntropyLoss::forward(const Tensor& logits, const Tensor& labels, int64_t* correct) {
    logits_dtype_ = logits.dtype();
    return softmax_cross_entropy(logits, label_rows(labels), &dz_, correct, label_smoothing_);
}

void CrossEntropyLoss::forward_into(const Tensor& logits, const Tensor& labels, LossTotals* totals) {
    logits_dtype_ = logits.dtype();
    softmax_cross_entropy_into(logits, label_rows(labels), &dz_, label_smoothing_, totals);
}

Tensor CrossEntropyLoss::backward(float scale) {
    KILN_CHECK(dz_.defined(), "CrossEntropyLoss: backward() before forward()");
    Tensor dz = dz_;
    dz_ = Tensor();
    if (scale != 1.0f) scale_(dz, scale);
    return dz.to(logits_dtype_);
}

}  // namespace kiln
