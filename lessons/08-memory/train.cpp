// lesson-08 — chapter 06's CIFAR net trained under a memory limit that its plain run exceeds
// by more than 2×, with the ways to fit that this chapter teaches:
//   recomputation       each block keeps only its input and recomputes itself in backward
//                       (nn/recompute.h), so the activations kept are a few blocks' inputs
//   micro-batches       --accumulate 4: four micro-batches of 32 per optimizer step of 128
//                       (train/loop.h), so every activation is a quarter of the size
//   a smaller workspace --workspace-limit 4MiB: im2col's columns for fewer images at a time
//
//   make lesson-08                                    # 10 epochs under --mem-limit 48MiB, ≥ 80%
//   make lesson-08 ARGS='--limit 2560 --epochs 1'     # a quick look
//   make lesson-08 ARGS='--plain --mem-limit 0 --accumulate 1 --limit 2560 --epochs 1'
//                                                     # chapter 06's way, for the peak to compare
#include <chrono>
#include <cstdio>
#include <optional>

#include "core/allocator.h"       // defines: BumpAllocator, parse_bytes
#include "nn/conv.h"              // defines: set_conv_workspace_limit
#include "nn/models.h"            // defines: cifar_net (with recompute), CifarNetWidths
#include "optim/optimizer.h"      // defines: SGD
#include "train/cli.h"            // defines: Cli, CommonFlags
#include "train/fit.h"            // defines: CifarData, only_measure, fit, report

using namespace kiln;

int main(int argc, char** argv) try {
    CommonFlags flags;
    flags.epochs = 10;
    flags.batch_size = 128;
    flags.accumulate = 4;
    flags.lr = 0.05f;
    flags.data = "data/cifar10";
    flags.mem_limit = "48MiB";
    flags.mem_report = true;  // where the first step's memory goes, module by module
    bool plain = false;
    std::string workspace = "4MiB";
    float weight_decay = 5e-4f;
    CifarNetWidths widths{32, 64, 128};
    Cli cli("lesson-08", "Trains lesson 06's CNN under a memory limit: recomputation, micro-batches, a small workspace.");
    flags.add_to(cli);
    cli.add("--plain", &plain, "no recomputation, the step arena and the default workspace, as lesson 06");
    cli.add_size("--workspace-limit", &workspace, "bytes of im2col columns a convolution computes at once (not with --plain)");
    cli.add("--weight-decay", &weight_decay, "L2 weight decay", Cli::at_least(0));
    cli.parse(argc, argv);
    KILN_USAGE_CHECK(!plain || !cli.given("--workspace-limit"), "--plain keeps chapter 06's workspace; "
                     "--workspace-limit is for the recomputed run (drop --plain, or the limit)");
    Device device = flags.apply();
    auto start = std::chrono::steady_clock::now();

    CifarData cifar(flags, device);
    // With recomputation the pool serves each step (it reuses what a recomputed block frees; an
    // arena would not); the plain run uses lesson 06's step arena.
    std::optional<BumpAllocator> arena;
    if (plain) arena.emplace("step arena", device);
    Rng rng(flags.seed);
    std::unique_ptr<Sequential> net = cifar_net(rng, widths, true, /*recompute=*/!plain);
    Sequential& model = *net;
    if (!plain) set_conv_workspace_limit(model, parse_bytes(workspace));
    model.to(device);
    SGD sgd(model.parameters(), flags.lr,
            SGD::Options{}.with_momentum(0.9f).with_weight_decay(weight_decay).with_nesterov());
    flags.apply_memory_limit(device);  // --mem-limit, now that the model and its optimizer exist
    // --find-batch-size or --time-report N: measure, print, stop (train/fit.h)
    if (only_measure(model, sgd, cifar.train, flags, arena ? &*arena : nullptr)) return 0;
    std::printf("lesson-08: %s, %lld parameters, batch %lld as %d micro-batches, %s, %lld training images, "
                "limit %s, device %s\n",
                model.name().c_str(), (long long)model.num_parameters(), (long long)flags.batch_size,
                flags.accumulate, plain ? "plain" : ("recompute, workspace " + workspace).c_str(),
                (long long)cifar.train_set.n, flags.mem_limit.empty() ? "none" : flags.mem_limit.c_str(),
                device_name(device));

    double test_acc = fit(model, sgd, cifar.train, cifar.test, flags, arena ? &*arena : nullptr);
    report(flags, device, test_acc, start);
    return 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "lesson-08: %s\n", e.what());
    return 1;
}
