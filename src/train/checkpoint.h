// checkpoint.h — saving a training run to one file and resuming it exactly.
//
//   TrainingRun run{*model, sgd, &scheduler, &loader, {{"dropout", &dropout.rng}}};
//   save_checkpoint("runs/epoch-3.safetensors", run, {epoch + 1, 0, step});   // end of an epoch
//   ResumePoint at = load_checkpoint("runs/epoch-3.safetensors", run);    // a fresh run, same flags
//   // ... continue with epoch at.epoch, its first at.position images already trained on
//
// A checkpoint is one StateDict (core/state.h) in the safetensors layout, which Hugging Face's
// `safetensors` package reads (io/safetensors.h: the layout, its checksums, how a save stays
// whole when it is interrupted, and how to open one in Python).
//
// The names: the model's tensors as the model names them ("conv1.weight", "bn1.running_mean"),
// so a Python user sees the same names; the optimizer's under "optimizer.", the scheduler's under
// "scheduler." (ReduceLROnPlateau's under "plateau."), a GradScaler's values under "scaler."
// (--amp f16), the loader position, epoch and RNG counters under "train.". Every value a resume
// reads is checked to lie in its range (an epoch of the schedule, a position in the epoch, a
// positive loss scale, ...). In Python:
//
//   from safetensors.torch import load_file
//   weights = {k: v for k, v in load_file(path).items()
//              if not k.startswith(("optimizer.", "scheduler.", "plateau.", "lookahead.", "train."))}
//   net.load_state_dict(weights)
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "core/rng.h"
#include "core/state.h"
#include "data/loader.h"
#include "io/safetensors.h"
#include "nn/module.h"
#include "optim/grad_scaler.h"
#include "optim/lookahead.h"
#include "optim/optimizer.h"
#include "optim/scheduler.h"

namespace kiln {

// ---- the model ------------------------------------------------------------------------------
// The model's parameters and buffers (batch norm's running statistics), as CPU copies under
// their names.
void save_model(StateDict& state, Module& model);
// Copies them back onto the model's device. A missing tensor, or one whose shape or dtype
// differs from the model's, is an error naming it (and both shapes); so is a tensor that is
// not the model's and not under "optimizer.", "scheduler.", "plateau.", "lookahead." or "train." (a
// checkpoint of another model).
void load_model(const StateDict& state, Module& model);

// ---- a training run -------------------------------------------------------------------------
// What a run's learning-rate schedule was laid out as: the number of epochs and the lr (first
// group) it gives at the start of each. A scheduler's settings (its kind, --lr, the epochs a
// one-cycle spans, a warm-up) all show in these lrs, so comparing them catches a resume with
// other schedule flags without knowing every scheduler's parameters.
struct ScheduleRecord {
    int64_t epochs = 0;                // 0: not recorded (a run not driven by epochs)
    std::vector<float> epoch_start_lrs;  // lr at the start of epoch 0, 1, ..., epochs − 1
};

// The record of a run of `epochs` epochs whose scheduler (null: a constant lr) is stepped
// steps_per_epoch times an epoch (1 for an epoch scheduler, the batches for a per-batch one).
// Pure: the scheduler is not stepped.
ScheduleRecord record_schedule(const Optimizer& optimizer, const LRScheduler* scheduler, int64_t epochs,
                               int64_t steps_per_epoch);

// The parts of a run a checkpoint holds. The same struct saves and loads.
struct TrainingRun {
    Module& model;
    Optimizer& optimizer;
    LRScheduler* scheduler = nullptr;                     // optional
    DataLoader* loader = nullptr;                         // optional: checked, then positioned
    std::vector<std::pair<std::string, Rng*>> rngs = {};  // e.g. {"dropout", &dropout.rng}
    ReduceLROnPlateau* plateau = nullptr;                 // optional, under "plateau."
    ScheduleRecord schedule = {};                         // optional (epochs > 0): saved, then
                                                          // checked against the checkpoint's
    GradScaler* scaler = nullptr;                         // optional, under "scaler." (--amp f16)
    Lookahead* lookahead = nullptr;                       // optional, its slow weights under
                                                          // "lookahead." (chapter 13)
};

// Where a run continues from: epoch `epoch` (counted from 0) with its first `position` images
// already trained on, after `step` optimizer steps in all. At the end of epoch e that is
// {e + 1, 0, steps}; in the middle, {e, loader.position(), steps}.
struct ResumePoint {
    int64_t epoch = 0, position = 0, step = 0;
};

// Model + optimizer ("optimizer.") + schedulers ("scheduler.", "plateau.") + GradScaler
// ("scaler.": scale, growth tracker, factors, interval) + Lookahead ("lookahead.") + the RNGs'
// seeds and counters, the loader's size and seed, the schedule record and `at` ("train.") into
// one file, written as write_safetensors does.
void save_checkpoint(const std::string& path, TrainingRun& run, const ResumePoint& at);
// What save_checkpoint writes, as a StateDict sharing the CPU tensors. Under data parallel
// training (chapter 12) every rank builds it — a ZeRO-1 optimizer gathers its pieces here, with
// every rank — and rank 0 alone writes it.
StateDict checkpoint_state(TrainingRun& run, const ResumePoint& at);

// The random streams' seeds and counters, under "train.rng.<name>.seed" and ".counter": what
// checkpoint_state writes of run.rngs and load_checkpoint puts back (the streams go on as they
// were, whatever this run's seed).
void save_streams(StateDict& state, const std::vector<std::pair<std::string, Rng*>>& rngs);
void load_streams(const StateDict& state, const std::vector<std::pair<std::string, Rng*>>& rngs);

// Reads a checkpoint into a freshly built run (same model, optimizer and flags), puts the
// loader at `at.epoch`, `at.position` and returns `at`. The run continues exactly: the loader
// takes the checkpoint's seed (the data order and augmentations go on as they were, whatever
// this run's --seed) and every RNG of run.rngs its seed and counter. Errors name the file and
// the tensor or value; a run set up differently (another training set size or batch size,
// number of epochs or schedule, or another number of data parallel ranks) is refused, naming
// the flag — so is a run with a GradScaler resuming a checkpoint saved without one, or the
// reverse (the --amp f16 flag). After an error the run is partly loaded and should not be
// trained on.
ResumePoint load_checkpoint(const std::string& path, TrainingRun& run);

}  // namespace kiln
