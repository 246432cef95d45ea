// test_loss_log.cpp — the training losses left on the GPU and read back many steps at a time
// (train/loss_log.h): the same epoch as reading every step's loss at once, bit for bit, with one
// copy to the host per 32 steps instead of one per step; and what a NaN loss or a bad label
// found late says.
//
//   make test T='[lossread]'
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <memory>
#include <limits>
#include <vector>

#include "data/loader.h"
#include "nn/layers.h"
#include "nn/models.h"
#include "optim/optimizer.h"
#include "train/loop.h"
#include "train/loss_log.h"

#include "fixtures.h"
#ifndef KILN_CUDA
#include "emu/emu.h"  // copies_to_host: the emulator counts the host's reads
#endif

using namespace kiln;

namespace {

struct Run {
    Rng rng{1};
    std::unique_ptr<Sequential> model = mlp(rng, 16, 8);
    SGD sgd{model->parameters(), 0.05f, SGD::Options{}.with_momentum(0.9f)};
    Run() { model->to(Device::CUDA); }
};

LoaderOptions on_cuda(int64_t batch) { return {batch, true, false, 1, {0.5f}, {0.25f}, Device::CUDA}; }

}  // namespace

TEST_CASE("an epoch on CUDA reads its losses once per 32 steps, and learns what reading each step does",
          "[lossread][cuda][trainer][lesson04]") {
    const ImageSet set = test::random_images(40 * 8, 7);  // 40 steps of 8 images
    const int accumulate = GENERATE(1, 2);
    INFO("--accumulate " << accumulate);
    EpochResult each, logged;
    Run a, b;
    {
        DataLoader loader(set, on_cuda(8));
        TrainOptions opt;
        opt.loss_read_every = 1, opt.accumulate = accumulate;  // the loss read back after every step
        each = train_epoch(*a.model, a.sgd, loader, 0, opt);
    }
#ifndef KILN_CUDA
    const std::uint64_t copies_before = emu::copies_to_host();
#endif
    {
        DataLoader loader(set, on_cuda(8));
        TrainOptions opt;  // the default: 32 steps a read
        opt.accumulate = accumulate;
        logged = train_epoch(*b.model, b.sgd, loader, 0, opt);
    }
#ifndef KILN_CUDA
    // 40 steps: one read after step 32 and one at the epoch's end (each step's own would be 40).
    CHECK(emu::copies_to_host() - copies_before == 2);
#endif
    CHECK(logged.loss == each.loss);  // the same steps, the same sums in the same order
    CHECK(logged.accuracy == each.accuracy);
    REQUIRE(std::isfinite(logged.loss));
    const auto pa = a.model->parameters(), pb = b.model->parameters();
    for (size_t i = 0; i < pa.size(); i++) {
        const Tensor wa = pa[i]->value.to(Device::CPU), wb = pb[i]->value.to(Device::CPU);
        REQUIRE(std::memcmp(wa.raw(), wb.raw(), wa.nbytes()) == 0);
    }
}

TEST_CASE("a loss that is not finite, found when the log is read, stops training at its step", "[lossread][cuda][trainer]") {
    const ImageSet set = test::random_images(5 * 8, 3);
    Run run;
    DataLoader loader(set, on_cuda(8));
    SGD wild(run.model->parameters(), 1e30f);  // the first update sends the weights to inf
    TrainOptions opt;
    // Step 1's loss is finite and its update is wild: step 2's is the first NaN, read with the
    // others at the epoch's end.
    REQUIRE_THROWS_WITH(train_epoch(*run.model, wild, loader, 0, opt),
                        Catch::Contains("training diverged") && Catch::Contains("epoch 1, step 2"));
}

TEST_CASE("a label outside the classes, found when the log is read, is named by step and row", "[lossread][cuda][trainer]") {
    LossLog log(Device::CUDA, 4);
    CrossEntropyLoss loss;
    const Tensor logits = Tensor::zeros({3, 5}, DType::F32, Device::CUDA);
    const Tensor good = Tensor::zeros({3}, DType::I32, Device::CUDA);
    Tensor bad = Tensor::zeros({3}, DType::I32);
    bad.set({1}, 9.0);
    const Tensor bad_cuda = bad.to(Device::CUDA);
    loss.forward_into(logits, good, log.slot(3, 1.0f));  // step 1
    log.end_step(3);
    loss.forward_into(logits, good, log.slot(3, 0.5f));  // step 2: two micro-batches, the second bad
    loss.forward_into(logits, bad_cuda, log.slot(3, 0.5f));
    log.end_step(6);
    REQUIRE(log.full(1) == false);
    REQUIRE(log.full(2) == true);  // 3 of 4 places taken
    REQUIRE_THROWS_WITH(log.read(), Catch::Contains("at step 2 the label at row 4 of the batch is outside [0, 5)"));
}

TEST_CASE("LossLog gives train_step's loss, and refuses what would read the step back", "[lossread][cuda][trainer]") {
    const ImageSet set = test::random_images(16, 5);
    DataLoader loader(set, on_cuda(16));
    loader.start_epoch(0);
    Batch batch;
    REQUIRE(loader.next(batch));
    Run a, b;
    const StepResult read = train_step(*a.model, a.sgd, batch.x, batch.y, {});
    LossLog log(Device::CUDA);
    StepOptions logged;
    logged.loss_log = &log;
    const StepResult r = train_step(*b.model, b.sgd, batch.x, batch.y, logged);
    REQUIRE(r.loss_logged);
    REQUIRE(r.stepped);
    log.end_step(batch.size());
    const std::vector<LossLog::Step> steps = log.read();
    REQUIRE(steps.size() == 1);
    CHECK(steps[0].loss == read.loss);
    CHECK(steps[0].correct == read.correct);
    CHECK(steps[0].batch_size == 16);
    REQUIRE(log.steps_waiting() == 0);

    logged.clip_norm = 1.0f;
    REQUIRE_THROWS_WITH(train_step(*b.model, b.sgd, batch.x, batch.y, logged), Catch::Contains("use a LossLog without them"));
}
