// test_zero_gpt.cpp — ZeRO-2 (dist/zero2.h) and ZeRO-3 (dist/zero3.h) on chapter 14's GPT, 2 ranks
// (mpirun -np 2): the same parameters as plain data parallel, bit for bit, with the tied token
// embedding's gradient written first by lm_head and last by the embedding; ZeRO-1, 2 and 3
// resumed from each rank's own shard.
//
// Run: make build/tests/kiln_mpi_tests && mpirun -np 2 build/tests/kiln_mpi_tests '[zero2],[zero3]'
// (as root add --allow-run-as-root --oversubscribe; make test runs them all)
#include <filesystem>
#include <memory>

#include <unistd.h>

#include <catch2/catch.hpp>

#include "dist/data_parallel.h"
#include "dist/zero2.h"
#include "dist/zero3.h"
#include "io/safetensors.h"
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

std::vector<float> floats_of(const Tensor& t) { return std::vector<float>(t.data<float>(), t.data<float>() + t.numel()); }

// `steps` steps of the recipe's AdamW, at its schedule's learning rate from step `from` on, with
// its clipping (to a norm of 1), on this rank's batches from..from+steps−1.
void train_steps(GPT& model, Optimizer& opt, int from, int steps) {
    const GPTRecipe r;
    StepOptions clip;
    clip.clip_norm = r.clip;
    const auto batches = token_batches(model.config, 4, from + steps);
    for (int it = from; it < from + steps; it++) {
        for (ParamGroup& g : opt.param_groups()) g.lr = gpt_lr(r, it);
        const StepResult step = train_step(model, opt, batches[size_t(it)].first, batches[size_t(it)].second, clip);
        REQUIRE(step.stepped);
        REQUIRE(step.grad_norm > r.clip);  // each step clips
    }
}

// 3 steps on data parallel (stage 0), ZeRO-2 (stage 2, buckets of bucket_bytes) or ZeRO-3 (stage
// 3, the blocks as units); the parameters after them.
std::vector<float> train_gpt(const GPTConfig& c, int stage, int64_t bucket_bytes = 64 << 10) {
    auto model = make_gpt(c, 1);
    const GPTRecipe r;
    std::unique_ptr<DataParallel> dp;
    std::unique_ptr<Optimizer> opt;
    if (stage == 0) {
        dp = std::make_unique<DataParallel>(*model, world());
        opt = gpt_optimizer(*model, r);
    } else if (stage == 3) {
        auto zero = gpt_zero_optimizer(*model, r, 3, world());
        train_steps(*model, *zero, 0, 3);
        return floats_of(static_cast<Zero3Optimizer&>(*zero).gathered_values());
    } else {
        opt = std::make_unique<Zero2Optimizer>(*model, decay_groups(*model, r.lr, r.weight_decay), world(), gpt_adamw,
                                               gpt_zero2_options(*model, bucket_bytes));
    }
    train_steps(*model, *opt, 0, 3);
    return floats_of(model->values_view());
}

}  // namespace

TEST_CASE("ZeRO-2 and ZeRO-3 train chapter 14's GPT to data parallel's parameters, bit for bit",
          "[lesson15][cpu][mpi][zero][zero2][zero3]") {
    for (bool recompute : {false, true}) {
        DYNAMIC_SECTION((recompute ? "blocks recomputed" : "activations kept")) {
            GPTConfig c = baby_gpt_config(83);
            c.n_layer = 2, c.recompute = recompute;
            const std::vector<float> plain = train_gpt(c, 0);
            REQUIRE(train_gpt(c, 2) == plain);
            REQUIRE(train_gpt(c, 2, 25 << 20) == plain);  // one bucket: the whole slab at the end
            REQUIRE(train_gpt(c, 3) == plain);
        }
    }
}

// The parameters a ZeRO optimizer's model holds: the slab (stages 1, 2), or gathered (stage 3).
std::vector<float> values_under(ZeroOptimizer& zero, GPT& model, int stage) {
    return floats_of(stage == 3 ? static_cast<Zero3Optimizer&>(zero).gathered_values() : model.values_view());
}

// Each rank writes its own shard (its piece of the parameters and of AdamW's moments); a new run
// of the same world reads its rank's file and takes the straight run's next steps, bit for bit.
TEST_CASE("ZeRO-1, 2 and 3 resume from each rank's shard exactly", "[lesson15][cpu][mpi][zero][zero3][checkpoint]") {
    const GPTRecipe r;
    GPTConfig c = baby_gpt_config(83);
    c.n_layer = 2;
    const std::string file = "/tmp/kiln-zero-shard-" + std::to_string(world().gather_all(int64_t(getpid()))[0]) +
                             "-rank" + std::to_string(world().rank()) + ".safetensors";
    for (int stage : {1, 2, 3}) {
        DYNAMIC_SECTION("ZeRO-" << stage) {
            auto model = make_gpt(c, 1);
            auto zero = gpt_zero_optimizer(*model, r, stage, world());
            train_steps(*model, *zero, 0, 3);
            StateDict shard;
            zero->save_shard(shard, "optimizer");
            write_safetensors(file, shard);
            train_steps(*model, *zero, 3, 3);
            const std::vector<float> straight = values_under(*zero, *model, stage);

            auto again = make_gpt(c, 99);  // other initial values: everything comes from the shard
            auto resumed = gpt_zero_optimizer(*again, r, stage, world());
            resumed->load_shard(read_safetensors(file), "optimizer");
            std::filesystem::remove(file);
            REQUIRE(resumed->steps() == 3);
            train_steps(*again, *resumed, 3, 3);
            REQUIRE(values_under(*resumed, *again, stage) == straight);

            StateDict other = shard;  // another rank's file is refused by name
            other.set("optimizer.shard.rank", int64_t(1 - world().rank()));
            REQUIRE_THROWS_WITH(resumed->load_shard(other, "optimizer"), Catch::Contains("each rank reads its own file"));
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
    Zero2Optimizer zero(*model, decay_groups(*model, r.lr, r.weight_decay), world(), gpt_adamw, o);
    auto [x, y] = token_batches(model->config, 2, 1).front();
    CHECK_THROWS_WITH(train_step(*model, zero, x, y, {}), Catch::Contains("undefined tensor"));
}
