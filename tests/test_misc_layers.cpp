// test_misc_layers.cpp — Dropout and Residual (chapter 06): values, masks, threads, finite
// differences, composition. GELU's tests are in test_gelu.cpp.
//
// Run: make build/tests/kiln_tests && build/tests/kiln_tests '[layers][lesson06]'
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include <catch2/catch.hpp>
#include <omp.h>

#include "core/rng.h"
#include "gradcheck.h"
#include "nn/conv.h"
#include "nn/layers.h"
#include "nn/misc.h"
#include "nn/norm.h"
#include "ops/kernels/all.h"

using namespace kiln;

namespace {
bool same_bits(const Tensor& a, const Tensor& b) {
    return a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}
}  // namespace

TEST_CASE("Dropout: inverted scaling, rate, eval identity, reproducible masks", "[layers][cpu][lesson06]") {
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

TEST_CASE("Dropout gradient (fixed mask) matches finite differences", "[layers][cpu][lesson06][gradcheck]") {
    Dropout drop(0.4f, 3);
    drop.fixed_mask = true;
    Rng rng(2);
    check_module_gradients(drop, Tensor::normal({6, 10}, 0.0f, 1.0f, rng));
}

TEST_CASE("Residual: identity and projection shortcuts", "[layers][cpu][lesson06]") {
    Rng rng(5);
    SECTION("identity shortcut: y = f(x) + x, and its gradient") {
        auto f = std::make_unique<Sequential>();
        f->emplace<Conv2d>(3, 3, 3, rng, ConvOptions{1, 1, 1, 1, true}, "conv_a");
        f->emplace<GELU>();
        f->emplace<Conv2d>(3, 3, 3, rng, ConvOptions{1, 1, 1, 1, false}, "conv_b");
        Residual res(std::move(f));
        CHECK(res.parameters().size() == 3);
        Tensor x = Tensor::normal({2, 3, 5, 5}, 0.0f, 1.0f, rng);
        check_module_gradients(res, x, 1);
    }
    SECTION("projection shortcut (1x1 conv, stride 2), BN in the body") {
        auto f = std::make_unique<Sequential>();
        f->emplace<Conv2d>(2, 4, 3, rng, ConvOptions{2, 1, 1, 1, false}, "conv");
        f->emplace<BatchNorm2d>(4, "bn");
        f->emplace<GELU>();
        auto shortcut = std::make_unique<Conv2d>(2, 4, 1, rng, ConvOptions{2, 0, 1, 1, false}, "proj");
        Residual res(std::move(f), std::move(shortcut));
        CHECK(res.parameters().size() == 4);  // conv.weight, bn.weight, bn.bias, proj.weight
        CHECK(res.parameters()[3]->name == "shortcut.weight");
        CHECK(res.named_buffers().size() == 2);    // bn's running statistics
        Tensor x = Tensor::normal({3, 2, 6, 5}, 0.0f, 1.0f, rng);
        check_module_gradients(res, x, 2);

        res.eval();
        CHECK_FALSE(res.body().training());
        CHECK_FALSE(res.shortcut()->training());
        CHECK_FALSE(static_cast<Sequential&>(res.body())[1].training());
        res.train();
        CHECK(static_cast<Sequential&>(res.body())[1].training());
    }
    SECTION("shapes that do not add up are an error naming the layer") {
        Residual res(std::make_unique<Conv2d>(2, 3, 1, rng), nullptr, "block1");
        REQUIRE_THROWS_WITH(res.forward(Tensor::zeros({1, 2, 4, 4})),
                            Catch::Matchers::Contains("block1") && Catch::Matchers::Contains("[1, 3, 4, 4]"));
    }
}
