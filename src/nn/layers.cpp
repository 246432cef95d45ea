// layers.cpp — Linear, ReLU, Flatten, Sequential, CrossEntropyLoss.
#include "nn/layers.h"

#include <cmath>

#include "ops/ops.h"

namespace kiln {

// ---- Linear --------------------------------------------------------------------------------
Linear::Linear(int64_t in, int64_t out, Rng& rng, bool has_bias, std::string name)
    : Module(std::move(name)), in_features(in), out_features(out) {
    KILN_CHECK(in > 0 && out > 0, "Linear(", in, ", ", out, "): sizes must be positive");
    float bound = 1.0f / std::sqrt(float(in));
    weight = make_parameter(this->name() + ".weight",
                            Tensor::uniform({out, in}, -bound, bound, rng, Device::CPU, Category::Parameter));
    if (has_bias)
        bias = make_parameter(this->name() + ".bias",
                              Tensor::uniform({out}, -bound, bound, rng, Device::CPU, Category::Parameter));
}

Tensor Linear::forward(const Tensor& x) {
    KILN_CHECK(x.ndim() == 2 && x.size(1) == in_features, name(), ": expected input [N, ", in_features, "], got ",
               x.desc(), " (a Flatten before it turns [N, C, H, W] into [N, C·H·W])");
    Tensor y = matmul(x, weight.value, false, true);  // [N, in] · [in, out]
    if (bias.value.defined()) add_bias_(y, bias.value);
    if (training()) x_ = x;
    return y;
}

Tensor Linear::backward(const Tensor& dy) {
    KILN_CHECK(x_.defined(), name(), ": backward without a training-mode forward");
    matmul_into(dy, true, x_, false, weight.grad, 1.0f, 1.0f);  // dW += dyᵀ · x   [out, in]
    if (bias.value.defined()) sum_rows_into(dy, bias.grad, 1.0f);  // db += Σ_n dy
    x_ = Tensor();                                                   // the cache is spent
    if (!input_needs_grad) return Tensor();                          // no one reads dx
    return matmul(dy, weight.value);                                 // dx = dy · W  [N, out] · [out, in]
}

std::vector<Parameter*> Linear::parameters() {
    if (bias.value.defined()) return {&weight, &bias};
    return {&weight};
}

// ---- ReLU ----------------------------------------------------------------------------------
Tensor ReLU::forward(const Tensor& x) {
    Tensor y = relu(x);
    if (training()) y_ = y;
    return y;
}

Tensor ReLU::backward(const Tensor& dy) {
    KILN_CHECK(y_.defined(), name(), ": backward without a training-mode forward");
    Tensor dx = relu_backward(y_, dy);
    y_ = Tensor();
    return dx;
}

// ---- Flatten -------------------------------------------------------------------------------
Tensor Flatten::forward(const Tensor& x) {
    KILN_CHECK(x.ndim() >= 2, name(), ": needs at least [N, ...], got ", x.desc());
    in_shape_ = x.shape();
    return x.reshape({x.size(0), -1});
}

Tensor Flatten::backward(const Tensor& dy) { return dy.reshape(in_shape_); }

// ---- Sequential ----------------------------------------------------------------------------
Tensor Sequential::forward(const Tensor& x) {
    Tensor h = x;
    for (auto& m : children_) h = m->forward(h);
    return h;
}

Tensor Sequential::backward(const Tensor& dy) {
    if (!children_.empty()) children_.front()->input_needs_grad = input_needs_grad;  // our input is its input
    Tensor g = dy;
    for (auto it = children_.rbegin(); it != children_.rend(); ++it) g = (*it)->backward(g);
    return g;
}

std::vector<Parameter*> Sequential::parameters() {
    std::vector<Parameter*> all;
    for (auto& m : children_)
        for (Parameter* p : m->parameters()) all.push_back(p);
    return all;
}

std::vector<std::pair<std::string, Tensor*>> Sequential::buffers() {
    std::vector<std::pair<std::string, Tensor*>> all;
    for (auto& m : children_)
        for (auto& b : m->buffers()) all.push_back(b);
    return all;
}

void Sequential::train(bool on) {
    Module::train(on);
    for (auto& m : children_) m->train(on);
}

// ---- CrossEntropyLoss ----------------------------------------------------------------------
float CrossEntropyLoss::forward(const Tensor& logits, const Tensor& labels) {
    return softmax_cross_entropy(logits, labels, &dz_);
}

Tensor CrossEntropyLoss::backward() {
    KILN_CHECK(dz_.defined(), "CrossEntropyLoss: backward() before forward()");
    Tensor dz = dz_;
    dz_ = Tensor();
    return dz;
}

}  // namespace kiln
