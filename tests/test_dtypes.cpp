// test_dtypes.cpp — the f16 and bf16 kernels (GEMM, elementwise, bias rows, reductions, softmax
// cross-entropy, dtype conversion) on the CPU and on CUDA (the emulator, under both schedules),
// each against the f32 kernel run on the same values.
//
// How each comparison is set up: the inputs are drawn in f32 and rounded to T (f16 or bf16);
// the rounded values are exact in f32, so "want" is the f32 op on exactly the values the T op
// saw. The T op computes in f32 too, then rounds its result to T once. So
//
//     |got − want| ≤ u_T·|want| + tiny_T                     (the one rounding of the output)
//                  + 2(R + 2)·eps_f32·S                       (the f32 sums, taken in another order)
//
// u_T = eps_T / 2 is T's unit roundoff (f16: 2^-11, bf16: 2^-8), tiny_T half T's smallest
// subnormal (the rounding error below the normal range: 2^-25 for f16), R the number of terms
// an output sums (K for GEMM, N for sum_rows, 0 for the elementwise ops) and S the sum of their
// absolute values (for GEMM: |alpha|·Σ_k |a_ik|·|b_kj| + |beta|·|c_ij|, computed by a second
// f32 GEMM on the absolute values). A sum of R terms in f32 is within R·eps_f32·S of the exact
// one whatever the order (plus 2 roundings for alpha and beta), and two such sums — the f32
// reference and the T kernel, blocked or tiled differently — within twice that.
//
//   make test T='[dtype]'
#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <sstream>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "fixtures.h"
#include "ops/ops.h"

using namespace kiln;
using test::require_identical;
using test::under_schedules;

namespace {

using Format = test::LowFormat;  // what the tolerance needs from a 16-bit format
const Format kF16 = test::low_format(DType::F16);
const Format kBF16 = test::low_format(DType::BF16);
constexpr double kEps32 = std::numeric_limits<float>::epsilon();

Tensor random(const Shape& shape, Rng& rng, float range = 1.0f) { return Tensor::uniform(shape, -range, range, rng); }

Tensor abs_of(const Tensor& x) {
    Tensor a = x.to(Device::CPU).to(DType::F32).clone();
    for (int64_t i = 0; i < a.numel(); i++) a.data<float>()[i] = std::fabs(a.data<float>()[i]);
    return a;
}

// got (a T tensor, any device) against want (f32, CPU): |got − want| ≤ u·|want| + tiny + sum_err[i],
// sum_err = 2(R + 2)·eps_f32·S elementwise (an undefined S: no sums).
void require_within(const Tensor& got_t, const Tensor& want, const Format& f, int64_t R, const Tensor& S) {
    REQUIRE(got_t.dtype() == f.dtype);
    const Tensor got = got_t.to(Device::CPU).to(DType::F32);
    REQUIRE(got.shape() == want.shape());
    int64_t bad = 0, first = -1;
    double first_tol = 0;
    for (int64_t i = 0; i < want.numel(); i++) {
        const double g = got.data<float>()[i], w = want.data<float>()[i];
        const double sum_err = S.defined() ? 2.0 * double(R + 2) * kEps32 * S.data<float>()[i] : 0.0;
        const double tol = f.u * std::fabs(w) + f.tiny + sum_err;
        if (!(std::fabs(g - w) <= tol) && bad++ == 0) {
            first = i;
            first_tol = tol;
        }
    }
    std::ostringstream msg;
    if (bad)
        msg << bad << " of " << want.numel() << " values out of tolerance; the first at " << first << ": got "
            << got.data<float>()[first] << ", want " << want.data<float>()[first] << ", tolerance " << first_tol;
    INFO(msg.str());
    REQUIRE(bad == 0);
}

// ---- GEMM ------------------------------------------------------------------------------------------
// c = alpha·op(a)·op(b) + beta·c in T on `device`, against the f32 GEMM (CPU) of the same values.
void check_gemm(const Format& f, Device device, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                float beta, Rng& rng) {
    INFO(dtype_name(f.dtype) << " on " << device_name(device) << ": M = " << M << ", N = " << N << ", K = " << K
                             << ", trans_a = " << ta << ", trans_b = " << tb << ", beta = " << beta);
    const Tensor a = random(ta ? Shape{K, M} : Shape{M, K}, rng).to(f.dtype);
    const Tensor b = random(tb ? Shape{N, K} : Shape{K, N}, rng).to(f.dtype);
    const Tensor c = random({M, N}, rng).to(f.dtype);
    Tensor got = c.clone().to(device);  // c itself stays for the reference
    matmul_into(a.to(device), ta, b.to(device), tb, got, alpha, beta);

    const Tensor a32 = a.to(DType::F32), b32 = b.to(DType::F32);
    Tensor want = c.to(DType::F32);
    matmul_into(a32, ta, b32, tb, want, alpha, beta);
    Tensor S = abs_of(c);  // |alpha|·|op(a)|·|op(b)| + |beta|·|c|
    matmul_into(abs_of(a32), ta, abs_of(b32), tb, S, std::fabs(alpha), std::fabs(beta));
    REQUIRE(got.device() == device);
    require_within(got, want, f, K, S);
}

// All four transposes, beta 0 and 0.5, sizes that are multiples of no tile: 7×13 with K = 29,
// 67×45 with K = 300 (two of the CPU's KC-blocks: the partial sums stay in f32 between them).
void check_gemm_shapes(Device device, std::initializer_list<std::array<int64_t, 3>> shapes, Rng& rng) {
    for (const Format& f : {kF16, kBF16})
        for (auto [M, N, K] : shapes)
            for (bool ta : {false, true})
                for (bool tb : {false, true})
                    for (float beta : {0.0f, 0.5f}) check_gemm(f, device, ta, tb, M, N, K, 1.25f, beta, rng);
}

}  // namespace

TEST_CASE("f16 and bf16 GEMM on the CPU: f32 sums, one rounding", "[dtype][cpu][gemm]") {
    Rng rng(101);
    check_gemm_shapes(Device::CPU, {{1, 1, 1}, {7, 13, 29}, {67, 45, 300}, {130, 70, 64}}, rng);
}

TEST_CASE("f16 and bf16 GEMM on CUDA: f32 sums, one rounding", "[dtype][cuda][gemm]") {
    Rng rng(103);
    under_schedules([&] { check_gemm_shapes(Device::CUDA, {{1, 1, 1}, {17, 33, 65}, {65, 63, 17}, {70, 40, 300}}, rng); });
}

TEST_CASE("f16 and bf16 GEMM on CUDA with the 128×128 tiles", "[dtype][cuda][gemm]") {
    Rng rng(107);
    // ≥ 256 tiles of 128×128 picks the big configuration; 2049 and 2050 leave partial tiles.
    under_schedules([&] {
        check_gemm(kF16, Device::CUDA, false, true, 2049, 2050, 5, 1.0f, 0.0f, rng);
        check_gemm(kBF16, Device::CUDA, true, false, 2049, 2050, 5, 1.0f, 0.5f, rng);
    });
}

TEST_CASE("f16 GEMM sums in f32: 4096 ones do not stop at 2048", "[dtype][cpu][cuda][gemm]") {
    // In f16, 2048 + 1 rounds back to 2048: a kernel that summed in f16 would return 2048.
    const int64_t K = 4096;
    const Tensor a = Tensor::ones({1, K}, DType::F16), b = Tensor::ones({K, 1}, DType::F16);
    REQUIRE(matmul(a, b).get({0, 0}) == 4096.0);
    under_schedules([&] { REQUIRE(matmul(a.to(Device::CUDA), b.to(Device::CUDA)).to(Device::CPU).get({0, 0}) == 4096.0); });
}

// ---- elementwise and rows ----------------------------------------------------------------------------
namespace {

// One op on tensors x[N,C], y[N,C], b[C] of one dtype and device; returns its result.
struct ElementwiseOp {
    const char* name;
    int64_t R;  // terms summed per output (sum_rows: N)
    std::function<Tensor(const Tensor& x, const Tensor& y, const Tensor& b)> run;
};

const std::vector<ElementwiseOp>& elementwise_ops() {
    static const std::vector<ElementwiseOp> ops = {
        {"fill_", 0, [](const Tensor& x, const Tensor&, const Tensor&) { Tensor t = x.clone(); fill_(t, 0.1f); return t; }},
        {"add", 0, [](const Tensor& x, const Tensor& y, const Tensor&) { return add(x, y); }},
        {"axpy_", 0, [](const Tensor& x, const Tensor& y, const Tensor&) { Tensor t = y.clone(); axpy_(t, -0.75f, x); return t; }},
        {"scale_", 0, [](const Tensor& x, const Tensor&, const Tensor&) { Tensor t = x.clone(); scale_(t, 1.7f); return t; }},
        {"relu", 0, [](const Tensor& x, const Tensor&, const Tensor&) { return relu(x); }},
        {"relu_backward", 0, [](const Tensor& x, const Tensor& y, const Tensor&) { return relu_backward(relu(x), y); }},
        {"add_bias_", 0, [](const Tensor& x, const Tensor&, const Tensor& b) { Tensor t = x.clone(); add_bias_(t, b); return t; }},
        {"sum_rows_into", 37, [](const Tensor& x, const Tensor&, const Tensor& b) { Tensor t = b.clone(); sum_rows_into(x, t, 0.5f); return t; }},
    };
    return ops;
}

void check_elementwise(Device device, Rng& rng) {
    const int64_t N = 37, C = 29;  // sum_rows_into's R above is N
    const Tensor x32 = random({N, C}, rng), y32 = random({N, C}, rng), b32 = random({C}, rng);
    for (const Format& f : {kF16, kBF16}) {
        const Tensor x = x32.to(f.dtype), y = y32.to(f.dtype), b = b32.to(f.dtype);
        for (const ElementwiseOp& op : elementwise_ops()) {
            INFO(op.name << " in " << dtype_name(f.dtype) << " on " << device_name(device));
            const Tensor got = op.run(x.to(device), y.to(device), b.to(device));
            REQUIRE(got.device() == device);
            const Tensor want = op.run(x.to(DType::F32), y.to(DType::F32), b.to(DType::F32));
            // S for a column sum of values in [-1, 1] plus 0.5·|db|: at most N + 1.
            const Tensor S = op.R ? Tensor::full(want.shape(), double(op.R + 1)) : Tensor();
            require_within(got, want, f, op.R, S);
        }
    }
}

}  // namespace

TEST_CASE("f16 and bf16 elementwise and row ops on the CPU match f32, rounded once", "[dtype][cpu][elementwise]") {
    Rng rng(109);
    check_elementwise(Device::CPU, rng);
}

TEST_CASE("f16 and bf16 elementwise and row ops on CUDA match f32, rounded once", "[dtype][cuda][elementwise]") {
    Rng rng(113);
    under_schedules([&] { check_elementwise(Device::CUDA, rng); });
}

TEST_CASE("ops refuse mixed and integer dtypes, naming the op and the tensor", "[dtype][cpu]") {
    const Tensor a = Tensor::zeros({2, 3}), h = Tensor::zeros({3, 2}, DType::F16);
    REQUIRE_THROWS_WITH(matmul(a, h), Catch::Contains("matmul: 'b' is f16[3, 2] on cpu but 'a' is f32[2, 3]"));
    REQUIRE(matmul(a.to(DType::F16), h).dtype() == DType::F16);  // one dtype throughout: its dtype out
    Tensor u = Tensor::zeros({2}, DType::U8);
    REQUIRE_THROWS_WITH(scale_(u, 2), Catch::Contains("scale_: 'x' is u8[2] on cpu; f32, f16 and bf16"));
    REQUIRE_THROWS_WITH(sum(Tensor::zeros({2}, DType::I32)), Catch::Contains("sum: 'x' is i32[2] on cpu"));
}

// ---- reductions ------------------------------------------------------------------------------------
namespace {

// sum and sum_squares read each T as its exact f32 value and add in double, in an order fixed by n
// alone; max and argmax_rows compare exact values. So a T tensor gives exactly what the f32 tensor
// of its values gives on the same device: the tolerance is 0 (no output rounding, the same sums).
void check_reductions(Device device, Rng& rng) {
    const Tensor x32 = random({300, 77}, rng);  // 23,100 elements: more than one CPU chunk
    for (const Format& f : {kF16, kBF16}) {
        INFO(dtype_name(f.dtype) << " on " << device_name(device));
        const Tensor x = x32.to(f.dtype).to(device), same = x32.to(f.dtype).to(DType::F32).to(device);
        REQUIRE(sum(x) == sum(same));
        REQUIRE(sum_squares(x) == sum_squares(same));
        REQUIRE(max(x) == max(same));
        require_identical(argmax_rows(x), argmax_rows(same));
    }
}

}  // namespace

TEST_CASE("sum, sum_squares, max and argmax_rows of f16 and bf16 tensors", "[dtype][cpu][reduce]") {
    Rng rng(137);
    check_reductions(Device::CPU, rng);
}

TEST_CASE("sum, sum_squares, max and argmax_rows of f16 and bf16 tensors on CUDA", "[dtype][cuda][reduce]") {
    Rng rng(139);
    under_schedules([&] { check_reductions(Device::CUDA, rng); });
}

// ---- conversion --------------------------------------------------------------------------------------
TEST_CASE("to(dtype) on CUDA converts on the device, bit for bit as the CPU does", "[dtype][cuda]") {
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    // Specials, ties (1 + 2^-11 for f16, 1 + 2^-8 for bf16), f16 subnormals and overflow, integers' edges.
    const std::vector<float> values = {0.0f, -0.0f, 1.0f, -2.5f, 0.1f, 1.00048828125f, 1.00390625f, 65519.0f,
                                       65520.0f, 1e-7f, 3e-8f, 127.5f, -128.5f, 300.0f, 1e10f, inf, -inf, nan};
    Tensor v = Tensor::empty({int64_t(values.size())});
    std::copy(values.begin(), values.end(), v.data<float>());
    const DType all[] = {DType::F32, DType::F16, DType::BF16, DType::I8, DType::I32, DType::U8};
    under_schedules([&] {
        for (DType from : all)
            for (DType to : all) {
                INFO(dtype_name(from) << " -> " << dtype_name(to));
                const Tensor src = v.to(from);
                const Tensor got = src.to(Device::CUDA).to(to);
                REQUIRE(got.device() == Device::CUDA);
                require_identical(got, src.to(to));
            }
    });
}

TEST_CASE("f16 -> bf16 rounds to nearest, through the exact f32 value", "[dtype][cpu]") {
    // f16 1 + 2^-9 + 2^-10 = 1.0029296875 lies between the bf16 neighbours 1 and 1 + 2^-7, below
    // the halfway point 1 + 2^-8: it rounds to 1.
    const Tensor h = Tensor::full({1}, 1.0029296875, DType::F16);
    REQUIRE(h.get({0}) == 1.0029296875);
    REQUIRE(h.to(DType::BF16).get({0}) == 1.0);
    REQUIRE(Tensor::full({1}, 1.0068359375, DType::F16).to(DType::BF16).get({0}) == 1.0078125);  // above: up
}

// ---- softmax cross-entropy ------------------------------------------------------------------------------
namespace {

void check_softmax_cross_entropy(Device device, Rng& rng) {
    // C = 300 > 128 threads: each CUDA thread takes several classes of its row.
    const int64_t shapes[][2] = {{37, 13}, {3, 300}};
    for (const Format& f : {kF16, kBF16})
        for (auto [N, C] : shapes) {
            INFO(dtype_name(f.dtype) << " on " << device_name(device) << ": N = " << N << ", C = " << C);
            const Tensor z = random({N, C}, rng, 8.0f).to(f.dtype);
            Tensor y = Tensor::empty({N}, DType::I32);
            for (int64_t n = 0; n < N; n++) y.data<int32_t>()[n] = int32_t(rng.next_below(uint64_t(C)));
            Tensor dz, dz32;
            const float loss = softmax_cross_entropy(z.to(device), y.to(device), &dz);
            const float want = softmax_cross_entropy(z.to(DType::F32), y, &dz32);
            // The loss is computed in f32 (double on the CPU) from the same values: the T path adds
            // no rounding, only the CPU/GPU difference of a C-term log-sum-exp and an N-term mean.
            REQUIRE(std::fabs(loss - want) <= 4.0 * double(C + N) * kEps32 * std::fabs(want));
            // dz has the logits' dtype; each entry, |dz| ≤ 1/N, is rounded once (and the GPU's
            // expf differs from the CPU's double exp by a few ulps of f32).
            REQUIRE(dz.dtype() == f.dtype);
            REQUIRE(dz.device() == device);
            require_within(dz, dz32, f, C, Tensor::full(dz32.shape(), 1.0 / double(N)));
        }
}

}  // namespace

TEST_CASE("softmax cross-entropy of f16 and bf16 logits: f32 math, dlogits in the logits' dtype",
          "[dtype][cpu][loss]") {
    Rng rng(127);
    check_softmax_cross_entropy(Device::CPU, rng);
}

TEST_CASE("softmax cross-entropy of f16 and bf16 logits on CUDA", "[dtype][cuda][loss]") {
    Rng rng(131);
    under_schedules([&] { check_softmax_cross_entropy(Device::CUDA, rng); });
}

TEST_CASE("float_format reads each type's range and epsilon off its bits", "[dtype][cpu][lesson09]") {
    // The IEEE 754 / bfloat16 constants, written independently of the conversions.
    const FloatFormat h = float_format(DType::F16);
    CHECK((h.exponent_bits == 5 && h.mantissa_bits == 10));
    CHECK(h.max == 65504.0);
    CHECK(h.min_normal == std::ldexp(1.0, -14));
    CHECK(h.min_subnormal == std::ldexp(1.0, -24));
    CHECK(h.epsilon == std::ldexp(1.0, -10));
    const FloatFormat b = float_format(DType::BF16);
    CHECK((b.exponent_bits == 8 && b.mantissa_bits == 7));
    CHECK(b.max == (2.0 - std::ldexp(1.0, -7)) * std::ldexp(1.0, 127));
    CHECK(b.min_normal == std::ldexp(1.0, -126));
    CHECK(b.min_subnormal == std::ldexp(1.0, -133));
    CHECK(b.epsilon == std::ldexp(1.0, -7));
    const FloatFormat f = float_format(DType::F32);
    CHECK(f.max == double(std::numeric_limits<float>::max()));
    CHECK(f.min_normal == double(std::numeric_limits<float>::min()));
    CHECK(f.min_subnormal == double(std::numeric_limits<float>::denorm_min()));
    CHECK(f.epsilon == double(std::numeric_limits<float>::epsilon()));
    REQUIRE_THROWS_WITH(float_format(DType::I8), Catch::Contains("not a floating-point type"));
}
