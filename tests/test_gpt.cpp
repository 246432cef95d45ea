// test_gpt.cpp — chapter 14's model (nn/gpt.h): nanoGPT's names and parameter count, its
// initialization, the gradients of a block and of the whole model against central differences,
// per-block recomputation bit for bit, the KV cache against the full forward, and a Linear on
// [B, T, C]; checkpoints that carry the vocabulary (--save, --resume, --from).
//
//   make test T='[gpt]'
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "data/text.h"
#include "fixtures.h"
#include "gradcheck.h"
#include "nn/gpt.h"
#include "core/allocator.h"
#include "ops/autocast.h"
#include "ops/ops.h"
#include "optim/adam.h"
#include "train/checkpoint.h"
#include "train/gpt_recipe.h"
#include "train/loop.h"
#include "train/memory_model.h"

using namespace kiln;

namespace {

GPTConfig tiny_config(AttentionKind kind = AttentionKind::Flash, float dropout = 0.0f, bool recompute = false) {
    GPTConfig c;
    c.block_size = 12, c.vocab_size = 7, c.n_layer = 2, c.n_head = 2, c.n_embd = 8;
    c.dropout = dropout, c.attention = kind, c.recompute = recompute;
    return c;
}

using test::random_ids;

// L = Σ logits · r, in double.
double loss_of(GPT& model, const Tensor& ids, const Tensor& r) {
    NoGradScope no_grad;
    const Tensor y = model.call(ids);
    double l = 0.0;
    for (int64_t i = 0; i < y.numel(); i++) l += double(y.data<float>()[i]) * double(r.data<float>()[i]);
    return l;
}

}  // namespace

TEST_CASE("GPT: nanoGPT's state_dict keys and parameter count", "[gpt][lesson14][cpu]") {
    GPTConfig c = tiny_config();
    c.n_layer = 1;
    auto model = make_gpt(c, 1);
    std::vector<std::string> names;
    for (auto& [name, p] : model->named_parameters()) names.push_back(name);
    // nanoGPT's model.state_dict().keys() for n_layer = 1, less lm_head.weight (the tied wte) and
    // the attention's causal-mask buffer (nanoGPT's attn.bias, absent with flash attention)
    const std::vector<std::string> want = {
        "transformer.wte.weight",          "transformer.wpe.weight",          "transformer.h.0.ln_1.weight",
        "transformer.h.0.ln_1.bias",       "transformer.h.0.attn.c_attn.weight", "transformer.h.0.attn.c_attn.bias",
        "transformer.h.0.attn.c_proj.weight", "transformer.h.0.attn.c_proj.bias", "transformer.h.0.ln_2.weight",
        "transformer.h.0.ln_2.bias",       "transformer.h.0.mlp.c_fc.weight",  "transformer.h.0.mlp.c_fc.bias",
        "transformer.h.0.mlp.c_proj.weight", "transformer.h.0.mlp.c_proj.bias", "transformer.ln_f.weight",
        "transformer.ln_f.bias"};
    CHECK(names == want);
    // get_num_params(): V·C (wte, which is also lm_head) + L·(12C² + 13C) + 2C, wpe not counted
    const int64_t C = c.n_embd, V = c.vocab_size;
    CHECK(gpt_num_params(*model) == V * C + c.n_layer * (12 * C * C + 13 * C) + 2 * C);
    CHECK(gpt_num_params(*model, false) == gpt_num_params(*model) + c.block_size * C);
}

TEST_CASE("GPT: nanoGPT's initialization — N(0, 0.02), residual projections N(0, 0.02/√(2L)), layer norms 1 and 0",
          "[gpt][lesson14][cpu]") {
    GPTConfig c = tiny_config();
    c.n_embd = 64, c.n_layer = 8, c.vocab_size = 50;
    auto model = make_gpt(c, 3);
    const auto stddev = [](const Tensor& t) {
        double s = 0.0, s2 = 0.0;
        for (int64_t i = 0; i < t.numel(); i++) s += t.data<float>()[i], s2 += double(t.data<float>()[i]) * t.data<float>()[i];
        const double mean = s / double(t.numel());
        return std::sqrt(s2 / double(t.numel()) - mean * mean);
    };
    for (auto& [name, p] : model->named_parameters()) {
        INFO(name);
        const Tensor& v = p->value;
        if (name.find("c_proj.weight") != std::string::npos)
            CHECK(stddev(v) == Approx(0.02 / std::sqrt(16.0)).epsilon(0.1));
        else if (v.ndim() == 2)
            CHECK(stddev(v) == Approx(0.02).epsilon(0.1));
        else
            CHECK(v.get({0}) == (name.find("ln") != std::string::npos && name.find(".weight") != std::string::npos ? 1 : 0));
    }
}

TEST_CASE("GPT block: gradients of the input and every parameter match central differences, both attentions",
          "[gpt][lesson14][cpu]") {
    for (AttentionKind kind : {AttentionKind::Textbook, AttentionKind::Flash}) {
        INFO(attention_kind_name(kind));
        Rng seeds(5), rng(6);
        Block block(tiny_config(kind), seeds, "0");
        check_module_gradients(block, Tensor::normal({2, 5, 8}, 0.0f, 1.0f, rng), 7);
    }
}

// Through the whole model, embeddings and tied head included: L = Σ logits · r, and for a sample
// of elements of every parameter, dL/dv against (L(v + ε) − L(v − ε)) / 2ε.
TEST_CASE("GPT: the whole model's parameter gradients match central differences (tied head, both embeddings)",
          "[gpt][lesson14][cpu]") {
    GPTConfig c = tiny_config();
    auto model = make_gpt(c, 11);
    for (auto& [name, p] : model->named_parameters()) {  // weights larger than nanoGPT's 0.02: visible effects
        Rng rng(std::hash<std::string>{}(name));
        p->value.copy_from(Tensor::normal(p->value.shape(), 0.0f, 0.3f, rng));
    }
    const Tensor ids = random_ids(2, 9, c.vocab_size, 12);
    Rng rng(13);
    const Tensor r = Tensor::normal({2 * 9, c.vocab_size}, 0.0f, 1.0f, rng);
    model->train();
    model->zero_grad();
    model->call(ids);
    model->call_backward(r);
    const double eps = 1e-2;
    Rng pick(14);
    for (auto& [name, p] : model->named_parameters()) {
        INFO(name);
        const Tensor g = p->grad.clone();
        for (int k = 0; k < 6; k++) {
            const int64_t i = int64_t(pick.next_below(uint64_t(p->value.numel())));
            float& v = p->value.data<float>()[i];
            const float v0 = v;
            v = v0 + float(eps);
            const double lp = loss_of(*model, ids, r);
            v = v0 - float(eps);
            const double lm = loss_of(*model, ids, r);
            v = v0;
            const double numeric = (lp - lm) / (2 * eps), analytic = g.data<float>()[i];
            CHECK(std::fabs(analytic - numeric) <= 3e-2 * std::max(std::fabs(analytic), std::fabs(numeric)) + 2e-3);
        }
    }
}

// nanoGPT's targets [B, T]: the loss flattens them as the logits' rows.
TEST_CASE("GPT: a train_step on [B, T] targets, and per-block recomputation gives the same gradients bit for bit",
          "[gpt][recompute][lesson14][cpu]") {
    for (AttentionKind kind : {AttentionKind::Textbook, AttentionKind::Flash}) {
        INFO(attention_kind_name(kind));
        const Tensor x = random_ids(3, 12, 7, 21), y = random_ids(3, 12, 7, 22);
        std::vector<Tensor> grads;
        std::vector<float> losses;
        for (bool recompute : {false, true}) {
            auto model = make_gpt(tiny_config(kind, 0.2f, recompute), 23);
            AdamW opt(model->parameters(), 1e-3f);
            const StepResult r = train_step(*model, opt, x, y, StepOptions{});
            REQUIRE(r.stepped);
            losses.push_back(r.loss);
            grads.push_back(model->grads_view().clone());
        }
        CHECK(losses[0] == losses[1]);
        test::require_identical(grads[1], grads[0]);
        // the first loss of an untrained model: about ln V (every character equally likely)
        CHECK(losses[0] == Approx(std::log(7.0)).epsilon(0.05));
    }
}

TEST_CASE("GPT: generation with the KV cache computes the full forward's logits, position by position",
          "[gpt][kvcache][lesson14][cpu]") {
    auto model = make_gpt(tiny_config(), 31);
    model->eval();
    const Tensor ids = random_ids(1, 10, 7, 32);
    Tensor full;
    {
        NoGradScope no_grad;
        full = model->call(ids);  // [10, V]
    }
    KVCache cache;
    for (int64_t l = 0; l < 2; l++) {
        cache.k.push_back(Tensor::zeros({1, 12, 8}));
        cache.v.push_back(Tensor::zeros({1, 12, 8}));
    }
    CHECK(cache.bytes() == 2 * 2 * 12 * 8 * 4);
    Tensor prompt = Tensor::empty({1, 4}, DType::I32);
    for (int64_t t = 0; t < 4; t++) prompt.data<int32_t>()[t] = ids.data<int32_t>()[t];
    Tensor logits = forward_cached(*model, prompt, cache);  // positions 0..3
    for (int64_t t = 4; t <= 10; t++) {
        INFO("position " << t - 1);
        for (int64_t v = 0; v < 7; v++) CHECK(logits.get({0, logits.size(1) - 1, v}) == Approx(full.get({t - 1, v})).margin(1e-5));
        if (t == 10) break;
        Tensor next = Tensor::empty({1, 1}, DType::I32);
        next.data<int32_t>()[0] = ids.data<int32_t>()[t];
        logits = forward_cached(*model, next, cache);
    }
    CHECK(cache.length == 10);
    // greedy decoding (top_k = 1) draws the same tokens with and without the cache
    const std::vector<int32_t> start = {1, 2, 3};
    SampleOptions with, without;
    with.top_k = without.top_k = 1;
    without.kv_cache = false;
    Rng r1(1), r2(1);
    CHECK(generate(*model, start, 8, with, r1) == generate(*model, start, 8, without, r2));
}

TEST_CASE("GPT: generation with the KV cache under bf16 autocast: caches in bf16, the full forward's tokens",
          "[gpt][kvcache][autocast][lesson14][cpu]") {
    // The caches hold what cached_attention computes in: under a bf16 scope, bf16 (half the bytes).
    auto model = make_gpt(tiny_config(), 31);
    AutocastScope amp(DType::BF16);
    CHECK(cached_attention_type(DType::F32) == DType::BF16);
    const std::vector<int32_t> start = {1, 2, 3};
    SampleOptions with, without;
    with.top_k = without.top_k = 1;
    without.kv_cache = false;
    Rng r1(1), r2(1);
    int64_t cache_bytes = 0;
    CHECK(generate(*model, start, 8, with, r1, &cache_bytes) == generate(*model, start, 8, without, r2));
    CHECK(cache_bytes == 2 * 2 * 12 * 8 * 2);  // 2 layers × (k, v) × block_size 12 × C 8 × 2 bytes
}

TEST_CASE("sample_token: temperature and top-k as nanoGPT's", "[gpt][lesson14][cpu]") {
    const float logits[4] = {1.0f, 3.0f, 2.0f, 0.0f};
    SampleOptions top1;
    top1.top_k = 1;
    Rng rng(5);
    for (int i = 0; i < 20; i++) CHECK(sample_token(logits, 4, top1, rng) == 1);
    SampleOptions top2;
    top2.top_k = 2;
    int counts[4] = {0, 0, 0, 0};
    for (int i = 0; i < 4000; i++) counts[sample_token(logits, 4, top2, rng)]++;
    CHECK(counts[0] == 0);
    CHECK(counts[3] == 0);
    // p(1) / p(2) = e^(3 − 2) among the two kept
    CHECK(double(counts[1]) / double(counts[1] + counts[2]) == Approx(std::exp(1.0) / (1 + std::exp(1.0))).margin(0.03));
    SampleOptions cold;
    cold.temperature = 0.0f;
    CHECK_THROWS_WITH(sample_token(logits, 4, cold, rng), Catch::Contains("temperature must be positive"));
}

// PyTorch's nn.Linear on [B, T, C]: the rows are every position, y is [B, T, out].
TEST_CASE("Linear on [B, T, in]: each position's row, and dx back in the input's shape", "[gpt][layers][lesson14][cpu]") {
    Rng rng(41);
    Linear fc(8, 5, rng);
    fc.train();
    const Tensor x = Tensor::normal({3, 4, 8}, 0.0f, 1.0f, rng);
    const Tensor y = fc.call(x);
    REQUIRE(y.shape() == Shape{3, 4, 5});
    Linear flat(8, 5, rng);
    flat.weight.value.copy_from(fc.weight.value);
    flat.bias.value.copy_from(fc.bias.value);
    test::require_close(y.reshape({12, 5}), flat.call(x.reshape({12, 8})), 1e-6);
    const Tensor dx = fc.call_backward(Tensor::normal({3, 4, 5}, 0.0f, 1.0f, rng));
    CHECK(dx.shape() == Shape{3, 4, 8});
    CHECK_THROWS_WITH(fc.call(Tensor::zeros({3, 4, 7})), Catch::Contains("expected input [N, 8] or [..., 8]"));
}

// Chapter 08's prediction (train/memory_model.h) of a GPT's steady training step against the
// allocators' peaks, at two context lengths, for both attentions and with per-block recomputation.
// On the CUDA device (the emulator without a GPU) the same, for both attentions at T = 32.
TEST_CASE("GPT memory: predicted and measured training peaks within 3%, textbook and flash, T = 32 and 64",
          "[gpt][memmodel][lesson14][cpu][cuda]") {
    for (Device device : {Device::CPU, Device::CUDA})
    for (AttentionKind kind : {AttentionKind::Textbook, AttentionKind::Flash})
        for (int64_t T : {32, 64})
            for (bool recompute : {false, true}) {
                if (device == Device::CUDA && (T != 32 || recompute)) continue;
                INFO(device_name(device) << " " << attention_kind_name(kind) << " T=" << T << (recompute ? " recompute" : ""));
                GPTConfig c = tiny_config(kind, 0.1f, recompute);
                c.block_size = 64, c.n_embd = 32, c.n_head = 4, c.vocab_size = 20;
                const int64_t B = 4;
                auto model = make_gpt(c, 1);
                model->train();
                const MemoryPrediction p =
                    predict_memory(*model, MemoryModelOptions{Shape{B, T}, OptimizerKind::Adam, device, true,
                                                              DType::F32, {}, Shape{B, T}});
                const int64_t measured = measure_gpt_step(c, B, T, device);
                INFO(memory_prediction_table(p));
                CHECK(double(p.allocator_peaks()) == Approx(double(measured)).epsilon(0.03));
            }
}

// ==== lesson 14's recipe =========================================================================
TEST_CASE("gpt_lr: nanoGPT's warm-up and cosine", "[gpt][lesson14][cpu]") {
    GPTRecipe r;
    r.iters = r.decay_iters = 1100, r.warmup = 100, r.lr = 1e-3f, r.min_lr = 1e-4f;
    CHECK(gpt_lr(r, 0) == Approx(1e-3 * 1 / 101));
    CHECK(gpt_lr(r, 99) == Approx(1e-3 * 100 / 101));
    CHECK(gpt_lr(r, 100) == Approx(1e-3));               // the cosine starts at lr
    CHECK(gpt_lr(r, 600) == Approx((1e-3 + 1e-4) / 2));  // half way: the mean
    CHECK(gpt_lr(r, 1100) == Approx(1e-4));
    CHECK(gpt_lr(r, 5000) == Approx(1e-4));
}

// The first losses of lesson-14's default run (seed 1), pinned: what `make lesson-14` prints.
// The pinned values were produced by this code; a change that alters them must be deliberate.
TEST_CASE("lesson 14: the baby GPT's first losses on Moby-Dick", "[gpt][trainer][lesson14][cpu]") {
    const TextData text = load_text("data/moby-dick/moby-dick.txt", 0, 0.1, " (make data fetches it)");
    REQUIRE(text.tokenizer.size() == 83);
    auto model = make_gpt(baby_gpt_config(text.tokenizer.size()), 1);
    GPTRecipe recipe;
    auto opt = gpt_optimizer(*model, recipe);
    TextWindows batches(text.train, 64, 12, 1, "the training split");
    BumpAllocator arena("test arena", Device::CPU);
    std::vector<float> losses;
    Tensor x, y;
    for (int64_t it = 0; it < 3; it++) {
        for (ParamGroup& g : opt->param_groups()) g.lr = gpt_lr(recipe, it);
        batches.batch(it, x, y);
        const StepResult r = train_step(*model, *opt, x, y, StepOptions{&arena, recipe.clip});
        REQUIRE(r.stepped);
        losses.push_back(r.loss);
    }
    const std::vector<float> pinned = {4.45501f, 4.45465f, 4.41161f};
    for (size_t i = 0; i < pinned.size(); i++) {
        INFO("step " << i);
        CHECK(losses[i] == Approx(pinned[i]).epsilon(1e-4));
    }
}

// ---- checkpoints (train/gpt_recipe.h) -------------------------------------------------------------
namespace {

// A tiny GPT on the characters of `text`, trained one step, with its AdamW.
struct TinyRun {
    CharTokenizer vocabulary;
    std::unique_ptr<GPT> model;
    std::unique_ptr<AdamW> opt;
};

TinyRun tiny_run(const std::string& text, int64_t n_head = 2) {
    const CharTokenizer tok = CharTokenizer::from_text(decode_utf8(std::vector<uint8_t>(text.begin(), text.end()), "test"));
    GPTConfig c = tiny_config();
    c.vocab_size = tok.size(), c.n_head = n_head;
    TinyRun r{tok, make_gpt(c, 5), nullptr};
    r.opt = gpt_optimizer(*r.model, GPTRecipe{});
    const StepResult s = train_step(*r.model, *r.opt, random_ids(2, 12, c.vocab_size, 6), random_ids(2, 12, c.vocab_size, 7), StepOptions{});
    REQUIRE(s.stepped);
    return r;
}

}  // namespace

TEST_CASE("GPT checkpoint: saved with its vocabulary, loaded without the text, it samples what the model sampled",
          "[gpt][checkpoint][lesson14][cpu]") {
    test::TempDir tmp;
    TinyRun run = tiny_run("Call me Ishmael.");
    save_gpt_checkpoint(tmp.file("run"), *run.model, *run.opt, run.vocabulary, GPTProgress{1, 3});
    REQUIRE(std::filesystem::exists(tmp.file("run/last.safetensors")));
    CHECK(CharTokenizer::load(tmp.file("run/vocab.json")) == run.vocabulary);

    const LoadedGPT loaded = load_gpt_checkpoint(tmp.file("run/last.safetensors"), AttentionKind::Textbook);
    CHECK(loaded.step == 1);
    CHECK(loaded.vocabulary == run.vocabulary);
    const GPTConfig& c = loaded.model->config;
    CHECK((c.n_layer == 2 && c.n_head == 2 && c.n_embd == 8 && c.block_size == 12 && c.vocab_size == run.vocabulary.size()));
    test::require_identical(loaded.model->values_view(), run.model->values_view());
    SampleOptions o;
    o.temperature = 0.8f;
    Rng r1(9), r2(9);
    const std::vector<int32_t> prompt = {1};
    CHECK(generate(*loaded.model, prompt, 20, o, r1) == generate(*run.model, prompt, 20, o, r2));
}

TEST_CASE("GPT checkpoint: a missing vocab.json, another text's, or a file of another model is refused by name",
          "[gpt][checkpoint][lesson14][cpu]") {
    test::TempDir tmp;
    TinyRun run = tiny_run("Call me Ishmael.");
    const std::string dir = tmp.file("run"), path = dir + "/last.safetensors", vocab = dir + "/vocab.json";
    save_gpt_checkpoint(dir, *run.model, *run.opt, run.vocabulary, GPTProgress{1, 3});

    std::filesystem::remove(vocab);
    CHECK_THROWS_WITH(load_gpt_checkpoint(path), Catch::Contains("no vocabulary '" + vocab + "'"));
    // as many characters, one of them another ('C' → 'K'): id 2, 'C' in the checkpoint's, is 'I' in this one
    CharTokenizer::from_text(decode_utf8(test::bytes_of("Kall me Ishmael."), "test")).save(vocab);
    CHECK_THROWS_WITH(load_gpt_checkpoint(path), Catch::Contains("'" + vocab + "' is not the vocabulary '" + path + "' was trained with") &&
                                                     Catch::Contains("id 2 is 'I' (U+49) in '" + vocab + "', 'C' (U+43) in the checkpoint"));
    CharTokenizer::from_text(decode_utf8(test::bytes_of("Call me"), "test")).save(vocab);
    CHECK_THROWS_WITH(load_gpt_checkpoint(path), Catch::Contains("in '" + vocab + "'") && Catch::Contains("in the checkpoint"));
    test::write_bytes(vocab, test::bytes_of("{\"code_points\": [1, 2]}"));
    CHECK_THROWS_WITH(load_gpt_checkpoint(path), Catch::Contains("is not a character vocabulary"));

    run.vocabulary.save(vocab);  // the right one again: it loads
    CHECK_NOTHROW(load_gpt_checkpoint(path));
    // chapter 07's checkpoint of the same model, without the GPT's entries
    TrainingRun plain{*run.model, *run.opt};
    save_checkpoint(tmp.file("plain.safetensors"), plain, ResumePoint{});
    CHECK_THROWS_WITH(load_gpt_checkpoint(tmp.file("plain.safetensors")), Catch::Contains("records no vocabulary"));
}

TEST_CASE("GPT --resume: the weights, AdamW and the step come back; another text or another shape is refused",
          "[gpt][checkpoint][lesson14][cpu]") {
    test::TempDir tmp;
    TinyRun run = tiny_run("Call me Ishmael.");
    const std::string path = tmp.file("run/last.safetensors");
    save_gpt_checkpoint(tmp.file("run"), *run.model, *run.opt, run.vocabulary, GPTProgress{1, 3});

    TinyRun fresh = tiny_run("Call me Ishmael.");
    for (Parameter* p : fresh.model->parameters()) fill_(p->value, 0.5f);
    const GPTProgress at = resume_gpt(path, *fresh.model, *fresh.opt, fresh.vocabulary);
    CHECK(at.step == 1);
    CHECK(at.seed == 3);  // the batches' seed: the checkpoint's run's
    test::require_identical(fresh.model->values_view(), run.model->values_view());
    CHECK(fresh.opt->steps() == run.opt->steps());

    TinyRun other_text = tiny_run("Kall me Ishmael.");
    CHECK_THROWS_WITH(resume_gpt(path, *other_text.model, *other_text.opt, other_text.vocabulary),
                      Catch::Contains("--resume " + path) && Catch::Contains("id 2 is 'I' (U+49) in this run's text") &&
                          Catch::Contains("--data and --limit"));
    TinyRun other_shape = tiny_run("Call me Ishmael.", 4);
    CHECK_THROWS_WITH(resume_gpt(path, *other_shape.model, *other_shape.opt, other_shape.vocabulary),
                      Catch::Contains("this run's model has --n-head 4, the checkpoint's 2"));
}
