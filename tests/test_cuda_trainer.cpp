// test_cuda_trainer.cpp — chapters 04 and 05's claim: the models train the same on the CUDA
// kernels as on the CPU. Lesson 02's MLP and lesson 03's LeNet: 20 steps of batch 64 on the
// real MNIST (data/mnist, `make data`), seed 1, lr 0.05, momentum 0.9 — the lessons' settings —
// on each device, and the 20 losses compared. Lesson 06's CIFAR net with batch norm (small
// widths, 4 random images): one forward and backward, logits and every gradient compared.
//
// Tolerance: relative 1e-4. The two runs do the same arithmetic in a different order: the GPU
// GEMM adds the K products tile by tile (and may fuse multiply-adds), the column sums of the
// bias gradient add 8 partial sums, the loss sums rows by a tree, batch norm sums a channel by
// a tree of 256 threads. Each step's results differ in the last bits of a float (~1e-7
// relative; the CIFAR net's logits ~1e-6 of the largest on the emulator, batch norm dividing
// by small deviations), and 20 steps of SGD let that grow; 1e-4 is far below any real bug (a
// wrong gradient changes the loss in the first or second digit).
//
//   make test T='[cuda][trainer]'     (LeNet: ~10 s on the emulator)
#include <catch2/catch.hpp>

#include <functional>
#include <memory>
#include <vector>

#include "data/idx.h"
#include "fixtures.h"
#include "data/loader.h"
#include "nn/models.h"
#include "ops/ops.h"
#include "optim/optimizer.h"
#include "train/evaluate.h"
#include "train/loop.h"

using namespace kiln;

namespace {

const ImageSet& mnist_train() {
    static ImageSet set = load_mnist("data/mnist", true);
    return set;
}

// The first `steps` losses of the model `build` makes (seed 1), trained on `device` with batch
// 64, lr 0.05 and momentum 0.9, as lessons 02 and 03 do.
std::vector<float> first_losses(Device device, int steps,
                                const std::function<std::unique_ptr<Sequential>(Rng&)>& build) {
    Rng rng(1);
    std::unique_ptr<Sequential> model = build(rng);
    model->to(device);
    SGD sgd(model->parameters(), 0.05f, SGD::Options{}.with_momentum(0.9f));
    DataLoader loader(mnist_train(), {64, true, false, 1, {0.1307f}, {0.3081f}, device});
    BumpAllocator arena("test arena", device, size_t(64) << 20);
    std::vector<float> losses;
    Batch b;
    for (int i = 0; i < steps && loader.next(b); i++) {
        REQUIRE(b.x.device() == device);
        losses.push_back(train_step(*model, sgd, b.x, b.y, StepOptions{&arena, 0.0f}).loss);
    }
    return losses;
}

}  // namespace

TEST_CASE("lesson 04: the MLP's first 20 losses on cuda match the CPU's", "[cuda][lesson04][trainer]") {
    auto build = [](Rng& rng) { return mlp(rng); };
    const std::vector<float> cpu = first_losses(Device::CPU, 20, build);
    const std::vector<float> gpu = first_losses(Device::CUDA, 20, build);
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

TEST_CASE("lesson 05: LeNet's first 20 losses on cuda match the CPU's", "[cuda][lesson05][trainer]") {
    const std::vector<float> cpu = first_losses(Device::CPU, 20, lenet);
    const std::vector<float> gpu = first_losses(Device::CUDA, 20, lenet);
    REQUIRE(gpu.size() == 20);
    REQUIRE(gpu[0] == Approx(2.3).margin(0.3));
    for (size_t i = 0; i < gpu.size(); i++) {
        INFO("step " << i << ": cuda " << gpu[i] << ", cpu " << cpu[i]);
        REQUIRE(gpu[i] == Approx(cpu[i]).epsilon(1e-4));
    }
    REQUIRE(gpu.back() < 0.9f * gpu.front());  // and it is learning
}

TEST_CASE("lesson 05: the CIFAR net with batch norm computes the same on cuda as on the CPU",
          "[cuda][lesson05][trainer]") {
    // Small widths and 4 random images: every layer kind of lesson 06 (conv, max-pool, batch norm
    // in training mode, GELU, linear) forward and backward, compared tensor by tensor.
    Rng data(7);
    const Tensor x = Tensor::normal({4, 3, 32, 32}, 0, 1, data);
    Tensor y = Tensor::empty({4}, DType::I32);
    for (int64_t i = 0; i < 4; i++) y.data<int32_t>()[i] = int32_t(data.next_below(10));
    Rng rng_cpu(1), rng_gpu(1);
    std::unique_ptr<Sequential> cpu_net = cifar_net(rng_cpu, {8, 16, 16}), gpu_net = cifar_net(rng_gpu, {8, 16, 16});
    gpu_net->to(Device::CUDA);
    CrossEntropyLoss cpu_loss, gpu_loss;
    const Tensor cpu_logits = cpu_net->forward(x), gpu_logits = gpu_net->forward(x.to(Device::CUDA));
    test::require_close(gpu_logits, cpu_logits, 1e-4);
    REQUIRE(gpu_loss.forward(gpu_logits, y.to(Device::CUDA)) == Approx(cpu_loss.forward(cpu_logits, y)).epsilon(1e-5));
    cpu_net->backward(cpu_loss.backward());
    gpu_net->backward(gpu_loss.backward());
    const std::vector<Parameter*> cpu_params = cpu_net->parameters(), gpu_params = gpu_net->parameters();
    for (size_t i = 0; i < cpu_params.size(); i++) {
        INFO(cpu_params[i]->name);
        test::require_close(gpu_params[i]->grad, cpu_params[i]->grad, 1e-4);
    }
}
