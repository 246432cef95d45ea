// lesson-03 — the LeNet of PyTorch's classic MNIST example, on the CPU: im2col + GEMM, pooling.
//
//   make lesson-03                        # 12 epochs, ≥ 99.0% test accuracy
//   make lesson-03 ARGS='--limit 5000'    # a quick look
//
// The network (src/nn/models.cpp, lenet):
//   x [N,1,28,28] -> conv 1→10 k5 -> max-pool 2 -> ReLU -> conv 10→20 k5 -> max-pool 2 -> ReLU
//   -> Flatten [N,320] -> Linear 320→50 -> ReLU -> Linear 50→10
//
// After training it draws, next to run.json and curves.svg (--save DIR, else runs/lesson-03/):
//   conv1-filters.png   what the first layer learned: its 10 filters of 5×5 weights
//   misclassified.png   test digits the network gets wrong, each with its prediction and label
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "core/allocator.h"       // defines: BumpAllocator, memory_summary
#include "io/images.h"            // defines: Image, grey_tile, grid, with_caption, save_png
#include "nn/models.h"            // defines: lenet (Conv2d, MaxPool2d, ReLU, Linear)
#include "ops/ops.h"              // defines: argmax_rows
#include "optim/optimizer.h"      // defines: SGD
#include "train/cli.h"            // defines: Cli, CommonFlags
#include "train/fit.h"            // defines: MnistData, only_measure, fit, report
#include "train/run_log.h"        // defines: run_info (the run's folder)

using namespace kiln;

namespace {

// conv1's weights [10, 1, 5, 5] as 10 tiles in a row, each 5×5 filter 12× larger and in its own
// grey range: its most negative weight black, its most positive white.
void save_filters(Module& model, const std::string& path) {
    Tensor w;
    for (auto& [name, p] : model.named_parameters())
        if (name == "conv1.weight") w = p->value.to(Device::CPU);
    std::vector<Image> tiles;
    for (int64_t o = 0; o < w.shape()[0]; o++) tiles.push_back(grey_tile(w.data<float>() + o * 25, 5, 5, 12));
    save_png(grid(tiles, 10, 6, {90, 90, 90}), path);
    std::printf("wrote %s\n", path.c_str());
}

// The first 32 test digits the model gets wrong, 3× larger, each captioned "pred P true T",
// in rows of 8. The test loader runs in order, so batch position + row is the image's index.
void save_misclassified(Module& model, DataLoader& test, const ImageSet& test_set, const std::string& path) {
    model.eval();
    test.start_epoch(0);
    std::vector<Image> tiles;
    std::vector<float> digit(28 * 28);
    Batch b;
    for (int64_t first = 0; tiles.size() < 32 && test.next(b); first += b.size()) {
        Tensor pred = argmax_rows(model.call(b.x)).to(Device::CPU);  // [N]
        for (int64_t i = 0; i < b.size() && tiles.size() < 32; i++) {
            const int64_t image = first + i;
            const int32_t p = pred.data<int32_t>()[i], t = test_set.labels[size_t(image)];
            if (p == t) continue;
            const uint8_t* pixels = &test_set.pixels[size_t(image) * digit.size()];
            digit.assign(pixels, pixels + digit.size());
            std::string caption = "pred " + std::to_string(p) + " true " + std::to_string(t);
            tiles.push_back(with_caption(grey_tile(digit.data(), 28, 28, 3), caption, kRed));
        }
    }
    model.train();
    if (tiles.empty()) return;  // nothing wrong: no picture
    save_png(grid(tiles, 8, 4, {90, 90, 90}), path);
    std::printf("wrote %s (%zu misclassified test images)\n", path.c_str(), tiles.size());
}

}  // namespace

int main(int argc, char** argv) try {
    CommonFlags flags;
    flags.epochs = 12;
    flags.lr = 0.05f;
    float momentum = 0.9f;
    Cli cli("lesson-03", "Trains the LeNet of PyTorch's classic MNIST example with SGD + momentum.");
    flags.add_to(cli);
    cli.add("--momentum", &momentum, "SGD momentum", Cli::between(0, 1));
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
    SGD sgd(model.parameters(), flags.lr, SGD::Options{}.with_momentum(momentum));
    flags.apply_memory_limit(device);  // --mem-limit, now that the model and its optimizer exist
    // --find-batch-size or --time-report N: measure, print, stop (train/fit.h)
    if (only_measure(model, sgd, mnist.train, flags, &arena)) return 0;
    std::printf("lesson-03: LeNet, %lld parameters, %lld training images, device %s\n",
                (long long)model.num_parameters(), (long long)mnist.train_set.n, device_name(device));

    double test_acc = fit(model, sgd, mnist.train, mnist.test, flags, &arena);
    const std::string dir = run_info(flags).dir;
    save_filters(model, dir + "/conv1-filters.png");
    save_misclassified(model, mnist.test, mnist.test_set, dir + "/misclassified.png");
    report(flags, device, test_acc, start);
    return 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "lesson-03: %s\n", e.what());
    return 1;
}
