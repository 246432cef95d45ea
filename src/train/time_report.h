// time_report.h — where a training step's time goes, layer by layer: the time budget of an
// epoch (lesson-13 --time-report N). Chapter 08's --mem-report says where a step's memory goes;
// this says where its time goes.
//
//   StepTimer timer(model, Device::CPU);   // hooks on every layer: forward and backward timed
//   while (...) {
//       timer.step_begins();                // before the batch is loaded
//       loader.next(batch);
//       timer.batch_loaded();
//       train_step(model, sgd, batch.x, batch.y, options);   // and whatever else a step does
//       timer.step_ends();
//   }
//   std::printf("%s", format_time_report(timer.report(), loader.num_batches()).c_str());
//   write_time_report_svg(timer.report(), "time.svg", "lesson-13, batch 1024");
//
// A layer is a module without children (a Sequential or a Residual is not timed itself: its
// layers are). Each one's forward is timed from its forward pre-hook to its forward hook, its
// backward from its backward pre-hook to its backward hook (nn/module.h), summed over the timed
// steps; a layer run twice in a step (recomputed in backward, chapter 08) is charged twice. What
// runs outside every layer — the loss, clearing gradients, the optimizer, Lookahead — is the
// step's time less the layers' and the batch's.
// The first `skip` steps are not timed: the first step grows the arena in chunks, allocates the
// packing buffers and touches fresh pages; reset() then trades the chunks for one slab, whose
// pages the second step touches for the first time (each first touch a page fault: zeroing 4 KiB). On CUDA each hook synchronizes the device first, so a layer
// is charged its kernels rather than their launches (and the step runs slower than untimed).
// On CUDA the timed steps' kernels are also timed one by one, by CUDA events around each launch
// (core/cuda_memory.h take_kernel_times): the GPU's own time per kernel, summed by kernel name,
// what a profiler's kernel summary shows, with no profiler. With KILN_PROFILE_TIMED_STEPS=1 in the
// environment the timed steps are also a profiler's capture range (core/cuda_memory.h
// set_profiler_capture), so that `ncu --profile-from-start off` profiles exactly them.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "core/cuda_memory.h"
#include "core/device.h"
#include "nn/module.h"

namespace kiln {

// One layer's time over the timed steps, in seconds.
struct LayerTime {
    std::string name;  // full name (Module::name)
    Shape output;      // its forward's output, as last seen
    double forward = 0, backward = 0;
};

struct TimeReport {
    std::vector<LayerTime> layers;  // in the model's order
    std::vector<cuda::KernelTime> kernels;  // on CUDA: each kernel's launches and ms over the timed steps
    int steps = 0;                  // timed steps
    double step = 0;                // their whole time, from step_begins to step_ends
    double data = 0;                // of which loading batches (step_begins to batch_loaded)
    double in_layers() const;       // Σ forward + backward over the layers
    double outside() const { return step - data - in_layers(); }
};

class StepTimer {
public:
    // Registers the hooks on every layer of `model` (which must outlive the timer) and times the
    // steps after the first `skip`.
    StepTimer(Module& model, Device device, int skip = 2);
    ~StepTimer();  // removes the hooks
    StepTimer(const StepTimer&) = delete;
    StepTimer& operator=(const StepTimer&) = delete;

    void step_begins();
    void batch_loaded();
    void step_ends();
    int steps_timed() const { return report_.steps; }
    const TimeReport& report() const { return report_; }

private:
    using Clock = std::chrono::steady_clock;
    double since(Clock::time_point t0) const;  // seconds, after synchronizing a CUDA device
    void add_hooks(Module& layer, size_t index);

    Device device_;
    bool profile_ = false;  // KILN_PROFILE_TIMED_STEPS=1: the timed steps are the profiler's range
    int skip_, steps_begun_ = 0;
    bool timing_ = false;  // the current step is timed
    Clock::time_point step_start_, layer_start_;
    TimeReport report_;
    std::vector<HookHandle> hooks_;
};

// The report as a table: per layer its output shape, forward, backward and total milliseconds per
// step (the mean of the timed steps), its share of the step and its seconds in an epoch of
// `steps_per_epoch` steps; then loading the batch, the rest outside the layers, and the step.
// With kernel times (CUDA), a second table: per kernel, slowest first, its launches and
// milliseconds per step and its share of all kernels' time, then their sum against the step.
std::string format_time_report(const TimeReport& r, int64_t steps_per_epoch);
std::string format_kernel_times(const TimeReport& r);  // the second table alone

// The same as a figure: a bar per layer, forward and backward stacked, in milliseconds per step,
// then the batch's and the outside's bars. Throws kiln::Error naming the path if it cannot write.
void write_time_report_svg(const TimeReport& r, const std::string& path, const std::string& title);

}  // namespace kiln
