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
// The rest of one GPU's memory, which the papers' figures leave out (kiln's GPT, chapter 14, is
// measured against all of it: tests/test_memory_plan.cpp):
//   temporary buffers     what backward holds beyond the forward's activations at its peak, in the
//                         last layer's MLP: dL/dlogits (f32, 4·s·b·V) and one more gradient of the
//                         MLP's width (e·s·b·f); with full recomputation, one layer's activations
//                         made again in its backward (but its output, the next layer's kept
//                         input); with stage 3, two layers' parameters
//                         gathered (the one running and the next, prefetched) and one layer's
//                         full gradients before they are reduce-scattered
//   fragmentation         every slab of the model states rounded up as a caching allocator hands
//                         it out (PoolAllocator::round_size: 512 bytes, 2 MiB above 1 MiB, as
//                         PyTorch's CUDA caching allocator), plus an allowance the user names, a
//                         fraction of everything else
// With offload (ZeRO-Offload's idea, optim/offload.h) the optimizer state and the f32 master
// weights live in the host's memory, with the gradients the GPU copies down each step: the GPU
// holds none of the first two, and `host` counts all three, (4 + K + e)Ψ in f32 (the host keeps
// a copy of the weights for its update) and (K + e)Ψ mixed (K includes the masters): 16Ψ and 14Ψ
// for Adam. Stage 1 and above shard it (each GPU's host process updates its shard).
//
//   MemoryPlanOptions o;
//   o.parameters = 7'500'000'000; o.precision = DType::BF16; o.optimizer = OptimizerKind::Adam;
//   o.zero_stage = 3; o.gpus = 64;
//   MemoryPlan p = plan_memory(o);  // p.total() == 1'875'000'000 bytes
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "nn/gpt.h"
#include "ops/attention.h"
#include "train/memory_model.h"

namespace kiln {

enum class Recompute { None, Selective, Full };
const char* recompute_name(Recompute recompute);  // "none", "selective", "full"

// GPT2: learned positions, biases, layer norms, a 4h-wide GELU MLP, the output layer tied to the
// token embedding. LLaMA (Touvron et al., 2023): rotary positions (no table), no biases, RMSNorm,
// a SwiGLU MLP of width f (three matrices), grouped-query attention (kv_heads), an untied output.
enum class Architecture { GPT2, LLaMA };

// A decoder-only transformer's shape. layers == 0: no shape, no activations counted.
struct TransformerShape {
    int64_t layers = 0, width = 0, heads = 0, vocab = 0, context = 0;
    Architecture arch = Architecture::GPT2;
    int64_t ffn = 0;       // the MLP's width f; 0: 4·width (GPT-2's)
    int64_t kv_heads = 0;  // the heads of K and V; 0: as many as the queries'
    int64_t mlp_width() const { return ffn > 0 ? ffn : 4 * width; }
    int64_t kv_width() const { return kv_heads > 0 ? width / heads * kv_heads : width; }
};

// The parameter count of a shape (h width, f MLP width, g K/V width, V vocabulary, s context):
//   GPT2   L·(4h² + 4h + 2hf + f + 5h) + V·h + s·h + 2h     (attention's QKV and output with
//          biases, the MLP's two linears with biases, two layer norms; token and position
//          embeddings; the final layer norm. f = 4h: L·(12h² + 13h) + V·h + s·h + 2h)
//   LLaMA  L·(2h² + 2hg + 3hf + 2h) + 2·V·h + h             (Q and the output h×h, K and V h×g,
//          gate, up and down h×f, two RMSNorms; the embedding and the output layer; the last norm)
// GPT-2 small (L 12, h 768): 124,439,808; LLaMA-7B (L 32, h 4096, f 11008): 6,738,415,616.
int64_t transformer_parameters(const TransformerShape& shape);
int64_t layer_parameters(const TransformerShape& shape);  // one layer's share of the above

// The models the lesson's tables name: gpt2, gpt2-medium, gpt2-large, gpt2-xl (Radford et al.,
// 2019), llama-7b, llama-13b (Touvron et al., 2023, LLaMA 1), llama-2-70b (LLaMA 2, grouped-
// query attention), gpt3-175b (Brown et al., 2020), and chapter 14's baby-gpt.
struct NamedTransformer {
    std::string name;
    TransformerShape shape;
};
const std::vector<NamedTransformer>& named_transformers();
// Throws a kiln::Error listing the names for one it does not know.
const TransformerShape& named_transformer(const std::string& name);

struct MemoryPlanOptions {
    int64_t parameters = 0;   // Ψ; 0: transformer_parameters(shape)
    TransformerShape shape;   // for the activations (and Ψ when parameters is 0)
    int64_t batch = 1;        // the micro-batch b, sequences a GPU
    DType precision = DType::F32;  // F32, or BF16/F16 mixed with f32 master weights
    OptimizerKind optimizer = OptimizerKind::Adam;
    Recompute recompute = Recompute::None;
    AttentionKind attention = AttentionKind::Textbook;  // Flash keeps lse (4·a·s·b) for the a·s²·b scores
    bool dropout = true;      // dropout after attention's softmax and both branches (Korthikanti's layer)
    int zero_stage = 0;       // 0 (plain data parallel) to 3
    int64_t gpus = 1;         // the data-parallel degree Nd
    bool offload = false;     // the optimizer state and master weights in host memory
    double fragmentation = 0.0;  // the allowance beyond the slabs' rounding, a fraction of the rest
};

// One GPU's bytes. optimizer_state includes the f32 master weights under mixed precision.
struct MemoryPlan {
    int64_t parameters = 0, gradients = 0, optimizer_state = 0, activations = 0;
    int64_t temporary = 0, fragmentation = 0;
    int64_t host = 0;  // offloaded to the host's memory: not in total()
    int64_t model_states() const { return parameters + gradients + optimizer_state; }
    int64_t total() const { return model_states() + activations + temporary + fragmentation; }
};

// One transformer layer's activation bytes for s = shape.context, e bytes an element (2 mixed,
// 4 f32), Korthikanti et al.'s count generalised (h width, g K/V width, f MLP width, a heads):
//   kept tensors   e·s·b·(6h + 2g + 2f)     GPT2: the two norms' inputs and outputs, Q, K, V, the
//                                           attention's output, the MLP's input to GELU and
//                                           GELU's output (f = 4h, g = h: 16·e·sbh)
//                  e·s·b·(6h + 2g + 3f)     LLaMA: the gate's and up's outputs and their product
//   scores         e·a·s²·b                 textbook: softmax's output (Flash: 4·a·s·b, lse)
//   dropout        2·s·b·h + a·s²·b·(e + 1) the two branches' 1-byte masks; after softmax its
//                                           mask and output (Flash: none, it redraws them)
// With e = 2, GPT2, textbook, dropout: s·b·h·(34 + 5·a·s/h), Korthikanti's. Selective
// recomputation drops the scores and their dropout; full keeps only the layer's input, e·s·b·h.
int64_t layer_activation_bytes(const TransformerShape& shape, int64_t batch, DType precision, Recompute recompute,
                               AttentionKind attention = AttentionKind::Textbook, bool dropout = true);

// Outside the layers: the embedding's output and the final norm's output (e·s·b·h each), and
// the logits, f32 for the loss (4·s·b·V).
int64_t head_activation_bytes(const TransformerShape& shape, int64_t batch, DType precision);

// Throws a kiln::Error naming the value for zero GPUs, a stage outside 0–3, heads that do not
// divide the width, a precision other than f32/bf16/f16, or no parameters and no shape.
MemoryPlan plan_memory(const MemoryPlanOptions& options);

// The bytes one GPU sends in a training step's collectives, ring algorithms (chapter 12's
// cost_model.h), each of the N−1 steps of a reduce-scatter or an all-gather one shard of
// ⌈Ψ/N⌉ elements of e bytes:
//   stages 0–2   2·(N−1)·e·⌈Ψ/N⌉   plain data parallel all-reduces the gradients (a reduce-scatter
//                                  and an all-gather); ZeRO-1 and -2 reduce-scatter the gradients
//                                  and all-gather the updated parameters: the same bytes
//   stage 3      3·(N−1)·e·⌈Ψ/N⌉   the parameters all-gathered for forward and again for
//                                  backward, the gradients reduce-scattered: 1.5× the bytes
int64_t communication_bytes(const MemoryPlanOptions& options);

// With offload, the bytes one GPU moves over PCIe in each direction a step: its gradients down
// to the host's optimizer, as many updated parameters back, e bytes each — all Ψ of them, or its
// shard ⌈Ψ/N⌉ from stage 1 on (each GPU's host process updates its own shard). 0 without offload.
int64_t offload_bytes_each_way(const MemoryPlanOptions& options);

// A measured step to draw on stages_svg's lines: the GPUs it ran on, its ZeRO stage, one GPU's bytes.
struct MeasuredStage {
    int64_t gpus = 1;
    int stage = 0;
    int64_t bytes = 0;
};

// An SVG document: one GPU's planned memory (plan_memory(options).total(), GB, or MiB when it
// stays under a GiB) against log2 of the GPU count from 1 to max_gpus (a power of two), one line
// per ZeRO stage, and each measured step a square of its stage's colour.
std::string stages_svg(MemoryPlanOptions options, int64_t max_gpus, const std::vector<MeasuredStage>& measured,
                       const std::string& title);

// The plan's options for a training step of kiln's GPT (chapter 14, nn/gpt.h) of config `c` on
// `batch` windows of c.block_size tokens, as train_step runs it: f32, AdamW (two moments), its
// attention, no dropout, full recomputation when c.recompute (each block keeps its input), one
// process. Throws for dropout > 0, which kiln's GPT draws again in backward and the plan does not
// count.
MemoryPlanOptions gpt_plan_options(const GPTConfig& c, int64_t batch);

// Offload (optim/offload.h) measured against the plan: one steady training step of kiln's GPT of
// config `c` on `batch` windows on the CUDA device (kiln's emulator in a build without a GPU), with
// the recipe's AdamW on the GPU and offloaded to the host (measure_gpt_step, train/gpt_recipe.h):
// both plans, the device bytes of both steps, and the host's pinned bytes. Offloaded with the serial
// schedule; with overlapped_too, the overlapped schedule's step is measured as well (same plan).
struct OffloadMeasured {
    MemoryPlan resident, offloaded;  // planned
    int64_t resident_bytes = 0, offloaded_bytes = 0, host_bytes = 0;  // measured
    int64_t overlapped_bytes = 0;    // measured with overlapped_too
};
OffloadMeasured measure_gpt_offload(const GPTConfig& c, int64_t batch, bool overlapped_too = false);

// The largest micro-batch whose plan's total fits in gpu_bytes (0: not even one sequence).
int64_t largest_batch(MemoryPlanOptions options, int64_t gpu_bytes);

}  // namespace kiln
