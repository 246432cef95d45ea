// memory_model.h — chapter 08's prediction: what one training step holds in memory, per module
// and at its peak, from the model, the input's shape and the optimizer's kind alone — nothing
// is computed and nothing is allocated.
//
// Each layer says what it allocates and keeps (Module::memory, with its formula above it:
// Linear in layers.h, Conv2d in conv.h, ...). The model replays train_step (train/loop.h) on
// those descriptions, tensor by tensor, with the same lifetimes as the real code:
//   before the step   the parameter and gradient slabs, the buffers, the optimizer's state
//                     slabs (1 for SGD with momentum, 2 for Adam), the data batch (x, y)
//   forward           each layer allocates y (and what it saves: argmax, mean and 1/σ, a mask)
//                     and a workspace it frees at once (im2col); caches keep x or y; the
//                     previous output is freed when nothing keeps it
//   loss              dL/dlogits [N, classes], and count_correct's predictions (i32 [N], freed)
//   backward          each layer: workspace, dx, a moment's scratch (a GPU's split-K partial
//                     sums), then its cache is let go; dy is freed when the layer before has
//                     its dx; dL/dlogits and the logits live until the end
//   optimizer         no temporaries (one update kernel per parameter)
// and counts bytes as the allocators do: the arena rounds every tensor up to 256 bytes, the pool
// to its size classes (512 bytes; 2 MiB above 1 MiB) and hands a freed block to a later
// request of its class (a large one to a request of at least half its size), so the replay runs
// two steps from an empty pool cache and reports the second: a training step in its steady state.
//
//   MemoryPrediction p = predict_memory(*model, {Shape{64, 1, 28, 28}, OptimizerKind::SGDMomentum});
//   std::cout << memory_prediction_table(p);
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "nn/module.h"
#include "optim/optimizer.h"

namespace kiln {

// The optimizer's state, in slabs shaped like the parameters': SGD none, SGD with momentum one
// (the momentum buffer), Adam and AdamW two (the moments m and v), with AMSGrad three.
enum class OptimizerKind { SGD, SGDMomentum, Adam, AdamAMSGrad };
int state_slabs(OptimizerKind kind);
// The kind of SGD, Adam or AdamW (by its options; a ZeroOptimizer's: the one it shards);
// throws for another optimizer.
OptimizerKind optimizer_kind(const Optimizer& optimizer);

struct MemoryModelOptions {
    Shape input;  // the data batch x, batch first: [N, 1, 28, 28]; the labels are i32 [N]
    OptimizerKind optimizer = OptimizerKind::SGDMomentum;
    Device device = Device::CPU;
    bool arena = true;  // activations from a step arena (StepOptions::arena), else from the pool
    DType amp = DType::F32;  // the step's --amp: the model replays f32 steps only, and refuses others
    // ZeRO-1 (chapter 12, dist/zero.h): the optimizer keeps the state of this rank's piece of the
    // slabs only, state_elements[i] elements for the model's i-th parameter (model order).
    // Empty: every parameter's whole state.
    std::vector<int64_t> state_elements = {};
    Shape labels = {};  // the labels' shape when not [N] (input[0] of them): a GPT's [B, T] targets
};

// The options that predict a step of `optimizer` on `model` (its kind; under ZeRO-1, the state
// of this rank's piece), on a batch of `input` on `device`.
MemoryModelOptions memory_model_options(Module& model, const Optimizer& optimizer, const Shape& input, Device device,
                                        bool arena, DType amp);

// One module's share. A container's row adds up its subtree (the largest workspace for
// `workspace`). Parameter, gradient and optimizer-state bytes are the tensors' own, 4 per
// element, before the slabs' alignment and the pool's rounding.
struct PredictedModule {
    std::string name;  // the full name, "" for the model itself
    int depth = 0;     // 0 for the model, 1 for its children, ...
    Shape output;
    int64_t parameters = 0, gradients = 0, optimizer_state = 0, buffers = 0;
    int64_t activations = 0;  // allocated by its forward and still held when the forward pass ends
                              // (the caches, and the logits), as its allocator counts them
    int64_t workspace = 0;    // the largest block of workspace it holds at once, as the pool counts it
};

struct MemoryPrediction {
    std::vector<PredictedModule> modules;  // in tree order, the model first
    int64_t resident = 0;  // in use before the step: slabs, buffers, optimizer state, data batch
    // The most bytes in use at once during the step, all allocators of the device together, and
    // where: the module running (its full name; "loss", "optimizer") and the phase.
    int64_t peak = 0;
    std::string peak_module;
    Phase peak_phase = Phase::Other;
    // Each allocator's own peak. device_memory_stats(device).peak_allocated is their sum, which
    // is more than `peak` when the arena's peak and the pool's come at different moments.
    int64_t pool_peak = 0, arena_peak = 0;
    int64_t allocator_peaks() const { return pool_peak + arena_peak; }
};

// Predicts one steady training step (train_step) of `model` in training mode on a batch of
// options.input. Throws a kiln::Error naming the layer if the input does not fit the model, or
// naming a container the model does not know how to run (it knows Sequential, Residual,
// Checkpoint, and the GPT's Block and Transformer).
MemoryPrediction predict_memory(Module& model, const MemoryModelOptions& options);

// The prediction as a table: one row per module (indented by depth), then the resident bytes,
// the peak and where it happens, and the allocators' peaks.
std::string memory_prediction_table(const MemoryPrediction& prediction);

}  // namespace kiln
