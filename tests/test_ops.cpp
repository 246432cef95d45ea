// test_ops.cpp — the operations of chapters 01–02 against hand-computed values: elementwise,
// bias rows, reductions (and their thread-count determinism), softmax cross-entropy (incl.
// logits of ±1e4), and the errors bad arguments get.
#include <omp.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>

#include "core/rng.h"
#include "ops/ops.h"

using namespace kiln;

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
