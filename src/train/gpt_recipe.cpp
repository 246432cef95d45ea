// gpt_recipe.cpp — chapter 14's training recipe and validation loss (see gpt_recipe.h).
#include "train/gpt_recipe.h"

#include <algorithm>
#include <cmath>

#include "core/allocator.h"
#include "data/text.h"
#include "nn/layers.h"
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

std::unique_ptr<AdamW> gpt_optimizer(GPT& model, const GPTRecipe& r) {
    Adam::Options o;
    o.beta1 = 0.9f, o.beta2 = 0.99f;
    return std::make_unique<AdamW>(decay_groups(model, r.lr, r.weight_decay), o);
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

int64_t measure_gpt_step(const GPTConfig& c, int64_t B, int64_t T, Device device) {
    PoolAllocator& pool = pool_allocator(device);
    pool.empty_cache();
    const int64_t before = pool.stats().allocated;
    auto model = make_gpt(c, 1);
    model->to(device);
    const GPTRecipe recipe;
    auto opt = gpt_optimizer(*model, recipe);
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
    return device_memory_stats(device).peak_allocated - before;
}

}  // namespace kiln
