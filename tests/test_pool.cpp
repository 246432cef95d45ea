// test_pool.cpp — MaxPool2d, AvgPool2d, GlobalAvgPool (chapter 03): hand-computed cases,
// finite differences, errors; on CUDA (chapter 05) against the CPU, NaN included, finite
// differences on the device; f16 and bf16 against f32 within the bound of lowp_check.h, CPU and
// CUDA; the CPU's f16/bf16 pooling backward, bit for bit the f32 kernel's result rounded once, on
// every CPU level and thread count.
//
// Run: make build/tests/kiln_tests && build/tests/kiln_tests '[pool]'
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <catch2/catch.hpp>

#include "core/rng.h"
#include "fixtures.h"
#include "gradcheck.h"
#include "lowp_check.h"
#include "nn/pool.h"
#include "ops/all.h"

using namespace kiln;
using test::cuda_copy;
using test::gpu_nans;
using test::identical_values_mismatch;
using test::require_close;
using test::require_identical;
using test::require_identical_values;
using test::tensor_of;
using test::under_schedules;

namespace {

std::vector<float> values(const Tensor& t) { return std::vector<float>(t.data<float>(), t.data<float>() + t.numel()); }

// Distinct values 0.1 apart in a scrambled order: no ties within 2ε of each other, so the
// finite differences never cross a max-pool kink.
Tensor spread(const Shape& s, uint64_t seed) {
    Tensor t = Tensor::empty(s);
    const int64_t n = t.numel();
    std::vector<int64_t> perm(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; i++) perm[size_t(i)] = i;
    Rng rng(seed);
    for (int64_t i = n - 1; i > 0; i--) std::swap(perm[size_t(i)], perm[size_t(rng.next_below(uint64_t(i + 1)))]);
    for (int64_t i = 0; i < n; i++) t.data<float>()[i] = 0.1f * float(perm[size_t(i)]) - 0.05f * float(n);
    return t;
}

}  // namespace

// One 4×4 plane, 2×2 windows, stride 2:
//
//   x:  1  2 | 5  3        max:   4  6        argmax (ih·4 + iw):   4   6
//       4  0 | 6  1               10  7                            13  11
//       -----+-----
//       9  8 | 2  7        avg:   1.75  3.75
//       3 10 | 4  5               7.5   4.5
//
// backward of max with dy = [[1, 2], [3, 4]]: dx is 0 except dx[4] = 1, dx[6] = 2, dx[13] = 3, dx[11] = 4.
// backward of avg: each dy / 4 over its 2×2 window.
TEST_CASE("MaxPool2d and AvgPool2d on a 4x4 plane computed by hand", "[pool][cpu][lesson03]") {
    const Tensor x = tensor_of({1, 1, 4, 4}, {1, 2, 5, 3, 4, 0, 6, 1, 9, 8, 2, 7, 3, 10, 4, 5});
    const Tensor dy = tensor_of({1, 1, 2, 2}, {1, 2, 3, 4});

    SECTION("max: the kernel's values and argmax") {
        Pool2dParams p;
        p.H = p.W = 4, p.KH = p.KW = 2, p.stride = 2;
        float y[4];
        int32_t at[4];
        cpu::maxpool2d_forward(x.data<float>(), y, at, p);
        CHECK(std::vector<float>(y, y + 4) == std::vector<float>{4, 6, 10, 7});
        CHECK(std::vector<int32_t>(at, at + 4) == std::vector<int32_t>{4, 6, 13, 11});
    }
    SECTION("max: the layer, forward and backward") {
        MaxPool2d pool(2, 2);
        Tensor y = pool.forward(x);
        CHECK(y.shape() == Shape{1, 1, 2, 2});
        CHECK(values(y) == std::vector<float>{4, 6, 10, 7});
        CHECK(values(pool.backward(dy)) == std::vector<float>{0, 0, 0, 0, 1, 0, 2, 0, 0, 0, 0, 4, 0, 3, 0, 0});
    }
    SECTION("avg: forward and backward") {
        AvgPool2d pool(2, 2);
        CHECK(values(pool.forward(x)) == std::vector<float>{1.75f, 3.75f, 7.5f, 4.5f});
        CHECK(values(pool.backward(dy)) == std::vector<float>{0.25f, 0.25f, 0.5f, 0.5f, 0.25f, 0.25f, 0.5f, 0.5f,
                                                              0.75f, 0.75f, 1.0f, 1.0f, 0.75f, 0.75f, 1.0f, 1.0f});
    }
}

// A 2×2 plane, 2×2 windows, stride 2, padding 1: each window holds one real value and three
// padding cells:
//
//     p  p  p  p          max (padding = −inf):  1  2      avg (padding = 0, counted):  0.25  0.5
//     p  1  2  p                                 3  4                                   0.75  1
//     p  3  4  p
//     p  p  p  p
TEST_CASE("Pooling with padding: -inf for max, counted zeros for avg", "[pool][cpu][lesson03]") {
    const Tensor x = tensor_of({1, 1, 2, 2}, {1, 2, 3, 4});
    MaxPool2d maxpool(2, 2, 1);
    CHECK(values(maxpool.forward(x)) == std::vector<float>{1, 2, 3, 4});
    AvgPool2d avgpool(2, 2, 1);
    CHECK(values(avgpool.forward(x)) == std::vector<float>{0.25f, 0.5f, 0.75f, 1.0f});
    // negative values: the max must not be the padding's 0
    const Tensor neg = tensor_of({1, 1, 2, 2}, {-1, -2, -3, -4});
    CHECK(values(maxpool.forward(neg)) == std::vector<float>{-1, -2, -3, -4});
}

// Overlapping windows: a 3×3 plane, 2×2 windows at stride 1. The centre (9, the maximum) is in
// all four windows, so it collects all four gradients:
//
//   x:  1 2 3      y:  9 9      dy:  1 2      dx:  0  0 0
//       4 9 5          9 9           3 4           0 10 0
//       6 7 8                                      0  0 0
// The 2×2, stride-2 fast path (pool.cpp) against a plain scan of each window: odd sizes (the
// last row and column are in no window), many ties (values from {0, 1, 2}: the first maximum
// wins), and NaNs (a NaN in a window wins, like PyTorch).
TEST_CASE("MaxPool2d 2x2 fast path: ties, NaN, odd sizes", "[pool][cpu][lesson03]") {
    // Widths 9 and 15: rows of 4 and 7 outputs (one at a time); 16: one block of 8 (short_rows.h);
    // 25 and 31: rows of 12 and 15, two blocks that overlap.
    for (const int64_t W : {9, 15, 16, 25, 31}) {
        DYNAMIC_SECTION("7 x " << W) {
            const int64_t N = 2, C = 3, H = 7, P = H / 2, Q = W / 2;
            Tensor x = Tensor::empty({N, C, H, W});
            Rng rng(3);
            float* xv = x.data<float>();
            for (int64_t i = 0; i < x.numel(); i++) xv[i] = float(rng.next_below(3));
            xv[10] = xv[50] = std::numeric_limits<float>::quiet_NaN();
            Pool2dParams p;
            p.N = N, p.C = C, p.H = H, p.W = W, p.KH = p.KW = 2, p.stride = 2;
            std::vector<float> y(size_t(N * C * P * Q));
            std::vector<int32_t> at(y.size());
            cpu::maxpool2d_forward(xv, y.data(), at.data(), p);
            for (int64_t nc = 0; nc < N * C; nc++)
                for (int64_t op = 0; op < P; op++)
                    for (int64_t oq = 0; oq < Q; oq++) {
                        const float* plane = xv + nc * H * W;
                        int64_t want = (2 * op) * W + 2 * oq;  // scan the window in row order
                        for (int64_t i : {want + 1, want + W, want + W + 1}) {
                            const float v = plane[i], m = plane[want];
                            if (v > m || (std::isnan(v) && !std::isnan(m))) want = i;
                        }
                        const size_t o = size_t((nc * P + op) * Q + oq);
                        CHECK(at[o] == want);
                        if (std::isnan(plane[want]))
                            CHECK(std::isnan(y[o]));
                        else
                            CHECK(y[o] == plane[want]);
                    }
        }
    }
}

TEST_CASE("MaxPool2d sums the gradients of overlapping windows", "[pool][cpu][lesson03]") {
    const Tensor x = tensor_of({1, 1, 3, 3}, {1, 2, 3, 4, 9, 5, 6, 7, 8});
    MaxPool2d pool(2, 1);
    CHECK(values(pool.forward(x)) == std::vector<float>{9, 9, 9, 9});
    CHECK(values(pool.backward(tensor_of({1, 1, 2, 2}, {1, 2, 3, 4}))) == std::vector<float>{0, 0, 0, 0, 10, 0, 0, 0, 0});
}

TEST_CASE("GlobalAvgPool averages each plane", "[pool][cpu][lesson06]") {
    const Tensor x = tensor_of({2, 2, 1, 3}, {1, 2, 3, 4, 5, 6, -1, 0, 4, 7, 8, 9});
    GlobalAvgPool gap;
    Tensor y = gap.forward(x);
    CHECK(y.shape() == Shape{2, 2});
    CHECK(values(y) == std::vector<float>{2, 5, 1, 8});
    CHECK(values(gap.backward(tensor_of({2, 2}, {3, 6, 0, -3}))) ==
          std::vector<float>{1, 1, 1, 2, 2, 2, 0, 0, 0, -1, -1, -1});
}

TEST_CASE("Pooling gradients match finite differences", "[pool][cpu][lesson03][gradcheck]") {
    SECTION("max 2x2 stride 2") {
        MaxPool2d pool(2, 2);
        check_module_gradients(pool, spread({2, 3, 6, 6}, 1));
    }
    SECTION("max 3x3 stride 2 padding 1, odd size") {
        MaxPool2d pool(3, 2, 1);
        check_module_gradients(pool, spread({2, 2, 7, 5}, 2));
    }
    SECTION("avg 2x2 stride 2") {
        AvgPool2d pool(2, 2);
        Rng rng(3);
        check_module_gradients(pool, Tensor::normal({2, 3, 6, 6}, 0.0f, 1.0f, rng));
    }
    SECTION("avg 3x3 stride 2 padding 1, odd size") {
        AvgPool2d pool(3, 2, 1);
        Rng rng(4);
        check_module_gradients(pool, Tensor::normal({2, 2, 7, 5}, 0.0f, 1.0f, rng));
    }
    SECTION("global average") {
        GlobalAvgPool pool;
        Rng rng(5);
        check_module_gradients(pool, Tensor::normal({3, 4, 5, 5}, 0.0f, 1.0f, rng));
    }
}

TEST_CASE("Pooling errors name the layer and the shapes", "[pool][cpu][lesson03]") {
    using Catch::Matchers::Contains;
    MaxPool2d pool(2, 2, 0, "pool1");
    REQUIRE_THROWS_AS(pool.forward(Tensor::zeros({3, 8, 8})), Error);
    REQUIRE_THROWS_WITH(pool.forward(Tensor::zeros({3, 8, 8})), Contains("pool1") && Contains("[3, 8, 8]"));
    REQUIRE_THROWS_WITH(pool.forward(Tensor::zeros({1, 1, 1, 1})), Contains("pool1") && Contains("[1, 1, 1, 1]"));
    REQUIRE_THROWS_WITH(pool.backward(Tensor::zeros({1, 1, 2, 2})), Contains("pool1") && Contains("backward"));
    pool.forward(Tensor::zeros({1, 2, 4, 4}));
    REQUIRE_THROWS_WITH(pool.backward(Tensor::zeros({1, 2, 3, 3})), Contains("pool1") && Contains("[1, 2, 2, 2]"));
    REQUIRE_THROWS_WITH(AvgPool2d(2, 2, 2, "pool2"), Contains("pool2") && Contains("padding"));
    GlobalAvgPool gap("gap");
    REQUIRE_THROWS_WITH(gap.forward(Tensor::zeros({4, 8})), Contains("gap") && Contains("[4, 8]"));
}

// ---- on CUDA (cuda/pool.cu; on the emulator without a GPU, under three schedules) -----------------
// Small random shapes that hit the edges (batch 1, odd sizes, padding, stride ≠ kernel), against
// the layers on the CPU. Tolerances (fixtures.h require_close: relative to the largest |value|):
// max pooling bit for bit (the same scan, the same argmax) and the average-pooling forward too;
// 1e-6 for the average-pooling backward and the global average (a GPU may fuse dy·(1/K²) into the
// add; the global sum is a tree instead of 8 lanes).
namespace {

// Values from {−1, −0.75, ..., 1}: many ties inside every pooling window.
Tensor with_ties(const Shape& s, Rng& rng) {
    Tensor t = Tensor::uniform(s, -1.0f, 1.0f, rng);
    for (int64_t i = 0; i < t.numel(); i++) t.data<float>()[i] = std::round(t.data<float>()[i] * 4.0f) / 4.0f;
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

}  // namespace

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

TEST_CASE("cuda pooling gradients match finite differences", "[cuda][pool][gradcheck][lesson05]") {
    Rng rng(12);
    SECTION("MaxPool2d 3x3, stride 2, padding 1") {
        MaxPool2d pool(3, 2, 1);
        check_module_gradients(pool, cuda_copy(spread({2, 2, 5, 5}, 12)));
    }
    SECTION("AvgPool2d 3x3, stride 2, padding 1") {
        AvgPool2d pool(3, 2, 1);
        check_module_gradients(pool, cuda_copy(Tensor::normal({1, 2, 5, 6}, 0.0f, 1.0f, rng)));
    }
    SECTION("GlobalAvgPool") {
        GlobalAvgPool pool;
        check_module_gradients(pool, cuda_copy(Tensor::normal({2, 3, 3, 3}, 0.0f, 1.0f, rng)));
    }
}

TEST_CASE("cuda pooling names the layer and both devices when they are apart", "[cuda][pool][lesson05]") {
    using Catch::Matchers::Contains;
    MaxPool2d pool(2, 2, 0, "pool1");
    pool.forward(cuda_copy(Tensor::ones({1, 1, 4, 4})));
    REQUIRE_THROWS_WITH(pool.backward(Tensor::ones({1, 1, 2, 2})),
                        Contains("pool1") && Contains("dy is on cpu but the input is on cuda"));
}

// ---- f16 and bf16 (chapter 09): within the bound of f32 (lowp_check.h) ----------------------------
namespace {

using namespace test::lowp;

// Max pooling: y is one of the window's values (exact); dx adds the dy of the windows whose
// maximum it is: at most ⌈K/s⌉² = 4 of them for 3×3 windows at stride 2.
OpCheck maxpool_check(const Pool2dArgs& a, const LowType& t) {
    Rng rng(6);
    const Tensor x = values_in(t, {2, 3, 7, 6}, -1, 1, rng);
    const Shape ys = pool2d_output_shape(x.shape(), a);
    const Tensor dy = values_in(t, ys, -1, 1, rng);
    auto run = [=](Device device, DType dt) {
        Tensor argmax;
        const Tensor y = maxpool2d(x.to(dt).to(device), a, &argmax);
        const Tensor dx = maxpool2d_backward(dy.to(dt).to(device), argmax, x.shape(), a);
        return std::vector<Tensor>{host_f32(y), host_f32(dx), host_f32(argmax.to(Device::CPU))};
    };
    Tensor argmax;
    const Tensor y = maxpool2d(x, a, &argmax);
    const Tensor S_dx = maxpool2d_backward(abs_of(dy), argmax, x.shape(), a);
    // argmax: the same position in every type (r = 0, n = 0: exactly equal)
    return {run, {{abs_of(y), 1, 1, 1}, {S_dx, 4, 1, 1}, {Tensor::zeros(ys), 0, 0, 0}}};
}

// Average pooling: y = (Σ of K² values)·(1/K²); dx adds dy/K² over at most 4 windows.
OpCheck avgpool_check(const Pool2dArgs& a, const LowType& t) {
    Rng rng(7);
    const Tensor x = values_in(t, {2, 3, 7, 6}, -1, 1, rng);
    const Tensor dy = values_in(t, pool2d_output_shape(x.shape(), a), -1, 1, rng);
    auto run = [=](Device device, DType dt) {
        const Tensor y = avgpool2d(x.to(dt).to(device), a);
        const Tensor dx = avgpool2d_backward(dy.to(dt).to(device), x.shape(), a);
        return std::vector<Tensor>{host_f32(y), host_f32(dx)};
    };
    const double K2 = double(a.kernel * a.kernel);
    return {run,
            {{avgpool2d(abs_of(x), a), K2 + 1, 1, 1}, {avgpool2d_backward(abs_of(dy), x.shape(), a), 4 + 1, 1, 1}}};
}

// Global average: y = Σ of H·W values / (H·W); dx = dy / (H·W).
OpCheck global_avgpool_check(const LowType& t) {
    Rng rng(8);
    const Tensor x = values_in(t, {2, 5, 6, 7}, -1, 1, rng);
    const Tensor dy = values_in(t, {2, 5}, -1, 1, rng);
    auto run = [=](Device device, DType dt) {
        return std::vector<Tensor>{host_f32(global_avgpool(x.to(dt).to(device))),
                                   host_f32(global_avgpool_backward(dy.to(dt).to(device), x.shape()))};
    };
    return {run, {{global_avgpool(abs_of(x)), 6 * 7 + 1, 1, 1}, {global_avgpool_backward(abs_of(dy), x.shape()), 1, 1, 1}}};
}

void pool_checks(Device device) {
    const Pool2dArgs two_by_two{2, 2, 0}, overlapping{3, 2, 1};
    for (const Pool2dArgs& a : {two_by_two, overlapping}) {
        INFO("kernel " << a.kernel << " stride " << a.stride << " padding " << a.padding);
        check_op(device, [&](const LowType& t) { return maxpool_check(a, t); });
        check_op(device, [&](const LowType& t) { return avgpool_check(a, t); });
    }
    check_op(device, global_avgpool_check);
}

}  // namespace

TEST_CASE("f16 and bf16 pooling on the CPU within the bound of f32", "[lowp][lesson09][cpu][pool]") {
    pool_checks(Device::CPU);
}

TEST_CASE("f16 and bf16 pooling on CUDA within the bound of f32 and the CPU", "[lowp][lesson09][cuda][pool]") {
    pool_checks(Device::CUDA);
}

// ---- f16 and bf16 on the CPU's f32 blocks (ops/cpu/f32_blocks.h), on every level and thread count:
// the f32 kernel's result rounded once, bit for bit (lowp_check.h) ---------------------------------------
namespace {

using test::random_lowp;
using test::lowp::check_bits_rounded_once;
using test::lowp::on_each_level_and_thread_count;

// The pooling backwards, overlapping 3×3 windows, stride 2, summed in an F32Plane: dx in T is the
// f32 kernel's dx rounded once.
template <typename T>
void check_pool_backward_blocks() {
    Pool2dParams p;
    p.N = 2, p.C = 3, p.H = 13, p.W = 11, p.KH = 3, p.KW = 3, p.stride = 2, p.padding = 1;
    const size_t nx = size_t(p.N * p.C * p.H * p.W);
    const std::vector<T> x = random_lowp<T>(nx, 31), dy = random_lowp<T>(nx, 32);  // dy: the first N·C·P·Q
    std::vector<int32_t> argmax(size_t(p.N * p.C * p.P() * p.Q()));
    std::vector<T> y(argmax.size());
    cpu::maxpool2d_forward(x.data(), y.data(), argmax.data(), p);
    check_bits_rounded_once("maxpool2d_backward", x, dy, [&](const auto&, const auto& dy, auto& dx) {
        cpu::maxpool2d_backward(dy.data(), argmax.data(), dx.data(), p);
    });
    check_bits_rounded_once("avgpool2d_backward", x, dy, [&](const auto&, const auto& dy, auto& dx) {
        cpu::avgpool2d_backward(dy.data(), dx.data(), p);
    });
}

}  // namespace

TEST_CASE("f16 and bf16 pooling backward gives the f32 kernel's result rounded once", "[cpu][lowp][lesson09][pool]") {
    on_each_level_and_thread_count(check_pool_backward_blocks<f16>);
    on_each_level_and_thread_count(check_pool_backward_blocks<bf16>);
}
