// optim.h — the optimizers' updates as Tensor ops: one call updates a whole parameter group
// (PyTorch's foreach / fused optimizers). Each op checks the group's tensors once (f32, one
// device, matching shapes) and walks its segments — one parameter and the tensors beside it —
// with the kernel of their device: ops/cpu/optim.cpp or cuda/optim.cu. When the parameters live
// in a slab (Module::pack) and the state in one laid out alike, the segments are consecutive
// pieces of the same few buffers.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

namespace kiln {

class Tensor;

// PyTorch's SGD, per element:
//   g = grad + wd·p;  buf = first ? g : momentum·buf + (1 − dampening)·g;
//   g = nesterov ? g + momentum·buf : buf   (when momentum ≠ 0);   p −= lr·g
struct SgdParams {
    float lr, momentum, dampening, weight_decay;
    bool nesterov;
    bool first_step;  // buf := g (the buffers start as the first gradient)
};

// One step of PyTorch's Adam or AdamW (the rule, and what each buffer is: src/optim/adam.h):
// Adam: g = grad + wd·p, AdamW: p = decay·p;  m = β1·m + (1 − β1)·g;  v = β2·v + (1 − β2)·g²;
// v_max = max(v_max, v) with AMSGrad (v_max then replaces v below);
// p −= step_size · m / (sqrt(v) / bias_correction2_sqrt + eps)
struct AdamParams {
    float lr, beta1, beta2, eps, weight_decay;
    bool decoupled;  // AdamW: p = p·(1 − lr·wd) before the step; Adam: g = grad + wd·p
    int64_t step;    // t = 1, 2, ...: this update's number, for the bias corrections
    // The step's scalars, in double as PyTorch computes them (from Python floats):
    // lr / (1 − β1^t),  sqrt(1 − β2^t),  and AdamW's factor on p, 1 − lr·wd.
    double step_size() const { return double(lr) / (1.0 - std::pow(double(beta1), double(step))); }
    double bias_correction2_sqrt() const { return std::sqrt(1.0 - std::pow(double(beta2), double(step))); }
    double decay() const { return 1.0 - double(lr) * double(weight_decay); }
};

// params[i] is updated in place from grads[i] and bufs[i] (momentum buffers; empty when
// momentum = 0), for every i.
void sgd_update(const std::vector<Tensor>& params, const std::vector<Tensor>& grads, const std::vector<Tensor>& bufs,
                const SgdParams& s);

// params[i] is updated in place from grads[i], exp_avg[i] (m), exp_avg_sq[i] (v) and
// max_exp_avg_sq[i] (v_max; empty without AMSGrad), for every i.
void adam_update(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                 const std::vector<Tensor>& exp_avg, const std::vector<Tensor>& exp_avg_sq,
                 const std::vector<Tensor>& max_exp_avg_sq, const AdamParams& a);

// GradScaler's unscale_ (optim/grad_scaler.h), in one pass over the f32 gradients (a model's
// gradients, as PyTorch's _amp_foreach_non_finite_check_and_unscale_ takes them):
//   found_inf = any g is inf or NaN        (checked before multiplying)
//   g *= inv_scale                         (every element, the non-finite ones too)
// Returns found_inf. Each element is independent, so any thread count gives the same bits.
// Only the tensors are read: in a packed model they are views into the gradient slab, and the
// slab's alignment padding between them is neither checked nor multiplied (0 · inf would make it
// NaN, for the next check to find).
bool unscale_and_check_(const std::vector<Tensor>& grads, float inv_scale);

}  // namespace kiln
