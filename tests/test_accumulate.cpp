// test_accumulate.cpp — gradient accumulation (train_step's StepOptions::accumulate, the
// trainers' --accumulate): K micro-batches and one optimizer step give one batch's update,
// except with batch norm; a K that does not fit the batch is refused.
//
// Run: make build/tests/kiln_tests && build/tests/kiln_tests '[accumulate]'
#include <algorithm>
#include <cmath>
#include <memory>

#include <catch2/catch.hpp>

#include "nn/models.h"
#include "optim/adam.h"
#include "optim/optimizer.h"
#include "train/cli.h"
#include "train/loop.h"

using namespace kiln;
using Catch::Matchers::Contains;

namespace {

// B random CIFAR-shaped images and labels (seed 7).
struct Batch16 {
    explicit Batch16(int64_t B) : x(Tensor::normal({B, 3, 32, 32}, 0, 1, rng)), y(Tensor::empty({B}, DType::I32)) {
        for (int64_t i = 0; i < B; i++) y.data<int32_t>()[i] = int32_t(rng.next_below(10));
    }
    Rng rng{7};
    Tensor x, y;
};

// A small CIFAR net (widths 8/16/16), seed 3: every call builds the same one.
std::unique_ptr<Sequential> small_net(bool batch_norm) {
    Rng rng(3);
    return cifar_net(rng, {8, 16, 16}, batch_norm);
}

std::unique_ptr<Optimizer> make_optimizer(const std::string& kind, Module& m) {
    if (kind == "sgd") return std::make_unique<SGD>(m.parameters(), 0.05f,
                                                    SGD::Options{}.with_momentum(0.9f).with_nesterov());
    return std::make_unique<Adam>(m.parameters(), 1e-3f);
}

// Two optimizer steps of `kind` on the batch, each as `K` micro-batches; the arena's high water
// (the most one micro-batch used) in *arena_bytes.
std::unique_ptr<Sequential> trained(bool batch_norm, const std::string& kind, const Batch16& b, int K,
                                    StepResult* last, size_t* arena_bytes = nullptr) {
    auto m = small_net(batch_norm);
    auto opt = make_optimizer(kind, *m);
    BumpAllocator arena("test arena", Device::CPU, size_t(64) << 20);
    for (int step = 0; step < 2; step++) *last = train_step(*m, *opt, b.x, b.y, StepOptions{&arena, 0.0f, K});
    if (arena_bytes) *arena_bytes = arena.high_water();
    return m;
}

// max |a − b| over every parameter of two models of the same layout.
float max_param_difference(Module& a, Module& b) {
    std::vector<Parameter*> pa = a.parameters(), pb = b.parameters();
    REQUIRE(pa.size() == pb.size());
    float worst = 0.0f;
    for (size_t i = 0; i < pa.size(); i++) {
        const float* u = pa[i]->value.data<float>();
        const float* v = pb[i]->value.data<float>();
        for (int64_t j = 0; j < pa[i]->value.numel(); j++) worst = std::max(worst, std::fabs(u[j] - v[j]));
    }
    return worst;
}

}  // namespace

// The tolerance. The micro-batches' gradients add up to the whole batch's in exact arithmetic;
// in floats the sums over the batch are taken in another order (K partial sums, each scaled by
// n_i/B, instead of one), which moves each gradient by a few ulps of its largest terms,
// ~1e-7 relative. SGD turns that into a parameter difference of lr · 1e-7 · |g| — far below
// 1e-6. Adam divides by √v: its first steps are lr · g/|g| per element, so an element whose
// gradient is nearly zero (where rounding is a large fraction of it) can move by up to a
// sizable share of lr = 1e-3. Measured after two steps: SGD 7e-9, Adam 1.1e-6. 2e-5 (2% of
// lr) bounds both with room for other builds' summation orders, and is ~10000× smaller than
// the difference batch norm makes (0.23, below).
constexpr float kTolerance = 2e-5f;

TEST_CASE("accumulate: K micro-batches give one batch's update without batch norm", "[accumulate][cpu][lesson08]") {
    const std::string kind = GENERATE(as<std::string>{}, "sgd", "adam");
    // 16 = 4 micro-batches of 4; 10 = micro-batches of 3, 3, 2, 2 (each weighted by n_i / B).
    const int64_t B = GENERATE(16, 10);
    INFO(kind << ", batch " << B);
    Batch16 b(B);
    StepResult whole, parts;
    size_t whole_bytes = 0, part_bytes = 0;
    auto one = trained(false, kind, b, 1, &whole, &whole_bytes);
    auto four = trained(false, kind, b, 4, &parts, &part_bytes);
    REQUIRE(parts.stepped);
    CHECK(max_param_difference(*one, *four) <= kTolerance);
    CHECK(parts.loss == Approx(whole.loss).epsilon(1e-5));  // the whole batch's mean loss
    CHECK(parts.correct == whole.correct);
    // One micro-batch's activations at a time: the arena's high water falls with K.
    CHECK(part_bytes < whole_bytes / 2);
}

// Batch norm normalizes each micro-batch with its own mean and variance, so each image's
// output depends on which other images share its micro-batch: 4 micro-batches of 4 compute a
// different function from one batch of 16, and their gradients differ by far more than
// rounding (and the running statistics are updated 4 times per step, not once).
TEST_CASE("accumulate: with batch norm the update differs", "[accumulate][cpu][lesson08]") {
    Batch16 b(16);
    StepResult whole, parts;
    auto one = trained(true, "sgd", b, 1, &whole);
    auto four = trained(true, "sgd", b, 4, &parts);
    CHECK(max_param_difference(*one, *four) > 100 * kTolerance);
}

TEST_CASE("accumulate: a K that does not fit the batch is refused", "[accumulate][cpu][lesson08]") {
    CommonFlags f;  // --batch-size 64
    f.accumulate = 3;
    REQUIRE_THROWS_WITH(f.apply(), Contains("--accumulate 3") && Contains("--batch-size 64"));
    f.accumulate = 0;
    REQUIRE_THROWS_WITH(f.apply(), Contains("--accumulate 0"));
    f.accumulate = 4;
    REQUIRE_NOTHROW(f.apply());

    Batch16 b(4);
    auto m = small_net(false);
    SGD sgd(m->parameters(), 0.1f);
    REQUIRE_THROWS_WITH(train_step(*m, sgd, b.x, b.y, StepOptions{nullptr, 0.0f, 5}),
                        Contains("5 micro-batches") && Contains("batch of 4"));
    REQUIRE_THROWS_WITH(train_step(*m, sgd, b.x, b.y, StepOptions{nullptr, 0.0f, 0}), Contains("0 micro-batches"));
}
