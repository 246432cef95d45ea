// test_memory_plan.cpp — chapter 15's planner arithmetic (train/memory_plan.h): small cases worked
// out by hand, the ZeRO paper's Figure 1 (7.5B parameters, 64 GPUs) to its printed precision,
// Korthikanti et al.'s activation formula for one GPT-3 175B layer, GPT-2 small's parameter
// count, and the errors for bad options.
#include <catch2/catch.hpp>
#include <cmath>

#include "train/gpt_recipe.h"
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
    CHECK(p.model_states() == 12000);
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
        CHECK(p.model_states() == 16000);
    }
    // Mixed SGD with momentum: K = 8 (master weights and momentum).
    CHECK(plan_memory(states(1000, DType::BF16, OptimizerKind::SGDMomentum, 0, 1)).optimizer_state == 8000);
}

TEST_CASE("memory plan: the ZeRO paper's Figure 1, 7.5B parameters on 64 GPUs", "[memplan][cpu][lesson15]") {
    // Rajbhandari et al., 2020, Figure 1: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB per GPU, the model
    // states alone (no allocator's rounding, no activations).
    const int64_t psi = 7'500'000'000;
    const auto per_gpu = [&](int stage) {
        return plan_memory(states(psi, DType::F16, OptimizerKind::Adam, stage, 64)).model_states();
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

    // The plan counts L layers of them, whatever the ZeRO stage (each GPU runs its own micro-batch),
    // and the embedding's and final norm's outputs (2·2·sbh) and the f32 logits (4·s·b·V).
    MemoryPlanOptions o = states(1000, DType::BF16, OptimizerKind::Adam, 3, 8);
    o.shape = {96, 12288, 96, 50257, 2048};
    o.recompute = Recompute::Selective;
    CHECK(plan_memory(o).activations == 96 * 855'638'016LL + 4 * 25'165'824LL + 4 * 2048LL * 50257);
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

// The published counts: GPT-2's four sizes as Hugging Face's transformers counts them
// (GPT2LMHeadModel.num_parameters(), the output layer tied: 124M, 355M, 774M, 1.5B), LLaMA's
// (Touvron et al., 2023, Table 2 rounds them to 6.7B and 13.0B; the released checkpoints hold
// these) and Llama 2 70B's (Touvron et al., 2023b, its released checkpoint).
TEST_CASE("memory plan: the named models' parameter counts are the published ones", "[memplan][cpu][lesson15]") {
    const std::vector<std::pair<const char*, int64_t>> published = {
        {"gpt2", 124'439'808},          {"gpt2-medium", 354'823'168},   {"gpt2-large", 774'030'080},
        {"gpt2-xl", 1'557'611'200},     {"llama-7b", 6'738'415'616},    {"llama-13b", 13'015'864'320},
        {"llama-2-70b", 68'976'648'192},
    };
    for (const auto& [name, count] : published) {
        INFO(name);
        CHECK(transformer_parameters(named_transformer(name)) == count);
    }
    // GPT-3 175B: 174.6 billion (Brown et al., 2020, Table 2.1 rounds it to 175.0B).
    CHECK(std::llround(double(transformer_parameters(named_transformer("gpt3-175b"))) / 1e8) == 1746);
    CHECK_THROWS_WITH(named_transformer("gpt5"), Catch::Contains("no model named 'gpt5'") && Catch::Contains("llama-7b"));
}

TEST_CASE("memory plan: temporary buffers, fragmentation, offload and the largest batch, worked by hand",
          "[memplan][cpu][lesson15]") {
    // A GPT-2-shaped model, L 1, h 8, a 2, V 10, s 4: Ψ = 12·64 + 13·8 + 80 + 32 + 16 = 1000.
    MemoryPlanOptions o;
    o.shape = {1, 8, 2, 10, 4};
    o.optimizer = OptimizerKind::Adam;
    o.dropout = false;
    REQUIRE(transformer_parameters(o.shape) == 1000);
    MemoryPlan p = plan_memory(o);
    // sbh = 32; layer 16·4·32 = 2048 plus P 4·a·s²·b = 128; head 2·4·32 + 4·4·10 = 416
    CHECK(p.activations == 2048 + 128 + 416);
    CHECK(p.temporary == 4 * 4 * 10 + 4 * 4 * 32);  // dL/dlogits, one gradient of width f = 32
    // four 4000-byte slabs (parameters, gradients, m, v), each rounded up to 4096
    CHECK(p.fragmentation == 4 * 96);
    o.fragmentation = 0.5;  // and half of everything else
    CHECK(plan_memory(o).fragmentation == 4 * 96 + (16000 + 2048 + 128 + 416 + 160 + 512) / 2);
    o.fragmentation = 0.0;
    // Offload: Adam's m and v to the host, nothing of them (nor their rounding) on the GPU; the
    // host also holds the f32 weights its update writes and the gradients copied down: 4 · 4000.
    o.offload = true;
    MemoryPlan off = plan_memory(o);
    CHECK((off.optimizer_state == 0 && off.host == 16000 && off.fragmentation == 2 * 96));
    o.precision = DType::BF16;  // mixed: masters, m, v in f32 and the gradients in 16 bits, 14 bytes each
    CHECK(plan_memory(o).host == 14000);
    o.precision = DType::F32;
    o.offload = false;
    // Full recomputation keeps each layer's input, e·sbh = 128, and makes one layer again in
    // backward, all but its output (the next layer's input, kept).
    o.recompute = Recompute::Full;
    MemoryPlan full = plan_memory(o);
    CHECK(full.activations == 128 + 416);
    CHECK(full.temporary == p.temporary + 2048 + 128 - 128);
    o.recompute = Recompute::None;
    // Stage 3 on 2 GPUs gathers two layers' parameters and one layer's gradients: 3·4·layer.
    o.zero_stage = 3, o.gpus = 2;
    CHECK(plan_memory(o).temporary == p.temporary + 3 * 4 * layer_parameters(o.shape));
    o.zero_stage = 0, o.gpus = 1;
    // The largest batch: each sequence adds activations and temporaries linearly.
    const int64_t one = plan_memory(o).total();
    o.batch = 2;
    const int64_t per_sequence = plan_memory(o).total() - one;
    CHECK(largest_batch(o, one - 1) == 0);
    CHECK(largest_batch(o, one) == 1);
    CHECK(largest_batch(o, one + 10 * per_sequence) == 11);
    CHECK(largest_batch(o, one + 10 * per_sequence - 1) == 10);
}

TEST_CASE("memory plan: a LLaMA layer's activations (SwiGLU, grouped-query attention)", "[memplan][cpu][lesson15]") {
    // h 8, a 4, 2 K/V heads (g = 4), f 12, s 4, b 1, bf16, flash, no dropout:
    //   kept 2·4·(6·8 + 2·4 + 3·12) = 736, lse 4·a·s·b = 64
    TransformerShape t{1, 8, 4, 10, 4, Architecture::LLaMA, 12, 2};
    CHECK(layer_activation_bytes(t, 1, DType::BF16, Recompute::None, AttentionKind::Flash, false) == 736 + 64);
    // its parameters: 2·64 + 2·8·4 + 3·8·12 + 16 = 496 a layer; 496 + 2·10·8 + 8 in all
    CHECK(layer_parameters(t) == 496);
    CHECK(transformer_parameters(t) == 664);
}

// Chapter 14's GPT, kiln's own layout (f32, no dropout): the plan's closed form — model states,
// L·(64·sbh + 4·a·s²·b) (flash: 4·a·s·b), the head, the temporaries, the slabs' rounding — against
// the allocators' peaks of a real steady step (measure_gpt_step), at two sizes, both attentions,
// with and without recomputation: within 3% (the target).
TEST_CASE("memory plan: chapter 14's GPT, planned and measured within 3%, two sizes, textbook and flash",
          "[memplan][gpt][lesson15][cpu]") {
    struct Size { int64_t layers, width, heads, context, batch; };
    for (const Size z : {Size{4, 128, 4, 64, 12}, Size{2, 192, 6, 128, 4}})  // the baby GPT, and a wider one
        for (AttentionKind kind : {AttentionKind::Textbook, AttentionKind::Flash})
            for (bool recompute : {false, true}) {
                INFO("L " << z.layers << " h " << z.width << " s " << z.context << " b " << z.batch << " "
                          << attention_kind_name(kind) << (recompute ? " recompute" : ""));
                GPTConfig c = baby_gpt_config(83);
                c.n_layer = z.layers, c.n_embd = z.width, c.n_head = z.heads, c.block_size = z.context;
                c.attention = kind, c.recompute = recompute;
                const MemoryPlan plan = plan_memory(gpt_plan_options(c, z.batch));
                const int64_t measured = measure_gpt_step(c, z.batch, z.context, Device::CPU);
                INFO("planned " << plan.total() << " measured " << measured);
                CHECK(double(plan.total()) == Approx(double(measured)).epsilon(0.03));
            }
    // The largest batch that fits: with a budget half-way between the measured steps of 12 and 13
    // windows, the plan's largest micro-batch is 12, as the measured steps say.
    const GPTConfig baby = baby_gpt_config(83);
    const int64_t at12 = measure_gpt_step(baby, 12, 64, Device::CPU), at13 = measure_gpt_step(baby, 13, 64, Device::CPU);
    REQUIRE(at13 > at12);
    CHECK(largest_batch(gpt_plan_options(baby, 1), at12 + (at13 - at12) / 2) == 12);
    GPTConfig dropping = baby_gpt_config(83);
    dropping.dropout = 0.1f;
    CHECK_THROWS_WITH(gpt_plan_options(dropping, 12), Catch::Contains("without dropout, not dropout 0.1"));
}

TEST_CASE("memory plan: each GPU's bytes of communication a step, and over PCIe with offload", "[memplan][cpu][lesson15]") {
    // Ψ = 1000 bf16 on 4 GPUs: shards of 250 elements, 500 bytes; a ring's 3 steps a collective.
    MemoryPlanOptions o = states(1000, DType::BF16, OptimizerKind::Adam, 0, 4);
    CHECK(communication_bytes(o) == 2 * 3 * 500);  // all-reduce = reduce-scatter + all-gather
    o.zero_stage = 1;
    CHECK(communication_bytes(o) == 2 * 3 * 500);
    o.zero_stage = 2;
    CHECK(communication_bytes(o) == 2 * 3 * 500);
    o.zero_stage = 3;
    CHECK(communication_bytes(o) == 3 * 3 * 500);  // 1.5× plain data parallel
    o.gpus = 1;
    CHECK(communication_bytes(o) == 0);
    // Offload: the gradients down and the parameters up, 2 bytes each; a shard of them from stage 1.
    CHECK(offload_bytes_each_way(o) == 0);
    o.offload = true, o.gpus = 4, o.zero_stage = 0;
    CHECK(offload_bytes_each_way(o) == 2000);
    o.zero_stage = 2;
    CHECK(offload_bytes_each_way(o) == 500);
}
