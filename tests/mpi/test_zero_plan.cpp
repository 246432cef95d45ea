// test_zero_plan.cpp — chapter 15's planner (train/memory_plan.h) against what each rank measures
// on 2 ranks (mpirun -np 2): plain data parallel (stage 0, chapter 12's DataParallel), ZeRO-1
// (dist/zero.h), ZeRO-2 (dist/zero2.h) and ZeRO-3 (dist/zero3.h); and the figure of lesson 15 with
// those measured steps on the plan's lines.
//
// Run: make build/tests/kiln_mpi_tests && mpirun -np 2 build/tests/kiln_mpi_tests '[memplan]'
// (as root add --allow-run-as-root --oversubscribe; make test runs them all)
#include <algorithm>
#include <fstream>
#include <memory>

#include <catch2/catch.hpp>

#include "dist/data_parallel.h"
#include "dist/zero3.h"
#include "optim/adam.h"
#include "train/gpt_recipe.h"
#include "train/memory_plan.h"
#include "world.h"

using namespace kiln;

namespace {

// The recipe's AdamW on a data-parallel model: the optimizer owns the DataParallel, so that it
// goes, and takes its hooks off the model, before measure_gpt_step's model does.
struct DataParallelAdamW : Optimizer {
    DataParallelAdamW(GPT& model, const GPTRecipe& r)
        : Optimizer(decay_groups(model, r.lr, r.weight_decay)),
          dp(std::make_unique<DataParallel>(model, world())),
          inner(gpt_optimizer(model, r)) {}
    void step() override { inner->step(); }
    std::vector<Tensor> state_of(size_t i) const override { return inner->state_of(i); }
    std::unique_ptr<DataParallel> dp;
    std::unique_ptr<AdamW> inner;
};

std::unique_ptr<Optimizer> data_parallel(GPT& model, const GPTRecipe& r) {
    return std::make_unique<DataParallelAdamW>(model, r);
}

// ZeRO-1, 2 (buckets of 256 KiB) and 3 (the blocks as units) over the recipe's AdamW.
std::unique_ptr<Optimizer> zero1(GPT& model, const GPTRecipe& r) { return gpt_zero_optimizer(model, r, 1, world()); }
std::unique_ptr<Optimizer> zero2(GPT& model, const GPTRecipe& r) { return gpt_zero_optimizer(model, r, 2, world()); }
std::unique_ptr<Optimizer> zero3(GPT& model, const GPTRecipe& r) { return gpt_zero_optimizer(model, r, 3, world()); }

// Each rank's steady step of the baby GPT (batch 12): alone (stage 0 on 1 GPU), data parallel
// (stage 0 on world().size() GPUs), ZeRO-1 (stage 1), ZeRO-2 (stage 2) and ZeRO-3 (stage 3).
std::vector<MeasuredStage> measured_stages(const GPTConfig& c) {
    const int64_t B = 12, n = world().size();
    return {{1, 0, measure_gpt_step(c, B, c.block_size, Device::CPU)},
            {n, 0, measure_gpt_step(c, B, c.block_size, Device::CPU, data_parallel)},
            {n, 1, measure_gpt_step(c, B, c.block_size, Device::CPU, zero1)},
            {n, 2, measure_gpt_step(c, B, c.block_size, Device::CPU, zero2)},
            {n, 3, measure_gpt_step(c, B, c.block_size, Device::CPU, zero3)}};
}

}  // namespace

// Chapter 14's baby GPT, AdamW sharded by ZeRO-1 (each rank keeps the moments of its piece of the
// slab only), ZeRO-2 (and the gradients of its piece, plus the buckets in flight) and ZeRO-3 (and
// the parameters of its piece, plus one block's gathered weights and gradients). Each stage's plan
// on world().size() GPUs against each rank's measured steady step, within 3%; the plan with what
// the stage adds counted whole (the stage below's plan; for stage 3 its own plan with the whole
// parameters, as its gathered layers cost more than stage 2's buckets) is off by more than that,
// so the test sees each stage's sharding.
TEST_CASE("memory plan: ZeRO-1, 2 and 3 on 2 ranks, chapter 14's GPT, each rank's step planned and measured within 3%",
          "[memplan][zero][lesson15][cpu][mpi]") {
    for (AttentionKind kind : {AttentionKind::Textbook, AttentionKind::Flash}) {
        INFO("rank " << world().rank() << " " << attention_kind_name(kind));
        GPTConfig c = baby_gpt_config(83);
        c.attention = kind;
        for (const MeasuredStage& m : measured_stages(c)) {
            MemoryPlanOptions o = gpt_plan_options(c, 12);
            o.gpus = m.gpus, o.zero_stage = m.stage;
            const MemoryPlan plan = plan_memory(o);
            const int64_t planned = plan.total();
            o.zero_stage = std::max(0, m.stage - 1);
            const int64_t unsharded = m.stage == 3 ? planned - plan.parameters + 4 * transformer_parameters(o.shape)
                                                   : plan_memory(o).total();
            INFO("stage " << m.stage << " on " << m.gpus << ": planned " << planned << ", unsharded " << unsharded
                          << ", measured " << m.bytes);
            CHECK(double(planned) == Approx(double(m.bytes)).epsilon(0.03));
            if (m.stage > 0) CHECK(double(unsharded) > 1.03 * double(m.bytes));  // the test sees the sharding
        }
    }
}

// The figure's squares are the measured steps: one per step, on its stage's colour.
TEST_CASE("memory plan: stages_svg draws a line per stage and a square per measured step", "[memplan][lesson15][cpu][mpi]") {
    const GPTConfig c = baby_gpt_config(83);
    const std::string svg = stages_svg(gpt_plan_options(c, 12), 8, measured_stages(c), "baby GPT");
    size_t squares = 0, lines = 0;
    for (size_t at = svg.find("<rect"); at != std::string::npos; at = svg.find("<rect", at + 1)) squares++;
    for (size_t at = svg.find("<polyline"); at != std::string::npos; at = svg.find("<polyline", at + 1)) lines++;
    CHECK(lines == 1 + 4);        // the axes' frame, a line per stage
    CHECK(squares == 1 + 4 + 5);  // the background, the legend's 4 swatches, 5 measured steps
    CHECK_THROWS_WITH(stages_svg(gpt_plan_options(c, 12), 6, {}, ""), Catch::Contains("power of two"));
}

// Writes lessons/15-large-models/figures/baby_gpt_stages.svg (hidden: run it by its tag, from the
// repository's root, on 2 ranks):
//   mpirun -np 2 build/tests/kiln_mpi_tests '[baby-stages-figure]'
TEST_CASE("write lessons/15-large-models/figures/baby_gpt_stages.svg", "[.][figure][baby-stages-figure]") {
    const GPTConfig c = baby_gpt_config(83);
    const std::string svg = stages_svg(gpt_plan_options(c, 12), 8, measured_stages(c),
                                       "baby GPT (chapter 14), f32 AdamW, batch 12: planned lines, measured squares");
    if (world().rank() == 0) {
        std::ofstream out("lessons/15-large-models/figures/baby_gpt_stages.svg");
        REQUIRE(out);
        out << svg;
    }
}
