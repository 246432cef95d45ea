// test_capstone_parts.cpp — the pieces chapter 13's fast CIFAR-10 trainer adds: the symmetric
// eigen-solver, dirac and patch-whitening initialization (nn/init.h), Lookahead weight
// averaging (optim/lookahead.h), label smoothing (ops/loss.h softmax_cross_entropy; its CUDA twin
// is checked against the CPU in test_ops.cpp), reflected shifts and alternating flips of the
// data (data/transforms.h, data/loader.h), test-time views (train/evaluate.h) and Scale
// (nn/misc.h). Hand-computed cases first, then the properties each promises.
//
//   make test T='[lesson13]'
#include <catch2/catch.hpp>

#include <cmath>
#include <memory>
#include <set>
#include <vector>

#include "core/rng.h"
#include "data/loader.h"
#include "data/transforms.h"
#include "nn/conv.h"
#include "nn/init.h"
#include "nn/norm.h"
#include "ops/loss.h"
#include "ops/ops.h"
#include "nn/layers.h"
#include "nn/misc.h"
#include "nn/module.h"
#include "optim/lookahead.h"
#include "train/evaluate.h"

using namespace kiln;

namespace {

// A · v for a row-major n×n A.
std::vector<double> times(const std::vector<double>& A, const double* v, int64_t n) {
    std::vector<double> r(static_cast<size_t>(n), 0.0);
    for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < n; ++j) r[size_t(i)] += A[size_t(i * n + j)] * v[j];
    return r;
}

}  // namespace

TEST_CASE("symmetric_eigen: a hand-computed 3×3 case", "[lesson13][init][cpu]") {
    // [[2, 1, 0], [1, 2, 0], [0, 0, 5]]: eigenvalues 1 (along (1, −1, 0)/√2), 3 ((1, 1, 0)/√2), 5 ((0, 0, 1)).
    std::vector<double> values, vectors;
    symmetric_eigen({2, 1, 0, 1, 2, 0, 0, 0, 5}, 3, values, vectors);
    CHECK(values[0] == Approx(1.0).margin(1e-12));
    CHECK(values[1] == Approx(3.0).margin(1e-12));
    CHECK(values[2] == Approx(5.0).margin(1e-12));
    const double s = std::sqrt(0.5);
    CHECK(std::fabs(vectors[0]) == Approx(s));
    CHECK(vectors[1] == Approx(-vectors[0]));  // (1, −1, 0) up to its sign
    CHECK(vectors[3] == Approx(vectors[4]));   // (1, 1, 0)
    CHECK(std::fabs(vectors[8]) == Approx(1.0));
    REQUIRE_THROWS_WITH(symmetric_eigen({1, 2, 3, 4}, 2, values, vectors), Catch::Contains("not symmetric"));
}

TEST_CASE("symmetric_eigen: A v = λ v with orthonormal v on a random 12×12 matrix", "[lesson13][init][cpu]") {
    Rng rng(3);
    const int64_t n = 12;
    std::vector<double> B(size_t(n * n)), A(size_t(n * n), 0.0);
    for (double& b : B) b = Rng::to_unit(rng.next_u64()) * 2.0 - 1.0;
    for (int64_t i = 0; i < n; ++i)  // A = B Bᵀ: symmetric, positive semi-definite
        for (int64_t j = 0; j < n; ++j)
            for (int64_t k = 0; k < n; ++k) A[size_t(i * n + j)] += B[size_t(i * n + k)] * B[size_t(j * n + k)];
    std::vector<double> values, vectors;
    symmetric_eigen(A, n, values, vectors);
    for (int64_t i = 0; i < n; ++i) {
        if (i > 0) CHECK(values[size_t(i - 1)] <= values[size_t(i)]);
        const double* v = vectors.data() + i * n;
        const std::vector<double> Av = times(A, v, n);
        for (int64_t j = 0; j < n; ++j) CHECK(Av[size_t(j)] == Approx(values[size_t(i)] * v[j]).margin(1e-9));
        for (int64_t k = 0; k < n; ++k) {
            double dot = 0;
            for (int64_t j = 0; j < n; ++j) dot += v[j] * vectors[size_t(k * n + j)];
            CHECK(dot == Approx(i == k ? 1.0 : 0.0).margin(1e-12));
        }
    }
}

TEST_CASE("dirac_init: the first C output channels are the input", "[lesson13][init][cpu]") {
    Rng rng(5);
    ConvOptions same;
    same.padding = 1, same.bias = false;
    Conv2d conv(4, 6, 3, rng, same);
    dirac_init(conv);
    const Tensor x = Tensor::normal({2, 4, 5, 7}, 0, 1, rng);
    const Tensor y = conv.forward(x);
    int64_t bad = 0, others_nonzero = 0;
    for (int64_t n = 0; n < 2; ++n)
        for (int64_t o = 0; o < 6; ++o)
            for (int64_t i = 0; i < 35; ++i) {
                const float got = y.data<float>()[(n * 6 + o) * 35 + i];
                if (o < 4) bad += got != x.data<float>()[(n * 4 + o) * 35 + i];
                else others_nonzero += got != 0.0f;
            }
    CHECK(bad == 0);
    CHECK(others_nonzero > 0);  // filters 4 and 5 kept their random initialization
    ConvOptions grouped = same;
    grouped.groups = 2;
    Conv2d g(4, 4, 3, rng, grouped);
    REQUIRE_THROWS_WITH(dirac_init(g), Catch::Contains("one group"));
}

TEST_CASE("whitening_init: the patches come out decorrelated with unit variance, and negated", "[lesson13][init][cpu]") {
    // Images whose 2×2 patches are strongly correlated: a smooth random field per channel
    // (each pixel the mean of a 4×4 block of noise) mixed across the 3 channels, plus a little noise.
    Rng rng(9);
    const int64_t N = 64, C = 3, H = 12, W = 12;
    const Tensor noise = Tensor::normal({N, C, H + 3, W + 3}, 0, 1, rng), fine = Tensor::normal({N, C, H, W}, 0, 0.1f, rng);
    Tensor x = Tensor::zeros({N, C, H, W});
    for (int64_t n = 0; n < N; ++n)
        for (int64_t c = 0; c < C; ++c)
            for (int64_t i = 0; i < H; ++i)
                for (int64_t j = 0; j < W; ++j) {
                    float v = 0;
                    for (int64_t cc = 0; cc < C; ++cc)
                        for (int64_t a = 0; a < 4; ++a)
                            for (int64_t b = 0; b < 4; ++b)
                                v += (cc == c ? 1.0f : 0.5f) * noise.data<float>()[((n * C + cc) * (H + 3) + i + a) * (W + 3) + j + b] / 16;
                    x.data<float>()[((n * C + c) * H + i) * W + j] = v + 3.0f + fine.data<float>()[((n * C + c) * H + i) * W + j];
                }
    ConvOptions valid;
    valid.bias = false;
    Conv2d conv(3, 24, 2, rng, valid);
    whitening_init(conv, x, 1e-9f);
    const Tensor y = conv.forward(x);  // [N, 24, 11, 11]
    const int64_t D = 12, L = 11 * 11, count = N * L;
    std::vector<double> mean(size_t(D), 0.0), cov(size_t(D * D), 0.0);
    for (int64_t n = 0; n < N; ++n)
        for (int64_t l = 0; l < L; ++l)
            for (int64_t a = 0; a < D; ++a) {
                const double ya = y.data<float>()[(n * 24 + a) * L + l];
                mean[size_t(a)] += ya / double(count);
                for (int64_t b = 0; b < D; ++b) cov[size_t(a * D + b)] += ya * y.data<float>()[(n * 24 + b) * L + l] / double(count);
                CHECK(y.data<float>()[(n * 24 + D + a) * L + l] == -float(ya));
            }
    int64_t bad = 0;
    for (int64_t a = 0; a < D; ++a)
        for (int64_t b = 0; b < D; ++b) {
            const double c = cov[size_t(a * D + b)] - mean[size_t(a)] * mean[size_t(b)];
            if (!(std::fabs(c - (a == b ? 1.0 : 0.0)) < 2e-3) && bad++ < 3)
                UNSCOPED_INFO("covariance of outputs " << a << ", " << b << ": " << c);
        }
    CHECK(bad == 0);
    Conv2d wrong(3, 12, 2, rng, valid);
    REQUIRE_THROWS_WITH(whitening_init(wrong, x), Catch::Contains("needs 24 output channels"));
}

TEST_CASE("Lookahead: slow = decay·slow + (1 − decay)·fast, then fast = slow, buffers too", "[lesson13][optim][cpu]") {
    Rng rng(2);
    Sequential model("net");
    ConvOptions o;
    o.bias = false;
    auto& conv = model.add(std::make_unique<Conv2d>(1, 1, 1, rng, o));
    model.add(std::make_unique<BatchNorm2d>(1));
    conv.weight.value.data<float>()[0] = 2.0f;
    Lookahead slow(model);  // slow: w = 2, bn weight 1, bias 0, running mean 0, var 1
    conv.weight.value.data<float>()[0] = 6.0f;
    Tensor* running_mean = nullptr;
    for (auto& [name, b] : model.named_buffers())
        if (name.find("running_mean") != std::string::npos) running_mean = b;
    REQUIRE(running_mean != nullptr);
    running_mean->data<float>()[0] = 4.0f;
    slow.update(model, 0.75f);  // 0.75·2 + 0.25·6 = 3;  0.75·0 + 0.25·4 = 1
    CHECK(conv.weight.value.data<float>()[0] == 3.0f);
    CHECK(running_mean->data<float>()[0] == 1.0f);
    conv.weight.value.data<float>()[0] = 11.0f;
    slow.update(model, 1.0f);  // back to the slow weights
    CHECK(conv.weight.value.data<float>()[0] == 3.0f);
    slow.update(model, 0.0f);  // keep the fast ones (and make them the slow ones)
    CHECK(conv.weight.value.data<float>()[0] == 3.0f);
    StateDict state;
    slow.save_state(state, "lookahead");
    conv.weight.value.data<float>()[0] = 7.0f;
    slow.update(model, 0.0f);  // slow = 7
    slow.load_state(state, "lookahead");  // slow = 3 again
    slow.update(model, 1.0f);
    CHECK(conv.weight.value.data<float>()[0] == 3.0f);
    REQUIRE_THROWS_WITH(slow.update(model, 1.5f), Catch::Contains("decay must be in [0, 1]"));
}

TEST_CASE("label smoothing: a hand-computed case, PyTorch's definition, and finite differences", "[lesson13][loss][cpu]") {
    // z = (ln 3, 0), y = 0, ε = 0.2: softmax p = (3/4, 1/4), target q = (1 − ε + ε/2, ε/2) = (0.9, 0.1),
    //   loss = −Σ q_c log p_c = −0.9 ln 0.75 − 0.1 ln 0.25 = 0.397542...,   dz = p − q = (−0.15, 0.15).
    Tensor z = Tensor::zeros({1, 2});
    z.data<float>()[0] = std::log(3.0f);
    Tensor y = Tensor::zeros({1}, DType::I32);
    Tensor dz;
    const float loss = softmax_cross_entropy(z, y, &dz, nullptr, 0.2f);
    CHECK(loss == Approx(-0.9 * std::log(0.75) - 0.1 * std::log(0.25)).epsilon(1e-6));
    CHECK(dz.data<float>()[0] == Approx(-0.15f).epsilon(1e-5));
    CHECK(dz.data<float>()[1] == Approx(0.15f).epsilon(1e-5));
    // A batch: the mean over rows of −Σ_c q_c log softmax_c, and dz against central differences.
    Rng rng(4);
    const int64_t N = 5, C = 7;
    Tensor zs = Tensor::normal({N, C}, 0, 2, rng), ys = Tensor::empty({N}, DType::I32);
    for (int64_t n = 0; n < N; ++n) ys.data<int32_t>()[n] = int32_t(rng.next_below(C));
    const float eps = 0.3f;
    const auto loss_of = [&](const Tensor& logits) {  // the definition, in double
        double total = 0;
        for (int64_t n = 0; n < N; ++n) {
            const float* r = logits.data<float>() + n * C;
            double s = 0;
            for (int64_t c = 0; c < C; ++c) s += std::exp(double(r[c]));
            for (int64_t c = 0; c < C; ++c) {
                const double q = (c == ys.data<int32_t>()[n] ? 1.0 - eps : 0.0) + eps / C;
                total -= q * (double(r[c]) - std::log(s));
            }
        }
        return total / N;
    };
    Tensor dzs;
    CHECK(softmax_cross_entropy(zs, ys, &dzs, nullptr, eps) == Approx(loss_of(zs)).epsilon(1e-6));
    for (int64_t i = 0; i < N * C; ++i) {
        Tensor plus = zs.clone(), minus = zs.clone();
        plus.data<float>()[i] += 1e-2f;
        minus.data<float>()[i] -= 1e-2f;
        const double numeric = (loss_of(plus) - loss_of(minus)) / (double(plus.data<float>()[i]) - minus.data<float>()[i]);
        CHECK(dzs.data<float>()[i] == Approx(numeric).margin(2e-5));
    }
    // ε = 0 is the plain loss, bit for bit.
    Tensor d0, d1;
    CHECK(softmax_cross_entropy(zs, ys, &d0, nullptr, 0.0f) == softmax_cross_entropy(zs, ys, &d1));
    REQUIRE_THROWS_WITH(softmax_cross_entropy(zs, ys, nullptr, nullptr, 1.0f), Catch::Contains("label smoothing must be in [0, 1)"));
}

TEST_CASE("Translate: a fixed shift, reflected or zero-padded at the edges", "[lesson13][transforms][cpu]") {
    // in = [[1, 2, 3], [4, 5, 6], [7, 8, 9]];  out[y, x] = in[y + dy, x + dx], row −1 reads row 1.
    const std::vector<float> in{1, 2, 3, 4, 5, 6, 7, 8, 9};
    std::vector<float> out(9);
    Translate(-1, -1).apply(in.data(), {1, 3, 3}, out.data(), 0);
    CHECK(out == std::vector<float>{5, 4, 5, 2, 1, 2, 5, 4, 5});
    Translate(1, 1).apply(in.data(), {1, 3, 3}, out.data(), 0);
    CHECK(out == std::vector<float>{5, 6, 5, 8, 9, 8, 5, 6, 5});
    Translate(1, 0, Padding::Zeros).apply(in.data(), {1, 3, 3}, out.data(), 0);
    CHECK(out == std::vector<float>{4, 5, 6, 7, 8, 9, 0, 0, 0});
    REQUIRE_THROWS_WITH(Translate(3, 0).output_shape({1, 3, 3}), Catch::Contains("smaller than the image"));
}

TEST_CASE("RandomCrop with reflection never reads a zero and covers every shift", "[lesson13][transforms][cpu]") {
    // A 4×4 image of the values 1..16, padded by 2 with its reflection, 4×4 windows: each output
    // holds only image values, and its corner takes every place a shift can bring it from.
    std::vector<float> in(16);
    for (int i = 0; i < 16; ++i) in[size_t(i)] = float(i + 1);
    const RandomCrop crop(4, 2, Padding::Reflect);
    std::set<float> corners;
    std::vector<float> out(16);
    for (uint64_t bits = 0; bits < 200; ++bits) {
        crop.apply(in.data(), {1, 4, 4}, out.data(), bits * 7919);
        for (float v : out) REQUIRE(v >= 1.0f);
        corners.insert(out[0]);
    }
    // The corner reads (reflect(top), reflect(left)), top and left in −2..2: rows and columns 2, 1,
    // 0, 1, 2 — the 9 values of the image's top-left 3×3.
    CHECK(corners == std::set<float>{1, 2, 3, 5, 6, 7, 9, 10, 11});
    REQUIRE_THROWS_WITH(RandomCrop(4, 4, Padding::Reflect).output_shape({1, 4, 4}), Catch::Contains("reflecting 4 pixels"));
}

TEST_CASE("alternating flip: every image mirrored in exactly one of two epochs running", "[lesson13][loader][cpu]") {
    // 64 images of 1×1×2 pixels (i, 255 − i): mirrored, the pair swaps.
    ImageSet s;
    s.n = 64, s.c = 1, s.h = 1, s.w = 2;
    for (int64_t i = 0; i < s.n; i++) {
        s.pixels.push_back(uint8_t(i));
        s.pixels.push_back(uint8_t(255 - i));
        s.labels.push_back(int32_t(i % 10));
    }
    LoaderOptions o;
    o.batch_size = 16, o.shuffle = false, o.prefetch = false, o.alternating_flip = true, o.seed = 3;
    DataLoader loader(s, o);
    const auto mirrored = [&](int64_t epoch) {  // image i mirrored in this epoch?
        std::vector<bool> m;
        loader.start_epoch(epoch);
        Batch b;
        while (loader.next(b))
            for (int64_t i = 0; i < b.size(); i++) m.push_back(b.x.data<float>()[2 * i] > b.x.data<float>()[2 * i + 1]);
        return m;
    };
    const auto e0 = mirrored(0), e1 = mirrored(1), e2 = mirrored(2);
    int64_t flipped0 = 0;
    for (size_t i = 0; i < e0.size(); i++) {
        CHECK(e0[i] != e1[i]);
        CHECK(e0[i] == e2[i]);
        flipped0 += e0[i];
    }
    CHECK(flipped0 > 16);  // about half: a fixed random half, not all or none
    CHECK(flipped0 < 48);
}

TEST_CASE("evaluate_views weighs each view's logits", "[lesson13][cpu]") {
    // 10 images of two pixels (25·i, 250 − 25·i) and a head with logit_c = c · (first pixel): the
    // plain view predicts class 0 for image 0 and 9 for the rest (2 right), the mirrored one 9 for
    // all (1 right). The weights pick which view's logits count.
    ImageSet s;
    s.n = 10, s.c = 1, s.h = 1, s.w = 2;
    for (int64_t i = 0; i < s.n; i++) {
        s.pixels.push_back(uint8_t(25 * i));
        s.pixels.push_back(uint8_t(250 - 25 * i));
        s.labels.push_back(int32_t(i));
    }
    LoaderOptions o;
    o.batch_size = 4, o.shuffle = false, o.prefetch = false;
    DataLoader plain(s, o);
    o.transforms.push_back(std::make_shared<RandomHorizontalFlip>(1.0f));
    DataLoader mirrored(s, o);
    Rng rng(1);
    Sequential net("net");
    net.add(std::make_unique<Flatten>());
    auto& head = net.add(std::make_unique<Linear>(2, 10, rng, false));
    for (int64_t c = 0; c < 10; c++) {
        head.weight.value.data<float>()[c * 2 + 0] = float(c);
        head.weight.value.data<float>()[c * 2 + 1] = 0.0f;
    }
    const double alone = evaluate(net, plain), flipped_alone = evaluate(net, mirrored);
    REQUIRE(alone == Approx(0.2));
    REQUIRE(flipped_alone == Approx(0.1));
    CHECK(evaluate_views(net, plain, {&mirrored}, {1.0f, 0.0f}).averaged == alone);
    CHECK(evaluate_views(net, plain, {&mirrored}, {0.0f, 1.0f}).averaged == flipped_alone);
    CHECK(evaluate_views(net, plain, {&mirrored}, {1.0f, 0.0f}).plain == alone);
    REQUIRE_THROWS_WITH(evaluate_views(net, plain, {&mirrored}, {1.0f}), Catch::Contains("1 weights for 2 views"));
}

TEST_CASE("Scale: y = s·x, dx = s·dy", "[lesson13][cpu]") {
    Scale scale(1.0f / 9);
    Tensor x = Tensor::full({2, 3}, 4.5);
    const Tensor y = scale.forward(x), dx = scale.backward(Tensor::full({2, 3}, 18.0));
    for (int64_t i = 0; i < 6; i++) {
        CHECK(y.data<float>()[i] == 0.5f);
        CHECK(dx.data<float>()[i] == 2.0f);
    }
}
