// test_ops.cpp — chapter 02's operations, each op's section holding its CPU, CUDA and f16/bf16
// cases: elementwise and bias rows, reductions (sum, max, argmax_rows, column sums), softmax
// cross-entropy; then the dtypes the ops refuse.
//   CPU (chapter 02): against hand-computed values, thread-count determinism, logits of ±1e4,
//     the errors bad arguments get.
//   CUDA (chapter 04; cuda/elementwise.cu, reduce.cu, loss.cu): against the CPU, on the emulator
//     without a GPU under three schedules, on shapes chosen to hit the edges: n = 1, odd sizes,
//     sizes that are not multiples of the block, n large enough for the grid-stride loops.
//   f16 and bf16 (chapter 09), on both devices: against f32 on the same values (drawn in f32,
//     rounded to T), within the bound of a kernel that computes in f32 and rounds its result
//     once (lowp_check.h's require_rounded_once; R the terms an output sums).
//
//   make test T='[elementwise]'   make test T='[reduce]'   make test T='[loss]'   (each op: every
//   backend and type)   make test T='[ops]' (chapter 02's CPU cases)
#include <omp.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <vector>

#include "core/rng.h"
#include "fixtures.h"
#include "lowp_check.h"
#include "ops/all.h"
#include "ops/ops.h"

using namespace kiln;
using test::cuda_copy;
using test::require_near;
using test::under_schedules;

static Tensor from(std::initializer_list<float> v, Shape shape) {
    Tensor t = Tensor::empty(shape);
    std::copy(v.begin(), v.end(), t.data<float>());
    return t;
}

namespace {

using test::lowp::kBF16;
using test::lowp::kF16;
using test::lowp::LowType;
using test::lowp::require_rounded_once;

Tensor random(const Shape& shape, Rng& rng, float range = 1.0f) { return Tensor::uniform(shape, -range, range, rng); }

}  // namespace

// ---- elementwise and bias rows ----------------------------------------------------------------------------
TEST_CASE("elementwise ops", "[ops][elementwise][cpu][lesson02]") {
    Tensor a = from({1, -2, 3, -4}, {4}), b = from({10, 20, 30, 40}, {4});
    Tensor s = add(a, b);
    REQUIRE(s.get({1}) == 18);
    axpy_(s, 0.5f, b);  // s += b/2
    REQUIRE(s.get({3}) == 56);
    scale_(s, 2);
    REQUIRE(s.get({0}) == 32);
    Tensor r = relu(a);
    REQUIRE((r.get({0}) == 1 && r.get({1}) == 0 && r.get({2}) == 3 && r.get({3}) == 0));
    Tensor dr = relu_backward(r, b);
    REQUIRE((dr.get({0}) == 10 && dr.get({1}) == 0 && dr.get({2}) == 30 && dr.get({3}) == 0));
    fill_(s, 7);
    REQUIRE(s.get({2}) == 7);
    REQUIRE_THROWS_WITH(add(a, Tensor::zeros({5})), Catch::Contains("f32[4]") && Catch::Contains("f32[5]"));
    REQUIRE_THROWS_WITH(relu(Tensor::zeros({2}, DType::I32)), Catch::Contains("relu: 'x' is i32[2] on cpu"));
    REQUIRE_THROWS_WITH(mul_into(a, a.to(DType::F16), s),
                        Catch::Contains("mul_into: 'b' is f16[4] on cpu but 'a' is f32[4]"));
    // add is autocast's Add row (ops/autocast.h): two types are summed in the wider, scope or not
    Tensor mixed = add(a, a.to(DType::F16));
    REQUIRE(mixed.dtype() == DType::F32);
    REQUIRE(mixed.get({2}) == 6);
}

TEST_CASE("bias rows and column sums", "[ops][elementwise][reduce][cpu][lesson02]") {
    //  y = [[1 2 3]      bias = [10 20 30]    y + bias = [[11 22 33]
    //       [4 5 6]]                                      [14 25 36]]
    Tensor y = from({1, 2, 3, 4, 5, 6}, {2, 3});
    add_bias_(y, from({10, 20, 30}, {3}));
    REQUIRE(y.get({1, 2}) == 36);
    Tensor db = from({1, 1, 1}, {3});
    sum_rows_into(y, db, 1.0f);  // [25 47 69] + 1
    REQUIRE((db.get({0}) == 26 && db.get({1}) == 48 && db.get({2}) == 70));
    sum_rows_into(y, db);        // beta = 0 overwrites
    REQUIRE(db.get({0}) == 25);
    Tensor am = argmax_rows(from({1, 9, 9, 0, -1, -5}, {2, 3}));
    REQUIRE((am.get({0}) == 1 && am.get({1}) == 0));  // first maximum wins
    REQUIRE_THROWS_WITH(add_bias_(y, from({1, 2}, {2})), Catch::Contains("bias [C]"));
}

TEST_CASE("cuda elementwise kernels match the CPU", "[cuda][lesson04][elementwise]") {
    Rng rng(7);
    // 0 launches nothing; 1, 255, 257: partial blocks; 300,007 > 1024·256: the grid-stride loop.
    for (int64_t n : {int64_t(0), int64_t(1), int64_t(255), int64_t(256), int64_t(257), int64_t(300007)}) {
        INFO("n = " << n);
        Tensor a = Tensor::uniform({n}, -1.0f, 1.0f, rng), b = Tensor::uniform({n}, -1.0f, 1.0f, rng);
        Tensor da = cuda_copy(a), db = cuda_copy(b);
        under_schedules([&] {
            require_near(add(da, db), add(a, b));
            require_near(relu(da), relu(a));
            Tensor dy = Tensor::uniform({n}, -1.0f, 1.0f, rng);
            Tensor r = relu(a);
            require_near(relu_backward(cuda_copy(r), cuda_copy(dy)), relu_backward(r, dy));

            Tensor y = b.clone(), dy2 = cuda_copy(b);
            axpy_(y, 0.37f, a);
            axpy_(dy2, 0.37f, da);
            require_near(dy2, y, 1e-6, 1e-7);  // a·x + y may be one fused multiply-add on the GPU

            Tensor s = a.clone(), ds = cuda_copy(a);
            scale_(s, -2.5f);
            scale_(ds, -2.5f);
            require_near(ds, s);

            Tensor f = Tensor::empty({n}, DType::F32, Device::CUDA);
            fill_(f, 3.25f);
            require_near(f, Tensor::full({n}, 3.25));
        });
    }
}

TEST_CASE("cuda sum_rows, add_bias and argmax_rows match the CPU", "[cuda][lesson04][elementwise][reduce]") {
    Rng rng(13);
    const int64_t shapes[][2] = {{1, 1}, {64, 10}, {37, 33}, {1000, 3}, {5, 70}, {3, 257}};
    for (auto [N, C] : shapes) {
        INFO("N = " << N << ", C = " << C);
        Tensor dy = Tensor::uniform({N, C}, -1.0f, 1.0f, rng), db0 = Tensor::uniform({C}, -1.0f, 1.0f, rng);
        Tensor bias = Tensor::uniform({C}, -1.0f, 1.0f, rng);
        // Rounded to quarters: rows with ties, where the first maximum must win on both.
        Tensor xq = Tensor::uniform({N, C}, -2.0f, 2.0f, rng);
        for (int64_t i = 0; i < xq.numel(); i++) xq.data<float>()[i] = std::round(xq.data<float>()[i] * 4) / 4;
        under_schedules([&] {
            for (float beta : {0.0f, 1.0f}) {
                INFO("beta = " << beta);
                Tensor want = db0.clone();
                sum_rows_into(dy, want, beta);
                // beta = 0 must not read db: start it as NaN on the device.
                Tensor got = beta == 0.0f ? Tensor::full({C}, std::nan("")).to(Device::CUDA) : cuda_copy(db0);
                sum_rows_into(cuda_copy(dy), got, beta);
                require_near(got, want, 1e-5, 1e-5);  // 8 partial sums per column, then added: another order
            }
            Tensor y = dy.clone(), dyc = cuda_copy(dy);
            add_bias_(y, bias);
            add_bias_(dyc, cuda_copy(bias));
            require_near(dyc, y);

            Tensor want = argmax_rows(xq), got = argmax_rows(cuda_copy(xq)).to(Device::CPU);
            REQUIRE(got.dtype() == DType::I32);
            for (int64_t n = 0; n < N; n++) REQUIRE(got.data<int32_t>()[n] == want.data<int32_t>()[n]);
        });
    }
}

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

void check_elementwise_lowp(Device device, Rng& rng) {
    const int64_t N = 37, C = 29;  // sum_rows_into's R above is N
    const Tensor x32 = random({N, C}, rng), y32 = random({N, C}, rng), b32 = random({C}, rng);
    for (const LowType& f : {kF16, kBF16}) {
        const Tensor x = x32.to(f.dtype), y = y32.to(f.dtype), b = b32.to(f.dtype);
        for (const ElementwiseOp& op : elementwise_ops()) {
            INFO(op.name << " in " << dtype_name(f.dtype) << " on " << device_name(device));
            const Tensor got = op.run(x.to(device), y.to(device), b.to(device));
            REQUIRE(got.device() == device);
            const Tensor want = op.run(x.to(DType::F32), y.to(DType::F32), b.to(DType::F32));
            // S for a column sum of values in [-1, 1] plus 0.5·|db|: at most N + 1.
            const Tensor S = op.R ? Tensor::full(want.shape(), double(op.R + 1)) : Tensor();
            require_rounded_once(got, want, f, op.R, S);
        }
    }
}

}  // namespace

TEST_CASE("f16 and bf16 elementwise and row ops on the CPU match f32, rounded once",
          "[dtype][cpu][elementwise][reduce][lesson09]") {
    Rng rng(109);
    check_elementwise_lowp(Device::CPU, rng);
}

TEST_CASE("f16 and bf16 elementwise and row ops on CUDA match f32, rounded once",
          "[dtype][cuda][elementwise][reduce][lesson09]") {
    Rng rng(113);
    under_schedules([&] { check_elementwise_lowp(Device::CUDA, rng); });
}

// f16 and bf16 on the CPU's f32 blocks (ops/cpu/f32_blocks.h), on every level and thread count:
// the f32 kernel's result rounded once, bit for bit (lowp_check.h).
namespace {

using test::random_lowp;
using test::lowp::check_bits_rounded_once;
using test::lowp::on_each_level_and_thread_count;

// n values of T: uniform in [-2, 2], and every 37th (from `first` on) one of the cases where
// rounding and NaN handling differ: ±0, ±inf, a NaN, subnormals (of f16: 3e-6, 7e-8; of bf16:
// 1e-39), values near f16's and bf16's largest.
// a and b take different `first`, so no index holds a NaN in both: which of two NaNs a + b
// returns (its sign) IEEE 754 leaves to the machine.
template <typename T>
std::vector<T> with_specials(size_t n, uint32_t seed, size_t first) {
    const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 3e-6f, -7e-8f, 1e-39f, 6.5e4f, -3.3e38f};
    std::vector<T> v = random_lowp<T>(n, seed);
    for (size_t i = first, k = 0; i < n; i += 37, k++) v[i] = T(specials[k % std::size(specials)]);
    return v;
}

template <typename T>
void check_elementwise_blocks() {
    // 1 and 7: one short block; 4095 and 4097 either side of a block (4096); 37865 = 9 blocks and
    // 1001 more: past the parallel threshold (2^15), not a multiple of 8.
    for (size_t n : {size_t(1), size_t(7), size_t(4095), size_t(4097), size_t(37865)}) {
        const std::vector<T> a = with_specials<T>(n, 11, 0), b = with_specials<T>(n, 12, 18);
        const int64_t m = int64_t(n);
        check_bits_rounded_once("add", a, b, [m](const auto& a, const auto& b, auto& y) {
            cpu::add(a.data(), b.data(), y.data(), m);
        });
        check_bits_rounded_once("mul", a, b, [m](const auto& a, const auto& b, auto& y) {
            cpu::mul(a.data(), b.data(), y.data(), m);
        });
        check_bits_rounded_once("mul into a", a, b, [m](const auto& a, const auto& b, auto& y) {
            y = a;
            cpu::mul(y.data(), b.data(), y.data(), m);
        });
        check_bits_rounded_once("axpy", a, b, [m](const auto& a, const auto& b, auto& y) {
            y = b;
            cpu::axpy(-0.75f, a.data(), y.data(), m);
        });
        check_bits_rounded_once("scale", a, b, [m](const auto& a, const auto&, auto& y) {
            y = a;
            cpu::scale(y.data(), m, 1.7f);
        });
        for (float cap : {INFINITY, 6.0f}) {
            check_bits_rounded_once("relu_forward", a, b, [m, cap](const auto& a, const auto&, auto& y) {
                cpu::relu_forward(a.data(), y.data(), m, cap);
            });
            check_bits_rounded_once("relu_backward", a, b, [m, cap](const auto& a, const auto& b, auto& y) {
                cpu::relu_backward(a.data(), b.data(), y.data(), m, cap);
            });
        }
        check_bits_rounded_once("gelu_forward", a, b, [m](const auto& a, const auto&, auto& y) {
            cpu::gelu_forward(a.data(), y.data(), m);
        });
        check_bits_rounded_once("gelu_backward", a, b, [m](const auto& a, const auto& b, auto& y) {
            cpu::gelu_backward(a.data(), b.data(), y.data(), m);
        });
        std::vector<uint8_t> mask(n);
        check_bits_rounded_once("dropout_forward", a, b, [m, &mask](const auto& a, const auto&, auto& y) {
            cpu::dropout_forward(a.data(), y.data(), mask.data(), m, 0.3f, 0x5eedu, 1000);
        });
        check_bits_rounded_once("dropout_backward", a, b, [m, &mask](const auto&, const auto& b, auto& y) {
            cpu::dropout_backward(b.data(), mask.data(), y.data(), m, 0.3f);
        });
    }
    // relu_backward copies dy's bits where the gradient flows: a NaN keeps its payload (in f32
    // and back, an f16 NaN would become the one quiet NaN 0x7e00).
    std::vector<T> y(4097, T(1.0f)), dy(4097, T(2.0f)), dx(4097);
    dy[4096].bits = 0x7f81;  // f16 and bf16: a signalling NaN with a payload
    cpu::relu_backward(y.data(), dy.data(), dx.data(), 4097, INFINITY);
    CHECK(dx[4096].bits == 0x7f81);
}

}  // namespace

TEST_CASE("f16 and bf16 elementwise kernels in f32 blocks give the f32 kernel's result rounded once, bit for bit",
          "[cpu][lowp][lesson09][elementwise][relu][gelu][dropout]") {
    on_each_level_and_thread_count(check_elementwise_blocks<f16>);
    on_each_level_and_thread_count(check_elementwise_blocks<bf16>);
}

// ---- reductions -------------------------------------------------------------------------------------------
TEST_CASE("reductions are exact on small cases and thread-count independent", "[ops][reduce][cpu][lesson02]") {
    Tensor x = from({1, 2, 3, 4}, {4});
    REQUIRE(sum(x) == 10);
    REQUIRE(mean(x) == 2.5);
    REQUIRE(max(x) == 4);
    Rng rng(3);
    Tensor big = Tensor::normal({1000003}, 0, 1, rng);
    omp_set_num_threads(1);
    double s1 = sum(big);
    omp_set_num_threads(2);
    double s2 = sum(big);
    omp_set_num_threads(3);
    double s3 = sum(big);
    omp_set_num_threads(2);
    REQUIRE(std::memcmp(&s1, &s2, sizeof s1) == 0);
    REQUIRE(std::memcmp(&s1, &s3, sizeof s1) == 0);
}

TEST_CASE("cuda sum and max match the CPU and are deterministic", "[cuda][lesson04][reduce]") {
    Rng rng(11);
    // 262,145 > 1024 blocks · 256 threads: pass 1's grid-stride loop gives threads several elements.
    for (int64_t n : {int64_t(1), int64_t(31), int64_t(256), int64_t(257), int64_t(1000), int64_t(262145)}) {
        INFO("n = " << n);
        Tensor x = Tensor::uniform({n}, -3.0f, 2.0f, rng);
        Tensor dx = cuda_copy(x);
        const double want = sum(x);
        double first = 0;
        under_schedules([&] {
            const double got = sum(dx);
            REQUIRE(got == Approx(want).epsilon(1e-12).margin(1e-12));  // both add floats in double
            if (first == 0) first = got;
            REQUIRE(got == first);  // bit-identical, whatever the schedule
            REQUIRE(sum(dx) == got);
            REQUIRE(max(dx) == max(x));  // max is exact
        });
    }
}

TEST_CASE("cuda sum of 1..n is exact; max finds the one large value", "[cuda][lesson04][reduce]") {
    //   x = [1 2 3 ... 1000]  ->  sum = 500500,  max = 1000; then x[777] = 1e6 -> max = 1e6
    Tensor x = Tensor::empty({1000});
    for (int64_t i = 0; i < 1000; i++) x.set({i}, double(i + 1));
    Tensor dx = cuda_copy(x);
    under_schedules([&] {
        REQUIRE(sum(dx) == 500500.0);
        REQUIRE(max(dx) == 1000.0f);
    });
    x.set({777}, 1e6);
    REQUIRE(max(cuda_copy(x)) == 1e6f);
    REQUIRE(sum(Tensor::empty({0}, DType::F32, Device::CUDA)) == 0.0);
}

namespace {

// sum and sum_squares read each T as its exact f32 value and add in double, in an order fixed by n
// alone; max and argmax_rows compare exact values. So a T tensor gives exactly what the f32 tensor
// of its values gives on the same device: the tolerance is 0 (no output rounding, the same sums).
void check_reductions_lowp(Device device, Rng& rng) {
    const Tensor x32 = random({300, 77}, rng);  // 23,100 elements: more than one CPU chunk
    for (const LowType& f : {kF16, kBF16}) {
        INFO(dtype_name(f.dtype) << " on " << device_name(device));
        const Tensor x = x32.to(f.dtype).to(device), same = x32.to(f.dtype).to(DType::F32).to(device);
        REQUIRE(sum(x) == sum(same));
        REQUIRE(sum_squares(x) == sum_squares(same));
        REQUIRE(max(x) == max(same));
        test::require_identical(argmax_rows(x), argmax_rows(same));
    }
}

}  // namespace

TEST_CASE("sum, sum_squares, max and argmax_rows of f16 and bf16 tensors", "[dtype][cpu][reduce][lesson09]") {
    Rng rng(137);
    check_reductions_lowp(Device::CPU, rng);
}

TEST_CASE("sum, sum_squares, max and argmax_rows of f16 and bf16 tensors on CUDA", "[dtype][cuda][reduce][lesson09]") {
    Rng rng(139);
    under_schedules([&] { check_reductions_lowp(Device::CUDA, rng); });
}

// ---- softmax cross-entropy --------------------------------------------------------------------------------
TEST_CASE("softmax cross-entropy: values and gradient by hand", "[loss][cpu][lesson02]") {
    // One row, logits [0, 0, ln 2]: softmax = [1/4, 1/4, 1/2]. Label 2: loss = −ln(1/2).
    Tensor z = from({0, 0, std::log(2.0f)}, {1, 3});
    Tensor y = Tensor::full({1}, 2, DType::I32);
    Tensor dz;
    float loss = softmax_cross_entropy(z, y, &dz);
    REQUIRE(loss == Approx(std::log(2.0)).epsilon(1e-6));
    REQUIRE(dz.get({0, 0}) == Approx(0.25));
    REQUIRE(dz.get({0, 2}) == Approx(-0.5));
    // two rows: the loss and the gradient are averaged over N
    Tensor z2 = from({0, 0, 0, 0}, {2, 2});
    Tensor y2 = Tensor::zeros({2}, DType::I32);
    REQUIRE(softmax_cross_entropy(z2, y2, &dz) == Approx(std::log(2.0)));
    REQUIRE(dz.get({1, 0}) == Approx(-0.25));
}

TEST_CASE("softmax cross-entropy is stable for logits of ±1e4", "[loss][cpu][lesson02]") {
    Tensor z = from({1e4f, -1e4f, 0, 1e4f, 1e4f, -1e4f}, {2, 3});
    Tensor y = Tensor::empty({2}, DType::I32);
    y.set({0}, 0);  // right with a huge margin: loss ≈ 0
    y.set({1}, 2);  // wrong with a huge margin: loss ≈ 2e4 + ln 2
    Tensor dz;
    float loss = softmax_cross_entropy(z, y, &dz);
    REQUIRE(std::isfinite(loss));
    REQUIRE(loss == Approx((0.0 + 2e4 + std::log(2.0)) / 2).epsilon(1e-6));
    for (int64_t i = 0; i < 6; i++) REQUIRE(std::isfinite(dz.data<float>()[i]));
    REQUIRE(dz.get({1, 0}) == Approx(0.25));   // (1/2 − 0) / N
    REQUIRE(dz.get({1, 2}) == Approx(-0.5));   // (0 − 1) / N
}

TEST_CASE("softmax cross-entropy gradient matches finite differences", "[loss][cpu][lesson02][gradcheck]") {
    Rng rng(11);
    Tensor z = Tensor::normal({3, 5}, 0, 2, rng);
    Tensor y = Tensor::empty({3}, DType::I32);
    for (int64_t n = 0; n < 3; n++) y.set({n}, double((n * 2) % 5));
    Tensor dz;
    softmax_cross_entropy(z, y, &dz);
    const float eps = 1e-2f;
    for (int64_t i = 0; i < z.numel(); i++) {
        float* p = z.data<float>() + i;
        float keep = *p;
        *p = keep + eps;
        double up = softmax_cross_entropy(z, y);
        *p = keep - eps;
        double down = softmax_cross_entropy(z, y);
        *p = keep;
        REQUIRE(dz.data<float>()[i] == Approx((up - down) / (2 * eps)).margin(1e-4).epsilon(1e-2));
    }
}

TEST_CASE("softmax cross-entropy rejects bad labels", "[loss][cpu][lesson02]") {
    Tensor z = Tensor::zeros({2, 3});
    Tensor y = Tensor::zeros({2}, DType::I32);
    y.set({1}, 3);
    REQUIRE_THROWS_WITH(softmax_cross_entropy(z, y), Catch::Contains("label 3 at row 1"));
    REQUIRE_THROWS_WITH(softmax_cross_entropy(z, Tensor::zeros({2})), Catch::Contains("should be i32"));
}

TEST_CASE("cuda softmax cross-entropy matches the CPU", "[cuda][lesson04][loss]") {
    Rng rng(31);
    // C = 300 > 128 threads: each thread takes several classes of its row.
    const int64_t shapes[][2] = {{1, 1}, {1, 10}, {64, 10}, {3, 300}, {200, 7}};
    for (auto [N, C] : shapes)
    for (float smoothing : {0.0f, 0.2f}) {  // 0.2: label smoothing (chapter 13)
        INFO("N = " << N << ", C = " << C << ", label smoothing " << smoothing);
        for (float range : {3.0f, 1e4f}) {  // ±1e4: exp would overflow without subtracting the max
            INFO("logits in ±" << range);
            Tensor z = Tensor::uniform({N, C}, -range, range, rng);
            Tensor y = Tensor::empty({N}, DType::I32);
            for (int64_t n = 0; n < N; n++) y.data<int32_t>()[n] = int32_t(rng.next_below(uint64_t(C)));
            Tensor dz;
            const float want = softmax_cross_entropy(z, y, &dz, nullptr, smoothing);
            Tensor dz_cuda;
            const Tensor zc = cuda_copy(z), yc = cuda_copy(y);
            under_schedules([&] {
                const float got = softmax_cross_entropy(zc, yc, &dz_cuda, nullptr, smoothing);
                REQUIRE(std::isfinite(got));
                REQUIRE(got == Approx(want).epsilon(1e-5).margin(1e-6));
                require_near(dz_cuda, dz, 1e-5, 1e-7);
                REQUIRE(softmax_cross_entropy(zc, yc, nullptr, nullptr, smoothing) == got);  // without the gradient, the same loss
            });
        }
    }
}

// The training step's one read-back: the loss, the rows predicted right and the labels' check.
TEST_CASE("cuda softmax cross-entropy counts the correct rows and checks the labels on the device",
          "[cuda][lesson04][loss]") {
    Rng rng(33);
    const int64_t N = 300, C = 7;  // N > 65535 is not needed: the grid-stride loop is the same code
    Tensor z = Tensor::uniform({N, C}, -1.0f, 1.0f, rng);
    Tensor y = Tensor::empty({N}, DType::I32);
    for (int64_t n = 0; n < N; n++) y.data<int32_t>()[n] = int32_t(rng.next_below(uint64_t(C)));
    // Ties: the first maximum is the prediction (argmax_rows), so row 0 is right and row 1 wrong.
    for (int64_t n : {0, 1}) {
        z.set({n, 2}, 5.0);
        z.set({n, 4}, 5.0);
    }
    y.set({0}, 2);
    y.set({1}, 4);
    const int64_t want = count_equal(argmax_rows(z), y);
    REQUIRE(want > 1);  // some rows right, some wrong: the count is not trivially 0 or N
    REQUIRE(want < N);
    int64_t cpu_correct = -1;
    softmax_cross_entropy(z, y, nullptr, &cpu_correct);
    REQUIRE(cpu_correct == want);
    const Tensor zc = cuda_copy(z), yc = cuda_copy(y);
    under_schedules([&] {
        int64_t correct = -1;
        Tensor dz;
        softmax_cross_entropy(zc, yc, &dz, &correct);
        REQUIRE(correct == want);
    });
    // A label outside [0, C): the first such row is named, as on the CPU.
    y.set({150}, -1);
    y.set({40}, int(C));
    for (Device device : {Device::CPU, Device::CUDA})
        REQUIRE_THROWS_WITH(softmax_cross_entropy(z.to(device), y.to(device)), Catch::Contains("label 7 at row 40"));
}

namespace {

void check_softmax_cross_entropy_lowp(Device device, Rng& rng) {
    // C = 300 > 128 threads: each CUDA thread takes several classes of its row.
    const int64_t shapes[][2] = {{37, 13}, {3, 300}};
    for (const LowType& f : {kF16, kBF16})
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
            const double eps32 = std::numeric_limits<float>::epsilon();
            REQUIRE(std::fabs(loss - want) <= 4.0 * double(C + N) * eps32 * std::fabs(want));
            // dz has the logits' dtype; each entry, |dz| ≤ 1/N, is rounded once (and the GPU's
            // expf differs from the CPU's double exp by a few ulps of f32).
            REQUIRE(dz.dtype() == f.dtype);
            REQUIRE(dz.device() == device);
            require_rounded_once(dz, dz32, f, C, Tensor::full(dz32.shape(), 1.0 / double(N)));
        }
}

}  // namespace

TEST_CASE("softmax cross-entropy of f16 and bf16 logits: f32 math, dlogits in the logits' dtype",
          "[dtype][cpu][loss][lesson09]") {
    Rng rng(127);
    check_softmax_cross_entropy_lowp(Device::CPU, rng);
}

TEST_CASE("softmax cross-entropy of f16 and bf16 logits on CUDA", "[dtype][cuda][loss][lesson09]") {
    Rng rng(131);
    under_schedules([&] { check_softmax_cross_entropy_lowp(Device::CUDA, rng); });
}

// ---- the dtypes the ops refuse ----------------------------------------------------------------------------
TEST_CASE("ops refuse mixed and integer dtypes, naming the op and the tensor",
          "[dtype][cpu][gemm][elementwise][reduce][lesson09]") {
    const Tensor a = Tensor::zeros({2, 3}), h = Tensor::zeros({3, 2}, DType::F16);
    REQUIRE_THROWS_WITH(matmul(a, h), Catch::Contains("matmul: 'b' is f16[3, 2] on cpu but 'a' is f32[2, 3]"));
    REQUIRE(matmul(a.to(DType::F16), h).dtype() == DType::F16);  // one dtype throughout: its dtype out
    Tensor u = Tensor::zeros({2}, DType::U8);
    REQUIRE_THROWS_WITH(scale_(u, 2), Catch::Contains("scale_: 'x' is u8[2] on cpu; f32, f16 and bf16"));
    REQUIRE_THROWS_WITH(sum(Tensor::zeros({2}, DType::I32)), Catch::Contains("sum: 'x' is i32[2] on cpu"));
}
