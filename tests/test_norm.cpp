// test_norm.cpp — BatchNorm1d / BatchNorm2d (chapter 06): a case computed by hand, the running
// statistics, eval mode, a double-precision reference, finite differences, threads, errors; on
// CUDA (cuda/norm.cu): the CPU's results on edge shapes (M = 2, M > 256 threads, |mean| ≫ std),
// the same bits on every run, finite differences on the device, the devices' error.
// LayerNorm: a case computed by hand (forward and backward), finite differences, threads, errors;
// and on CUDA: the CPU's results on edge shapes, the same bits under every schedule, finite
// differences on the device. Both in f16 and bf16 (chapter 09) against f32, within the bound of
// lowp_check.h, on the CPU and CUDA; and the CPU kernels' f16/bf16 blocks, bit for bit the f32
// kernel's result rounded once, on every CPU level and thread count; and the autocast class each
// runs in.
//
// Run: make build/tests/kiln_tests && build/tests/kiln_tests '[batchnorm]'   (or '[layernorm]')
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include <catch2/catch.hpp>
#include <omp.h>

#include "core/rng.h"
#include "fixtures.h"
#include "gradcheck.h"
#include "lowp_check.h"
#include "nn/norm.h"
#include "ops/all.h"
#include "ops/norm.h"

using namespace kiln;
using test::cuda_copy;
using test::require_close;
using test::require_identical;
using test::same_bits;
using test::tensor_of;
using test::under_schedules;

// BatchNorm1d(2) on x [4, 2]:
//
//        ch0  ch1        ch0: mean 4,  biased var (9 + 1 + 1 + 9) / 4 = 5,   unbiased 20/3
//   x =   1   10         ch1: mean 20, biased var (100 + 100 + 0 + 400) / 4 = 150, unbiased 200
//         3   10
//         5   20         y[:,0] = (−3, −1, 1, 3) / √(5 + 1e-5)
//         7   40         y[:,1] = (−10, −10, 0, 20) / √(150 + 1e-5)
//
// running_mean = 0.9 · 0 + 0.1 · (4, 20)      = (0.4, 2.0)
// running_var  = 0.9 · 1 + 0.1 · (20/3, 200)  = (1.5666667, 20.9)
TEST_CASE("BatchNorm1d train and eval on a [4, 2] batch computed by hand", "[batchnorm][cpu][lesson06]") {
    BatchNorm1d bn(2);
    const Tensor x = tensor_of({4, 2}, {1, 10, 3, 10, 5, 20, 7, 40});
    Tensor y = bn.forward(x);
    const double s0 = std::sqrt(5.0 + 1e-5), s1 = std::sqrt(150.0 + 1e-5);
    const double want[8] = {-3 / s0, -10 / s1, -1 / s0, -10 / s1, 1 / s0, 0, 3 / s0, 20 / s1};
    for (int i = 0; i < 8; i++) CHECK(y.data<float>()[i] == Approx(want[i]).epsilon(1e-6));
    CHECK(bn.running_mean.data<float>()[0] == Approx(0.4).epsilon(1e-6));
    CHECK(bn.running_mean.data<float>()[1] == Approx(2.0).epsilon(1e-6));
    CHECK(bn.running_var.data<float>()[0] == Approx(0.9 + 0.1 * 20.0 / 3.0).epsilon(1e-6));
    CHECK(bn.running_var.data<float>()[1] == Approx(20.9).epsilon(1e-6));

    SECTION("a second step moves the running statistics again") {
        bn.forward(x);
        CHECK(bn.running_mean.data<float>()[0] == Approx(0.9 * 0.4 + 0.1 * 4).epsilon(1e-6));
        CHECK(bn.running_var.data<float>()[1] == Approx(0.9 * 20.9 + 0.1 * 200).epsilon(1e-6));
    }
    SECTION("eval uses the running statistics and leaves them alone") {
        bn.weight.value.data<float>()[0] = 2.0f;  // y = weight · x̂ + bias
        bn.bias.value.data<float>()[1] = -1.0f;
        bn.eval();
        Tensor ye = bn.forward(x);
        const double rv0 = 0.9 + 0.1 * 20.0 / 3.0, rv1 = 20.9;
        for (int n = 0; n < 4; n++) {
            CHECK(ye.data<float>()[2 * n] ==
                  Approx(2.0 * (x.data<float>()[2 * n] - 0.4) / std::sqrt(rv0 + 1e-5)).epsilon(1e-6));
            CHECK(ye.data<float>()[2 * n + 1] ==
                  Approx((x.data<float>()[2 * n + 1] - 2.0) / std::sqrt(rv1 + 1e-5) - 1.0).epsilon(1e-6));
        }
        CHECK(bn.running_mean.data<float>()[0] == Approx(0.4).epsilon(1e-6));
    }
    SECTION("named_buffers() names the running statistics") {
        auto b = bn.named_buffers();
        REQUIRE(b.size() == 2);
        CHECK(b[0].first == "running_mean");
        CHECK(b[1].first == "running_var");
        CHECK(b[0].second == &bn.running_mean);
        CHECK(bn.parameters().size() == 2);
        CHECK(bn.parameters()[0]->name == "weight");
    }
}

TEST_CASE("BatchNorm2d matches a double-precision reference, even with a large mean", "[batchnorm][cpu][lesson06]") {
    const int64_t N = 4, C = 3, H = 5, W = 6, S = H * W;
    Rng rng(12);
    // channel 2 sits at 1000 with spread 0.01: Σx² − (Σx)²/M would lose every digit in f32
    Tensor x = Tensor::normal({N, C, H, W}, 0.0f, 1.0f, rng);
    for (int64_t n = 0; n < N; n++)
        for (int64_t s = 0; s < S; s++) {
            float& v = x.data<float>()[(n * C + 2) * S + s];
            v = 1000.0f + 0.01f * v;
        }
    BatchNorm2d bn(C);
    Rng prng(13);
    bn.weight.value = Tensor::uniform({C}, 0.5f, 1.5f, prng);
    bn.bias.value = Tensor::uniform({C}, -0.5f, 0.5f, prng);
    Tensor y = bn.forward(x);
    for (int64_t c = 0; c < C; c++) {
        double mean = 0, var = 0;
        for (int64_t n = 0; n < N; n++)
            for (int64_t s = 0; s < S; s++) mean += x.data<float>()[(n * C + c) * S + s];
        mean /= double(N * S);
        for (int64_t n = 0; n < N; n++)
            for (int64_t s = 0; s < S; s++) var += std::pow(x.data<float>()[(n * C + c) * S + s] - mean, 2);
        var /= double(N * S);
        const double g = bn.weight.value.data<float>()[c], b = bn.bias.value.data<float>()[c];
        for (int64_t n = 0; n < N; n++)
            for (int64_t s = 0; s < S; s++) {
                const int64_t i = (n * C + c) * S + s;
                CHECK(y.data<float>()[i] == Approx(g * (x.data<float>()[i] - mean) / std::sqrt(var + 1e-5) + b)
                                                .epsilon(2e-3)
                                                .margin(2e-3));
            }
        CHECK(bn.running_var.data<float>()[c] ==
              Approx(0.9 + 0.1 * var * double(N * S) / double(N * S - 1)).epsilon(1e-4));
    }
}

TEST_CASE("BatchNorm gradients match finite differences (training mode)", "[batchnorm][cpu][lesson06][gradcheck]") {
    Rng rng(21);
    SECTION("BatchNorm2d") {
        BatchNorm2d bn(3);
        bn.weight.value = Tensor::uniform({3}, 0.5f, 1.5f, rng);
        bn.bias.value = Tensor::uniform({3}, -0.5f, 0.5f, rng);
        check_module_gradients(bn, Tensor::normal({3, 3, 4, 3}, 0.5f, 2.0f, rng), 1);
    }
    SECTION("BatchNorm1d") {
        BatchNorm1d bn(4);
        bn.weight.value = Tensor::uniform({4}, 0.5f, 1.5f, rng);
        check_module_gradients(bn, Tensor::normal({6, 4}, -1.0f, 1.5f, rng), 2);
    }
    SECTION("BatchNorm1d on [N, C, L]") {
        BatchNorm1d bn(2);
        check_module_gradients(bn, Tensor::normal({3, 2, 5}, 0.0f, 1.0f, rng), 3);
    }
}

TEST_CASE("BatchNorm2d gives the same bits on 1 and 2 threads", "[batchnorm][cpu][lesson06][threads]") {
    Rng rng(31);
    Tensor x = Tensor::normal({16, 32, 16, 16}, 0.3f, 2.0f, rng);
    Tensor dy = Tensor::normal(x.shape(), 0.0f, 1.0f, rng);
    const int saved = omp_get_max_threads();
    Tensor y[2], dx[2], dg[2], db[2], rm[2], rv[2];
    for (int t = 1; t <= 2; t++) {
        omp_set_num_threads(t);
        BatchNorm2d bn(32);
        y[t - 1] = bn.forward(x);
        dx[t - 1] = bn.backward(dy);
        dg[t - 1] = bn.weight.grad;
        db[t - 1] = bn.bias.grad;
        rm[t - 1] = bn.running_mean;
        rv[t - 1] = bn.running_var;
    }
    omp_set_num_threads(saved);
    CHECK(same_bits(y[0], y[1]));
    CHECK(same_bits(dx[0], dx[1]));
    CHECK(same_bits(dg[0], dg[1]));
    CHECK(same_bits(db[0], db[1]));
    CHECK(same_bits(rm[0], rm[1]));
    CHECK(same_bits(rv[0], rv[1]));
}

TEST_CASE("BatchNorm errors name the layer and the shapes", "[batchnorm][cpu][lesson06]") {
    using Catch::Matchers::Contains;
    BatchNorm2d bn2(3, "bn1");
    REQUIRE_THROWS_AS(bn2.forward(Tensor::zeros({2, 4, 5, 5})), Error);
    REQUIRE_THROWS_WITH(bn2.forward(Tensor::zeros({2, 4, 5, 5})), Contains("bn1") && Contains("[2, 4, 5, 5]"));
    REQUIRE_THROWS_WITH(bn2.forward(Tensor::zeros({2, 3})), Contains("bn1") && Contains("[2, 3]"));
    REQUIRE_THROWS_WITH(bn2.backward(Tensor::zeros({2, 3, 5, 5})), Contains("bn1") && Contains("backward"));
    BatchNorm1d bn1(3, "fc_bn");
    REQUIRE_THROWS_WITH(bn1.forward(Tensor::zeros({1, 3})), Contains("fc_bn") && Contains("more than one value"));
    bn1.eval();
    CHECK_NOTHROW(bn1.forward(Tensor::zeros({1, 3})));  // eval needs no batch statistics
}

// ---- BatchNorm on CUDA (cuda/norm.cu; on the emulator without a GPU, under three schedules) ------
// Per-channel sums in another order than the CPU's, both in double: y, dx and the parameters'
// gradients within 1e-5 of the CPU's (relative to the largest |value|), the eval forward and the
// running statistics within 1e-6.
namespace {

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

TEST_CASE("cuda batch norm gradients match finite differences", "[cuda][batchnorm][lesson06][gradcheck]") {
    Rng rng(12);
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
}

TEST_CASE("cuda batch norm names the layer and both devices when they are apart", "[cuda][batchnorm][lesson06]") {
    using Catch::Matchers::Contains;
    BatchNorm2d bn(2, "bn1");  // still on the CPU
    REQUIRE_THROWS_WITH(bn.forward(cuda_copy(Tensor::ones({2, 2, 3, 3}))),
                        Contains("bn1") && Contains("weight is on cpu but the input is on cuda") &&
                            Contains("model.to(Device::CUDA)"));
}

// ---- LayerNorm ------------------------------------------------------------------------------------
// LayerNorm(4) on x [2, 4], weight w = (1, 2, 0.5, −1), bias b = (0, 1, 0, 0.5):
//
//   row 0 = (1, 2, 3, 6):     mean 3, x − mean = (−2, −1, 0, 3), var = (4 + 1 + 0 + 9) / 4 = 3.5
//   row 1 = (−1, −1, 1, 1):   mean 0, var 1
//   x̂ = (x − mean) / σ with σ0 = √(3.5 + 1e-5), σ1 = √(1 + 1e-5);   y = w · x̂ + b
//
// backward with dy = [[1, 0, 0, 0], [0, 0, 0, 0]] (only y[0, 0] matters):
//   dbias = Σ_rows dy = (1, 0, 0, 0)          dweight = Σ_rows dy · x̂ = (−2/σ0, 0, 0, 0)
//   row 0: g = w · dy = (1, 0, 0, 0), Σ g = 1, Σ g·x̂ = −2/σ0
//          dx_d = (g_d − 1/4 − x̂_d · (−2/σ0) / 4) / σ0          row 1: g = 0, so dx = 0
TEST_CASE("LayerNorm forward and backward on a [2, 4] batch computed by hand", "[layernorm][cpu][lesson06]") {
    LayerNorm ln(4);
    ln.weight.value = tensor_of({4}, {1, 2, 0.5f, -1});
    ln.bias.value = tensor_of({4}, {0, 1, 0, 0.5f});
    const Tensor x = tensor_of({2, 4}, {1, 2, 3, 6, -1, -1, 1, 1});
    const Tensor y = ln.forward(x);
    const double s0 = std::sqrt(3.5 + 1e-5), s1 = std::sqrt(1.0 + 1e-5);
    const double want_y[8] = {-2 / s0, 1 - 2 / s0, 0, 0.5 - 3 / s0, -1 / s1, 1 - 2 / s1, 0.5 / s1, 0.5 - 1 / s1};
    for (int i = 0; i < 8; i++) CHECK(y.data<float>()[i] == Approx(want_y[i]).margin(1e-6));

    const Tensor dx = ln.backward(tensor_of({2, 4}, {1, 0, 0, 0, 0, 0, 0, 0}));
    const double xhat0[4] = {-2 / s0, -1 / s0, 0, 3 / s0}, g0[4] = {1, 0, 0, 0};
    for (int d = 0; d < 4; d++) {
        CHECK(dx.data<float>()[d] == Approx((g0[d] - 0.25 - xhat0[d] * (-2 / s0) / 4) / s0).margin(1e-6));
        CHECK(dx.data<float>()[4 + d] == 0.0f);
        CHECK(ln.bias.grad.data<float>()[d] == float(g0[d]));
        CHECK(ln.weight.grad.data<float>()[d] == Approx(d == 0 ? -2 / s0 : 0.0).margin(1e-6));
    }
}

TEST_CASE("LayerNorm gradients match finite differences", "[layernorm][cpu][lesson06][gradcheck]") {
    Rng rng(23);
    SECTION("[N, D]") {
        LayerNorm ln(5);
        ln.weight.value = Tensor::uniform({5}, 0.5f, 1.5f, rng);
        ln.bias.value = Tensor::uniform({5}, -0.5f, 0.5f, rng);
        check_module_gradients(ln, Tensor::normal({4, 5}, 0.5f, 2.0f, rng), 1);
    }
    SECTION("[N, L, D]: every leading dimension is a row") {
        LayerNorm ln(3);
        ln.weight.value = Tensor::uniform({3}, -1.5f, 1.5f, rng);
        check_module_gradients(ln, Tensor::normal({2, 3, 3}, -1.0f, 1.5f, rng), 2);
    }
}

TEST_CASE("LayerNorm gives the same bits on 1 and 2 threads", "[layernorm][cpu][lesson06][threads]") {
    Rng rng(33);
    const Tensor x = Tensor::normal({64, 8, 200}, 0.3f, 2.0f, rng);
    const Tensor dy = Tensor::normal(x.shape(), 0.0f, 1.0f, rng);
    const int saved = omp_get_max_threads();
    Tensor y[2], dx[2], dw[2], db[2];
    for (int t = 1; t <= 2; t++) {
        omp_set_num_threads(t);
        LayerNorm ln(200);
        y[t - 1] = ln.forward(x);
        dx[t - 1] = ln.backward(dy);
        dw[t - 1] = ln.weight.grad;
        db[t - 1] = ln.bias.grad;
    }
    omp_set_num_threads(saved);
    CHECK(same_bits(y[0], y[1]));
    CHECK(same_bits(dx[0], dx[1]));
    CHECK(same_bits(dw[0], dw[1]));
    CHECK(same_bits(db[0], db[1]));
}

TEST_CASE("LayerNorm errors name the layer and the shapes", "[layernorm][cpu][lesson06]") {
    using Catch::Matchers::Contains;
    LayerNorm ln(4, "ln1");
    REQUIRE_THROWS_WITH(ln.forward(Tensor::zeros({2, 5})), Contains("ln1") && Contains("[2, 5]"));
    REQUIRE_THROWS_WITH(ln.backward(Tensor::zeros({2, 4})), Contains("ln1") && Contains("backward"));
    ln.forward(Tensor::zeros({2, 4}));
    REQUIRE_THROWS_WITH(ln.backward(Tensor::zeros({2, 3})), Contains("ln1") && Contains("[2, 4]"));
    REQUIRE_THROWS_WITH(LayerNorm(0, "ln2"), Contains("ln2"));
    Tensor mean, invstd;
    REQUIRE_THROWS_WITH(layernorm(Tensor::zeros({2, 4}), Tensor::ones({3}), Tensor::zeros({4}), 1e-5f, &mean, &invstd),
                        Contains("layernorm") && Contains("'gamma'") && Contains("[4]"));
}

// ---- LayerNorm on CUDA (cuda/norm.cu; on the emulator without a GPU, under three schedules) ------
// Row sums in another order than the CPU's, both in double: y and dx within 1e-5 of the CPU's.
TEST_CASE("cuda layer norm matches the CPU and gives the same bits on every run", "[cuda][layernorm][lesson06]") {
    const Shape shapes[] = {
        {1, 1},       // D = 1: x̂ = 0, y = bias
        {3, 7},       // fewer values in a row than threads in a block
        {2, 3, 300},  // D = 300 > 256 threads; leading dimensions flattened into 6 rows
    };
    Rng rng(7);
    for (const Shape& s : shapes) {
        INFO("x " << s.str());
        const int64_t D = s[s.ndim - 1];
        const Tensor x = Tensor::normal(s, 0.5f, 2.0f, rng), dy = Tensor::normal(s, 0.0f, 1.0f, rng);
        const Tensor weight = Tensor::uniform({D}, 0.5f, 1.5f, rng), bias = Tensor::uniform({D}, -0.5f, 0.5f, rng);
        LayerNorm cpu_ln(D);
        cpu_ln.weight.value = weight;
        cpu_ln.bias.value = bias;
        const Tensor y = cpu_ln.forward(x), dx = cpu_ln.backward(dy);
        std::vector<Tensor> first;  // the first schedule's results: the second must give the same bits
        under_schedules([&] {
            LayerNorm gpu_ln(D);
            gpu_ln.weight.value = weight;
            gpu_ln.bias.value = bias;
            gpu_ln.to(Device::CUDA);
            // Row sums in another order than the CPU's, both in double: y and dx within a few ulps
            const std::vector<Tensor> got = {gpu_ln.forward(x.to(Device::CUDA)), gpu_ln.backward(dy.to(Device::CUDA)),
                                             gpu_ln.weight.grad, gpu_ln.bias.grad};
            require_close(got[0], y, 1e-5);
            require_close(got[1], dx, 1e-5);
            require_close(got[2], cpu_ln.weight.grad, 1e-5);
            require_close(got[3], cpu_ln.bias.grad, 1e-5);
            if (first.empty()) first = got;
            for (size_t i = 0; i < got.size(); i++) require_identical(got[i], first[i]);
        });
    }
}

TEST_CASE("cuda layer norm gradients match finite differences", "[cuda][layernorm][lesson06][gradcheck]") {
    Rng rng(8);
    LayerNorm ln(6);
    ln.weight.value = Tensor::uniform({6}, 0.5f, 1.5f, rng);
    ln.to(Device::CUDA);
    check_module_gradients(ln, Tensor::normal({3, 2, 6}, 0.0f, 1.5f, rng).to(Device::CUDA), 4);
}

// ---- f16 and bf16 (chapter 09): within the bound of f32 (lowp_check.h) ----------------------------
namespace {

using namespace test::lowp;

// x, y, dy, dx in T; gamma, beta, the statistics, dgamma and dbeta f32 in both runs. The
// statistics are sums of the same values in f32 or double on both sides (r = 0, n = the M values
// of a channel); y and dx are one f32 expression of them, rounded once (S = |y|, n = 2: the
// reference's last two operations and the T side's); dgamma = Σ dy·x̂ and dbeta = Σ dy over M.
struct NormInputs {
    Tensor x, gamma, beta, dy;
};

NormInputs norm_inputs(const LowType& t, const Shape& xs, int64_t features, uint64_t seed) {
    Rng rng(seed);
    // x off-centre (mean about 1, std about 1.2); gamma and beta stay f32 in every run
    return {values_in(t, xs, -1, 3, rng), Tensor::uniform({features}, 0.5f, 1.5f, rng),
            Tensor::uniform({features}, -0.5f, 0.5f, rng), values_in(t, xs, -1, 1, rng)};
}

// Σ|dy| and Σ|dy·x̂| per feature, for dbeta's and dgamma's bounds: the f32 backward on |dy| with
// x̂ replaced by |x̂| is not an op, so the two sums are taken here, with (x, mean, invstd) laid
// out as `feature_of(i)` and `group_of(i)` say.
struct ParamSums {
    Tensor dbeta, dgamma;
};
ParamSums param_sums(const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& invstd, int64_t features,
                     const std::function<int64_t(int64_t)>& feature_of, const std::function<int64_t(int64_t)>& group_of) {
    ParamSums s{Tensor::zeros({features}), Tensor::zeros({features})};
    const float *xv = x.data<float>(), *g = dy.data<float>(), *m = mean.data<float>(), *is = invstd.data<float>();
    for (int64_t i = 0; i < x.numel(); i++) {
        const int64_t f = feature_of(i), r = group_of(i);
        s.dbeta.data<float>()[f] += std::fabs(g[i]);
        s.dgamma.data<float>()[f] += std::fabs(g[i] * (xv[i] - m[r]) * is[r]);
    }
    return s;
}

OpCheck batchnorm_check(const LowType& t) {
    const int64_t N = 3, C = 4, H = 3, W = 5, S = H * W;
    const NormInputs in = norm_inputs(t, {N, C, H, W}, C, 9);
    auto run = [=](Device device, DType dt) {
        auto f32 = [&](const Tensor& v) { return v.to(device); };
        Tensor rm = Tensor::zeros({C}, DType::F32, device), rv = Tensor::ones({C}, DType::F32, device);
        Tensor mean, invstd;
        const Tensor xd = in.x.to(dt).to(device);
        const Tensor y = batchnorm_train(xd, f32(in.gamma), f32(in.beta), rm, rv, 1e-5f, 0.1f, &mean, &invstd);
        const Tensor ye = batchnorm_eval(xd, f32(in.gamma), f32(in.beta), rm, rv, 1e-5f);
        Tensor dgamma = Tensor::zeros({C}, DType::F32, device), dbeta = Tensor::zeros({C}, DType::F32, device);
        const Tensor dx = batchnorm_backward(in.dy.to(dt).to(device), xd, f32(in.gamma), mean, invstd, dgamma, dbeta);
        return std::vector<Tensor>{host_f32(y),  host_f32(mean),   host_f32(invstd), host_f32(rm),   host_f32(rv),
                                   host_f32(ye), host_f32(dx), host_f32(dgamma), host_f32(dbeta)};
    };
    const std::vector<Tensor> ref = run(Device::CPU, DType::F32);
    const ParamSums ps = param_sums(
        in.x, in.dy, ref[1], ref[2], C, [&](int64_t i) { return i / S % C; }, [&](int64_t i) { return i / S % C; });
    const double M = double(N * S), gap = 1e-5;  // the CUDA batch-norm cases' relative tolerance
    auto b = [&](const Tensor& s, double n, double r) { return Bound{s, n, r, r, gap * max_abs(s)}; };
    return {run,
            {b(abs_of(ref[0]), 2, 1), b(abs_of(ref[1]), M, 0), b(abs_of(ref[2]), M, 0), b(abs_of(ref[3]), M, 0),
             b(abs_of(ref[4]), M, 0), b(abs_of(ref[5]), 2, 1), b(abs_of(ref[6]), 2, 1), b(ps.dgamma, M, 0),
             b(ps.dbeta, M, 0)}};
}

OpCheck layernorm_check(const LowType& t) {
    const int64_t R = 6, D = 20;
    const NormInputs in = norm_inputs(t, {2, 3, D}, D, 10);
    auto run = [=](Device device, DType dt) {
        Tensor mean, invstd;
        const Tensor xd = in.x.to(dt).to(device), gamma = in.gamma.to(device);
        const Tensor y = layernorm(xd, gamma, in.beta.to(device), 1e-5f, &mean, &invstd);
        Tensor dgamma = Tensor::zeros({D}, DType::F32, device), dbeta = Tensor::zeros({D}, DType::F32, device);
        const Tensor dx = layernorm_backward(in.dy.to(dt).to(device), xd, gamma, mean, invstd, dgamma, dbeta);
        return std::vector<Tensor>{host_f32(y),  host_f32(mean),   host_f32(invstd),
                                   host_f32(dx), host_f32(dgamma), host_f32(dbeta)};
    };
    const std::vector<Tensor> ref = run(Device::CPU, DType::F32);
    const ParamSums ps = param_sums(
        in.x, in.dy, ref[1], ref[2], D, [&](int64_t i) { return i % D; }, [&](int64_t i) { return i / D; });
    const double gap = 1e-5;  // as for batch norm
    auto b = [&](const Tensor& s, double n, double r) { return Bound{s, n, r, r, gap * max_abs(s)}; };
    // dx = invstd·(g − Σg/D − x̂·Σg·x̂/D): sums of D terms
    return {run,
            {b(abs_of(ref[0]), 2, 1), b(abs_of(ref[1]), double(D), 0), b(abs_of(ref[2]), double(D), 0),
             b(abs_of(ref[3]), double(D) + 2, 1), b(ps.dgamma, double(R), 0), b(ps.dbeta, double(R), 0)}};
}

void norm_checks(Device device) {
    check_op(device, batchnorm_check);
    check_op(device, layernorm_check);
}

}  // namespace

TEST_CASE("f16 and bf16 batch and layer norm on the CPU, statistics in f32, within the bound of f32",
          "[lowp][lesson09][cpu][batchnorm][layernorm]") {
    norm_checks(Device::CPU);
}

TEST_CASE("f16 and bf16 batch and layer norm on CUDA, statistics in f32, within the bound of f32 and the CPU",
          "[lowp][lesson09][cuda][batchnorm][layernorm]") {
    norm_checks(Device::CUDA);
}

TEST_CASE("lowp norms: a parameter in f16 or bf16 is an error; f32 parameters with f16 activations run",
          "[lowp][lesson09][cpu][batchnorm][layernorm]") {
    using Catch::Matchers::Contains;
    const Tensor x = Tensor::zeros({2, 3, 6, 6}, DType::F16);
    Tensor mean = Tensor::zeros({3}), var = Tensor::ones({3}), save_mean, save_invstd;
    REQUIRE_THROWS_WITH(batchnorm_train(x, Tensor::ones({3}, DType::F16), Tensor::zeros({3}), mean, var, 1e-5f, 0.1f,
                                        &save_mean, &save_invstd),
                        Contains("batchnorm_train") && Contains("'gamma' is f16") && Contains("should be f32") &&
                            Contains("(here f16)"));
    REQUIRE_THROWS_WITH(layernorm(x, Tensor::ones({6}), Tensor::zeros({6}, DType::BF16), 1e-5f, &save_mean,
                                  &save_invstd),
                        Contains("layernorm") && Contains("'beta' is bf16") && Contains("should be f32"));
    // f32 parameters with f16 activations are the contract: this one runs
    REQUIRE(batchnorm_eval(x, Tensor::ones({3}), Tensor::zeros({3}), mean, var, 1e-5f).dtype() == DType::F16);
}

// ---- f16 and bf16 on the CPU's f32 blocks (ops/cpu/f32_blocks.h), on every level and thread count:
// the f32 kernel's result rounded once, bit for bit (lowp_check.h) ---------------------------------------
namespace {

using test::lowp::check_bits_rounded_once;
using test::lowp::on_each_level_and_thread_count;

// Rows of S values in {-2, -1.5, ..., 2}, each row's value at s and at S - 1 - s opposite (0 in
// the middle): every row sums to exactly 0, and the norms' sums below (of x, x², dy, dy·x,
// γ·dy·x̂ with γ in quarters and x̂ = 2x) are exact in any order, fused or not. So f32 and T
// compute the same statistics, and the T kernel's y must be the f32 kernel's y rounded once.
template <typename T>
std::vector<T> opposite_pairs(int64_t rows, int64_t S, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> half(-4, 4);
    std::vector<T> v(size_t(rows * S), T(0.0f));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t s = 0; s < S / 2; s++) {
            const float x = 0.5f * float(half(rng));
            v[size_t(r * S + s)] = T(x);
            v[size_t(r * S + S - 1 - s)] = T(-x);
        }
    return v;
}

// Batch norm and layer norm: y in T is the f32 kernel's y rounded once.
template <typename T>
void check_norm_blocks() {
    // S = 5: rows shorter than a block; S = 4100: a row of a whole block and 4 more.
    for (int64_t S : {int64_t(5), int64_t(4100)}) {
        BatchNormParams p;
        p.N = 3, p.C = 4, p.S = S;
        const std::vector<T> x = opposite_pairs<T>(p.N * p.C, S, 21), dy = opposite_pairs<T>(p.N * p.C, S, 22);
        const std::vector<float> gamma = {0.5f, 1.25f, -0.75f, 2.0f}, beta = {0.1f, -0.2f, 0.0f, 0.3f};
        check_bits_rounded_once("batchnorm_forward_train", x, dy, [&](const auto& x, const auto&, auto& y) {
            std::vector<float> rm(4), rv(4, 1.0f), sm(4), si(4);
            cpu::batchnorm_forward_train(x.data(), gamma.data(), beta.data(), y.data(), rm.data(), rv.data(),
                                         sm.data(), si.data(), p);
        });
        check_bits_rounded_once("batchnorm_forward_eval", x, dy, [&](const auto& x, const auto&, auto& y) {
            const std::vector<float> rm = {0.1f, -0.3f, 0.0f, 0.5f}, rv = {0.9f, 1.1f, 2.0f, 0.5f};
            cpu::batchnorm_forward_eval(x.data(), gamma.data(), beta.data(), rm.data(), rv.data(), y.data(), p);
        });
        check_bits_rounded_once("batchnorm_backward", x, dy, [&](const auto& x, const auto& dy, auto& dx) {
            const std::vector<float> sm(4, 0.0f), si = {1.1f, 0.9f, 0.7f, 1.3f};
            std::vector<float> dg(4), db(4);
            cpu::batchnorm_backward(dy.data(), x.data(), gamma.data(), beta.data(), sm.data(), si.data(), dx.data(),
                                    dg.data(), db.data(), p);
        });
        // layer norm: R = N·C rows of D = S
        const int64_t R = p.N * p.C, D = S;
        const size_t rows = static_cast<size_t>(R), cols = static_cast<size_t>(D);
        std::vector<float> lg(cols), lb(cols);
        for (size_t d = 0; d < cols; d++) lg[d] = 1.0f + 0.25f * float(d % 4), lb[d] = 0.01f * float(d % 7);
        check_bits_rounded_once("layernorm_forward", x, dy, [&](const auto& x, const auto&, auto& y) {
            std::vector<float> mean(rows), invstd(rows);
            cpu::layernorm_forward(x.data(), lg.data(), lb.data(), y.data(), mean.data(), invstd.data(), R, D, 1e-5f);
        });
        check_bits_rounded_once("layernorm_backward", x, dy, [&](const auto& x, const auto& dy, auto& dx) {
            std::vector<float> mean(rows, 0.0f), invstd(rows, 2.0f), dg(cols), db(cols);
            cpu::layernorm_backward(dy.data(), x.data(), lg.data(), mean.data(), invstd.data(), dx.data(), dg.data(),
                                    db.data(), R, D);
        });
    }
}

}  // namespace

TEST_CASE("f16 and bf16 batch norm and layer norm give the f32 kernel's result rounded once",
          "[cpu][lowp][lesson09][batchnorm][layernorm]") {
    on_each_level_and_thread_count(check_norm_blocks<f16>);
    on_each_level_and_thread_count(check_norm_blocks<bf16>);
}

namespace {

test::AmpRun run_batchnorm(DType in) {
    Rng rng(7);
    Tensor x = Tensor::uniform({4, 3, 2, 2}, -1, 1, rng).to(in), g = Tensor::ones({3}), b = Tensor::zeros({3});
    Tensor rm = Tensor::zeros({3}), rv = Tensor::ones({3}), mean, invstd, saved;
    Tensor y = batchnorm_train(x, g, b, rm, rv, 1e-5f, 0.1f, &mean, &invstd, &saved);
    CHECK(batchnorm_eval(x, g, b, rm, rv, 1e-5f).dtype() == y.dtype());
    Tensor dg = Tensor::zeros({3}), db = Tensor::zeros({3});
    return {y.dtype(), batchnorm_backward(Tensor::ones(y.shape(), y.dtype()), saved, g, mean, invstd, dg, db).dtype()};
}

test::AmpRun run_layernorm(DType in) {
    Rng rng(7);
    Tensor x = Tensor::uniform({4, 8}, -1, 1, rng).to(in), g = Tensor::ones({8}), b = Tensor::zeros({8});
    Tensor mean, invstd, saved;
    Tensor y = layernorm(x, g, b, 1e-5f, &mean, &invstd, &saved);
    Tensor dg = Tensor::zeros({8}), db = Tensor::zeros({8});
    return {y.dtype(), layernorm_backward(Tensor::ones(y.shape(), y.dtype()), saved, g, mean, invstd, dg, db).dtype()};
}

}  // namespace

// Chapter 09: batch norm is elementwise per channel, exact in the low type with its statistics in
// f32 inside the kernel (class Input); layer norm's row sums lose in f16 what 2^-11 cannot hold
// (class F32).
TEST_CASE("batch norm runs in autocast's Input class, layer norm in its F32 class",
          "[autocast][lesson09][cpu][batchnorm][layernorm]") {
    test::check_autocast_class(CastPolicy::Input, run_batchnorm);
    test::check_autocast_class(CastPolicy::F32, run_layernorm);
}
