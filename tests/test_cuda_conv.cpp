// test_cuda_conv.cpp — the CUDA convolution (cuda/conv.cu, chapter 05) against the CPU one
// (src/ops/cpu/conv.cpp, itself checked against the direct 7-loop convolution in test_conv.cpp):
// every pass and both forward strategies on small random shapes that cover each option, the
// layer on the cuda device, finite differences there, and the same-device error.
//
// Without a GPU the kernels run on kiln's emulator under two schedules (threads in order, then
// reversed between barriers), and the results of the two must be bit-identical: nothing in
// cuda/conv.cu may depend on the order threads run in. (under_schedules, require_close and
// require_identical are in tests/fixtures.h.)
//
// Tolerance: the GPU adds the products of a sum in another order than the CPU (GEMM tiles, bias
// added last), so each value may be off by a few ulps of the largest partial sums:
//   |got − want| ≤ 1e-5 · max |want|   over the whole tensor.
//
//   make test T='[conv][cuda]'
#include <catch2/catch.hpp>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "fixtures.h"
#include "gradcheck.h"
#include "nn/conv.h"
#include "ops/cpu/cnn_ops.h"
#include "ops/cuda_ops.h"

using namespace kiln;
using test::require_identical;
using test::under_schedules;

namespace {

constexpr double kRelTol = 1e-5;  // relative to the largest |value| of the tensor (see above)

void require_close(const Tensor& got, const Tensor& want) { test::require_close(got, want, kRelTol); }

struct Case {
    const char* what;
    int64_t N, C, H, W, O, KH, KW, stride, padding, dilation, groups;
    bool bias;
    int64_t col_images;  // images per workspace chunk on the GPU (< N: several chunks)
};

Conv2dParams params_of(const Case& k) {
    Conv2dParams p;
    p.N = k.N, p.C = k.C, p.H = k.H, p.W = k.W, p.O = k.O, p.KH = k.KH, p.KW = k.KW;
    p.stride = k.stride, p.padding = k.padding, p.dilation = k.dilation, p.groups = k.groups;
    return p;
}

// The shapes: odd sizes everywhere; Kc = Cg·KH·KW below, at and above the kernel's 16-wide k
// steps; N·P·Q over one 64- or 128-column tile; Og ≤ 16 (the 16×128 implicit tile), 16 < Og < 64
// (64×64) and Og ≥ 64 (im2col by default, two 64-row tiles).
const Case kCases[] = {
    // what                                  N  C   H   W   O KH KW  s  pad d  G  bias  col_images
    {"3x3, padding 1, 2 images per chunk", 3, 3, 7, 9, 5, 3, 3, 1, 1, 1, 1, true, 2},
    {"stride 2, groups 2, 3x2 kernel", 2, 4, 9, 8, 6, 3, 2, 2, 0, 1, 2, true, 1},
    {"batch 1, dilation 2, padding 2, no bias", 1, 3, 11, 10, 4, 3, 3, 1, 2, 2, 1, false, 1},
    {"depthwise 3x3", 2, 6, 6, 7, 6, 3, 3, 1, 1, 1, 6, true, 2},
    {"1x1, O = 70 (im2col by default)", 2, 5, 5, 5, 70, 1, 1, 1, 0, 1, 1, true, 2},
    {"5x5 stride 2, O = 20 (64x64 tiles)", 3, 2, 13, 12, 20, 5, 5, 2, 2, 1, 1, true, 3},
    {"stride 3, dilation 2, groups 3, 2x3 kernel", 2, 6, 10, 11, 9, 2, 3, 3, 1, 2, 3, true, 1},
};

using ForwardFn = void (*)(const float*, const float*, const float*, float*, const Conv2dParams&, float*,
                           int64_t);

}  // namespace

TEST_CASE("cuda conv2d: both forward strategies and both backward passes match the CPU", "[conv][cuda][lesson05]") {
    Rng rng(41);
    for (const Case& k : kCases) {
        SECTION(k.what) {
            const Conv2dParams p = params_of(k);
            const int64_t P = p.P(), Q = p.Q();
            Tensor x = Tensor::uniform({k.N, k.C, k.H, k.W}, -1, 1, rng);
            Tensor w = Tensor::uniform({k.O, k.C / k.groups, k.KH, k.KW}, -1, 1, rng);
            Tensor b = Tensor::uniform({k.O}, -1, 1, rng), dy = Tensor::uniform({k.N, k.O, P, Q}, -1, 1, rng);
            Tensor dw0 = Tensor::uniform(w.shape(), -1, 1, rng), db0 = Tensor::uniform({k.O}, -1, 1, rng);

            // The CPU: y, dx, and dw, db accumulated onto dw0, db0.
            Tensor cpu_col = Tensor::empty({std::max<int64_t>(1, k.N * cpu::conv2d_col_elems_per_image(p))});
            Tensor y = Tensor::empty({k.N, k.O, P, Q}), dx = Tensor::empty(x.shape());
            Tensor dw = dw0.clone(), db = db0.clone();
            const float* bias = k.bias ? b.data<float>() : nullptr;
            cpu::conv2d_forward(x.data<float>(), w.data<float>(), bias, y.data<float>(), p, cpu_col.data<float>(), k.N);
            cpu::conv2d_backward_data(dy.data<float>(), w.data<float>(), dx.data<float>(), p, cpu_col.data<float>(),
                                      k.N);
            cpu::conv2d_backward_weight(x.data<float>(), dy.data<float>(), dw.data<float>(),
                                        k.bias ? db.data<float>() : nullptr, p, cpu_col.data<float>(), k.N);

            // The GPU, with a workspace of col_images images.
            Tensor gx = x.to(Device::CUDA), gw = w.to(Device::CUDA), gb = b.to(Device::CUDA), gdy = dy.to(Device::CUDA);
            Tensor col = Tensor::empty({k.col_images * cuda::conv2d_col_elems_per_image(p)}, DType::F32, Device::CUDA);
            const float* gbias = k.bias ? gb.data<float>() : nullptr;
            const Tensor nan = Tensor::full(y.shape(), std::numeric_limits<double>::quiet_NaN());
            const Tensor nan_dx = Tensor::full(x.shape(), std::numeric_limits<double>::quiet_NaN());
            std::vector<Tensor> first;  // the first schedule's results: the second must give the same bits
            under_schedules([&] {
                std::vector<Tensor> got;
                const std::pair<const char*, ForwardFn> strategies[] = {
                    {"im2col", cuda::conv2d_forward_im2col<float>},
                    {"implicit GEMM", cuda::conv2d_forward_implicit_gemm<float>},
                    {"conv2d_forward (by conv2d_algo)", cuda::conv2d_forward<float>},
                };
                for (auto [name, forward] : strategies) {
                    INFO("forward: " << name);
                    Tensor gy = nan.to(Device::CUDA);  // every element must be written
                    forward(gx.data<float>(), gw.data<float>(), gbias, gy.data<float>(), p, col.data<float>(),
                            k.col_images);
                    require_close(gy, y);
                    got.push_back(gy);
                }
                Tensor gdx = nan_dx.to(Device::CUDA);  // dx is overwritten, never read
                cuda::conv2d_backward_data(gdy.data<float>(), gw.data<float>(), gdx.data<float>(), p,
                                           col.data<float>(), k.col_images);
                INFO("backward: dx");
                require_close(gdx, dx);
                Tensor gdw = dw0.to(Device::CUDA), gdb = db0.to(Device::CUDA);  // dw and db accumulate
                cuda::conv2d_backward_weight(gx.data<float>(), gdy.data<float>(), gdw.data<float>(),
                                             k.bias ? gdb.data<float>() : nullptr, p, col.data<float>(),
                                             k.col_images);
                INFO("backward: dw and db");
                require_close(gdw, dw);
                require_close(gdb, db);  // without a bias, db0 untouched on both
                got.insert(got.end(), {gdx, gdw, gdb});
                if (first.empty()) first = got;
                for (size_t i = 0; i < got.size(); i++) require_identical(got[i], first[i]);
            });
        }
    }
}

TEST_CASE("cuda conv2d_algo: implicit GEMM below 64 output channels per group, im2col above",
          "[conv][cuda][lesson05]") {
    Conv2dParams p;
    p.C = 10, p.O = 20, p.KH = p.KW = 5, p.H = p.W = 12;  // LeNet's second convolution
    REQUIRE(cuda::conv2d_algo(p) == ConvAlgo::ImplicitGemm);
    p.C = 64, p.O = 64, p.KH = p.KW = 3;
    REQUIRE(cuda::conv2d_algo(p) == ConvAlgo::Im2col);
    p.groups = 2;  // 32 per group
    REQUIRE(cuda::conv2d_algo(p) == ConvAlgo::ImplicitGemm);
    REQUIRE(std::string(conv_algo_name(ConvAlgo::Im2col)) == "im2col");
    REQUIRE(cuda::conv2d_col_elems_per_image(p) == (64 * 9 + 64) * 10 * 10);  // (C·K·K + O)·P·Q
}

TEST_CASE("cuda Conv2d layer matches the CPU layer, with a workspace of one image", "[conv][cuda][lesson05]") {
    // O = 64 with a 1-image workspace: the im2col forward in 3 chunks; O = 8: the implicit GEMM.
    for (int64_t O : {int64_t(8), int64_t(64)}) {
        INFO("O = " << O);
        Rng rng(43), rng2(43);
        const ConvOptions opt{2, 1, 1, 1, true};
        Conv2d cpu_conv(3, O, 3, rng, opt, "conv"), gpu_conv(3, O, 3, rng2, opt, "conv");
        gpu_conv.to(Device::CUDA);
        gpu_conv.workspace_limit = 1;  // one image per chunk
        Tensor x = Tensor::uniform({3, 3, 9, 8}, -1, 1, rng);
        Tensor y = cpu_conv.forward(x);
        Tensor dy = Tensor::uniform(y.shape(), -1, 1, rng);
        Tensor dx = cpu_conv.backward(dy);
        Tensor gy = gpu_conv.forward(x.to(Device::CUDA));
        REQUIRE(gy.device() == Device::CUDA);
        require_close(gy, y);
        Tensor gdx = gpu_conv.backward(dy.to(Device::CUDA));
        REQUIRE(gdx.device() == Device::CUDA);
        require_close(gdx, dx);
        require_close(gpu_conv.weight.grad, cpu_conv.weight.grad);
        require_close(gpu_conv.bias.grad, cpu_conv.bias.grad);
    }
}

TEST_CASE("cuda Conv2d gradients match finite differences", "[conv][cuda][lesson05][gradcheck]") {
    struct G { const char* what; int64_t N, C, H, W, O, K; ConvOptions opt; };
    const G cases[] = {
        {"stride 2, padding 1", 2, 2, 6, 5, 3, 3, {2, 1, 1, 1, true}},
        {"dilation 2, groups 2, no bias", 1, 4, 7, 7, 2, 3, {1, 1, 2, 2, false}},
    };
    for (const G& g : cases) {
        SECTION(g.what) {
            Rng rng(11);
            Conv2d conv(g.C, g.O, g.K, rng, g.opt, "conv");
            conv.to(Device::CUDA);
            Tensor x = Tensor::normal({g.N, g.C, g.H, g.W}, 0.0f, 1.0f, rng).to(Device::CUDA);
            check_module_gradients(conv, x, 5);
        }
    }
}

TEST_CASE("cuda Conv2d refuses tensors on another device, saying to move the model", "[conv][cuda][lesson05]") {
    using Catch::Matchers::Contains;
    Rng rng(1);
    Conv2d conv(3, 4, 3, rng, {}, "conv1");  // on the CPU
    Tensor x = Tensor::zeros({2, 3, 8, 8});
    REQUIRE_THROWS_WITH(conv.forward(x.to(Device::CUDA)),
                        Contains("conv1") && Contains("weight") && Contains("cpu") && Contains("cuda") &&
                            Contains("model.to("));
    conv.to(Device::CUDA);
    conv.forward(x.to(Device::CUDA));
    REQUIRE_THROWS_WITH(conv.backward(Tensor::zeros({2, 4, 6, 6})),
                        Contains("conv1") && Contains("dy") && Contains("model.to("));
}
