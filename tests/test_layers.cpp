// test_layers.cpp — the layers of chapter 02 (Linear, ReLU, Flatten, Sequential) against
// hand-computed values and finite differences, and SGD's first updates by its formula.
#include <catch2/catch.hpp>
#include <cmath>

#include "gradcheck.h"
#include "nn/layers.h"
#include "nn/models.h"
#include "ops/ops.h"
#include "optim/optimizer.h"

using namespace kiln;

TEST_CASE("Linear computes x·Wᵀ + b", "[layers][cpu][lesson02]") {
    Rng rng(0);
    Linear fc(2, 3, rng, true, "fc");
    // W = [[1 2] [3 4] [5 6]], b = [0.5 0 -0.5], x = [[1 1]]  ->  y = [[3.5 7 10.5]]
    for (int64_t i = 0; i < 6; i++) fc.weight.value.data<float>()[i] = float(i + 1);
    fc.bias.value.set({0}, 0.5);
    fc.bias.value.set({1}, 0);
    fc.bias.value.set({2}, -0.5);
    Tensor y = fc.forward(Tensor::ones({1, 2}));
    REQUIRE((y.get({0, 0}) == 3.5 && y.get({0, 1}) == 7 && y.get({0, 2}) == 10.5));
    // dy = [[1 0 0]]: dW row 0 = x, db = dy, dx = W row 0
    Tensor dy = Tensor::zeros({1, 3});
    dy.set({0, 0}, 1);
    Tensor dx = fc.backward(dy);
    REQUIRE((dx.get({0, 0}) == 1 && dx.get({0, 1}) == 2));
    REQUIRE((fc.weight.grad.get({0, 0}) == 1 && fc.weight.grad.get({1, 0}) == 0));
    REQUIRE(fc.bias.grad.get({0}) == 1);
    REQUIRE_THROWS_WITH(fc.forward(Tensor::ones({1, 5})), Catch::Contains("fc: expected input [N, 2]"));
    REQUIRE_THROWS_WITH(fc.backward(dy), Catch::Contains("backward without a training-mode forward"));
}

TEST_CASE("gradients of Linear, ReLU, Flatten and an MLP match finite differences",
          "[layers][cpu][lesson02][gradcheck]") {
    Rng rng(5);
    SECTION("Linear with bias") {
        Linear fc(7, 4, rng, true, "fc");
        check_module_gradients(fc, Tensor::normal({3, 7}, 0, 1, rng));
    }
    SECTION("Linear without bias") {
        Linear fc(5, 2, rng, false, "fc");
        check_module_gradients(fc, Tensor::normal({4, 5}, 0, 1, rng));
    }
    SECTION("ReLU (inputs kept away from the kink at 0)") {
        ReLU r;
        Tensor x = Tensor::normal({2, 9}, 0, 1, rng);
        for (int64_t i = 0; i < x.numel(); i++) {
            float& v = x.data<float>()[i];
            if (std::fabs(v) < 0.1f) v = 0.5f;
        }
        check_module_gradients(r, x);
    }
    SECTION("a small MLP through Flatten") {
        Sequential m("mlp");
        m.emplace<Flatten>();
        m.emplace<Linear>(12, 6, rng, true, "fc1");
        m.emplace<ReLU>();
        m.emplace<Linear>(6, 3, rng, true, "fc2");
        check_module_gradients(m, Tensor::normal({2, 3, 2, 2}, 0, 1, rng));
    }
}

TEST_CASE("gradients accumulate until zero_grad", "[layers][cpu][lesson02]") {
    // Two backward passes of different inputs: dW = dyᵀ·x1 + dyᵀ·x2 only if the second adds to
    // the first (a backward that overwrote dW would leave dyᵀ·x2); db = Σ dy twice.
    Rng rng(1);
    Linear fc(3, 2, rng, true, "fc");
    Tensor x1 = Tensor::ones({1, 3}), x2 = Tensor::full({1, 3}, 2.0), dy = Tensor::ones({1, 2});
    fc.forward(x1);
    fc.backward(dy);
    fc.forward(x2);
    fc.backward(dy);
    for (int64_t o = 0; o < 2; o++) {
        REQUIRE(fc.bias.grad.get({o}) == 2);
        for (int64_t i = 0; i < 3; i++) REQUIRE(fc.weight.grad.get({o, i}) == 3);  // 1·1 + 1·2
    }
    fc.zero_grad();
    REQUIRE(fc.bias.grad.get({0}) == 0);
    REQUIRE(fc.weight.grad.get({1, 2}) == 0);
}

TEST_CASE("models name their parameters and count them", "[layers][cpu][lesson02]") {
    Rng rng(1);
    auto m = mlp(rng, 32, 16);
    auto ps = m->parameters();
    REQUIRE(ps.size() == 6);
    REQUIRE(ps[0]->name == "fc1.weight");
    REQUIRE(ps[5]->name == "fc3.bias");
    REQUIRE(m->num_parameters() == 784 * 32 + 32 + 32 * 16 + 16 + 16 * 10 + 10);
    REQUIRE(ps[0]->value.category() == Category::Parameter);
    REQUIRE(ps[0]->grad.category() == Category::Gradient);
}

TEST_CASE("SGD follows PyTorch's update rule", "[optim][cpu][lesson02]") {
    // One parameter p = 1 with a constant gradient 0.5, lr 0.1.
    auto run = [](SGD::Options o, int steps) {
        Parameter p{"p", Tensor::full({1}, 1.0), Tensor::full({1}, 0.5)};
        SGD sgd({&p}, 0.1f, o);
        for (int i = 0; i < steps; i++) sgd.step();
        return p.value.get({0});
    };
    // plain:     p = 1 − 0.1·0.5 = 0.95, then 0.90
    REQUIRE(run({}, 2) == Approx(0.90));
    // momentum 0.9: buf1 = 0.5, p1 = 0.95; buf2 = 0.9·0.5 + 0.5 = 0.95, p2 = 0.95 − 0.095 = 0.855
    REQUIRE(run(SGD::Options{}.with_momentum(0.9f), 2) == Approx(0.855));
    // Nesterov: g1 = 0.5 + 0.9·0.5 = 0.95, p1 = 0.905; buf2 = 0.95, g2 = 0.5 + 0.855 = 1.355, p2 = 0.7695
    REQUIRE(run(SGD::Options{}.with_momentum(0.9f).with_nesterov(), 2) == Approx(0.7695));
    // weight decay 0.1: g = 0.5 + 0.1·1 = 0.6, p1 = 0.94
    REQUIRE(run(SGD::Options{}.with_weight_decay(0.1f), 1) == Approx(0.94));
    // dampening 0.5: buf1 = 0.5 (first step undamped), buf2 = 0.9·0.5 + 0.5·0.5 = 0.7; p2 = 0.95 − 0.07
    REQUIRE(run(SGD::Options{}.with_momentum(0.9f).with_dampening(0.5f), 2) == Approx(0.88));
    Parameter q{"q", Tensor::zeros({1}), Tensor::zeros({1})};
    REQUIRE_THROWS_WITH(SGD({&q}, 0.1f, SGD::Options{}.with_nesterov()), Catch::Contains("Nesterov"));
}
