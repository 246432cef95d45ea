// bench_train.cpp — training throughput of the chapters' models on the CPU (images/second),
// on random inputs of the real shapes (the data pipeline is not what is measured).
//
//   build/bench/bench_train            prints "bench mlp_train_cpu: 21000 img/s", ...
//   mlp_train_cpu        chapter 02's MLP, batch 64
//   lenet_train_cpu      chapter 03's LeNet, batch 64 (compare: bench/torch_lenet.py)
//   cifar_net_train_cpu  the network of bench/torch_cifar_net.py, batch 256, SGD Nesterov
//   lenet_train_cpu_f16, _bf16, cifar_net_train_cpu_f16, _bf16
//                        the same in mixed precision (chapter 09: autocast, and with f16 a
//                        GradScaler), then their ratio to f32 ("..._vs_f32")
// Threads: OMP_NUM_THREADS (make bench sets 2). The figure is the median of 5 timed rounds.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <optional>
#include <vector>

#include "nn/layers.h"
#include "nn/models.h"
#include "ops/autocast.h"
#include "optim/grad_scaler.h"
#include "optim/optimizer.h"

using namespace kiln;

// Median images/second of `rounds` rounds of `steps` training steps at batch B, with the SGD
// settings of the PyTorch script it is compared with; amp f16 or bf16: under autocast (f16 with
// a GradScaler), as --amp trains.
static double train_throughput(Module& model, const Shape& input, int64_t classes, int steps, int rounds,
                               SGD::Options options, DType amp = DType::F32) {
    Rng rng(0);
    int64_t B = input[0];
    Tensor x = Tensor::normal(input, 0, 1, rng);
    Tensor y = Tensor::empty({B}, DType::I32);
    for (int64_t i = 0; i < B; i++) y.data<int32_t>()[i] = int32_t(rng.next_below(uint64_t(classes)));
    model.input_needs_grad = false;  // as train_epoch (and PyTorch: the input has no requires_grad)
    SGD sgd(model.parameters(), 0.01f, options);
    CrossEntropyLoss criterion;
    BumpAllocator arena("bench arena", Device::CPU, size_t(1) << 30);
    GradScaler scaler(GradScaler::Options{65536.0f, 2.0, 0.5, 2000, amp == DType::F16});
    auto step = [&] {
        {
            std::optional<AutocastScope> autocast;
            if (amp != DType::F32) autocast.emplace(amp);
            AllocatorScope scope(arena);
            sgd.zero_grad();
            criterion.forward(model.forward(x), y);
            model.backward(criterion.backward(scaler.loss_scale()));
        }
        scaler.step(sgd, model);  // disabled (f32, bf16): the optimizer's step
        scaler.update();
        arena.reset();
    };
    for (int i = 0; i < 3; i++) step();  // warm-up: caches, page faults, thread pool
    std::vector<double> rates;
    for (int r = 0; r < rounds; r++) {
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < steps; i++) step();
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        rates.push_back(double(B) * steps / s);
    }
    std::sort(rates.begin(), rates.end());
    return rates[rates.size() / 2];
}

// The model in f32, f16 and bf16 (each from the same initial weights), and each low type's ratio to f32.
static void bench_precisions(const char* name, const std::function<std::unique_ptr<Module>()>& build,
                             const Shape& input, int steps, SGD::Options options) {
    double f32 = 0;
    for (DType amp : {DType::F32, DType::F16, DType::BF16}) {
        auto model = build();
        const double rate = train_throughput(*model, input, 10, steps, 5, options, amp);
        if (amp == DType::F32) {
            f32 = rate;
            std::printf("bench %s: %.0f img/s\n", name, rate);
        } else {
            std::printf("bench %s_%s: %.0f img/s\n", name, dtype_name(amp), rate);
            std::printf("bench %s_%s_vs_f32: %.2f ratio\n", name, dtype_name(amp), rate / f32);
        }
        std::fflush(stdout);
    }
}

int main() {
    Rng rng(1);
    auto net = mlp(rng);
    std::printf("bench mlp_train_cpu: %.0f img/s\n", train_throughput(*net, {64, 1, 28, 28}, 10, 100, 5, {0.9f, 0, 0, false}));
    std::fflush(stdout);
    bench_precisions("lenet_train_cpu", [] { Rng r(1); return lenet(r); }, {64, 1, 28, 28}, 40, {0.5f, 0, 0, false});
    bench_precisions("cifar_net_train_cpu", [] { Rng r(1); return cifar_net(r); }, {256, 3, 32, 32}, 2,
                     {0.9f, 0, 5e-4f, true});
    return 0;
}
