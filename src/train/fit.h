// fit.h — what every chapter's trainer does around the training loop: the epochs with their
// learning-rate schedule and evaluation, the final report, and MNIST's loader settings.
//
//   MnistData mnist(flags, device);        // the sets and their loaders
//   double acc = fit(model, sgd, mnist.train, mnist.test, flags.epochs, flags.lr, &arena);
//   report(device, acc, start);          // memory summary, then the result line
#pragma once
#include <chrono>

#include "core/allocator.h"
#include "data/image_set.h"
#include "data/loader.h"
#include "nn/module.h"
#include "optim/optimizer.h"
#include "train/cli.h"

namespace kiln {

// Trains `epochs` epochs, printing the test accuracy after each; returns the last one.
// Schedule (step decay, until chapter 07's schedulers):
//   lr = base_lr               for epoch < max(1, ⌊0.7 · epochs⌋)
//   lr = base_lr / 10          after: the last 30% of the epochs fine-tune
double fit(Module& model, Optimizer& optimizer, DataLoader& train, DataLoader& test, int epochs, float base_lr,
           BumpAllocator* arena);

// Prints the memory summary of the device and, last, the result line:
//   result: test_acc=98.42% time=41.3s peak_mem=12.6MiB
void report(Device device, double test_accuracy, std::chrono::steady_clock::time_point start);

// MNIST batches: pixels normalized with the training set's mean 0.1307 and std 0.3081.
// train = true: shuffled batches of --batch-size from --seed; false: 1000 at a time, in order.
LoaderOptions mnist_loader_options(const CommonFlags& flags, Device device, bool train);

// What an MNIST trainer reads: the training set (--limit images of it, if given) and the
// test set from --data, and a loader for each (mnist_loader_options) delivering to `device`.
struct MnistData {
    MnistData(const CommonFlags& flags, Device device);
    ImageSet train_set, test_set;  // declared before the loaders, which keep references to them
    DataLoader train, test;
};

}  // namespace kiln
