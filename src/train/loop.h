// loop.h — one training step, and one epoch of them: the loop every trainer runs.
//
// One step (train_step), in order:
//   1. logits = model.call(x)               activations come from the arena (if given)
//   2. loss   = cross_entropy(logits, y)    and dL/dlogits
//   3. model.call_backward(dL/dlogits)      fills every parameter's grad
//      optimizer.clip_gradients(clip_norm) if asked (chapter 07: clip_grad_norm; the optimizer's
//                                          own, since a sharded one holds the summed gradients)
//   4. optimizer.step()                     p -= lr · (update from grad), if everything is finite
//   5. arena.reset()                        this step's activations are gone, in O(1)
//
// With a GradScaler (StepOptions::scaler, chapter 09: --amp f16), steps 2-4 become PyTorch's
// recipe (optim/grad_scaler.h): dL/dlogits is multiplied by the scale S before backward;
// scaler.unscale_ divides the gradients by S and looks for inf/NaN; clipping sees the true
// gradients; scaler.step skips the optimizer if an inf/NaN was found; scaler.update adjusts S.
// A skipped step is not an error: the training loop goes on, as PyTorch's does.
//
// Gradient accumulation (StepOptions::accumulate = K, the trainers' --accumulate K): the batch
// of B images is cut into K micro-batches of about B/K (every one of B/K when K divides B), and
// steps 1-3 run once per micro-batch, the arena reset after each — only one micro-batch's
// activations are alive at a time, which is the memory saved. Micro-batch i (n_i images) has
// the mean loss L_i of its own images; its gradient is scaled by n_i / B before backward:
//   Σ_i (n_i / B) · dL_i/dW = d/dW (1/B Σ_images loss) = the whole batch's mean-loss gradient,
// and the parameters' grads add up over the micro-batches (backward accumulates). Then one
// optimizer step. So B (--batch-size) stays the optimizer's batch: the same lr trains the same
// model, with K times fewer activations (and K smaller, less efficient, GEMMs). The step's loss
// and correct count are the whole batch's. Exactly the same update up to float rounding — but
// not with batch norm: BN normalizes each micro-batch with that micro-batch's statistics (and
// updates its running statistics K times), so the network computes another function.
//
// The epoch (train_epoch) adds, after each step: scheduler.step() if the lr changes every batch
// (OneCycleLR) and the optimizer stepped (a step a GradScaler skipped does not advance the
// schedule: grad_scaler.h says why), and the progress bar.
//
// On a GPU the loss is read back once per TrainOptions::loss_read_every steps, not every step
// (train/loss_log.h says why that pays): the steps' losses wait on the device in a LossLog, and
// the checks and the progress bar below see them when it is read. Not with a GradScaler or
// clipping, which read the gradients back every step anyway (their inf/NaN check, their norm).
//
// With TrainOptions::cuda_graph (--cuda-graph) the epoch's steps go through a StepGraph
// (train/step_graph.h): the first two uncaptured, then the step captured once and launched as one
// CUDA Graph per step; a batch of another shape (the epoch's last) runs uncaptured.
//
// When training diverges, train_epoch stops with an error naming the epoch and the step: without
// a GradScaler at the first inf or NaN loss (or gradient norm, when clipping); with one, once a
// skipped step takes the scale below kMinLossScale. A scale below 1 scales the gradients down,
// not up: at that point they overflow even at their true size (or the loss itself is inf/NaN),
// so halving the scale again cannot help. PyTorch's GradScaler goes on halving it towards 0,
// skipping every step in silence; kiln's GradScaler follows PyTorch's rule, and the training
// loop is where kiln stops.
#pragma once
#include <functional>
#include <string>
#include <utility>

#include "core/allocator.h"
#include "data/loader.h"
#include "nn/module.h"
#include "optim/grad_scaler.h"
#include "optim/optimizer.h"
#include "optim/scheduler.h"
#include "train/run_log.h"

namespace kiln {

class MemoryRecording;  // train/memory_trace.h: --mem-report and --mem-trace
class LossLog;          // train/loss_log.h
struct LossTotals;      // ops/loss.h

// The smallest loss scale train_epoch goes on with after a skipped step (see above).
constexpr float kMinLossScale = 1.0f;

// How one step runs.
struct StepOptions {
    BumpAllocator* arena = nullptr;  // each step's activations (reset after the step)
    float clip_norm = 0.0f;          // > 0: clip the gradients' global norm to it
    int accumulate = 1;              // micro-batches per optimizer step (≤ the batch's size)
    GradScaler* scaler = nullptr;    // loss scaling (--amp f16); null: none, the step unchanged
    DType amp = DType::F32;          // f16/bf16: forward and backward under an AutocastScope
                                     // (ops/autocast.h, --amp); f32: none
    float label_smoothing = 0.0f;    // the loss's ε (CrossEntropyLoss; chapter 13)
    LossLog* loss_log = nullptr;     // the loss left on the device, in this log (train/loss_log.h):
                                     // StepResult::loss is then unknown (loss_logged); neither a
                                     // scaler nor clipping with it. null: the loss is read at once
};

// What a step did. A non-finite loss or gradient norm is reported, not thrown: the optimizer
// step is skipped (stepped = false) and the caller decides — the training loop stops with an
// error. With a GradScaler its inf/NaN check decides instead (grads_finite), and the scaler
// lowers its scale and training goes on.
struct StepResult {
    float loss = 0;
    int64_t correct = 0;       // correct predictions in the batch
    float grad_norm = 0;       // the norm before clipping (0 when not clipping)
    bool loss_finite = true;
    bool grads_finite = true;  // known only when clipping (the norm is computed then) or scaling
    bool stepped = false;      // the optimizer updated the parameters
    float loss_scale = 1;      // what dL/dlogits was multiplied by (the GradScaler's scale)
    bool loss_logged = false;  // the loss and correct are in StepOptions::loss_log, not here (and
                               // the step was taken: its loss is not known yet)
    bool finite() const { return loss_finite && grads_finite; }
};

// Forward, softmax cross-entropy and backward of one (micro-)batch, its activations from the
// arena if given, its loss gradient scaled by `scale` (its share of the whole batch; 1 for the
// whole batch, which is then not touched): adds to the parameters' grads, returns its mean loss
// and its correct count — or, given `totals`, leaves both there (on the device; train/loss_log.h)
// and returns NaN and 0. before_backward, when given, is called with the loss (NaN with totals)
// between forward and backward. train_step runs it once per micro-batch (and before the last
// backward tells the optimizer what follows: Optimizer::before_last_backward); --find-batch-size
// probes with it.
std::pair<float, int64_t> forward_backward(Module& model, const Tensor& x, const Tensor& y, float scale,
                                           BumpAllocator* arena, float label_smoothing = 0.0f,
                                           LossTotals* totals = nullptr,
                                           const std::function<void(float loss)>& before_backward = {});

// --grad-hist: the gradients the optimizer was given (unscaled, clipped if asked), against f16's
// range as they are and at the scale the step used (train/grad_hist.h), all of them and then
// parameter by parameter (which layers' gradients underflow); the figure of all, as
// run.dir/grad-hist.svg, when run.trainer is set. train_epoch calls it after a run's first step.
void print_grad_hist(Module& model, float loss_scale, const RunInfo& run);

// One step on the batch (x, y): zero the model's grads, forward, softmax cross-entropy, backward (the
// model's input_needs_grad set to false: x is data) — once per micro-batch —, optional clipping,
// the optimizer's step, the arena's reset. Throws if opt.accumulate is not in [1, batch size].
StepResult train_step(Module& model, Optimizer& optimizer, const Tensor& x, const Tensor& y, const StepOptions& opt);

struct EpochResult {
    float loss = 0;                // mean training loss over the epoch
    double accuracy = 0;           // training accuracy over the epoch
    double images_per_second = 0;
    int64_t skipped = 0;           // steps the GradScaler skipped (an inf/NaN gradient)
    float loss_scale = 0;          // the GradScaler's scale at the epoch's end; 0 without one
};

// How to train: the loop's options (train_epoch) and the epochs' (fit, train/fit.h).
struct TrainOptions {
    int epochs = 1;
    LRScheduler* scheduler = nullptr;  // stepped after every epoch, or after every batch when
    bool per_batch = false;            // per_batch (OneCycleLR); null: the lr stays as it is
    BumpAllocator* arena = nullptr;    // each step's activations (reset after the step)
    float clip_norm = 0.0f;            // > 0: clip the gradients' global norm to it each step
    std::string save_dir;              // fit: a checkpoint after every epoch, save_dir/last.safetensors
    std::string resume;                // fit: continue from this checkpoint (train/checkpoint.h)
    DataLoader* test_mirrored = nullptr;  // fit: the test set flipped; also score with mirrors (evaluate.h)
    int accumulate = 1;                // micro-batches per optimizer step (StepOptions::accumulate)
    RunInfo run = {};                  // fit: with run.trainer set, run.json and curves.svg in run.dir
                                       // after every epoch (train/run_log.h)
    MemoryRecording* memory = nullptr;    // records the first steps' allocations; null: nothing recorded
    GradScaler* scaler = nullptr;      // loss scaling (StepOptions::scaler); saved in checkpoints
    DType amp = DType::F32;            // mixed precision (StepOptions::amp), evaluation included
    bool grad_hist = false;            // train_epoch: print the first step's gradient exponents
                                       // against f16's range (train/grad_hist.h); fit: first epoch only
    float label_smoothing = 0.0f;      // the loss's ε (StepOptions::label_smoothing)
    bool main_process = true;          // fit: false on data parallel ranks other than 0 (chapter 12),
                                       // which build each checkpoint (a collective under ZeRO-1) but
                                       // leave writing it, and run.json, to rank 0
    bool overwrite = false;            // fit: save_dir may hold another run's checkpoints, which this
                                       // run replaces (--overwrite); else that is refused
    int loss_read_every = 32;          // on a GPU, without a scaler or clipping: the losses read back
                                       // once per this many steps (train/loss_log.h); 1: every step
    bool cuda_graph = false;           // train_epoch: each step of the first step's shapes launched
                                       // as one captured CUDA Graph (train/step_graph.h, --cuda-graph)
};

// Trains one epoch (epoch counts from 0, of opt.epochs) with a progress bar. Throws kiln::Error
// if the loss or the gradients stop being finite, naming the epoch and the step — unless a
// GradScaler is in charge (opt.scaler), which skips such steps and goes on until its scale falls
// below kMinLossScale.
EpochResult train_epoch(Module& model, Optimizer& optimizer, DataLoader& loader, int epoch, const TrainOptions& opt);

}  // namespace kiln
