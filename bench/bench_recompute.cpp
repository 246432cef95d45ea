// bench_recompute.cpp — what chapter 08's memory savers cost and save on the CPU: activation
// recomputation (Checkpoint) on the CIFAR net and a 20-layer net, and gradient accumulation on
// the CIFAR net, against the plain step.
//
//   build/bench/bench_recompute     prints "bench cifar_net_b128_act_peak: 97.3 MiB", ...
//   <net>_act_peak       the most activation bytes alive at once during one training step
//                        (Category::Activation in the pool: no arena, so freed bytes are reused)
//   <net>_peak           the same for every byte the step allocates (activations, im2col
//                        workspace, ...), above what was allocated before it
//   <net>_step           the step's time, median of 3 steps after one warm-up
//   cifar_net_b128       lesson 06's net (widths 32/64/128), batch 128, SGD Nesterov
//   deep_net20_b16       make_deep_net(depth 20, width 32), batch 16; _recompute: a Checkpoint
//                        every 4 layers
//   _accumulateK         the CIFAR net's step as K micro-batches of 128/K (--accumulate K)
// Threads: OMP_NUM_THREADS (make bench sets 2). About 30 s on 2 idle cores.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "nn/models.h"
#include "optim/optimizer.h"
#include "train/loop.h"

using namespace kiln;

namespace {

struct Figures {
    double act_peak_mib = 0, peak_mib = 0, step_ms = 0;
};

// One warm-up step, then 3 timed ones, each train_step with K micro-batches on random data of
// `input`'s shape; the peaks of the last step.
Figures measure(Module& model, const Shape& input, int K) {
    Rng rng(0);
    const int64_t B = input[0];
    Tensor x = Tensor::normal(input, 0, 1, rng);
    Tensor y = Tensor::empty({B}, DType::I32);
    for (int64_t i = 0; i < B; i++) y.data<int32_t>()[i] = int32_t(rng.next_below(10));
    SGD sgd(model.parameters(), 0.01f, SGD::Options{}.with_momentum(0.9f).with_weight_decay(5e-4f).with_nesterov());
    PoolAllocator& pool = pool_allocator(Device::CPU);
    const StepOptions options{nullptr, 0.0f, K};
    train_step(model, sgd, x, y, options);  // warm-up: the optimizer's state, the pool's blocks
    std::vector<double> ms;
    Figures f;
    for (int i = 0; i < 3; i++) {
        const MemoryStats before = pool.stats();
        pool.reset_peak();
        const auto t0 = std::chrono::steady_clock::now();
        train_step(model, sgd, x, y, options);
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
        const MemoryStats after = pool.stats();
        const int act = int(Category::Activation);
        f.act_peak_mib = double(after.peak_use[act] - before.in_use[act]) / (1 << 20);
        f.peak_mib = double(after.peak_allocated - before.allocated) / (1 << 20);
    }
    std::sort(ms.begin(), ms.end());
    f.step_ms = ms[ms.size() / 2];
    return f;
}

void print(const std::string& name, const Figures& f) {
    std::printf("bench %s_act_peak: %.1f MiB\n", name.c_str(), f.act_peak_mib);
    std::printf("bench %s_peak: %.1f MiB\n", name.c_str(), f.peak_mib);
    std::printf("bench %s_step: %.0f ms\n", name.c_str(), f.step_ms);
    std::fflush(stdout);
}

}  // namespace

int main() {
    const CifarNetWidths lesson06{32, 64, 128};
    const Shape cifar_batch{128, 3, 32, 32};
    for (bool recompute : {false, true}) {
        Rng rng(1);
        auto net = cifar_net(rng, lesson06, true, recompute);
        print(recompute ? "cifar_net_b128_recompute" : "cifar_net_b128", measure(*net, cifar_batch, 1));
    }
    for (int K : {2, 4}) {
        Rng rng(1);
        auto net = cifar_net(rng, lesson06, true);
        print("cifar_net_b128_accumulate" + std::to_string(K), measure(*net, cifar_batch, K));
    }
    for (int64_t segment : {0, 4}) {
        Rng rng(1);
        auto net = make_deep_net(rng, 20, 32, segment);
        print(segment ? "deep_net20_b16_recompute" : "deep_net20_b16", measure(*net, {16, 3, 32, 32}, 1));
    }
    return 0;
}
