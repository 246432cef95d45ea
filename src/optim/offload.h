// offload.h — the optimizer in the host's memory (chapter 15; ZeRO-Offload's idea: Ren et al.,
// "ZeRO-Offload: Democratizing Billion-Scale Model Training", USENIX ATC 2021). On a GPU, Adam
// keeps two f32 moments per parameter beside the weights and their gradients: 16 of the 16 + 8
// bytes a parameter f32 training holds before any activation (chapter 08). Offloaded, the GPU
// keeps only the weights and their gradients; the host keeps, in page-locked ("pinned") memory
// that the copy engines reach directly,
//   the f32 master weights   the copy the update writes (4 bytes a parameter)
//   the gradients            the device's, copied down each step (4 bytes a parameter)
//   the optimizer's state    SGD's momentum buffer, Adam's m and v (4 bytes a slab)
// Two schedules run the same math (step t's forward reads step t − 1's update: no delayed update).
//
// Serial (OffloadSchedule::Serial, lesson-14 --offload-schedule serial): after backward,
//   1. the gradients device → host       (one blocking copy each: the host waits for backward)
//   2. the update on the CPU             the same rule, one group one call of the CPU kernel
//   3. the updated weights host → device (queued from pinned memory on the launch stream)
// The GPU idles through 1–3.
//
// Overlapped (OffloadSchedule::Overlapped, the default). The gradient slab is cut into buckets as
// DataParallel cuts it (nn/grad_buckets.h: bucket 0 holds the last layers, which backward
// finishes first), and a second, non-blocking stream carries the copies (core/cuda_stream.h's
// CopyStream), so three things run at once: the GPU's kernels, the copy engine, a host thread.
//   backward finishes bucket b   (the backward hook of the last of its layers, on the trainer's thread)
//     → event grads_ready[b] on the launch stream; the copy stream waits for it, copies b's
//       gradients down into the pinned slab and records grads_down[b]
//   the update thread takes b    (once step() is certain: below)
//     → waits (host) for grads_down[b] — the gradients have arrived — and for weights_up[b] of the
//       step before (that copy has read the masters it is about to change); runs the rule on b's
//       parameters; queues b's weights up on the copy stream and records weights_up[b]
//   the next forward reaches a layer of bucket b (its forward pre-hook)
//     → waits (host) until b's update has been queued, then the launch stream waits for
//       weights_up[b] (cudaStreamWaitEvent): that layer's kernels, and only they, wait for b's copy
// The update thread takes the ready bucket whose layers the next forward reads first (the highest
// b), so after backward the first layers are updated first and the next forward starts while the
// last layers' buckets are still being updated and copied. step() itself returns at once; the
// launch stream waits for every grads_down (the next zero_grad would overwrite what they read).
//
//   GPU    backward L3    L2    L1    L0 |        forward L0    L1    L2    L3
//   copy            ↓b0   ↓b1 ↑b0  ↑b1 ↓b2    ↑b2        (b0 = L3, b1 = L2, b2 = L1 and L0;
//   CPU                upd b0 upd b1     upd b2           ↓ gradients down, ↑ weights up)
//   forward L0 waits for ↑b2 only (L2 for ↑b1, L3 for ↑b0: long done).
//
// When the update may begin. Whether a step follows, and on which gradients, is known only after
// backward when something reads all of them first. train_step says which before the last
// backward (Optimizer::before_last_backward):
//   Step    no clipping, no GradScaler, finite losses: each bucket is updated as soon as its
//           gradients are down, while backward goes on with the layers before it.
//   Clip    gradient clipping: the copies go down during backward, but the updates wait for the
//           global norm (clip_gradients, on the GPU as before); each bucket's host gradients are
//           then multiplied by the same f32 factor the GPU's are (the same bits), and updated
//           first-layer-first, overlapping the next forward. An inf/NaN norm skips the step.
//   Other   a GradScaler (it unscales the gradients in place and may skip the step) or a
//           non-finite loss: the whole-step schedule — copies and updates start at step(), still
//           first-layer-first and overlapping the next forward. So does a step() train_step did
//           not announce.
// The update's bits do not depend on timing: each bucket is updated once a step, from its own
// gradients, with the step's lr and count, whichever thread gets there first. Weights read other
// than through a forward (a checkpoint, a test) need synchronize() first: train/checkpoint.cpp
// calls it. A layer must be the first to read the parameters it owns in forward (GPT's tied wte
// is the embedding's, read before lm_head's).
//
// PCIe carries 4Ψ bytes each way a step (train/memory_plan.h's offload_bytes_each_way).
// ZeRO-Offload goes further and hides the update behind the next step with a one-step delayed
// parameter update (DPU: step t's forward runs on the weights of step t − 2), which changes the
// training's math; kiln does not build it.
//
// Under mixed precision (chapter 09's autocast) kiln's parameters are the f32 masters on the GPU
// (the f32 ops — layer norm, the loss — read them; the 16-bit copies are made each step), so
// offload moves the optimizer's state and a host copy of the weights there too, and the
// gradients and weights cross PCIe in f32. The planner's mixed rows count ZeRO-Offload's layout
// instead: 16-bit weights and gradients on the GPU, 2 bytes each way.
//
// The numbers are the same bits as the optimizer left on the GPU, where the GPU's and the CPU's
// kernels agree bit for bit (on kiln's emulator they do: tests/test_offload.cpp; nvcc may contract
// a·b + c into one fused multiply-add, the CPU build does not).
//
//   auto opt = offload_optimizer(gpt_optimizer(model, recipe), model);  // built on the GPU's parameters
//   train_step(model, *opt, x, y, step);                               // as any optimizer
//   opt->synchronize();                                                // before reading the weights
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/allocator.h"
#include "nn/grad_buckets.h"
#include "optim/optimizer.h"

namespace kiln {

// An allocator of host (Device::CPU) memory that is page-locked: cudaMallocHost per allocation,
// no cache (the optimizer's slabs are made once). Counted as the host's, by category, in
// device_memory_stats(Device::CPU); stats() alone is the pinned bytes.
class PinnedHostAllocator : public Allocator {
public:
    PinnedHostAllocator() : Allocator("pinned host", Device::CPU) {}
    ~PinnedHostAllocator() override;
    void* allocate(size_t bytes, Category category) override;
    void deallocate(void* ptr) override;

private:
    struct Block { size_t size, requested; Category category; };
    std::map<void*, Block> live_;
};

enum class OffloadSchedule { Serial, Overlapped };
const char* offload_schedule_name(OffloadSchedule s);  // "serial", "overlapped"

// A moment of the overlapped schedule, for whoever watches it (the tests record the order).
struct OffloadEvent {
    enum Kind {
        GradsDown,     // bucket's gradients queued device → host (trainer's thread)
        UpdateBegins,  // the update thread takes the bucket
        UpdateEnds,    // its update done, its weights queued host → device (update thread)
        ForwardWaits,  // a layer's forward pre-hook waits for the bucket's weights (trainer's thread)
    } kind;
    size_t bucket;
};
const char* offload_event_name(OffloadEvent::Kind kind);

struct OffloadOptions {
    OffloadSchedule schedule = OffloadSchedule::Overlapped;
    int64_t bucket_bytes = 25 << 20;  // as DataParallel's (DDP's bucket_cap_mb = 25)
    // Called at each OffloadEvent on the thread where it happens; it may block (a test holds a
    // thread to show what runs meanwhile).
    std::function<void(const OffloadEvent&)> observer;
};

class OffloadedOptimizer : public Optimizer {
public:
    // Takes over an SGD, Adam or AdamW whose parameters are on the GPU (Device::CUDA): the same
    // groups, options and state (moved to the host if it has stepped); the weights' host copies
    // are taken now. Refuses parameters on the CPU (nothing to offload: drop --offload) and any
    // other optimizer (a ZeRO optimizer, which shards instead, included) by name. A scheduler is
    // attached to this optimizer, not to the one given (which is gone after this).
    // The serial schedule, which needs no model.
    explicit OffloadedOptimizer(std::unique_ptr<Optimizer> device_optimizer);
    // `options.schedule` over `model` (packed, every parameter in the optimizer; it must outlive
    // this optimizer, which hooks its layers when overlapped).
    OffloadedOptimizer(std::unique_ptr<Optimizer> device_optimizer, Module& model, OffloadOptions options);
    ~OffloadedOptimizer() override;
    void step() override;
    void before_last_backward(AfterBackward next) override;
    // Overlapped: the norm and the clipped gradients on the GPU as clip_grad_norm has them (after
    // the copies down have read them), and the factor kept for the host's copies.
    float clip_gradients(const std::vector<Parameter*>& params, float max_norm) override;
    void synchronize() override;  // every bucket updated and its weights on the launch stream's side
    std::vector<Tensor> state_of(size_t i) const override;
    const Optimizer& rule() const override { return host_->rule(); }
    // The host optimizer's keys, which are the optimizer's own (the host parameters carry the
    // GPU's names): a checkpoint resumes with or without offload.
    void save_state(StateDict& state, const std::string& prefix) const override;
    // Loads the state, then takes the weights' host copies again from the GPU's: load the model
    // first (train/checkpoint.cpp does).
    void load_state(const StateDict& state, const std::string& prefix) override;

    // The host's pinned bytes (masters, gradients, state), by category.
    MemoryStats host_stats() const { return pinned_->stats(); }
    // Bytes over PCIe a step: gradients down, weights up (equal: 4 bytes a parameter).
    int64_t bytes_each_way() const;
    OffloadSchedule schedule() const { return pipeline_ ? OffloadSchedule::Overlapped : OffloadSchedule::Serial; }
    const std::vector<GradBucket>& buckets() const;  // overlapped: the buckets (bucket 0 finished first)

private:
    class Pipeline;  // the overlapped schedule: copy stream, events, hooks, update thread (offload.cpp)

    std::unique_ptr<PinnedHostAllocator> pinned_;
    std::vector<Parameter> host_params_;  // one per device parameter, groups in order: master + gradient
    Tensor host_values_, host_grads_;     // their slabs (pinned)
    std::unique_ptr<Optimizer> host_;     // the rule, over host_params_
    std::unique_ptr<Pipeline> pipeline_;  // null: the serial schedule

    std::vector<Parameter*> device_params() const;
    void take_weights_from_device();
    void set_host_groups();  // the groups' lr and weight decay of now onto the host rule
};

// The same optimizer with its state on the host: a CUDA device's parameters only. Without a model,
// the serial schedule; with one, options.schedule (overlapped by default).
std::unique_ptr<Optimizer> offload_optimizer(std::unique_ptr<Optimizer> device_optimizer);
std::unique_ptr<Optimizer> offload_optimizer(std::unique_ptr<Optimizer> device_optimizer, Module& model,
                                             OffloadOptions options = {});

}  // namespace kiln
