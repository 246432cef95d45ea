// test_trainers.cpp — the chapters' trainers on the real MNIST (data/mnist, from `make data`):
// their first losses pinned for seed 1, and a short run whose loss falls.
//
// The pinned values were produced by this code; a change that alters them changes what every
// learner sees, so it must be deliberate (update the numbers and say why in the commit).
#include <catch2/catch.hpp>
#include <cstring>
#include <fstream>
#include <limits>
#include <vector>

#include "data/idx.h"
#include "data/loader.h"
#include "capstone_fixture.h"
#include "fixtures.h"
#include "nn/conv.h"
#include "nn/models.h"
#include "ops/ops.h"
#include "optim/optimizer.h"
#include "optim/scheduler.h"
#include "train/evaluate.h"
#include "train/airbench.h"
#include "train/cli.h"
#include "train/fit.h"
#include "train/loop.h"
#include "train/time_report.h"

using namespace kiln;

static const ImageSet& mnist_train() {
    static ImageSet set = load_mnist("data/mnist", true);
    return set;
}

// The first `steps` losses of a model trained as the lesson's trainer does (batch 64, seed 1):
// train_step, with an arena, as train_epoch runs it.
static std::vector<float> first_losses(Module& model, Optimizer& opt, int steps) {
    DataLoader loader(mnist_train(), {64, true, false, 1, {0.1307f}, {0.3081f}, Device::CPU});
    BumpAllocator arena("test arena", Device::CPU, size_t(64) << 20);
    std::vector<float> losses;
    Batch b;
    for (int i = 0; i < steps && loader.next(b); i++) {
        const StepResult r = train_step(model, opt, b.x, b.y, StepOptions{&arena, 0.0f});
        REQUIRE(r.stepped);
        losses.push_back(r.loss);
    }
    return losses;
}

// The pins hold to `rel` relative error: builds differ in the last bits (the SAN=1 build has no
// -march=native, so GEMM sums in another order), and training steps amplify those bits.
static void require_close(const std::vector<float>& got, const std::vector<float>& pinned, double rel = 1e-4) {
    REQUIRE(got.size() == pinned.size());
    for (size_t i = 0; i < got.size(); i++) {
        INFO("step " << i << ": got " << got[i] << ", pinned " << pinned[i]);
        REQUIRE(got[i] == Approx(pinned[i]).epsilon(rel));
    }
}

TEST_CASE("lesson 01: softmax regression's first losses", "[trainer][cpu][lesson01]") {
    Rng rng(1);
    auto model = softmax_regression(rng);
    SGD sgd(model->parameters(), 0.05f);
    std::vector<float> losses = first_losses(*model, sgd, 8);
    REQUIRE(losses[0] == Approx(2.3).margin(0.3));  // ≈ ln 10 for a fresh classifier
    require_close(losses, {2.3667228f, 1.8291087f, 1.5883523f, 1.3402978f, 1.1681719f, 1.2218316f, 0.9343950f,
                           0.9581792f});
}

TEST_CASE("lesson 02: the MLP's first losses", "[trainer][cpu][lesson02]") {
    Rng rng(1);
    auto model = mlp(rng);
    SGD sgd(model->parameters(), 0.05f, SGD::Options{}.with_momentum(0.9f));
    std::vector<float> losses = first_losses(*model, sgd, 8);
    REQUIRE(losses[0] == Approx(2.3).margin(0.3));
    require_close(losses, {2.2945447f, 2.2717242f, 2.2194564f, 2.1812530f, 2.1248631f, 2.0507360f, 1.9411154f,
                           1.8810743f});
}

TEST_CASE("lesson 03: LeNet's first losses", "[trainer][cpu][lesson03]") {
    Rng rng(1);
    auto model = lenet(rng);
    SGD sgd(model->parameters(), 0.05f, SGD::Options{}.with_momentum(0.9f));
    std::vector<float> losses = first_losses(*model, sgd, 8);
    REQUIRE(losses[0] == Approx(2.3).margin(0.3));
    require_close(losses, {2.3207517f, 2.3127384f, 2.2790847f, 2.2677021f, 2.2497561f, 2.2564533f, 2.2135735f,
                           2.2437146f});
}

TEST_CASE("lesson 06: the CIFAR net's first losses, with and without batch norm", "[trainer][cpu][lesson06]") {
    // A fixed batch of 32 random "images" with random labels: the pins cover the network and
    // its ops (conv, pool, BN, GELU, Nesterov SGD), not the data.
    Rng data(7);
    Tensor x = Tensor::normal({32, 3, 32, 32}, 0, 1, data);
    Tensor y = Tensor::empty({32}, DType::I32);
    for (int64_t i = 0; i < 32; i++) y.data<int32_t>()[i] = int32_t(data.next_below(10));
    auto losses_of = [&](bool batch_norm) {
        Rng rng(1);
        auto model = cifar_net(rng, {32, 64, 128}, batch_norm);
        SGD sgd(model->parameters(), 0.05f,
                SGD::Options{}.with_momentum(0.9f).with_weight_decay(5e-4f).with_nesterov());
        BumpAllocator arena("test arena", Device::CPU, size_t(256) << 20);
        std::vector<float> losses;
        for (int step = 0; step < 5; step++) losses.push_back(train_step(*model, sgd, x, y, {&arena, 0.0f}).loss);
        return losses;
    };
    std::vector<float> bn = losses_of(true), plain = losses_of(false);
    // memorizing one batch drives the loss down fast, which amplifies rounding the most
    require_close(bn, {2.9605851f, 2.3140104f, 1.7140838f, 0.7519941f, 0.3261750f}, 2e-3);
    require_close(plain, {2.3020639f, 2.3017778f, 2.3013701f, 2.3008542f, 2.3002415f});
    REQUIRE(bn.back() < 0.2f * bn.front());                 // with BN it memorizes the batch;
    REQUIRE(plain.front() - plain.back() < 0.01f);           // without, the signal has vanished
}

TEST_CASE("lesson 13: the capstone net's first losses (whitened, identity-started, smoothed labels)", "[trainer][cpu][lesson13]") {
    // As lesson 06's: a fixed random batch. The whitening is computed from 64 other random images.
    const test::CapstoneBatch batch(32, 64);
    const Tensor &x = batch.x, &y = batch.y;
    auto model = test::capstone_net(batch.sample);
    SGD sgd = test::capstone_sgd(*model);
    REQUIRE(sgd.param_groups().size() == 3);
    REQUIRE(sgd.param_groups()[0].params.size() == 6);   // the six batch norms' β
    REQUIRE(sgd.param_groups()[1].params.size() == 1);   // the stem's bias
    REQUIRE(sgd.param_groups()[2].params.size() == 7);   // six 3×3 convs and the head
    BumpAllocator arena("test arena", Device::CPU, size_t(512) << 20);
    StepOptions step{&arena, 0.0f};
    step.label_smoothing = 0.2f;
    std::vector<float> losses;
    StepTimer timer(*model, Device::CPU);  // --time-report: timing changes nothing the step computes
    for (int i = 0; i < 5; i++) {
        timer.step_begins();
        timer.batch_loaded();
        losses.push_back(train_step(*model, sgd, x, y, step).loss);
        timer.step_ends();
    }
    // memorizing the batch; label smoothing 0.2 keeps the loss above H(q) = 0.8669 (10 classes)
    require_close(losses, {2.2947035f, 1.7909223f, 1.6515040f, 0.9371973f, 0.9112704f}, 2e-3);
    REQUIRE(losses.back() > 0.8668f);
    const TimeReport& t = timer.report();
    REQUIRE(t.steps == 3);  // the first two not timed
    REQUIRE(t.layers.size() == 27);  // stem, its GELU, 3 × 7 in the blocks, pool, flatten, head, scale
    CHECK(t.layers[9].name == "block2a.conv");
    CHECK(t.layers[9].output == Shape{32, 256, 15, 15});
    CHECK(t.layers[9].backward > 0);
    CHECK(t.step >= t.in_layers());
}

TEST_CASE("lesson 02: a short run's loss falls", "[trainer][cpu][lesson02]") {
    ImageSet small = take_spread(mnist_train(), 2000);
    DataLoader loader(small, {64, true, false, 1, {0.1307f}, {0.3081f}, Device::CPU});
    Rng rng(1);
    auto model = mlp(rng, 128, 64);
    SGD sgd(model->parameters(), 0.05f, SGD::Options{}.with_momentum(0.9f));
    BumpAllocator arena("test arena", Device::CPU, size_t(16) << 20);
    TrainOptions opt{3, nullptr, false, &arena, 0.0f, "", ""};
    EpochResult first = train_epoch(*model, sgd, loader, 0, opt);
    train_epoch(*model, sgd, loader, 1, opt);
    EpochResult third = train_epoch(*model, sgd, loader, 2, opt);
    REQUIRE(third.loss < 0.6f * first.loss);
    REQUIRE(third.accuracy > 0.9);
}

TEST_CASE("train_step reports a non-finite loss or gradient and skips the update", "[trainer][cpu][lesson07]") {
    Rng rng(1);
    auto model = mlp(rng, 8, 4);
    SGD sgd(model->parameters(), 0.1f);
    Tensor x = Tensor::ones({2, 1, 28, 28}), y = Tensor::zeros({2}, DType::I32);
    const Tensor w = model->parameters()[0]->value.clone();
    SECTION("a NaN input: the loss is NaN") {
        x.set({0, 0, 0, 0}, std::numeric_limits<double>::quiet_NaN());
        const StepResult r = train_step(*model, sgd, x, y, {nullptr, 1.0f});
        REQUIRE(!r.loss_finite);
        REQUIRE(!r.stepped);
        test::require_identical(model->parameters()[0]->value, w);  // not updated
    }
    SECTION("an infinite gradient: clipping's norm says so, the loss is finite") {
        model->module_at("fc3").register_backward_hook([](Module& fc3, const Tensor&, Tensor&) {
            static_cast<Linear&>(fc3).weight.grad.set({0, 0}, std::numeric_limits<double>::infinity());
        });
        const StepResult r = train_step(*model, sgd, x, y, {nullptr, 1.0f});
        REQUIRE(r.loss_finite);
        REQUIRE(!r.grads_finite);
        REQUIRE(!r.stepped);
        test::require_identical(model->parameters()[0]->value, w);
    }
    SECTION("finite: one update") {
        const StepResult r = train_step(*model, sgd, x, y, {nullptr, 1.0f});
        REQUIRE(r.finite());
        REQUIRE(r.stepped);
        REQUIRE(r.grad_norm > 0.0f);
        REQUIRE(sgd.steps() == 1);
    }
    SECTION("the training loop stops, naming the epoch and the step") {
        ImageSet set = take_spread(mnist_train(), 64);
        DataLoader loader(set, {64, true, false, 1, {0.1307f}, {0.3081f}, Device::CPU});
        SGD wild(model->parameters(), 1e30f);  // the first update sends the weights to inf
        TrainOptions opt{1, nullptr, false, nullptr, 0.0f, "", ""};
        train_epoch(*model, wild, loader, 0, opt);
        REQUIRE_THROWS_WITH(train_epoch(*model, wild, loader, 0, opt),
                            Catch::Contains("epoch 1, step 1") && Catch::Contains("loss"));
    }
}

// What --save and --resume do in every trainer (train/fit.h): a run stopped after epoch 2 of 3
// and resumed from its checkpoint ends with the same weights, bit for bit, as one that never
// stopped, with a per-batch schedule whose position must survive too.
TEST_CASE("fit: --save after each epoch, --resume continues exactly", "[trainer][checkpoint][cpu][lesson07]") {
    test::TempDir dir;
    ImageSet small = take_spread(mnist_train(), 640);
    struct Run {
        Rng rng{1};
        std::unique_ptr<Sequential> model = mlp(rng, 32, 16);
        SGD sgd{decay_groups(*model, 0.05f, 1e-3f), SGD::Options{}.with_momentum(0.9f).with_nesterov()};
        OneCycleLR schedule{sgd, 0.1, 3 * 10};
    };
    auto fit_epochs = [&](Run& r, int epochs, const std::string& save, const std::string& resume) {
        DataLoader train(small, {64, true, false, 1, {0.1307f}, {0.3081f}, Device::CPU});
        DataLoader test(small, {320, false, false, 1, {0.1307f}, {0.3081f}, Device::CPU});
        return fit(*r.model, r.sgd, train, test, TrainOptions{epochs, &r.schedule, true, nullptr, 0.0f, save, resume});
    };
    Run whole, first, second;
    const double acc = fit_epochs(whole, 3, "", "");
    fit_epochs(first, 3, dir.path + "/run", "");  // prev.safetensors: after epoch 2 of 3
    REQUIRE(fit_epochs(second, 3, "", dir.path + "/run/prev.safetensors") == acc);
    std::vector<Parameter*> a = whole.model->parameters(), b = second.model->parameters();
    for (size_t i = 0; i < a.size(); i++) {
        INFO(a[i]->name);
        test::require_identical(b[i]->value, a[i]->value);
    }
    REQUIRE(second.sgd.lr() == whole.sgd.lr());
    REQUIRE(second.schedule.last_epoch() == 30);
    // a checkpoint of another model is refused by name
    Rng rng(1);
    auto other = mlp(rng, 64, 16);
    SGD sgd(other->parameters(), 0.05f);
    DataLoader train(small, {64, true, false, 1, {0.1307f}, {0.3081f}, Device::CPU});
    REQUIRE_THROWS_WITH(fit(*other, sgd, train, train,
                            TrainOptions{3, nullptr, false, nullptr, 0.0f, "", dir.path + "/run/last.safetensors"}),
                        Catch::Contains("fc1.weight"));
}

// 7 random 2×3×4 "images" of 3 classes, to score with and without their mirror images.
static ImageSet random_images() {
    ImageSet s;
    s.n = 7; s.c = 2; s.h = 3; s.w = 4;
    Rng rng(5);
    for (int64_t i = 0; i < s.n * s.c * s.h * s.w; i++) s.pixels.push_back(uint8_t(rng.next_u64() % 256));
    for (int64_t i = 0; i < s.n; i++) s.labels.push_back(int32_t(rng.next_u64() % 3));
    return s;
}

TEST_CASE("evaluate_with_mirror: each image's logits plus its mirror image's", "[trainer][cpu][lesson07]") {
    ImageSet set = random_images();
    LoaderOptions in_order{3, false, false, 0, {0.5f, 0.4f}, {0.2f, 0.3f}};  // batches of 3, 3, 1
    LoaderOptions flipped = in_order;
    flipped.transforms = {std::make_shared<RandomHorizontalFlip>(1.0f)};
    DataLoader loader(set, in_order), mirrored(set, flipped);
    Rng rng(2);
    Sequential model("probe");
    model.emplace<Flatten>();
    model.emplace<Linear>(24, 3, rng);

    // by hand: flip each batch along W, add the two views' logits, count the argmax hits
    int64_t plain = 0, averaged = 0;
    loader.start_epoch(0);
    mirrored.start_epoch(0);
    Batch b, m;
    while (loader.next(b) && mirrored.next(m)) {
        Tensor flip = b.x.clone();  // [N, 2, 3, 4]
        const float* x = b.x.data<float>();
        float* f = flip.data<float>();
        for (int64_t row = 0; row < b.x.numel() / 4; row++)
            for (int64_t col = 0; col < 4; col++) f[row * 4 + col] = x[row * 4 + 3 - col];
        test::require_identical(m.x, flip);  // the mirrored loader delivers exactly these
        Tensor logits = model.forward(b.x);
        plain += count_correct(logits, b.y);
        averaged += count_correct(add(logits, model.forward(flip)), b.y);
    }
    MirrorAccuracy acc = evaluate_with_mirror(model, loader, mirrored);
    REQUIRE(acc.plain == double(plain) / 7);
    REQUIRE(acc.averaged == double(averaged) / 7);
    REQUIRE(acc.plain == evaluate(model, loader));

    LoaderOptions other_batches = flipped;
    other_batches.batch_size = 2;
    DataLoader wrong(set, other_batches);
    REQUIRE_THROWS_WITH(evaluate_with_mirror(model, loader, wrong),
                        Catch::Contains("view 1 (the mirrored or shifted loader) has 4 batches") && Catch::Contains("3"));
}

TEST_CASE("--mem-limit below what the model alone takes says so and what the minimum is", "[trainer][memory][cpu][lesson08]") {
    Rng rng(1);
    std::unique_ptr<Sequential> model = lenet(rng);
    SGD sgd(model->parameters(), 0.05f, SGD::Options{}.with_momentum(0.9f));
    CommonFlags flags;
    flags.mem_limit = "64KiB";  // LeNet's 21,840 parameters are 85 KiB; with grads and momentum, 3 times that
    REQUIRE(flags.apply() == Device::CPU);
    REQUIRE(memory_limit(Device::CPU) == 0);  // not before the model is built
    REQUIRE_THROWS_WITH(flags.apply_memory_limit(Device::CPU),
                        Catch::Contains("--mem-limit 64KiB is below what the model needs before its first step") &&
                            Catch::Contains("parameters, gradients and optimizer state take") &&
                            Catch::Contains("try --mem-limit"));
    REQUIRE(memory_limit(Device::CPU) == 0);
    flags.mem_limit = "1GiB";
    flags.apply_memory_limit(Device::CPU);
    REQUIRE(memory_limit(Device::CPU) == int64_t(1) << 30);
    set_memory_limit(Device::CPU, 0);
}

TEST_CASE("fit prints the peaks of training, evaluation and saving apart", "[trainer][memory][cpu][lesson08]") {
    RunPeaks p{20 << 20, 6 << 20, 0};
    REQUIRE(p.str() == "memory peaks: training steps 20.0MiB, evaluation 6.0MiB");
    p.saving = 21 << 20;
    REQUIRE(p.str() == "memory peaks: training steps 20.0MiB, evaluation 6.0MiB, saving checkpoints 21.0MiB");
}

// Lesson 08's claim: its way of training chapter 06's net needs less than half the memory of
// chapter 06's way, at the same batch of 128 (random images: memory does not depend on them).
TEST_CASE("lesson 08: recomputation, 4 micro-batches and a 4 MiB workspace halve a step's peak", "[trainer][memory][cpu][lesson08]") {
    Rng data_rng(3);
    const Tensor x = Tensor::normal({128, 3, 32, 32}, 0, 1, data_rng);
    const Tensor y = Tensor::zeros({128}, DType::I32);
    auto step_peak = [&](bool lesson08) {
        Rng rng(1);
        std::unique_ptr<Sequential> model = cifar_net(rng, {32, 64, 128}, true, /*recompute=*/lesson08);
        if (lesson08) set_conv_workspace_limit(*model, 4 << 20);
        SGD sgd(model->parameters(), 0.05f,
                SGD::Options{}.with_momentum(0.9f).with_weight_decay(5e-4f).with_nesterov());
        BumpAllocator arena("test arena", Device::CPU);
        reset_phase_peak(Device::CPU);
        const StepResult r = train_step(*model, sgd, x, y, StepOptions{lesson08 ? nullptr : &arena, 0.0f, lesson08 ? 4 : 1});
        REQUIRE(r.stepped);
        return device_peaks(Device::CPU).phase_peak;
    };
    const int64_t plain = step_peak(false), lesson08 = step_peak(true);
    INFO("plain " << format_bytes(plain) << ", lesson 08 " << format_bytes(lesson08));
    REQUIRE(2 * lesson08 < plain);
}

TEST_CASE("--time-report N: only_measure trains N steps after the first two, timed, draws them and says stop",
          "[trainer][time][cpu][lesson08]") {
    ImageSet small = take_spread(mnist_train(), 640);  // 10 batches of 64
    DataLoader loader(small, {64, true, false, 1, {0.1307f}, {0.3081f}, Device::CPU});
    Rng rng(1);
    auto model = mlp(rng, 32, 16);
    SGD sgd(model->parameters(), 0.05f);
    BumpAllocator arena("test arena", Device::CPU, size_t(16) << 20);
    const Tensor before = model->parameters()[0]->value.clone();
    test::TempDir dir;
    CommonFlags flags;
    REQUIRE_FALSE(only_measure(*model, sgd, loader, flags, &arena));  // neither flag: the trainer trains
    REQUIRE(sgd.steps() == 0);

    flags.time_report = 3;
    flags.time_svg = dir.file("time.svg");
    flags.apply();
    REQUIRE(only_measure(*model, sgd, loader, flags, &arena));
    REQUIRE(sgd.steps() == 5);  // two untimed, three timed
    REQUIRE(std::ifstream(flags.time_svg).good());
    const Tensor after = model->parameters()[0]->value;
    REQUIRE(std::memcmp(after.data<float>(), before.data<float>(), size_t(after.nbytes())) != 0);  // the steps trained

    flags.time_report = 100, flags.time_svg.clear();  // more than an epoch has: its 8 timed steps
    REQUIRE(only_measure(*model, sgd, loader, flags, &arena));
    REQUIRE(sgd.steps() == 15);

    // bad combinations are refused before any data is read (a negative count is refused by the
    // command line: test_cli.cpp)
    CommonFlags bad;
    bad.time_svg = "t.svg";
    REQUIRE_THROWS_WITH(bad.apply(), Catch::Contains("add --time-report N"));
    bad.time_report = 2, bad.find_batch_size = true;
    REQUIRE_THROWS_WITH(bad.apply(), Catch::Contains("ask for one at a time"));
}
