// lesson-13-mobilenet — MobileNetV2 (Sandler et al., 2018) on CIFAR-10: the lightweight-model
// answer to small devices, beside the capstone's fast net (train.cpp).
//
//   make lesson-13-mobilenet                         # width 1.0: 2.24 M parameters, 10 epochs
//   make lesson-13-mobilenet ARGS='--width 0.5'      # 0.70 M parameters
//   make lesson-13-mobilenet ARGS='--limit 2048 --epochs 1 --mem-report'   # a quick look, and its memory
//   make lesson-13-mobilenet ARGS='--save runs/13-mobilenet'   # a checkpoint after every epoch (--resume
//                                                               # continues), which lesson-10 prunes and
//                                                               # lesson-11 quantizes (--model mobilenet)
//
// The network (nn/models.h, mobilenet_v2): a 3×3 stem, 17 inverted residual blocks
//   x -> 1×1 conv C → t·C (expand) -> BN -> ReLU6 -> 3×3 depthwise conv (one filter per channel,
//        stride s) -> BN -> ReLU6 -> 1×1 conv t·C → C' (project) -> BN      (+ x when s = 1, C = C')
// then a 1×1 conv to 1280, global average pooling and a linear head. Where a plain 3×3 conv
// C → C' costs 9·C·C' multiply-adds per pixel, the block's depthwise conv costs 9·t·C and its two
// 1×1 convs t·C·(C + C'): the parameters and flops move into 1×1 convs (GEMMs) and the spatial
// work into a cheap per-channel filter. Activations, though, grow t = 6 times inside each block.
//
// Trained the chapter-07 way (SGD with Nesterov momentum, weight decay on the weights only, a
// one-cycle schedule stepped every batch, random crops and flips), with the capstone's label
// smoothing; fit (train/fit.h) prints each epoch, the memory peaks and the result line.
#include <chrono>
#include <cstdio>
#include <memory>

#include "core/allocator.h"       // defines: BumpAllocator
#include "nn/models.h"            // defines: mobilenet_v2
#include "optim/optimizer.h"      // defines: SGD, decay_groups
#include "optim/scheduler.h"      // defines: OneCycleLR
#include "train/cli.h"            // defines: Cli, CommonFlags
#include "train/fit.h"            // defines: CifarData, only_measure, train_options, fit, report

using namespace kiln;

int main(int argc, char** argv) try {
    CommonFlags flags;
    flags.epochs = 10;
    flags.batch_size = 128;
    flags.lr = 0.1f;  // the one-cycle schedule's peak
    flags.data = "data/cifar10-png";
    float width = 1.0f, weight_decay = 5e-4f, smoothing = 0.1f;
    Cli cli("lesson-13-mobilenet", "Trains MobileNetV2 (inverted residuals, depthwise convolutions, ReLU6) on CIFAR-10.");
    flags.add_to(cli);
    cli.add("--width", &width, "width multiplier: every block's channels × this (rounded to multiples of 8)", Cli::positive());
    cli.add("--weight-decay", &weight_decay, "L2 weight decay on the weights (not on biases and BN)", Cli::at_least(0));
    cli.add("--label-smoothing", &smoothing, "label smoothing ε", Cli::between(0, 1));
    cli.parse(argc, argv);
    const Device device = flags.apply();
    const auto start = std::chrono::steady_clock::now();

    CifarData cifar(flags, device);
    BumpAllocator arena("step arena", device);
    Rng rng(flags.seed);
    std::unique_ptr<Sequential> model = mobilenet_v2(rng, 10, width);
    model->to(device);
    SGD sgd(decay_groups(*model, flags.lr, weight_decay), SGD::Options{}.with_momentum(0.9f).with_nesterov());
    flags.apply_memory_limit(device);
    if (only_measure(*model, sgd, cifar.train, flags, &arena)) return 0;  // --find-batch-size, --time-report
    OneCycleLR schedule(sgd, flags.lr, int64_t(flags.epochs) * cifar.train.num_batches());
    std::printf("lesson-13-mobilenet: %s width %.2f, %lld parameters, batch %lld, %lld training images, device %s\n",
                model->name().c_str(), double(width), (long long)model->num_parameters(), (long long)flags.batch_size,
                (long long)cifar.train_set.n, device_name(device));

    // the shared flags (--save and --resume, --accumulate, --mem-report, --amp, ...), then its own
    FlagTraining train = train_options(flags, *model, sgd, cifar.train, &arena);
    train.options.scheduler = &schedule, train.options.per_batch = true;  // the one-cycle lr moves every batch
    train.options.test_mirrored = &cifar.test_mirrored;
    train.options.label_smoothing = smoothing;
    const double acc = fit(*model, sgd, cifar.train, cifar.test, train.options);
    report(flags, device, acc, start);
    return 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "lesson-13-mobilenet: %s\n", e.what());
    return 1;
}
