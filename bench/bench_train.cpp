// bench_train.cpp — training throughput of the chapters' models on the CPU (images/second),
// on random inputs of the real shapes (the data pipeline is not what is measured).
//
//   build/bench/bench_train            prints "bench mlp_train_cpu: 21000 img/s", ...
//   mlp_train_cpu        chapter 02's MLP, batch 64
//   lenet_train_cpu      chapter 03's LeNet, batch 64 (compare: bench/torch_lenet.py)
//   cifar_net_train_cpu  the network of bench/torch_cifar_net.py, batch 256, SGD Nesterov
// Threads: OMP_NUM_THREADS (make bench sets 2). The figure is the median of 5 timed rounds.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

#include "nn/layers.h"
#include "nn/models.h"
#include "optim/optimizer.h"

using namespace kiln;

// Median images/second of `rounds` rounds of `steps` training steps at batch B, with the SGD
// settings of the PyTorch script it is compared with.
static double train_throughput(Module& model, const Shape& input, int64_t classes, int steps, int rounds,
                               SGD::Options options) {
    Rng rng(0);
    int64_t B = input[0];
    Tensor x = Tensor::normal(input, 0, 1, rng);
    Tensor y = Tensor::empty({B}, DType::I32);
    for (int64_t i = 0; i < B; i++) y.data<int32_t>()[i] = int32_t(rng.next_below(uint64_t(classes)));
    model.input_needs_grad = false;  // as train_epoch (and PyTorch: the input has no requires_grad)
    SGD sgd(model.parameters(), 0.01f, options);
    CrossEntropyLoss criterion;
    BumpAllocator arena("bench arena", Device::CPU, size_t(1) << 30);
    auto step = [&] {
        {
            AllocatorScope scope(arena);
            sgd.zero_grad();
            criterion.forward(model.forward(x), y);
            model.backward(criterion.backward());
        }
        sgd.step();
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

int main() {
    Rng rng(1);
    auto net = mlp(rng);
    std::printf("bench mlp_train_cpu: %.0f img/s\n", train_throughput(*net, {64, 1, 28, 28}, 10, 100, 5, {0.9f, 0, 0, false}));
    std::fflush(stdout);
    auto le = lenet(rng);
    std::printf("bench lenet_train_cpu: %.0f img/s\n", train_throughput(*le, {64, 1, 28, 28}, 10, 40, 5, {0.5f, 0, 0, false}));
    std::fflush(stdout);
    auto cifar = cifar_net(rng);
    std::printf("bench cifar_net_train_cpu: %.0f img/s\n", train_throughput(*cifar, {256, 3, 32, 32}, 10, 2, 5, {0.9f, 0, 5e-4f, true}));
    return 0;
}
