// test_memory_model.cpp — chapter 08's memory prediction (train/memory_model.h) against the
// allocators' own statistics during a real train_step: a tiny model worked out by hand to the
// byte, then the chapters' models (LeNet, the MLP, the CIFAR net with and without batch norm)
// within 2%, on the CPU and on the CUDA device (a GPU, or the kernel emulator playing GPUs of
// several SM counts).
#include <catch2/catch.hpp>
#include <functional>
#include <memory>
#include <optional>

#include "nn/conv.h"
#include "nn/layers.h"
#include "nn/misc.h"
#include "nn/norm.h"
#include "nn/pool.h"
#include "nn/models.h"
#include "nn/recompute.h"
#include "optim/adam.h"
#include "optim/optimizer.h"
#include "train/loop.h"
#include "train/memory_model.h"
#include "kiln_cuda.h"  // kiln::emu::ScopedMultiprocessors on the emulator

using namespace kiln;

namespace {

// What the allocators counted during one steady train_step.
struct Measured {
    int64_t peak = 0;       // the allocators' peaks added up, as device_memory_stats reports them
    int64_t pool_peak = 0;  // the pool's own (with no arena: the step's true peak)
    int64_t arena_peak = 0;
};

// Builds the model (`build` gets a fresh Rng), then: an empty pool cache, one warm-up step (it
// creates the optimizer's state), the peaks reset, one measured step — as the model predicts.
// Tensors other tests keep alive in the pool are subtracted: they were in use before the model.
Measured measure_step(const std::function<std::unique_ptr<Module>(Rng&)>& build,
                      const std::function<std::unique_ptr<Optimizer>(Module&)>& make_optimizer, const Shape& input,
                      Device device, bool use_arena) {
    PoolAllocator& pool = pool_allocator(device);
    pool.empty_cache();
    const int64_t before = pool.stats().allocated;
    Rng rng(1);
    std::unique_ptr<Module> model = build(rng);
    model->to(device);
    std::unique_ptr<Optimizer> optimizer = make_optimizer(*model);
    Tensor x = Tensor::uniform(input, -1.0f, 1.0f, rng, Device::CPU, Category::Data).to(device);
    Tensor y = Tensor::zeros({input[0]}, DType::I32, Device::CPU, Category::Data).to(device);
    std::optional<BumpAllocator> arena;
    if (use_arena) arena.emplace("test arena", device, size_t(1) << 30);
    pool.empty_cache();
    const StepOptions step{arena ? &*arena : nullptr, 0.0f};
    REQUIRE(train_step(*model, *optimizer, x, y, step).stepped);
    pool.reset_peak();
    if (arena) arena->reset_peak();
    REQUIRE(train_step(*model, *optimizer, x, y, step).stepped);
    Measured m;
    m.pool_peak = pool.stats().peak_allocated - before;
    m.arena_peak = arena ? arena->stats().peak_allocated : 0;
    m.peak = device_memory_stats(device).peak_allocated - before;
    return m;
}

std::unique_ptr<Optimizer> sgd_momentum(Module& m) {
    return std::make_unique<SGD>(m.parameters(), 0.01f,
                                 SGD::Options{}.with_momentum(0.9f).with_weight_decay(5e-4f).with_nesterov());
}

std::unique_ptr<Optimizer> adam(Module& m) { return std::make_unique<Adam>(m.parameters(), 1e-3f); }

// Predicted and measured, each allocator's peak and their sum, within 2% (and the true peak
// without an arena, when the pool is the only allocator).
void require_agreement(const std::function<std::unique_ptr<Module>(Rng&)>& build, OptimizerKind kind,
                       const Shape& input, Device device, bool use_arena) {
    Rng rng(1);
    std::unique_ptr<Module> model = build(rng);
    const auto make_optimizer = kind == OptimizerKind::Adam ? adam : sgd_momentum;
    REQUIRE(optimizer_kind(*make_optimizer(*model)) == kind);
    const MemoryPrediction p = predict_memory(*model, {input, kind, device, use_arena});
    const Measured m = measure_step(build, make_optimizer, input, device, use_arena);
    INFO(memory_prediction_table(p));
    INFO("measured: pool " << m.pool_peak << " + arena " << m.arena_peak << " = " << m.peak);
    CHECK(double(p.allocator_peaks()) == Approx(double(m.peak)).epsilon(0.02));
    CHECK(double(p.pool_peak) == Approx(double(m.pool_peak)).epsilon(0.02));
    CHECK(double(p.arena_peak) == Approx(double(m.arena_peak)).epsilon(0.02));
    if (!use_arena) CHECK(double(p.peak) == Approx(double(m.peak)).epsilon(0.02));
}

std::unique_ptr<Module> tiny(Rng& rng) {
    auto m = std::make_unique<Sequential>("tiny");
    m->add("fc1", std::make_unique<Linear>(4, 3, rng));
    m->emplace<ReLU>();
    m->add("fc2", std::make_unique<Linear>(3, 2, rng));
    m->pack();
    return m;
}

// Every other layer kind, and a Residual: x [8, 3, 8, 8] -> conv 3→4 -> BN -> avg-pool 2 ->
// dropout -> GELU -> x + (conv 4→4 -> ReLU)(x) -> global avg-pool [8, 4] -> LayerNorm -> Linear 4→3.
std::unique_ptr<Module> every_layer(Rng& rng) {
    auto m = std::make_unique<Sequential>("every-layer");
    const ConvOptions same{1, 1, 1, 1, true};
    m->add("conv", std::make_unique<Conv2d>(3, 4, 3, rng, same));
    m->add("bn", std::make_unique<BatchNorm2d>(4));
    m->add("avgpool", std::make_unique<AvgPool2d>(2));
    m->add("dropout", std::make_unique<Dropout>(0.5f, 7));
    m->add("gelu", std::make_unique<GELU>());
    auto body = std::make_unique<Sequential>("body");
    body->add("conv", std::make_unique<Conv2d>(4, 4, 3, rng, same));
    body->emplace<ReLU>();
    m->add("residual", std::make_unique<Residual>(std::move(body)));
    m->add("gap", std::make_unique<GlobalAvgPool>());
    m->add("ln", std::make_unique<LayerNorm>(4));
    m->add("fc", std::make_unique<Linear>(4, 3, rng));
    m->pack();
    return m;
}

// every_layer's first five layers and its Residual, each in a Checkpoint: x [8, 3, 8, 8] ->
// Checkpoint(conv -> BN -> avg-pool -> dropout -> GELU) -> Checkpoint(Residual) -> gap -> fc.
std::unique_ptr<Module> checkpointed(Rng& rng) {
    const ConvOptions same{1, 1, 1, 1, true};
    auto block = std::make_unique<Sequential>("block");
    block->add("conv", std::make_unique<Conv2d>(3, 4, 3, rng, same));
    block->add("bn", std::make_unique<BatchNorm2d>(4));
    block->add("avgpool", std::make_unique<AvgPool2d>(2));
    block->add("dropout", std::make_unique<Dropout>(0.5f, 7));
    block->add("gelu", std::make_unique<GELU>());
    auto body = std::make_unique<Sequential>("body");
    body->add("conv", std::make_unique<Conv2d>(4, 4, 3, rng, same));
    body->add("relu", std::make_unique<ReLU>(ReLU::InPlace));
    auto m = std::make_unique<Sequential>("checkpointed");
    m->add("block", std::make_unique<Checkpoint>(std::move(block)));
    m->add("residual", std::make_unique<Checkpoint>(std::make_unique<Residual>(std::move(body))));
    m->add("gap", std::make_unique<GlobalAvgPool>());
    m->add("fc", std::make_unique<Linear>(4, 3, rng));
    m->pack();
    return m;
}

std::function<std::unique_ptr<Module>(Rng&)> cifar(bool batch_norm, bool recompute = false) {
    return [batch_norm, recompute](Rng& rng) -> std::unique_ptr<Module> {
        return cifar_net(rng, {32, 64, 128}, batch_norm, recompute);
    };
}

std::unique_ptr<Module> lenet_model(Rng& rng) { return lenet(rng); }
std::unique_ptr<Module> mlp_model(Rng& rng) { return mlp(rng, 512, 256); }

}  // namespace

TEST_CASE("memory model: a tiny MLP, every byte worked out by hand", "[memmodel][cpu][lesson08]") {
    // x [2, 4] -> fc1 (4→3) -> ReLU -> fc2 (3→2), SGD with momentum, activations in an arena.
    Rng rng(1);
    auto model = tiny(rng);
    const MemoryPrediction p = predict_memory(*model, {Shape{2, 4}, OptimizerKind::SGDMomentum});
    INFO(memory_prediction_table(p));
    REQUIRE(p.modules.size() == 4);
    const PredictedModule &all = p.modules[0], &fc1 = p.modules[1], &relu = p.modules[2], &fc2 = p.modules[3];
    CHECK((fc1.name == "fc1" && relu.name == "1" && fc2.name == "fc2" && fc2.depth == 1));
    // parameters 4·(3·4 + 3) = 60 and 4·(2·3 + 2) = 32 bytes; as much gradient and momentum
    CHECK((fc1.parameters == 60 && fc1.gradients == 60 && fc1.optimizer_state == 60));
    CHECK((fc2.parameters == 32 && all.parameters == 92 && all.optimizer_state == 92));
    CHECK((fc1.output == Shape{2, 3} && fc2.output == Shape{2, 2} && all.output == Shape{2, 2}));
    // Kept after forward, each tensor one 256-byte arena block: fc1 keeps x (the data, not its
    // own) and its y is freed once ReLU has made its own y, which ReLU keeps (and fc2 as its x);
    // fc2's y is the logits.
    CHECK((fc1.activations == 0 && relu.activations == 256 && fc2.activations == 256 && all.activations == 512));
    // Resident: the parameter slab is fc1.weight at 0, fc1.bias at 256, fc2.weight at 512,
    // fc2.bias at 768 → 776 bytes, a 1024-byte pool block; gradients and momentum the same;
    // x (32 bytes) and the labels (8) a 512-byte block each: 3 · 1024 + 2 · 512 = 4096.
    CHECK(p.resident == 4096);
    // The arena during the step: fc1 y 256, ReLU y 512, fc1's y freed 256, fc2 y 512, dlogits 768,
    // the predictions 1024 then freed 768; backward: fc2's dx 1024, ReLU's dx 1280 — the peak,
    // in ReLU's backward — then ReLU's y, fc2's dx, ReLU's dx, dlogits and the logits go.
    CHECK(p.arena_peak == 1280);
    CHECK(p.pool_peak == 4096);
    CHECK(p.peak == 4096 + 1280);
    CHECK((p.peak_module == "1" && p.peak_phase == Phase::Backward));

    const Measured m = measure_step(tiny, sgd_momentum, Shape{2, 4}, Device::CPU, true);
    CHECK(m.arena_peak == 1280);
    CHECK(m.pool_peak == 4096);
}

TEST_CASE("memory model: every layer kind and a Residual, predicted and measured to the byte",
          "[memmodel][cpu][lesson08]") {
    for (bool use_arena : {true, false}) {
        INFO("arena: " << use_arena);
        Rng rng(1);
        auto model = every_layer(rng);
        const MemoryPrediction p = predict_memory(*model, {Shape{8, 3, 8, 8}, OptimizerKind::Adam, Device::CPU, use_arena});
        INFO(memory_prediction_table(p));
        const Measured m = measure_step(every_layer, adam, Shape{8, 3, 8, 8}, Device::CPU, use_arena);
        CHECK(p.pool_peak == m.pool_peak);
        CHECK(p.arena_peak == m.arena_peak);
        // the rows: the model, its nine children, the residual's body and the body's two layers
        REQUIRE(p.modules.size() == 13);
        CHECK((p.modules[6].name == "residual" && p.modules[6].output == Shape{8, 4, 4, 4}));
        CHECK((p.modules[8].name == "residual.body.conv" && p.modules[8].depth == 3));
        CHECK(p.modules[0].output == Shape{8, 3});
    }
}

// Chapter 08's exercise 1 checks its LayerNorm formula here: the layer norm keeps its input
// [64, 512] (fc1's output, 128 KiB) and each row's mean and 1/σ, alive at the step's peak (fc2's
// backward), so a memory() that forgot what it keeps moves the predicted peak, which the
// every-layer model's [8, 4] layer norm does not (its cache is gone by its step's peak).
static std::unique_ptr<Module> layernorm_mlp(Rng& rng) {
    auto m = std::make_unique<Sequential>("layernorm-mlp");
    m->add("fc1", std::make_unique<Linear>(256, 512, rng));
    m->add("ln", std::make_unique<LayerNorm>(512));
    m->add("fc2", std::make_unique<Linear>(512, 10, rng));
    m->pack();
    return m;
}

TEST_CASE("memory model: a layer norm's cache at the step's peak, predicted and measured to the byte",
          "[memmodel][layernorm][cpu][lesson08]") {
    for (bool use_arena : {true, false}) {
        INFO("arena: " << use_arena);
        Rng rng(1);
        auto model = layernorm_mlp(rng);
        const MemoryPrediction p = predict_memory(*model, {Shape{64, 256}, OptimizerKind::SGDMomentum, Device::CPU, use_arena});
        INFO(memory_prediction_table(p));
        const Measured m = measure_step(layernorm_mlp, sgd_momentum, Shape{64, 256}, Device::CPU, use_arena);
        CHECK(p.pool_peak == m.pool_peak);
        CHECK(p.arena_peak == m.arena_peak);
        // its own row: its output, which fc2 keeps, and each row's mean and 1/σ ([64] f32 each,
        // rounded as the allocator does); the input it keeps counts for fc1, which made it
        REQUIRE(p.modules[2].name == "ln");
        CHECK(p.modules[2].activations == 64 * 512 * 4 + 2 * (use_arena ? 256 : 512));
        REQUIRE(p.modules[1].name == "fc1");
        CHECK(p.modules[1].activations == 64 * 512 * 4);
    }
}

TEST_CASE("memory model: Checkpoint blocks (recomputation) predicted and measured to the byte",
          "[memmodel][cpu][lesson08]") {
    for (bool use_arena : {true, false}) {
        INFO("arena: " << use_arena);
        Rng rng(1);
        auto model = checkpointed(rng);
        const MemoryPrediction p = predict_memory(*model, {Shape{8, 3, 8, 8}, OptimizerKind::Adam, Device::CPU, use_arena});
        INFO(memory_prediction_table(p));
        const Measured m = measure_step(checkpointed, adam, Shape{8, 3, 8, 8}, Device::CPU, use_arena);
        CHECK(p.pool_peak == m.pool_peak);
        CHECK(p.arena_peak == m.arena_peak);
        // A Checkpoint keeps its input alone, and a kept tensor counts for the module that made
        // it: the block's output (GELU's, [8, 4, 4, 4] f32), kept by the residual's Checkpoint,
        // counts for the block; nothing inside the residual is kept (gap keeps no tensor).
        REQUIRE(p.modules[1].name == "block");
        CHECK(p.modules[1].activations == 8 * 4 * 4 * 4 * 4);
        REQUIRE(p.modules[8].name == "residual");
        CHECK(p.modules[8].activations == 0);
    }
}

TEST_CASE("memory model: LeNet and the MLP at batch 64, predicted and measured peaks within 2%",
          "[memmodel][cpu][lesson08]") {
    for (bool use_arena : {true, false}) {
        INFO("arena: " << use_arena);
        require_agreement(lenet_model, OptimizerKind::SGDMomentum, Shape{64, 1, 28, 28}, Device::CPU, use_arena);
        require_agreement(mlp_model, OptimizerKind::SGDMomentum, Shape{64, 1, 28, 28}, Device::CPU, use_arena);
        require_agreement(mlp_model, OptimizerKind::Adam, Shape{64, 1, 28, 28}, Device::CPU, use_arena);
    }
}

TEST_CASE("memory model: the CIFAR net (32/64/128) at batch 64 and 256, with and without batch norm, within 2%",
          "[memmodel][cpu][lesson08]") {
    for (bool batch_norm : {true, false})
        for (int64_t batch : {64, 256}) {
            INFO("batch norm: " << batch_norm << ", batch " << batch);
            require_agreement(cifar(batch_norm), OptimizerKind::SGDMomentum, Shape{batch, 3, 32, 32}, Device::CPU,
                              true);
        }
    require_agreement(cifar(true), OptimizerKind::SGDMomentum, Shape{64, 3, 32, 32}, Device::CPU, false);
    INFO("with recomputation, as lesson 08 trains it (no arena)");
    require_agreement(cifar(true, true), OptimizerKind::SGDMomentum, Shape{64, 3, 32, 32}, Device::CPU, false);
}

// On a GPU a convolution's weight gradient is a split-K GEMM whose partial sums (S·Og·Kc floats
// from the pool, ops/conv.h conv2d_backward_scratch) depend on the SM count: on an H200 (132 SMs)
// LeNet's conv2 at batch 64 takes 16 slices, 320,000 bytes the prediction must count. The
// emulator reports its OpenMP threads as SMs; here it also plays a GPU of 8 SMs and an H200.
TEST_CASE("memory model: LeNet on the CUDA device, within 2%, whatever its SM count", "[memmodel][cuda][lesson08]") {
#ifdef KILN_CUDA
    require_agreement(lenet_model, OptimizerKind::SGDMomentum, Shape{64, 1, 28, 28}, Device::CUDA, true);
#else
    for (int sms : {0, 8, 132}) {
        emu::ScopedMultiprocessors gpu(sms);
        INFO("the emulator reports " << emu::multiprocessors() << " SMs");
        require_agreement(lenet_model, OptimizerKind::SGDMomentum, Shape{64, 1, 28, 28}, Device::CUDA, true);
    }
#endif
}

TEST_CASE("memory model: an input that does not fit the model names the layer", "[memmodel][cpu][lesson08]") {
    Rng rng(1);
    auto model = lenet(rng);
    REQUIRE_THROWS_WITH(predict_memory(*model, {Shape{64, 3, 28, 28}}), Catch::Contains("conv1"));
    REQUIRE_THROWS_WITH(predict_memory(*model, {Shape{64}}), Catch::Contains("batch first"));
    REQUIRE_THROWS_WITH(predict_memory(*model, {Shape{64, 1, 28, 28}, OptimizerKind::SGD, Device::CPU, true, DType::F16}),
                        Catch::Contains("not --amp f16"));
}
