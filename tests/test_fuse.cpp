// test_fuse.cpp — batch norm with GELU fused after it (nn/fuse.h, chapter 06 and GPU part 2):
// the fused layer must give the bits of BatchNorm then GELU — forward, backward, evaluation, in
// f32, bf16 and f16, on the CPU and on CUDA — while launching fewer kernels and keeping one
// activation fewer per pair.
//
// Run: make build/tests/kiln_tests && build/tests/kiln_tests '[fuse]'
#include <memory>

#include <catch2/catch.hpp>

#include "core/allocator.h"
#include "core/cuda_memory.h"
#include "fixtures.h"
#include "nn/fuse.h"
#include "nn/layers.h"
#include "nn/misc.h"
#include "nn/models.h"
#include "nn/norm.h"
#include "nn/recompute.h"

using namespace kiln;
using test::forward_backward;
using test::require_identical;

namespace {

// x [4, 3, 5, 5] with a channel mean far from 0, gamma and beta away from 1 and 0 (GELU then
// sees both signs and its curved part), dz ~ N(0, 1); all as `dtype` on `device`.
struct PairData {
    PairData(DType dtype, Device device) {
        Rng rng(11);
        x = Tensor::normal({4, 3, 5, 5}, 1.5f, 2.0f, rng).to(dtype).to(device);
        dz = Tensor::normal({4, 3, 5, 5}, 0, 1, rng).to(dtype).to(device);
        gamma = Tensor::normal({3}, 1.0f, 0.5f, rng);
        beta = Tensor::normal({3}, 0.0f, 0.5f, rng);
    }
    Tensor x, dz, gamma, beta;
};

// A BatchNorm2d(3) with the data's gamma and beta, on `device`.
std::unique_ptr<BatchNorm2d> make_bn(const PairData& d, Device device) {
    auto bn = std::make_unique<BatchNorm2d>(3);
    bn->weight.value.copy_from(d.gamma);
    bn->bias.value.copy_from(d.beta);
    bn->to(device);
    return bn;
}

}  // namespace

TEST_CASE("batch norm with GELU fused gives the bits of BatchNorm then GELU", "[fuse][batchnorm][gelu][cpu][cuda][lesson06]") {
    for (Device device : {Device::CPU, Device::CUDA}) {
        for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
            INFO(device_name(device) << ", " << dtype_name(dtype));
            const PairData d(dtype, device);
            auto bn = make_bn(d, device), fused = make_bn(d, device);
            GELU gelu;
            fused->gelu = true;
            // training: the output, dx, dgamma, dbeta and the running statistics
            const Tensor z = gelu.forward(bn->forward(d.x));
            const Tensor z_fused = fused->forward(d.x);
            require_identical(z_fused, z);
            require_identical(fused->backward(d.dz), bn->backward(gelu.backward(d.dz)));
            require_identical(fused->weight.grad, bn->weight.grad);
            require_identical(fused->bias.grad, bn->bias.grad);
            require_identical(fused->running_mean, bn->running_mean);
            require_identical(fused->running_var, bn->running_var);
            // evaluation: the running statistics
            bn->eval();
            fused->eval();
            require_identical(fused->forward(d.x), gelu.forward(bn->forward(d.x)));
        }
    }
}

TEST_CASE("batch norm with GELU fused: CUDA matches the CPU", "[fuse][batchnorm][gelu][cuda][lesson06]") {
    const PairData cpu_data(DType::F32, Device::CPU), cuda_data(DType::F32, Device::CUDA);
    auto cpu = make_bn(cpu_data, Device::CPU), gpu = make_bn(cuda_data, Device::CUDA);
    cpu->gelu = gpu->gelu = true;
    test::require_close(gpu->forward(cuda_data.x).to(Device::CPU), cpu->forward(cpu_data.x), 1e-5, 1e-6);
    test::require_close(gpu->backward(cuda_data.dz).to(Device::CPU), cpu->backward(cpu_data.dz), 1e-4, 1e-6);
    test::require_close(gpu->weight.grad.to(Device::CPU), cpu->weight.grad, 1e-4, 1e-6);
    test::require_close(gpu->bias.grad.to(Device::CPU), cpu->bias.grad, 1e-4, 1e-6);
}

namespace {

struct Batch {
    explicit Batch(Device device) {
        Rng rng(5);
        x = Tensor::normal({4, 3, 32, 32}, 0, 1, rng).to(device);
        Tensor labels = Tensor::empty({4}, DType::I32);
        for (int64_t i = 0; i < 4; i++) labels.data<int32_t>()[i] = int32_t(rng.next_below(10));
        y = labels.to(device);
    }
    Tensor x, y;
};

}  // namespace

TEST_CASE("fuse_batchnorm_gelu: the CIFAR net trains to the same bits with one activation fewer per pair",
          "[fuse][cpu][lesson06]") {
    const bool recompute = GENERATE(false, true);
    INFO("recompute " << recompute);
    Rng r1(3), r2(3);
    auto plain = cifar_net(r1, {8, 16, 16}, true, recompute);
    auto fused = cifar_net(r2, {8, 16, 16}, true, recompute);
    const std::vector<std::string> paths = fuse_batchnorm_gelu(*fused);
    const std::string in = recompute ? ".inner" : "";
    REQUIRE(paths == std::vector<std::string>{"block1a" + in + ".bn", "block1b" + in + ".bn", "block2a" + in + ".bn",
                                              "block2b" + in + ".bn", "block3a" + in + ".bn", "block3b" + in + ".bn"});
    REQUIRE(fuse_batchnorm_gelu(*fused).empty());  // done once
    REQUIRE(dynamic_cast<GELU*>(&(*fused)[1]) != nullptr);  // the stem's GELU follows a conv: kept
    // the same parameters under the same names
    const auto names = [](Module& m) {
        std::vector<std::string> n;
        for (auto& [name, p] : m.named_parameters()) n.push_back(name);
        return n;
    };
    REQUIRE(names(*fused) == names(*plain));
    const Batch b(Device::CPU);
    for (int step = 0; step < 2; step++) {
        INFO("step " << step + 1);
        REQUIRE(forward_backward(*fused, b.x, b.y) == forward_backward(*plain, b.x, b.y));
        auto pa = plain->parameters(), pb = fused->parameters();
        for (size_t i = 0; i < pa.size(); i++) require_identical(pb[i]->grad, pa[i]->grad);
    }
    if (recompute) return;  // (a Checkpoint keeps only its input either way)
    // What the forward keeps for backward: each fused pair drops GELU's input, the BN's output
    // [4, C, H, W] in f32. The stem (2×2, no padding) makes 31×31, each block a halves it (floor):
    // blocks 1a, 1b at 15×15 with 8 channels, 2a, 2b 7×7×16, 3a, 3b 3×3×16.
    const auto kept_after_forward = [&](Module& m) {
        m.zero_grad();
        const int64_t before = device_memory_stats(Device::CPU).requested[size_t(Category::Activation)];
        const Tensor logits = m.call(b.x);
        const int64_t after = device_memory_stats(Device::CPU).requested[size_t(Category::Activation)];
        m.call_backward(Tensor::ones(logits.shape()));  // spend the caches
        return after - before;
    };
    const int64_t saved = 4 * 4 * (2 * 8 * 15 * 15 + 2 * 16 * 7 * 7 + 2 * 16 * 3 * 3);
    CHECK(kept_after_forward(*plain) - kept_after_forward(*fused) == saved);
}

TEST_CASE("fuse_batchnorm_gelu on CUDA: the CPU's loss, two launches fewer per pair and step",
          "[fuse][cuda][lesson06]") {
    Rng r1(3), r2(3);
    auto cpu = cifar_net(r1, {8, 16, 16}, true, false);
    auto gpu = cifar_net(r2, {8, 16, 16}, true, false);
    fuse_batchnorm_gelu(*cpu);
    REQUIRE(fuse_batchnorm_gelu(*gpu).size() == 6);
    gpu->to(Device::CUDA);
    const Batch on_cpu(Device::CPU), on_gpu(Device::CUDA);
    CHECK(forward_backward(*gpu, on_gpu.x, on_gpu.y) == Approx(forward_backward(*cpu, on_cpu.x, on_cpu.y)).epsilon(1e-5));
    // Launches of one step, by kernel: GELU's forward and backward run for the stem only.
    const auto launches = [](const std::vector<cuda::KernelTime>& times, const std::string& kernel) {
        for (const cuda::KernelTime& k : times)
            if (k.kernel.find(kernel) != std::string::npos) return k.launches;
        return int64_t(0);
    };
    Rng r3(3);
    auto unfused = cifar_net(r3, {8, 16, 16}, true, false);
    unfused->to(Device::CUDA);
    cuda::set_kernel_timing(true);
    cuda::take_kernel_times();
    forward_backward(*unfused, on_gpu.x, on_gpu.y);
    const std::vector<cuda::KernelTime> separate = cuda::take_kernel_times();
    forward_backward(*gpu, on_gpu.x, on_gpu.y);
    const std::vector<cuda::KernelTime> together = cuda::take_kernel_times();
    cuda::set_kernel_timing(false);
    CHECK(launches(separate, "gelu_forward") == 7);
    CHECK(launches(separate, "gelu_backward") == 7);
    CHECK(launches(together, "gelu_forward") == 1);
    CHECK(launches(together, "gelu_backward") == 1);
    CHECK(launches(together, "batchnorm_forward_train") == launches(separate, "batchnorm_forward_train"));
    int64_t all_separate = 0, all_together = 0;
    for (const cuda::KernelTime& k : separate) all_separate += k.launches;
    for (const cuda::KernelTime& k : together) all_together += k.launches;
    CHECK(all_separate - all_together == 2 * 6);
}
