// test_cuda_trainer.cpp — chapter 04's claim: lesson 02's MLP trains the same on the CUDA
// kernels as on the CPU. 20 steps of batch 64 on the real MNIST (data/mnist, `make data`),
// seed 1, lr 0.05, momentum 0.9 — the lesson's settings — on each device, and the 20 losses
// compared.
//
// Tolerance: relative 1e-4. The two runs do the same arithmetic in a different order: the GPU
// GEMM adds the K products tile by tile (and may fuse multiply-adds), the column sums of the
// bias gradient add 8 partial sums, the loss sums rows by a tree. Each step's results differ
// in the last bits of a float (~1e-7 relative), and 20 steps of SGD let that grow; 1e-4 is
// far below any real bug (a wrong gradient changes the loss in the first or second digit).
//
//   make test T='[cuda][trainer]'
#include <catch2/catch.hpp>

#include <memory>
#include <vector>

#include "data/idx.h"
#include "data/loader.h"
#include "nn/models.h"
#include "ops/ops.h"
#include "optim/optimizer.h"
#include "train/evaluate.h"

using namespace kiln;

namespace {

const ImageSet& mnist_train() {
    static ImageSet set = load_mnist("data/mnist", true);
    return set;
}

// The first `steps` losses of lesson 02's MLP trained on `device` (batch 64, seed 1).
std::vector<float> first_losses(Device device, int steps) {
    Rng rng(1);
    std::unique_ptr<Sequential> model = mlp(rng);
    model->to(device);
    SGD sgd(model->parameters(), 0.05f, {0.9f, 0.0f, 0.0f, false});
    DataLoader loader(mnist_train(), {64, true, false, 1, {0.1307f}, {0.3081f}, device});
    CrossEntropyLoss criterion;
    std::vector<float> losses;
    Batch b;
    for (int i = 0; i < steps && loader.next(b); i++) {
        REQUIRE(b.x.device() == device);
        sgd.zero_grad();
        losses.push_back(criterion.forward(model->forward(b.x), b.y));
        model->backward(criterion.backward());
        sgd.step();
    }
    return losses;
}

}  // namespace

TEST_CASE("lesson 04: the MLP's first 20 losses on cuda match the CPU's", "[cuda][lesson04][trainer]") {
    const std::vector<float> cpu = first_losses(Device::CPU, 20);
    const std::vector<float> gpu = first_losses(Device::CUDA, 20);
    REQUIRE(gpu.size() == 20);
    REQUIRE(gpu[0] == Approx(2.3).margin(0.3));  // ≈ ln 10 for a fresh classifier
    for (size_t i = 0; i < gpu.size(); i++) {
        INFO("step " << i << ": cuda " << gpu[i] << ", cpu " << cpu[i]);
        REQUIRE(gpu[i] == Approx(cpu[i]).epsilon(1e-4));
    }
    REQUIRE(gpu.back() < 0.8f * gpu.front());  // and it is learning
}

TEST_CASE("lesson 04: evaluate on cuda counts the same as on the CPU", "[cuda][lesson04][trainer]") {
    ImageSet some = take_spread(mnist_train(), 500);
    Rng rng(1);
    std::unique_ptr<Sequential> model = mlp(rng, 64, 32);
    DataLoader cpu_loader(some, {100, false, false, 1, {0.1307f}, {0.3081f}, Device::CPU});
    const double cpu_acc = evaluate(*model, cpu_loader);
    model->to(Device::CUDA);
    DataLoader cuda_loader(some, {100, false, false, 1, {0.1307f}, {0.3081f}, Device::CUDA});
    // The same model and images; only a near-tie between two logits could flip one answer.
    REQUIRE(evaluate(*model, cuda_loader) == Approx(cpu_acc).margin(1.0 / 500));
}
