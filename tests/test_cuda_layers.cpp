// test_cuda_layers.cpp — the CUDA pooling, batch-norm, dropout and residual layers (cuda/pool.cu,
// cuda/norm.cu, cuda/elementwise.cu; chapters 05–06) against the same layers on the CPU
// (src/ops/cpu/pool.cpp, norm.cpp, elementwise.cpp, themselves checked by hand and against
// references in test_pool.cpp, test_norm.cpp, test_misc_layers.cpp): small random shapes that hit
// the edges (batch 1, odd sizes, padding, stride ≠ kernel, M = 2 and M > the 256 threads of a
// block), finite differences on the cuda device, and the same-device errors. Layer norm's and
// GELU's CUDA cases are with their CPU ones, in test_norm.cpp and test_gelu.cpp.
//
// Without a GPU the kernels run on kiln's emulator, each comparison under two schedules
// (tests/fixtures.h under_schedules). Tolerances (tests/fixtures.h require_close: relative to
// the tensor's largest |value|):
//   bit for bit   max pooling (same scan, same argmax), average-pooling forward, dropout (the
//                 CPU's hash on the device: same mask, same y and dx)
//   1e-6          average-pooling backward and the global average (a GPU may fuse dy·(1/K²)
//                 into the add; the global sum is a tree instead of 8 lanes), batch-norm eval
//   1e-5          batch-norm training and backward (per-channel sums in another order, both
//                 in double; y and dx then differ by a few float ulps), residual blocks
//
//   make test T='[cuda][pool]'    (likewise [batchnorm], [dropout], [residual])
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "fixtures.h"
#include "gradcheck.h"
#include "nn/conv.h"
#include "nn/layers.h"
#include "nn/misc.h"
#include "nn/norm.h"
#include "nn/pool.h"
#include "ops/kernels/all.h"

using namespace kiln;
using test::require_close;
using test::gpu_nans;
using test::identical_values_mismatch;
using test::require_identical;
using test::require_identical_values;
using test::under_schedules;

namespace {

Tensor cuda_copy(const Tensor& t) { return t.to(Device::CUDA); }

// Values from {−1, −0.75, ..., 1}: many ties inside every pooling window.
Tensor with_ties(const Shape& s, Rng& rng) {
    Tensor t = Tensor::uniform(s, -1.0f, 1.0f, rng);
    for (int64_t i = 0; i < t.numel(); i++) t.data<float>()[i] = std::round(t.data<float>()[i] * 4.0f) / 4.0f;
    return t;
}

// 0.05·(a permutation of 0 .. n−1), centred: no two values closer than 0.05, so a ±0.01 finite
// difference never changes which value of a pooling window is the maximum.
Tensor spread(const Shape& s, Rng& rng) {
    Tensor t = Tensor::empty(s);
    const int64_t n = t.numel();
    std::vector<float> v(size_t(n), 0.0f);
    for (int64_t i = 0; i < n; i++) v[size_t(i)] = 0.05f * float(i - n / 2);
    for (int64_t i = n - 1; i > 0; i--) std::swap(v[size_t(i)], v[size_t(rng.next_below(uint64_t(i + 1)))]);
    std::copy(v.begin(), v.end(), t.data<float>());
    return t;
}

struct PoolCase {
    const char* what;
    int64_t N, C, H, W, K, stride, padding;
};

const PoolCase kPoolCases[] = {
    {"a single value", 1, 1, 1, 1, 1, 1, 0},
    {"LeNet's 2x2 stride 2 (the CPU's special case)", 2, 3, 8, 8, 2, 2, 0},
    {"odd sizes: the last row and column are in no window", 1, 2, 7, 9, 2, 2, 0},
    {"overlapping windows with padding", 2, 2, 9, 7, 3, 2, 1},
    {"stride 1: an input in up to 9 windows", 1, 3, 6, 5, 3, 1, 1},
    {"stride != kernel, padding K/2", 3, 1, 5, 6, 4, 3, 2},
};

// BatchNorm2d for [N, C, H, W], else BatchNorm1d, with random weight and bias (not the 1 and 0
// they start with) drawn from seed: the same seed, the same layer.
std::unique_ptr<BatchNorm> make_bn(const Shape& s, uint64_t seed) {
    Rng rng(seed);
    std::unique_ptr<BatchNorm> bn;
    if (s.ndim == 4) bn = std::make_unique<BatchNorm2d>(s[1]);
    else bn = std::make_unique<BatchNorm1d>(s[1]);
    bn->weight.value.copy_from(Tensor::uniform({s[1]}, 0.5f, 2.0f, rng));
    bn->bias.value.copy_from(Tensor::uniform({s[1]}, -1.0f, 1.0f, rng));
    return bn;
}

}  // namespace

// ---- pooling -------------------------------------------------------------------------------------
// NaN is part of pooling's contract, its bits are not (PyTorch 2.x: max pooling propagates a NaN
// in the window, as does an average; which NaN is unspecified). A GPU's arithmetic returns its own
// NaN where the CPU passes the input's along, so the forward results are compared as values: NaN
// where the CPU has NaN, the same bits everywhere else (on the emulator after gpu_nans, which
// gives its NaNs a GPU's bits, so that this run checks what a GPU run must pass).
TEST_CASE("cuda max and average pooling match the CPU bit for bit, NaN as NaN", "[cuda][pool][lesson05]") {
    Rng rng(3);
    for (const PoolCase& c : kPoolCases) {
        INFO(c.what << ": x [" << c.N << ", " << c.C << ", " << c.H << ", " << c.W << "], K " << c.K << ", stride "
                    << c.stride << ", padding " << c.padding);
        Tensor x = with_ties({c.N, c.C, c.H, c.W}, rng);
        x.data<float>()[x.numel() / 2] = NAN;  // NaN wins its windows, as on the CPU
        MaxPool2d cpu_max(c.K, c.stride, c.padding), gpu_max(c.K, c.stride, c.padding);
        AvgPool2d cpu_avg(c.K, c.stride, c.padding), gpu_avg(c.K, c.stride, c.padding);
        const Tensor y_max = cpu_max.forward(x), y_avg = cpu_avg.forward(x);
        const Tensor dy = Tensor::uniform(y_max.shape(), -1.0f, 1.0f, rng);
        const Tensor dx_max = cpu_max.backward(dy), dx_avg = cpu_avg.backward(dy);
        under_schedules([&] {
            require_identical_values(gpu_nans(gpu_max.forward(cuda_copy(x))), y_max);
            require_identical(gpu_max.backward(cuda_copy(dy)), dx_max);  // the same argmax, gathered
            require_identical_values(gpu_nans(gpu_avg.forward(cuda_copy(x))), y_avg);
            require_close(gpu_avg.backward(cuda_copy(dy)), dx_avg, 1e-6);
        });
    }
}

TEST_CASE("pooling's NaN contract: a NaN matches any NaN, everything else its bits", "[cpu][pool][lesson05]") {
    // [1, NaN (the CPU's 0x7fc00000), -0, NaN] against the GPU's NaN 0x7fffffff in the same places
    Tensor want = Tensor::empty({4}), got = Tensor::empty({4});
    const uint32_t want_bits[] = {0x3f800000u, 0x7fc00000u, 0x80000000u, 0xffc00000u};
    std::memcpy(want.raw(), want_bits, sizeof want_bits);
    got.copy_from(gpu_nans(want));
    CHECK(got.data<float>()[1] != got.data<float>()[1]);
    CHECK(identical_values_mismatch(got, want).empty());
    // a NaN where the CPU has a number, a number where it has NaN, +0 for -0: each a mismatch
    for (int i : {0, 1, 2}) {
        Tensor bad = got.clone();
        const uint32_t swapped[] = {0x7fffffffu, 0x3f800000u, 0x00000000u};
        std::memcpy(static_cast<uint8_t*>(bad.raw()) + 4 * i, &swapped[i], 4);
        INFO("element " << i);
        CHECK(!identical_values_mismatch(bad, want).empty());
    }
}

TEST_CASE("cuda max pooling keeps the first maximum of a window on ties", "[cuda][pool][lesson05]") {
    // One 3x3 window, stride 1, over a plane of equal values: the maximum is the first (0, 0),
    // so backward sends dy there and nowhere else.
    //   x = [2 2 2]     y = [2]      dx = [5 0 0]
    //       [2 2 2]     dy = [5]          [0 0 0]
    //       [2 2 2]                       [0 0 0]
    MaxPool2d pool(3, 1);
    const Tensor y = pool.forward(cuda_copy(Tensor::full({1, 1, 3, 3}, 2.0)));
    require_identical(y, Tensor::full({1, 1, 1, 1}, 2.0));
    Tensor want = Tensor::zeros({1, 1, 3, 3});
    want.data<float>()[0] = 5.0f;
    require_identical(pool.backward(cuda_copy(Tensor::full({1, 1, 1, 1}, 5.0))), want);
}

TEST_CASE("cuda global average pooling matches the CPU", "[cuda][pool][lesson05]") {
    Rng rng(4);
    // One warp per plane: S = 1; S = 49 and 300 > 32 lanes: lanes take several values; 256
    // planes of 3×3 (the CIFAR net's last layer): 32 blocks of 8 warps.
    for (const Shape& s : {Shape{1, 1, 1, 1}, Shape{3, 5, 7, 7}, Shape{2, 2, 15, 20}, Shape{4, 64, 3, 3}}) {
        INFO("x " << s.str());
        const Tensor x = Tensor::uniform(s, -2.0f, 3.0f, rng);
        GlobalAvgPool cpu_pool, gpu_pool;
        const Tensor y = cpu_pool.forward(x);
        const Tensor dy = Tensor::uniform(y.shape(), -1.0f, 1.0f, rng);
        const Tensor dx = cpu_pool.backward(dy);
        under_schedules([&] {
            require_close(gpu_pool.forward(cuda_copy(x)), y, 1e-6);
            require_close(gpu_pool.backward(cuda_copy(dy)), dx, 1e-6);
        });
    }
}

// ---- batch norm ----------------------------------------------------------------------------------
TEST_CASE("cuda batch norm matches the CPU in training and evaluation", "[cuda][batchnorm][lesson06]") {
    struct Case {
        const char* what;
        Shape shape;
        float offset;  // added to every x: |mean| ≫ std tests the two-pass variance
    };
    const Case cases[] = {
        {"BatchNorm1d, M = 2 (the smallest batch that trains)", {2, 3}, 0.0f},
        {"BatchNorm1d on [N, C, L]", {3, 4, 5}, 0.0f},
        {"BatchNorm2d, batch 1, odd sizes", {1, 3, 5, 7}, 0.0f},
        {"BatchNorm2d, M = 600 > 256 threads", {6, 2, 10, 10}, 0.0f},
        {"BatchNorm2d, |mean| = 1000 ≫ std = 0.6", {4, 2, 6, 6}, 1000.0f},
    };
    Rng rng(5);
    for (const Case& c : cases) {
        INFO(c.what << ": x " << c.shape.str());
        Tensor x = Tensor::uniform(c.shape, -1.0f, 1.0f, rng);
        for (int64_t i = 0; i < x.numel(); i++) x.data<float>()[i] += c.offset;
        const Tensor dy = Tensor::uniform(c.shape, -1.0f, 1.0f, rng);
        const uint64_t seed = rng.next_u64();
        std::unique_ptr<BatchNorm> cpu_bn = make_bn(c.shape, seed);
        const Tensor y = cpu_bn->forward(x);
        const Tensor dx = cpu_bn->backward(dy);
        cpu_bn->eval();
        const Tensor y_eval = cpu_bn->forward(x);
        under_schedules([&] {
            std::unique_ptr<BatchNorm> gpu_bn = make_bn(c.shape, seed);
            gpu_bn->to(Device::CUDA);
            require_close(gpu_bn->forward(cuda_copy(x)), y, 1e-5);
            require_close(gpu_bn->running_mean, cpu_bn->running_mean, 1e-6);
            require_close(gpu_bn->running_var, cpu_bn->running_var, 1e-6);
            require_close(gpu_bn->backward(cuda_copy(dy)), dx, 1e-5);
            require_close(gpu_bn->weight.grad, cpu_bn->weight.grad, 1e-5);
            require_close(gpu_bn->bias.grad, cpu_bn->bias.grad, 1e-5);
            gpu_bn->eval();
            require_close(gpu_bn->forward(cuda_copy(x)), y_eval, 1e-6);
        });
    }
}

TEST_CASE("cuda batch norm gives the same bits on every run", "[cuda][batchnorm][lesson06]") {
    // No atomics: each channel's sums are one block's fixed tree, whatever order threads run in.
    Rng rng(6);
    const Tensor x = cuda_copy(Tensor::normal({5, 3, 9, 9}, 0.5f, 2.0f, rng));
    const Tensor dy = cuda_copy(Tensor::normal({5, 3, 9, 9}, 0.0f, 1.0f, rng));
    std::vector<Tensor> outs;
    under_schedules([&] {
        BatchNorm2d bn(3);
        bn.to(Device::CUDA);
        outs.push_back(bn.forward(x));
        outs.push_back(bn.backward(dy));
        outs.push_back(bn.weight.grad);
    });
    for (size_t i = 3; i < outs.size(); i++) require_identical(outs[i], outs[i - 3]);
}

// ---- dropout -------------------------------------------------------------------------------------
TEST_CASE("cuda dropout draws the CPU's mask bit for bit", "[cuda][dropout][lesson06]") {
    Rng rng(8);
    const uint64_t seed_hash = Rng(42).seed_hash(), first = 123456789;
    // 300,007 > 1024 blocks · 256 threads: the grid-stride loop; drop_p = 1 drops everything
    for (int64_t n : {int64_t(1), int64_t(1000), int64_t(300007)})
        for (float drop_p : {0.1f, 0.5f, 1.0f}) {
            INFO("n = " << n << ", drop_p = " << drop_p);
            const Tensor x = Tensor::uniform({n}, -1.0f, 1.0f, rng), dy = Tensor::uniform({n}, -1.0f, 1.0f, rng);
            Tensor y = Tensor::empty({n}), dx = Tensor::empty({n}), mask = Tensor::empty({n}, DType::U8);
            cpu::dropout_forward(x.data<float>(), y.data<float>(), mask.data<uint8_t>(), n, drop_p, seed_hash, first);
            cpu::dropout_backward(dy.data<float>(), mask.data<uint8_t>(), dx.data<float>(), n, drop_p);
            const Tensor gx = cuda_copy(x), gdy = cuda_copy(dy);
            Tensor gy = Tensor::empty({n}, DType::F32, Device::CUDA);
            Tensor gdx = Tensor::empty({n}, DType::F32, Device::CUDA);
            Tensor gmask = Tensor::empty({n}, DType::U8, Device::CUDA);
            under_schedules([&] {
                cuda::dropout_forward(gx.data<float>(), gy.data<float>(), gmask.data<uint8_t>(), n, drop_p, seed_hash,
                                      first);
                cuda::dropout_backward(gdy.data<float>(), gmask.data<uint8_t>(), gdx.data<float>(), n, drop_p);
                require_identical(gmask, mask);
                require_identical(gy, y);
                require_identical(gdx, dx);
            });
        }
}

TEST_CASE("cuda Dropout layer: the CPU's masks step after step, identity in eval", "[cuda][dropout][lesson06]") {
    Rng rng(9);
    Dropout cpu_drop(0.3f, 11), gpu_drop(0.3f, 11);
    for (int step = 0; step < 3; step++) {  // each forward draws fresh counters: the streams stay in step
        INFO("step " << step);
        const Tensor x = Tensor::uniform({4, 33}, -1.0f, 1.0f, rng), dy = Tensor::uniform({4, 33}, -1.0f, 1.0f, rng);
        require_identical(gpu_drop.forward(cuda_copy(x)), cpu_drop.forward(x));
        require_identical(gpu_drop.backward(cuda_copy(dy)), cpu_drop.backward(dy));
    }
    gpu_drop.eval();
    const Tensor x = cuda_copy(Tensor::ones({3, 3}));
    CHECK(gpu_drop.forward(x).raw() == x.raw());  // the identity returns x itself
}

// ---- residual --------------------------------------------------------------------------------------
TEST_CASE("cuda residual blocks match the CPU", "[cuda][residual][lesson05]") {
    // A block of lesson 06: conv → batch norm → GELU, plus a strided 1x1 projection shortcut;
    // built twice from the same seed, one copy moved to cuda.
    auto block = [](Rng& rng) {
        auto f = std::make_unique<Sequential>();
        f->emplace<Conv2d>(2, 4, 3, rng, ConvOptions{2, 1, 1, 1, false}, "conv");
        f->emplace<BatchNorm2d>(4, "bn");
        f->emplace<GELU>();
        auto shortcut = std::make_unique<Conv2d>(2, 4, 1, rng, ConvOptions{2, 0, 1, 1, false}, "proj");
        return std::make_unique<Residual>(std::move(f), std::move(shortcut));
    };
    Rng rng(10), rng_cpu(1), rng_gpu(1);
    std::unique_ptr<Residual> cpu_res = block(rng_cpu), gpu_res = block(rng_gpu);
    gpu_res->to(Device::CUDA);
    const Tensor x = Tensor::normal({3, 2, 7, 6}, 0.0f, 1.0f, rng);
    const Tensor y = cpu_res->forward(x);
    const Tensor dy = Tensor::normal(y.shape(), 0.0f, 1.0f, rng);
    const Tensor dx = cpu_res->backward(dy);
    require_close(gpu_res->forward(cuda_copy(x)), y, 1e-5);
    require_close(gpu_res->backward(cuda_copy(dy)), dx, 1e-5);
    const std::vector<Parameter*> cpu_params = cpu_res->parameters(), gpu_params = gpu_res->parameters();
    for (size_t i = 0; i < cpu_params.size(); i++) {
        INFO(cpu_params[i]->name);
        require_close(gpu_params[i]->grad, cpu_params[i]->grad, 1e-5);
    }
}

// ---- finite differences on the device ---------------------------------------------------------------
TEST_CASE("cuda pooling, batch norm, GELU, dropout and residual gradients match finite differences",
          "[cuda][pool][batchnorm][gelu][dropout][residual][gradcheck][lesson05][lesson06]") {
    Rng rng(12);
    SECTION("MaxPool2d 3x3, stride 2, padding 1") {
        MaxPool2d pool(3, 2, 1);
        check_module_gradients(pool, cuda_copy(spread({2, 2, 5, 5}, rng)));
    }
    SECTION("AvgPool2d 3x3, stride 2, padding 1") {
        AvgPool2d pool(3, 2, 1);
        check_module_gradients(pool, cuda_copy(Tensor::normal({1, 2, 5, 6}, 0.0f, 1.0f, rng)));
    }
    SECTION("GlobalAvgPool") {
        GlobalAvgPool pool;
        check_module_gradients(pool, cuda_copy(Tensor::normal({2, 3, 3, 3}, 0.0f, 1.0f, rng)));
    }
    SECTION("BatchNorm2d, training") {
        std::unique_ptr<BatchNorm> bn = make_bn({2, 3, 3, 3}, 1);
        bn->to(Device::CUDA);
        check_module_gradients(*bn, cuda_copy(Tensor::normal({2, 3, 3, 3}, 0.5f, 2.0f, rng)));
    }
    SECTION("BatchNorm1d, training") {
        std::unique_ptr<BatchNorm> bn = make_bn({5, 4}, 2);
        bn->to(Device::CUDA);
        check_module_gradients(*bn, cuda_copy(Tensor::normal({5, 4}, 0.0f, 1.0f, rng)));
    }
    SECTION("GELU") {
        GELU gelu;
        check_module_gradients(gelu, cuda_copy(Tensor::normal({3, 7}, 0.0f, 2.0f, rng)));
    }
    SECTION("Dropout, fixed mask") {
        Dropout drop(0.4f, 3);
        drop.fixed_mask = true;
        check_module_gradients(drop, cuda_copy(Tensor::normal({4, 6}, 0.0f, 1.0f, rng)));
    }
    SECTION("Residual: conv → GELU → conv plus the identity") {
        auto f = std::make_unique<Sequential>();
        f->emplace<Conv2d>(2, 2, 3, rng, ConvOptions{1, 1, 1, 1, true}, "conv_a");
        f->emplace<GELU>();
        f->emplace<Conv2d>(2, 2, 3, rng, ConvOptions{1, 1, 1, 1, false}, "conv_b");
        Residual res(std::move(f));
        res.to(Device::CUDA);
        check_module_gradients(res, cuda_copy(Tensor::normal({2, 2, 4, 4}, 0.0f, 1.0f, rng)));
    }
}

// ---- errors ---------------------------------------------------------------------------------------
TEST_CASE("cuda layers name the tensor and both devices when they are apart", "[cuda][batchnorm][pool][lesson05][lesson06]") {
    using Catch::Matchers::Contains;
    BatchNorm2d bn(2, "bn1");  // still on the CPU
    REQUIRE_THROWS_WITH(bn.forward(cuda_copy(Tensor::ones({2, 2, 3, 3}))),
                        Contains("bn1") && Contains("weight is on cpu but the input is on cuda") &&
                            Contains("model.to(Device::CUDA)"));
    MaxPool2d pool(2, 2, 0, "pool1");
    pool.forward(cuda_copy(Tensor::ones({1, 1, 4, 4})));
    REQUIRE_THROWS_WITH(pool.backward(Tensor::ones({1, 1, 2, 2})),
                        Contains("pool1") && Contains("dy is on cpu but the input is on cuda"));
}
