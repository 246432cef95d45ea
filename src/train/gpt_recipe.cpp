// gpt_recipe.cpp — chapter 14's training recipe and validation loss (see gpt_recipe.h).
#include "train/gpt_recipe.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <filesystem>

#include "core/allocator.h"
#include "data/text.h"
#include "io/archive.h"
#include "nn/layers.h"
#include "train/checkpoint.h"
#include "train/fit.h"
#include "train/loop.h"

namespace kiln {

namespace {
constexpr double kPi = 3.14159265358979323846;
}  // namespace

GPTConfig baby_gpt_config(int64_t vocab_size) {
    GPTConfig c;
    c.block_size = 64, c.vocab_size = vocab_size, c.n_layer = 4, c.n_head = 4, c.n_embd = 128, c.dropout = 0.0f;
    c.attention = AttentionKind::Flash;
    return c;
}

float gpt_lr(const GPTRecipe& r, int64_t it) {
    if (it < r.warmup) return r.lr * float(it + 1) / float(r.warmup + 1);
    if (it > r.decay_iters) return r.min_lr;
    const double ratio = double(it - r.warmup) / double(std::max<int64_t>(1, r.decay_iters - r.warmup));
    const double coeff = 0.5 * (1.0 + std::cos(kPi * ratio));  // 1 → 0
    return float(double(r.min_lr) + coeff * double(r.lr - r.min_lr));
}

Adam::Options gpt_adam_options() {
    Adam::Options o;
    o.beta1 = 0.9f, o.beta2 = 0.99f;
    return o;
}

std::unique_ptr<AdamW> gpt_optimizer(GPT& model, const GPTRecipe& r) {
    return std::make_unique<AdamW>(decay_groups(model, r.lr, r.weight_decay), gpt_adam_options());
}

StepResult gpt_train_step(GPT& model, Optimizer& optimizer, const TextWindows& batches, int64_t it,
                          const GPTRecipe& recipe, const StepOptions& step, Device device, int rank, int world) {
    const float lr = gpt_lr(recipe, it);
    for (ParamGroup& g : optimizer.param_groups()) g.lr = lr;
    Tensor x, y;
    batches.batch(it, x, y, device, rank, world);
    return train_step(model, optimizer, x, y, step);
}

std::unique_ptr<Optimizer> gpt_adamw(std::vector<ParamGroup> groups) {
    return std::make_unique<AdamW>(std::move(groups), gpt_adam_options());
}

double gpt_eval_loss(GPT& model, const std::vector<int32_t>& tokens, int64_t block_size, int64_t batch,
                     int64_t max_windows, Device device) {
    const int64_t all = ordered_window_count(tokens, block_size);
    const int64_t windows = max_windows > 0 ? std::min(max_windows, all) : all;
    KILN_CHECK(windows > 0, "gpt_eval_loss: ", tokens.size(), " tokens hold no window of ", block_size + 1);
    const bool was_training = model.training();
    model.eval();
    NoGradScope no_grad;
    double total = 0.0;  // Σ over windows of each batch's mean loss × its windows
    for (int64_t first = 0; first < windows; first += batch) {
        const int64_t n = std::min(batch, windows - first);
        Tensor x, y;
        ordered_windows(tokens, block_size, first, n, x, y, device);
        CrossEntropyLoss loss;
        total += double(loss.forward(model.call(x), y)) * double(n);
    }
    model.train(was_training);
    return total / double(windows);
}

int64_t measure_gpt_step(const GPTConfig& c, int64_t B, int64_t T, Device device, const GPTOptimizerFactory& make_optimizer,
                         const std::function<void(const Optimizer&)>& after) {
    PoolAllocator& pool = pool_allocator(device);
    pool.empty_cache();
    const int64_t before = pool.stats().allocated;
    auto model = make_gpt(c, 1);
    model->to(device);
    const GPTRecipe recipe;
    std::unique_ptr<Optimizer> opt = make_optimizer ? make_optimizer(*model, recipe) : gpt_optimizer(*model, recipe);
    Rng rng(2);
    Tensor x = Tensor::empty({B, T}, DType::I32, Device::CPU, Category::Data), y = x.clone();
    for (int64_t i = 0; i < B * T; i++) {
        x.data<int32_t>()[i] = int32_t(rng.next_below(uint64_t(c.vocab_size)));
        y.data<int32_t>()[i] = int32_t(rng.next_below(uint64_t(c.vocab_size)));
    }
    x = x.to(device), y = y.to(device);
    BumpAllocator arena("measured step", device);
    const StepOptions step{&arena, recipe.clip};
    pool.empty_cache();
    for (int i = 0; i < 2; i++) {
        if (i == 1) pool.reset_peak(), arena.reset_peak();  // the steady step
        KILN_CHECK(train_step(*model, *opt, x, y, step).stepped, "measure_gpt_step: the step was not taken");
    }
    if (after) after(*opt);
    return device_memory_stats(device).peak_allocated - before;
}

// ---- checkpoints -------------------------------------------------------------------------------
namespace {

// The GPT's shape as a checkpoint records it, and the lesson-14 flag that sets each number.
struct ShapeEntry {
    const char* key;
    const char* flag;
    int64_t GPTConfig::*field;
};
const ShapeEntry kShape[] = {{"train.gpt.n_layer", "--n-layer", &GPTConfig::n_layer},
                             {"train.gpt.n_head", "--n-head", &GPTConfig::n_head},
                             {"train.gpt.n_embd", "--n-embd", &GPTConfig::n_embd},
                             {"train.gpt.block_size", "--block-size", &GPTConfig::block_size}};
constexpr const char* kVocabulary = "train.gpt.vocabulary";
constexpr const char* kSeed = "train.gpt.seed";

// The model's random streams (dropout's), named by their modules: a resumed run draws on.
std::vector<std::pair<std::string, Rng*>> random_streams(GPT& model) {
    std::vector<std::pair<std::string, Rng*>> streams;
    for (auto& [path, m] : model.named_modules())
        if (Rng* r = m->random_stream()) streams.emplace_back(path, r);
    return streams;
}

// The vocabulary the checkpoint records (train.gpt.vocabulary).
CharTokenizer recorded_vocabulary(const std::string& path, const StateDict& state) {
    KILN_CHECK(state.has(kVocabulary), "'", path, "' records no vocabulary (\"", kVocabulary,
               "\"): it is not a checkpoint of lesson-14 --save");
    return CharTokenizer::from_json(state.get_string(kVocabulary), path + "'s " + kVocabulary);
}

}  // namespace

void save_gpt_checkpoint(const std::string& save_dir, GPT& model, Optimizer& optimizer, const CharTokenizer& vocabulary,
                         const GPTProgress& at, bool main_process) {
    TrainingRun run{model, optimizer};
    StateDict state = checkpoint_state(run, ResumePoint{0, 0, at.step});  // every rank: a collective under ZeRO-1
    if (!main_process) return;
    record_gpt_run(state, model, vocabulary, at.seed);
    std::error_code error;
    std::filesystem::create_directories(save_dir, error);
    KILN_CHECK(!error, "--save ", save_dir, ": cannot create the folder (", error.message(), ")");
    vocabulary.save(save_dir + "/vocab.json");  // first: a checkpoint is never without it
    save_last(save_dir, state);
}

CharTokenizer gpt_checkpoint_vocabulary(const std::string& path, const StateDict& state) {
    const CharTokenizer recorded = recorded_vocabulary(path, state);
    const std::string file = (std::filesystem::path(path).parent_path() / "vocab.json").string();
    const CharTokenizer beside = CharTokenizer::load(file);
    const std::string diff = beside.difference(recorded, "'" + file + "'", "the checkpoint");
    KILN_CHECK(diff.empty(), "'", file, "' is not the vocabulary '", path, "' was trained with (", diff,
               "): put the vocab.json its run saved beside it");
    return beside;
}

LoadedGPT load_gpt_checkpoint(const std::string& path, AttentionKind attention) {
    const StateDict state = read_safetensors(path);
    CharTokenizer vocabulary = gpt_checkpoint_vocabulary(path, state);
    return with_hint((" (in checkpoint '" + path + "')").c_str(), [&] {
        GPTConfig c;
        c.vocab_size = vocabulary.size(), c.attention = attention, c.dropout = 0.0f;
        for (const ShapeEntry& e : kShape) c.*e.field = state.get_int(e.key, 1, INT32_MAX);
        auto model = make_gpt(c, 1);
        load_model(state, *model);  // every tensor's shape checked: wte's rows against the vocabulary
        return LoadedGPT{std::move(model), std::move(vocabulary), state.get_int("train.step", 0, INT64_MAX)};
    });
}

void record_gpt_run(StateDict& state, GPT& model, const CharTokenizer& vocabulary, uint64_t seed) {
    for (const ShapeEntry& e : kShape) state.set(e.key, model.config.*e.field);
    state.set_u64(kSeed, seed);
    state.set(kVocabulary, vocabulary.to_json());
    save_streams(state, random_streams(model));
}

uint64_t resume_gpt_run(const std::string& path, const StateDict& state, GPT& model, const CharTokenizer& corpus) {
    const std::string diff = corpus.difference(recorded_vocabulary(path, state), "this run's text", "the checkpoint's");
    KILN_CHECK(diff.empty(), "--resume ", path, ": the text's characters are not the vocabulary the checkpoint was "
               "trained with (", diff, "): resume with the --data and --limit of its run");
    for (const ShapeEntry& e : kShape) {
        const int64_t saved = state.get_int(e.key), now = model.config.*e.field;
        KILN_CHECK(saved == now, "--resume ", path, ": this run's model has ", e.flag, " ", now, ", the checkpoint's ",
                   saved, ": resume with the flags it was trained with");
    }
    with_hint((" (in checkpoint '" + path + "')").c_str(), [&] { load_streams(state, random_streams(model)); });
    return state.get_u64(kSeed);
}

GPTProgress resume_gpt(const std::string& path, GPT& model, Optimizer& optimizer, const CharTokenizer& corpus) {
    const StateDict state = read_safetensors(path);
    const uint64_t seed = resume_gpt_run(path, state, model, corpus);
    TrainingRun run{model, optimizer};
    const int64_t step = load_checkpoint(path, run).step;
    return GPTProgress{step, seed};
}

}  // namespace kiln
