// optimizer.cpp — the optimizer base, SGD, weight-decay groups and gradient clipping (formulas in
// optimizer.h).
#include "optim/optimizer.h"

#include <cmath>

#include "ops/cpu/cpu_ops.h"
#include "ops/cuda_ops.h"
#include "ops/ops.h"

namespace kiln {

Optimizer::Optimizer(std::vector<Parameter*> params, float learning_rate, float weight_decay)
    : Optimizer(std::vector<ParamGroup>{ParamGroup{std::move(params), learning_rate, weight_decay}}) {}

Optimizer::Optimizer(std::vector<ParamGroup> groups) : groups_(std::move(groups)) {
    KILN_CHECK(!groups_.empty(), "optimizer: no parameter groups");
    for (size_t g = 0; g < groups_.size(); g++) {
        KILN_CHECK(!groups_[g].params.empty(), "optimizer: parameter group ", g, " is empty");
        KILN_CHECK(groups_[g].lr >= 0.0f && groups_[g].weight_decay >= 0.0f, "optimizer: group ", g,
                   ": learning rate and weight decay must be ≥ 0, got lr ", groups_[g].lr, ", weight_decay ",
                   groups_[g].weight_decay);
    }
}

void Optimizer::zero_grad() {
    for (ParamGroup& g : groups_)
        for (Parameter* p : g.params) fill_(p->grad, 0.0f);
}

void Optimizer::set_lr(float learning_rate) {
    for (ParamGroup& g : groups_) g.lr = learning_rate;
}

void Optimizer::save_state(StateDict& state, const std::string& prefix) const {
    state.set(prefix + ".steps", steps_);
    for (size_t g = 0; g < groups_.size(); g++) state.set(prefix + ".group" + std::to_string(g) + ".lr", double(groups_[g].lr));
}

void Optimizer::load_state(const StateDict& state, const std::string& prefix) {
    steps_ = state.get_int(prefix + ".steps");
    for (size_t g = 0; g < groups_.size(); g++)
        groups_[g].lr = float(state.get_double(prefix + ".group" + std::to_string(g) + ".lr"));
}

SGD::SGD(std::vector<Parameter*> params, float learning_rate, Options options)
    : Optimizer(std::move(params), learning_rate, options.weight_decay), opt_(options) {
    check_options();
}

SGD::SGD(std::vector<ParamGroup> groups, Options options) : Optimizer(std::move(groups)), opt_(options) {
    check_options();
}

void SGD::check_options() const {
    KILN_CHECK(opt_.momentum >= 0.0f && opt_.dampening >= 0.0f, "SGD: momentum and dampening must be ≥ 0");
    KILN_CHECK(!opt_.nesterov || (opt_.momentum > 0.0f && opt_.dampening == 0.0f),
               "SGD: Nesterov momentum needs momentum > 0 and dampening = 0 (as in PyTorch)");
}

void SGD::step() {
    bool first = buf_.empty();
    size_t i = 0;  // the parameter's index over all groups: its buffer
    for (ParamGroup& group : groups_) {
        for (Parameter* param : group.params) {
            Tensor& w = param->value;
            const Tensor& g = param->grad;
            check_same_device(w, g, "SGD::step");
            if (first && opt_.momentum != 0.0f)
                buf_.push_back(Tensor::zeros(w.shape(), DType::F32, w.device(), Category::OptimizerState));
            float* buf = opt_.momentum != 0.0f ? buf_[i].data<float>() : nullptr;
            auto update = w.device() == Device::CUDA ? cuda::sgd_update : cpu::sgd_update;
            update(w.data<float>(), g.data<float>(), buf, w.numel(), group.lr, opt_.momentum, opt_.dampening,
                   group.weight_decay, opt_.nesterov, first);
            i++;
        }
    }
    steps_++;
}

// Keys: <prefix>.steps, <prefix>.group<g>.lr, <prefix>.<parameter name>.momentum_buffer
void SGD::save_state(StateDict& state, const std::string& prefix) const {
    Optimizer::save_state(state, prefix);
    size_t i = 0;
    for (const ParamGroup& group : groups_)
        for (const Parameter* param : group.params) {
            if (i < buf_.size()) state.put(prefix + "." + param->name + ".momentum_buffer", buf_[i]);
            i++;
        }
}

void SGD::load_state(const StateDict& state, const std::string& prefix) {
    Optimizer::load_state(state, prefix);
    buf_.clear();
    if (opt_.momentum == 0.0f || steps_ == 0) return;
    for (const ParamGroup& group : groups_)
        for (const Parameter* param : group.params) {
            const Tensor& w = param->value;
            buf_.push_back(Tensor::zeros(w.shape(), DType::F32, w.device(), Category::OptimizerState));
            state.get_into(prefix + "." + param->name + ".momentum_buffer", buf_.back());
        }
}

std::vector<ParamGroup> decay_groups(Module& model, float lr, float weight_decay) {
    ParamGroup decay{{}, lr, weight_decay}, no_decay{{}, lr, 0.0f};
    for (Parameter* p : model.parameters()) (p->value.ndim() >= 2 ? decay : no_decay).params.push_back(p);
    std::vector<ParamGroup> groups;
    for (ParamGroup* g : {&decay, &no_decay})
        if (!g->params.empty()) groups.push_back(std::move(*g));
    return groups;
}

float clip_grad_norm(const std::vector<Parameter*>& params, float max_norm) {
    KILN_CHECK(max_norm > 0.0f, "clip_grad_norm: max_norm must be > 0, got ", max_norm);
    double squares = 0.0;
    for (const Parameter* p : params) squares += sum_squares(p->grad);
    const double total = std::sqrt(squares);
    if (!std::isfinite(total)) return float(total);  // inf or NaN: nothing to scale by
    const double coef = double(max_norm) / (total + 1e-6);
    if (coef < 1.0)
        for (Parameter* p : params) scale_(p->grad, float(coef));
    return float(total);
}

}  // namespace kiln
