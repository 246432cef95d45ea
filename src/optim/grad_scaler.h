// grad_scaler.h — dynamic loss scaling for f16 training, with PyTorch's semantics
// (torch.amp.GradScaler).
//
// Why: f16's smallest normal number is 2^-14 and its smallest subnormal 2^-24; many gradient
// values are smaller and would round to zero in an f16 backward pass. Multiplying the loss by a
// scale S multiplies every gradient by S (backward is linear in dL), which lifts them into
// f16's range; dividing the f32 gradients by S before the optimizer step undoes it. Too large
// an S makes some value overflow to inf instead, so S is adjusted as training goes:
//
//   one step:   dL/dlogits *= S                       (train_step: loss_scale())
//               backward                              (the gradients are S times too large)
//   unscale_:   found_inf = any g is inf or NaN;  g *= inv_scale,  inv_scale = float(1 / double(S))
//   step:       optimizer.step() unless found_inf     (a skipped step changes no parameter)
//   update:     found_inf:  S = S · backoff_factor,  tracker = 0
//               otherwise:  tracker += 1; when tracker == growth_interval:
//                             S' = float(S · growth_factor); S = S' if S' is finite; tracker = 0
//
// (S and both factors are multiplied in double and rounded once to float, as PyTorch's kernel
// does; S is never clamped, as in PyTorch: a run that keeps overflowing halves it towards 0.)
// Defaults: S = 2^16, growth_factor 2, backoff_factor 0.5, growth_interval 2000 — with factors
// of 2 the scale stays a power of two, so scaling and unscaling are exact in f32 unless a value
// leaves f32's range. The order is enforced as PyTorch does: unscale_ at most once, and step at
// most once, between two update()s; update() needs an unscale_ (or step) before it.
//
// kiln's train_step (train/loop.h) runs it: unscale_, then clipping (on the true gradients),
// step, update.
//
// A skipped step and the learning-rate schedule: a per-batch schedule (OneCycleLR) is stepped
// only when the optimizer stepped (train_epoch). The schedule then counts parameter updates,
// so every lr it lays out is used by a real update, in order: the first steps of a run, which
// usually overflow while S calibrates down from 2^16, do not use up the warm-up's first lrs.
// PyTorch's usual loop steps the scheduler after every batch anyway and warns "Detected call of
// lr_scheduler.step() before optimizer.step()", because the lr of each skipped batch is lost.
// The price of kiln's choice: the schedule ends as many steps short of its end as there were
// skipped steps (a handful in a run; the progress line and run.json count them).
//
//   GradScaler scaler;                                  // PyTorch's defaults
//   StepOptions o{&arena}; o.scaler = &scaler;
//   train_step(model, sgd, x, y, o);                    // scaled, unscaled, maybe skipped, updated
#pragma once
#include <cstdint>
#include <string>

#include "core/state.h"
#include "nn/module.h"
#include "optim/optimizer.h"

namespace kiln {

class GradScaler {
public:
    struct Options {
        float init_scale = 65536.0f;  // 2^16
        double growth_factor = 2.0;   // > 1
        double backoff_factor = 0.5;  // in (0, 1)
        int64_t growth_interval = 2000;  // clean steps in a row before the scale grows
        bool enabled = true;  // false: loss_scale() is 1, unscale_ and update do nothing, step steps
    };
    GradScaler() : GradScaler(Options{}) {}
    explicit GradScaler(Options options);  // throws naming a factor or interval out of range

    // The factor the loss gradient is multiplied by now (1 when disabled).
    float loss_scale() const { return enabled_ ? scale_ : 1.0f; }

    // Multiplies the model's gradients by float(1 / double(scale)) and records whether any was
    // inf or NaN — the gradients only, not the padding between them in a packed model's slab.
    // Throws if called twice, or after step(), before update().
    void unscale_(Module& model);
    // unscale_(model) unless it ran already, then optimizer.step() unless an inf or NaN was
    // found. Returns whether the optimizer stepped. Throws if called twice before update().
    bool step(Optimizer& optimizer, Module& model);
    // Adjusts the scale from what unscale_ found (the rule above) and starts the next step.
    // Throws if no unscale_ (or step) ran since the last update().
    void update();

    bool enabled() const { return enabled_; }
    int64_t growth_tracker() const { return growth_tracker_; }  // clean steps since the last change
    bool found_inf() const { return found_inf_; }  // what the last unscale_ found
    const Options& options() const { return options_; }

    // scale, growth_tracker and the options' factors and interval, under "<prefix>." keys (the
    // scale as an exact hex float); nothing when disabled. Throws between unscale_ and update():
    // save at the end of a step.
    void save_state(StateDict& state, const std::string& prefix) const;
    // Restores them (a disabled scaler loads nothing). A state without the scaler's keys is an
    // error saying the checkpoint was saved without loss scaling.
    void load_state(const StateDict& state, const std::string& prefix);

private:
    enum class Stage { Ready, Unscaled, Stepped };  // PyTorch's OptState: READY, UNSCALED, STEPPED
    Options options_;
    bool enabled_;
    float scale_;
    int64_t growth_tracker_ = 0;
    bool found_inf_ = false;
    Stage stage_ = Stage::Ready;
};

}  // namespace kiln
