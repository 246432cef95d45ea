// optimizer.h — updates parameters from their gradients. Chapter 02 uses SGD with momentum;
// chapter 07 adds the rest (Adam, AdamW, schedulers).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/cuda_memory.h"
#include "core/state.h"
#include "nn/module.h"

namespace kiln {

// What follows a backward, as train_step knows it before the batch's last backward starts (see
// Optimizer::before_last_backward).
enum class AfterBackward {
    Step,  // step(), on the gradients backward leaves: every loss was finite, no clipping, no GradScaler
    Clip,  // clip_gradients (one factor for every gradient; an inf/NaN norm skips the step), then step()
    Other, // something may rewrite the gradients or skip the step first (a GradScaler, a non-finite loss)
};

// Parameters that share a learning rate and a weight decay (PyTorch's param_groups), e.g.
// the weights with weight decay, and the biases and batch-norm parameters without.
struct ParamGroup {
    std::vector<Parameter*> params;
    float lr = 0.0f;            // set by learning-rate schedulers, each group from its own base
    float weight_decay = 0.0f;
    // The lr the first scheduler found (PyTorch's "initial_lr"): every later scheduler of the
    // same optimizer (SequentialLR's parts) scales this one, not an already scheduled lr.
    // Negative until a scheduler is attached.
    float initial_lr = -1.0f;
};

// The usual split for weight decay: the weights (parameters with ≥ 2 dims: linear and conv
// weights) with weight_decay, then everything else (biases, batch norm's γ and β: 1-D) with 0;
// both with lr. Decaying a bias or a γ only pulls it towards 0, which nothing asks for. A group
// with no parameters is left out (an optimizer refuses empty groups).
std::vector<ParamGroup> decay_groups(Module& model, float lr, float weight_decay);

class Optimizer {
public:
    // One group holding every parameter, with this learning rate and weight decay.
    Optimizer(std::vector<Parameter*> params, float lr, float weight_decay);
    explicit Optimizer(std::vector<ParamGroup> groups);
    virtual ~Optimizer() = default;
    virtual void step() = 0;  // one update of every parameter from its grad
    void zero_grad();         // every grad := 0

    std::vector<ParamGroup>& param_groups() { return groups_; }
    const std::vector<ParamGroup>& param_groups() const { return groups_; }
    float lr() const { return groups_.front().lr; }  // the first group's
    void set_lr(float lr);                             // every group's
    int64_t steps() const { return steps_; }
    // A step taken by launching a captured CUDA Graph of step() (train/step_graph.h): its kernels
    // ran, the host's code did not, so the count is advanced here.
    void count_replayed_step() { steps_++; }

    // ---- capturable: the step's scalars in device memory (train/step_graph.h) ---------------
    // A captured graph replays its kernels' arguments as they were at the capture — the lr, and
    // Adam's bias corrections, which change with the step count t. Once make_capturable() has
    // run, the update kernels read each group's scalars (SGD: lr; Adam: lr / (1 − β1^t),
    // sqrt(1 − β2^t), 1 − lr·wd) from a small array on the parameters' device instead (PyTorch's
    // capturable=True keeps lr and the step there for the same reason). An uncaptured step
    // writes them itself; whoever launches a captured step writes them first: write_scalars(t),
    // one host-to-device copy that does not wait for the device (cuda::PinnedStaging). The same
    // floats, read from memory: the same bits. SGD, Adam and AdamW can; can_capture() says.
    virtual bool can_capture() const { return false; }
    void make_capturable();  // refused, naming why, when !can_capture()
    bool capturable() const { return scalars_.defined(); }
    void write_scalars(int64_t t);  // each group's scalars for step t

    // ---- a step in parts, overlapped with backward (chapter 15: optim/offload.h) ----------
    // update(which) applies this step's rule (step count steps() + 1) to the parameters i (groups
    // in order) with which[i], as step() would; step() is update(every parameter), then the count.
    // A caller that updates in parts calls count_step() once all parts are done. SGD, Adam and
    // AdamW have it; any other optimizer refuses, naming itself.
    virtual void update(const std::vector<bool>& which);
    void count_step() { steps_++; }
    size_t num_params() const;  // over every group
    // train_step says, just before the batch's last backward, what follows it: an optimizer that
    // updates while backward is still running (OffloadedOptimizer) starts a bucket's update as
    // soon as backward has finished it only when `next` is Step. Nothing is done by default.
    virtual void before_last_backward(AfterBackward next) { (void)next; }
    // Waits until the model's parameters hold the last step's update: an optimizer that leaves its
    // step running (OffloadedOptimizer: copies in flight, a host thread) finishes it here. Whoever
    // reads the weights other than through a forward (a checkpoint, a test) calls it first.
    virtual void synchronize() {}
    // The state kept for the i-th parameter (groups in order; views of the state slabs): SGD's
    // momentum buffer, Adam's moments; none before the first step. The memory report counts it
    // for the module that owns the parameter.
    virtual std::vector<Tensor> state_of(size_t i) const = 0;
    // The optimizer whose rule updates the weights: this one, or the one a wrapper runs on its
    // share of them (ZeRO-1, dist/zero.h). The memory model (train/memory_model.h) sizes the
    // state from it.
    virtual const Optimizer& rule() const { return *this; }
    // The state elements this process keeps for each of the model's parameters (model order),
    // when it keeps a share of them (ZeRO-1); empty: every parameter's whole state.
    virtual std::vector<int64_t> state_elements(Module& model) const {
        (void)model;
        return {};
    }
    // Clips the gradients this optimizer's update will read to a global norm of max_norm and
    // returns their norm before clipping: clip_grad_norm (below) over params, the model's. A
    // sharded optimizer overrides it: under ZeRO-1 (dist/zero.h) the gradients are summed over
    // the ranks only inside the optimizer, so only it can see their norm. train_step calls it.
    virtual float clip_gradients(const std::vector<Parameter*>& params, float max_norm);

    // The state a resumed run needs (step count, buffers), under "<prefix>." keys.
    virtual void save_state(StateDict& state, const std::string& prefix) const;
    virtual void load_state(const StateDict& state, const std::string& prefix);

protected:
    // The groups, after refusing a weight decay given in the options too: with groups, each group
    // brings its own (ParamGroup::weight_decay), and a second value would be dropped unseen.
    static std::vector<ParamGroup> own_decay(std::vector<ParamGroup> groups, float options_weight_decay,
                                             const char* optimizer);

    std::vector<ParamGroup> groups_;
    int64_t steps_ = 0;

    // capturable: group g's scalars for step t, into out[0 .. kScalars) (the rule's kernel reads
    // them: ops/optim.h SgdParams::scalars, AdamParams::scalars); null before make_capturable().
    static constexpr int kScalars = 4;
    virtual void step_scalars(const ParamGroup& group, int64_t t, float* out) const;
    const float* scalars_of(size_t group) const;
    // Before an update: a capturable optimizer's scalars for step t, unless a graph is being
    // captured (then the launch writes them).
    void write_scalars_unless_capturing(int64_t t);

private:
    Tensor scalars_;  // [groups × kScalars] f32, Category::OptimizerState
    std::shared_ptr<cuda::PinnedStaging> staging_;  // on CUDA: the copies up
};

// One zeroed f32 tensor per parameter of the optimizer (groups in order), shaped like it and
// on its device, all views of one Category::OptimizerState slab laid out like Module::pack's:
// the optimizers' state (momentum buffers, Adam's moments).
std::vector<Tensor> state_slab(const Optimizer& optimizer);

// Stochastic gradient descent with PyTorch's semantics (torch.optim.SGD):
//   g   = grad + weight_decay · p                       (L2 penalty)
//   buf = g                                  on the first step
//   buf = momentum · buf + (1 − dampening) · g          after that
//   g   = nesterov ? g + momentum · buf : buf            (when momentum ≠ 0)
//   p   = p − lr · g
// Memory: one buffer per parameter when momentum ≠ 0 (Category::OptimizerState, one slab: see
// state_slab), else none. step() updates each group in one sgd_update call (ops/optim.h).
class SGD : public Optimizer {
public:
    // Named, PyTorch's keywords: SGD::Options{}.with_momentum(0.9f).with_nesterov(); a field
    // left out keeps PyTorch's default. Not an aggregate: positional braces do not compile.
    struct Options {
        Options() {}
        float momentum = 0.0f, dampening = 0.0f, weight_decay = 0.0f;
        bool nesterov = false;
        Options& with_momentum(float m) { return momentum = m, *this; }
        Options& with_dampening(float d) { return dampening = d, *this; }
        Options& with_weight_decay(float wd) { return weight_decay = wd, *this; }
        Options& with_nesterov(bool on = true) { return nesterov = on, *this; }
    };
    SGD(std::vector<Parameter*> params, float lr, Options options);
    SGD(std::vector<Parameter*> params, float lr) : SGD(std::move(params), lr, Options{}) {}
    // Groups bring their own lr and weight_decay; options.weight_decay must be 0 (else refused).
    SGD(std::vector<ParamGroup> groups, Options options);
    void step() override;
    void update(const std::vector<bool>& which) override;
    bool can_capture() const override { return true; }
    std::vector<Tensor> state_of(size_t i) const override {
        return i < buf_.size() ? std::vector<Tensor>{buf_[i]} : std::vector<Tensor>{};
    }
    void save_state(StateDict& state, const std::string& prefix) const override;
    void load_state(const StateDict& state, const std::string& prefix) override;
    const Options& options() const { return opt_; }

protected:
    void step_scalars(const ParamGroup& group, int64_t t, float* out) const override;  // lr

private:
    Options opt_;
    void check_options() const;
    std::vector<Tensor> buf_;  // one per parameter (groups in order), created on the first step (state_slab)
};

// Gradient clipping by global norm (torch.nn.utils.clip_grad_norm_), over all the grads at once:
//   total = sqrt(Σ_params Σ_i g_i²)            (in double, in a fixed order: sum_squares)
//   coef  = max_norm / (total + 1e-6)
//   if coef < 1: every g = coef · g            (the direction is kept, the norm becomes max_norm)
// Returns total, the norm before clipping (worth logging: spikes show a run about to diverge).
// A NaN or infinite total changes no gradient and is returned as it is: the caller decides
// (train_step reports it, the training loop stops with an error, a GradScaler would skip the
// step). PyTorch's default instead makes every grad NaN.
float clip_grad_norm(const std::vector<Parameter*>& params, float max_norm);

// clip_grad_norm's second half, for gradients whose squares the caller has summed itself (ZeRO-1
// sums them over the ranks): total = sqrt(squares); each of grads scaled by
// max_norm / (total + 1e-6) when that is < 1 (nothing scaled when total is inf or NaN). Returns total.
float clip_to_norm(const std::vector<Tensor>& grads, double squares, float max_norm);
// Its parts: Σ_params Σ_i g_i² (in double, in a fixed order), and the factor the gradients are
// scaled by, max_norm / (sqrt(squares) + 1e-6) when that is < 1, else 1 (also when the norm is inf
// or NaN); clip_to_norm multiplies by it in f32, as anyone who repeats it must.
double grad_squares(const std::vector<Parameter*>& params);
float clip_factor(double squares, float max_norm);

}  // namespace kiln
