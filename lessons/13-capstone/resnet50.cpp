// lesson-13-resnet50 — the memory plan of a ResNet-50 for CIFAR-100 (23.7 million parameters):
// what one training step holds at batch 32, 128 and 256, in f32 and bf16, with and without
// recomputation, predicted (chapter 08's memory model) beside measured (real steps, on random
// images: the memory does not depend on the pixels), and per rank under ZeRO-1 (chapter 12).
//
//   make lesson-13-resnet50                           # the whole table (several minutes)
//   make lesson-13-resnet50 ARGS='--batch-sizes 32'   # one batch size
//   make lesson-13-resnet50 ARGS='--measure-up-to 0'  # predictions only (seconds)
//
// Each measured row runs --steps training steps (SGD with momentum, like chapter 07) and reports
// the last: the most bytes in use at once during it (device_peaks, all allocators of the device:
// parameters, gradients, momentum, batch, activations, workspaces) and its time. Without
// recomputation the activations come from a step arena, as in the chapter trainers; with it from
// the pool, which reuses what each recomputed block frees (an arena frees nothing until its reset).
// The memory model replays f32 steps only; the bf16 rows are measured alone.
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "core/allocator.h"    // defines: BumpAllocator, device_peaks, reset_phase_peak, format_bytes
#include "dist/zero.h"         // defines: zero_state_elements, zero_memory_table
#include "nn/models.h"         // defines: resnet50
#include "optim/optimizer.h"   // defines: SGD
#include "train/cli.h"         // defines: Cli
#include "train/loop.h"        // defines: train_step, StepOptions
#include "train/memory_model.h"  // defines: predict_memory, memory_model_options

using namespace kiln;

namespace {

struct Flags {
    std::string batch_sizes = "32,128,256";
    int64_t measure_up_to = 256;  // measure batches up to this size; predict the rest
    int steps = 2;                // real steps per measured row; the last is reported
    int64_t classes = 100;
    int threads = 0;
};

std::vector<int64_t> parse_list(const std::string& text) {
    std::vector<int64_t> out;
    std::stringstream in(text);
    std::string item;
    while (std::getline(in, item, ',')) {
        const bool digits = !item.empty() && item.size() <= 9 && item.find_first_not_of("0123456789") == std::string::npos;
        KILN_USAGE_CHECK(digits && std::stoll(item) > 0, "--batch-sizes '", text, "' must be positive whole numbers "
                         "(below 10^9) separated by commas");
        out.push_back(std::stoll(item));
    }
    return out;
}

struct Measured {
    int64_t peak = 0;
    double seconds = 0;
};

// `steps` training steps of `model` on random images of batch n; the last one's peak and time.
Measured measure(Module& model, SGD& sgd, int64_t n, int64_t classes, DType amp, bool arena, int steps) {
    Rng rng(7);
    const Tensor x = Tensor::normal({n, 3, 32, 32}, 0.0f, 1.0f, rng);
    Tensor y = Tensor::empty({n}, DType::I32);
    for (int64_t i = 0; i < n; i++) y.data<int32_t>()[i] = int32_t(i % classes);
    std::optional<BumpAllocator> step_arena;
    if (arena) step_arena.emplace("step arena", Device::CPU);
    const StepOptions options{step_arena ? &*step_arena : nullptr, 0.0f, 1, nullptr, amp, 0.0f};
    Measured m;
    for (int s = 0; s < steps; s++) {
        reset_phase_peak(Device::CPU);
        const auto t0 = std::chrono::steady_clock::now();
        const StepResult r = train_step(model, sgd, x, y, options);
        KILN_CHECK(r.finite(), "lesson-13-resnet50: a step of batch ", n, " gave a non-finite loss");
        m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        m.peak = device_peaks(Device::CPU).phase_peak;
    }
    return m;
}

// The memory model's peak for one f32 step of batch n; with `world` > 1, rank 0's under ZeRO-1.
int64_t predict(Module& model, const SGD& sgd, int64_t n, bool arena, int world) {
    MemoryModelOptions o = memory_model_options(model, sgd, Shape{n, 3, 32, 32}, Device::CPU, arena, DType::F32);
    if (world > 1) o.state_elements = zero_state_elements(model, 0, world);
    return predict_memory(model, o).peak;
}

}  // namespace

int main(int argc, char** argv) try {
    Flags f;
    Cli cli("lesson-13-resnet50", "The memory of a ResNet-50 (CIFAR-100) training step: batch sizes, f32/bf16, recomputation, ZeRO-1; predicted and measured.");
    cli.add("--batch-sizes", &f.batch_sizes, "the batch sizes of the table, comma-separated");
    cli.add("--measure-up-to", &f.measure_up_to, "measure real steps for batches up to this size (0: predict only)", Cli::at_least(0));
    cli.add("--steps", &f.steps, "real steps per measured row (the last is reported: the first also fills caches)", Cli::at_least(1));
    cli.add("--classes", &f.classes, "the head's classes (CIFAR-100: 100)", Cli::at_least(2));
    cli.add("--threads", &f.threads, "CPU threads, 0 = all cores", Cli::at_least(0));
    cli.parse(argc, argv);
    if (f.threads > 0) omp_set_num_threads(f.threads);
    const std::vector<int64_t> batches = parse_list(f.batch_sizes);

    std::printf("%-7s %-6s %-10s %12s %12s %9s\n", "batch", "type", "recompute", "predicted", "measured", "step");
    for (bool recompute : {false, true}) {
        Rng rng(1);
        std::unique_ptr<Sequential> net = resnet50(rng, f.classes, recompute);
        net->pack();
        SGD sgd(net->parameters(), 0.1f, SGD::Options{}.with_momentum(0.9f).with_weight_decay(5e-4f).with_nesterov());
        const bool arena = !recompute;
        for (int64_t n : batches) {
            for (DType amp : {DType::F32, DType::BF16}) {
                const std::string predicted = amp == DType::F32 ? format_bytes(predict(*net, sgd, n, arena, 1)) : "—";
                std::string measured = "—", seconds = "—";
                if (n <= f.measure_up_to) {
                    const Measured m = measure(*net, sgd, n, f.classes, amp, arena, f.steps);
                    measured = format_bytes(m.peak);
                    char buf[32];
                    std::snprintf(buf, sizeof buf, "%.1f s", m.seconds);
                    seconds = buf;
                }
                std::printf("%-7lld %-6s %-10s %12s %12s %9s\n", (long long)n, dtype_name(amp), recompute ? "yes" : "no",
                            predicted.c_str(), measured.c_str(), seconds.c_str());
                std::fflush(stdout);
            }
        }
        if (!recompute) {
            // ZeRO-1: rank 0 of 2 and of 8 keeps the momentum of its piece of the slab only.
            for (int world : {2, 8})
                for (int64_t n : batches)
                    std::printf("%-7lld %-6s %-10s %12s %12s %9s   ZeRO-1, rank 0 of %d (batch per rank)\n", (long long)n,
                                "f32", "no", format_bytes(predict(*net, sgd, n, arena, world)).c_str(), "—", "—", world);
            std::printf("%s", zero_memory_table(net->num_parameters(), 1, {1, 2, 8}).c_str());
        }
    }
    return 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "lesson-13-resnet50: %s\n", e.what());
    return 1;
}
