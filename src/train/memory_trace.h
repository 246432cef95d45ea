// memory_trace.h — where a training step's memory goes, measured: a recorder of every tensor
// allocation and free (time, bytes, category, phase, device, module), the per-module report of
// one step (the trainers' --mem-report), and the events of a few steps as JSON with their
// timeline as an SVG (--mem-trace FILE.json, which also writes FILE.svg).
//
//   MemoryRecorder rec(model);                    // observes every allocation from now on
//   train_step(model, sgd, x, y, {&arena});
//   rec.end_step();                               // the events so far are step 0
//   rec.stop();
//   MemoryTrace trace = rec.trace();
//   StepMemory m = measure_step(trace, 0, model, sgd, Device::CPU, &arena);
//   std::printf("%s", format_step_memory(m).c_str());
//   write_memory_trace(trace, Device::CPU, "trace.json", "lenet");   // and trace.svg
//
// Every figure counts the bytes the tensors asked for (Tensor::nbytes), before the allocator
// rounds them up; the report's pool lines say what the rounding adds. Recording costs time and
// memory only while a recorder is alive: without one an allocation reads one flag.
#pragma once
#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/allocator.h"
#include "data/loader.h"
#include "nn/module.h"
#include "optim/optimizer.h"
#include "train/cli.h"

namespace kiln {

// One tensor allocation (bytes > 0) or free (bytes < 0).
struct MemoryEvent {
    double time_us;      // since the recorder started
    int64_t bytes;       // + allocated, − freed
    Category category;
    Phase phase;
    Device device;
    std::string module;  // full name of the innermost module running (Module::name); "" outside any
    int step;            // the recorded step it belongs to: 0, 1, ...
    int64_t id;          // the allocation; its free has the same id (−1: allocated before the recording)
    bool freed() const { return bytes < 0; }
};

// How "" is shown: an allocation outside every module (the loss, the optimizer, the loader).
constexpr const char* kOutsideModules = "(step)";
std::string shown_name(const std::string& module);  // the module's name, or kOutsideModules for ""

// What a recording holds: the events, where the steps and the model's forwards ended, and what
// was in use when it started. Plain data: a copy, read while the recorder may go on.
struct MemoryTrace {
    std::vector<MemoryEvent> events;
    std::vector<size_t> step_ends;  // events before each step's end
    // Where a step's first forward of the model ended: the number of events before it, and the
    // id of its output (−1 if it was allocated before the recording); one per step, in order.
    struct ForwardEnd {
        size_t event;
        int64_t output_id;
    };
    std::vector<ForwardEnd> forward_ends;
    // Tensor bytes in use per category and device when the recording started (counted like the
    // events: before rounding).
    std::array<std::array<int64_t, kNumCategories>, 2> in_use_at_start{};

    int steps() const { return int(step_ends.size()); }  // steps ended
    // The events of step s: [first, last) in events.
    std::pair<size_t, size_t> step_events(int s) const;
};

class MemoryRecorder {
public:
    // Starts observing every tensor allocation (set_allocation_observer: one recorder at a time)
    // and the end of model's forward (a forward hook on it). The model must outlive the recorder.
    explicit MemoryRecorder(Module& model);
    ~MemoryRecorder();  // stop()
    MemoryRecorder(const MemoryRecorder&) = delete;
    MemoryRecorder& operator=(const MemoryRecorder&) = delete;

    void end_step();  // the events so far belong to the steps ended; the next ones to the next step
    void stop();      // no more events: the observer and the hook are removed
    bool recording() const { return hook_.has_value(); }
    MemoryTrace trace() const;  // what is recorded so far

private:
    void record(const AllocationEvent& e);
    void forward_ended(const Tensor& output);

    std::optional<HookHandle> hook_;  // set while recording
    std::chrono::steady_clock::time_point start_;
    mutable std::mutex mu_;  // the loader's prefetch thread allocates during a step
    MemoryTrace trace_;
    std::unordered_map<const void*, int64_t> live_ids_;  // address -> id of the live allocations seen
    int64_t next_id_ = 0;
};

// ---- the report of one step ----------------------------------------------------------------
// One module's own memory in one step, in tensor bytes (its children have rows of their own).
struct ModuleMemory {
    std::string name;              // full name (Module::name), or kOutsideModules
    int64_t parameters = 0;        // its parameters' values
    int64_t gradients = 0;         // their grads
    int64_t optimizer_state = 0;   // the optimizer's state of its parameters (Optimizer::state_of)
    int64_t activations_kept = 0;  // allocated by it in forward, still alive when the model's
                                   // forward ended (the model's output not counted)
    int64_t workspace_peak = 0;    // the most Workspace in use on the device at its allocations
};

// The moment of the step with the most tensor bytes in use on the device.
struct MemoryPeak {
    int64_t bytes = 0;
    std::array<int64_t, kNumCategories> by_category{};
    std::string module;  // of the allocation that reached it ("" outside every module)
    Phase phase = Phase::Other;
    double time_us = 0;  // since the step started
};

// Tensor bytes in use per category on one device, moved along a trace's events (the report's
// peak, the timeline's stack).
struct Levels {
    Device device;
    std::array<int64_t, kNumCategories> in_use;

    // The levels on `device` just before event `upto`.
    Levels(const MemoryTrace& trace, Device d, size_t upto);
    // Adds the event if it is on this device; says whether it was.
    bool apply(const MemoryEvent& e);
    int64_t total() const;
};

// The most tensor bytes in use on `device` over events [first, last): reached by an allocation,
// or, if none goes above it, the level before `first`.
MemoryPeak find_peak(const MemoryTrace& trace, Device device, size_t first, size_t last);

// The allocators' side at the end of the step: the device's pool and the step arena.
struct PoolMemory {
    std::string pool_name;
    int64_t reserved = 0;        // taken from the system: live blocks and cached ones
    int64_t allocated = 0;       // in live blocks (rounded sizes)
    int64_t requested = 0;       // what the live blocks' tensors asked for
    int64_t cached = 0;          // free blocks kept for reuse
    int64_t peak_reserved = 0, peak_allocated = 0;  // since the program started
    std::string arena_name;      // "" without an arena
    int64_t arena_capacity = 0, arena_high_water = 0;
    int64_t rounding() const { return allocated - requested; }      // what the size classes cost
    int64_t fragmentation() const { return reserved - allocated; }  // reserved but handed to no one
};

struct StepMemory {
    Device device = Device::CPU;
    int step = 0;
    std::vector<ModuleMemory> modules;  // the model's tree in order, then kOutsideModules if it holds anything
    ModuleMemory total;                 // column sums; workspace_peak: the step's most Workspace in use
    MemoryPeak peak;
    PoolMemory pool;
};

// Measures the recorded step `step` on `device`: parameters, gradients and optimizer state from the
// model and optimizer as they are now; activations kept, workspace and the peak from the events;
// the pool and `arena` (may be null) as they are now.
StepMemory measure_step(const MemoryTrace& trace, int step, Module& model, const Optimizer& optimizer,
                        Device device, const BumpAllocator* arena);
// The table per module, the totals, the peak, the pool and the arena, as text.
std::string format_step_memory(const StepMemory& m);

// ---- the trace -----------------------------------------------------------------------------
// FILE.json -> FILE.svg
std::string timeline_path(const std::string& trace_json);
// Throws kiln::Error, naming the path and what to try, unless `trace_json` ends in .json and it
// and its .svg can be written. The trainers call it before training starts.
void check_trace_path(const std::string& trace_json);
// Writes every recorded event as JSON (a header with the device, the categories, the phases and
// the bytes in use at the start, then one object per event) to trace_json, and the timeline of
// `device` (memory in use over time stacked by category, phases shaded, the peak marked) to
// timeline_path(trace_json). `model_name` goes into the figure's title.
void write_memory_trace(const MemoryTrace& trace, Device device, const std::string& trace_json,
                        const std::string& model_name);

// ---- what a trainer does with --mem-report and --mem-trace ---------------------------------
struct MemoryTraceOptions {
    bool report = false;     // print the report of the first step (--mem-report)
    std::string trace;       // write the first trace_steps steps to this .json and its .svg (--mem-trace)
    int trace_steps = 2;     // --mem-trace-steps
    Shape input;             // a step's (micro-)batch x: the report prints the prediction for it
                             // (train/memory_model.h) beside what it measured
    DType amp = DType::F32;  // --amp: the memory model predicts f32 steps only, so none then
};

// The training loop's side (TrainOptions::memory): records from the first step on, prints the
// report after it, writes the trace after trace_steps steps (or at finish(), if training ends
// first), then stops recording.
class MemoryRecording {
public:
    // Checks the trace path now (check_trace_path), before any step runs.
    MemoryRecording(MemoryTraceOptions options, Module& model, const Optimizer& optimizer, Device device,
                    const BumpAllocator* arena);
    void step_begins();  // before the step's batch is loaded
    void step_ends();
    void finish();       // stops recording; writes the trace if it is still due

private:
    std::string predicted_beside(int64_t measured_peak) const;
    MemoryTraceOptions options_;
    Module& model_;
    const Optimizer& optimizer_;
    Device device_;
    const BumpAllocator* arena_;
    std::optional<MemoryRecorder> recorder_;
    int steps_done_ = 0;
    bool finished_ = false;
    int steps_wanted() const;
};

// The recording a trainer's flags ask for (--mem-report, --mem-trace, --mem-trace-steps) of
// `model` on the device of the optimizer's parameters, a step's batch shaped as `train`'s
// images; null when they ask for none. For TrainOptions::memory:
//   auto memory = memory_recording(flags, model, sgd, &arena, mnist.train);
//   opt.memory = memory.get();
std::unique_ptr<MemoryRecording> memory_recording(const CommonFlags& flags, Module& model, const Optimizer& optimizer,
                                                  const BumpAllocator* arena, const DataLoader& train);

}  // namespace kiln
