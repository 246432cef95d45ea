// scheduler.cpp — the learning-rate schedules (formulas in scheduler.h).
#include "optim/scheduler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace kiln {

namespace {

constexpr double kPi = 3.14159265358979323846;

// How many of the (increasing) milestones are ≤ t: Python's bisect_right.
int64_t milestones_passed(const std::vector<int64_t>& milestones, int64_t t) {
    return std::upper_bound(milestones.begin(), milestones.end(), t) - milestones.begin();
}

void check_increasing(const std::vector<int64_t>& milestones, const char* who) {
    for (size_t i = 0; i < milestones.size(); i++)
        KILN_CHECK(milestones[i] > 0 && (i == 0 || milestones[i] > milestones[i - 1]), who,
                   ": milestones must be positive and increasing; milestone ", i, " is ", milestones[i]);
}

}  // namespace

// ---- the base: a step counter and the groups' bases ------------------------------------------

LRScheduler::LRScheduler(Optimizer& optimizer) : optimizer_(optimizer) {
    for (ParamGroup& g : optimizer_.param_groups())
        if (g.initial_lr < 0.0f) g.initial_lr = g.lr;  // the first scheduler fixes the bases
}

void LRScheduler::apply() {
    for (ParamGroup& g : optimizer_.param_groups()) g.lr = float(lr_at(t_, g.initial_lr));
}

void LRScheduler::step() {
    t_++;
    apply();
}

std::vector<float> LRScheduler::last_lr() const {
    std::vector<float> lrs;
    for (const ParamGroup& g : optimizer_.param_groups()) lrs.push_back(g.lr);
    return lrs;
}

void LRScheduler::save_state(StateDict& state, const std::string& prefix) const {
    state.set(prefix + ".last_epoch", t_);
}

void LRScheduler::load_state(const StateDict& state, const std::string& prefix) {
    t_ = state.get_int(prefix + ".last_epoch", 0, INT64_MAX);
    apply();
}

// ---- closed-form schedules -------------------------------------------------------------------

StepLR::StepLR(Optimizer& optimizer, int64_t step_size, double gamma)
    : LRScheduler(optimizer), step_size_(step_size), gamma_(gamma) {
    KILN_CHECK(step_size > 0, "StepLR: step_size must be ≥ 1, got ", step_size);
    start();
}
double StepLR::lr_at(int64_t t, double base) const { return base * std::pow(gamma_, double(t / step_size_)); }

MultiStepLR::MultiStepLR(Optimizer& optimizer, std::vector<int64_t> milestones, double gamma)
    : LRScheduler(optimizer), milestones_(std::move(milestones)), gamma_(gamma) {
    check_increasing(milestones_, "MultiStepLR");
    start();
}
double MultiStepLR::lr_at(int64_t t, double base) const {
    return base * std::pow(gamma_, double(milestones_passed(milestones_, t)));
}

ExponentialLR::ExponentialLR(Optimizer& optimizer, double gamma) : LRScheduler(optimizer), gamma_(gamma) {
    KILN_CHECK(gamma > 0.0, "ExponentialLR: gamma must be > 0, got ", gamma);
    start();
}
double ExponentialLR::lr_at(int64_t t, double base) const { return base * std::pow(gamma_, double(t)); }

CosineAnnealingLR::CosineAnnealingLR(Optimizer& optimizer, int64_t T_max, double eta_min)
    : LRScheduler(optimizer), T_max_(T_max), eta_min_(eta_min) {
    KILN_CHECK(T_max > 0, "CosineAnnealingLR: T_max must be ≥ 1, got ", T_max);
    start();
}
double CosineAnnealingLR::lr_at(int64_t t, double base) const {
    return eta_min_ + (base - eta_min_) * (1.0 + std::cos(kPi * double(t) / double(T_max_))) / 2.0;
}

LinearLR::LinearLR(Optimizer& optimizer, double start_factor, double end_factor, int64_t total_iters)
    : LRScheduler(optimizer), start_factor_(start_factor), end_factor_(end_factor), total_iters_(total_iters) {
    KILN_CHECK(start_factor > 0.0 && start_factor <= 1.0 && end_factor >= 0.0 && end_factor <= 1.0,
               "LinearLR: start_factor must be in (0, 1] and end_factor in [0, 1], got ", start_factor, " and ",
               end_factor);
    KILN_CHECK(total_iters > 0, "LinearLR: total_iters must be ≥ 1, got ", total_iters);
    start();
}
double LinearLR::lr_at(int64_t t, double base) const {
    const double done = double(std::min(t, total_iters_)) / double(total_iters_);
    return base * (start_factor_ + (end_factor_ - start_factor_) * done);
}

// ---- one cycle ---------------------------------------------------------------------------------

OneCycleLR::OneCycleLR(Optimizer& optimizer, double max_lr, int64_t total_steps, Options options)
    : LRScheduler(optimizer), total_steps_(total_steps), opt_(options) {
    KILN_CHECK(total_steps > 0, "OneCycleLR: total_steps must be ≥ 1, got ", total_steps,
               " (epochs × batches per epoch)");
    KILN_CHECK(max_lr > 0.0, "OneCycleLR: max_lr must be > 0, got ", max_lr);
    KILN_CHECK(opt_.pct_start > 0.0 && opt_.pct_start < 1.0, "OneCycleLR: pct_start must be in (0, 1), got ",
               opt_.pct_start);
    KILN_CHECK(opt_.div_factor > 0.0 && opt_.final_div_factor > 0.0,
               "OneCycleLR: div_factor and final_div_factor must be > 0");
    const double initial = max_lr / opt_.div_factor, min_lr = initial / opt_.final_div_factor;
    const double s1 = opt_.pct_start * double(total_steps) - 1.0, end = double(total_steps) - 1.0;
    if (opt_.three_phase)
        phases_ = {{s1, initial, max_lr}, {2.0 * opt_.pct_start * double(total_steps) - 2.0, max_lr, initial},
                   {end, initial, min_lr}};
    else
        phases_ = {{s1, initial, max_lr}, {end, max_lr, min_lr}};
    // The groups' own lrs are replaced: every group starts at max_lr / div_factor.
    for (ParamGroup& g : optimizer_.param_groups()) g.initial_lr = float(initial);
    start();
}

double OneCycleLR::lr_at(int64_t t, double) const {
    KILN_CHECK(t <= total_steps_, "OneCycleLR: stepped ", t, " times but total_steps is ", total_steps_,
               " (make total_steps = epochs × batches per epoch, and step once per batch)");
    double start_step = 0.0;
    for (size_t i = 0; i < phases_.size(); i++) {
        const Phase& ph = phases_[i];
        if (double(t) <= ph.end_step || i + 1 == phases_.size()) {
            const double p = (double(t) - start_step) / (ph.end_step - start_step);
            if (opt_.anneal == Anneal::Linear) return ph.start_lr + (ph.end_lr - ph.start_lr) * p;
            return ph.end_lr + (ph.start_lr - ph.end_lr) * (1.0 + std::cos(kPi * p)) / 2.0;
        }
        start_step = ph.end_step;
    }
    return phases_.back().end_lr;  // not reached: the last phase takes every t
}

// ---- sequential ------------------------------------------------------------------------------

SequentialLR::SequentialLR(Optimizer& optimizer, std::vector<LRScheduler*> schedulers,
                           std::vector<int64_t> milestones)
    : LRScheduler(optimizer), schedulers_(std::move(schedulers)), milestones_(std::move(milestones)) {
    KILN_CHECK(!schedulers_.empty() && milestones_.size() + 1 == schedulers_.size(), "SequentialLR: ",
               schedulers_.size(), " schedulers need ", schedulers_.size() - 1, " milestones, got ",
               milestones_.size());
    check_increasing(milestones_, "SequentialLR");
    start();
}

double SequentialLR::lr_at(int64_t t, double base) const {
    const int64_t i = milestones_passed(milestones_, t);
    const int64_t since = i == 0 ? t : t - milestones_[i - 1];
    return schedulers_[i]->lr_at(since, base);
}

// ---- reduce on plateau -----------------------------------------------------------------------

ReduceLROnPlateau::ReduceLROnPlateau(Optimizer& optimizer, Options options)
    : optimizer_(optimizer), opt_(options),
      best_(options.mode == Mode::Min ? INFINITY : -INFINITY) {
    KILN_CHECK(opt_.factor > 0.0 && opt_.factor < 1.0, "ReduceLROnPlateau: factor must be in (0, 1), got ",
               opt_.factor);
    KILN_CHECK(opt_.patience >= 0 && opt_.cooldown >= 0 && opt_.threshold >= 0.0 && opt_.min_lr >= 0.0,
               "ReduceLROnPlateau: patience, cooldown, threshold and min_lr must be ≥ 0");
}

bool ReduceLROnPlateau::better(double a) const {
    const bool rel = opt_.threshold_mode == ThresholdMode::Rel;
    if (opt_.mode == Mode::Min) return rel ? a < best_ * (1.0 - opt_.threshold) : a < best_ - opt_.threshold;
    return rel ? a > best_ * (1.0 + opt_.threshold) : a > best_ + opt_.threshold;
}

void ReduceLROnPlateau::step(double metric) {
    last_epoch_++;
    if (better(metric)) {
        best_ = metric;
        bad_epochs_ = 0;
    } else {
        bad_epochs_++;
    }
    if (cooldown_left_ > 0) {
        cooldown_left_--;
        bad_epochs_ = 0;
    }
    if (bad_epochs_ > opt_.patience) {
        for (ParamGroup& g : optimizer_.param_groups()) {
            const double old_lr = g.lr, new_lr = std::max(old_lr * opt_.factor, opt_.min_lr);
            if (old_lr - new_lr > opt_.eps) g.lr = float(new_lr);
        }
        cooldown_left_ = opt_.cooldown;
        bad_epochs_ = 0;
    }
}

// Keys: <prefix>.best, .num_bad_epochs, .cooldown_counter, .last_epoch; the lrs themselves are
// the optimizer's state.
void ReduceLROnPlateau::save_state(StateDict& state, const std::string& prefix) const {
    state.set(prefix + ".best", best_);
    state.set(prefix + ".num_bad_epochs", bad_epochs_);
    state.set(prefix + ".cooldown_counter", cooldown_left_);
    state.set(prefix + ".last_epoch", last_epoch_);
}

void ReduceLROnPlateau::load_state(const StateDict& state, const std::string& prefix) {
    best_ = state.get_double(prefix + ".best", -INFINITY, INFINITY);  // ±inf before the first epoch
    last_epoch_ = state.get_int(prefix + ".last_epoch", 0, INT64_MAX);
    bad_epochs_ = state.get_int(prefix + ".num_bad_epochs", 0, last_epoch_);
    cooldown_left_ = state.get_int(prefix + ".cooldown_counter", 0, opt_.cooldown);
}

}  // namespace kiln
