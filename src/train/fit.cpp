// fit.cpp — epochs, schedule, evaluation and the final report (see fit.h).
#include "train/fit.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <optional>

#include "data/cifar.h"
#include "data/idx.h"
#include "ops/autocast.h"
#include "train/batch_size.h"
#include "train/checkpoint.h"
#include "train/evaluate.h"
#include "train/loop.h"
#include "train/memory_trace.h"
#include "train/progress.h"
#include "train/run_log.h"
#include "train/step_graph.h"

namespace kiln {

namespace {

// The test accuracy after an epoch, printed with the lr the epoch started with. With
// opt.test_mirrored the mirror-averaged accuracy (evaluate_with_mirror) is printed too, and is
// the one returned.
double test_epoch(Module& model, DataLoader& test, const TrainOptions& opt, int epoch, float lr) {
    std::optional<AutocastScope> amp;  // --amp: evaluated in the precision it trains in
    if (opt.amp != DType::F32) amp.emplace(opt.amp);
    if (!opt.test_mirrored) {
        double acc = evaluate(model, test, opt.arena);
        std::printf("epoch %d: test accuracy %.2f%% (lr %.4g)\n", epoch + 1, 100 * acc, lr);
        return acc;
    }
    MirrorAccuracy acc = evaluate_with_mirror(model, test, *opt.test_mirrored, opt.arena);
    std::printf("epoch %d: test accuracy %.2f%%, with mirror images %.2f%% (lr %.4g)\n", epoch + 1,
                100 * acc.plain, 100 * acc.averaged, lr);
    return acc.averaged;
}

// Runs work() and raises `peak` to the most memory in use on the device at one moment during it.
template <typename Work>
void measure_peak(Device device, int64_t& peak, Work&& work) {
    reset_phase_peak(device);
    work();
    peak = std::max(peak, device_peaks(device).phase_peak);
}

}  // namespace

// --save DIR of a run that is not the one DIR holds: refused unless --overwrite, so that another
// run's checkpoints (and its run.json) are not replaced by mistake. A checkpoint is any
// DIR/*.safetensors (last and prev, and what a trainer saves besides: lesson-10's pruned.safetensors);
// resuming from DIR's own checkpoint continues the run DIR holds.
void check_save_dir(const TrainOptions& opt) {
    const std::filesystem::path dir(opt.save_dir), last = dir / "last.safetensors";
    std::error_code error;
    std::vector<std::filesystem::path> held;
    for (std::filesystem::directory_iterator it(dir, error), end; !error && it != end; it.increment(error))
        if (it->path().extension() == ".safetensors") held.push_back(it->path());
    if (held.empty() || opt.overwrite) return;
    const std::filesystem::path from = std::filesystem::path(opt.resume).parent_path();
    if (!opt.resume.empty() && std::filesystem::equivalent(from.empty() ? "." : from, dir, error)) return;
    std::sort(held.begin(), held.end());
    const std::filesystem::path named = std::count(held.begin(), held.end(), last) ? last : held.front();
    KILN_FAIL("--save ", opt.save_dir, " holds the checkpoints of another run (", named.string(), "), which this run "
              "would replace. Continue that run with --resume ", named.string(), ", replace it with --overwrite, or "
              "--save another folder");
}

// --resume: loads the checkpoint into the run and returns the epoch to continue with. The
// trainers save at the end of an epoch, so a checkpoint of theirs is never mid-epoch. The data
// order is the checkpoint's: a --seed other than its run's is said to change nothing.
int resume_from(const std::string& path, TrainingRun& run) {
    const uint64_t seed = run.loader->options().seed;
    ResumePoint at = load_checkpoint(path, run);
    KILN_CHECK(at.position == 0, path, ": saved in the middle of epoch ", at.epoch + 1,
               "; the trainers resume only from the end of an epoch (a checkpoint written by --save)");
    std::printf("resumed from %s: epoch %lld done, lr %.4g\n", path.c_str(), (long long)at.epoch, run.optimizer.lr());
    if (run.loader->options().seed != seed)
        std::printf("the data order goes on as the checkpoint's run began it, with its --seed %llu (not %llu)\n",
                    (unsigned long long)run.loader->options().seed, (unsigned long long)seed);
    return int(at.epoch);
}

// --save: save_dir/last.safetensors, replaced atomically after every epoch; the one it
// replaces becomes save_dir/prev.safetensors, so a damaged last checkpoint costs one epoch.
// Not the main process (a data parallel rank but 0): the state is built, nothing is written.
void save_epoch(const std::string& save_dir, TrainingRun& run, int epochs_done, bool main_process) {
    const StateDict state = checkpoint_state(run, ResumePoint{epochs_done, 0, run.optimizer.steps()});
    if (main_process) save_last(save_dir, state);
}

void save_last(const std::string& save_dir, const StateDict& state) {
    std::error_code error;
    std::filesystem::create_directories(save_dir, error);
    KILN_CHECK(!error, "--save ", save_dir, ": cannot create the folder (", error.message(), ")");
    const std::string path = save_dir + "/last.safetensors";
    write_safetensors(path, state, save_dir + "/prev.safetensors");  // last.safetensors is never missing
    std::printf("saved %s\n", path.c_str());
}

std::string RunPeaks::str() const {
    std::string s = "memory peaks: training steps " + format_bytes(training) + ", evaluation " + format_bytes(evaluation);
    if (saving > 0) s += ", saving checkpoints " + format_bytes(saving);
    return s;
}

double fit(Module& model, Optimizer& optimizer, DataLoader& train, DataLoader& test, const TrainOptions& opt) {
    // The schedule as this run lays it out (before --resume loads anything): --resume refuses a
    // checkpoint laid out otherwise.
    const ScheduleRecord schedule =
        record_schedule(optimizer, opt.scheduler, opt.epochs, opt.per_batch ? train.num_batches() : 1);
    TrainingRun run{model, optimizer, opt.scheduler, &train, {}, nullptr, schedule, opt.scaler};
    if (!opt.save_dir.empty() && opt.main_process) check_save_dir(opt);
    const int first = opt.resume.empty() ? 0 : resume_from(opt.resume, run);
    std::optional<RunLog> log;  // run.json and curves.svg; an unwritable folder fails here
    if (!opt.run.trainer.empty() && opt.main_process) log.emplace(opt.run, first);
    // a finished run: its accuracy
    double test_acc = first < opt.epochs ? 0.0 : test_epoch(model, test, opt, first - 1, optimizer.lr());
    const Device device = train.options().device;
    RunPeaks peaks;
    TrainOptions epoch_opt = opt;  // --grad-hist: the first step of the run only
    for (int epoch = first; epoch < opt.epochs; epoch++) {
        const float lr = optimizer.lr();  // the lr this epoch starts with
        EpochResult trained;
        epoch_opt.grad_hist = opt.grad_hist && epoch == first;
        measure_peak(device, peaks.training, [&] { trained = train_epoch(model, optimizer, train, epoch, epoch_opt); });
        if (opt.scheduler && !opt.per_batch) opt.scheduler->step();
        measure_peak(device, peaks.evaluation, [&] { test_acc = test_epoch(model, test, opt, epoch, lr); });
        if (log)
            log->add({epoch + 1, trained.loss, trained.accuracy, test_acc, lr, trained.images_per_second,
                      peak_memory(device), trained.loss_scale, trained.skipped});
        if (!opt.save_dir.empty())
            measure_peak(device, peaks.saving, [&] { save_epoch(opt.save_dir, run, epoch + 1, opt.main_process); });
        std::fflush(stdout);
    }
    if (opt.memory) opt.memory->finish();  // a trace of more steps than the run had
    std::printf("%s\n", peaks.str().c_str());
    return test_acc;
}

// --cuda-graph with what a captured step cannot do (train/step_graph.h), refused before training.
static void check_cuda_graph(const CommonFlags& flags) {
    if (!flags.cuda_graph) return;
    KILN_USAGE_CHECK(flags.device == "cuda", "--cuda-graph captures CUDA kernels: use it with --device cuda");
    KILN_USAGE_CHECK(flags.amp == DType::F32, "--cuda-graph with --amp ", dtype_name(flags.amp),
                     ": only f32 steps are captured; leave out one of them");
    KILN_USAGE_CHECK(!flags.mem_report && flags.mem_trace.empty(),
                     "--cuda-graph with --mem-report or --mem-trace: the recording watches uncaptured steps; "
                     "leave out one of them");
}

FlagTraining train_options(const CommonFlags& flags, Module& model, const Optimizer& optimizer,
                           const DataLoader& train, BumpAllocator* arena) {
    for (const char* flag : {"--epochs", "--lr", "--resume", "--overwrite", "--accumulate"}) flags.use(flag);
    FlagTraining t;
    t.options.epochs = flags.epochs;
    t.options.arena = arena;
    t.options.save_dir = flags.save;
    t.options.resume = flags.resume;
    t.options.overwrite = flags.overwrite;
    t.options.accumulate = flags.accumulate;
    t.options.run = run_info(flags);
    t.options.main_process = flags.rank == 0;
    t.memory = memory_recording(flags, model, optimizer, arena, train);
    t.options.memory = t.memory.get();
    t.scaler = set_precision(flags, t.options);
    t.options.cuda_graph = flags.cuda_graph;
    check_cuda_graph(flags);
    return t;
}

StepOptions step_options(const CommonFlags& flags, BumpAllocator* arena, std::unique_ptr<GradScaler>& scaler) {
    flags.use("--accumulate");
    flags.use("--amp");
    scaler = grad_scaler(flags);
    StepOptions o;
    o.arena = arena;
    o.accumulate = flags.accumulate;
    o.scaler = scaler.get();
    o.amp = flags.amp;
    return o;
}

double fit(Module& model, Optimizer& optimizer, DataLoader& train, DataLoader& test, const CommonFlags& flags,
           BumpAllocator* arena) {
    MultiStepLR decay(optimizer, {std::max(1, flags.epochs * 7 / 10)}, 0.1);
    FlagTraining t = train_options(flags, model, optimizer, train, arena);
    t.options.scheduler = &decay;
    return fit(model, optimizer, train, test, t.options);
}

void print_time_report(const TimeReport& r, int64_t steps_per_epoch, const CommonFlags& flags) {
    flags.use("--time-report");
    flags.use("--time-svg");
    std::printf("%s", format_time_report(r, steps_per_epoch).c_str());
    if (flags.time_svg.empty()) return;
    const std::string program = flags.cli ? flags.cli->program() : "kiln";
    write_time_report_svg(r, flags.time_svg, program + ": one step of batch " + std::to_string(flags.batch_size) +
                                                 ", amp " + dtype_name(flags.amp));
    std::printf("wrote %s\n", flags.time_svg.c_str());
}

// What one step costs the host in launches, and the step's time, over n steps of the loader's
// batch size taken by `step` (after the device has finished what came before; until the device
// has finished them). Stops early at the epoch's end or a smaller batch.
struct StepsTimed {
    int steps = 0;
    double ms_per_step = 0, kernel_launches = 0, graph_launches = 0;  // per step
};
static StepsTimed time_steps(DataLoader& train, LossLog& log, int n, const std::function<void(const Batch&)>& step) {
    Batch batch;
    cuda::synchronize();
    const int64_t k0 = cuda::kernel_launches(), g0 = cuda::graph_launches();
    const auto t0 = std::chrono::steady_clock::now();
    StepsTimed r;
    while (r.steps < n && train.next(batch) && batch.size() == train.options().batch_size) {
        if (log.full()) (void)log.read();
        step(batch);
        log.end_step(batch.size());
        r.steps++;
    }
    (void)log.read();
    cuda::synchronize();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const double k = r.steps > 0 ? 1.0 / r.steps : 0.0;
    r.ms_per_step = ms * k;
    r.kernel_launches = double(cuda::kernel_launches() - k0) * k;
    r.graph_launches = double(cuda::graph_launches() - g0) * k;
    return r;
}

// --time-report N --cuda-graph: after the table (whose steps wait for the device at every layer),
// N steps as training takes them (the loss left on the device), then N through a StepGraph (its
// two uncaptured steps and its capture first, untimed): the time per step and the host's
// launches per step of each.
static void print_graph_steps(Module& model, Optimizer& optimizer, DataLoader& train, const StepOptions& options,
                              int n) {
    LossLog log(Device::CUDA, 32 * options.accumulate);
    StepOptions o = options;
    o.loss_log = &log;
    const StepsTimed plain = time_steps(train, log, n, [&](const Batch& b) { train_step(model, optimizer, b.x, b.y, o); });
    StepGraph graph;
    const auto graph_step = [&](const Batch& b) { graph.step(model, optimizer, b.x, b.y, o); };
    (void)time_steps(train, log, 3, graph_step);  // uncaptured twice, then captured
    const StepsTimed graphed = time_steps(train, log, n, graph_step);
    std::printf("launches per step, and time per step without the layers' waits (host clock, %s, batch %lld):\n",
                cuda::is_emulated() ? "the emulator" : "the GPU", (long long)train.options().batch_size);
    const auto row = [&](const char* how, const StepsTimed& s) {
        const double images_per_s = s.ms_per_step > 0 ? 1e3 * double(train.options().batch_size) / s.ms_per_step : 0;
        std::printf("  %-30s %4d steps %9.3f ms/step %10.0f img/s %6.1f kernel launches %4.1f graph launches\n", how,
                    s.steps, s.ms_per_step, images_per_s, s.kernel_launches, s.graph_launches);
    };
    row("launched kernel by kernel", plain);
    row("one CUDA Graph (--cuda-graph)", graphed);
}

// --time-report N: training steps of the first epoch, the first two untimed (StepTimer's skip),
// until N are timed or the epoch ends; then the table and, with --time-svg, the figure.
static void print_step_times(Module& model, Optimizer& optimizer, DataLoader& train, const CommonFlags& flags,
                             BumpAllocator* arena) {
    check_cuda_graph(flags);
    std::unique_ptr<GradScaler> scaler;
    const StepOptions options = step_options(flags, arena, scaler);
    model.train();
    train.start_epoch(0);
    {
        StepTimer timer(model, train.options().device);  // its hooks wait for the device: gone before a capture
        Batch batch;
        while (timer.steps_timed() < flags.time_report) {
            timer.step_begins();
            if (!train.next(batch)) break;
            timer.batch_loaded();
            train_step(model, optimizer, batch.x, batch.y, options);
            timer.step_ends();
        }
        print_time_report(timer.report(), train.num_batches(), flags);
    }
    if (flags.cuda_graph) print_graph_steps(model, optimizer, train, options, flags.time_report);
}

bool only_measure(Module& model, Optimizer& optimizer, DataLoader& train, const CommonFlags& flags,
                  BumpAllocator* arena) {
    flags.use("--lr");  // the optimizer the trainer built with it takes --time-report's steps
    flags.use("--find-batch-size");
    flags.use("--time-report");
    if (flags.find_batch_size) {
        flags.use("--amp");
        flags.use("--accumulate");
        print_largest_batch(model, optimizer, train, BatchProbeOptions{arena != nullptr, flags.accumulate, flags.amp, &optimizer});
    }
    if (flags.time_report > 0) print_step_times(model, optimizer, train, flags, arena);
    if (flags.measures()) flags.check_used();
    return flags.measures();
}

std::unique_ptr<GradScaler> grad_scaler(const CommonFlags& flags) {
    return flags.amp == DType::F16 ? std::make_unique<GradScaler>() : nullptr;
}

std::unique_ptr<GradScaler> set_precision(const CommonFlags& flags, TrainOptions& opt) {
    flags.use("--amp");
    flags.use("--grad-hist");
    std::unique_ptr<GradScaler> scaler = grad_scaler(flags);
    opt.scaler = scaler.get();
    opt.grad_hist = flags.grad_hist;
    opt.amp = flags.amp;
    return scaler;
}

void report(const CommonFlags& flags, Device device, double test_accuracy,
            std::chrono::steady_clock::time_point start) {
    std::printf("%s", memory_summary(device).c_str());
    const DevicePeaks peaks = device_peaks(device);
    std::printf("peak memory: %s in use at once (peak_mem), %s reserved from the system (what --mem-limit counts)\n",
                format_bytes(peaks.peak).c_str(), format_bytes(peaks.peak_reserved).c_str());
    std::printf("%s\n", result_line(test_accuracy, seconds_since(start), peak_memory(device)).c_str());
    std::fflush(stdout);
    flags.check_used();
}

int64_t test_batch_size(const CommonFlags& flags) { return flags.batch_size / (flags.world_size * flags.accumulate); }

// The training loader's share of the data under data parallel training (CommonFlags::rank).
static void share(LoaderOptions& o, const CommonFlags& flags) {
    o.rank = flags.rank;
    o.world_size = flags.world_size;
    o.batch_size = flags.batch_size / flags.world_size;
}

LoaderOptions mnist_loader_options(const CommonFlags& flags, Device device, bool train) {
    LoaderOptions o{flags.batch_size, true, false, flags.seed, {0.1307f}, {0.3081f}, device};
    if (train) {
        share(o, flags);
    } else {
        o.batch_size = test_batch_size(flags);
        o.shuffle = false;
    }
    return o;
}

// The flags a data set's loaders take.
static const CommonFlags& data_flags(const CommonFlags& flags) {
    for (const char* flag : {"--data", "--limit", "--batch-size", "--seed"}) flags.use(flag);
    return flags;
}

MnistData::MnistData(const CommonFlags& flags, Device device)
    : train_set(take_spread(load_mnist(data_flags(flags).data, true), flags.limit)),
      test_set(load_mnist(flags.data, false)),
      train(train_set, mnist_loader_options(flags, device, true)),
      test(test_set, mnist_loader_options(flags, device, false)) {}

// CIFAR-10's per-channel mean and standard deviation (R, G, B) over the training set.
static LoaderOptions cifar_loader_options(const CommonFlags& flags, Device device, bool train) {
    LoaderOptions o{flags.batch_size, true, true, flags.seed, {0.4914f, 0.4822f, 0.4465f},
                    {0.2470f, 0.2435f, 0.2616f}, device};
    if (train) {
        o.transforms = {std::make_shared<RandomCrop>(32, 4), std::make_shared<RandomHorizontalFlip>()};
        share(o, flags);
    } else {
        o.batch_size = test_batch_size(flags);
        o.shuffle = false;
        o.drop_last = false;
    }
    return o;
}

// The same loader, every image flipped left to right (p = 1).
static LoaderOptions mirrored(LoaderOptions o) {
    o.transforms = {std::make_shared<RandomHorizontalFlip>(1.0f)};
    return o;
}

CifarData::CifarData(const CommonFlags& flags, Device device)
    : train_set(take_spread(load_cifar10(data_flags(flags).data, true), flags.limit)),
      test_set(load_cifar10(flags.data, false)),
      train(train_set, cifar_loader_options(flags, device, true)),
      test(test_set, cifar_loader_options(flags, device, false)),
      test_mirrored(test_set, mirrored(cifar_loader_options(flags, device, false))) {}

}  // namespace kiln
