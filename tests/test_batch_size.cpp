// test_batch_size.cpp — --find-batch-size: the largest batch that fits, found with real steps,
// leaving the model as it was.
#include <catch2/catch.hpp>

#include "core/allocator.h"
#include "fixtures.h"
#include "nn/models.h"
#include "ops/ops.h"
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
