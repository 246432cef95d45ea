// adam.h — Adam and AdamW (chapter 07), with PyTorch's semantics. The per-element work is one
// fused op per parameter group, adam_update (src/ops/optim.h: the kernels cpu/optim.cpp and
// cuda/optim.cu), which serves both optimizers and AMSGrad.
//
// Memory kept per parameter, in units of the weights (Category::OptimizerState):
//   SGD without momentum 0×, SGD with momentum 1× (the buffer),
//   Adam and AdamW 2× (exp_avg m and exp_avg_sq v), 3× with AMSGrad (max_exp_avg_sq v_max).
// So training with Adam holds 4× the weights (weights, grads, m, v) before any activation.
#pragma once
#include <string>
#include <vector>

#include "optim/optimizer.h"

namespace kiln {

struct AdamParams;  // ops/optim.h

// Adam (torch.optim.Adam). At step t = 1, 2, ..., for each parameter p with gradient g, m and v
// starting at 0:
//   g     = g + weight_decay · p                  (L2 penalty, added to the gradient)
//   m     = β1 · m + (1 − β1) · g                 (exp_avg: running mean of g)
//   v     = β2 · v + (1 − β2) · g²                (exp_avg_sq: running mean of g², elementwise)
//   v_max = max(v_max, v)                         (AMSGrad only; then v_max replaces v below)
//   denom = sqrt(v) / sqrt(1 − β2^t) + eps
//   p     = p − lr / (1 − β1^t) · m / denom
// That is p −= lr · m̂ / (sqrt(v̂) + eps) with the bias-corrected m̂ = m / (1 − β1^t) and
// v̂ = v / (1 − β2^t) (m and v start at 0, so early on they underestimate; the corrections undo
// it), written the way PyTorch's single-tensor implementation computes it, so the two round alike.
//
// AdamW (torch.optim.AdamW, "decoupled weight decay") replaces the L2 line by a decay of the
// weights before the step, then runs the same rule with g = grad:
//   p     = p − lr · weight_decay · p
// With Adam's L2 the decay term is divided by sqrt(v̂) like the gradient, so weights with large
// gradients are barely decayed; AdamW shrinks every weight by the same factor 1 − lr·wd.
class Adam : public Optimizer {
public:
    // Named, PyTorch's keywords: Adam::Options{}.with_betas(0.9f, 0.99f).with_amsgrad(); a field
    // left out keeps PyTorch's default. Not an aggregate: positional braces do not compile.
    struct Options {
        Options() {}
        float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
        bool amsgrad = false;
        Options& with_betas(float b1, float b2) { return beta1 = b1, beta2 = b2, *this; }
        Options& with_eps(float e) { return eps = e, *this; }
        Options& with_weight_decay(float wd) { return weight_decay = wd, *this; }
        Options& with_amsgrad(bool on = true) { return amsgrad = on, *this; }
    };
    Adam(std::vector<Parameter*> params, float lr, Options options);
    Adam(std::vector<Parameter*> params, float lr) : Adam(std::move(params), lr, Options{}) {}
    // Groups bring their own lr and weight_decay; options.weight_decay must be 0 (else refused).
    Adam(std::vector<ParamGroup> groups, Options options);
    void step() override;
    void update(const std::vector<bool>& which) override;
    bool can_capture() const override { return true; }
    std::vector<Tensor> state_of(size_t i) const override {  // m, v (and v_max with AMSGrad)
        std::vector<Tensor> state;
        for (const std::vector<Tensor>* moments : {&exp_avg_, &exp_avg_sq_, &max_exp_avg_sq_})
            if (i < moments->size()) state.push_back((*moments)[i]);
        return state;
    }
    // Keys: those of Optimizer::save_state, and <prefix>.<parameter name>.exp_avg, .exp_avg_sq
    // (and .max_exp_avg_sq with AMSGrad) once a step has been taken.
    void save_state(StateDict& state, const std::string& prefix) const override;
    void load_state(const StateDict& state, const std::string& prefix) override;
    const Options& options() const { return opt_; }
    bool decoupled() const { return decoupled_; }

protected:
    Adam(std::vector<ParamGroup> groups, Options options, bool decoupled);
    // step size lr / (1 − β1^t), sqrt(1 − β2^t), AdamW's 1 − lr·wd: AdamParams' three, as floats
    void step_scalars(const ParamGroup& group, int64_t t, float* out) const override;

private:
    Options opt_;
    bool decoupled_;
    // One per parameter (groups in order), each list a slab (state_slab), created on the first
    // step; max_exp_avg_sq stays empty without AMSGrad.
    std::vector<Tensor> exp_avg_, exp_avg_sq_, max_exp_avg_sq_;

    const char* name() const { return decoupled_ ? "AdamW" : "Adam"; }
    AdamParams params_of(const ParamGroup& group, int64_t t) const;
    void create_moments();  // zeros, on the parameters' device
};

// AdamW: Adam with decoupled weight decay (the rule is above Adam).
class AdamW : public Adam {
public:
    // PyTorch's defaults for AdamW: Adam's, with weight_decay = 1e-2 instead of 0.
    static Options defaults();
    AdamW(std::vector<Parameter*> params, float lr, Options options);
    AdamW(std::vector<Parameter*> params, float lr) : AdamW(std::move(params), lr, defaults()) {}
    AdamW(std::vector<ParamGroup> groups, Options options);
};

}  // namespace kiln
