// lesson-01 — softmax regression on MNIST: one Linear layer, and where its memory goes.
//
//   make lesson-01                        # 10 epochs, ≥ 92% test accuracy
//   make lesson-01 ARGS='--limit 2000'    # a quick look
//
// The model (N = batch size):
//   x [N, 1, 28, 28] -> Flatten [N, 784] -> Linear 784→10 -> logits [N, 10] -> softmax
// Before training it prints the tensors it made and what they cost; after, the allocators'
// memory summary.
#include <chrono>
#include <cstdio>

#include "core/allocator.h"       // defines: BumpAllocator, memory_summary, format_bytes
#include "nn/models.h"            // defines: softmax_regression (Flatten, Linear)
#include "optim/optimizer.h"      // defines: SGD
#include "train/cli.h"            // defines: Cli, CommonFlags
#include "train/fit.h"            // defines: MnistData, only_measure, fit, report

using namespace kiln;

int main(int argc, char** argv) try {
    CommonFlags flags;
    flags.epochs = 10;
    flags.lr = 0.05f;
    Cli cli("lesson-01", "Trains softmax regression (one Linear layer) on MNIST with plain SGD; the lr drops\n"
                         "tenfold for the last 30% of the epochs (with --epochs 10: epochs 8-10).");
    flags.add_to(cli);
    cli.parse(argc, argv);
    Device device = flags.apply();
    auto start = std::chrono::steady_clock::now();

    MnistData mnist(flags, device);  // train and test sets and loaders, from --data

    // Each step's activations and workspaces, reset after every step (train/loop.cpp); the
    // arena starts empty and grows to the largest step's size (core/allocator.h).
    BumpAllocator arena("step arena", device);
    Rng rng(flags.seed);
    std::unique_ptr<Sequential> net = softmax_regression(rng);  // see src/nn/models.cpp
    Sequential& model = *net;
    model.to(device);
    SGD sgd(model.parameters(), flags.lr);
    flags.apply_memory_limit(device);  // --mem-limit, now that the model and its optimizer exist
    // --find-batch-size or --time-report N: measure, print, stop (train/fit.h)
    if (only_measure(model, sgd, mnist.train, flags, &arena)) return 0;

    // What the model is made of: each tensor, its dtype, and the bytes it takes.
    std::printf("lesson-01: softmax regression on %lld MNIST images, device %s\n", (long long)mnist.train_set.n,
                device_name(device));
    for (Parameter* p : model.parameters())
        std::printf("  %-10s %-18s %8s (+ the same again for its gradient)\n", p->name.c_str(), p->value.desc().c_str(),
                    format_bytes(int64_t(p->value.nbytes())).c_str());
    std::printf("  as f16 the weight would take %s: %s\n",
                format_bytes(int64_t(model.parameters()[0]->value.to(Device::CPU).to(DType::F16).nbytes())).c_str(),
                "half the bytes, 11 bits of precision instead of 24");

    double test_acc = fit(model, sgd, mnist.train, mnist.test, flags, &arena);
    std::printf("arena: %s used at most per step, of %s\n", format_bytes(int64_t(arena.high_water())).c_str(),
                format_bytes(int64_t(arena.capacity())).c_str());
    report(flags, device, test_acc, start);
    return 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "lesson-01: %s\n", e.what());
    return 1;
}
