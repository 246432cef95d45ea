// test_residual.cpp — Residual (nn/misc.h; chapter 06): identity and projection shortcuts, their
// gradients against finite differences, train/eval reaching the body and the shortcut, the error
// for shapes that do not add up; on CUDA (the emulator without a GPU) a block with batch norm and
// a strided projection against the CPU (within 1e-5 of the largest |value|: batch norm's sums in
// another order) and finite differences on the device.
//
//   make test T='[residual]'
#include <memory>
#include <vector>

#include <catch2/catch.hpp>

#include "core/rng.h"
#include "fixtures.h"
#include "gradcheck.h"
#include "nn/conv.h"
#include "nn/layers.h"
#include "nn/misc.h"
#include "nn/norm.h"

using namespace kiln;
using test::cuda_copy;
using test::require_close;

TEST_CASE("Residual: identity and projection shortcuts", "[residual][layers][cpu][lesson06]") {
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

// ---- CUDA --------------------------------------------------------------------------------------
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

TEST_CASE("cuda residual gradients match finite differences", "[cuda][residual][lesson05][gradcheck]") {
    Rng rng(12);
    auto f = std::make_unique<Sequential>();
    f->emplace<Conv2d>(2, 2, 3, rng, ConvOptions{1, 1, 1, 1, true}, "conv_a");
    f->emplace<GELU>();
    f->emplace<Conv2d>(2, 2, 3, rng, ConvOptions{1, 1, 1, 1, false}, "conv_b");
    Residual res(std::move(f));
    res.to(Device::CUDA);
    check_module_gradients(res, cuda_copy(Tensor::normal({2, 2, 4, 4}, 0.0f, 1.0f, rng)));
}
