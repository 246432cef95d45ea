// optimizer.cpp — the optimizer base, SGD, weight-decay groups and gradient clipping (formulas in
// optimizer.h).
#include "optim/optimizer.h"

#include <cfloat>
#include <cmath>
#include <cstring>

#include "ops/ops.h"
#include "ops/optim.h"

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

void Optimizer::update(const std::vector<bool>& which) {
    (void)which;
    KILN_FAIL("this optimizer updates all its parameters in one step(): only SGD, Adam and AdamW update a part of "
              "them (what an offloaded optimizer does as backward finishes each bucket)");
}

size_t Optimizer::num_params() const {
    size_t n = 0;
    for (const ParamGroup& g : groups_) n += g.params.size();
    return n;
}

std::vector<Tensor> state_slab(const Optimizer& optimizer) {
    std::vector<Shape> shapes;
    Device device = Device::CPU;
    for (const ParamGroup& g : optimizer.param_groups())
        for (const Parameter* p : g.params) {
            shapes.push_back(p->value.shape());
            device = p->value.device();
        }
    return make_slab(shapes, DType::F32, device, Category::OptimizerState).views;
}

void Optimizer::step_scalars(const ParamGroup& group, int64_t t, float* out) const {
    (void)group, (void)t, (void)out;
    KILN_FAIL("optimizer: this one has no scalars in device memory (can_capture() is false)");
}

void Optimizer::make_capturable() {
    KILN_CHECK(can_capture(), "optimizer: this one cannot be captured in a CUDA Graph: only SGD, Adam and AdamW read "
               "their step's scalars (lr, bias corrections) from device memory");
    if (capturable()) return;
    const Device device = groups_.front().params.front()->value.device();
    scalars_ = Tensor::empty({int64_t(groups_.size()) * kScalars}, DType::F32, device, Category::OptimizerState);
    if (device == Device::CUDA) staging_ = std::make_shared<cuda::PinnedStaging>();
}

void Optimizer::write_scalars(int64_t t) {
    KILN_CHECK(capturable(), "optimizer: write_scalars before make_capturable");
    std::vector<float> host(groups_.size() * kScalars, 0.0f);
    for (size_t g = 0; g < groups_.size(); g++) step_scalars(groups_[g], t, host.data() + g * kScalars);
    const size_t bytes = host.size() * sizeof(float);
    if (!staging_) {
        std::memcpy(scalars_.raw(), host.data(), bytes);
        return;
    }
    staging_->begin(bytes);
    staging_->copy_to_device(scalars_.raw(), host.data(), bytes);
}

void Optimizer::write_scalars_unless_capturing(int64_t t) {
    if (capturable() && !cuda::capturing()) write_scalars(t);
}

const float* Optimizer::scalars_of(size_t group) const {
    return capturable() ? static_cast<const float*>(scalars_.raw()) + group * kScalars : nullptr;
}

void Optimizer::set_lr(float learning_rate) {
    for (ParamGroup& g : groups_) g.lr = learning_rate;
}

void Optimizer::save_state(StateDict& state, const std::string& prefix) const {
    state.set(prefix + ".steps", steps_);
    for (size_t g = 0; g < groups_.size(); g++) state.set(prefix + ".group" + std::to_string(g) + ".lr", double(groups_[g].lr));
}

// Every value checked before it is used: steps ≥ 0, lrs finite and ≥ 0, and no per-parameter
// state (a momentum buffer, a moment) with steps 0 — an optimizer makes its state at its first
// step, so such a pair means a damaged file, whose state would be silently dropped.
void Optimizer::load_state(const StateDict& state, const std::string& prefix) {
    steps_ = state.get_int(prefix + ".steps", 0, INT64_MAX);
    for (size_t g = 0; g < groups_.size(); g++)
        groups_[g].lr = float(state.get_double(prefix + ".group" + std::to_string(g) + ".lr", 0.0, FLT_MAX));
    const std::string head = prefix + ".";
    const auto first = state.tensors.lower_bound(head);
    KILN_CHECK(steps_ > 0 || first == state.tensors.end() || first->first.compare(0, head.size(), head) != 0,
               "state: value \"", prefix, ".steps\" is 0, yet the state holds \"", first->first,
               "\", which an optimizer makes at its first step (the checkpoint is corrupt, or was edited by hand?)");
}

SGD::SGD(std::vector<Parameter*> params, float learning_rate, Options options)
    : Optimizer(std::move(params), learning_rate, options.weight_decay), opt_(options) {
    check_options();
}

std::vector<ParamGroup> Optimizer::own_decay(std::vector<ParamGroup> groups, float options_weight_decay,
                                             const char* optimizer) {
    KILN_CHECK(options_weight_decay == 0.0f, optimizer, ": options.weight_decay = ", options_weight_decay,
               " given with parameter groups, which bring their own (ParamGroup::weight_decay, as decay_groups "
               "sets it): put it in the groups and leave the options' at 0");
    return groups;
}

SGD::SGD(std::vector<ParamGroup> groups, Options options)
    : Optimizer(own_decay(std::move(groups), options.weight_decay, "SGD")), opt_(options) {
    check_options();
}

void SGD::check_options() const {
    KILN_CHECK(opt_.momentum >= 0.0f && opt_.dampening >= 0.0f, "SGD: momentum and dampening must be ≥ 0");
    KILN_CHECK(!opt_.nesterov || (opt_.momentum > 0.0f && opt_.dampening == 0.0f),
               "SGD: Nesterov momentum needs momentum > 0 and dampening = 0 (as in PyTorch)");
}

void SGD::step() {
    update(std::vector<bool>(num_params(), true));
    steps_++;
}

// The first step (no buffer yet, or one made by this step's earlier part) sets buf = g.
void SGD::update(const std::vector<bool>& which) {
    const bool first = buf_.empty() || steps_ == 0;
    if (buf_.empty() && opt_.momentum != 0.0f) buf_ = state_slab(*this);
    write_scalars_unless_capturing(steps_ + 1);
    size_t i = 0;  // the parameter's index over all groups: its buffer
    for (size_t k = 0; k < groups_.size(); k++) {
        const ParamGroup& group = groups_[k];
        std::vector<Tensor> w, g, buf;
        for (Parameter* param : group.params) {
            if (which.at(i)) {
                w.push_back(param->value);
                g.push_back(param->grad);
                if (!buf_.empty()) buf.push_back(buf_[i]);
            }
            i++;
        }
        if (!w.empty())
            sgd_update(w, g, buf,
                       SgdParams{group.lr, opt_.momentum, opt_.dampening, group.weight_decay, opt_.nesterov, first,
                                 scalars_of(k)});
    }
}

void SGD::step_scalars(const ParamGroup& group, int64_t t, float* out) const {
    (void)t;
    out[0] = group.lr;
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
    buf_ = state_slab(*this);
    size_t i = 0;
    for (const ParamGroup& group : groups_)
        for (const Parameter* param : group.params)
            state.get_into(prefix + "." + param->name + ".momentum_buffer", buf_[i++]);
}

std::vector<ParamGroup> decay_groups(Module& model, float lr, float weight_decay) {
    ParamGroup decay{{}, lr, weight_decay}, no_decay{{}, lr, 0.0f};
    for (Parameter* p : model.parameters()) (p->value.ndim() >= 2 ? decay : no_decay).params.push_back(p);
    std::vector<ParamGroup> groups;
    for (ParamGroup* g : {&decay, &no_decay})
        if (!g->params.empty()) groups.push_back(std::move(*g));
    return groups;
}

double grad_squares(const std::vector<Parameter*>& params) {
    double squares = 0.0;
    for (const Parameter* p : params) squares += sum_squares(p->grad);
    return squares;
}

float clip_grad_norm(const std::vector<Parameter*>& params, float max_norm) {
    std::vector<Tensor> grads;
    for (const Parameter* p : params) grads.push_back(p->grad);
    return clip_to_norm(grads, grad_squares(params), max_norm);
}

float clip_factor(double squares, float max_norm) {
    KILN_CHECK(max_norm > 0.0f, "clip_grad_norm: max_norm must be > 0, got ", max_norm);
    const double total = std::sqrt(squares);
    if (!std::isfinite(total)) return 1.0f;  // inf or NaN: nothing to scale by
    const double coef = double(max_norm) / (total + 1e-6);
    return coef < 1.0 ? float(coef) : 1.0f;
}

float clip_to_norm(const std::vector<Tensor>& grads, double squares, float max_norm) {
    const float factor = clip_factor(squares, max_norm);
    if (factor < 1.0f)
        for (Tensor g : grads) scale_(g, factor);  // (a Tensor is a handle: g shares the gradient's bytes)
    return float(std::sqrt(squares));
}

float Optimizer::clip_gradients(const std::vector<Parameter*>& params, float max_norm) {
    return clip_grad_norm(params, max_norm);
}

}  // namespace kiln
