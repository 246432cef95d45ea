// fit.cpp — epochs, schedule, evaluation and the final report (see fit.h).
#include "train/fit.h"

#include <algorithm>
#include <cstdio>

#include "data/idx.h"
#include "train/evaluate.h"
#include "train/loop.h"
#include "train/progress.h"

namespace kiln {

double fit(Module& model, Optimizer& optimizer, DataLoader& train, DataLoader& test, int epochs, float base_lr,
           BumpAllocator* arena) {
    double test_acc = 0;
    for (int epoch = 0; epoch < epochs; epoch++) {
        optimizer.set_lr(epoch < std::max(1, epochs * 7 / 10) ? base_lr : base_lr * 0.1f);
        train_epoch(model, optimizer, train, epoch, epochs, arena);
        test_acc = evaluate(model, test);
        std::printf("epoch %d: test accuracy %.2f%%\n", epoch + 1, 100 * test_acc);
        std::fflush(stdout);
    }
    return test_acc;
}

void report(Device device, double test_accuracy, std::chrono::steady_clock::time_point start) {
    std::printf("%s", memory_summary(device).c_str());
    std::printf("%s\n", result_line(test_accuracy, seconds_since(start), peak_memory(device)).c_str());
}

LoaderOptions mnist_loader_options(const CommonFlags& flags, Device device, bool train) {
    LoaderOptions o{flags.batch_size, true, false, flags.seed, {0.1307f}, {0.3081f}, device};
    if (!train) {
        o.batch_size = 1000;
        o.shuffle = false;
    }
    return o;
}

MnistData::MnistData(const CommonFlags& flags, Device device)
    : train_set(take_spread(load_mnist(flags.data, true), flags.limit)),
      test_set(load_mnist(flags.data, false)),
      train(train_set, mnist_loader_options(flags, device, true)),
      test(test_set, mnist_loader_options(flags, device, false)) {}

}  // namespace kiln
