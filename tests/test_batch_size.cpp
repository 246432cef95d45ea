// test_batch_size.cpp — --find-batch-size: the largest batch that fits, found with real steps,
// leaving the model as it was.
#include <catch2/catch.hpp>

#include "core/allocator.h"
#include "fixtures.h"
#include "nn/models.h"
#include "ops/ops.h"
#include "optim/optimizer.h"
#include "train/batch_size.h"

using namespace kiln;
using kiln::test::require_identical;

// A small CIFAR net (batch norm: running statistics the probes must put back) under a limit of
// what the model takes plus 8 MiB.
TEST_CASE("find_batch_size: the largest batch fits, one more does not, the model is unchanged", "[batchsize][memory][cpu][lesson08]") {
    Rng rng(1);
    std::unique_ptr<Sequential> model = cifar_net(rng, {8, 16, 16}, true);
    std::vector<Tensor> before;
    for (auto& [name, p] : model->named_parameters()) before.push_back(p->value.clone());
    for (auto& [name, t] : model->named_buffers()) before.push_back(t->clone());

    pool_allocator(Device::CPU).empty_cache();
    set_memory_limit(Device::CPU, device_memory_stats(Device::CPU).reserved + (8 << 20));
    const BatchSearch s = find_batch_size(*model, {3, 32, 32}, Device::CPU, 4096);
    set_memory_limit(Device::CPU, 0);

    INFO(describe(s, 0));
    REQUIRE(s.largest > 1);
    REQUIRE(s.largest < 4096);
    bool next_failed = false;
    for (const BatchProbe& p : s.probes) {
        if (p.batch == s.largest + 1) next_failed = !p.fits;
        if (p.fits) REQUIRE(p.batch <= s.largest);
        if (!p.fits) REQUIRE(p.batch > s.largest);
    }
    REQUIRE(next_failed);  // the bisection ended between two neighbours
    REQUIRE(s.peak > 0);
    // doubling then bisecting: about 2·log2(largest) probes, not one per batch size
    REQUIRE(s.probes.size() <= 2 * 13);

    size_t i = 0;
    for (auto& [name, p] : model->named_parameters()) {
        INFO(name);
        require_identical(p->value, before[i++]);
        REQUIRE(sum_squares(p->grad) == 0.0);
    }
    for (auto& [name, t] : model->named_buffers()) {
        INFO(name);
        require_identical(*t, before[i++]);
    }
    REQUIRE_THAT(describe(s, 8 << 20), Catch::Contains("largest batch: " + std::to_string(s.largest)) &&
                                            Catch::Contains("--mem-limit 8.0MiB"));
}

// Issue 46, item 4: the search runs the step the trainer runs. Chapter 08's trainer recomputes
// (no arena: an arena would keep every recomputed block's activations) and accumulates 4
// micro-batches; its first step makes SGD's momentum. A probe that ignores any of these answers
// for another step.
TEST_CASE("find_batch_size probes the trainer's step: micro-batches, arena or none, the optimizer's state",
          "[batchsize][memory][cpu][lesson08]") {
    Rng rng(1);
    std::unique_ptr<Sequential> model = cifar_net(rng, {8, 16, 16}, true, /*recompute=*/true);
    SGD sgd(model->parameters(), 0.1f, SGD::Options{}.with_momentum(0.9f).with_nesterov());
    pool_allocator(Device::CPU).empty_cache();
    set_memory_limit(Device::CPU, device_memory_stats(Device::CPU).reserved + (8 << 20));
    const auto largest = [&](BatchProbeOptions o) { return find_batch_size(*model, {3, 32, 32}, Device::CPU, 4096, o); };
    const BatchSearch pool = largest({false, 1, DType::F32, &sgd});
    const BatchSearch four = largest({false, 4, DType::F32, &sgd});
    const BatchSearch arena = largest({true, 1, DType::F32, &sgd});
    set_memory_limit(Device::CPU, 0);
    INFO(describe(pool, 0) << describe(four, 0, 4) << describe(arena, 0));
    REQUIRE(pool.largest > 1);
    // 4 micro-batches: about 4 times the batch in the same memory (the data batch aside)
    CHECK(four.largest % 4 == 0);
    CHECK(four.largest > 2 * pool.largest);
    for (const BatchProbe& p : four.probes) CHECK(p.batch % 4 == 0);
    CHECK_THAT(describe(four, 0, 4), Catch::Contains("largest batch: " + std::to_string(four.largest) + " (4 micro-batches of " +
                                                    std::to_string(four.largest / 4) + ")"));
    // recomputation frees what a block's recomputed forward made: the pool reuses it, an arena not
    CHECK(pool.largest > arena.largest);
    REQUIRE(sgd.steps() == 0);
}

TEST_CASE("find_batch_size counts the optimizer state the first step will make", "[batchsize][memory][cpu][lesson08]") {
    Rng rng(1);
    std::unique_ptr<Sequential> model = mlp(rng, 1024, 1024);  // 1.9 M parameters: 7.4 MiB of momentum
    SGD momentum(model->parameters(), 0.1f, SGD::Options{}.with_momentum(0.9f));
    pool_allocator(Device::CPU).empty_cache();
    set_memory_limit(Device::CPU, device_memory_stats(Device::CPU).reserved + (12 << 20));
    const BatchSearch with = find_batch_size(*model, {1, 28, 28}, Device::CPU, 4096, {true, 1, DType::F32, &momentum});
    const BatchSearch without = find_batch_size(*model, {1, 28, 28}, Device::CPU, 4096, {true, 1, DType::F32, nullptr});
    set_memory_limit(Device::CPU, 0);
    INFO(describe(with, 0) << describe(without, 0));
    CHECK(with.largest > 0);
    CHECK(with.largest < without.largest);
    CHECK(momentum.steps() == 0);
}
