// lesson-05 — lesson 03's LeNet on MNIST, trained on the CUDA convolution and pooling kernels
// of cuda/conv.cu and cuda/pool.cu (a GPU, or kiln's emulator).
//
//   make lesson-05                          # 12 epochs on --device cuda, ≥ 99.0% test accuracy
//   make lesson-05 ARGS='--device cpu'      # the same run on the CPU kernels, to compare
//   make lesson-05 ARGS='--limit 2000 --epochs 1'   # a quick look
//   make lesson-05 ARGS='--cuda-graph'      # each step one CUDA Graph launch (train/step_graph.h)
//
// The trainer is lesson 03's with one default changed: --device cuda. Conv2d, MaxPool2d and
// the rest dispatch on the tensors' device, so the same model runs each convolution by the
// algorithm cuda::conv2d_algo picks for its shape (here the implicit GEMM for both layers:
// 10 and 20 output channels), each pooling layer by one thread per output.
//
// The network (src/nn/models.cpp, lenet; N = batch size):
//   x [N,1,28,28] -> conv 1→10 k5 -> max-pool 2 -> ReLU -> conv 10→20 k5 -> max-pool 2 -> ReLU
//   -> Flatten [N,320] -> Linear 320→50 -> ReLU -> Linear 50→10
#include <chrono>
#include <cstdio>
#include <memory>

#include "core/allocator.h"       // defines: BumpAllocator, memory_summary
#include "nn/models.h"            // defines: lenet (Conv2d, MaxPool2d, ReLU, Linear)
#include "optim/optimizer.h"      // defines: SGD
#include "train/cli.h"            // defines: Cli, CommonFlags
#include "train/fit.h"            // defines: MnistData, only_measure, fit, report

using namespace kiln;

int main(int argc, char** argv) try {
    CommonFlags flags;
    flags.device = "cuda";
    flags.epochs = 12;  // as lesson 03, whose run first passed 99.0% at epoch 11
    flags.lr = 0.05f;
    float momentum = 0.9f;
    Cli cli("lesson-05", "Trains lesson 03's LeNet on MNIST with the CUDA kernels (a GPU, or the emulator).");
    flags.add_to(cli);
    cli.add("--cuda-graph", &flags.cuda_graph,
            "launch each training step as one captured CUDA Graph (--device cuda; the README's \"launch overhead\")");
    cli.add("--momentum", &momentum, "SGD momentum", Cli::between(0, 1));
    cli.parse(argc, argv);
    Device device = flags.apply();
    auto start = std::chrono::steady_clock::now();

    MnistData mnist(flags, device);  // the loaders copy each batch to the device

    // Each step's activations and workspaces, reset after every step (train/loop.cpp); the
    // arena starts empty and grows to the largest step's size (core/allocator.h).
    BumpAllocator arena("step arena", device);

    // Model: drawn on the CPU from the seed (the same weights as lesson 03), then moved.
    Rng rng(flags.seed);
    std::unique_ptr<Sequential> model = lenet(rng);
    model->to(device);
    SGD sgd(model->parameters(), flags.lr, SGD::Options{}.with_momentum(momentum));
    flags.apply_memory_limit(device);  // --mem-limit, now that the model and its optimizer exist
    // --find-batch-size or --time-report N: measure, print, stop (train/fit.h)
    if (only_measure(*model, sgd, mnist.train, flags, &arena)) return 0;
    std::printf("lesson-05: LeNet, %lld parameters, %lld training images, device %s\n",
                (long long)model->num_parameters(), (long long)mnist.train_set.n, device_name(device));

    double test_acc = fit(*model, sgd, mnist.train, mnist.test, flags, &arena);  // as lesson 03
    report(flags, device, test_acc, start);
    return 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "lesson-05: %s\n", e.what());
    return 1;
}
