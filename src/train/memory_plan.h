// memory_plan.h — chapter 15's planner, its arithmetic: how many bytes one GPU holds to train a
// large model, by category, from the model's size and shape alone (nothing is allocated).
//
// Model states (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion
// Parameter Models", SC 2020, section 3.1 and Figure 1). With Ψ parameters:
//   f32                  parameters 4Ψ, gradients 4Ψ, optimizer state KΨ, K = 4 per state slab
//                        (SGD with momentum: K = 4; Adam: K = 8, its moments m and v)
//   bf16/f16 mixed       parameters 2Ψ and gradients 2Ψ in 16 bits; the optimizer keeps f32
//                        master weights besides its slabs: K = 4 + 4 per slab (Adam: K = 12,
//                        the paper's, so 2 + 2 + 12 = 16 bytes a parameter)
// ZeRO with Nd data-parallel GPUs shards more of them at each stage; per GPU, mixed Adam:
//   stage 0  (2 + 2 + K)Ψ            stage 2  (2 + (2 + K)/Nd)Ψ
//   stage 1  (2 + 2 + K/Nd)Ψ         stage 3  (2 + 2 + K)Ψ/Nd
// A sharded category holds ceil(Ψ/Nd) elements a GPU (the last shard padded, as a real
// partition is).
//
// Activations (Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
// Models", MLSys 2023, arXiv 2205.05198, section 4, no tensor or sequence parallelism): one transformer layer with
// sequence s, micro-batch b, width h and a heads keeps, in bytes, with 16-bit activations and
// 1-byte dropout masks,
//   none       s·b·h·(34 + 5·a·s/h)  = 34·sbh + 5·a·s²·b
//   selective  s·b·h·34              (attention's softmax, its dropout and mask, recomputed)
//   full       s·b·h·2               (only the layer's input; the rest recomputed)
// Where the 34 and the 5 come from: 16 tensors of sbh elements (attention 5: the QKV input, Q,
// K, V, the output projection's input; MLP 9: its input, the GeLU's input 4sbh, the second
// linear's input 4sbh; the two layer norms' inputs 2) at 2 bytes, plus 2 dropout masks of sbh
// at 1 byte; and 2 tensors of a·s²·b (softmax output, its dropout's output) at 2 bytes plus one
// mask at 1. With f32 activations (e = 4 bytes an element) the same count gives
//   s·b·h·(16e + 2) + a·s²·b·(2e + 1).
// Embeddings, the final layer norm and the logits are not counted: L layers hold L times this.
//
//   MemoryPlanOptions o;
//   o.parameters = 7'500'000'000; o.precision = DType::BF16; o.optimizer = OptimizerKind::Adam;
//   o.zero_stage = 3; o.gpus = 64;
//   MemoryPlan p = plan_memory(o);  // p.total() == 1'875'000'000 bytes
#pragma once
#include <cstdint>

#include "core/dtype.h"
#include "train/memory_model.h"

namespace kiln {

enum class Recompute { None, Selective, Full };

// A GPT-shaped decoder (GPT-2's layout). layers == 0: no shape, no activations counted.
struct TransformerShape {
    int64_t layers = 0, width = 0, heads = 0, vocab = 0, context = 0;
};

// GPT-2's parameter count for a shape: per layer two layer norms (4h), the attention's QKV and
// output projections with biases (4h² + 4h), the MLP's two linears of 4h with biases
// (8h² + 5h); then token and position embeddings (V·h + s·h, the output layer tied to the
// token embedding) and the final layer norm (2h):
//   L·(12h² + 13h) + V·h + s·h + 2h        (GPT-2 small, L 12, h 768: 124,439,808)
int64_t transformer_parameters(const TransformerShape& shape);

struct MemoryPlanOptions {
    int64_t parameters = 0;   // Ψ; 0: transformer_parameters(shape)
    TransformerShape shape;   // for the activations (and Ψ when parameters is 0)
    int64_t batch = 1;        // the micro-batch b, sequences a GPU
    DType precision = DType::F32;  // F32, or BF16/F16 mixed with f32 master weights
    OptimizerKind optimizer = OptimizerKind::Adam;
    Recompute recompute = Recompute::None;
    int zero_stage = 0;       // 0 (plain data parallel) to 3
    int64_t gpus = 1;         // the data-parallel degree Nd
};

// One GPU's bytes. optimizer_state includes the f32 master weights under mixed precision.
struct MemoryPlan {
    int64_t parameters = 0, gradients = 0, optimizer_state = 0, activations = 0;
    int64_t model_states() const { return parameters + gradients + optimizer_state; }
    int64_t total() const { return model_states() + activations; }
};

// One transformer layer's activation bytes (the formula above) for s = shape.context.
int64_t layer_activation_bytes(const TransformerShape& shape, int64_t batch, DType precision, Recompute recompute);

// Throws a kiln::Error naming the value for zero GPUs, a stage outside 0–3, heads that do not
// divide the width, a precision other than f32/bf16/f16, or no parameters and no shape.
MemoryPlan plan_memory(const MemoryPlanOptions& options);

}  // namespace kiln
