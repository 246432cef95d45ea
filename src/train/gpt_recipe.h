// gpt_recipe.h — how chapter 14 trains its GPT: nanoGPT's recipe (train.py with
// config/train_shakespeare_char.py) and its validation loss.
//
//   AdamW, β = (0.9, 0.99), weight decay 0.1 on the weights (the ≥ 2-D parameters, embeddings
//   included: nanoGPT's configure_optimizers), none on biases and layer norms
//   the learning rate: a linear warm-up, then a cosine down to min_lr (gpt_lr below)
//   gradients clipped to a global norm of 1.0 (train_step's clip_norm)
//
// And its checkpoints (lesson-14 --save, --resume, --from): chapter 07's file (train/checkpoint.h:
// the model, AdamW's moments, the step, the dropout streams) plus the GPT's shape and its
// vocabulary, with the vocabulary also written beside it as vocab.json (data/text.h), since a
// character model's ids mean nothing without it. A checkpoint so loads and samples without the text.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "data/text.h"
#include "nn/gpt.h"
#include "optim/adam.h"
#include "train/loop.h"

namespace kiln {

struct GPTRecipe {
    int64_t iters = 2000;        // optimizer steps
    int64_t warmup = 100;        // steps of linear warm-up
    int64_t decay_iters = 2000;  // the step the cosine reaches min_lr (nanoGPT: = max_iters)
    float lr = 1e-3f, min_lr = 1e-4f, weight_decay = 0.1f, clip = 1.0f;
};

// nanoGPT's "baby GPT" for a CPU (its README: 4 layers, 4 heads, 128 channels, context 64, no
// dropout), flash attention, for a vocabulary of vocab_size: lesson-14's default model.
GPTConfig baby_gpt_config(int64_t vocab_size);

// nanoGPT's get_lr(it):
//   it < warmup            lr · (it + 1) / (warmup + 1)
//   it > decay_iters       min_lr
//   otherwise              min_lr + ½ (1 + cos(π r)) (lr − min_lr),   r = (it − warmup) / (decay_iters − warmup)
float gpt_lr(const GPTRecipe& recipe, int64_t it);

// AdamW over decay_groups (optim/optimizer.h) with the recipe's lr and weight decay, β = (0.9, 0.99)
// (gpt_adam_options).
std::unique_ptr<AdamW> gpt_optimizer(GPT& model, const GPTRecipe& recipe);
Adam::Options gpt_adam_options();
// The same AdamW over given groups: what a ZeroOptimizer (dist/zero.h) runs on each rank's piece,
//   ZeroOptimizer zero(model, decay_groups(model, recipe.lr, recipe.weight_decay), comm, gpt_adamw);
std::unique_ptr<Optimizer> gpt_adamw(std::vector<ParamGroup> groups);

// Step `it` of lesson-14's training: gpt_lr(recipe, it) into every group, batch `it` of `batches`
// on `device`, and train_step with `step` (the recipe's clip among its options). Under data
// parallel training (chapter 12: the model under a DataParallel, or the optimizer a
// ZeroOptimizer) rank `rank` of `world` trains on its share of the batch (TextWindows::batch):
// the loss returned is its share's (the whole batch's is the mean over the ranks), the gradient
// norm the summed gradients'. Every rank calls it for every step.
StepResult gpt_train_step(GPT& model, Optimizer& optimizer, const TextWindows& batches, int64_t it,
                          const GPTRecipe& recipe, const StepOptions& step, Device device, int rank = 0, int world = 1);

// The mean cross-entropy, in nats per character, of the model's next-token predictions over the
// ordered windows of `tokens` (data/text.h: offsets 0, T, 2T, ...), the first max_windows of them
// (0: all), `batch` windows a forward, in evaluation mode and without caches. Depends on nothing
// random: the same model gives the same loss.
double gpt_eval_loss(GPT& model, const std::vector<int32_t>& tokens, int64_t block_size, int64_t batch,
                     int64_t max_windows, Device device);

// One steady training step of the GPT of `c` (seed 1) on a batch of B random windows of T
// tokens, on `device`, with a step arena and this recipe's AdamW — the second step, after one
// that creates the optimizer's state — measured: the allocators' peaks added up
// (device_memory_stats), less what was in use before the model was built. What chapter 08's
// prediction (train/memory_model.h, MemoryPrediction::allocator_peaks) is checked against.
// make_optimizer, when given, makes the step's optimizer instead of gpt_optimizer (chapter 15
// measures ZeRO ranks' steps with it, and offload's); after, when given, sees the optimizer after
// the measured step (offload's host bytes).
using GPTOptimizerFactory = std::function<std::unique_ptr<Optimizer>(GPT& model, const GPTRecipe& recipe)>;
int64_t measure_gpt_step(const GPTConfig& c, int64_t B, int64_t T, Device device,
                         const GPTOptimizerFactory& make_optimizer = {},
                         const std::function<void(const Optimizer&)>& after = {});

// ---- checkpoints -------------------------------------------------------------------------------
// Where a run is: the steps done, and the seed its batches are drawn from (data/text.h's
// TextWindows: batch k is a function of the seed and k alone).
struct GPTProgress {
    int64_t step = 0;
    uint64_t seed = 1;
};

// save_dir/last.safetensors at `at` (the one before kept as prev.safetensors), with
// "train.gpt.n_layer", "n_head", "n_embd", "block_size", "train.gpt.seed" and
// "train.gpt.vocabulary" (the tokenizer's JSON) besides chapter 07's entries, and save_dir/vocab.json.
// Under data parallel training every rank calls it (a ZeroOptimizer gathers its pieces of AdamW's
// moments here) and only the main process (rank 0) writes.
void save_gpt_checkpoint(const std::string& save_dir, GPT& model, Optimizer& optimizer, const CharTokenizer& vocabulary,
                         const GPTProgress& at, bool main_process = true);

// What every lesson-14 checkpoint records of its run besides the weights, the optimizer and the
// step: the GPT's shape, the batches' seed and the vocabulary (the keys above), and its dropout
// streams (the model's named modules'). save_gpt_checkpoint writes it into the whole checkpoint,
// save_gpt_shard (dist/zero3.h) into every rank's shard.
void record_gpt_run(StateDict& state, GPT& model, const CharTokenizer& vocabulary, uint64_t seed);
// A checkpoint's record against this run: its vocabulary against the text's, its shape against the
// model's, each refused naming `path` and the flag to give; the dropout streams put back where they
// were. Returns the batches' seed.
uint64_t resume_gpt_run(const std::string& path, const StateDict& state, GPT& model, const CharTokenizer& corpus);

// The vocabulary of a checkpoint: the vocab.json beside it, checked against the one the file
// records. Missing, unreadable, or another text's (a vocab.json copied from another run) is an
// error naming both files and where the two vocabularies differ.
CharTokenizer gpt_checkpoint_vocabulary(const std::string& path, const StateDict& state);

// A GPT as a checkpoint holds it, without the text it was trained on: its shape from the file,
// its vocabulary as gpt_checkpoint_vocabulary, its weights loaded (on the CPU; `attention` is
// either kind: the weights are the same).
struct LoadedGPT {
    std::unique_ptr<GPT> model;
    CharTokenizer vocabulary;
    int64_t step;  // the steps it was trained for
};
LoadedGPT load_gpt_checkpoint(const std::string& path, AttentionKind attention = AttentionKind::Flash);

// --resume: loads the checkpoint into a model and optimizer built from the same flags, after
// checking that the text's vocabulary (`corpus`) is the checkpoint's and the model's shape its
// (an error naming the flag: --n-head 4, the checkpoint's 2); returns where its run was, whose
// seed the batches go on with (whatever this run's --seed).
GPTProgress resume_gpt(const std::string& path, GPT& model, Optimizer& optimizer, const CharTokenizer& corpus);

}  // namespace kiln
