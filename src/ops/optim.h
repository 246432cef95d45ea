// optim.h — the optim family (chapters 07 and 09): the optimizers' fused updates and GradScaler's
// unscale. The kernels' contract, declared once for both backends (core/backend.h;
// src/ops/cpu/optim.cpp ↔ cuda/optim.cu), then the ops on tensors. The ops name no autocast class
// (ops/autocast.h): parameters, gradients and state are f32 whatever the step's precision.
//
// Each kernel is one pass that reads a parameter, its gradient and its optimizer buffers once and
// writes the new values: an optimizer step costs one trip through memory, not one per line of
// the rule. Every element is independent, so any thread count gives the same bits.
//
// The ops update a whole parameter group in one call (PyTorch's foreach / fused optimizers). Each
// op checks the group's tensors once (f32, one device, matching shapes) and hands all its
// segments — one parameter and the tensors beside it each — to one call of the kernel of their
// device: one parallel region on the CPU, one launch on CUDA. When the parameters live in a slab
// (Module::pack) and the state in one laid out alike, the segments are consecutive pieces of the
// same few buffers.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/backend.h"

namespace kiln {

// ==== the kernels ===============================================================================
// PyTorch's SGD, per element:
//   g = grad + wd·p;  buf = first ? g : momentum·buf + (1 − dampening)·g;
//   g = nesterov ? g + momentum·buf : buf   (when momentum ≠ 0);   p −= lr·g
struct SgdParams {
    float lr, momentum, dampening, weight_decay;
    bool nesterov;
    bool first_step;  // buf := g (the buffers start as the first gradient)
    // A capturable optimizer's (optim/optimizer.h): where the kernel reads lr when it runs — one
    // float in memory of the parameters' device, rewritten before each step — in place of `lr`
    // above, which a captured CUDA Graph would replay unchanged. Null: `lr`.
    const float* scalars = nullptr;
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
    // A capturable optimizer's: where the kernel reads {step_size, bias_correction2_sqrt, decay}
    // (as floats) when it runs, in place of the three above (which depend on lr and t, both of
    // which a captured graph would replay unchanged). Null: computed from the fields.
    const float* scalars = nullptr;
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

// ==== the ops on tensors ========================================================================
class Tensor;

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

// ==== the definitions ===========================================================================
// The group's checks, then one kernel call for the whole group on its device.
#ifdef KILN_DEFINE_OPS  // compiled once, in src/ops/ops.cpp (see there)
#include "core/tensor.h"

namespace kiln {

namespace detail {

// Every list has params.size() tensors (or is empty when `optional`), each f32 with params[i]'s
// shape on params[0]'s device. Returns that device.
Device check_group(const char* op, const std::vector<Tensor>& params,
                   std::initializer_list<std::pair<const std::vector<Tensor>*, bool>> lists) {
    KILN_CHECK(!params.empty(), op, ": an empty group");
    const Device device = params[0].device();
    for (auto [list, optional] : lists) {
        KILN_CHECK(list->size() == params.size() || (optional && list->empty()), op, ": ", params.size(),
                   " parameters but ", list->size(), " tensors beside them");
    }
    for (size_t i = 0; i < params.size(); i++) {
        check_dtype(params[i], DType::F32, op, "parameter");
        KILN_CHECK(params[i].device() == device, op, ": the group's parameters are on more than one device (",
                   params[0].desc(), " and ", params[i].desc(), ")");
        for (auto [list, optional] : lists) {
            if (list->empty()) continue;
            check_shape((*list)[i], params[i].shape(), op, "state or gradient");
            check_dtype((*list)[i], DType::F32, op, "state or gradient");
            check_same_device(params[i], (*list)[i], op);
        }
    }
    return device;
}

// The kernels' view of a list: each tensor's data, or nothing for an empty (optional) list.
std::vector<float*> pointers(const std::vector<Tensor>& list) {
    std::vector<float*> out;
    for (const Tensor& t : list) out.push_back(const_cast<Tensor&>(t).data<float>());
    return out;
}

float* const* data_or_null(const std::vector<float*>& pointers) {
    return pointers.empty() ? nullptr : pointers.data();
}

std::vector<int64_t> sizes(const std::vector<Tensor>& list) {
    std::vector<int64_t> out;
    for (const Tensor& t : list) out.push_back(t.numel());
    return out;
}

}  // namespace detail

void sgd_update(const std::vector<Tensor>& params, const std::vector<Tensor>& grads, const std::vector<Tensor>& bufs,
                const SgdParams& s) {
    const Device device =
        detail::check_group("sgd_update", params, {{&grads, false}, {&bufs, s.momentum == 0.0f}});
    KILN_CHECK(s.momentum == 0.0f || !bufs.empty(), "sgd_update: momentum ", s.momentum, " needs its buffers");
    const std::vector<float*> p = detail::pointers(params), g = detail::pointers(grads),
                              buf = detail::pointers(bufs);
    const std::vector<int64_t> n = detail::sizes(params);
    on_backend(device, [&](auto be) {
        kernel::sgd_update(be, p.data(), g.data(), detail::data_or_null(buf), n.data(), int64_t(n.size()), s);
    });
}

void adam_update(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                 const std::vector<Tensor>& exp_avg, const std::vector<Tensor>& exp_avg_sq,
                 const std::vector<Tensor>& max_exp_avg_sq, const AdamParams& a) {
    const Device device = detail::check_group(
        "adam_update", params,
        {{&grads, false}, {&exp_avg, false}, {&exp_avg_sq, false}, {&max_exp_avg_sq, true}});
    const std::vector<float*> p = detail::pointers(params), g = detail::pointers(grads),
                              m = detail::pointers(exp_avg), v = detail::pointers(exp_avg_sq),
                              v_max = detail::pointers(max_exp_avg_sq);
    const std::vector<int64_t> n = detail::sizes(params);
    on_backend(device, [&](auto be) {
        kernel::adam_update(be, p.data(), g.data(), m.data(), v.data(), detail::data_or_null(v_max), n.data(),
                            int64_t(n.size()), a);
    });
}

bool unscale_and_check_(const std::vector<Tensor>& grads, float inv_scale) {
    const Device device = detail::check_group("unscale_and_check_", grads, {});
    const std::vector<float*> g = detail::pointers(grads);
    const std::vector<int64_t> n = detail::sizes(grads);
    return on_backend(device, [&](auto be) {
        return kernel::unscale_and_check(be, g.data(), n.data(), int64_t(n.size()), inv_scale);
    });
}

}  // namespace kiln
#endif  // KILN_DEFINE_OPS
