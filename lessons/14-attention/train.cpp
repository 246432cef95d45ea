// lesson-14 — a character-level GPT (nanoGPT's, nn/gpt.h) trained from scratch on Moby-Dick,
// with causal self-attention in either version: the textbook one, which stores the T×T
// probabilities, or FlashAttention-2's tiles, which store one number per row. Then it writes.
//
//   make lesson-14                                    # nanoGPT's "baby GPT", 2000 iterations
//   make lesson-14 ARGS='--iters 50 --sample 200'     # a quick look
//   make lesson-14 ARGS='--attention textbook --memory'   # the memory of a step, per module
//   make lesson-14 ARGS='--save runs/lesson-14'           # a checkpoint and vocab.json, every 500 steps
//   make lesson-14 ARGS='--from runs/lesson-14/last.safetensors --sample 1000'   # write, without the text
//   mpirun -np 2 build/bin/lesson-14 --zero 1        # 2 ranks × 6 windows, AdamW's moments sharded
//   mpirun -np 2 build/bin/lesson-14 --zero 3        # and the gradients and parameters (chapter 15)
//   make lesson-14 ARGS='--device cuda --offload'     # AdamW's state on the host, the update on the CPU (chapter 15),
//                                                     # overlapped with the GPU's work (--offload-schedule serial: after it)
//
// The recipe is nanoGPT's (train/gpt_recipe.h): AdamW (0.9, 0.99), weight decay 0.1 on the
// weights, warm-up then cosine, clipping at 1.0; the batches are random windows of the first 90%
// of the text (data/text.h), the validation loss is over the last 10%, in order.
//
// Started by mpirun, it is chapter 12's data parallel training: every rank holds the model and
// trains on its --batch-size / p windows of each batch; the gradients are averaged over the
// ranks after backward (--zero 0, dist/data_parallel.h) or inside the optimizer, which keeps
// AdamW's moments of its piece of the parameters only (--zero 1, ZeRO-1: dist/zero.h, which also
// clips by the global norm), and of the gradients too (--zero 2: dist/zero2.h, each bucket
// reduce-scattered into its piece during backward) and of the parameters too (--zero 3:
// dist/zero3.h, each block gathered only while it runs; --save writes one file a rank, which --resume
// reads on as many ranks; no --memory; the model gathered whole after training for the last
// evaluation and the sample). Every rank
// evaluates the same model; rank 0 prints, writes the checkpoints (every rank helps gather them)
// and samples.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>

#include "core/allocator.h"         // defines: BumpAllocator, format_bytes, memory_summary
#include "data/text.h"              // defines: load_text, TextWindows, decode_utf8
#include "dist/data_parallel.h"     // defines: DataParallel
#include "dist/zero3.h"             // defines: ZeroOptimizer, Zero3Optimizer, gpt_zero_optimizer, save_gpt_shard, resume_gpt_shard
#include "mpi/launch.h"             // defines: run_ranks, start_ranks
#include "nn/gpt.h"                 // defines: GPT, make_gpt, generate
#include "optim/grad_scaler.h"      // defines: GradScaler
#include "optim/offload.h"          // defines: OffloadedOptimizer, offload_optimizer
#include "train/cli.h"              // defines: Cli, CommonFlags
#include "train/fit.h"              // defines: TrainOptions, check_save_dir
#include "train/gpt_recipe.h"       // defines: GPTRecipe, gpt_optimizer, gpt_adamw, gpt_train_step, gpt_eval_loss, save_gpt_checkpoint
#include "train/memory_model.h"     // defines: predict_memory, memory_prediction_table
#include "train/progress.h"         // defines: seconds_since, peak_memory

using namespace kiln;

namespace {

struct Lesson14Flags {
    GPTConfig gpt;
    GPTRecipe recipe;
    std::string attention = "flash", prompt = "\n", from;
    int64_t eval_interval = 500, eval_windows = 200, log_interval = 100, sample = 500, top_k = 0;
    float temperature = 0.8f;
    bool no_kv_cache = false, memory = false;
    bool offload = false;  // --offload: AdamW's state and the f32 master weights in the host's pinned memory
    std::string offload_schedule = "overlapped";  // --offload-schedule: overlapped with the GPU's work, or serial
    int zero = 0;  // under mpirun: 0 data parallel, 1-3 ZeRO's stage
};

// The flags this trainer shares with the others but has no use for, refused with the reason.
void refuse_shared(Cli& cli) {
    cli.refuse("--epochs", "lesson-14 counts optimizer steps: --iters N");
    for (const char* f : {"--find-batch-size", "--time-report", "--time-svg", "--grad-hist", "--mem-trace",
                          "--mem-trace-steps"})
        cli.refuse(f, "lesson-14 does not take it (chapters 07 to 09 do)");
    cli.refuse("--mem-report", "lesson-14 prints chapter 08's per-module table with --memory");
}

// Prints chapter 08's predicted step, per module: where the memory of a training step goes — of
// this rank's share of the batch, and under ZeRO-1 with this rank's piece of AdamW's moments.
void print_memory(GPT& model, const Optimizer& optimizer, const CommonFlags& flags, const Lesson14Flags& o,
                  Device device) {
    const Shape batch{flags.batch_size / flags.world_size, o.gpt.block_size};
    MemoryModelOptions m = memory_model_options(model, optimizer, batch, device, true, DType::F32);
    m.labels = batch;
    if (flags.world_size > 1) std::printf("rank 0 of %d:\n", flags.world_size);
    std::printf("%s", memory_prediction_table(predict_memory(model, m)).c_str());
}

// The ranks' flags that cannot work together, refused before anything is built (a --batch-size
// the ranks cannot share equally is refused with the shared flags: train/cli.h).
void check_ranks(const CommonFlags& flags, const Lesson14Flags& o, Device device) {
    KILN_USAGE_CHECK(flags.world_size == 1 || device == Device::CPU, "lesson-14 trains several ranks on CPUs (MPI moves CPU memory); "
                     "chapter 12's lesson-12 --backend nccl trains on GPUs");
    KILN_USAGE_CHECK(!(o.zero >= 1 && flags.amp == DType::F16), "--zero ", o.zero, " reduces the gradients inside "
                     "the optimizer step, after a GradScaler would have checked them for inf/NaN on one rank only: use "
                     "--amp bf16 (no scaler) or --zero 0");
    KILN_USAGE_CHECK(!(o.zero >= 2 && o.memory), "--memory is chapter 08's prediction, which shards no gradient: for "
                     "--zero ", o.zero, " ask chapter 15's planner (lesson-15 --plan --model baby-gpt --zero ", o.zero,
                     " --gpus ", flags.world_size, ")");
    KILN_USAGE_CHECK(!o.offload || device == Device::CUDA, "--offload moves AdamW's state from a GPU's memory to the "
                     "host's: it needs --device cuda (on the CPU the state is in the host's memory already)");
    KILN_USAGE_CHECK(!(o.offload && o.zero >= 1), "--offload with --zero ", o.zero, " is not built (each rank would update "
                     "its shard on its host): use one or the other");
    KILN_USAGE_CHECK(!(o.offload && o.memory), "--memory is chapter 08's prediction, which keeps AdamW's state on the "
                     "device: for --offload ask chapter 15's planner (lesson-15 --plan --model baby-gpt --offload)");
    KILN_USAGE_CHECK(o.offload || o.offload_schedule == "overlapped", "--offload-schedule ", o.offload_schedule,
                     " schedules the offloaded optimizer: add --offload");
}

// The recipe's AdamW: whole on every rank, or sharded over them (--zero 1, 2, 3), or with its
// state on the host (--offload, chapter 15: optim/offload.h), its update overlapped with the GPU's
// work or after it (--offload-schedule).
std::unique_ptr<Optimizer> make_optimizer(GPT& model, const Lesson14Flags& o, Communicator& comm) {
    if (o.zero >= 1) return gpt_zero_optimizer(model, o.recipe, o.zero, comm);
    if (o.offload) {
        OffloadOptions options;
        options.schedule = o.offload_schedule == "serial" ? OffloadSchedule::Serial : OffloadSchedule::Overlapped;
        return offload_optimizer(gpt_optimizer(model, o.recipe), model, options);
    }
    return gpt_optimizer(model, o.recipe);
}

// What each rank keeps of the model's state under --zero N, for the run's first lines.
const char* sharding(int zero) {
    switch (zero) {
        case 1: return "ZeRO-1 (AdamW's moments sharded, gradients reduced and clipped in the optimizer)";
        case 2: return "ZeRO-2 (AdamW's moments and the gradients sharded, reduced bucket by bucket during backward)";
        case 3: return "ZeRO-3 (AdamW's moments, the gradients and the parameters sharded, each block gathered while it runs)";
        default: return "data parallel (gradients all-reduced during backward)";
    }
}

// --sample N: N characters after the prompt, drawn with the temperature, top-k and KV cache of
// the flags, from Rng(seed); printed with the cache's size and the time they took.
void print_sample(GPT& model, const CharTokenizer& vocabulary, const Lesson14Flags& o, uint64_t seed) {
    SampleOptions s;
    s.temperature = o.temperature, s.top_k = o.top_k, s.kv_cache = !o.no_kv_cache;
    Rng rng(seed);
    int64_t cache_bytes = 0;
    const std::vector<int32_t> prompt =
        vocabulary.encode(decode_utf8(std::vector<uint8_t>(o.prompt.begin(), o.prompt.end()), "--prompt"), "--prompt");
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<int32_t> ids = generate(model, prompt, o.sample, s, rng, &cache_bytes);
    std::printf("sample (%lld characters, temperature %.2f, %s, %.1f s):\n%s\n", (long long)o.sample, o.temperature,
                s.kv_cache ? ("KV cache " + format_bytes(cache_bytes)).c_str() : "no KV cache", seconds_since(t0),
                vocabulary.decode(ids).c_str());
}

// --from FILE: the model and vocabulary of a checkpoint (train/gpt_recipe.h), and a sample; the
// text is not read, and nothing is trained.
int sample_from(const std::string& path, const CommonFlags& flags, const Lesson14Flags& o, Device device, const Cli& cli) {
    flags.refuse_training_flags("--from samples from a trained model");
    for (const char* f : {"--iters", "--block-size", "--n-layer", "--n-head", "--n-embd", "--dropout", "--recompute",
                          "--memory"})
        KILN_USAGE_CHECK(!cli.given(f), f, " shapes a model or its training; --from takes the checkpoint's model as it is");
    LoadedGPT loaded = load_gpt_checkpoint(path, o.attention == "flash" ? AttentionKind::Flash : AttentionKind::Textbook);
    loaded.model->to(device);
    const GPTConfig& c = loaded.model->config;
    std::printf("lesson-14: %s, trained %lld steps: GPT of %lld layers, %lld heads, %lld channels, context %lld, "
                "vocabulary %lld (vocab.json beside it), device %s\n",
                path.c_str(), (long long)loaded.step, (long long)c.n_layer, (long long)c.n_head, (long long)c.n_embd,
                (long long)c.block_size, (long long)c.vocab_size, device_name(device));
    flags.use("--seed");
    if (o.sample > 0) print_sample(*loaded.model, loaded.vocabulary, o, flags.seed);
    flags.check_used();
    return 0;
}

int run(int argc, char** argv, MpiCommunicator& mpi) {
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
    cli.add("--from", &o.from, "sample from a checkpoint of --save (its weights, and the vocab.json beside it), "
            "without the text and without training");
    cli.add("--zero", &o.zero, "under mpirun: 0, data parallel (every rank keeps AdamW's moments), 1, ZeRO-1 "
            "(each rank those of its piece of the parameters), 2, ZeRO-2 (and that piece's gradients), 3, ZeRO-3 "
            "(and that piece's parameters)", Cli::between(0, 3));
    cli.add("--offload", &o.offload, "with --device cuda: AdamW's moments and the f32 master weights in the host's "
            "pinned memory, the update on the CPU (chapter 15)");
    cli.add("--offload-schedule", &o.offload_schedule, "with --offload: overlapped (the copies and the CPU's update "
            "run beside backward and the next forward, bucket by bucket) or serial (after backward, the GPU waiting)",
            {"overlapped", "serial"});
    cli.parse(argc, argv);
    start_ranks(mpi, cli, flags);  // the same flags on every rank, the cores shared out, rank 0 speaks
    Device device = flags.apply();
    if (!o.from.empty()) return sample_from(o.from, flags, o, device, cli);
    check_ranks(flags, o, device);
    for (const char* f : {"--batch-size", "--lr", "--seed", "--data", "--limit", "--amp", "--accumulate", "--save",
                          "--resume", "--overwrite"})
        flags.use(f);
    const auto start = std::chrono::steady_clock::now();

    const TextData text = load_text(flags.data + "/moby-dick.txt", flags.limit, 0.1, " (make data fetches it)");
    o.gpt.vocab_size = text.tokenizer.size();
    o.gpt.attention = o.attention == "flash" ? AttentionKind::Flash : AttentionKind::Textbook;
    o.recipe.lr = flags.lr;
    o.recipe.decay_iters = o.recipe.iters;
    auto model = make_gpt(o.gpt, flags.seed);
    model->to(device);
    auto opt = make_optimizer(*model, o, mpi);
    std::unique_ptr<DataParallel> ddp;  // --zero 0 on several ranks: the gradients averaged after backward
    if (mpi.size() > 1 && o.zero == 0) ddp = std::make_unique<DataParallel>(*model, mpi);
    flags.apply_memory_limit(device);
    TrainOptions saving;  // --save into another run's folder is refused without --overwrite
    saving.save_dir = flags.save, saving.resume = flags.resume, saving.overwrite = flags.overwrite;
    if (!flags.save.empty()) check_save_dir(saving);
    std::printf("lesson-14: GPT of %lld layers, %lld heads, %lld channels, context %lld, vocabulary %lld: %lld "
                "parameters (%s attention%s), batch %lld, %lld steps, %lld training characters, %s, device %s\n",
                (long long)o.gpt.n_layer, (long long)o.gpt.n_head, (long long)o.gpt.n_embd, (long long)o.gpt.block_size,
                (long long)o.gpt.vocab_size, (long long)gpt_num_params(*model), o.attention.c_str(),
                o.gpt.recompute ? ", recompute" : "", (long long)flags.batch_size, (long long)o.recipe.iters,
                (long long)text.train.size(), flags.amp == DType::F32 ? "f32" : ("amp " + std::string(dtype_name(flags.amp))).c_str(),
                device_name(device));
    if (mpi.size() > 1)
        std::printf("%d ranks × %lld windows, %s\n", mpi.size(), (long long)(flags.batch_size / mpi.size()),
                    sharding(o.zero));
    if (o.offload)
        std::printf("offload: AdamW's moments and the f32 master weights on the host; %s over PCIe each way a step; "
                    "the %s schedule\n",
                    format_bytes(static_cast<const OffloadedOptimizer&>(*opt).bytes_each_way()).c_str(),
                    offload_schedule_name(static_cast<const OffloadedOptimizer&>(*opt).schedule()));
    if (o.memory) {  // chapter 08's table of the step, and stop
        print_memory(*model, *opt, flags, o, device);
        flags.check_used();
        return 0;
    }

    // --resume: the weights, AdamW's moments, the step and the batches' seed; batch k is a function
    // of (seed, k), so the run goes on with the batches it would have drawn
    // (--zero 3: each rank its own shard, dist/zero3.h's gpt_shard_path)
    const GPTProgress at = flags.resume.empty() ? GPTProgress{0, flags.seed}
                           : o.zero == 3 ? resume_gpt_shard(flags.resume, *model, static_cast<ZeroOptimizer&>(*opt),
                                                            text.tokenizer, mpi.rank(), mpi.size())
                                         : resume_gpt(flags.resume, *model, *opt, text.tokenizer);
    const int64_t first = at.step;
    if (!flags.resume.empty()) {
        std::printf("resumed from %s: %lld steps done\n", flags.resume.c_str(), (long long)first);
        if (at.seed != flags.seed)
            std::printf("the batches go on as the checkpoint's run drew them, with its --seed %llu (not %llu)\n",
                        (unsigned long long)at.seed, (unsigned long long)flags.seed);
    }
    const auto save = [&](int64_t steps_done) {
        if (flags.save.empty()) return;
        const GPTProgress done{steps_done, at.seed};
        if (o.zero == 3)  // one file a rank, nothing gathered
            save_gpt_shard(flags.save, *model, static_cast<ZeroOptimizer&>(*opt), text.tokenizer, done, mpi.rank(), mpi.size());
        else
            save_gpt_checkpoint(flags.save, *model, *opt, text.tokenizer, done, mpi.rank() == 0);
    };
    TextWindows batches(text.train, o.gpt.block_size, flags.batch_size, at.seed, "the training split");
    BumpAllocator arena("step arena", device);
    std::optional<GradScaler> scaler;
    if (flags.amp == DType::F16) scaler.emplace();
    const StepOptions step{&arena, o.recipe.clip, flags.accumulate, scaler ? &*scaler : nullptr, flags.amp};
    model->train();
    auto last = std::chrono::steady_clock::now();  // when step last_it ended
    int64_t last_it = first - 1;
    for (int64_t it = first; it < o.recipe.iters; it++) {
        StepResult r = gpt_train_step(*model, *opt, batches, it, o.recipe, step, device, mpi.rank(), mpi.size());
        if (mpi.size() > 1) r.loss = float(mpi.sum(r.loss) / mpi.size());  // the whole batch's: the mean of the shares'
        KILN_CHECK(r.finite() || scaler, "training diverged at step ", it, ": loss ", r.loss, " (try a lower --lr)");
        if (it % o.log_interval == 0 || it == o.recipe.iters - 1) {
            const double ms = 1000.0 * seconds_since(last) / double(it - last_it);  // the steps since the last line
            std::printf("step %lld: loss %.4f, lr %.2e, %.0f ms/step\n", (long long)it, r.loss, opt->lr(), ms);
            std::fflush(stdout);
            last = std::chrono::steady_clock::now(), last_it = it;
        }
        if (it > 0 && it % o.eval_interval == 0 && it + 1 < o.recipe.iters) {  // not timed with the steps
            std::printf("step %lld: val loss %.4f (first %lld windows)\n", (long long)it,
                        gpt_eval_loss(*model, text.val, o.gpt.block_size, 64, o.eval_windows, device),
                        (long long)o.eval_windows);
            save(it + 1);
            last = std::chrono::steady_clock::now(), last_it = it;
        }
    }
    opt->synchronize();  // the last step's weights in place (an overlapped offload may still be copying them)
    const double train_seconds = seconds_since(start);
    if (first < o.recipe.iters) save(o.recipe.iters);
    if (o.zero == 3) static_cast<Zero3Optimizer&>(*opt).gather_model();  // whole for the evaluation and the sample
    const double val = gpt_eval_loss(*model, text.val, o.gpt.block_size, 64, 0, device);
    std::printf("%s", memory_summary(device).c_str());  // each allocator's peak (rank 0's), and the limit if any
    if (o.offload)
        std::printf("host, pinned (offload): %s\n",
                    format_bytes(static_cast<const OffloadedOptimizer&>(*opt).host_stats().allocated).c_str());
    std::printf("result: val_loss=%.4f bits_per_char=%.3f time=%.1fs peak_mem=%s\n", val, val / std::log(2.0),
                train_seconds, format_bytes(peak_memory(device)).c_str());

    if (o.sample > 0 && mpi.rank() == 0) print_sample(*model, text.tokenizer, o, flags.seed);
    flags.check_used();
    return 0;
}

}  // namespace

int main(int argc, char** argv) { return run_ranks("lesson-14", argc, argv, run); }
