// test_lowp_ops.cpp — the CNN ops (ops/cnn.h) in f16 and bf16 (chapter 09): every op, forward
// and backward, on the CPU and on the CUDA kernels (the emulator without a GPU), against the f32
// op on the same values; the CPU against CUDA in f16; and the dtype errors of the contract (every
// tensor in x's type, the norms' parameters and statistics in f32).
//
// ---- The inputs -----------------------------------------------------------------------------
// Random f32 values rounded to T first, so that the f16 (or bf16) op and the f32 op start from
// exactly the same numbers: every difference comes from the arithmetic, none from the inputs.
//
// ---- The bound, derived ----------------------------------------------------------------------
// Let y be an output element and S = Σ|terms| the sum of the absolute values of what it adds
// (for a convolution Σ|w·x| + |b|: the same op run in f32 on |x|, |w|, |b|; for an op that is
// not a sum — GELU, a norm's normalized value — S = |y|). Each side's error against exact
// arithmetic is:
//   f32 accumulation of n terms          ≤ n·2^-24 · S   (each of the n additions rounds to f32)
//   rounding the result to T, r times    ≤ r·u · S       (u = 2^-11 for f16, 2^-8 for bf16; |y| ≤ S)
// The T op pays both, the f32 reference the first only, in another order perhaps, so
//   |y_T − y_f32| ≤ (r·u + 2·n·2^-24) · S + tiny
// with tiny = half the smallest subnormal of T (2^-25 for f16; 2^-134 for bf16), the absolute
// error of rounding a result that falls below T's normal range. r is 1 for every result except:
//   conv dx                  2   the GEMM's dcol is stored in T, then col2im adds (cpu/conv.cpp)
//   conv dw, CPU pointwise   N   added image by image into dw of T (cpu/conv.cpp)
// and 0 for the norms' f32 statistics and parameter gradients (never rounded to T).
// CPU against CUDA, both in f16: each is within its bound of the exact value, so the two are
// within (r_cpu + r_cuda)·u·S + 2·n·2^-24·S of each other, plus, for the ops whose f32 results
// already differ between the devices beyond summation order (the device's erff and expf in GELU,
// double sums in another order in the norms), the tolerance test_cuda_layers.cpp allows them.
//
//   make test T='[lowp]'
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "fixtures.h"
#include "ops/cnn.h"
#include "ops/cpu/gemm.h"

using namespace kiln;
using Catch::Matchers::Contains;

namespace {

constexpr double kF32Unit = 0x1p-24;  // f32's unit roundoff

using LowType = test::LowFormat;  // unit roundoff u, half the smallest subnormal
const LowType kF16 = test::low_format(DType::F16);
const LowType kBF16 = test::low_format(DType::BF16);

// Uniform values in [lo, hi), rounded to T and held as f32 on the CPU.
Tensor values_in(const LowType& t, const Shape& shape, float lo, float hi, Rng& rng) {
    return Tensor::uniform(shape, lo, hi, rng).to(t.dtype).to(DType::F32);
}

Tensor host_f32(const Tensor& t) { return t.to(Device::CPU).to(DType::F32); }

Tensor abs_of(const Tensor& t) {
    Tensor a = host_f32(t).clone();
    float* v = a.data<float>();
    for (int64_t i = 0; i < a.numel(); i++) v[i] = std::fabs(v[i]);
    return a;
}

// One result of an op: how to bound it (see the header).
struct Bound {
    Tensor S;        // Σ|terms| per element, f32 on the CPU
    double n;        // terms summed in f32
    double r_cpu;    // roundings to T on the CPU
    double r_cuda;   // and on CUDA
    double gap = 0;  // CPU against CUDA: how far their f32 results may differ besides (absolute)
};

// An op to check: run(device, dtype) converts the inputs (f32 values representable in T) to
// dtype on device, runs the op and returns its results as f32 tensors on the CPU.
struct OpCheck {
    std::function<std::vector<Tensor>(Device, DType)> run;
    std::vector<Bound> bounds;
};

// Every element: |got − want| ≤ rel·S + tiny.
void require_within(const Tensor& got_t, const Tensor& want_t, const Tensor& S_t, double rel, double tiny) {
    const Tensor got = host_f32(got_t), want = host_f32(want_t), S = host_f32(S_t);
    REQUIRE(got.shape() == want.shape());
    REQUIRE(S.shape() == want.shape());
    const float *g = got.data<float>(), *w = want.data<float>(), *s = S.data<float>();
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < got.numel(); i++)
        if (!(std::fabs(double(g[i]) - double(w[i])) <= rel * double(s[i]) + tiny) && bad++ == 0) first = i;
    INFO("mismatches: " << bad << " of " << got.numel());
    if (bad) INFO("first at " << first << ": got " << g[first] << ", f32 " << w[first] << ", bound "
                              << rel * double(s[first]) + tiny);
    REQUIRE(bad == 0);
}

void check_against_f32(const OpCheck& op, Device device, const LowType& t) {
    const std::vector<Tensor> want = op.run(device, DType::F32), got = op.run(device, t.dtype);
    REQUIRE(got.size() == op.bounds.size());
    for (size_t i = 0; i < got.size(); i++) {
        INFO("result " << i << " on " << device_name(device) << " in " << dtype_name(t.dtype));
        const Bound& b = op.bounds[i];
        const double r = device == Device::CUDA ? b.r_cuda : b.r_cpu;
        require_within(got[i], want[i], b.S, r * t.u + 2.0 * b.n * kF32Unit, t.tiny);
    }
}

void check_cpu_against_cuda(const OpCheck& op) {
    const std::vector<Tensor> cpu = op.run(Device::CPU, DType::F16), gpu = op.run(Device::CUDA, DType::F16);
    for (size_t i = 0; i < cpu.size(); i++) {
        INFO("result " << i << ", CUDA against the CPU in f16");
        const Bound& b = op.bounds[i];
        require_within(gpu[i], cpu[i], b.S, (b.r_cpu + b.r_cuda) * kF16.u + 2.0 * b.n * kF32Unit,
                       kF16.tiny + b.gap);
    }
}

// The op built by make(t) for each type against f32 on the device; on CUDA (under each of the
// emulator's schedules) also against the CPU in f16.
void check_op(Device device, const std::function<OpCheck(const LowType&)>& make) {
    for (const LowType& t : {kF16, kBF16}) {
        const OpCheck op = make(t);
        if (device == Device::CPU) check_against_f32(op, device, t);
        else test::under_schedules([&] { check_against_f32(op, device, t); });
    }
    if (device == Device::CUDA) check_cpu_against_cuda(make(kF16));
}

// The largest |value| of a tensor: the scale of a relative tolerance over the whole tensor.
double max_abs(const Tensor& t) {
    const Tensor a = abs_of(t);
    return double(*std::max_element(a.data<float>(), a.data<float>() + a.numel()));
}

// ---- convolution -------------------------------------------------------------------------------
struct ConvCase {
    const char* what;
    int64_t N, C, H, W, O, K, stride, padding, groups;
    bool bias;
};

// Each forward strategy: CPU Im2col, Pointwise, Depthwise; CUDA implicit GEMM (Og < 64) and im2col
// (Og ≥ 64). Backward: the CPU's three paths and CUDA's one.
const ConvCase kConvCases[] = {
    // what                                         N  C  H  W   O  K  s  pad G  bias
    {"3x3 pad 1: CPU im2col, CUDA implicit GEMM", 2, 3, 6, 5, 5, 3, 1, 1, 1, true},
    {"3x3 stride 2, O = 64: im2col on both", 2, 2, 5, 6, 64, 3, 2, 1, 1, true},
    {"1x1: CPU pointwise", 3, 4, 3, 4, 6, 1, 1, 0, 1, false},
    {"depthwise 3x3: CPU direct loops", 2, 4, 5, 5, 4, 3, 1, 1, 4, true},
};

OpCheck conv_check(const ConvCase& k, const LowType& t) {
    Rng rng(5);
    const Tensor x = values_in(t, {k.N, k.C, k.H, k.W}, -1, 1, rng);
    const Tensor w = values_in(t, {k.O, k.C / k.groups, k.K, k.K}, -1, 1, rng);
    const Tensor b = k.bias ? values_in(t, {k.O}, -1, 1, rng) : Tensor();
    Conv2dArgs a;
    a.stride = k.stride, a.padding = k.padding, a.groups = k.groups;
    const Tensor y0 = conv2d(x, w, b, a);
    const Tensor dy = values_in(t, y0.shape(), -1, 1, rng);

    // y, dw, db, dx of the op in dtype on device
    auto run = [=](Device device, DType dt) {
        auto in = [&](const Tensor& v) { return v.defined() ? v.to(dt).to(device) : Tensor(); };
        const Tensor xd = in(x), wd = in(w), dyd = in(dy);
        Tensor dw = Tensor::zeros(w.shape(), dt, device), db = k.bias ? Tensor::zeros({k.O}, dt, device) : Tensor();
        const Tensor y = conv2d(xd, wd, in(b), a);
        const Tensor dx = conv2d_backward(xd, wd, dyd, dw, db, true, a);
        std::vector<Tensor> out{host_f32(y), host_f32(dw), host_f32(dx)};
        if (k.bias) out.push_back(host_f32(db));
        return out;
    };
    // Σ|terms|: the f32 op on absolute values
    Tensor S_dw = Tensor::zeros(w.shape()), S_db = k.bias ? Tensor::zeros({k.O}) : Tensor();
    const Tensor S_y = conv2d(abs_of(x), abs_of(w), k.bias ? abs_of(b) : Tensor(), a);
    const Tensor S_dx = conv2d_backward(abs_of(x), abs_of(w), abs_of(dy), S_dw, S_db, true, a);
    const double PQ = double(y0.size(2) * y0.size(3)), Kc = double(k.C / k.groups * k.K * k.K);
    const bool cpu_pointwise = k.K == 1 && k.groups == 1;
    std::vector<Bound> bounds{
        {S_y, Kc + 1, 1, 1},
        {S_dw, double(k.N) * PQ, cpu_pointwise ? double(k.N) : 1.0, 1},
        {S_dx, double(k.O / k.groups * k.K * k.K), 2, 2},
    };
    if (k.bias) bounds.push_back({S_db, double(k.N) * PQ, 1, 1});
    return {run, bounds};
}

// ---- pooling ---------------------------------------------------------------------------------------
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

// ---- batch and layer norm ------------------------------------------------------------------------
// x, y, dy, dx in T; gamma, beta, the statistics, dgamma and dbeta f32 in both runs. The
// statistics are sums of the same values in f32 or double on both sides (r = 0, n = the M values
// of a channel); y and dx are one f32 expression of them, rounded once (S = |y|, n = 2: the
// reference's last two operations and the T side's); dgamma = Σ dy·x̂ and dbeta = Σ dy over M.
struct NormInputs {
    Tensor x, gamma, beta, dy;
};

NormInputs norm_inputs(const LowType& t, const Shape& xs, int64_t features, uint64_t seed) {
    Rng rng(seed);
    // x off-centre (mean about 1, std about 1.2); gamma and beta stay f32 in every run
    return {values_in(t, xs, -1, 3, rng), Tensor::uniform({features}, 0.5f, 1.5f, rng),
            Tensor::uniform({features}, -0.5f, 0.5f, rng), values_in(t, xs, -1, 1, rng)};
}

// Σ|dy| and Σ|dy·x̂| per feature, for dbeta's and dgamma's bounds: the f32 backward on |dy| with
// x̂ replaced by |x̂| is not an op, so the two sums are taken here, with (x, mean, invstd) laid
// out as `feature_of(i)` and `group_of(i)` say.
struct ParamSums {
    Tensor dbeta, dgamma;
};
ParamSums param_sums(const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& invstd, int64_t features,
                     const std::function<int64_t(int64_t)>& feature_of, const std::function<int64_t(int64_t)>& group_of) {
    ParamSums s{Tensor::zeros({features}), Tensor::zeros({features})};
    const float *xv = x.data<float>(), *g = dy.data<float>(), *m = mean.data<float>(), *is = invstd.data<float>();
    for (int64_t i = 0; i < x.numel(); i++) {
        const int64_t f = feature_of(i), r = group_of(i);
        s.dbeta.data<float>()[f] += std::fabs(g[i]);
        s.dgamma.data<float>()[f] += std::fabs(g[i] * (xv[i] - m[r]) * is[r]);
    }
    return s;
}

OpCheck batchnorm_check(const LowType& t) {
    const int64_t N = 3, C = 4, H = 3, W = 5, S = H * W;
    const NormInputs in = norm_inputs(t, {N, C, H, W}, C, 9);
    auto run = [=](Device device, DType dt) {
        auto f32 = [&](const Tensor& v) { return v.to(device); };
        Tensor rm = Tensor::zeros({C}, DType::F32, device), rv = Tensor::ones({C}, DType::F32, device);
        Tensor mean, invstd;
        const Tensor xd = in.x.to(dt).to(device);
        const Tensor y = batchnorm_train(xd, f32(in.gamma), f32(in.beta), rm, rv, 1e-5f, 0.1f, &mean, &invstd);
        const Tensor ye = batchnorm_eval(xd, f32(in.gamma), f32(in.beta), rm, rv, 1e-5f);
        Tensor dgamma = Tensor::zeros({C}, DType::F32, device), dbeta = Tensor::zeros({C}, DType::F32, device);
        const Tensor dx = batchnorm_backward(in.dy.to(dt).to(device), xd, f32(in.gamma), mean, invstd, dgamma, dbeta);
        return std::vector<Tensor>{host_f32(y),  host_f32(mean),   host_f32(invstd), host_f32(rm),   host_f32(rv),
                                   host_f32(ye), host_f32(dx), host_f32(dgamma), host_f32(dbeta)};
    };
    const std::vector<Tensor> ref = run(Device::CPU, DType::F32);
    const ParamSums ps = param_sums(
        in.x, in.dy, ref[1], ref[2], C, [&](int64_t i) { return i / S % C; }, [&](int64_t i) { return i / S % C; });
    const double M = double(N * S), gap = 1e-5;  // test_cuda_layers.cpp's relative tolerance for batch norm
    auto b = [&](const Tensor& s, double n, double r) { return Bound{s, n, r, r, gap * max_abs(s)}; };
    return {run,
            {b(abs_of(ref[0]), 2, 1), b(abs_of(ref[1]), M, 0), b(abs_of(ref[2]), M, 0), b(abs_of(ref[3]), M, 0),
             b(abs_of(ref[4]), M, 0), b(abs_of(ref[5]), 2, 1), b(abs_of(ref[6]), 2, 1), b(ps.dgamma, M, 0),
             b(ps.dbeta, M, 0)}};
}

OpCheck layernorm_check(const LowType& t) {
    const int64_t R = 6, D = 20;
    const NormInputs in = norm_inputs(t, {2, 3, D}, D, 10);
    auto run = [=](Device device, DType dt) {
        Tensor mean, invstd;
        const Tensor xd = in.x.to(dt).to(device), gamma = in.gamma.to(device);
        const Tensor y = layernorm(xd, gamma, in.beta.to(device), 1e-5f, &mean, &invstd);
        Tensor dgamma = Tensor::zeros({D}, DType::F32, device), dbeta = Tensor::zeros({D}, DType::F32, device);
        const Tensor dx = layernorm_backward(in.dy.to(dt).to(device), xd, gamma, mean, invstd, dgamma, dbeta);
        return std::vector<Tensor>{host_f32(y),  host_f32(mean),   host_f32(invstd),
                                   host_f32(dx), host_f32(dgamma), host_f32(dbeta)};
    };
    const std::vector<Tensor> ref = run(Device::CPU, DType::F32);
    const ParamSums ps = param_sums(
        in.x, in.dy, ref[1], ref[2], D, [&](int64_t i) { return i % D; }, [&](int64_t i) { return i / D; });
    const double gap = 1e-5;  // as for batch norm
    auto b = [&](const Tensor& s, double n, double r) { return Bound{s, n, r, r, gap * max_abs(s)}; };
    // dx = invstd·(g − Σg/D − x̂·Σg·x̂/D): sums of D terms
    return {run,
            {b(abs_of(ref[0]), 2, 1), b(abs_of(ref[1]), double(D), 0), b(abs_of(ref[2]), double(D), 0),
             b(abs_of(ref[3]), double(D) + 2, 1), b(ps.dgamma, double(R), 0), b(ps.dbeta, double(R), 0)}};
}

// ---- GELU and dropout (elementwise: one f32 expression per element, rounded once) ----------------
OpCheck gelu_check(const LowType& t) {
    Rng rng(11);
    const Tensor x = values_in(t, {3, 70}, -4, 4, rng), dy = values_in(t, {3, 70}, -1, 1, rng);
    auto run = [=](Device device, DType dt) {
        const Tensor xd = x.to(dt).to(device);
        return std::vector<Tensor>{host_f32(gelu(xd)), host_f32(gelu_backward(xd, dy.to(dt).to(device)))};
    };
    const std::vector<Tensor> ref = run(Device::CPU, DType::F32);
    const double gap = 2e-6;  // the CPU's erf and exp against the device's (test_cuda_layers.cpp)
    return {run, {{abs_of(ref[0]), 2, 1, 1, gap}, {abs_of(ref[1]), 2, 1, 1, gap}}};
}

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

// ---- each group of ops on one device ---------------------------------------------------------------
void conv_checks(Device device) {
    for (const ConvCase& k : kConvCases) {
        SECTION(k.what) { check_op(device, [&](const LowType& t) { return conv_check(k, t); }); }
    }
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

void norm_checks(Device device) {
    check_op(device, batchnorm_check);
    check_op(device, layernorm_check);
}

void elementwise_checks(Device device) {
    check_op(device, gelu_check);
    check_op(device, dropout_check);
}

}  // namespace

TEST_CASE("f16 and bf16 conv2d on the CPU, every strategy, forward and backward, within the bound of f32",
          "[lowp][lesson09][cpu][conv]") {
    conv_checks(Device::CPU);
}

TEST_CASE("f16 and bf16 conv2d on CUDA, both strategies, forward and backward, within the bound of f32 and the CPU",
          "[lowp][lesson09][cuda][conv]") {
    conv_checks(Device::CUDA);
}

TEST_CASE("f16 and bf16 pooling on the CPU within the bound of f32", "[lowp][lesson09][cpu][pool]") {
    pool_checks(Device::CPU);
}

TEST_CASE("f16 and bf16 pooling on CUDA within the bound of f32 and the CPU", "[lowp][lesson09][cuda][pool]") {
    pool_checks(Device::CUDA);
}

TEST_CASE("f16 and bf16 batch and layer norm on the CPU, statistics in f32, within the bound of f32",
          "[lowp][lesson09][cpu][batchnorm][layernorm]") {
    norm_checks(Device::CPU);
}

TEST_CASE("f16 and bf16 batch and layer norm on CUDA, statistics in f32, within the bound of f32 and the CPU",
          "[lowp][lesson09][cuda][batchnorm][layernorm]") {
    norm_checks(Device::CUDA);
}

TEST_CASE("f16 and bf16 GELU and dropout on the CPU within the bound of f32", "[lowp][lesson09][cpu][gelu][dropout]") {
    elementwise_checks(Device::CPU);
}

TEST_CASE("f16 and bf16 GELU and dropout on CUDA within the bound of f32 and the CPU",
          "[lowp][lesson09][cuda][gelu][dropout]") {
    elementwise_checks(Device::CUDA);
}

TEST_CASE("lowp cnn ops: a mixed pair names the tensor; a norm's f16 parameter is an error",
          "[lowp][lesson09][cpu]") {
    const Tensor x = Tensor::zeros({2, 3, 6, 6}, DType::F16), w = Tensor::zeros({4, 3, 3, 3});
    REQUIRE_THROWS_WITH(conv2d(x, w, Tensor(), {}), Contains("conv2d") && Contains("'w' is f32") &&
                                                        Contains("'x' is f16") && Contains(".to(DType::"));
    Tensor dw = Tensor::zeros({4, 3, 3, 3}, DType::BF16), db;
    REQUIRE_THROWS_WITH(conv2d_backward(x, w.to(DType::F16), Tensor::zeros({2, 4, 4, 4}, DType::F16), dw, db, true, {}),
                        Contains("conv2d_backward") && Contains("'dw' is bf16"));

    Tensor mean = Tensor::zeros({3}), var = Tensor::ones({3}), save_mean, save_invstd;
    REQUIRE_THROWS_WITH(batchnorm_train(x, Tensor::ones({3}, DType::F16), Tensor::zeros({3}), mean, var, 1e-5f, 0.1f,
                                        &save_mean, &save_invstd),
                        Contains("batchnorm_train") && Contains("'gamma' is f16") && Contains("should be f32") &&
                            Contains("(here f16)"));
    REQUIRE_THROWS_WITH(layernorm(x, Tensor::ones({6}), Tensor::zeros({6}, DType::BF16), 1e-5f, &save_mean,
                                  &save_invstd),
                        Contains("layernorm") && Contains("'beta' is bf16") && Contains("should be f32"));
    // f32 parameters with f16 activations are the contract: this one runs
    REQUIRE(batchnorm_eval(x, Tensor::ones({3}), Tensor::zeros({3}), mean, var, 1e-5f).dtype() == DType::F16);
}

TEST_CASE("bf16 conv2d on AMX tiles (emulated), every strategy, forward and backward, within the bound of f32",
          "[lowp][lesson09][cpu][conv][amx]") {
    const test::AmxEmulation emulated;
    REQUIRE(std::string(cpu::gemm_path<bf16>(cpu_level())) == "amx-bf16-emulated");
    for (const ConvCase& k : kConvCases) {
        SECTION(k.what) { check_against_f32(conv_check(k, kBF16), Device::CPU, kBF16); }
    }
}
