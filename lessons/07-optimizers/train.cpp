// lesson-07 — optimizers and learning-rate schedules: CIFAR-10 on the CPU, 89.28% (target ≥ 88%).
//
//   make lesson-07                                   # SGD + Nesterov, one-cycle schedule, 24 epochs
//   make lesson-07 ARGS='--optimizer adamw --lr 0.004 --weight-decay 0.05'
//   make lesson-07 ARGS='--schedule cosine --warmup 2'   # linear warm-up, then cosine
//   make lesson-07 ARGS='--save runs/07'             # a checkpoint after every epoch (and the log)
//   make lesson-07 ARGS='--resume runs/07/last.safetensors'   # continue exactly where it stopped
//   make lesson-07 ARGS='--recompute --accumulate 2'   # less memory (chapter 08)
//
// The network is lesson 06's (src/nn/models.cpp, cifar_net), wider: 48/96/192 channels.
// What this chapter changes is the training: the optimizer (SGD with Nesterov momentum, Adam
// or AdamW), weight decay on the weights only (decay_groups), and the schedule, stepped after
// every batch (optim/scheduler.h).
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "core/allocator.h"       // defines: BumpAllocator
#include "nn/models.h"            // defines: cifar_net
#include "optim/adam.h"           // defines: Adam, AdamW
#include "optim/optimizer.h"      // defines: SGD, decay_groups
#include "optim/scheduler.h"      // defines: OneCycleLR, LinearLR, CosineAnnealingLR, SequentialLR
#include "train/cli.h"            // defines: Cli, CommonFlags
#include "train/fit.h"            // defines: CifarData, only_measure, train_options, fit, report

using namespace kiln;

namespace {

struct Flags {
    CommonFlags common;
    std::string optimizer = "sgd";    // sgd | adam | adamw
    std::string schedule = "onecycle";  // onecycle | cosine
    int warmup = 0;                   // cosine: epochs of linear warm-up first
    float momentum = 0.9f, weight_decay = 5e-4f, clip = 0.0f;
    bool no_tta = false;              // score the test images only as they are
    bool recompute = false;           // Checkpoint each block (nn/recompute.h)
    CifarNetWidths widths{48, 96, 192};
};

// The optimizer, its weight decay on the weights only: biases and batch norm's γ, β get none.
std::unique_ptr<Optimizer> make_optimizer(const Flags& f, Module& model) {
    std::vector<ParamGroup> groups = decay_groups(model, f.common.lr, f.weight_decay);
    if (f.optimizer == "sgd") return std::make_unique<SGD>(groups,
                                                           SGD::Options{}.with_momentum(f.momentum).with_nesterov());
    if (f.optimizer == "adam") return std::make_unique<Adam>(groups, Adam::Options{});
    if (f.optimizer == "adamw") return std::make_unique<AdamW>(groups, Adam::Options{});  // the decay: in groups
    KILN_FAIL("lesson-07: unknown --optimizer \"", f.optimizer, "\"; use sgd, adam or adamw");
}

// The schedule, stepped after every batch: one cycle (up for 30% of the steps, then down to
// almost 0), or a linear warm-up followed by a cosine to 0. `parts` keeps SequentialLR's parts.
std::unique_ptr<LRScheduler> make_schedule(const Flags& f, Optimizer& opt, int64_t steps_per_epoch,
                                           std::vector<std::unique_ptr<LRScheduler>>& parts) {
    const int64_t total = f.common.epochs * steps_per_epoch, warm = f.warmup * steps_per_epoch;
    if (f.schedule == "onecycle") return std::make_unique<OneCycleLR>(opt, f.common.lr, total);
    KILN_CHECK(f.schedule == "cosine", "lesson-07: unknown --schedule \"", f.schedule, "\"; use onecycle or cosine");
    if (warm == 0) return std::make_unique<CosineAnnealingLR>(opt, total);
    KILN_USAGE_CHECK(warm < total, "--warmup ", f.warmup, " must be fewer than --epochs ", f.common.epochs);
    parts.push_back(std::make_unique<LinearLR>(opt, 0.01, 1.0, warm));
    parts.push_back(std::make_unique<CosineAnnealingLR>(opt, total - warm));
    return std::make_unique<SequentialLR>(opt, std::vector<LRScheduler*>{parts[0].get(), parts[1].get()},
                                          std::vector<int64_t>{warm});
}

}  // namespace

int main(int argc, char** argv) try {
    Flags f;
    f.common.epochs = 24;
    f.common.batch_size = 128;
    f.common.lr = 0.1f;
    f.common.data = "data/cifar10";
    Cli cli("lesson-07", "Trains lesson 06's CNN, wider, on CIFAR-10 with a chosen optimizer and schedule.");
    f.common.add_to(cli);
    cli.add("--optimizer", &f.optimizer, "sgd (Nesterov momentum), adam or adamw", {"sgd", "adam", "adamw"});
    cli.add("--schedule", &f.schedule, "onecycle (--lr is the peak) or cosine (from --lr to 0)", {"onecycle", "cosine"});
    cli.add("--warmup", &f.warmup, "cosine: epochs of linear warm-up from lr/100 first", Cli::at_least(0));
    cli.add("--momentum", &f.momentum, "SGD's momentum", Cli::between(0, 1));
    cli.add("--weight-decay", &f.weight_decay, "weight decay of the weights (L2 for sgd and adam, decoupled for adamw)", Cli::at_least(0));
    cli.add("--clip", &f.clip, "clip the gradients' global norm to this (0: no clipping)", Cli::at_least(0));
    cli.add("--no-tta", &f.no_tta, "score the test images only as they are, not also with their mirror images");
    cli.add("--recompute", &f.recompute, "keep only each block's input, recompute the block in backward (less memory, more time; no step arena)");
    cli.add("--width1", &f.widths.w1, "channels of block 1", Cli::at_least(1));
    cli.add("--width2", &f.widths.w2, "channels of block 2", Cli::at_least(1));
    cli.add("--width3", &f.widths.w3, "channels of block 3", Cli::at_least(1));
    cli.parse(argc, argv);
    KILN_USAGE_CHECK(f.schedule == "cosine" || !cli.given("--warmup"), "--warmup is the cosine schedule's: add "
                     "--schedule cosine (one-cycle warms up by itself)");
    KILN_USAGE_CHECK(f.optimizer == "sgd" || !cli.given("--momentum"), "--momentum is SGD's; --optimizer ", f.optimizer,
                     " keeps its own moments");
    Device device = f.common.apply();
    auto start = std::chrono::steady_clock::now();

    CifarData cifar(f.common, device);
    // Each step's activations and workspaces, reset after every step (train/loop.cpp); the
    // arena starts empty and grows to the largest step's size (core/allocator.h). Not with
    // --recompute: an arena frees nothing before its reset, so the activations a Checkpoint
    // frees would not be reused; the pool reuses them (nn/recompute.h).
    std::optional<BumpAllocator> arena;
    if (!f.recompute) arena.emplace("step arena", device);
    Rng rng(f.common.seed);
    std::unique_ptr<Sequential> model = cifar_net(rng, f.widths, true, f.recompute);
    model->to(device);
    std::unique_ptr<Optimizer> opt = make_optimizer(f, *model);
    f.common.apply_memory_limit(device);  // --mem-limit, now that the model and its optimizer exist
    // --find-batch-size or --time-report N: measure, print, stop (train/fit.h)
    if (only_measure(*model, *opt, cifar.train, f.common, arena ? &*arena : nullptr)) return 0;
    std::vector<std::unique_ptr<LRScheduler>> parts;
    std::unique_ptr<LRScheduler> schedule = make_schedule(f, *opt, cifar.train.num_batches(), parts);
    std::printf("lesson-07: %s %lld/%lld/%lld, %lld parameters, %s + %s, %lld training images, device %s\n",
                model->name().c_str(), (long long)f.widths.w1, (long long)f.widths.w2, (long long)f.widths.w3,
                (long long)model->num_parameters(), f.optimizer.c_str(), f.schedule.c_str(),
                (long long)cifar.train_set.n, device_name(device));

    // the shared flags (--save, --resume, --accumulate, --mem-report, --amp, ...), then this chapter's
    FlagTraining train = train_options(f.common, *model, *opt, cifar.train, arena ? &*arena : nullptr);
    train.options.scheduler = schedule.get();
    train.options.per_batch = true;
    train.options.clip_norm = f.clip;
    train.options.test_mirrored = f.no_tta ? nullptr : &cifar.test_mirrored;
    double test_acc = fit(*model, *opt, cifar.train, cifar.test, train.options);
    report(f.common, device, test_acc, start);
    return 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "lesson-07: %s\n", e.what());
    return 1;
}
