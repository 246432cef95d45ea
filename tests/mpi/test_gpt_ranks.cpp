// test_gpt_ranks.cpp — chapter 14's GPT on 2 ranks (mpirun -np 2), lesson-14's training step
// (train/gpt_recipe.h, gpt_train_step) with its recipe's AdamW and clipping: ZeRO-1 and plain
// data parallel against one process that trains on the whole batch.
//
// Run: make build/tests/kiln_mpi_tests && mpirun -np 2 build/tests/kiln_mpi_tests '[lesson14]'
// (as root add --allow-run-as-root --oversubscribe; make test runs them all)
#include <algorithm>
#include <cmath>
#include <memory>

#include <catch2/catch.hpp>

#include "dist/data_parallel.h"
#include "dist/zero.h"
#include "train/gpt_recipe.h"
#include "world.h"

using namespace kiln;

namespace {

// 3000 random tokens of a vocabulary of 16 (seed 4): the same on every rank.
std::vector<int32_t> random_tokens() {
    Rng rng(4);
    std::vector<int32_t> tokens(3000);
    for (int32_t& t : tokens) t = int32_t(rng.next_below(16));
    return tokens;
}

// A GPT small enough for a test: 2 layers, 2 heads, 32 channels, context 16.
GPTConfig small_gpt() {
    GPTConfig c = baby_gpt_config(16);
    c.n_layer = 2, c.n_head = 2, c.n_embd = 32, c.block_size = 16;
    return c;
}

enum class Ranks { Alone, DataParallel, Zero1 };
struct Run {
    std::vector<float> losses, norms;  // each step's (the whole batch's loss; the norm before clipping)
    std::vector<float> params;
};

// 8 steps of lesson-14's recipe (lr 1e-2 after 2 steps of warm-up, clipping at 0.5) on batches of
// 8 windows: alone, or this rank's 4 of each with plain data parallel or ZeRO-1.
Run train(const std::vector<int32_t>& tokens, Ranks ranks) {
    GPTRecipe recipe;
    recipe.iters = recipe.decay_iters = 8, recipe.warmup = 2, recipe.lr = 1e-2f, recipe.min_lr = 1e-3f, recipe.clip = 0.5f;
    auto model = make_gpt(small_gpt(), 1);
    std::unique_ptr<Optimizer> opt;
    if (ranks == Ranks::Zero1)
        opt = std::make_unique<ZeroOptimizer>(*model, decay_groups(*model, recipe.lr, recipe.weight_decay), world(), gpt_adamw);
    else
        opt = gpt_optimizer(*model, recipe);
    std::unique_ptr<DataParallel> ddp;
    if (ranks == Ranks::DataParallel) ddp = std::make_unique<DataParallel>(*model, world());
    const bool alone = ranks == Ranks::Alone;
    const TextWindows batches(tokens, 16, 8, 1, "the tokens");
    StepOptions step;
    step.clip_norm = recipe.clip;
    Run run;
    for (int64_t it = 0; it < recipe.iters; it++) {
        const StepResult r =
            gpt_train_step(*model, *opt, batches, it, recipe, step, Device::CPU, alone ? 0 : world().rank(), alone ? 1 : 2);
        run.losses.push_back(alone ? r.loss : float(world().sum(r.loss) / 2));  // the whole batch's: the mean of the shares'
        run.norms.push_back(r.grad_norm);
    }
    const Tensor v = model->values_view();
    run.params.assign(v.data<float>(), v.data<float>() + v.numel());
    return run;
}

}  // namespace

// ZeRO-1 and data parallel reduce the same gradients (a + b, halved) and clip them by the same
// global norm, summed in another grouping (ZeRO-1: each rank's piece, then the two pieces; data
// parallel: parameter by parameter), which the float norm does not see: the same floats, bit for
// bit. One process takes the mean over 8 windows in one GEMM, not over 4 and 4 averaged: rounding
// apart, the same losses and norms (within 1e-5, relative) and parameters — all but a few within
// 1e-6, and those within 1% of one step's lr: AdamW moves each element by lr · m/(√v + ε), about
// lr whatever the gradient's size, so an element whose gradients are tiny (near their rounding)
// takes a visibly different step (8 steps: 53 of 26976 elements beyond 1e-6, at most 2.2e-5).
TEST_CASE("lesson 14 on 2 ranks: ZeRO-1 takes data parallel's steps bit for bit, and one process's within rounding",
          "[lesson14][zero][ddp][cpu][mpi]") {
    REQUIRE(world().size() == 2);
    const std::vector<int32_t> tokens = random_tokens();
    const Run zero = train(tokens, Ranks::Zero1);
    const Run ddp = train(tokens, Ranks::DataParallel);
    const Run alone = train(tokens, Ranks::Alone);
    for (size_t s = 0; s < zero.losses.size(); s++) {
        INFO("step " << s << ": loss " << zero.losses[s] << " / " << ddp.losses[s] << " / " << alone.losses[s]
                     << " (ZeRO-1 / data parallel / alone), norm " << zero.norms[s] << " / " << ddp.norms[s] << " / "
                     << alone.norms[s]);
        CHECK(zero.norms[s] > 0.5f);  // every step clips
        CHECK(zero.losses[s] == ddp.losses[s]);
        CHECK(zero.norms[s] == ddp.norms[s]);
        CHECK(zero.losses[s] == Approx(alone.losses[s]).epsilon(1e-5));
        CHECK(zero.norms[s] == Approx(alone.norms[s]).epsilon(1e-5));
    }
    REQUIRE(zero.params == ddp.params);
    float worst = 0;
    size_t above = 0;
    for (size_t i = 0; i < zero.params.size(); i++) {
        worst = std::max(worst, std::abs(zero.params[i] - alone.params[i]));
        above += std::abs(zero.params[i] - alone.params[i]) > 1e-6f;
    }
    INFO("largest difference from one process's parameters: " << worst << "; " << above << " of "
                                                                   << zero.params.size() << " differ by more than 1e-6");
    CHECK(worst < 1e-4f);                      // 1% of one step's lr
    CHECK(above * 100 < zero.params.size());   // a few: the rest agree to 1e-6
}
