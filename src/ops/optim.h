// optim.h — the optimizers' updates as Tensor ops: one call updates a whole parameter group
// (PyTorch's foreach / fused optimizers). Each op checks the group's tensors once (f32, one
// device, matching shapes) and hands all its segments — one parameter and the tensors beside it
// each — to one call of the kernel of their device (ops/kernels/optim.h): one parallel region on
// the CPU, one launch on CUDA. When the parameters live in a slab (Module::pack) and the state in
// one laid out alike, the segments are consecutive pieces of the same few buffers.
#pragma once
#include <cstdint>
#include <vector>

#include "ops/kernels/optim.h"  // SgdParams, AdamParams

namespace kiln {

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
