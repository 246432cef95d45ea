// adam.cpp — Adam and AdamW (the rule is in adam.h, the per-element arithmetic in the
// adam_update kernels).
#include "optim/adam.h"

#include "ops/cpu/cpu_ops.h"
#include "ops/cuda_ops.h"

namespace kiln {

static std::vector<ParamGroup> one_group(std::vector<Parameter*> params, float lr, float weight_decay) {
    return {ParamGroup{std::move(params), lr, weight_decay}};
}

Adam::Adam(std::vector<Parameter*> params, float lr, Options options)
    : Adam(one_group(std::move(params), lr, options.weight_decay), options, false) {}

Adam::Adam(std::vector<ParamGroup> groups, Options options) : Adam(std::move(groups), options, false) {}

Adam::Adam(std::vector<ParamGroup> groups, Options options, bool decoupled)
    : Optimizer(std::move(groups)), opt_(options), decoupled_(decoupled) {
    KILN_CHECK(opt_.beta1 >= 0.0f && opt_.beta1 < 1.0f && opt_.beta2 >= 0.0f && opt_.beta2 < 1.0f, name(),
               ": betas must be in [0, 1), got beta1 ", opt_.beta1, ", beta2 ", opt_.beta2,
               " (PyTorch's defaults are 0.9 and 0.999)");
    // PyTorch accepts eps = 0, but then a parameter whose gradient has always been 0 gets 0 / 0.
    KILN_CHECK(opt_.eps > 0.0f, name(), ": eps must be > 0, got ", opt_.eps, " (PyTorch's default is 1e-8)");
}

AdamW::AdamW(std::vector<Parameter*> params, float lr, Options options)
    : Adam(one_group(std::move(params), lr, options.weight_decay), options, true) {}

AdamW::AdamW(std::vector<ParamGroup> groups, Options options) : Adam(std::move(groups), options, true) {}

Adam::Options AdamW::defaults() {
    Options o;
    o.weight_decay = 1e-2f;
    return o;
}

void Adam::create_moments() {
    moments_.clear();
    for (const ParamGroup& group : groups_)
        for (const Parameter* param : group.params) {
            const Tensor& w = param->value;
            auto zeros = [&] { return Tensor::zeros(w.shape(), DType::F32, w.device(), Category::OptimizerState); };
            moments_.push_back({zeros(), zeros(), opt_.amsgrad ? zeros() : Tensor()});
        }
}

void Adam::step() {
    if (moments_.empty()) create_moments();
    size_t i = 0;  // the parameter's index over all groups: its moments
    for (ParamGroup& group : groups_) {
        const cpu::AdamParams a{group.lr, opt_.beta1, opt_.beta2, opt_.eps, group.weight_decay, decoupled_,
                                steps_ + 1};
        for (Parameter* param : group.params) {
            Tensor& w = param->value;
            const Tensor& g = param->grad;
            check_same_device(w, g, decoupled_ ? "AdamW::step" : "Adam::step");
            Moments& s = moments_[i++];
            float* v_max = opt_.amsgrad ? s.max_exp_avg_sq.data<float>() : nullptr;
            auto update = w.device() == Device::CUDA ? cuda::adam_update : cpu::adam_update;
            update(w.data<float>(), g.data<float>(), s.exp_avg.data<float>(), s.exp_avg_sq.data<float>(), v_max,
                   w.numel(), a);
        }
    }
    steps_++;
}

void Adam::save_state(StateDict& state, const std::string& prefix) const {
    Optimizer::save_state(state, prefix);
    if (moments_.empty()) return;  // no step yet: nothing else to keep
    size_t i = 0;
    for (const ParamGroup& group : groups_)
        for (const Parameter* param : group.params) {
            const Moments& s = moments_[i++];
            const std::string key = prefix + "." + param->name;
            state.put(key + ".exp_avg", s.exp_avg);
            state.put(key + ".exp_avg_sq", s.exp_avg_sq);
            if (opt_.amsgrad) state.put(key + ".max_exp_avg_sq", s.max_exp_avg_sq);
        }
}

void Adam::load_state(const StateDict& state, const std::string& prefix) {
    Optimizer::load_state(state, prefix);
    moments_.clear();
    if (steps_ == 0) return;
    create_moments();
    size_t i = 0;
    for (const ParamGroup& group : groups_)
        for (const Parameter* param : group.params) {
            Moments& s = moments_[i++];
            const std::string key = prefix + "." + param->name;
            state.get_into(key + ".exp_avg", s.exp_avg);
            state.get_into(key + ".exp_avg_sq", s.exp_avg_sq);
            if (opt_.amsgrad) state.get_into(key + ".max_exp_avg_sq", s.max_exp_avg_sq);
        }
}

}  // namespace kiln
