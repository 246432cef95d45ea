// lesson-02 — a multi-layer perceptron on MNIST, trained by backpropagation and SGD.
//
//   make lesson-02                       # 10 epochs, ≥ 98% test accuracy
//   make lesson-02 ARGS='--limit 2000'   # a quick look on 2,000 images
//
// The network (N = batch size):
//   x [N, 1, 28, 28] -> Flatten [N, 784] -> Linear 784→512 -> ReLU -> Linear 512→256 -> ReLU
//                    -> Linear 256→10 -> logits [N, 10] -> softmax cross-entropy
#include <chrono>
#include <cstdio>

#include "core/allocator.h"       // defines: BumpAllocator, memory_summary
#include "nn/models.h"            // defines: mlp (Linear, ReLU, Flatten, Sequential)
#include "optim/optimizer.h"      // defines: SGD
#include "train/cli.h"            // defines: Cli, CommonFlags
#include "train/fit.h"            // defines: MnistData, only_measure, fit, report

using namespace kiln;

int main(int argc, char** argv) try {
    CommonFlags flags;
    flags.epochs = 10;
    flags.lr = 0.05f;
    float momentum = 0.9f;
    int64_t hidden1 = 512, hidden2 = 256;
    Cli cli("lesson-02", "Trains a 3-layer perceptron on MNIST with SGD + momentum.");
    flags.add_to(cli);
    cli.add("--momentum", &momentum, "SGD momentum", Cli::between(0, 1));
    cli.add("--hidden1", &hidden1, "units of the first hidden layer", Cli::at_least(1));
    cli.add("--hidden2", &hidden2, "units of the second hidden layer", Cli::at_least(1));
    cli.parse(argc, argv);
    Device device = flags.apply();
    auto start = std::chrono::steady_clock::now();

    MnistData mnist(flags, device);  // train and test sets and loaders, from --data

    // Each step's activations and workspaces, reset after every step (train/loop.cpp); the
    // arena starts empty and grows to the largest step's size (core/allocator.h).
    BumpAllocator arena("step arena", device);

    // Model: weights drawn from the seed, so a run can be repeated exactly.
    Rng rng(flags.seed);
    std::unique_ptr<Sequential> net = mlp(rng, hidden1, hidden2);  // see src/nn/models.cpp
    Sequential& model = *net;
    model.to(device);
    SGD sgd(model.parameters(), flags.lr, SGD::Options{}.with_momentum(momentum));
    flags.apply_memory_limit(device);  // --mem-limit, now that the model and its optimizer exist
    // --find-batch-size or --time-report N: measure, print, stop (train/fit.h)
    if (only_measure(model, sgd, mnist.train, flags, &arena)) return 0;
    std::printf("lesson-02: MLP 784-%lld-%lld-10, %lld parameters, %lld training images, device %s\n",
                (long long)hidden1, (long long)hidden2, (long long)model.num_parameters(),
                (long long)mnist.train_set.n, device_name(device));

    double test_acc = fit(model, sgd, mnist.train, mnist.test, flags, &arena);
    report(flags, device, test_acc, start);
    return 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "lesson-02: %s\n", e.what());
    return 1;
}
