// optim.h — the optimizers' fused updates and GradScaler's unscale (chapters 07 and 09),
// declared once for both backends (core/backend.h): src/ops/cpu/optim.cpp ↔ cuda/optim.cu.
// Each is one pass that reads a parameter, its gradient and its optimizer buffers once and
// writes the new values: an optimizer step costs one trip through memory, not one per line of
// the rule. Every element is independent, so any thread count gives the same bits.
#pragma once
#include <cmath>
#include <cstdint>

#include "core/backend.h"

namespace kiln {

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

// The updates take a whole parameter group at once, PyTorch's foreach way: `count` segments, one
// per parameter, segment t holding sizes[t] elements at p[t], at grad[t] and at each state
// array's [t]. One call is one pass over all of them: one parallel region on the CPU, one launch
// on CUDA (llm.c's single update kernel), whatever the number of parameters.
//
// SGD over a group; buf is null when momentum = 0.
KILN_KERNEL(sgd_update, void sgd_update(float* const* p, const float* const* grad, float* const* buf,
                                        const int64_t* sizes, int64_t count, const SgdParams& s));
// Adam or AdamW over a group; v_max is null without AMSGrad.
KILN_KERNEL(adam_update, void adam_update(float* const* p, const float* const* grad, float* const* m, float* const* v,
                                          float* const* v_max, const int64_t* sizes, int64_t count,
                                          const AdamParams& a));
// GradScaler's unscale_, over `count` tensors (grads[t] of sizes[t] elements): g[i] *= inv_scale
// for every i, in the same pass; returns whether any g[i] was inf or NaN before it was multiplied
// (on CUDA a flag in device memory that any thread of any launch may set, read back once).
KILN_KERNEL(unscale_and_check,
            bool unscale_and_check(float* const* grads, const int64_t* sizes, int64_t count, float inv_scale));

}  // namespace kiln
