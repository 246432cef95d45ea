// test_fuse.cpp — batch norm with GELU fused after it (nn/fuse.h, chapter 06 and GPU part 2):
// the fused layer must give the bits of BatchNorm then GELU — forward, backward, evaluation, in
// f32, bf16 and f16, on the CPU and on CUDA — while launching fewer kernels and keeping one
// activation fewer per pair.
//
// Run: make build/tests/kiln_tests && build/tests/kiln_tests '[fuse]'
#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include <catch2/catch.hpp>

#include "core/allocator.h"
#include "core/cuda_memory.h"
#include "fixtures.h"
#include "nn/fuse.h"
#include "nn/layers.h"
#include "nn/misc.h"
#include "nn/models.h"
#include "nn/norm.h"
#include "nn/pool.h"
#include "nn/recompute.h"
#include "optim/optimizer.h"

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

// A BatchNorm2d(3) with the data's gamma and beta, on `device` (d: PairData or PoolPairData).
template <typename Data>
std::unique_ptr<BatchNorm2d> make_bn(const Data& d, Device device) {
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

// ==== max pooling 2×2 fused in front of batch norm (BatchNorm::pool2x2, fuse_maxpool_batchnorm) ====
namespace {

// x [N, 3, H, W] in halves between −3 and 3 (many ties inside a window), dz [N, 3, H/2, W/2]
// ~ N(0, 1), gamma and beta away from 1 and 0; all as `dtype` on `device`. nan: one NaN in
// channel 1's first window.
struct PoolPairData {
    PoolPairData(Shape shape, DType dtype, Device device, bool nan = false) {
        Rng rng(17);
        Tensor xs = Tensor::normal(shape, 0.5f, 1.5f, rng);
        float* v = xs.data<float>();
        for (int64_t i = 0; i < xs.numel(); i++) v[i] = std::round(std::min(3.0f, std::max(-3.0f, v[i])) * 2) / 2;
        if (nan) v[shape[2] * shape[3] + shape[3] + 1] = std::nanf("");
        x = xs.to(dtype).to(device);
        dz = Tensor::normal({shape[0], shape[1], shape[2] / 2, shape[3] / 2}, 0, 1, rng).to(dtype).to(device);
        gamma = Tensor::normal({3}, 1.0f, 0.5f, rng);
        beta = Tensor::normal({3}, 0.0f, 0.5f, rng);
    }
    Tensor x, dz, gamma, beta;
};

// MaxPool2d(2) → BatchNorm2d (→ GELU) run one after the other, and the BatchNorm2d with the pool
// fused in front (and the GELU after); `same` compares two tensors.
template <typename Same>
void check_pool_bn_pair(const PoolPairData& d, Device device, bool gelu, Same same) {
    MaxPool2d pool(2);
    GELU act;
    auto bn = make_bn(d, device), fused = make_bn(d, device);
    fused->pool2x2 = true;
    fused->gelu = gelu;
    const auto separate_forward = [&](const Tensor& x) {
        const Tensor y = bn->forward(pool.forward(x));
        return gelu ? act.forward(y) : y;
    };
    // training: the output, dx, dgamma, dbeta and the running statistics
    same(fused->forward(d.x), separate_forward(d.x));
    const Tensor dx = pool.backward(bn->backward(gelu ? act.backward(d.dz) : d.dz));
    same(fused->backward(d.dz), dx);
    same(fused->weight.grad, bn->weight.grad);
    same(fused->bias.grad, bn->bias.grad);
    same(fused->running_mean, bn->running_mean);
    same(fused->running_var, bn->running_var);
    // evaluation: the running statistics
    bn->eval();
    fused->eval();
    same(fused->forward(d.x), separate_forward(d.x));
}

}  // namespace

TEST_CASE("max pooling 2x2 fused into batch norm gives the bits of MaxPool2d then BatchNorm2d (then GELU)",
          "[fuse][pool][norm][batchnorm][cpu][cuda][lesson06]") {
    // even and odd sizes: an odd H's last row and an odd W's last column are in no window (floor)
    for (const Shape& shape : {Shape{4, 3, 6, 8}, Shape{3, 3, 7, 5}}) {
        for (Device device : {Device::CPU, Device::CUDA}) {
            for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
                for (bool gelu : {false, true}) {
                    INFO(shape.str() << ", " << device_name(device) << ", " << dtype_name(dtype) << ", gelu " << gelu);
                    check_pool_bn_pair(PoolPairData(shape, dtype, device), device, gelu, require_identical);
                }
            }
        }
    }
}

TEST_CASE("max pooling 2x2 fused into batch norm: a NaN in a window wins it, as in MaxPool2d",
          "[fuse][pool][norm][batchnorm][cpu][cuda]") {
    // The NaN's channel becomes NaN throughout (its statistics are NaN), the others stay numbers.
    for (Device device : {Device::CPU, Device::CUDA}) {
        for (DType dtype : {DType::F32, DType::BF16}) {
            INFO(device_name(device) << ", " << dtype_name(dtype));
            const PoolPairData d({2, 3, 4, 6}, dtype, device, /*nan=*/true);
            check_pool_bn_pair(d, device, true, test::require_identical_values);
        }
    }
}

TEST_CASE("max pooling 2x2 fused into batch norm: ties go to the window's first place, row-major, as in PyTorch",
          "[fuse][pool][norm][batchnorm][cpu][cuda]") {
    // x [2, 1, 2, 4]: every window holds one value four times, or a tie of two after a smaller one;
    // the gradient must reach the first of the tied places (PyTorch 2.x's max_pool2d: `val > max`).
    for (Device device : {Device::CPU, Device::CUDA}) {
        INFO(device_name(device));
        Tensor x = Tensor::empty({2, 1, 2, 4}, DType::F32);
        // image 0: windows (1 1 / 1 1) and (0 2 / 2 1);  image 1: (3 0 / 0 3) and (−1 −2 / −1 −1)
        const float values[] = {1, 1, 0, 2, 1, 1, 2, 1, 3, 0, -1, -2, 0, 3, -1, -1};
        std::copy(values, values + 16, x.data<float>());
        // the winners: image 0 (0, 0) and (0, 3); image 1 (0, 0) and (0, 2)
        const std::vector<int64_t> winners = {0, 3, 8, 10};
        const auto places = [](const Tensor& t) {
            std::vector<int64_t> nonzero;
            const Tensor c = t.to(Device::CPU);
            for (int64_t i = 0; i < c.numel(); i++)
                if (c.data<float>()[i] != 0.0f) nonzero.push_back(i);
            return nonzero;
        };
        MaxPool2d pool(2);
        pool.forward(x.to(device));
        CHECK(places(pool.backward(Tensor::ones({2, 1, 1, 2}).to(device))) == winners);
        BatchNorm2d fused(1);
        fused.pool2x2 = true;
        fused.to(device);
        fused.forward(x.to(device));
        Tensor dz = Tensor::empty({2, 1, 1, 2}, DType::F32);
        const float dz_values[] = {1.0f, -1.0f, 0.5f, 2.0f};
        std::copy(dz_values, dz_values + 4, dz.data<float>());
        CHECK(places(fused.backward(dz.to(device))) == winners);
    }
}

TEST_CASE("fuse_maxpool_batchnorm: only a 2x2, stride-2, unpadded MaxPool2d directly before a BatchNorm2d folds",
          "[fuse][pool][cpu]") {
    Rng rng(3);
    auto lenet_net = lenet(rng);  // its pools are followed by ReLUs
    CHECK(fuse_maxpool_batchnorm(*lenet_net).empty());
    Sequential seq("seq");
    seq.add("p1", std::make_unique<MaxPool2d>(2, 1));  // stride 1
    seq.add("bn1", std::make_unique<BatchNorm2d>(3));
    seq.add("p2", std::make_unique<MaxPool2d>(2, 2, 1));  // padded
    seq.add("bn2", std::make_unique<BatchNorm2d>(3));
    seq.add("p3", std::make_unique<MaxPool2d>(3, 2));  // 3×3
    seq.add("bn3", std::make_unique<BatchNorm2d>(3));
    seq.add("p4", std::make_unique<MaxPool2d>(2));
    seq.add("bn4", std::make_unique<BatchNorm1d>(3));  // not a BatchNorm2d
    seq.add("p5", std::make_unique<MaxPool2d>(2));
    seq.add("bn5", std::make_unique<BatchNorm2d>(3));
    CHECK(fuse_maxpool_batchnorm(seq) == std::vector<std::string>{"bn5"});
    CHECK(dynamic_cast<Identity*>(&seq[8]) != nullptr);
    CHECK(seq.children()[8].name == "p5");
    for (size_t i = 0; i < 8; i += 2) CHECK(dynamic_cast<MaxPool2d*>(&seq[i]) != nullptr);
    CHECK(fuse_maxpool_batchnorm(seq).empty());  // done once
}

namespace {

// Every parameter's and buffer's name and bytes, in order: what a checkpoint holds.
std::vector<std::pair<std::string, Tensor>> model_state(Module& m) {
    std::vector<std::pair<std::string, Tensor>> state;
    for (auto& [name, p] : m.named_parameters()) state.emplace_back(name, p->value.to(Device::CPU));
    for (auto& [name, b] : m.named_buffers()) state.emplace_back(name, b->to(Device::CPU));
    return state;
}

void require_same_state(Module& got, Module& want) {
    const auto a = model_state(got), b = model_state(want);
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); i++) {
        INFO(b[i].first);
        REQUIRE(a[i].first == b[i].first);
        require_identical(a[i].second, b[i].second);
    }
}

// Two SGD steps of the CIFAR net and one evaluation, on `device`: the losses, then the state.
struct NetRun {
    std::vector<float> losses;
    Tensor eval_logits;
};

NetRun train_two_steps(Sequential& net, SGD& sgd, const Batch& b) {
    NetRun run;
    for (int step = 0; step < 2; step++) {
        run.losses.push_back(forward_backward(net, b.x, b.y));
        sgd.step();
    }
    net.eval();
    run.eval_logits = net.call(b.x).to(Device::CPU);
    net.train();
    return run;
}

}  // namespace

TEST_CASE("fuse_maxpool_batchnorm: the CIFAR net trains to the same bits, keeping 3 bytes fewer per pooled value",
          "[fuse][pool][norm][cpu][lesson06]") {
    const bool recompute = GENERATE(false, true);
    const bool with_gelu = GENERATE(false, true);
    INFO("recompute " << recompute << ", BN and GELU fused too " << with_gelu);
    Rng r1(3), r2(3);
    auto plain = cifar_net(r1, {8, 16, 16}, true, recompute);
    auto fused = cifar_net(r2, {8, 16, 16}, true, recompute);
    const std::string in = recompute ? ".inner" : "";
    REQUIRE(fuse_maxpool_batchnorm(*fused) ==
            std::vector<std::string>{"block1a" + in + ".bn", "block2a" + in + ".bn", "block3a" + in + ".bn"});
    if (with_gelu) REQUIRE(fuse_batchnorm_gelu(*fused).size() == 6);
    REQUIRE(dynamic_cast<MaxPool2d*>(&fused->module_at("pool")) != nullptr);  // the head's 3×3 pool stays
    require_same_state(*fused, *plain);                                         // the same checkpoint
    const Batch b(Device::CPU);
    SGD sgd_plain(plain->parameters(), 0.05f), sgd_fused(fused->parameters(), 0.05f);
    const NetRun want = train_two_steps(*plain, sgd_plain, b), got = train_two_steps(*fused, sgd_fused, b);
    CHECK(got.losses == want.losses);
    require_identical(got.eval_logits, want.eval_logits);  // evaluation: the running statistics
    require_same_state(*fused, *plain);                    // weights and running statistics
    if (recompute) return;  // (a Checkpoint keeps only its input either way)
    // What the forward keeps: each folded pool's i32 argmax becomes a byte per pooled value. Blocks
    // 1a, 2a, 3a pool 31×31 → 15×15 (8 channels), 15×15 → 7×7 and 7×7 → 3×3 (16), batch 4.
    const auto kept_after_forward = [&](Module& m) {
        m.zero_grad();
        const int64_t before = device_memory_stats(Device::CPU).requested[size_t(Category::Activation)];
        const Tensor logits = m.call(b.x);
        const int64_t after = device_memory_stats(Device::CPU).requested[size_t(Category::Activation)];
        m.call_backward(Tensor::ones(logits.shape()));  // spend the caches
        return after - before;
    };
    const int64_t gelu_saved = with_gelu ? 4 * 4 * (2 * 8 * 15 * 15 + 2 * 16 * 7 * 7 + 2 * 16 * 3 * 3) : 0;
    const int64_t pool_saved = 3 * 4 * (8 * 15 * 15 + 16 * 7 * 7 + 16 * 3 * 3);
    CHECK(kept_after_forward(*plain) - kept_after_forward(*fused) == pool_saved + gelu_saved);
}

TEST_CASE("fuse_maxpool_batchnorm on CUDA: the unfused net's bits, a launch fewer per folded pool each way",
          "[fuse][pool][norm][cuda][lesson06]") {
    Rng r1(3), r2(3);
    auto plain = cifar_net(r1, {8, 16, 16}, true, false);
    auto fused = cifar_net(r2, {8, 16, 16}, true, false);
    REQUIRE(fuse_maxpool_batchnorm(*fused).size() == 3);
    REQUIRE(fuse_batchnorm_gelu(*fused).size() == 6);
    REQUIRE(fuse_batchnorm_gelu(*plain).size() == 6);  // the same BN+GELU layers on both sides
    plain->to(Device::CUDA);
    fused->to(Device::CUDA);
    const Batch b(Device::CUDA);
    // Launches of one step, by kernel: max pooling runs for the head's 3×3 pool only.
    const auto launches = [](const std::vector<cuda::KernelTime>& times, const std::string& kernel) {
        int64_t n = 0;
        for (const cuda::KernelTime& k : times)
            if (kernel.empty() || k.kernel.find(kernel) != std::string::npos) n += k.launches;
        return n;
    };
    cuda::set_kernel_timing(true);
    cuda::take_kernel_times();
    const float loss_plain = forward_backward(*plain, b.x, b.y);
    const std::vector<cuda::KernelTime> separate = cuda::take_kernel_times();
    const float loss_fused = forward_backward(*fused, b.x, b.y);
    const std::vector<cuda::KernelTime> together = cuda::take_kernel_times();
    cuda::set_kernel_timing(false);
    CHECK(loss_fused == loss_plain);
    auto pa = plain->parameters(), pb = fused->parameters();
    for (size_t i = 0; i < pa.size(); i++) require_identical(pb[i]->grad.to(Device::CPU), pa[i]->grad.to(Device::CPU));
    CHECK(launches(separate, "maxpool2d_forward") == 4);
    CHECK(launches(separate, "maxpool2d_backward") == 4);
    CHECK(launches(together, "maxpool2d_forward") == 1);
    CHECK(launches(together, "maxpool2d_backward") == 1);
    CHECK(launches(together, "batchnorm_") == launches(separate, "batchnorm_"));
    CHECK(launches(separate, "") - launches(together, "") == 2 * 3);
}
