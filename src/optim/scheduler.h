// scheduler.h — learning-rate schedules with PyTorch's semantics (torch.optim.lr_scheduler).
//
// A scheduler owns a step counter t. Constructing it sets every group's lr to lr(0); each
// step() advances t by one and sets lr(t). Whether a step is an epoch or a batch is the
// trainer's choice: OneCycleLR is stepped after every batch, the others usually after every
// epoch. As in PyTorch, call step() after optimizer.step().
//
//   SGD sgd(model.parameters(), 0.1f, SGD::Options{}.with_momentum(0.9f).with_weight_decay(5e-4f).with_nesterov());
//   OneCycleLR sched(sgd, 0.1, epochs * loader.num_batches());
//   for each batch: forward, backward, sgd.step(), sched.step();
//
// Each group is scheduled from its own base: the lr it had when the first scheduler of the
// optimizer was made (ParamGroup::initial_lr, PyTorch's "initial_lr"), so groups with
// different lrs keep their ratio. The formulas below are the closed forms PyTorch documents
// (its code mostly applies them recursively, step by step; the two agree to float rounding).
// Here they are evaluated in double and rounded once to the group's f32 lr.
//
// Letters: t = step count (PyTorch's last_epoch), base = the group's initial lr.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/state.h"
#include "optim/optimizer.h"

namespace kiln {

class LRScheduler {
public:
    virtual ~LRScheduler() = default;
    void step();                                   // t += 1, then every group's lr = lr_at(t, base)
    int64_t last_epoch() const { return t_; }      // how many times step() was called
    std::vector<float> last_lr() const;            // each group's lr now
    // The schedule itself, for any t ≥ 0 (pure: no state changes).
    virtual double lr_at(int64_t t, double base) const = 0;

    virtual void save_state(StateDict& state, const std::string& prefix) const;  // "<prefix>.last_epoch"
    virtual void load_state(const StateDict& state, const std::string& prefix);   // and sets the lrs

protected:
    // Records each group's base (initial_lr) and sets lr(0). Subclasses call start() at the end
    // of their constructor, once lr_at can be evaluated.
    explicit LRScheduler(Optimizer& optimizer);
    void start() { apply(); }
    void apply();  // every group's lr = lr_at(t_, its base)

    Optimizer& optimizer_;
    int64_t t_ = 0;
};

// lr = base · gamma^⌊t / step_size⌋
class StepLR : public LRScheduler {
public:
    StepLR(Optimizer& optimizer, int64_t step_size, double gamma = 0.1);
    double lr_at(int64_t t, double base) const override;

private:
    int64_t step_size_;
    double gamma_;
};

// lr = base · gamma^(number of milestones ≤ t)        milestones increasing
class MultiStepLR : public LRScheduler {
public:
    MultiStepLR(Optimizer& optimizer, std::vector<int64_t> milestones, double gamma = 0.1);
    double lr_at(int64_t t, double base) const override;

private:
    std::vector<int64_t> milestones_;
    double gamma_;
};

// lr = base · gamma^t
class ExponentialLR : public LRScheduler {
public:
    ExponentialLR(Optimizer& optimizer, double gamma);
    double lr_at(int64_t t, double base) const override;

private:
    double gamma_;
};

// lr = eta_min + (base − eta_min) · (1 + cos(π · t / T_max)) / 2
// (half a cosine from base down to eta_min over T_max steps; past T_max it rises again, as
// PyTorch's does)
class CosineAnnealingLR : public LRScheduler {
public:
    CosineAnnealingLR(Optimizer& optimizer, int64_t T_max, double eta_min = 0.0);
    double lr_at(int64_t t, double base) const override;

private:
    int64_t T_max_;
    double eta_min_;
};

// Linear warm-up (or decay) of a multiplicative factor over total_iters steps, then constant:
//   lr = base · (start_factor + (end_factor − start_factor) · min(t, total_iters) / total_iters)
class LinearLR : public LRScheduler {
public:
    LinearLR(Optimizer& optimizer, double start_factor = 1.0 / 3.0, double end_factor = 1.0,
             int64_t total_iters = 5);
    double lr_at(int64_t t, double base) const override;

private:
    double start_factor_, end_factor_;
    int64_t total_iters_;
};

// One cycle (Smith & Topin 2018), stepped after every batch, total_steps steps in all. It
// ignores the groups' lrs and goes from max_lr / div_factor up to max_lr and down to
// (max_lr / div_factor) / final_div_factor, in two phases (three with three_phase):
//   two phases:   [0, s1]   initial → max          s1 = pct_start · total_steps − 1
//                 [s1, e]   max → min              e  = total_steps − 1
//   three phases: [0, s1]   initial → max,   [s1, s2] max → initial,   [s2, e] initial → min
//                 s2 = 2 · pct_start · total_steps − 2
// Within a phase from lr_a (at step a) to lr_b (at step b), with p = (t − a) / (b − a):
//   cos:     lr = lr_b + (lr_a − lr_b) · (1 + cos(π · p)) / 2
//   linear:  lr = lr_a + (lr_b − lr_a) · p
// PyTorch also cycles the momentum by default (cycle_momentum); kiln's keeps the optimizer's
// momentum fixed, which is PyTorch's cycle_momentum=False. Stepping to t > total_steps throws,
// as PyTorch does.
class OneCycleLR : public LRScheduler {
public:
    enum class Anneal { Cos, Linear };
    struct Options {
        double pct_start = 0.3;
        Anneal anneal = Anneal::Cos;
        double div_factor = 25.0;
        double final_div_factor = 1e4;
        bool three_phase = false;
    };
    OneCycleLR(Optimizer& optimizer, double max_lr, int64_t total_steps, Options options);
    OneCycleLR(Optimizer& optimizer, double max_lr, int64_t total_steps)
        : OneCycleLR(optimizer, max_lr, total_steps, Options{}) {}
    double lr_at(int64_t t, double base) const override;  // base is not used

private:
    struct Phase {
        double end_step;  // the last step of the phase
        double start_lr, end_lr;
    };
    int64_t total_steps_;
    Options opt_;
    std::vector<Phase> phases_;
};

// Chains schedulers: the i-th runs from milestone i−1 (or 0) to milestone i, restarted at its
// own step 0 there. All scale the same bases. E.g. warm-up then cosine:
//   LinearLR warm(sgd, 0.1, 1.0, 5);  CosineAnnealingLR cos(sgd, 95);
//   SequentialLR sched(sgd, {&warm, &cos}, {5});
//   lr(t) = schedulers[i].lr_at(t − milestones[i−1], base),   i = number of milestones ≤ t
// The parts must outlive it; only SequentialLR's step() is called.
class SequentialLR : public LRScheduler {
public:
    SequentialLR(Optimizer& optimizer, std::vector<LRScheduler*> schedulers, std::vector<int64_t> milestones);
    double lr_at(int64_t t, double base) const override;

private:
    std::vector<LRScheduler*> schedulers_;
    std::vector<int64_t> milestones_;
};

// Lowers the lr when a metric stops improving (stepped with the metric, e.g. the validation
// loss after each epoch). Not a function of t: it keeps state.
//   better(a) =  mode min, rel: a < best · (1 − threshold)      mode min, abs: a < best − threshold
//                mode max, rel: a > best · (1 + threshold)      mode max, abs: a > best + threshold
//   each step(metric):
//     if better(metric): best = metric, bad_epochs = 0   else bad_epochs += 1
//     if cooldown_left > 0: cooldown_left −= 1, bad_epochs = 0     (just reduced: wait)
//     if bad_epochs > patience: every group's lr = max(lr · factor, min_lr)  (only when that
//                               changes it by more than eps), cooldown_left = cooldown, bad_epochs = 0
class ReduceLROnPlateau {
public:
    enum class Mode { Min, Max };
    enum class ThresholdMode { Rel, Abs };
    struct Options {
        Mode mode = Mode::Min;
        double factor = 0.1;
        int64_t patience = 10;
        double threshold = 1e-4;
        ThresholdMode threshold_mode = ThresholdMode::Rel;
        int64_t cooldown = 0;
        double min_lr = 0.0;
        double eps = 1e-8;
    };
    ReduceLROnPlateau(Optimizer& optimizer, Options options);
    explicit ReduceLROnPlateau(Optimizer& optimizer) : ReduceLROnPlateau(optimizer, Options{}) {}
    void step(double metric);
    int64_t num_bad_epochs() const { return bad_epochs_; }
    double best() const { return best_; }

    void save_state(StateDict& state, const std::string& prefix) const;
    void load_state(const StateDict& state, const std::string& prefix);

private:
    bool better(double metric) const;
    Optimizer& optimizer_;
    Options opt_;
    double best_;
    int64_t bad_epochs_ = 0, cooldown_left_ = 0, last_epoch_ = 0;
};

}  // namespace kiln
