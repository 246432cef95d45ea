// test_cuda_conv.cpp — the CUDA convolution (cuda/conv.cu, chapter 05) against the CPU one
// (src/ops/cpu/conv.cpp, itself checked against the direct 7-loop convolution in test_conv.cpp):
// every pass and both forward strategies on small random shapes that cover each option, the
// layer on the cuda device, finite differences there, and the same-device error; then the direct
// depthwise kernels (groups == C == O) in f32, f16 and bf16, and on a hand-computed channel.
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
//   make test T='[conv][cuda]'        make test T='[depthwise]'
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "fixtures.h"
#include "gradcheck.h"
#include "nn/conv.h"
#include "ops/cnn.h"
#include "ops/kernels/all.h"

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

// The shapes: odd sizes everywhere; Kc = Cg·KH·KW below, at and above the kernels' 8-, 16- and
// 32-wide k steps; N·P·Q over one 64- or 128-column tile; products of at most 16 rows (the 16×128
// tiles), more (64×64), and enough 128×128 tiles for the big shape (two per SM: on the emulator
// an SM is one of its OpenMP threads, and these shapes assume at most 2); a dw sum long enough
// to be split into slices (N·P·Q ≥ 4·256 over one small tile).
const Case kCases[] = {
    // what                                  N  C   H   W   O KH KW  s  pad d  G  bias  col_images
    {"3x3, padding 1, 2 images per chunk", 3, 3, 7, 9, 5, 3, 3, 1, 1, 1, 1, true, 2},
    {"stride 2, groups 2, 3x2 kernel", 2, 4, 9, 8, 6, 3, 2, 2, 0, 1, 2, true, 1},
    {"batch 1, dilation 2, padding 2, no bias", 1, 3, 11, 10, 4, 3, 3, 1, 2, 2, 1, false, 1},
    {"depthwise 3x3", 2, 6, 6, 7, 6, 3, 3, 1, 1, 1, 6, true, 2},
    {"1x1, O = 70 (im2col by default)", 2, 5, 5, 5, 70, 1, 1, 1, 0, 1, 1, true, 2},
    {"5x5 stride 2, O = 20 (64x64 tiles)", 3, 2, 13, 12, 20, 5, 5, 2, 2, 1, 1, true, 3},
    {"stride 3, dilation 2, groups 3, 2x3 kernel", 2, 6, 10, 11, 9, 2, 3, 3, 1, 2, 3, true, 1},
    {"O = 130: the forward on 128x128 tiles", 2, 5, 12, 12, 130, 3, 3, 1, 1, 1, 1, true, 2},
    {"C = 130: dx on 128x128 tiles", 2, 130, 10, 10, 24, 3, 3, 1, 1, 1, 1, false, 1},
    {"a long dw sum, split in slices", 4, 3, 16, 16, 8, 3, 3, 1, 1, 1, 1, true, 4},
};

using ForwardFn = void (*)(const float*, const float*, const float*, float*, const Conv2dParams&, float*,
                           int64_t);
using DataFn = void (*)(const float*, const float*, float*, const Conv2dParams&, float*, int64_t);
using WeightFn = void (*)(const float*, const float*, float*, float*, const Conv2dParams&, float*, int64_t);

}  // namespace

TEST_CASE("cuda conv2d: every strategy of each pass matches the CPU", "[conv][cuda][lesson05]") {
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
            Tensor cpu_col = Tensor::empty({std::max<int64_t>(1, k.N * cpu::conv2d_col_elems_per_image(p, DType::F32))});
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
                // Each output adds its products in the order k = 0, 1, ... and then the bias in
                // all three (the engine's tile moves data differently, not arithmetic): one set of
                // bits. (A depthwise shape's engine forward is the direct kernel: bias first.)
                INFO("the forward strategies give the same bits");
                require_identical(got[1], got[0]);
                if (cuda::conv2d_algo(p) == ConvAlgo::ImplicitGemm) require_identical(got[2], got[0]);
                const std::pair<const char*, DataFn> data_passes[] = {
                    {"im2col", cuda::conv2d_backward_data_im2col<float>},
                    {"conv2d_backward_data (the engine's)", cuda::conv2d_backward_data<float>},
                };
                for (auto [name, backward_data] : data_passes) {
                    INFO("backward dx: " << name);
                    Tensor gdx = nan_dx.to(Device::CUDA);  // dx is overwritten, never read
                    backward_data(gdy.data<float>(), gw.data<float>(), gdx.data<float>(), p, col.data<float>(),
                                  k.col_images);
                    require_close(gdx, dx);
                    got.push_back(gdx);
                }
                const std::pair<const char*, WeightFn> weight_passes[] = {
                    {"im2col", cuda::conv2d_backward_weight_im2col<float>},
                    {"conv2d_backward_weight (the engine's)", cuda::conv2d_backward_weight<float>},
                };
                for (auto [name, backward_weight] : weight_passes) {
                    INFO("backward dw and db: " << name);
                    Tensor gdw = dw0.to(Device::CUDA), gdb = db0.to(Device::CUDA);  // dw and db accumulate
                    backward_weight(gx.data<float>(), gdy.data<float>(), gdw.data<float>(),
                                    k.bias ? gdb.data<float>() : nullptr, p, col.data<float>(), k.col_images);
                    require_close(gdw, dw);
                    require_close(gdb, db);  // without a bias, db0 untouched on both
                    got.insert(got.end(), {gdw, gdb});
                }
                if (first.empty()) first = got;
                for (size_t i = 0; i < got.size(); i++) require_identical(got[i], first[i]);
            });
        }
    }
}

TEST_CASE("cuda conv2d_algo: the implicit GEMMs for every shape but depthwise, which needs no workspace",
          "[conv][cuda][lesson05]") {
    Conv2dParams p;
    p.C = 10, p.O = 20, p.KH = p.KW = 5, p.H = p.W = 12;  // LeNet's second convolution
    REQUIRE(cuda::conv2d_algo(p) == ConvAlgo::ImplicitGemm);
    p.C = 64, p.O = 256, p.KH = p.KW = 3;  // the capstone's widths
    REQUIRE(cuda::conv2d_algo(p) == ConvAlgo::ImplicitGemm);
    p.groups = 2;
    REQUIRE(cuda::conv2d_algo(p) == ConvAlgo::ImplicitGemm);
    REQUIRE(std::string(conv_algo_name(ConvAlgo::ImplicitGemm)) == "implicit-gemm");
    // The engine's passes take no column workspace; the lab's im2col strategies still size theirs.
    REQUIRE(conv2d_workspace(p, Device::CUDA, true, kDefaultConvWorkspace).bytes() == 0);
    REQUIRE(conv2d_workspace(p, Device::CUDA, false, kDefaultConvWorkspace).bytes() == 0);
    REQUIRE(cuda::conv2d_col_elems_per_image(p) == (64 * 9 + 256) * 10 * 10);  // (C·K·K + O)·P·Q
    p.O = 64, p.groups = 64;  // one filter per channel: the direct kernels
    REQUIRE(cuda::conv2d_algo(p) == ConvAlgo::Depthwise);
}

TEST_CASE("cuda Conv2d layer matches the CPU layer, with a workspace of one image", "[conv][cuda][lesson05]") {
    // O = 8 (16×128 tiles) and O = 64 (64×64 tiles); a 1-image workspace limit, which the engine's
    // implicit GEMMs do not need.
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
        {"depthwise, stride 2, dilation 2 (the direct kernels)", 2, 3, 7, 6, 3, 3, {2, 2, 2, 3, true}},
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

// ==== depthwise: groups == C == O, the direct kernels ================================================
// cuda::conv2d_forward, _backward_data and _backward_weight take cuda/conv.cu's depthwise kernels
// for these shapes (and no workspace: col is null here), against cpu::conv2d_* (its own direct
// depthwise loops). In f32 the forward and dx add in the CPU's order (bias, then the taps in
// (kh, kw) order); dw sums in double on the GPU: within kRelTol. f16 and bf16 against the f32 CPU
// on the same values, within the rounding bound of lowp_check.h's header:
//   |got − want| ≤ (u + 2·n·2^-24)·S + tiny      S = Σ|terms| (the f32 op on absolute values),
// n the terms of the sum, u and tiny of T; each result is rounded to T once (r = 1, dx included).
namespace {

struct DepthwiseCase {
    const char* what;
    int64_t N, C, H, W, KH, KW, stride, padding, dilation;
    bool bias;
};

// N·P·Q over one block of 256 (the dw walk's carries), stride 2 and 3, 5×5, dilation 2, odd and
// non-square sizes, a tap that reads only padding (its dw gets nothing), one channel alone.
const DepthwiseCase kDepthwiseCases[] = {
    // what                                                     N  C   H   W KH KW  s pad d  bias
    {"3x3, stride 1, padding 1, N·P·Q = 468", 3, 4, 12, 13, 3, 3, 1, 1, 1, true},
    {"3x3, stride 2, padding 1", 2, 5, 9, 8, 3, 3, 2, 1, 1, false},
    {"5x5, padding 2", 2, 3, 10, 11, 5, 5, 1, 2, 1, true},
    {"3x3, dilation 2, padding 2, no bias", 2, 3, 9, 10, 3, 3, 1, 2, 2, false},
    {"odd 7x9 image, 3x2 kernel, stride 3, padding 1", 3, 2, 7, 9, 3, 2, 3, 1, 1, true},
    {"1x2 image, padding 2, stride 3: taps wholly on the padding", 2, 3, 1, 2, 3, 3, 3, 2, 1, true},
    {"one channel, batch 1, 2x3 kernel, no padding", 1, 1, 6, 5, 2, 3, 1, 0, 1, false},
};

Conv2dParams depthwise_params(const DepthwiseCase& k) {
    Conv2dParams p;
    p.N = k.N, p.C = k.C, p.H = k.H, p.W = k.W, p.O = k.C, p.KH = k.KH, p.KW = k.KW;
    p.stride = k.stride, p.padding = k.padding, p.dilation = k.dilation, p.groups = k.C;
    return p;
}

// The inputs of one case, f32 on the CPU (values of T when rounded by `as`): x, w, b, dy, and
// the dw and db the backward pass accumulates onto.
struct DepthwiseInputs {
    Tensor x, w, b, dy, dw0, db0;
};

DepthwiseInputs depthwise_inputs(const Conv2dParams& p, Rng& rng, DType as = DType::F32) {
    auto values = [&](const Shape& s) { return Tensor::uniform(s, -1, 1, rng).to(as).to(DType::F32); };
    return {values({p.N, p.C, p.H, p.W}), values({p.C, 1, p.KH, p.KW}), values({p.C}),
            values({p.N, p.C, p.P(), p.Q()}), values({p.C, 1, p.KH, p.KW}), values({p.C})};
}

// y, dx, dw (= dw0 + Σ) and db (= db0 + Σ, or db0 without a bias), as f32 on the CPU.
struct DepthwiseResults {
    Tensor y, dx, dw, db;
};

DepthwiseResults cpu_depthwise(const Conv2dParams& p, const DepthwiseInputs& in, bool bias) {
    REQUIRE(cpu::conv2d_algo(p, DType::F32) == ConvAlgo::Depthwise);
    DepthwiseResults r{Tensor::empty(in.dy.shape()), Tensor::empty(in.x.shape()), in.dw0.clone(), in.db0.clone()};
    const float* b = bias ? in.b.data<float>() : nullptr;
    cpu::conv2d_forward<float>(in.x.data<float>(), in.w.data<float>(), b, r.y.data<float>(), p, nullptr, 0);
    cpu::conv2d_backward_data<float>(in.dy.data<float>(), in.w.data<float>(), r.dx.data<float>(), p, nullptr, 0);
    cpu::conv2d_backward_weight<float>(in.x.data<float>(), in.dy.data<float>(), r.dw.data<float>(),
                                bias ? r.db.data<float>() : nullptr, p, nullptr, 0);
    return r;
}

// The same passes on CUDA in T, without a workspace; y and dx start as NaN, so an element the
// kernels never write fails. The results in T, on the device.
template <typename T>
DepthwiseResults cuda_depthwise(const Conv2dParams& p, const DepthwiseInputs& in, bool bias, DType dt) {
    auto dev = [&](const Tensor& t) { return t.to(dt).to(Device::CUDA); };
    const double nan = std::numeric_limits<double>::quiet_NaN();
    const Tensor x = dev(in.x), w = dev(in.w), b = dev(in.b), dy = dev(in.dy);
    DepthwiseResults r{Tensor::full(in.dy.shape(), nan, dt, Device::CUDA),
                       Tensor::full(in.x.shape(), nan, dt, Device::CUDA), dev(in.dw0), dev(in.db0)};
    cuda::conv2d_forward(x.data<T>(), w.data<T>(), bias ? b.data<T>() : nullptr, r.y.data<T>(), p,
                         static_cast<T*>(nullptr), 0);
    cuda::conv2d_backward_data(dy.data<T>(), w.data<T>(), r.dx.data<T>(), p, static_cast<T*>(nullptr), 0);
    cuda::conv2d_backward_weight(x.data<T>(), dy.data<T>(), r.dw.data<T>(), bias ? r.db.data<T>() : nullptr, p,
                                 static_cast<T*>(nullptr), 0);
    return r;
}

DepthwiseInputs abs_inputs(const DepthwiseInputs& in) {
    auto abs = [](const Tensor& t) {
        Tensor a = t.clone();
        for (int64_t i = 0; i < a.numel(); i++) a.data<float>()[i] = std::fabs(a.data<float>()[i]);
        return a;
    };
    return {abs(in.x), abs(in.w), abs(in.b), abs(in.dy), abs(in.dw0), abs(in.db0)};
}

// got (T, any device) against want (f32, CPU): |got − want| ≤ (u + 2·n·2^-24)·S + tiny per element.
void require_within_rounding(const Tensor& got_t, const Tensor& want, const Tensor& S, const test::LowFormat& f,
                             double n) {
    const Tensor got = got_t.to(Device::CPU).to(DType::F32);
    REQUIRE(got.shape() == want.shape());
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < want.numel(); i++) {
        const double g = got.data<float>()[i], w = want.data<float>()[i];
        const double tol = (f.u + 2.0 * n * 0x1p-24) * double(S.data<float>()[i]) + f.tiny;
        if (!(std::fabs(g - w) <= tol) && bad++ == 0) first = i;  // NaN fails
    }
    std::ostringstream msg;
    if (bad) msg << bad << " of " << want.numel() << " values beyond the bound; the first at " << first << ": got "
                 << got.data<float>()[first] << ", want " << want.data<float>()[first];
    INFO(msg.str());
    REQUIRE(bad == 0);
}

template <typename T>
void check_depthwise_low(const DepthwiseCase& k, const test::LowFormat& f, Rng& rng) {
    INFO(dtype_name(f.dtype));
    const Conv2dParams p = depthwise_params(k);
    const DepthwiseInputs in = depthwise_inputs(p, rng, f.dtype);
    const DepthwiseResults want = cpu_depthwise(p, in, k.bias), S = cpu_depthwise(p, abs_inputs(in), k.bias);
    const double taps = double(k.KH * k.KW), outputs = double(k.N * p.P() * p.Q());
    test::under_schedules([&] {
        const DepthwiseResults got = cuda_depthwise<T>(p, in, k.bias, f.dtype);
        INFO("forward");
        require_within_rounding(got.y, want.y, S.y, f, taps + 1);
        INFO("backward: dx");
        require_within_rounding(got.dx, want.dx, S.dx, f, taps);
        INFO("backward: dw and db");
        require_within_rounding(got.dw, want.dw, S.dw, f, outputs + 1);
        require_within_rounding(got.db, want.db, S.db, f, outputs + 1);
    });
}

}  // namespace

TEST_CASE("cuda depthwise conv2d: the direct kernels match the CPU in f32, the same bits under every schedule",
          "[conv][cuda][depthwise]") {
    Rng rng(61);
    for (const DepthwiseCase& k : kDepthwiseCases) {
        SECTION(k.what) {
            const Conv2dParams p = depthwise_params(k);
            const DepthwiseInputs in = depthwise_inputs(p, rng);
            const DepthwiseResults want = cpu_depthwise(p, in, k.bias);
            std::vector<Tensor> first;  // the first schedule's results: the others must give the same bits
            under_schedules([&] {
                const DepthwiseResults got = cuda_depthwise<float>(p, in, k.bias, DType::F32);
                INFO("forward");
                require_close(got.y, want.y);
                INFO("backward: dx");
                require_close(got.dx, want.dx);
                INFO("backward: dw and db (accumulated onto dw0, db0)");
                require_close(got.dw, want.dw);
                require_close(got.db, want.db);
                const std::vector<Tensor> all{got.y, got.dx, got.dw, got.db};
                if (first.empty()) first = all;
                for (size_t i = 0; i < all.size(); i++) require_identical(all[i], first[i]);
            });
        }
    }
}

TEST_CASE("cuda depthwise conv2d in f16 and bf16 matches the f32 CPU within one rounding",
          "[conv][cuda][depthwise][lowp]") {
    Rng rng(67);
    for (const DepthwiseCase& k : kDepthwiseCases) {
        SECTION(k.what) {
            check_depthwise_low<f16>(k, test::low_format(DType::F16), rng);
            check_depthwise_low<bf16>(k, test::low_format(DType::BF16), rng);
        }
    }
}

// One 3×3 channel, padding 1, with weights 2^(3·kh + kw): every tap adds a different amount, so
// a tap skipped (or read twice, or from the wrong place) changes every output it touches. All
// values are small integers: exact in f32, whatever the order of the sums.
//   x = 1 2 3     w =  1   2   4     dy = 1 3 2     b = 1000, dw0 = 100, db0 = 1
//       4 5 6          8  16  32          2 1 4
//       7 8 9         64 128 256          3 2 1
// e.g. y[0, 0] = 1000 + 16·1 + 32·2 + 128·4 + 256·5 (the taps kh, kw ≥ 1; the others are on the
// padding), dx[0, 0] = 1·dy[1, 1] + 2·dy[1, 0] + 8·dy[0, 1] + 16·dy[0, 0],
// dw[0, 0] = 100 + dy[1, 1]·x[0, 0] + dy[1, 2]·x[0, 1] + dy[2, 1]·x[1, 0] + dy[2, 2]·x[1, 1].
TEST_CASE("cuda depthwise conv2d: a hand-computed 3x3 channel, every tap counted once", "[conv][cuda][depthwise]") {
    using test::tensor_of;
    Conv2dParams p;
    p.N = 1, p.C = p.O = p.groups = 1, p.H = p.W = 3, p.KH = p.KW = 3, p.padding = 1;
    const Tensor x = tensor_of({1, 1, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9}, Device::CUDA);
    const Tensor w = tensor_of({1, 1, 3, 3}, {1, 2, 4, 8, 16, 32, 64, 128, 256}, Device::CUDA);
    const Tensor b = tensor_of({1}, {1000}, Device::CUDA);
    const Tensor dy = tensor_of({1, 1, 3, 3}, {1, 3, 2, 2, 1, 4, 3, 2, 1}, Device::CUDA);
    Tensor y = Tensor::empty({1, 1, 3, 3}, DType::F32, Device::CUDA);
    Tensor dx = Tensor::empty(x.shape(), DType::F32, Device::CUDA);
    Tensor dw = Tensor::full(w.shape(), 100, DType::F32, Device::CUDA);
    Tensor db = Tensor::full({1}, 1, DType::F32, Device::CUDA);
    under_schedules([&] {
        cuda::conv2d_forward<float>(x.data<float>(), w.data<float>(), b.data<float>(), y.data<float>(), p, nullptr, 0);
        require_identical(y, tensor_of({1, 1, 3, 3}, {2872, 3568, 2152, 4178, 5097, 2808, 1396, 1510, 1225}));
        cuda::conv2d_backward_data<float>(dy.data<float>(), w.data<float>(), dx.data<float>(), p, nullptr, 0);
        require_identical(dx, tensor_of({1, 1, 3, 3}, {45, 110, 140, 368, 897, 1130, 384, 1032, 848}));
    });
    // dw and db accumulate: once (under the default schedule), onto 100 and 1
    cuda::conv2d_backward_weight<float>(x.data<float>(), dy.data<float>(), dw.data<float>(), db.data<float>(), p,
                                        nullptr, 0);
    require_identical(dw, tensor_of({1, 1, 3, 3}, {122, 144, 134, 153, 196, 169, 161, 189, 148}));
    require_identical(db, tensor_of({1}, {20}));
}
