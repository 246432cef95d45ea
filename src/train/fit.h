// fit.h — what every chapter's trainer does around the training loop: the epochs with their
// learning-rate schedule and evaluation, the final report, and MNIST's loader settings.
//
//   MnistData mnist(flags, device);        // the sets and their loaders
//   double acc = fit(model, sgd, mnist.train, mnist.test, flags, &arena);
//   report(flags, device, acc, start);   // memory summary, then the result line
//
// Chapter 07 passes its own scheduler through TrainOptions (train/loop.h), made from the flags:
//   FlagTraining t = train_options(flags, model, sgd, train, &arena);   // --save, --accumulate, --amp, ...
//   OneCycleLR sched(sgd, max_lr, flags.epochs * train.num_batches());
//   t.options.scheduler = &sched, t.options.per_batch = true;
//   fit(model, sgd, train, test, t.options);
#pragma once
#include <chrono>
#include <memory>
#include <string>

#include "core/allocator.h"
#include "data/image_set.h"
#include "data/loader.h"
#include "nn/module.h"
#include "optim/grad_scaler.h"
#include "optim/optimizer.h"
#include "optim/scheduler.h"
#include "train/cli.h"
#include "train/checkpoint.h"
#include "train/loop.h"
#include "train/memory_trace.h"
#include "train/time_report.h"

namespace kiln {

// The most memory in use on the device at one moment during each part of a run: the training
// steps, the evaluations, and the checkpoint saves (--save). fit prints them after the last
// epoch, as "memory peaks: training steps 20.4MiB, evaluation 6.3MiB".
struct RunPeaks {
    int64_t training = 0, evaluation = 0, saving = 0;
    std::string str() const;
};

// Trains opt.epochs epochs, printing the lr and the test accuracy after each, and the memory
// peaks (RunPeaks) at the end; returns the last accuracy. With opt.resume it first loads that checkpoint (model, optimizer, scheduler, data
// order) and continues after its epoch, refusing one laid out over other epochs or with another
// schedule; with opt.save_dir it saves one after every epoch (save_dir/last.safetensors, the
// one before kept as save_dir/prev.safetensors). With opt.run.trainer set it keeps the run's log
// (train/run_log.h): opt.run.dir/run.json and curves.svg, rewritten after every epoch.
double fit(Module& model, Optimizer& optimizer, DataLoader& train, DataLoader& test, const TrainOptions& opt);

// The shared flags that shape training, in TrainOptions for fit (each marked used,
// CommonFlags::use): --epochs, --save and --resume, --accumulate, the run's log (run_info),
// --mem-report, --mem-trace and --mem-trace-steps (memory_recording), --amp and --grad-hist
// (set_precision, with a GradScaler for f16), rank 0 as the main process. The arena is
// TrainOptions::arena. No scheduler: the caller sets its own. FlagTraining owns what the options
// point to (the recording, the scaler).
struct FlagTraining {
    TrainOptions options;
    std::unique_ptr<MemoryRecording> memory;
    std::unique_ptr<GradScaler> scaler;
};
FlagTraining train_options(const CommonFlags& flags, Module& model, const Optimizer& optimizer,
                           const DataLoader& train, BumpAllocator* arena);

// How a trainer with a loop of its own runs each step from the flags (--accumulate, --amp with
// its GradScaler, which `scaler` receives): for train_step.
StepOptions step_options(const CommonFlags& flags, BumpAllocator* arena, std::unique_ptr<GradScaler>& scaler);

// --save and --resume for a trainer with a loop of its own (chapter 13), as fit does them:
// save_epoch writes save_dir/last.safetensors after `epochs_done` epochs (the one it replaces
// becomes save_dir/prev.safetensors; nothing is written but by the main process);
// resume_from loads a checkpoint saved at the end of an epoch into the run and returns the
// epochs it had done.
// check_save_dir refuses, before any training, a save_dir holding another run's checkpoints,
// unless opt.overwrite (--overwrite) or opt.resume continues that run.
void check_save_dir(const TrainOptions& opt);
void save_epoch(const std::string& save_dir, TrainingRun& run, int epochs_done, bool main_process);
// What save_epoch writes with: `state` to save_dir/last.safetensors (the folder made if need be),
// the last one kept as save_dir/prev.safetensors; prints "saved PATH".
void save_last(const std::string& save_dir, const StateDict& state);
int resume_from(const std::string& path, TrainingRun& run);

// The earlier chapters' fit: flags.epochs epochs (and --save, --resume) with step decay
// (MultiStepLR with one milestone):
//   lr = base_lr               for epoch < max(1, ⌊0.7 · epochs⌋)
//   lr = base_lr / 10          after: the last 30% of the epochs fine-tune
// and the log of run_info(flags): --save DIR, or runs/<trainer>/ (none without flags.cli);
// with --amp f16 a GradScaler (grad_scaler(flags)), with --grad-hist the first step's histogram.
double fit(Module& model, Optimizer& optimizer, DataLoader& train, DataLoader& test, const CommonFlags& flags,
           BumpAllocator* arena);

// --find-batch-size and --time-report N measure instead of training: runs the one asked for
// (the largest batch that fits in --mem-limit, train/batch_size.h, with the trainer's steps:
// its arena or none, its --accumulate micro-batches; or N training steps after the first two,
// timed layer by layer, train/time_report.h), prints it and returns true, for the trainer to
// stop (after CommonFlags::check_used); returns false when neither was asked for.
//   if (only_measure(model, sgd, cifar.train, flags, &arena)) return 0;
bool only_measure(Module& model, Optimizer& optimizer, DataLoader& train, const CommonFlags& flags,
                  BumpAllocator* arena);

// What --time-report prints: the table of r (format_time_report, train/time_report.h) and, with
// --time-svg, its figure, titled "<trainer>: one step of batch B, amp A".
void print_time_report(const TimeReport& r, int64_t steps_per_epoch, const CommonFlags& flags);

// The GradScaler a trainer's flags ask for: PyTorch's defaults with --amp f16 (f16's range
// needs loss scaling), none otherwise (null) — bf16 has f32's exponent range, and f32 needs none.
// A trainer that builds its own TrainOptions calls set_precision below.
std::unique_ptr<GradScaler> grad_scaler(const CommonFlags& flags);

// --amp and --grad-hist into opt (amp, grad_hist, and the scaler of grad_scaler(flags), which
// the caller keeps alive for the run): for a trainer that builds its own TrainOptions.
std::unique_ptr<GradScaler> set_precision(const CommonFlags& flags, TrainOptions& opt);

// Prints the memory summary of the device, the peaks of memory in use and reserved, and, last,
// the result line:
//   peak memory: 99.2MiB in use at once (peak_mem), 249.1MiB reserved from the system (what --mem-limit counts)
//   result: test_acc=98.42% time=41.3s peak_mem=12.6MiB
// Then checks that the run used every shared flag it was given (CommonFlags::check_used).
void report(const CommonFlags& flags, Device device, double test_accuracy,
            std::chrono::steady_clock::time_point start);

// The test set is scored in batches of the training step's size (a micro-batch with
// --accumulate, one rank's share under data parallel training), in the same arena: evaluation keeps no caches, so it never needs more memory
// than a training step (a larger test batch would: LeNet's im2col for 1000 images is 57 MiB).
int64_t test_batch_size(const CommonFlags& flags);

// MNIST batches: pixels normalized with the training set's mean 0.1307 and std 0.3081.
// train = true: shuffled batches of --batch-size from --seed (of this rank's share of each epoch,
// batch_size / world_size at a time, under data parallel training); false: test_batch_size, in order.
LoaderOptions mnist_loader_options(const CommonFlags& flags, Device device, bool train);

// What an MNIST trainer reads: the training set (--limit images of it, if given) and the
// test set from --data, and a loader for each (mnist_loader_options) delivering to `device`.
struct MnistData {
    MnistData(const CommonFlags& flags, Device device);
    ImageSet train_set, test_set;  // declared before the loaders, which keep references to them
    DataLoader train, test;
};

// What a CIFAR-10 trainer reads, likewise (--data, --limit, --batch-size, --seed): pixels
// normalized with the training set's per-channel mean and std; the training batches shuffled,
// full batches only, with random crops (padding 4) and horizontal flips; the test set in order,
// test_batch_size at a time, not augmented; test_mirrored: the test set again, each image flipped left
// to right (for TrainOptions::test_mirrored).
struct CifarData {
    CifarData(const CommonFlags& flags, Device device);
    ImageSet train_set, test_set;
    DataLoader train, test, test_mirrored;
};

}  // namespace kiln
