// offload.h — the optimizer in the host's memory (chapter 15; ZeRO-Offload's idea: Ren et al.,
// "ZeRO-Offload: Democratizing Billion-Scale Model Training", USENIX ATC 2021). On a GPU, Adam
// keeps two f32 moments per parameter beside the weights and their gradients: 16 of the 16 + 8
// bytes a parameter f32 training holds before any activation (chapter 08). Offloaded, the GPU
// keeps only the weights and their gradients; the host keeps, in page-locked ("pinned") memory
// that the copy engines reach directly,
//   the f32 master weights   the copy the update writes (4 bytes a parameter)
//   the gradients            the device's, copied down each step (4 bytes a parameter)
//   the optimizer's state    SGD's momentum buffer, Adam's m and v (4 bytes a slab)
// and each step is
//   1. the gradients device → host       (one copy each, after backward: the host waits for it)
//   2. the update on the CPU             the same rule, one group one call of the CPU kernel
//                                        (ops/kernels/optim.h: one parallel region per group)
//   3. the updated weights host → device (queued copies from pinned memory, one each)
// PCIe carries 4Ψ bytes each way a step (train/memory_plan.h's offload_bytes_each_way).
//
// What overlaps: nothing with the GPU's computation. The copies down wait for backward; the update
// needs all of them; the next forward needs the weights back. The copies up are async from
// pinned memory, so step() returns once they are queued, and the next step's kernels are queued
// behind them on the same stream — the host goes on to the next batch while the bus copies, but
// the GPU idles during 1–3. ZeRO-Offload hides the update behind the next step with a one-step
// delayed parameter update (DPU: step t's forward runs on the weights of step t − 2), which
// changes the training's math; kiln does not build it.
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
//   auto opt = offload_optimizer(gpt_optimizer(model, recipe));  // built on the GPU's parameters
//   train_step(model, *opt, x, y, step);                        // as any optimizer
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "core/allocator.h"
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

class OffloadedOptimizer : public Optimizer {
public:
    // Takes over an SGD, Adam or AdamW whose parameters are on the GPU (Device::CUDA): the same
    // groups, options and state (moved to the host if it has stepped); the weights' host copies
    // are taken now. Refuses parameters on the CPU (nothing to offload: drop --offload) and any
    // other optimizer (a ZeRO optimizer, which shards instead, included) by name. A scheduler is
    // attached to this optimizer, not to the one given (which is gone after this).
    explicit OffloadedOptimizer(std::unique_ptr<Optimizer> device_optimizer);
    void step() override;
    std::vector<Tensor> state_of(size_t i) const override { return host_->state_of(i); }
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

private:
    std::unique_ptr<PinnedHostAllocator> pinned_;
    std::vector<Parameter> host_params_;  // one per device parameter, groups in order: master + gradient
    Tensor host_values_, host_grads_;     // their slabs (pinned)
    std::unique_ptr<Optimizer> host_;     // the rule, over host_params_

    std::vector<Parameter*> device_params() const;
    void take_weights_from_device();
};

// The same optimizer with its state on the host: a CUDA device's parameters only.
std::unique_ptr<Optimizer> offload_optimizer(std::unique_ptr<Optimizer> device_optimizer);

}  // namespace kiln
