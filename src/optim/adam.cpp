// adam.cpp — Adam and AdamW (the rule is in adam.h, the per-element arithmetic in the
// adam_update kernels).
#include "optim/adam.h"

#include "ops/optim.h"

namespace kiln {

static std::vector<ParamGroup> one_group(std::vector<Parameter*> params, float lr, float weight_decay) {
    return {ParamGroup{std::move(params), lr, weight_decay}};
}

Adam::Adam(std::vector<Parameter*> params, float lr, Options options)
    : Adam(one_group(std::move(params), lr, options.weight_decay), options, false) {}

Adam::Adam(std::vector<ParamGroup> groups, Options options)
    : Adam(own_decay(std::move(groups), options.weight_decay, "Adam"), options, false) {}

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

AdamW::AdamW(std::vector<ParamGroup> groups, Options options)
    : Adam(own_decay(std::move(groups), options.weight_decay, "AdamW"), options, true) {}

Adam::Options AdamW::defaults() {
    Options o;
    o.weight_decay = 1e-2f;
    return o;
}

void Adam::create_moments() {
    exp_avg_ = state_slab(*this);
    exp_avg_sq_ = state_slab(*this);
    max_exp_avg_sq_ = opt_.amsgrad ? state_slab(*this) : std::vector<Tensor>();
}

void Adam::step() {
    update(std::vector<bool>(num_params(), true));
    steps_++;
}

AdamParams Adam::params_of(const ParamGroup& group, int64_t t) const {
    return AdamParams{group.lr, opt_.beta1, opt_.beta2, opt_.eps, group.weight_decay, decoupled_, t};
}

void Adam::step_scalars(const ParamGroup& group, int64_t t, float* out) const {
    const AdamParams a = params_of(group, t);
    out[0] = float(a.step_size()), out[1] = float(a.bias_correction2_sqrt()), out[2] = float(a.decay());
}

void Adam::update(const std::vector<bool>& which) {
    if (exp_avg_.empty()) create_moments();
    write_scalars_unless_capturing(steps_ + 1);
    size_t i = 0;  // the parameter's index over all groups: its moments
    for (size_t k = 0; k < groups_.size(); k++) {
        const ParamGroup& group = groups_[k];
        AdamParams a = params_of(group, steps_ + 1);
        a.scalars = scalars_of(k);
        std::vector<Tensor> w, g, m, v, v_max;
        for (Parameter* param : group.params) {
            if (which.at(i)) {
                w.push_back(param->value);
                g.push_back(param->grad);
                m.push_back(exp_avg_[i]);
                v.push_back(exp_avg_sq_[i]);
                if (opt_.amsgrad) v_max.push_back(max_exp_avg_sq_[i]);
            }
            i++;
        }
        if (!w.empty()) adam_update(w, g, m, v, v_max, a);
    }
}

void Adam::save_state(StateDict& state, const std::string& prefix) const {
    Optimizer::save_state(state, prefix);
    if (exp_avg_.empty()) return;  // no step yet: nothing else to keep
    size_t i = 0;
    for (const ParamGroup& group : groups_)
        for (const Parameter* param : group.params) {
            const std::string key = prefix + "." + param->name;
            state.put(key + ".exp_avg", exp_avg_[i]);
            state.put(key + ".exp_avg_sq", exp_avg_sq_[i]);
            if (opt_.amsgrad) state.put(key + ".max_exp_avg_sq", max_exp_avg_sq_[i]);
            i++;
        }
}

void Adam::load_state(const StateDict& state, const std::string& prefix) {
    Optimizer::load_state(state, prefix);
    exp_avg_.clear();
    exp_avg_sq_.clear();
    max_exp_avg_sq_.clear();
    if (steps_ == 0) return;
    create_moments();
    size_t i = 0;
    for (const ParamGroup& group : groups_)
        for (const Parameter* param : group.params) {
            const std::string key = prefix + "." + param->name;
            state.get_into(key + ".exp_avg", exp_avg_[i]);
            state.get_into(key + ".exp_avg_sq", exp_avg_sq_[i]);
            if (opt_.amsgrad) state.get_into(key + ".max_exp_avg_sq", max_exp_avg_sq_[i]);
            i++;
        }
}

}  // namespace kiln
