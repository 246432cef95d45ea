// lesson-14 — a character-level GPT (nanoGPT's, nn/gpt.h) trained from scratch on Moby-Dick,
// with causal self-attention in either version: the textbook one, which stores the T×T
// probabilities, or FlashAttention-2's tiles, which store one number per row. Then it writes.
//
//   make lesson-14                                    # nanoGPT's "baby GPT", 2000 iterations
//   make lesson-14 ARGS='--iters 50 --sample 200'     # a quick look
//   make lesson-14 ARGS='--attention textbook --memory'   # the memory of a step, per module
//
// The recipe is nanoGPT's (train/gpt_recipe.h): AdamW (0.9, 0.99), weight decay 0.1 on the
// weights, warm-up then cosine, clipping at 1.0; the batches are random windows of the first 90%
// of the text (data/text.h), the validation loss is over the last 10%, in order.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>

#include "core/allocator.h"         // defines: BumpAllocator, format_bytes, memory_summary
#include "data/text.h"              // defines: load_text, TextWindows, decode_utf8
#include "nn/gpt.h"                 // defines: GPT, make_gpt, generate
#include "optim/grad_scaler.h"      // defines: GradScaler
#include "train/cli.h"              // defines: Cli, CommonFlags
#include "train/gpt_recipe.h"       // defines: GPTRecipe, gpt_lr, gpt_optimizer, gpt_eval_loss
#include "train/loop.h"             // defines: train_step
#include "train/memory_model.h"     // defines: predict_memory, memory_prediction_table
#include "train/progress.h"         // defines: seconds_since, peak_memory

using namespace kiln;

namespace {

struct Lesson14Flags {
    GPTConfig gpt;
    GPTRecipe recipe;
    std::string attention = "flash", prompt = "\n";
    int64_t eval_interval = 500, eval_windows = 200, log_interval = 100, sample = 500, top_k = 0;
    float temperature = 0.8f;
    bool no_kv_cache = false, memory = false;
};

// The flags this trainer shares with the others but has no use for, refused with the reason.
void refuse_shared(Cli& cli) {
    cli.refuse("--epochs", "lesson-14 counts optimizer steps: --iters N");
    for (const char* f : {"--save", "--resume", "--overwrite"}) cli.refuse(f, "lesson-14 keeps no checkpoints");
    for (const char* f : {"--find-batch-size", "--time-report", "--time-svg", "--grad-hist", "--mem-trace",
                          "--mem-trace-steps"})
        cli.refuse(f, "lesson-14 does not take it (chapters 07 to 09 do)");
    cli.refuse("--mem-report", "lesson-14 prints chapter 08's per-module table with --memory");
}

// Prints chapter 08's predicted step, per module: where the memory of a training step goes.
void print_memory(GPT& model, const CommonFlags& flags, const Lesson14Flags& o, Device device) {
    const Shape batch{flags.batch_size, o.gpt.block_size};
    MemoryModelOptions m{batch, OptimizerKind::Adam, device, true, DType::F32, {}, batch};
    std::printf("%s", memory_prediction_table(predict_memory(model, m)).c_str());
}

}  // namespace

int main(int argc, char** argv) try {
    CommonFlags flags;
    flags.batch_size = 12;
    flags.lr = 1e-3f;
    flags.data = "data/moby-dick";
    Lesson14Flags o;
    o.gpt = baby_gpt_config(0);  // the vocabulary is the text's
    Cli cli("lesson-14", "Trains a character-level GPT on Moby-Dick, textbook or FlashAttention, and samples from it.");
    flags.add_to(cli);
    refuse_shared(cli);
    cli.add("--iters", &o.recipe.iters, "optimizer steps (the cosine ends at the last)", Cli::at_least(0));
    cli.add("--warmup", &o.recipe.warmup, "steps of linear learning-rate warm-up", Cli::at_least(0));
    cli.add("--min-lr", &o.recipe.min_lr, "the learning rate the cosine ends at", Cli::at_least(0));
    cli.add("--weight-decay", &o.recipe.weight_decay, "AdamW's decoupled weight decay (weights only)", Cli::at_least(0));
    cli.add("--clip", &o.recipe.clip, "clip the gradients' global norm to this (0: no clipping)", Cli::at_least(0));
    cli.add("--block-size", &o.gpt.block_size, "context length T (characters)", Cli::at_least(1));
    cli.add("--n-layer", &o.gpt.n_layer, "transformer blocks", Cli::at_least(1));
    cli.add("--n-head", &o.gpt.n_head, "attention heads (divides --n-embd)", Cli::at_least(1));
    cli.add("--n-embd", &o.gpt.n_embd, "channels C", Cli::at_least(1));
    cli.add("--dropout", &o.gpt.dropout, "dropout of embeddings, attention and residual branches", Cli::between(0, 0.99));
    cli.add("--attention", &o.attention, "textbook (stores the T×T probabilities) or flash (FlashAttention-2)",
            {"textbook", "flash"});
    cli.add("--recompute", &o.gpt.recompute, "each block keeps only its input and runs again in backward");
    cli.add("--eval-interval", &o.eval_interval, "every N steps, the loss on the first --eval-windows of validation", Cli::at_least(1));
    cli.add("--eval-windows", &o.eval_windows, "validation windows of the periodic estimate (the last is over all)", Cli::at_least(1));
    cli.add("--log-interval", &o.log_interval, "print the training loss every N steps", Cli::at_least(1));
    cli.add("--sample", &o.sample, "characters to write after training (0: none)", Cli::at_least(0));
    cli.add("--temperature", &o.temperature, "sampling temperature", Cli::positive());
    cli.add("--top-k", &o.top_k, "sample among the k likeliest characters (0: all)", Cli::at_least(0));
    cli.add("--prompt", &o.prompt, "the text the sample starts from");
    cli.add("--no-kv-cache", &o.no_kv_cache, "sample by running the whole context again for every character");
    cli.add("--memory", &o.memory, "print chapter 08's predicted training step, per module, and stop");
    cli.parse(argc, argv);
    Device device = flags.apply();
    for (const char* f : {"--batch-size", "--lr", "--seed", "--data", "--limit", "--amp", "--accumulate"}) flags.use(f);
    const auto start = std::chrono::steady_clock::now();

    const TextData text = load_text(flags.data + "/moby-dick.txt", flags.limit, 0.1, " (make data fetches it)");
    o.gpt.vocab_size = text.tokenizer.size();
    o.gpt.attention = o.attention == "flash" ? AttentionKind::Flash : AttentionKind::Textbook;
    o.recipe.lr = flags.lr;
    o.recipe.decay_iters = o.recipe.iters;
    auto model = make_gpt(o.gpt, flags.seed);
    model->to(device);
    auto opt = gpt_optimizer(*model, o.recipe);
    flags.apply_memory_limit(device);
    std::printf("lesson-14: GPT of %lld layers, %lld heads, %lld channels, context %lld, vocabulary %lld: %lld "
                "parameters (%s attention%s), batch %lld, %lld steps, %lld training characters, %s, device %s\n",
                (long long)o.gpt.n_layer, (long long)o.gpt.n_head, (long long)o.gpt.n_embd, (long long)o.gpt.block_size,
                (long long)o.gpt.vocab_size, (long long)gpt_num_params(*model), o.attention.c_str(),
                o.gpt.recompute ? ", recompute" : "", (long long)flags.batch_size, (long long)o.recipe.iters,
                (long long)text.train.size(), flags.amp == DType::F32 ? "f32" : ("amp " + std::string(dtype_name(flags.amp))).c_str(),
                device_name(device));
    if (o.memory) {  // chapter 08's table of the step, and stop
        print_memory(*model, flags, o, device);
        flags.check_used();
        return 0;
    }

    TextWindows batches(text.train, o.gpt.block_size, flags.batch_size, flags.seed, "the training split");
    BumpAllocator arena("step arena", device);
    std::optional<GradScaler> scaler;
    if (flags.amp == DType::F16) scaler.emplace();
    const StepOptions step{&arena, o.recipe.clip, flags.accumulate, scaler ? &*scaler : nullptr, flags.amp};
    model->train();
    Tensor x, y;
    auto last = std::chrono::steady_clock::now();  // when step last_it ended
    int64_t last_it = -1;
    for (int64_t it = 0; it < o.recipe.iters; it++) {
        const float lr = gpt_lr(o.recipe, it);
        for (ParamGroup& g : opt->param_groups()) g.lr = lr;
        batches.batch(it, x, y, device);
        const StepResult r = train_step(*model, *opt, x, y, step);
        KILN_CHECK(r.finite() || scaler, "training diverged at step ", it, ": loss ", r.loss, " (try a lower --lr)");
        if (it % o.log_interval == 0 || it == o.recipe.iters - 1) {
            const double ms = 1000.0 * seconds_since(last) / double(it - last_it);  // the steps since the last line
            std::printf("step %lld: loss %.4f, lr %.2e, %.0f ms/step\n", (long long)it, r.loss, lr, ms);
            std::fflush(stdout);
            last = std::chrono::steady_clock::now(), last_it = it;
        }
        if (it > 0 && it % o.eval_interval == 0 && it + 1 < o.recipe.iters) {  // not timed with the steps
            std::printf("step %lld: val loss %.4f (first %lld windows)\n", (long long)it,
                        gpt_eval_loss(*model, text.val, o.gpt.block_size, 64, o.eval_windows, device),
                        (long long)o.eval_windows);
            last = std::chrono::steady_clock::now(), last_it = it;
        }
    }
    const double train_seconds = seconds_since(start);
    const double val = gpt_eval_loss(*model, text.val, o.gpt.block_size, 64, 0, device);
    std::printf("%s", memory_summary(device).c_str());  // each allocator's peak, and the limit if any
    std::printf("result: val_loss=%.4f bits_per_char=%.3f time=%.1fs peak_mem=%s\n", val, val / std::log(2.0),
                train_seconds, format_bytes(peak_memory(device)).c_str());

    if (o.sample > 0) {
        SampleOptions s;
        s.temperature = o.temperature, s.top_k = o.top_k, s.kv_cache = !o.no_kv_cache;
        Rng rng(flags.seed);
        int64_t cache_bytes = 0;
        const std::vector<int32_t> prompt = text.tokenizer.encode(decode_utf8(std::vector<uint8_t>(o.prompt.begin(), o.prompt.end()), "--prompt"), "--prompt");
        const auto t0 = std::chrono::steady_clock::now();
        const std::vector<int32_t> ids = generate(*model, prompt, o.sample, s, rng, &cache_bytes);
        std::printf("sample (%lld characters, temperature %.2f, %s, %.1f s):\n%s\n", (long long)o.sample, o.temperature,
                    s.kv_cache ? ("KV cache " + format_bytes(cache_bytes)).c_str() : "no KV cache", seconds_since(t0),
                    text.tokenizer.decode(ids).c_str());
    }
    flags.check_used();
    return 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "lesson-14: %s\n", e.what());
    return 1;
}
