// test_cnn_ops.cpp — the argument checks of the Tensor-level CNN ops (ops/conv.h, elementwise.h,
// norm.h, pool.h): a wrong shape, a wrong dtype (and mixed f32/f16: test_conv.cpp and
// test_norm.cpp have more) and a wrong device each fail with a message that names the op and the
// tensor. (The results themselves are
// tested through the layers, each op's CPU, CUDA, f16 and bf16 cases in its own file:
// test_conv.cpp, test_pool.cpp, test_norm.cpp, test_gelu.cpp, test_dropout.cpp.) Each case is
// tagged with every op it checks, so make test T='[conv]' (or [pool], [gelu], ...) runs it too.
#include <catch2/catch.hpp>

#include "core/tensor.h"
#include "ops/conv.h"
#include "ops/elementwise.h"
#include "ops/norm.h"
#include "ops/pool.h"

using namespace kiln;
using Catch::Matchers::Contains;

TEST_CASE("cnn ops: a wrong shape names the op and the tensor",
          "[ops][cnn][conv][pool][batchnorm][gelu][dropout][cpu][lesson03]") {
    const Tensor x = Tensor::zeros({2, 3, 8, 8}), w = Tensor::zeros({4, 3, 3, 3});
    REQUIRE_THROWS_WITH(conv2d(Tensor::zeros({3, 8, 8}), w, Tensor(), {}), Contains("conv2d") && Contains("'x'"));
    REQUIRE_THROWS_WITH(conv2d(x, Tensor::zeros({4, 2, 3, 3}), Tensor(), {}),
                        Contains("conv2d") && Contains("'w'") && Contains("groups=1"));
    REQUIRE_THROWS_WITH(conv2d(x, w, Tensor::zeros({5}), {}), Contains("conv2d") && Contains("'b'") && Contains("[4]"));
    Tensor dw = Tensor::zeros({4, 3, 3, 3}), db;
    REQUIRE_THROWS_WITH(conv2d_backward(x, w, Tensor::zeros({2, 4, 5, 5}), dw, db, true, {}),
                        Contains("conv2d_backward") && Contains("'dy'") && Contains("[2, 4, 6, 6]"));

    REQUIRE_THROWS_WITH(maxpool2d_backward(Tensor::zeros({1, 1, 3, 3}), Tensor::zeros({1, 1, 2, 2}, DType::I32),
                                           Shape{1, 1, 4, 4}, {2, 2, 0}),
                        Contains("maxpool2d_backward") && Contains("'dy'"));
    REQUIRE_THROWS_WITH(avgpool2d(Tensor::zeros({1, 1, 1, 1}), {3, 1, 0}),
                        Contains("avgpool2d") && Contains("does not fit"));
    REQUIRE_THROWS_WITH(global_avgpool_backward(Tensor::zeros({2, 4}), Shape{2, 3, 4, 4}),
                        Contains("global_avgpool_backward") && Contains("'dy'"));

    Tensor mean = Tensor::zeros({3}), var = Tensor::ones({3}), save_mean, save_invstd;
    REQUIRE_THROWS_WITH(batchnorm_train(x, Tensor::ones({4}), Tensor::zeros({3}), mean, var, 1e-5f, 0.1f, &save_mean,
                                        &save_invstd),
                        Contains("batchnorm_train") && Contains("'gamma'") && Contains("[3]"));
    REQUIRE_THROWS_WITH(gelu_backward(x, Tensor::zeros({2, 3})), Contains("gelu_backward") && Contains("'dy'"));
    REQUIRE_THROWS_WITH(dropout_backward(x, Tensor::zeros({2}, DType::U8), 0.5f),
                        Contains("dropout_backward") && Contains("'mask'"));
}

TEST_CASE("cnn ops: a wrong dtype names the op and the tensor; f16 with f32 is a mixed pair",
          "[ops][cnn][conv][pool][gelu][dropout][cpu][lesson03]") {
    const Tensor x = Tensor::zeros({2, 3, 8, 8}), w = Tensor::zeros({4, 3, 3, 3});
    REQUIRE_THROWS_WITH(conv2d(x, Tensor::zeros({4, 3, 3, 3}, DType::I32), Tensor(), {}),
                        Contains("conv2d") && Contains("'w'") && Contains("f32, f16 and bf16 are supported"));
    REQUIRE_THROWS_WITH(conv2d(Tensor::zeros({2, 3, 8, 8}, DType::F16), w, Tensor(), {}),
                        Contains("conv2d") && Contains("'w' is f32") && Contains("'x' is f16"));
    REQUIRE_THROWS_WITH(gelu_backward(Tensor::zeros({4}, DType::BF16), Tensor::zeros({4})),
                        Contains("gelu_backward") && Contains("'dy' is f32") && Contains("bf16"));
    Tensor argmax;
    REQUIRE_THROWS_WITH(maxpool2d(Tensor::zeros({1, 1, 4, 4}, DType::U8), {2, 2, 0}, &argmax),
                        Contains("maxpool2d") && Contains("'x'") && Contains("f32, f16 and bf16 are supported"));
    REQUIRE_THROWS_WITH(maxpool2d_backward(Tensor::zeros({1, 1, 2, 2}), Tensor::zeros({1, 1, 2, 2}), Shape{1, 1, 4, 4},
                                           {2, 2, 0}),
                        Contains("maxpool2d_backward") && Contains("'argmax'") && Contains("i32"));
    REQUIRE_THROWS_WITH(dropout_backward(Tensor::zeros({4}), Tensor::zeros({4}), 0.5f),
                        Contains("dropout_backward") && Contains("'mask'") && Contains("u8"));
}

TEST_CASE("cnn ops: tensors on two devices name the op, both tensors and both devices",
          "[ops][cnn][conv][batchnorm][gelu][cuda][lesson05]") {
    const Tensor x = Tensor::zeros({2, 3, 8, 8}, DType::F32, Device::CUDA), w = Tensor::zeros({4, 3, 3, 3});
    REQUIRE_THROWS_WITH(conv2d(x, w, Tensor(), {}), Contains("conv2d") && Contains("'w' is on cpu") &&
                                                        Contains("'x' is on cuda") && Contains(".to(Device::CUDA)"));
    Tensor gamma = Tensor::ones({3}), beta = Tensor::zeros({3}, DType::F32, Device::CUDA);
    Tensor mean = Tensor::zeros({3}, DType::F32, Device::CUDA), var = Tensor::ones({3}, DType::F32, Device::CUDA);
    REQUIRE_THROWS_WITH(batchnorm_eval(x, gamma, beta, mean, var, 1e-5f),
                        Contains("batchnorm_eval") && Contains("'gamma' is on cpu"));
    REQUIRE_THROWS_WITH(gelu_backward(x, Tensor::zeros(x.shape())), Contains("gelu_backward") && Contains("'dy'"));
}
