// test_ops.cpp — the operations of chapters 01–02 against hand-computed values: elementwise,
// bias rows, reductions (and their thread-count determinism), softmax cross-entropy (incl.
// logits of ±1e4), and the errors bad arguments get; their CUDA kernels (chapter 04) against the
// CPU: elementwise, sum and max (deterministic), bias rows, argmax, the loss and its count of
// correct rows.
//
//   make test T='[ops]'   (CPU)     make test T='[cuda][lesson04]'   (CUDA; [reduce], [loss], ...)
#include <omp.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>

#include "core/rng.h"
#include "fixtures.h"
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

TEST_CASE("elementwise ops", "[ops][cpu][lesson02]") {
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

TEST_CASE("bias rows and column sums", "[ops][cpu][lesson02]") {
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

TEST_CASE("matmul shapes and errors", "[ops][cpu][lesson02]") {
    Tensor a = from({1, 2, 3, 4, 5, 6}, {2, 3});  // [[1 2 3] [4 5 6]]
    Tensor c = matmul(a, a, false, true);          // a·aᵀ = [[14 32] [32 77]]
    REQUIRE((c.get({0, 0}) == 14 && c.get({0, 1}) == 32 && c.get({1, 1}) == 77));
    Tensor d = matmul(a, a, true, false);          // aᵀ·a is 3×3
    REQUIRE(d.shape() == Shape({3, 3}));
    REQUIRE(d.get({2, 2}) == 45);
    REQUIRE_THROWS_WITH(matmul(a, a), Catch::Contains("inner sizes differ"));
}

TEST_CASE("reductions are exact on small cases and thread-count independent", "[ops][cpu][lesson02]") {
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

// ---- on CUDA (chapter 04; cuda/elementwise.cu, reduce.cu, loss.cu; on the emulator without a GPU,
// under three schedules) ---------------------------------------------------------------------------
// Random shapes chosen to hit the edges: n = 1, odd sizes, sizes that are not multiples of the
// block, n large enough for the grid-stride loops.
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

TEST_CASE("cuda sum_rows, add_bias and argmax_rows match the CPU", "[cuda][lesson04][reduce]") {
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
