// test_dropout.cpp — Dropout (ops/elementwise.h dropout, dropout_backward; the kernels in
// ops/cpu/elementwise.cpp and cuda/elementwise.cu; the layer in nn/misc.h; chapter 06), every
// backend in one file: inverted scaling, the rate, eval as the identity, reproducible masks that do
// not depend on the thread count, finite differences with a fixed mask; on CUDA (the emulator
// without a GPU, under three schedules) the CPU's mask, y and dx bit for bit (the CPU's counter
// hash on the device), step after step through the layer, and finite differences; in f16 and bf16
// against f32, within the bound of lowp_check.h, on both.
//
//   make test T='[dropout]'
#include <vector>

#include <catch2/catch.hpp>
#include <omp.h>

#include "core/rng.h"
#include "fixtures.h"
#include "gradcheck.h"
#include "lowp_check.h"
#include "nn/misc.h"
#include "ops/elementwise.h"
#include "ops/all.h"

using namespace kiln;
using test::cuda_copy;
using test::require_identical;
using test::same_bits;
using test::under_schedules;

TEST_CASE("Dropout: inverted scaling, rate, eval identity, reproducible masks", "[dropout][layers][cpu][lesson06]") {
    const float p = 0.3f;
    Tensor x = Tensor::ones({100000});
    Dropout drop(p, 42);
    Tensor y = drop.forward(x);
    int64_t kept = 0;
    for (int64_t i = 0; i < y.numel(); i++) {
        const float v = y.data<float>()[i];
        if (v != 0.0f) {
            kept++;
            CHECK(v == Approx(1.0 / (1.0 - p)).epsilon(1e-6));
        }
    }
    CHECK(double(kept) / double(x.numel()) == Approx(1.0 - p).margin(0.01));

    SECTION("backward: dy · mask / (1 − p)") {
        Tensor dx = drop.backward(Tensor::full(x.shape(), 2.0));
        int64_t wrong = 0;
        for (int64_t i = 0; i < x.numel(); i++)
            wrong += dx.data<float>()[i] != (y.data<float>()[i] == 0.0f ? 0.0f : 2.0f / (1.0f - p));
        CHECK(wrong == 0);
    }
    SECTION("the next forward draws a new mask; the same seed draws the same masks") {
        Tensor y2 = drop.forward(x);
        CHECK_FALSE(same_bits(y, y2));
        Dropout again(p, 42);
        CHECK(same_bits(again.forward(x), y));
    }
    SECTION("eval is the identity") {
        drop.eval();
        Tensor ye = drop.forward(x);
        CHECK(ye.raw() == x.raw());
        CHECK(drop.backward(x).raw() == x.raw());
    }
    SECTION("the mask does not depend on the thread count") {
        const int saved = omp_get_max_threads();
        Tensor out[2];
        for (int t = 1; t <= 2; t++) {
            omp_set_num_threads(t);
            Dropout d(p, 7);
            out[t - 1] = d.forward(x);
        }
        omp_set_num_threads(saved);
        CHECK(same_bits(out[0], out[1]));
    }
}

TEST_CASE("Dropout gradient (fixed mask) matches finite differences", "[dropout][layers][cpu][lesson06][gradcheck]") {
    Dropout drop(0.4f, 3);
    drop.fixed_mask = true;
    Rng rng(2);
    check_module_gradients(drop, Tensor::normal({6, 10}, 0.0f, 1.0f, rng));
}

// ---- CUDA --------------------------------------------------------------------------------------
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

TEST_CASE("cuda Dropout gradient (fixed mask) matches finite differences", "[cuda][dropout][lesson06][gradcheck]") {
    Rng rng(12);
    Dropout drop(0.4f, 3);
    drop.fixed_mask = true;
    check_module_gradients(drop, cuda_copy(Tensor::normal({4, 6}, 0.0f, 1.0f, rng)));
}

// ---- f16 and bf16 (chapter 09): within the bound of f32 (lowp_check.h) ----------------------------
namespace {

using namespace test::lowp;

// Dropout: one f32 expression per element, rounded once.
OpCheck dropout_check(const LowType& t) {
    Rng rng(12);
    const Tensor x = values_in(t, {5, 41}, -1, 1, rng), dy = values_in(t, {5, 41}, -1, 1, rng);
    const float p = 0.3f;
    auto run = [=](Device device, DType dt) {
        Tensor mask;
        const Tensor y = dropout(x.to(dt).to(device), p, 77, 1000, &mask);
        const Tensor dx = dropout_backward(dy.to(dt).to(device), mask, p);
        return std::vector<Tensor>{host_f32(y), host_f32(dx), host_f32(mask.to(Device::CPU))};
    };
    const std::vector<Tensor> ref = run(Device::CPU, DType::F32);
    // the mask: the same in every type (r = 0, n = 0: exactly equal)
    return {run, {{abs_of(ref[0]), 1, 1, 1}, {abs_of(ref[1]), 1, 1, 1}, {Tensor::zeros(x.shape()), 0, 0, 0}}};
}

}  // namespace

TEST_CASE("f16 and bf16 dropout on the CPU within the bound of f32", "[lowp][lesson09][cpu][dropout]") {
    check_op(Device::CPU, dropout_check);
}

TEST_CASE("f16 and bf16 dropout on CUDA within the bound of f32 and the CPU", "[lowp][lesson09][cuda][dropout]") {
    check_op(Device::CUDA, dropout_check);
}
