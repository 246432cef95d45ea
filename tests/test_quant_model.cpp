// test_quant_model.cpp — chapter 11 from the top: the arithmetic of ops/qparams.h, the
// Tensor-level ops' checks (ops/quant.h) and depthwise qconv2d against f32's conv2d, batch-norm
// folding (quant/fold.h), and the int8 network (quant/qmodel.h): conversion, its accuracy against
// f32, its file, its errors.
// On CUDA (cuda/quant.cu, on the emulator without a GPU): quantize/dequantize, fake quantization
// and the Tensor-level int8 ops give the CPU's bits, beside their CPU cases (quant_check.h).
// The int8 kernels themselves are tested against integer references, CPU and CUDA, in
// test_qgemm.cpp; the observers in test_observer.cpp.
//
// Run: make build/tests/kiln_tests && build/tests/kiln_tests '[lesson11]'
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>

#include <unistd.h>  // getpid

#include <catch2/catch.hpp>

#include "core/allocator.h"
#include "fixtures.h"
#include "nn/conv.h"
#include "nn/layers.h"
#include "nn/misc.h"
#include "nn/models.h"
#include "nn/norm.h"
#include "nn/pool.h"
#include "nn/prune.h"
#include "ops/conv.h"
#include "ops/quant.h"
#include "quant/fold.h"
#include "quant/qat.h"
#include "quant/qmodel.h"
#include "ops/qparams.h"
#include "quant_check.h"
#include "train/checkpoint.h"

using namespace kiln;
using Catch::Matchers::Contains;
using test::require_close;
using test::require_identical;
using test::under_schedules;
using namespace kiln::test::quant;  // quant_check.h

namespace {

// A fresh path under /tmp for this test process.
std::string temp_path(const std::string& name) {
    return "/tmp/kiln-test-quant-" + std::to_string(::getpid()) + "-" + name;
}

// Every batch norm of the model with running statistics and an affine that are not the
// identity: mean ~ N(0, 0.5), var ~ U(0.5, 2), γ ~ U(0.5, 1.5) (negated where `negative_gamma`
// names the layer), β ~ N(0, 0.3).
void randomize_batchnorms(Module& model, Rng& rng, const std::string& negative_gamma = "") {
    for (auto& [name, m] : model.named_modules()) {
        auto* bn = dynamic_cast<BatchNorm2d*>(m);
        if (!bn) continue;
        const Shape c{bn->num_features};
        bn->running_mean = Tensor::normal(c, 0, 0.5f, rng);
        bn->running_var = Tensor::uniform(c, 0.5f, 2.0f, rng);
        bn->weight.value = Tensor::uniform(c, 0.5f, 1.5f, rng);
        bn->bias.value = Tensor::normal(c, 0, 0.3f, rng);
        if (name == negative_gamma) bn->weight.value.data<float>()[0] = -1.0f;
    }
}

Tensor eval_forward(Module& model, const Tensor& x) {
    model.eval();
    NoGradScope no_grad;
    return model.call(x);
}

// The int8 network of `model`, calibrated with min/max observers on x itself: nothing is clipped,
// so it differs from f32 only by rounding.
QuantizedNet minmax_int8(Module& model, const Tensor& x) {
    QuantConfig config;
    config.activations = QuantConfig::Observer::MinMax;
    Calibrator cal(model, config);
    cal.run(x);
    return convert(model, cal);
}

// The kinds of the steps, from the summary (one line per step, a residual's own steps below it,
// indented two more spaces): "input conv residual( conv conv ) ... output".
std::string step_kinds(const QuantizedNet& q) {
    std::istringstream lines(q.summary());
    std::string line, kinds;
    size_t depth = 1;
    while (std::getline(lines, line)) {
        const size_t indent = line.find_first_not_of(' ') / 2;
        for (; depth > indent; depth--) kinds += ") ";
        const size_t colon = line.find(": ");
        const std::string kind = line.substr(colon + 2, line.find(' ', colon + 2) - colon - 2);
        kinds += kind + (kind == "residual" ? "( " : " ");
        depth = kind == "residual" ? indent + 1 : indent;
    }
    return kinds;
}

// A small residual net with a shortcut, as ResNet's blocks are: relu(body(x) + shortcut(x)).
//   stem conv 3→8 3×3 + ReLU, block: Residual(body: conv 8→16 3×3 stride 2 + ReLU, conv 16→16 3×3;
//   shortcut: conv 8→16 1×1 stride 2) then ReLU, global average pool, linear 16→10
std::unique_ptr<Sequential> shortcut_net(Rng& rng) {
    auto body = std::make_unique<Sequential>("body");
    body->add("conv1", std::make_unique<Conv2d>(8, 16, 3, rng, ConvOptions{2, 1}));
    body->add("relu", std::make_unique<ReLU>());
    body->add("conv2", std::make_unique<Conv2d>(16, 16, 3, rng, ConvOptions{1, 1}));
    auto block = std::make_unique<Sequential>("block");
    block->add("residual", std::make_unique<Residual>(std::move(body),
                                                      std::make_unique<Conv2d>(8, 16, 1, rng, ConvOptions{2, 0})));
    block->add("relu", std::make_unique<ReLU>());
    auto net = std::make_unique<Sequential>("shortcut-net");
    net->add("stem", std::make_unique<Conv2d>(3, 8, 3, rng, ConvOptions{1, 1}));
    net->add("relu", std::make_unique<ReLU>());
    net->add("block", std::move(block));
    net->add("pool", std::make_unique<GlobalAvgPool>());
    net->add("fc", std::make_unique<Linear>(16, 10, rng));
    return net;
}

// The largest |got − want| over the logits, as a fraction of the f32 logits' range.
double error_of_range(const Tensor& got, const Tensor& want) {
    double lo = 0, hi = 0, err = 0;
    for (int64_t i = 0; i < want.numel(); i++) {
        const double w = want.data<float>()[i];
        lo = std::min(lo, w), hi = std::max(hi, w);
        err = std::max(err, std::abs(double(got.data<float>()[i]) - w));
    }
    return err / (hi - lo);
}

}  // namespace

// ---- the arithmetic -------------------------------------------------------------------------------
TEST_CASE("quantize_value rounds half to even, saturates, and keeps the zero point exact",
          "[lesson11][quant][cpu]") {
    // scale 0.5: x / scale = 2x
    const float inv = 2.0f;
    CHECK(quantize_value(0.25f, inv, 0, 0, 255) == 0);    // 0.5 → 0 (even)
    CHECK(quantize_value(0.75f, inv, 0, 0, 255) == 2);    // 1.5 → 2 (even)
    CHECK(quantize_value(1.25f, inv, 10, 0, 255) == 12);  // 2.5 → 2, + 10
    CHECK(quantize_value(0.0f, inv, 37, 0, 255) == 37);   // 0 is exactly the zero point
    CHECK(quantize_value(1000.0f, inv, 0, 0, 255) == 255);
    CHECK(quantize_value(-1000.0f, inv, 0, -128, 127) == -128);
    CHECK(quantize_value(-3.0f, inv, 0, 0, 127) == 0);
    CHECK(dequantize_value(12, 0.5f, 10) == 1.0f);
}

TEST_CASE("choose_qparams: PyTorch's rules on hand-computed ranges", "[lesson11][quant][cpu]") {
    // [−1, 3] over [0, 255]: scale = 4/255, zero point = 0 − round(−1 / (4/255)) = round(63.75) = 64.
    QParams a = choose_qparams_affine(-1.0f, 3.0f, 0, 255);
    CHECK(a.scale == Approx(4.0 / 255).epsilon(1e-7));
    CHECK(a.zero_point == 64);
    // [2, 5]: the range is widened to [0, 5] so that 0 is exact: zero point 0.
    a = choose_qparams_affine(2.0f, 5.0f, 0, 127);
    CHECK(a.scale == Approx(5.0 / 127).epsilon(1e-7));
    CHECK(a.zero_point == 0);
    // [−4, −1] → [−4, 0]: zero point 255.
    CHECK(choose_qparams_affine(-4.0f, -1.0f, 0, 255).zero_point == 255);
    // all zero: the scale becomes float32's epsilon, not 0.
    CHECK(choose_qparams_affine(0.0f, 0.0f, 0, 255).scale == std::numeric_limits<float>::epsilon());
    // symmetric [−2, 1] over [−128, 127]: scale = 2 / 127.5, zero point 0.
    const QParams s = choose_qparams_symmetric(-2.0f, 1.0f, -128, 127);
    CHECK(s.scale == Approx(2.0 / 127.5).epsilon(1e-7));
    CHECK(s.zero_point == 0);
    CHECK_THROWS_WITH(choose_qparams_affine(1.0f, 0.0f, 0, 255), Contains("observe some data first"));
}

// M = m0 · 2^(−31 − shift) is within 2^-31 of the real multiplier, and apply_requant rounds
// acc · M exactly: the reference is floor(acc · m0 / 2^(31 + shift) + 1/2) in long double, whose
// 64-bit mantissa holds acc · m0 (≤ 2^24 · 2^31) exactly.
TEST_CASE("requantization in fixed point is round(acc · M), half up", "[lesson11][quant][cpu]") {
    Rng rng(11);
    for (int i = 0; i < 2000; i++) {
        const double M = std::exp(double(rng.next_below(1000000)) * 18e-6 - 16.0);  // 1e-7 .. 7
        const Requant r = make_requant(M);
        REQUIRE(r.m0 >= (1 << 30));
        const long double Mq = std::ldexp((long double)r.m0, -31 - r.shift);
        REQUIRE(std::fabs(double(Mq) - M) <= M * std::ldexp(1.0, -31));
        const int32_t acc = int32_t(rng.next_below(1u << 25)) - (1 << 24);
        const long double want = std::floor((long double)acc * Mq + 0.5L);
        INFO("M " << M << " acc " << acc);
        REQUIRE(apply_requant(acc, r) == int32_t(want));
    }
    CHECK(make_requant(0.0).m0 == 0);
    CHECK(apply_requant(5, make_requant(0.5)) == 3);     // 2.5 → 3: half up
    CHECK(apply_requant(-5, make_requant(0.5)) == -2);   // −2.5 → −2: half up
    CHECK(requantize_value(1000, make_requant(0.5), 10, 0, 255) == 255);
    CHECK(requantize_value(-100, make_requant(0.5), 10, 10, 255) == 10);  // a fused ReLU's clamp
}

TEST_CASE("quantize and dequantize ops: round trip within half a step, and their errors", "[lesson11][quant][quantize][cpu]") {
    Rng rng(2);
    const Tensor x = Tensor::uniform({3, 5}, -1.0f, 2.0f, rng);
    const QParams qp = choose_qparams_affine(-1.0f, 2.0f, 0, 255);
    const Tensor back = dequantize(quantize(x, qp, DType::U8), qp);
    require_close(back, x, 0.0, qp.scale / 2 * (1 + 1e-6));  // |x − x̂| ≤ scale/2 inside the range
    Tensor bad = x.to(Device::CPU);
    bad.data<float>()[7] = std::nanf("");
    CHECK_THROWS_WITH(quantize(bad, qp, DType::U8), Contains("needs finite values") && Contains("element 7"));
    CHECK_THROWS_WITH(quantize(x, QParams{1.0f, 0, -128, 127}, DType::U8), Contains("does not fit u8"));
    CHECK_THROWS_WITH(quantize(x, qp, DType::I32), Contains("u8 or i8"));
    const Tensor s = Tensor::ones({4}), z = Tensor::zeros({4}, DType::I32);
    CHECK_THROWS_WITH(quantize_per_channel(x, s, z, 0, -128, 127, DType::I8), Contains("scale"));
    CHECK_THROWS_WITH(quantize_per_channel(x, s, z, 2, -128, 127, DType::I8), Contains("past the last dimension"));
}

// On CUDA (cuda/quant.cu; on the emulator without a GPU, under each schedule): the CPU's bits.
namespace {

// x [outer, C, inner] quantized to Q and back on both devices, with channel c's scale[c] and
// zero_point[c]; per tensor (C = 1) through quantize/dequantize, which take them by value.
template <typename Q>
void check_round_trip(const std::vector<float>& x, int64_t outer, int64_t C, int64_t inner,
                      const std::vector<float>& scale, const std::vector<int32_t>& zero_point, int32_t qmin,
                      int32_t qmax) {
    const int64_t n = outer * C * inner;
    const bool per_tensor = C == 1;
    INFO((per_tensor ? "per tensor" : "per channel") << ", qmin " << qmin << ", qmax " << qmax);
    std::vector<Q> q(static_cast<size_t>(n));
    std::vector<float> back(static_cast<size_t>(n));
    if (per_tensor) {
        cpu::quantize(x.data(), q.data(), n, scale[0], zero_point[0], qmin, qmax);
        cpu::dequantize(q.data(), back.data(), n, scale[0], zero_point[0]);
    } else {
        cpu::quantize_per_channel(x.data(), q.data(), outer, C, inner, scale.data(), zero_point.data(), qmin, qmax);
        cpu::dequantize_per_channel(q.data(), back.data(), outer, C, inner, scale.data(), zero_point.data());
    }
    DeviceArray<float> x_d(x), scale_d(scale);
    DeviceArray<int32_t> zero_point_d(zero_point);
    under_schedules([&] {
        DeviceArray<Q> q_d(n);
        DeviceArray<float> back_d(n);
        if (per_tensor) {
            cuda::quantize(x_d.get(), q_d.get(), n, scale[0], zero_point[0], qmin, qmax);
            cuda::dequantize(q_d.get(), back_d.get(), n, scale[0], zero_point[0]);
        } else {
            cuda::quantize_per_channel(x_d.get(), q_d.get(), outer, C, inner, scale_d.get(), zero_point_d.get(), qmin,
                                       qmax);
            cuda::dequantize_per_channel(q_d.get(), back_d.get(), outer, C, inner, scale_d.get(), zero_point_d.get());
        }
        require_same_bits(q_d.host(), q);
        require_same_bits(back_d.host(), back);
    });
}

}  // namespace

TEST_CASE("cuda quantize and dequantize match the CPU bit for bit", "[lesson11][cuda][quant][quantize]") {
    Rng rng(3);
    const int64_t outer = 3, C = 5, inner = 37, n = outer * C * inner;
    std::vector<float> x = random_floats(n, -3.0f, 3.0f, rng);
    const std::vector<float> scale = random_floats(C, 0.005f, 0.05f, rng);
    // Ties (x = (k + 0.5)·scale rounds to even), out-of-range values, infinities and a NaN (qmin).
    x[0] = 2.5f * scale[0];
    x[1] = -3.5f * scale[0];
    x[2] = 1e9f;
    x[3] = -std::numeric_limits<float>::infinity();
    x[4] = std::numeric_limits<float>::quiet_NaN();
    // Per tensor: u8 with a reduced range, i8.
    check_round_trip<uint8_t>(x, 1, 1, n, {0.02f}, {37}, kActQmin, kActQmaxReduced);
    check_round_trip<int8_t>(x, 1, 1, n, {0.03f}, {0}, kWeightQmin, kWeightQmax);
    // Per channel: u8 affine along dim 1, i8 symmetric along dim 0 (a conv weight [O, C·KH·KW]).
    check_round_trip<uint8_t>(x, outer, C, inner, scale, random_ints<int32_t>(C, 0, 255, rng), kActQmin, kActQmax);
    check_round_trip<int8_t>(x, 1, C, outer * inner, scale, std::vector<int32_t>(static_cast<size_t>(C), 0),
                             kWeightQmin, kWeightQmax);
}

// ---- the int8 ops of a MobileNetV2: depthwise qconv2d, qadd, qglobal_avgpool ---------------------------
TEST_CASE("qconv2d depthwise is within 1 of f32's depthwise conv2d of the dequantized tensors, quantized",
          "[lesson11][cpu][quant][depthwise]") {
    // Both compute ŷ = conv(x̂, ŵ) + b on the same dequantized x̂ and ŵ, then round ŷ / s_y once. The
    // int8 layer's sum is exact but for its bias, rounded to a unit of s_x·s_w[c] (half of one is
    // M_c / 2 of a step of y, M_c = s_x·s_w[c] / s_y: a few thousandths here), and its multiplier
    // (2^-31 relative); f32's sum of 10 terms is off by a few ulps. So the two values rounded are
    // less than 1 apart, and their integers at most 1.
    Rng rng(17);
    const int64_t N = 2, C = 6;
    for (int64_t stride : {int64_t(1), int64_t(2)}) {
        INFO("stride " << stride);
        const Tensor x = Tensor::uniform({N, C, 9, 8}, -1.0f, 2.0f, rng);
        const Tensor w = Tensor::uniform({C, 1, 3, 3}, -1.0f, 1.0f, rng);
        const Tensor b = Tensor::uniform({C}, -0.5f, 0.5f, rng);
        const QParams x_qp = choose_qparams_affine(-1.0f, 2.0f, kActQmin, kActQmax);
        Tensor w_scale = Tensor::empty({C}), w_zero = Tensor::zeros({C}, DType::I32);
        for (int64_t c = 0; c < C; c++) {
            const float* wc = w.data<float>() + c * 9;
            w_scale.data<float>()[c] =
                choose_qparams_symmetric(*std::min_element(wc, wc + 9), *std::max_element(wc, wc + 9), kWeightQmin,
                                         kWeightQmax).scale;
        }
        const Tensor xq = quantize(x, x_qp, DType::U8);
        const Tensor wq = quantize_per_channel(w, w_scale, w_zero, 0, kWeightQmin, kWeightQmax, DType::I8);
        Conv2dArgs args;
        args.stride = stride, args.padding = 1, args.groups = C;
        const Tensor y = conv2d(dequantize(xq, x_qp), dequantize_per_channel(wq, w_scale, w_zero, 0), b, args);
        const float* yv = y.data<float>();
        const QParams y_qp = choose_qparams_affine(*std::min_element(yv, yv + y.numel()),
                                                   *std::max_element(yv, yv + y.numel()), kActQmin, kActQmax);
        const Tensor want = quantize(y, y_qp, DType::U8);
        // The int8 layer: bias[c] = round(b[c] / (s_x·s_w[c])) − z_x·Σ w[c], M_c = s_x·s_w[c] / s_y.
        Tensor bias = Tensor::empty({C}, DType::I32), requant = Tensor::empty({C, 2}, DType::I32);
        for (int64_t c = 0; c < C; c++) {
            const double s_xw = double(x_qp.scale) * double(w_scale.data<float>()[c]);
            int32_t wsum = 0;
            for (int64_t k = 0; k < 9; k++) wsum += wq.data<int8_t>()[c * 9 + k];
            bias.data<int32_t>()[c] = int32_t(std::lround(double(b.data<float>()[c]) / s_xw)) - x_qp.zero_point * wsum;
            const Requant r = make_requant(s_xw / double(y_qp.scale));
            requant.data<int32_t>()[2 * c] = r.m0, requant.data<int32_t>()[2 * c + 1] = r.shift;
        }
        const QLayerOutput out{bias, requant, y_qp.zero_point, kActQmin, kActQmax};
        const Tensor got = qconv2d(xq, wq, out, stride, 1, 1, C, x_qp.zero_point, kActQmax);
        REQUIRE(got.shape() == want.shape());
        int64_t off = 0, equal = 0;
        for (int64_t i = 0; i < got.numel(); i++) {
            const int d = std::abs(int(got.data<uint8_t>()[i]) - int(want.data<uint8_t>()[i]));
            off += d > 1, equal += d == 0;
        }
        INFO(equal << " of " << got.numel() << " equal");
        CHECK(off == 0);
    }
}

TEST_CASE("qconv2d, qadd and qglobal_avgpool refuse bad input with a message naming the op",
          "[lesson11][cpu][quant]") {
    const Tensor x = Tensor::zeros({1, 4, 5, 5}, DType::U8), w = Tensor::zeros({4, 1, 3, 3}, DType::I8);
    const QLayerOutput out{Tensor::zeros({4}, DType::I32), Tensor::zeros({4, 2}, DType::I32), 0, 0, 255};
    CHECK(qconv2d(x, w, out, 1, 1, 1, 4, 0, 255).shape() == Shape{1, 4, 5, 5});  // depthwise
    CHECK_THROWS_WITH(qconv2d(Tensor::zeros({1, 4, 5, 5}), w, out, 1, 1, 1, 4, 0, 255),
                      Contains("qconv2d: 'x' should be u8"));
    CHECK_THROWS_WITH(qconv2d(x, Tensor::zeros({4, 1, 3, 3}, DType::U8), out, 1, 1, 1, 4, 0, 255),
                      Contains("qconv2d: 'w' should be i8"));
    CHECK_THROWS_WITH(qconv2d(x, w, out, 1, 1, 1, 2, 0, 255), Contains("qconv2d") && Contains("C/groups"));
    CHECK_THROWS_WITH(qconv2d(x, Tensor::zeros({4, 2, 3, 3}, DType::I8), out, 1, 1, 1, 2, 0, 255),
                      Contains("qconv2d: groups=2") && Contains("depthwise"));
    const QLayerOutput out8{Tensor::zeros({8}, DType::I32), Tensor::zeros({8, 2}, DType::I32), 0, 0, 255};
    CHECK_THROWS_WITH(qconv2d(x, Tensor::zeros({8, 1, 3, 3}, DType::I8), out8, 1, 1, 1, 4, 0, 255),
                      Contains("qconv2d: groups=4"));  // groups = C but O = 2·C: not depthwise

    const Tensor a = Tensor::zeros({2, 3}, DType::U8);
    const QParams q{0.1f, 5};
    CHECK_THROWS_WITH(qadd(a, q, Tensor::zeros({3, 2}, DType::U8), q, q), Contains("qadd: 'b' should have shape"));
    CHECK_THROWS_WITH(qadd(Tensor::zeros({2, 3}, DType::I8), q, a, q, q), Contains("qadd: 'a' should be u8"));
    CHECK_THROWS_WITH(qadd(a, q, a, QParams{1e-5f, 5}, q), Contains("qadd") && Contains("4096"));
    CHECK_THROWS_WITH(qadd(a, q, a, q, QParams{0.0f, 5}), Contains("qadd") && Contains("positive"));
    CHECK_THROWS_WITH(qadd(a, q, a, q, QParams{0.1f, 5, 0, 300}), Contains("qadd") && Contains("[0, 255]"));

    CHECK_THROWS_WITH(qglobal_avgpool(Tensor::zeros({1, 4, 5, 5})), Contains("qglobal_avgpool: 'x' should be u8"));
    CHECK_THROWS_WITH(qglobal_avgpool(a), Contains("qglobal_avgpool: 'x' should be [N, C, H, W]"));
    CHECK_THROWS_WITH(qglobal_avgpool(Tensor::zeros({1, 4, 0, 5}, DType::U8)), Contains("H·W > 0"));
}

TEST_CASE("the Tensor-level depthwise qconv2d, qadd and qglobal_avgpool on cuda give the CPU's bytes",
          "[lesson11][cuda][quant][qconv][qadd][qpool]") {
    Rng rng(16);
    const int64_t N = 2, C = 6;
    // A CPU tensor of `shape` holding v's bytes.
    auto tensor = [](const Shape& shape, DType dtype, const auto& v) {
        Tensor t = Tensor::empty(shape, dtype);
        std::memcpy(t.raw(), v.data(), t.nbytes());
        return t;
    };
    const Tensor x = tensor({N, C, 7, 5}, DType::U8, random_ints<uint8_t>(N * C * 35, 0, 255, rng));
    const Tensor x2 = tensor({N, C, 7, 5}, DType::U8, random_ints<uint8_t>(N * C * 35, 0, 255, rng));
    const std::vector<int8_t> wv = random_ints<int8_t>(C * 9, -128, 127, rng);
    const Tensor w = tensor({C, 1, 3, 3}, DType::I8, wv);
    Output o(C, acc_spread(9), true, rng, wv);
    const Tensor bias = tensor({C}, DType::I32, o.bias), requant = tensor({C, 2}, DType::I32, o.requant);
    const QLayerOutput out{bias, requant, o.zero_point, o.lo, o.hi};
    const QLayerOutput out_d{bias.to(Device::CUDA), requant.to(Device::CUDA), o.zero_point, o.lo, o.hi};
    const Tensor x_d = x.to(Device::CUDA);
    for (int64_t stride : {int64_t(1), int64_t(2)}) {
        const Tensor y = qconv2d(x, w, out, stride, 1, 1, C, 128, 255);
        require_identical(qconv2d(x_d, w.to(Device::CUDA), out_d, stride, 1, 1, C, 128, 255), y);
    }
    const QParams qa{0.04f, 120}, qb{0.03f, 70}, qy{0.06f, 100};
    require_identical(qadd(x_d, qa, x2.to(Device::CUDA), qb, qy), qadd(x, qa, x2, qb, qy));
    require_identical(qglobal_avgpool(x_d), qglobal_avgpool(x));
    REQUIRE_THROWS_WITH(qadd(x, qa, x_d, qb, qy), Catch::Contains("qadd: tensors on different devices"));
}

// ---- batch norm folding ------------------------------------------------------------------------------
// The folded net computes the same function up to rounding: each folded conv multiplies its
// weights by a_c once (one rounding, u = 2^-24 relative) instead of scaling the sum after, so a
// sum of K terms moves by about K·u of its largest terms; L = 8 layers of it (7 convs, the
// head) give tol = 2·L·K·u relative to the largest logit, K = 16·9 the longest reduction.
TEST_CASE("fold_batchnorm: the folded CIFAR net computes what the original does in eval mode",
          "[lesson11][fold][cpu]") {
    for (const std::string negative : {"", "block2a.bn"}) {
        INFO("negative gamma in '" << negative << "'");
        Rng rng(4);
        auto model = cifar_net(rng, {8, 16, 16, 8});
        randomize_batchnorms(*model, rng, negative);
        const Tensor x = Tensor::normal({3, 3, 32, 32}, 0, 1, rng);
        const Tensor want = eval_forward(*model, x);
        const std::vector<std::string> folded = fold_batchnorm(*model);
        // Six batch norms; one after a max-pool with a negative γ cannot fold (max would become min).
        CHECK(folded.size() == (negative.empty() ? 6u : 5u));
        if (!negative.empty()) CHECK(dynamic_cast<BatchNorm2d*>(&model->module_at(negative)) != nullptr);
        CHECK(dynamic_cast<Identity*>(&model->module_at("block1b.bn")) != nullptr);
        CHECK(static_cast<Conv2d&>(model->module_at("block1b.conv")).bias.value.defined());
        const double tol = 2 * 8 * 16 * 9 / double(1 << 24);
        require_close(eval_forward(*model, x), want, tol);
    }
}

// ---- the int8 network -----------------------------------------------------------------------------------
// LeNet with random weights, calibrated with min/max observers on the very inputs it is then
// run on (so nothing is clipped): the int8 logits differ from f32 only by rounding. Each of the
// 4 weighted layers rounds its weights and its output to 8 bits — half a step, 1/510 of the
// range each — and the errors add up through the layers; 4 layers at ~1/255 of the range give
// a bound of 4% of the logits' range, which a wrong zero point or scale exceeds many times over.
TEST_CASE("convert: LeNet in int8 computes its f32 logits within rounding", "[lesson11][qmodel][cpu]") {
    Rng rng(7);
    auto model = lenet(rng);
    const Tensor x = Tensor::normal({16, 1, 28, 28}, 0, 1, rng);
    const Tensor want = eval_forward(*model, x);
    QuantizedNet q = minmax_int8(*model, x);
    // input, conv1 (+ReLU through the pool), pool, conv2, pool, flatten, fc1 (+ReLU), fc2, output
    std::string kinds;
    for (const auto& s : q.steps) kinds += s->kind + " ";
    CHECK(kinds == "input conv maxpool conv maxpool flatten linear linear output ");
    const Tensor got = q.forward(x);
    double lo = 0, hi = 0;
    for (int64_t i = 0; i < want.numel(); i++) lo = std::min(lo, double(want.data<float>()[i])), hi = std::max(hi, double(want.data<float>()[i]));
    require_close(got, want, 0.0, 0.04 * (hi - lo));
}

TEST_CASE("convert: the CIFAR net with its batch norms folded, GELUs as tables", "[lesson11][qmodel][cpu]") {
    Rng rng(8);
    auto model = cifar_net(rng, {8, 16, 16, 8});
    randomize_batchnorms(*model, rng, "block2a.bn");  // one batch norm stays: a per-channel table
    fold_batchnorm(*model);
    const Tensor x = Tensor::normal({4, 3, 32, 32}, 0, 1, rng);
    QuantizedNet q = minmax_int8(*model, x);
    int tables = 0, per_channel = 0;
    for (const auto& s : q.steps)
        if (s->kind == "table") {
            tables++;
            const std::string d = s->describe();
            per_channel += d.find("bn+gelu, 16×256") != std::string::npos;
        }
    CHECK(tables == 7);       // stem's GELU and one per block
    CHECK(per_channel == 1);  // block2a's unfolded batch norm and its GELU, one table per channel
    CHECK(q.forward(x).shape() == Shape{4, 10});
}

// MobileNetV2 (chapter 13) at width 0.25: every kind of its layers has an int8 step — the
// depthwise convs, ReLU6 fused as a clamp into the conv before it, the residual adds (qadd),
// the global average pool — and the logits stay close to f32's through 53 convolutions.
TEST_CASE("convert: MobileNetV2 in int8, depthwise convs, ReLU6 clamps, residual adds", "[lesson11][qmodel][cpu]") {
    Rng rng(13);
    auto model = mobilenet_v2(rng, 10, 0.25f);
    randomize_batchnorms(*model, rng);
    fold_batchnorm(*model);
    const Tensor x = Tensor::normal({8, 3, 32, 32}, 0, 1, rng);
    const Tensor want = eval_forward(*model, x);
    const QuantizedNet q = minmax_int8(*model, x);
    const std::string kinds = step_kinds(q), summary = q.summary();
    const auto count = [](const std::string& text, const std::string& what) {
        size_t n = 0;
        for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) n++;
        return n;
    };
    INFO(summary);
    size_t residuals = 0;  // the blocks with stride 1 and as many channels out as in: 12 at this width
    for (auto& [name, m] : model->named_modules()) residuals += dynamic_cast<Residual*>(m) != nullptr;
    CHECK(residuals == 12);
    CHECK(count(kinds, "residual(") == residuals);
    CHECK(count(summary, " depthwise") == 17);  // one per block
    CHECK(count(summary, "+ ReLU ≤ 6") == 35);  // stem, 17 depthwise, 16 expansions, the 1280-wide conv
    CHECK(count(kinds, "table") == 0);          // every ReLU6 fused, every batch norm folded
    CHECK(kinds.find("avgpool linear output") != std::string::npos);
    // 53 layers, each rounding its output to 1/255 of its range: a few percent of the logits'
    // range, where LeNet's 5 layers stay within 4%.
    CHECK(error_of_range(q.forward(x), want) < 0.08);
}

// A shortcut with a layer of its own, and a ReLU after the sum: the body's last conv must not take
// that ReLU (it acts on the sum), so it is a table after the residual step.
TEST_CASE("convert: a residual with a shortcut conv, and the ReLU after the sum", "[lesson11][qmodel][cpu]") {
    Rng rng(14);
    auto model = shortcut_net(rng);
    const Tensor x = Tensor::normal({6, 3, 12, 12}, 0, 1, rng);
    const Tensor want = eval_forward(*model, x);
    const QuantizedNet q = minmax_int8(*model, x);
    INFO(q.summary());
    CHECK(step_kinds(q) == "input conv residual( conv conv conv ) table avgpool linear output ");
    CHECK(q.summary().find("block.residual.body.conv2: conv     [16, 16, 3, 3] i8, out") != std::string::npos);
    CHECK(error_of_range(q.forward(x), want) < 0.04);
}

// The int8 file: what is saved is what comes back (the same logits, bit for bit), at about a
// quarter of the f32 checkpoint: the weights take 1 byte instead of 4, and the per-channel
// scales, int32 biases, tables and the header add a little.
TEST_CASE("QuantizedNet: save and load give the same network, at ≤ 27% of the f32 file",
          "[lesson11][qmodel][cpu]") {
    Rng rng(9);
    auto model = cifar_net(rng, {32, 64, 128});
    randomize_batchnorms(*model, rng);
    const std::string f32_path = temp_path("f32.safetensors"), q_path = temp_path("int8.safetensors");
    StateDict f32_state;
    save_model(f32_state, *model);
    write_safetensors(f32_path, f32_state);
    fold_batchnorm(*model);
    const Tensor x = Tensor::normal({2, 3, 32, 32}, 0, 1, rng);
    Calibrator cal(*model, QuantConfig{});
    cal.run(x);
    const QuantizedNet q = convert(*model, cal);
    q.save(q_path);
    const QuantizedNet back = QuantizedNet::load(q_path);
    require_identical(back.forward(x), q.forward(x));
    CHECK(back.summary() == q.summary());
    const auto file_size = [](const std::string& p) {
        std::FILE* f = std::fopen(p.c_str(), "rb");
        std::fseek(f, 0, SEEK_END);
        const long n = std::ftell(f);
        std::fclose(f);
        return double(n);
    };
    const double ratio = file_size(q_path) / file_size(f32_path);
    INFO("int8 file / f32 file = " << ratio);
    CHECK(ratio <= 0.27);
    std::remove(f32_path.c_str());
    std::remove(q_path.c_str());
}

// Residual steps in the file: their own steps follow them in "quant.steps", and load rebuilds the
// same nesting (the same summary) and the same logits.
TEST_CASE("QuantizedNet: residual steps saved and loaded, bit for bit", "[lesson11][qmodel][cpu]") {
    Rng rng(15);
    auto mobilenet = mobilenet_v2(rng, 10, 0.25f);
    randomize_batchnorms(*mobilenet, rng);
    fold_batchnorm(*mobilenet);
    auto shortcut = shortcut_net(rng);
    for (Module* m : {static_cast<Module*>(mobilenet.get()), static_cast<Module*>(shortcut.get())}) {
        INFO(m->name());
        const Tensor x = Tensor::normal({2, 3, 32, 32}, 0, 1, rng);
        Calibrator cal(*m, QuantConfig{});
        cal.run(x);
        const QuantizedNet q = convert(*m, cal);
        const std::string path = temp_path("residual-int8.safetensors");
        q.save(path);
        const QuantizedNet back = QuantizedNet::load(path);
        std::remove(path.c_str());
        CHECK(back.summary() == q.summary());
        require_identical(back.forward(x), q.forward(x));
    }
}

TEST_CASE("quantization's errors name the layer or the file and say what to do", "[lesson11][qmodel][cpu]") {
    Rng rng(10);
    auto model = lenet(rng);
    {
        Calibrator cal(*model, QuantConfig{});
        CHECK_THROWS_WITH(convert(*model, cal), Contains("seen no batch"));
        CHECK_THROWS_WITH(cal.observer("conv9"), Contains("no observer for layer 'conv9'"));
    }
    Sequential odd;
    odd.add("conv", std::make_unique<Conv2d>(1, 2, 3, rng));
    odd.add("avg", std::make_unique<AvgPool2d>(2));
    {
        Calibrator cal(odd, QuantConfig{});
        cal.run(Tensor::normal({1, 1, 8, 8}, 0, 1, rng));
        CHECK_THROWS_WITH(convert(odd, cal), Contains("avg: no int8 version of this layer"));
    }
    Sequential grouped;
    grouped.add("conv", std::make_unique<Conv2d>(4, 4, 3, rng, ConvOptions{1, 1, 1, 2}));
    {
        Calibrator cal(grouped, QuantConfig{});
        cal.run(Tensor::normal({1, 4, 8, 8}, 0, 1, rng));
        CHECK_THROWS_WITH(convert(grouped, cal), Contains("conv: an int8 convolution with groups 2 is not written"));
    }
    auto residual_net = shortcut_net(rng);
    {
        Calibrator cal(*residual_net, QuantConfig{});
        cal.run(Tensor::normal({1, 3, 8, 8}, 0, 1, rng));
        const QuantizedNet plan = convert(*residual_net, cal);
        CHECK_THROWS_WITH(QuantAwareTraining(*residual_net, plan), Contains("block.residual is a Residual"));
    }
    const std::string path = temp_path("not-int8.safetensors");
    StateDict f32_state;
    save_model(f32_state, *model);
    write_safetensors(path, f32_state);
    CHECK_THROWS_WITH(QuantizedNet::load(path), Contains("not an int8 network") && Contains("load_model"));
    std::remove(path.c_str());
    CHECK_THROWS_WITH(parse_observer("median"), Contains("minmax, moving or histogram"));
    QuantizedNet empty;
    CHECK_THROWS_WITH(empty.forward(Tensor::zeros({1, 1, 28, 28})), Contains("no steps"));
}

// The same int8 network on the GPU (the emulator here): integer kernels, so the same bits.
TEST_CASE("QuantizedNet on cuda gives the CPU's logits bit for bit", "[lesson11][qmodel][cuda]") {
    Rng rng(12);
    auto model = cifar_net(rng, {8, 16, 16, 8});
    randomize_batchnorms(*model, rng, "block2a.bn");
    fold_batchnorm(*model);
    auto lenet_model = lenet(rng);
    auto mobilenet = mobilenet_v2(rng, 10, 0.25f);  // depthwise convs and residual adds
    randomize_batchnorms(*mobilenet, rng);
    fold_batchnorm(*mobilenet);
    for (Module* m : {static_cast<Module*>(model.get()), static_cast<Module*>(lenet_model.get()),
                      static_cast<Module*>(mobilenet.get())}) {
        const bool is_lenet = m == lenet_model.get();
        INFO(m->name());
        const Tensor x = is_lenet ? Tensor::normal({3, 1, 28, 28}, 0, 1, rng) : Tensor::normal({2, 3, 32, 32}, 0, 1, rng);
        Calibrator cal(*m, QuantConfig{});
        cal.run(x);
        QuantizedNet q = convert(*m, cal);
        const Tensor want = q.forward(x);
        q.to(Device::CUDA);
        require_identical(q.forward(x.to(Device::CUDA)), want);
        CHECK_THROWS_WITH(q.forward(x), Contains("move one of them with to()"));
    }
}

// ---- quantization-aware training -------------------------------------------------------------------------
// FakeQuantize learns [−1, 3] from its first training batch (u8: scale 4/255, zero point 64),
// rounds to that grid, and passes the gradient only where the value fell inside the range.
TEST_CASE("FakeQuantize: the grid of its observed range, and the straight-through gradient",
          "[lesson11][qat][cpu]") {
    FakeQuantize fq;
    const Tensor x = test::tensor_of({1, 4}, {-1.0f, 0.5f, 3.0f, 1.0f});
    const Tensor y = fq.call(x);
    const float s = 4.0f / 255;
    // 0.5 → round(31.875) = 32 steps above the zero point; 1.0 → round(63.75) = 64
    require_close(y, test::tensor_of({1, 4}, {-64 * s, 32 * s, 191 * s, 64 * s}), 1e-6);
    CHECK(fq.qparams().zero_point == 64);
    fq.call_backward(Tensor::ones({1, 4}));  // the training forward's cache, released
    fq.eval();
    const Tensor x2 = test::tensor_of({1, 3}, {-2.0f, 2.0f, 5.0f});  // eval: the range stays [−1, 3]
    const Tensor y2 = fq.call(x2);
    CHECK(y2.data<float>()[0] == Approx(-64 * s));  // clipped to the range's ends
    CHECK(y2.data<float>()[2] == Approx(191 * s));
    fq.train();
    fq.call(x);
    const Tensor dx = fq.call_backward(test::tensor_of({1, 4}, {1, 2, 3, 4}));
    require_identical(dx, test::tensor_of({1, 4}, {1, 2, 3, 4}));  // all four inside [−1, 3]
    fq.call(test::tensor_of({1, 2}, {-50.0f, 0.0f}));  // widens the range by 1% of the way: −1.49
    const Tensor dx2 = fq.call_backward(test::tensor_of({1, 2}, {7, 8}));
    require_identical(dx2, test::tensor_of({1, 2}, {0, 8}));  // −50 was clipped: no gradient
}

TEST_CASE("cuda fake quantization, forward and straight-through backward, matches the CPU", "[lesson11][cuda][quant][qat]") {
    Rng rng(5);
    const int64_t outer = 4, C = 3, inner = 29, n = outer * C * inner;
    std::vector<float> x = random_floats(n, -2.0f, 2.0f, rng);
    const std::vector<float> dy = random_floats(n, -1.0f, 1.0f, rng);
    const std::vector<float> scale = {0.01f, 0.004f, 0.02f};
    const std::vector<int32_t> zp = {128, 0, 77};
    x[0] = 1.3f;  // channel 0: rint(130) + 128 = 258 > 255, outside: dx = 0
    x[1] = 0.0f;  // channel 0: 128, inside: dx = dy
    DeviceArray<float> x_d(x), dy_d(dy), scale_d(scale);
    DeviceArray<int32_t> zp_d(zp);
    std::vector<float> y(static_cast<size_t>(n)), dx(static_cast<size_t>(n));
    cpu::fake_quantize_forward(x.data(), y.data(), outer, C, inner, scale.data(), zp.data(), 0, 255);
    cpu::fake_quantize_backward(x.data(), dy.data(), dx.data(), outer, C, inner, scale.data(), zp.data(), 0, 255);
    under_schedules([&] {
        DeviceArray<float> y_d(n), dx_d(n);
        cuda::fake_quantize_forward(x_d.get(), y_d.get(), outer, C, inner, scale_d.get(), zp_d.get(), 0, 255);
        cuda::fake_quantize_backward(x_d.get(), dy_d.get(), dx_d.get(), outer, C, inner, scale_d.get(), zp_d.get(),
                                     0, 255);
        require_same_bits(y_d.host(), y);
        require_same_bits(dx_d.host(), dx);
    });
    REQUIRE(dx[0] == 0.0f);  // the clamp passes no gradient ...
    REQUIRE(dx[1] == dy[1]);  // ... the rounding passes it through
}

// Pruning and quantization-aware training on one weight, each a transform of its own (nn/module.h):
// the layer computes with fake_quantize(weight_orig ⊙ mask) — the pruned entries stay 0 (the
// symmetric grid has 0 on it), the others on the i8 grid of the masked weight's channel scales —
// and after finish() with weight_orig ⊙ mask again.
TEST_CASE("a pruned weight trains fake-quantized: the transforms compose", "[lesson11][lesson10][qat][prune][cpu]") {
    Rng rng(17);
    auto model = lenet(rng);
    const Tensor x = Tensor::normal({4, 1, 28, 28}, 0, 1, rng);
    Calibrator cal(*model, QuantConfig{});
    cal.run(x);
    const QuantizedNet plan = convert(*model, cal);
    Conv2d& conv1 = static_cast<Conv2d&>(model->module_at("conv1"));
    prune::l1_unstructured(conv1, "weight", 0.5);
    Parameter& w = conv1.weight;
    const Tensor masked = w.used().to(Device::CPU).clone();  // value ⊙ mask
    const int64_t C = w.value.size(0), K = w.value.numel() / C;
    {
        QuantAwareTraining qat(*model, plan);
        REQUIRE(w.transforms.size() == 2);
        CHECK(w.transforms[0].kind == "prune");
        CHECK(w.transforms[1].kind == "fake_quant");
        model->train();
        model->call(x);  // the pre-hook remakes both, in order
        const Tensor used = w.used().to(Device::CPU), mask = w.mask.to(Device::CPU);
        int64_t zeros = 0;
        for (int64_t c = 0; c < C; c++) {
            float amax = 0;  // the channel's scale from the masked weight, not from weight_orig
            for (int64_t k = 0; k < K; k++) amax = std::max(amax, std::fabs(masked.data<float>()[c * K + k]));
            const float scale = amax / 127.5f;
            for (int64_t k = 0; k < K; k++) {
                const int64_t i = c * K + k;
                const float steps = used.data<float>()[i] / scale;
                CHECK(std::fabs(steps - std::nearbyint(steps)) < 1e-3);
                CHECK(std::fabs(used.data<float>()[i] - masked.data<float>()[i]) <= 0.5f * scale * 1.0001f);
                if (mask.data<float>()[i] == 0.0f) {
                    CHECK(used.data<float>()[i] == 0.0f);
                    zeros++;
                }
            }
        }
        CHECK(zeros == w.value.numel() / 2);
    }
    REQUIRE(w.transforms.size() == 1);  // pruning's stays
    model->call(x);
    require_identical(w.used().to(Device::CPU), masked);
}

// QuantAwareTraining wraps the range points and hooks the weights; a training step runs; finish()
// gives back the same tree with the trained weights.
TEST_CASE("QuantAwareTraining: in, a step of training, and out again", "[lesson11][qat][cpu]") {
    Rng rng(13);
    auto model = lenet(rng);
    const Tensor x = Tensor::normal({8, 1, 28, 28}, 0, 1, rng);
    Tensor labels = Tensor::empty({8}, DType::I32);
    for (int i = 0; i < 8; i++) labels.data<int32_t>()[i] = i % 10;
    Calibrator cal(*model, QuantConfig{});
    cal.run(x);
    const QuantizedNet plan = convert(*model, cal);
    std::vector<std::string> names_before;
    for (auto& [name, p] : model->named_parameters()) names_before.push_back(name);
    const Tensor w_before = static_cast<Conv2d&>(model->module_at("conv1")).weight.value.to(Device::CPU);
    {
        QuantAwareTraining qat(*model, plan);
        CHECK(dynamic_cast<Sequential*>(&model->module_at("conv1")) != nullptr);  // the input's fake quant
        CHECK(dynamic_cast<FakeQuantize*>(&model->module_at("fc2.fake_quant")) != nullptr);
        model->train();
        model->input_needs_grad = false;
        model->zero_grad();
        BumpAllocator arena("step arena", Device::CPU);  // as train_step runs a step: what lives
        {                                                // on must not come from the arena
            AllocatorScope scope(arena);
            CrossEntropyLoss loss;
            const float l = loss.forward(model->call(x), labels);
            CHECK(std::isfinite(l));
            model->call_backward(loss.backward());
        }
        arena.reset();
        Conv2d* conv1 = nullptr;
        for (auto& [name, m] : model->named_modules())
            if (auto* c = dynamic_cast<Conv2d*>(m); c && !conv1) conv1 = c;
        REQUIRE(conv1 != nullptr);
        // The layer computed with its weight on the i8 grid: each value a multiple of its channel's scale.
        const Tensor used = conv1->weight.used().to(Device::CPU), w = conv1->weight.value.to(Device::CPU);
        CHECK(conv1->weight.has_transform("fake_quant"));
        float amax = 0;
        for (int64_t i = 0; i < 25; i++) amax = std::max(amax, std::fabs(w.data<float>()[i]));
        const float scale = amax / 127.5f;
        for (int64_t i = 0; i < 25; i++) {
            const float steps = used.data<float>()[i] / scale;
            CHECK(std::fabs(steps - std::nearbyint(steps)) < 1e-3);
        }
        double grad = 0;
        for (int64_t i = 0; i < conv1->weight.grad.numel(); i++) grad += std::fabs(conv1->weight.grad.to(Device::CPU).data<float>()[i]);
        CHECK(grad > 0);
        conv1->weight.value.data<float>()[0] += 1.0f;  // "training" changed it
        // The int8 network with the ranges the fake quantizers learned (one training batch).
        CHECK_THROWS_WITH(qat.range_of(), Contains("call finish() first"));
        qat.finish();
        const QuantizedNet tuned = convert(*model, qat.range_of());
        CHECK(tuned.summary().size() > 0);
        CHECK(tuned.steps.size() == plan.steps.size());
    }
    std::vector<std::string> names_after;
    for (auto& [name, p] : model->named_parameters()) names_after.push_back(name);
    CHECK(names_after == names_before);
    Conv2d& conv1 = static_cast<Conv2d&>(model->module_at("conv1"));
    CHECK(conv1.weight.transforms.empty());
    CHECK(conv1.weight.value.to(Device::CPU).data<float>()[0] == w_before.data<float>()[0] + 1.0f);
}
