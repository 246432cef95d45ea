// test_memory_plan.cpp — chapter 15's planner arithmetic (train/memory_plan.h): small cases worked
// out by hand, the ZeRO paper's Figure 1 (7.5B parameters, 64 GPUs) to its printed precision,
// Korthikanti et al.'s activation formula for one GPT-3 175B layer, GPT-2 small's parameter
// count, and the errors for bad options.
#include <catch2/catch.hpp>
#include <cmath>

#include "train/memory_plan.h"

using namespace kiln;

namespace {

MemoryPlanOptions states(int64_t psi, DType precision, OptimizerKind optimizer, int stage, int64_t gpus) {
    MemoryPlanOptions o;
    o.parameters = psi;
    o.precision = precision;
    o.optimizer = optimizer;
    o.zero_stage = stage;
    o.gpus = gpus;
    return o;
}

// Bytes in the paper's GB (10^9 bytes), rounded to its one decimal, in tenths: 31.4 GB -> 314.
int64_t tenths_of_gb(int64_t bytes) { return std::llround(double(bytes) / 1e8); }

// GPT-3 175B's layer (Brown et al., 2020): width 12288, 96 heads, at sequence 2048.
TransformerShape gpt3_layer() { return {1, 12288, 96, 50257, 2048}; }

}  // namespace

TEST_CASE("memory plan: f32 SGD with momentum holds 4 bytes each of parameters, gradients and momentum",
          "[memplan][cpu][lesson15]") {
    MemoryPlan p = plan_memory(states(1000, DType::F32, OptimizerKind::SGDMomentum, 0, 1));
    CHECK(p.parameters == 4000);
    CHECK(p.gradients == 4000);
    CHECK(p.optimizer_state == 4000);
    CHECK(p.activations == 0);
    CHECK(p.total() == 12000);
    // f32 Adam: two moments, 8 bytes a parameter of state; plain SGD none.
    CHECK(plan_memory(states(1000, DType::F32, OptimizerKind::Adam, 0, 1)).optimizer_state == 8000);
    CHECK(plan_memory(states(1000, DType::F32, OptimizerKind::SGD, 0, 1)).optimizer_state == 0);
}

TEST_CASE("memory plan: each ZeRO stage shards one more category across the GPUs", "[memplan][cpu][lesson15]") {
    const auto sgd = [](int stage, int64_t psi) {
        return plan_memory(states(psi, DType::F32, OptimizerKind::SGDMomentum, stage, 2));
    };
    MemoryPlan s0 = sgd(0, 1000), s1 = sgd(1, 1000), s2 = sgd(2, 1000), s3 = sgd(3, 1000);
    CHECK((s0.parameters == 4000 && s0.gradients == 4000 && s0.optimizer_state == 4000));
    CHECK((s1.parameters == 4000 && s1.gradients == 4000 && s1.optimizer_state == 2000));
    CHECK((s2.parameters == 4000 && s2.gradients == 2000 && s2.optimizer_state == 2000));
    CHECK((s3.parameters == 2000 && s3.gradients == 2000 && s3.optimizer_state == 2000));
    // An odd count: each GPU holds ceil(1001/2) = 501 elements of a sharded category.
    MemoryPlan odd = sgd(3, 1001);
    CHECK((odd.parameters == 2004 && odd.gradients == 2004 && odd.optimizer_state == 2004));
}

TEST_CASE("memory plan: mixed-precision Adam takes 16 bytes a parameter (2 + 2 + K, K = 12)",
          "[memplan][cpu][lesson15]") {
    for (DType half : {DType::BF16, DType::F16}) {
        MemoryPlan p = plan_memory(states(1000, half, OptimizerKind::Adam, 0, 1));
        CHECK(p.parameters == 2000);
        CHECK(p.gradients == 2000);
        CHECK(p.optimizer_state == 12000);  // f32 master weights, momentum, variance
        CHECK(p.total() == 16000);
    }
    // Mixed SGD with momentum: K = 8 (master weights and momentum).
    CHECK(plan_memory(states(1000, DType::BF16, OptimizerKind::SGDMomentum, 0, 1)).optimizer_state == 8000);
}

TEST_CASE("memory plan: the ZeRO paper's Figure 1, 7.5B parameters on 64 GPUs", "[memplan][cpu][lesson15]") {
    // Rajbhandari et al., 2020, Figure 1: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB per GPU.
    const int64_t psi = 7'500'000'000;
    const auto per_gpu = [&](int stage) {
        return plan_memory(states(psi, DType::F16, OptimizerKind::Adam, stage, 64)).total();
    };
    CHECK(per_gpu(0) == 120'000'000'000);  // (2 + 2 + 12)Ψ
    CHECK(tenths_of_gb(per_gpu(1)) == 314);  // (2 + 2 + 12/64)Ψ = 31.40625 GB
    CHECK(tenths_of_gb(per_gpu(2)) == 166);  // (2 + 14/64)Ψ     = 16.640625 GB
    CHECK(tenths_of_gb(per_gpu(3)) == 19);   // 16Ψ/64           = 1.875 GB
    CHECK(per_gpu(1) == 31'406'250'000);
    CHECK(per_gpu(2) == 16'640'625'000);
    CHECK(per_gpu(3) == 1'875'000'000);
}

TEST_CASE("memory plan: one GPT-3 175B layer's activations at sequence 2048 (Korthikanti et al., 2022)",
          "[memplan][cpu][lesson15]") {
    // By hand: s·b·h = 2048·1·12288 = 25,165,824; 5·a·s/h = 5·96·2048/12288 = 80.
    //   none       25,165,824 · (34 + 80) = 2,868,903,936 bytes (2.87 GB)
    //   selective  25,165,824 · 34        =   855,638,016 bytes
    //   full       25,165,824 · 2         =    50,331,648 bytes
    const TransformerShape t = gpt3_layer();
    CHECK(layer_activation_bytes(t, 1, DType::BF16, Recompute::None) == 2'868'903'936);
    CHECK(layer_activation_bytes(t, 1, DType::BF16, Recompute::Selective) == 855'638'016);
    CHECK(layer_activation_bytes(t, 1, DType::BF16, Recompute::Full) == 50'331'648);
    // Linear in the micro-batch; f32 activations: sbh·(16·4 + 2) + a·s²·b·(2·4 + 1).
    CHECK(layer_activation_bytes(t, 4, DType::BF16, Recompute::None) == 4 * 2'868'903'936LL);
    CHECK(layer_activation_bytes(t, 1, DType::F32, Recompute::None) == 25'165'824LL * 66 + 402'653'184LL * 9);

    // The plan counts L layers of them, whatever the ZeRO stage (each GPU runs its own micro-batch).
    MemoryPlanOptions o = states(1000, DType::BF16, OptimizerKind::Adam, 3, 8);
    o.shape = {96, 12288, 96, 50257, 2048};
    o.recompute = Recompute::Selective;
    CHECK(plan_memory(o).activations == 96 * 855'638'016LL);
}

TEST_CASE("memory plan: GPT-2 small's parameter count from its shape", "[memplan][cpu][lesson15]") {
    // L 12, h 768, V 50257, s 1024: 12·(12·768² + 13·768) + 50257·768 + 1024·768 + 2·768.
    const TransformerShape gpt2 = {12, 768, 12, 50257, 1024};
    CHECK(transformer_parameters(gpt2) == 124'439'808);
    MemoryPlanOptions o;
    o.shape = gpt2;
    o.optimizer = OptimizerKind::Adam;  // f32 Adam: 16 bytes a parameter of model states
    CHECK(plan_memory(o).model_states() == 16 * 124'439'808LL);
}

TEST_CASE("memory plan: bad options are refused, naming the value", "[memplan][cpu][lesson15]") {
    MemoryPlanOptions o = states(1000, DType::BF16, OptimizerKind::Adam, 1, 0);
    CHECK_THROWS_WITH(plan_memory(o), Catch::Contains("GPUs must be at least 1, not 0"));
    o.gpus = 4;
    o.zero_stage = 4;
    CHECK_THROWS_WITH(plan_memory(o), Catch::Contains("ZeRO stage must be 0, 1, 2 or 3, not 4"));
    o.zero_stage = -1;
    CHECK_THROWS_WITH(plan_memory(o), Catch::Contains("not -1"));
    o.zero_stage = 0;
    o.shape = {12, 768, 10, 50257, 1024};
    CHECK_THROWS_WITH(plan_memory(o), Catch::Contains("10 heads do not divide the width 768"));
    o.shape = {};
    o.precision = DType::I8;
    CHECK_THROWS_WITH(plan_memory(o), Catch::Contains("not i8"));
    o.precision = DType::F32;
    o.parameters = 0;
    CHECK_THROWS_WITH(plan_memory(o), Catch::Contains("parameter count or a transformer shape"));
}
