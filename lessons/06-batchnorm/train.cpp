// lesson-06 — a convolutional net with batch normalization on CIFAR-10, on the CPU.
//
//   make lesson-06                        # 10 epochs, ≥ 80% test accuracy
//   make lesson-06 ARGS='--no-bn'         # the same net without batch norm, to compare
//   make lesson-06 ARGS='--limit 5000 --epochs 2'   # a quick look
//   make lesson-06 ARGS='--recompute --accumulate 2'  # less memory (chapter 08)
//   make lesson-06 ARGS='--fuse'          # each BN with its GELU (and the max-pool before it) as
//                                         # one layer: the same bits, fewer launches, less kept
//
// The network (src/nn/models.cpp, cifar_net), widths 32/64/128 by default:
//   x [N,3,32,32] -> conv 2×2 3→24, GELU -> 3 × block(conv 3×3, max-pool 2, BN, GELU,
//   conv 3×3, BN, GELU) -> max-pool 3 -> Flatten -> Linear 128→10
// Augmentation: random crops (padding 4) and horizontal flips.
#include <chrono>
#include <cstdio>
#include <optional>

#include "core/allocator.h"       // defines: BumpAllocator, memory_summary
#include "nn/fuse.h"              // defines: fuse_batchnorm_gelu, fuse_maxpool_batchnorm
#include "nn/models.h"            // defines: cifar_net (Conv2d, BatchNorm2d, GELU, MaxPool2d, Linear)
#include "optim/optimizer.h"      // defines: SGD
#include "train/cli.h"            // defines: Cli, CommonFlags
#include "train/fit.h"            // defines: CifarData, only_measure, fit, report

using namespace kiln;

int main(int argc, char** argv) try {
    CommonFlags flags;
    flags.epochs = 10;
    flags.batch_size = 128;
    flags.lr = 0.05f;
    flags.data = "data/cifar10";
    bool no_bn = false, recompute = false, fuse = false;
    float weight_decay = 5e-4f;
    CifarNetWidths widths{32, 64, 128};
    Cli cli("lesson-06", "Trains a CNN with batch normalization on CIFAR-10 (SGD, Nesterov momentum 0.9).");
    flags.add_to(cli);
    cli.add("--no-bn", &no_bn, "leave the batch-norm layers out (the convolutions get biases)");
    cli.add("--recompute", &recompute, "keep only each block's input, recompute the block in backward (less memory, more time; no step arena)");
    cli.add("--fuse", &fuse, "run each batch norm, the GELU after it and a 2x2 max-pool before it as one layer (nn/fuse.h): one kernel each way, less kept, the same bits");
    cli.add("--weight-decay", &weight_decay, "L2 weight decay", Cli::at_least(0));
    cli.add("--width1", &widths.w1, "channels of block 1", Cli::at_least(1));
    cli.add("--width2", &widths.w2, "channels of block 2", Cli::at_least(1));
    cli.add("--width3", &widths.w3, "channels of block 3", Cli::at_least(1));
    cli.parse(argc, argv);
    Device device = flags.apply();
    KILN_USAGE_CHECK(!(fuse && no_bn), "--fuse joins batch norms to their GELUs; with --no-bn there are none: drop one of the two");
    auto start = std::chrono::steady_clock::now();

    CifarData cifar(flags, device);  // crops and flips for training (train/fit.h)

    // Each step's activations and workspaces, reset after every step (train/loop.cpp); the
    // arena starts empty and grows to the largest step's size (core/allocator.h). Not with
    // --recompute: an arena frees nothing before its reset, so the activations a Checkpoint
    // frees would not be reused; the pool reuses them (nn/recompute.h).
    std::optional<BumpAllocator> arena;
    if (!recompute) arena.emplace("step arena", device);
    Rng rng(flags.seed);
    std::unique_ptr<Sequential> net = cifar_net(rng, widths, !no_bn, recompute);
    Sequential& model = *net;
    if (fuse) {
        fuse_maxpool_batchnorm(model);
        fuse_batchnorm_gelu(model);
    }
    model.to(device);
    SGD sgd(model.parameters(), flags.lr,
            SGD::Options{}.with_momentum(0.9f).with_weight_decay(weight_decay).with_nesterov());
    flags.apply_memory_limit(device);  // --mem-limit, now that the model and its optimizer exist
    // --find-batch-size or --time-report N: measure, print, stop (train/fit.h)
    if (only_measure(model, sgd, cifar.train, flags, arena ? &*arena : nullptr)) return 0;
    std::printf("lesson-06: %s%s, widths %lld/%lld/%lld, %lld parameters, %lld training images, device %s\n",
                model.name().c_str(), fuse ? " (max-pool, batch norm and GELU fused)" : "", (long long)widths.w1,
                (long long)widths.w2, (long long)widths.w3,
                (long long)model.num_parameters(), (long long)cifar.train_set.n, device_name(device));

    double test_acc = fit(model, sgd, cifar.train, cifar.test, flags, arena ? &*arena : nullptr);
    report(flags, device, test_acc, start);
    return 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "lesson-06: %s\n", e.what());
    return 1;
}
