// lesson-03 — the LeNet of PyTorch's classic MNIST example, on the CPU: im2col + GEMM, pooling.
//
//   make lesson-03                        # 12 epochs, ≥ 99.0% test accuracy
//   make lesson-03 ARGS='--limit 5000'    # a quick look
//
// The network (src/nn/models.cpp, lenet):
//   x [N,1,28,28] -> conv 1→10 k5 -> max-pool 2 -> ReLU -> conv 10→20 k5 -> max-pool 2 -> ReLU
//   -> Flatten [N,320] -> Linear 320→50 -> ReLU -> Linear 50→10
#include <chrono>
#include <cstdio>

#include "core/allocator.h"       // defines: BumpAllocator, memory_summary
#include "nn/models.h"            // defines: lenet (Conv2d, MaxPool2d, ReLU, Linear)
#include "optim/optimizer.h"      // defines: SGD
#include "train/cli.h"            // defines: Cli, CommonFlags
#include "train/batch_size.h"      // defines: print_largest_batch
#include "train/fit.h"            // defines: MnistData, fit, report

using namespace kiln;

int main(int argc, char** argv) try {
    CommonFlags flags;
    flags.epochs = 12;
    flags.lr = 0.05f;
    float momentum = 0.9f;
    Cli cli("lesson-03", "Trains the LeNet of PyTorch's classic MNIST example with SGD + momentum.");
    flags.add_to(cli);
    cli.add("--momentum", &momentum, "SGD momentum");
    cli.parse(argc, argv);
    Device device = flags.apply();
    auto start = std::chrono::steady_clock::now();

    MnistData mnist(flags, device);  // train and test sets and loaders, from --data

    // Each step's activations and workspaces, reset after every step (train/loop.cpp); the
    // arena starts empty and grows to the largest step's size (core/allocator.h).
    BumpAllocator arena("step arena", device);
    Rng rng(flags.seed);
    std::unique_ptr<Sequential> net = lenet(rng);
    Sequential& model = *net;
    model.to(device);
    SGD sgd(model.parameters(), flags.lr, {momentum, 0.0f, 0.0f, false});
    flags.apply_memory_limit(device);  // --mem-limit, now that the model and its optimizer exist
    if (flags.find_batch_size) {  // print the largest batch that fits in --mem-limit, and stop
        print_largest_batch(model, mnist.train);
        return 0;
    }
    std::printf("lesson-03: LeNet, %lld parameters, %lld training images, device %s\n",
                (long long)model.num_parameters(), (long long)mnist.train_set.n, device_name(device));

    double test_acc = fit(model, sgd, mnist.train, mnist.test, flags, &arena);
    report(device, test_acc, start);
    return 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "lesson-03: %s\n", e.what());
    return 1;
}
