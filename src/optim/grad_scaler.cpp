// grad_scaler.cpp — GradScaler (see grad_scaler.h for the rules).
#include "optim/grad_scaler.h"

#include <cfloat>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "ops/optim.h"

namespace kiln {

GradScaler::GradScaler(Options options) : options_(options), enabled_(options.enabled), scale_(options.init_scale) {
    KILN_CHECK(std::isfinite(options.init_scale) && options.init_scale > 0.0f, "GradScaler: init_scale ",
               options.init_scale, " must be a positive finite number (PyTorch's default is 65536 = 2^16)");
    KILN_CHECK(options.growth_factor > 1.0, "GradScaler: growth_factor ", options.growth_factor,
               " must be > 1 (the default is 2)");
    KILN_CHECK(options.backoff_factor > 0.0 && options.backoff_factor < 1.0, "GradScaler: backoff_factor ",
               options.backoff_factor, " must be in (0, 1) (the default is 0.5)");
    KILN_CHECK(options.growth_interval >= 1, "GradScaler: growth_interval ", options.growth_interval,
               " must be at least 1 step (the default is 2000)");
}

void GradScaler::unscale_(Module& model) {
    if (!enabled_) return;
    KILN_CHECK(stage_ != Stage::Unscaled,
               "GradScaler: unscale_() has already been called since the last update(); call it once per step");
    KILN_CHECK(stage_ != Stage::Stepped, "GradScaler: unscale_() is being called after step(); call it before");
    // In double, then rounded once: a float division may be compiled less exactly (PyTorch's reason).
    const float inv_scale = float(1.0 / double(scale_));
    // The gradients alone: in a packed model views into the slab, the padding between them left out.
    std::vector<Tensor> grads;
    for (Parameter* p : model.parameters()) grads.push_back(p->grad);
    found_inf_ = unscale_and_check_(grads, inv_scale);
    stage_ = Stage::Unscaled;
}

bool GradScaler::step(Optimizer& optimizer, Module& model) {
    if (!enabled_) {
        optimizer.step();
        return true;
    }
    KILN_CHECK(stage_ != Stage::Stepped, "GradScaler: step() has already been called since the last update()");
    if (stage_ == Stage::Ready) unscale_(model);
    stage_ = Stage::Stepped;
    if (found_inf_) return false;
    optimizer.step();
    return true;
}

void GradScaler::update() {
    if (!enabled_) return;
    KILN_CHECK(stage_ != Stage::Ready,
               "GradScaler: update() without an inf check since the last update(); call unscale_() or step() first");
    if (found_inf_) {
        scale_ = float(double(scale_) * options_.backoff_factor);
        growth_tracker_ = 0;
    } else if (++growth_tracker_ == options_.growth_interval) {
        const float grown = float(double(scale_) * options_.growth_factor);
        if (std::isfinite(grown)) scale_ = grown;  // never grown to inf
        growth_tracker_ = 0;
    }
    found_inf_ = false;
    stage_ = Stage::Ready;
}

void GradScaler::save_state(StateDict& state, const std::string& prefix) const {
    if (!enabled_) return;
    KILN_CHECK(stage_ == Stage::Ready, "GradScaler: its state is saved between steps, after update()");
    state.set(prefix + ".scale", double(scale_));
    state.set(prefix + ".growth_tracker", growth_tracker_);
    state.set(prefix + ".growth_factor", options_.growth_factor);
    state.set(prefix + ".backoff_factor", options_.backoff_factor);
    state.set(prefix + ".growth_interval", options_.growth_interval);
}

void GradScaler::load_state(const StateDict& state, const std::string& prefix) {
    if (!enabled_) return;
    KILN_USAGE_CHECK(state.has(prefix + ".scale"), "this run scales the loss (--amp f16) but the checkpoint holds no ",
                     "GradScaler state (\"", prefix, ".scale\"): it was saved without loss scaling. Resume with the ",
                     "--amp it was trained with");
    // The ranges the constructor and update() keep them in.
    scale_ = float(state.get_double(prefix + ".scale", FLT_TRUE_MIN, FLT_MAX));
    options_.growth_factor = state.get_double(prefix + ".growth_factor", std::nextafter(1.0, 2.0), INFINITY);
    options_.backoff_factor =
        state.get_double(prefix + ".backoff_factor", DBL_TRUE_MIN, std::nextafter(1.0, 0.0));
    options_.growth_interval = state.get_int(prefix + ".growth_interval", 1, INT64_MAX);
    growth_tracker_ = state.get_int(prefix + ".growth_tracker", 0, options_.growth_interval - 1);
    found_inf_ = false;
    stage_ = Stage::Ready;
}

}  // namespace kiln
