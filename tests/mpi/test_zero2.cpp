// test_zero2.cpp — ZeRO-2 (dist/zero2.h) on chapter 14's GPT, 2 ranks (mpirun -np 2): the same
// parameters as plain data parallel, bit for bit, with the tied token embedding's gradient
// written first by lm_head and last by the embedding.
//
// Run: make build/tests/kiln_mpi_tests && mpirun -np 2 build/tests/kiln_mpi_tests '[zero2]'
// (as root add --allow-run-as-root --oversubscribe; make test runs them all)
#include <memory>

#include <catch2/catch.hpp>

#include "dist/data_parallel.h"
#include "dist/zero2.h"
#include "optim/adam.h"
#include "train/gpt_recipe.h"
#include "train/loop.h"
#include "world.h"

using namespace kiln;

namespace {

// Batches of random tokens, this rank's own (seeded by the rank): [B, T] ids and targets.
std::vector<std::pair<Tensor, Tensor>> token_batches(const GPTConfig& c, int64_t B, int steps) {
    Rng rng(uint64_t(7 + world().rank()));
    std::vector<std::pair<Tensor, Tensor>> batches;
    for (int s = 0; s < steps; s++) {
        Tensor x = Tensor::empty({B, c.block_size}, DType::I32), y = x.clone();
        for (int64_t i = 0; i < x.numel(); i++) {
            x.data<int32_t>()[i] = int32_t(rng.next_below(uint64_t(c.vocab_size)));
            y.data<int32_t>()[i] = int32_t(rng.next_below(uint64_t(c.vocab_size)));
        }
        batches.emplace_back(x, y);
    }
    return batches;
}

// The recipe's AdamW, at its schedule's learning rate for each step, with its clipping (to a norm
// of 1), on data parallel (stage 0) or ZeRO-2 (stage 2, buckets of bucket_bytes); the parameters
// after the steps.
std::vector<float> train_gpt(const GPTConfig& c, int stage, int64_t bucket_bytes = 64 << 10) {
    auto model = make_gpt(c, 1);
    const GPTRecipe r;
    std::unique_ptr<DataParallel> dp;
    std::unique_ptr<Optimizer> opt;
    if (stage == 0) {
        dp = std::make_unique<DataParallel>(*model, world());
        opt = gpt_optimizer(*model, r);
    } else {
        Zero2Options o;
        o.bucket_bytes = bucket_bytes;
        o.written_early = {&model->transformer().wte().weight};
        const auto adamw = [](std::vector<ParamGroup> groups) -> std::unique_ptr<Optimizer> {
            return std::make_unique<AdamW>(std::move(groups), gpt_adam_options());
        };
        opt = std::make_unique<Zero2Optimizer>(*model, decay_groups(*model, r.lr, r.weight_decay), world(), adamw, o);
    }
    StepOptions clip;
    clip.clip_norm = r.clip;
    int64_t it = 0;
    for (auto& [x, y] : token_batches(c, 4, 3)) {
        for (ParamGroup& g : opt->param_groups()) g.lr = gpt_lr(r, it);
        const StepResult step = train_step(*model, *opt, x, y, clip);
        REQUIRE(step.stepped);
        REQUIRE(step.grad_norm > r.clip);  // each step clips
        it++;
    }
    Tensor v = model->values_view();
    return std::vector<float>(v.data<float>(), v.data<float>() + v.numel());
}

}  // namespace

TEST_CASE("ZeRO-2 trains chapter 14's GPT to data parallel's parameters, bit for bit", "[lesson15][cpu][mpi][zero][zero2]") {
    for (bool recompute : {false, true}) {
        DYNAMIC_SECTION((recompute ? "blocks recomputed" : "activations kept")) {
            GPTConfig c = baby_gpt_config(83);
            c.n_layer = 2, c.recompute = recompute;
            const std::vector<float> plain = train_gpt(c, 0);
            REQUIRE(train_gpt(c, 2) == plain);
            REQUIRE(train_gpt(c, 2, 25 << 20) == plain);  // one bucket: the whole slab at the end
        }
    }
}

// lm_head writes the tied embedding's gradient before the embedding's own backward: without its
// buffer from the start of backward, lm_head's write finds no gradient tensor (the op says so).
TEST_CASE("ZeRO-2 refuses a tied weight it was not told of", "[lesson15][cpu][mpi][zero][zero2]") {
    auto model = make_gpt(baby_gpt_config(83), 1);
    const GPTRecipe r;
    Zero2Options o;
    o.bucket_bytes = 64 << 10;
    const auto adamw = [](std::vector<ParamGroup> groups) -> std::unique_ptr<Optimizer> {
        return std::make_unique<AdamW>(std::move(groups), gpt_adam_options());
    };
    Zero2Optimizer zero(*model, decay_groups(*model, r.lr, r.weight_decay), world(), adamw, o);
    auto [x, y] = token_batches(model->config, 2, 1).front();
    CHECK_THROWS_WITH(train_step(*model, zero, x, y, {}), Catch::Contains("undefined tensor"));
}
