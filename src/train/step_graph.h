// step_graph.h — a training step captured once as a CUDA Graph and launched as one call per step:
// the trainers' --cuda-graph (chapters 04 and 05), TrainOptions::cuda_graph.
//
// Why. Each kernel launch costs the host a few microseconds; lesson 05's LeNet step is about a
// hundred launches of kernels that each run for about as long, so the GPU spends much of the step
// waiting for the host. A graph (core/cuda_memory.h cuda::Graph) hands the GPU the whole step in
// one launch.
//
// What capture requires, and how this class meets it:
//   static shapes     the step is captured for one batch shape; a batch of another shape (the
//                     epoch's last, smaller one) runs uncaptured, as train_step.
//   static addresses  the graph replays the pointers it recorded. Each batch is copied into the
//                     graph's own input tensors before the launch; the step's activations come
//                     from the graph's own arena and its other temporaries (the loss's scratch,
//                     split-K partial sums) from the graph's own pool (PoolScope), which no code
//                     outside the graph's steps is handed, so nothing else lives there between
//                     launches. Parameters, gradients and the optimizer's state exist before the
//                     capture and stay where they are.
//   no allocation     the first step runs uncaptured as usual (it creates the gradients and the
//                     momentum buffers); the second runs uncaptured in the graph's arena and pool,
//                     which keep their blocks; the third is captured, and every allocation it
//                     makes is a cached block of the second's. One that is not is refused
//                     (core/allocator.cpp), naming the allocator.
//   no host sync      the loss stays on the device (a LossLog, train/loss_log.h): the graph's
//                     loss kernel writes into the graph's own log, copied into the training
//                     loop's log after each launch. A GradScaler (its inf/NaN check) and
//                     clipping (its norm) read the step back: refused with --cuda-graph.
//   constant scalars  a kernel's arguments are recorded with the graph, and the learning rate
//                     (which a schedule changes) and Adam's bias corrections (which change with
//                     the step count) would be replayed as captured. So the optimizer is made
//                     capturable (optim/optimizer.h, as PyTorch's capturable=True): its kernels
//                     read those scalars from a small device array, which each launch's host side
//                     rewrites first (one copy of 16 bytes per group, without a wait). One capture
//                     serves any schedule. SGD, Adam and AdamW can; other optimizers are refused.
// Per captured step the host makes 1 graph launch, 3 copies (the optimizer's scalars up, the batch
// into the graph's inputs) and one 32-byte copy per micro-batch (its loss totals into the loop's
// log), instead of the step's kernel launches.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "core/allocator.h"
#include "core/cuda_memory.h"
#include "train/loop.h"
#include "train/loss_log.h"

namespace kiln {

class StepGraph {
public:
    StepGraph();
    // Why `opt` (and the optimizer) cannot be captured, or "" when they can: CUDA tensors, a
    // LossLog, no GradScaler, no clipping, f32 (no --amp), SGD, Adam or AdamW.
    static std::string refusal(const StepOptions& opt, const Optimizer& optimizer);

    // One step on (x, y), as train_step(model, optimizer, x, y, opt) takes it, bit for bit: the
    // first two uncaptured (see above), later ones of the first step's shapes by the graph.
    // opt.loss_log receives the loss as with train_step.
    StepResult step(Module& model, Optimizer& optimizer, const Tensor& x, const Tensor& y, const StepOptions& opt);

    int64_t captures() const { return captures_; }  // 1 once a step has been captured
    int64_t launches() const { return launches_; }  // steps taken by the graph

private:
    void capture(Module& model, Optimizer& optimizer, const StepOptions& opt);

    PoolAllocator pool_;   // the captured step's temporaries
    BumpAllocator arena_;  // its activations
    std::optional<LossLog> log_;  // where its loss kernels write
    Tensor x_, y_;                // its inputs: each batch is copied here
    Shape x_shape_, y_shape_;     // the first step's, the captured ones
    cuda::Graph graph_;
    int64_t steps_ = 0, captures_ = 0, launches_ = 0;
};

}  // namespace kiln
