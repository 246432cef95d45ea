// test_gelu.cpp — GELU (ops/elementwise.h gelu, gelu_backward; the kernels in ops/cpu/elementwise.cpp and
// cuda/elementwise.cu; the layer in nn/misc.h; chapter 06), every backend in one file: the exact
// erf form by hand, the CPU kernels against the formulas in double, finite differences, and the
// CUDA kernels (on the emulator without a GPU, under three schedules) against the CPU within 2e-6
// absolute (the device's erff/expf against the CPU's 1e-6-accurate approximations) and against
// finite differences; in f16 and bf16 against f32, within the bound of lowp_check.h, on both.
//
//   make test T='[gelu]'
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include <catch2/catch.hpp>

#include "core/rng.h"
#include "core/tensor.h"
#include "fixtures.h"
#include "gradcheck.h"
#include "lowp_check.h"
#include "nn/misc.h"
#include "ops/elementwise.h"
#include "ops/all.h"

using namespace kiln;
using test::require_close;
using test::under_schedules;

// ---- CPU ---------------------------------------------------------------------------------------
// GELU(x) = x · Φ(x):  GELU(1) = 0.8413447,  GELU(−1) = −0.1586553,  GELU(0) = 0
TEST_CASE("GELU is the exact erf form", "[gelu][layers][cpu][lesson06]") {
    GELU gelu;
    Tensor x = Tensor::empty({7});
    const float xs[7] = {-3.0f, -1.0f, -0.5f, 0.0f, 0.5f, 1.0f, 3.0f};
    std::memcpy(x.data<float>(), xs, sizeof xs);
    Tensor y = gelu.forward(x);
    for (int i = 0; i < 7; i++) {
        const double v = xs[i];
        CHECK(y.data<float>()[i] == Approx(0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0)))).margin(1e-6));
    }
    CHECK(y.data<float>()[5] == Approx(0.8413447).margin(1e-6));
    CHECK(y.data<float>()[1] == Approx(-0.1586553).margin(1e-6));
    CHECK(y.data<float>()[3] == 0.0f);
}

// The kernels use their own erf and exp (ops/cpu/elementwise.cpp, to vectorize): within 1e-6 of the exact
// formulas, in double, across the whole useful range and beyond.
TEST_CASE("GELU kernels stay within 1e-6 of the exact formulas", "[gelu][layers][cpu][lesson06]") {
    const int64_t n = 200001;
    std::vector<float> x(n), y(n), dy(n, 1.0f), dx(n);
    for (int64_t i = 0; i < n; i++) x[size_t(i)] = -10.0f + 20.0f * float(i) / float(n - 1);
    cpu::gelu_forward(x.data(), y.data(), n);
    cpu::gelu_backward(x.data(), dy.data(), dx.data(), n);
    double worst_y = 0, worst_dx = 0;
    for (int64_t i = 0; i < n; i++) {
        const double v = x[size_t(i)], cdf = 0.5 * (1.0 + std::erf(v / std::sqrt(2.0)));
        const double pdf = std::exp(-0.5 * v * v) / std::sqrt(2.0 * 3.14159265358979324);
        worst_y = std::max(worst_y, std::fabs(y[size_t(i)] - v * cdf) / std::max(1.0, std::fabs(v)));
        worst_dx = std::max(worst_dx, std::fabs(dx[size_t(i)] - (cdf + v * pdf)));
    }
    CHECK(worst_y < 1e-6);
    CHECK(worst_dx < 1e-6);
}

TEST_CASE("GELU gradient matches finite differences", "[gelu][layers][cpu][lesson06][gradcheck]") {
    GELU gelu;
    Rng rng(1);
    check_module_gradients(gelu, Tensor::normal({4, 3, 5}, 0.0f, 2.0f, rng));
}

// ---- CUDA --------------------------------------------------------------------------------------
TEST_CASE("cuda GELU matches the CPU", "[cuda][gelu][lesson06]") {
    Rng rng(7);
    for (int64_t n : {int64_t(1), int64_t(257), int64_t(5000)}) {
        INFO("n = " << n);
        const Tensor x = Tensor::uniform({n}, -6.0f, 6.0f, rng), dy = Tensor::uniform({n}, -1.0f, 1.0f, rng);
        GELU cpu_gelu, gpu_gelu;
        const Tensor y = cpu_gelu.forward(x), dx = cpu_gelu.backward(dy);
        under_schedules([&] {
            require_close(gpu_gelu.forward(x.to(Device::CUDA)), y, 0.0, 2e-6);
            require_close(gpu_gelu.backward(dy.to(Device::CUDA)), dx, 0.0, 2e-6);
        });
    }
}

TEST_CASE("cuda GELU gradient matches finite differences", "[cuda][gelu][lesson06][gradcheck]") {
    Rng rng(12);
    GELU gelu;
    check_module_gradients(gelu, Tensor::normal({3, 7}, 0.0f, 2.0f, rng).to(Device::CUDA));
}

// ---- f16 and bf16 (chapter 09): within the bound of f32 (lowp_check.h) ----------------------------
namespace {

using namespace test::lowp;

// GELU: one f32 expression per element, rounded once.
OpCheck gelu_check(const LowType& t) {
    Rng rng(11);
    const Tensor x = values_in(t, {3, 70}, -4, 4, rng), dy = values_in(t, {3, 70}, -1, 1, rng);
    auto run = [=](Device device, DType dt) {
        const Tensor xd = x.to(dt).to(device);
        return std::vector<Tensor>{host_f32(gelu(xd)), host_f32(gelu_backward(xd, dy.to(dt).to(device)))};
    };
    const std::vector<Tensor> ref = run(Device::CPU, DType::F32);
    const double gap = 2e-6;  // the CPU's erf and exp against the device's ("cuda GELU matches the CPU")
    return {run, {{abs_of(ref[0]), 2, 1, 1, gap}, {abs_of(ref[1]), 2, 1, 1, gap}}};
}

}  // namespace

TEST_CASE("f16 and bf16 GELU on the CPU within the bound of f32", "[lowp][lesson09][cpu][gelu]") {
    check_op(Device::CPU, gelu_check);
}

TEST_CASE("f16 and bf16 GELU on CUDA within the bound of f32 and the CPU", "[lowp][lesson09][cuda][gelu]") {
    check_op(Device::CUDA, gelu_check);
}
