// test_attention.cpp — chapter 14's ops (ops/attention.h), every backend in one file: the
// embedding and its scatter-add, the softmax of rows, and causal self-attention in its two
// versions, on the CPU and on the CUDA kernels (the emulator without a GPU).
//
// ---- The reference ------------------------------------------------------------------------------
// ref_attention below is the formula in double, written out loop by loop: S = scale·QKᵀ masked,
// P = softmax(S), O = (P ⊙ Z/(1 − p)) V, and its gradients
//   dV = Pdᵀ dO,  dP = (dO Vᵀ) ⊙ Z/(1 − p),  dS = P ⊙ (dP − rowsum(dP ⊙ P)),  dQ = scale·dS K,  dK = scale·dSᵀ Q.
// Its gradients are first checked against central differences of its own forward (in double,
// where ε = 1e-6 leaves ~1e-9 of error), so the formula itself is tested; then both kernels are
// checked against it (f32: relative 2e-5 of the largest value), and FlashAttention's backward
// against the textbook's.
//
// ---- f16 and bf16 (chapter 09's bound) ---------------------------------------------------------
// With q, k, v rounded to T first, both runs start from the same numbers. An output element
// o_id = Σ_j Pd_ij v_jd is bounded as lowp_check.h bounds a sum, with S = Σ_j Pd_ij |v_jd|:
//   |o_T − o_f32| ≤ (r·u + 2·n·2^-24)·S + tiny
// r = 1 for flash (o rounded once), 2 for the textbook version (P is stored in T, then o is
// rounded), n = Tk terms. A gradient is a sum of products with more stages: for dq_id =
// scale·Σ_j P_ij (dP_ij − Δ_i) k_jd the terms are bounded by S = scale·Σ_j P_ij (|dP_ij| + |Δ_i|)
// |k_jd| (likewise dk), and r = 4 (P stored in T, dP's and Δ's inputs o and dO in T, the result
// rounded); dv_jd = Σ_i Pd_ij dO_id has S = Σ_i Pd_ij |dO_id| and r = 2.
//
//   make test T='[attention]'   make test T='[embedding]'   make test T='[softmax]'
#include <catch2/catch.hpp>

#include <omp.h>

#include <cmath>
#include <functional>
#include <vector>

#include "core/rng.h"
#include "fixtures.h"
#include "ops/attention.h"

using namespace kiln;
using Catch::Contains;

namespace {

Tensor host(const Tensor& t) { return t.to(Device::CPU).to(DType::F32); }

// ---- the reference, in double ------------------------------------------------------------------
struct Sizes {
    int64_t B, T, C, H;
    int64_t D() const { return C / H; }
};

struct Ref {
    std::vector<double> y, dqkv;                 // [B, T, C], [B, T, 3C]
    std::vector<double> y_abs, dq_abs, dv_abs;   // the S of each element's bound (header)
};

// The forward (and, with dy, the backward) of causal self-attention on qkv [B, T, 3C], in double.
Ref ref_attention(const std::vector<double>& qkv, const Sizes& z, const std::vector<double>* dy = nullptr,
                  const AttentionDropout& drop = {}) {
    const int64_t B = z.B, T = z.T, C = z.C, H = z.H, D = z.D();
    const double scale = 1.0 / std::sqrt(double(D));
    AttentionParams p;
    p.B = B, p.H = H, p.Tq = p.Tk = T, p.D = D, p.dropout_p = drop.p, p.seed_hash = drop.seed_hash, p.first = drop.first;
    const auto at = [&](int64_t b, int64_t t, int64_t part, int64_t h, int64_t d) {
        return qkv[size_t(((b * T + t) * 3 + part) * C + h * D + d)];
    };
    Ref r;
    r.y.assign(size_t(B * T * C), 0.0), r.y_abs = r.y;
    r.dqkv.assign(size_t(B * T * 3 * C), 0.0), r.dq_abs = r.dv_abs = r.dqkv;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
            const int64_t bh = b * H + h;
            std::vector<double> P(size_t(T * T), 0.0), Z(size_t(T * T), 0.0);
            for (int64_t i = 0; i < T; i++) {
                double m = -INFINITY;
                std::vector<double> s(size_t(T), 0.0);
                for (int64_t j = 0; j <= i; j++) {
                    for (int64_t d = 0; d < D; d++) s[size_t(j)] += at(b, i, 0, h, d) * at(b, j, 1, h, d);
                    s[size_t(j)] *= scale;
                    m = std::max(m, s[size_t(j)]);
                }
                double sum = 0.0;
                for (int64_t j = 0; j <= i; j++) sum += std::exp(s[size_t(j)] - m);
                for (int64_t j = 0; j <= i; j++) {
                    P[size_t(i * T + j)] = std::exp(s[size_t(j)] - m) / sum;
                    Z[size_t(i * T + j)] = attention_kept(p, bh, i, j) ? 1.0 / (1.0 - drop.p) : 0.0;
                }
                for (int64_t d = 0; d < D; d++)
                    for (int64_t j = 0; j <= i; j++) {
                        const double w = P[size_t(i * T + j)] * Z[size_t(i * T + j)];
                        r.y[size_t((b * T + i) * C + h * D + d)] += w * at(b, j, 2, h, d);
                        r.y_abs[size_t((b * T + i) * C + h * D + d)] += w * std::fabs(at(b, j, 2, h, d));
                    }
            }
            if (!dy) continue;
            const auto g = [&](int64_t t, int64_t d) { return (*dy)[size_t((b * T + t) * C + h * D + d)]; };
            const auto out = [&](std::vector<double>& v, int64_t t, int64_t part, int64_t d) -> double& {
                return v[size_t(((b * T + t) * 3 + part) * C + h * D + d)];
            };
            std::vector<double> dP(size_t(T * T), 0.0), dS(size_t(T * T), 0.0), Dl(size_t(T), 0.0);
            for (int64_t i = 0; i < T; i++) {
                for (int64_t j = 0; j <= i; j++) {
                    for (int64_t d = 0; d < D; d++) dP[size_t(i * T + j)] += g(i, d) * at(b, j, 2, h, d);
                    dP[size_t(i * T + j)] *= Z[size_t(i * T + j)];
                    Dl[size_t(i)] += dP[size_t(i * T + j)] * P[size_t(i * T + j)];
                }
                for (int64_t j = 0; j <= i; j++) dS[size_t(i * T + j)] = P[size_t(i * T + j)] * (dP[size_t(i * T + j)] - Dl[size_t(i)]);
            }
            for (int64_t i = 0; i < T; i++)
                for (int64_t j = 0; j <= i; j++)
                    for (int64_t d = 0; d < D; d++) {
                        const double ds = dS[size_t(i * T + j)], pd = P[size_t(i * T + j)] * Z[size_t(i * T + j)];
                        const double bound = P[size_t(i * T + j)] * (std::fabs(dP[size_t(i * T + j)]) + std::fabs(Dl[size_t(i)]));
                        out(r.dqkv, i, 0, d) += scale * ds * at(b, j, 1, h, d);  // dQ
                        out(r.dqkv, j, 1, d) += scale * ds * at(b, i, 0, h, d);  // dK
                        out(r.dqkv, j, 2, d) += pd * g(i, d);                    // dV
                        out(r.dq_abs, i, 0, d) += scale * bound * std::fabs(at(b, j, 1, h, d));
                        out(r.dq_abs, j, 1, d) += scale * bound * std::fabs(at(b, i, 0, h, d));
                        out(r.dv_abs, j, 2, d) += pd * std::fabs(g(i, d));
                    }
        }
    return r;
}

std::vector<double> values_of(const Tensor& t) {
    const Tensor h = host(t);
    return std::vector<double>(h.data<float>(), h.data<float>() + h.numel());
}

Tensor tensor_from(const Shape& s, const std::vector<double>& v) {
    Tensor t = Tensor::empty(s);
    for (int64_t i = 0; i < t.numel(); i++) t.data<float>()[i] = float(v[size_t(i)]);
    return t;
}

// Uniform values in [-a, a], rounded to `t` and held as f32 (so that every type starts from them).
Tensor random_values(const Shape& s, float a, uint64_t seed, DType t = DType::F32) {
    Rng rng(seed);
    return Tensor::uniform(s, -a, a, rng).to(t).to(DType::F32);
}

struct Run {
    Tensor y, dqkv, saved;
};

// Forward and backward on `device` in dtype `t`, results as f32 on the CPU.
Run run_attention(const Tensor& qkv, const Tensor& dy, int64_t heads, AttentionKind kind, Device device,
                  DType t = DType::F32, const AttentionDropout& drop = {}) {
    Tensor x = qkv.to(t).to(device), g = dy.to(t).to(device), saved;
    Tensor y = causal_self_attention(x, heads, kind, drop, &saved);
    Tensor dqkv = causal_self_attention_backward(x, y, saved, g, heads, kind, drop);
    return {host(y), host(dqkv), saved.to(Device::CPU)};
}

const AttentionKind kKinds[] = {AttentionKind::Textbook, AttentionKind::Flash};

}  // namespace

// ==== embedding ==================================================================================
//   W = [[0, 1, 2],      ids = [2, 0, 2]   →   y = [[6, 7, 8], [0, 1, 2], [6, 7, 8]]
//        [3, 4, 5],
//        [6, 7, 8],      dy = [[1, 1, 1], [2, 2, 2], [10, 20, 30]]
//        [9, 10, 11]]    dW += row 0: [2, 2, 2], row 2: [1, 1, 1] + [10, 20, 30] = [11, 21, 31]
TEST_CASE("embedding: rows looked up by id, and their gradients scattered back, on the CPU and CUDA",
          "[embedding][attention][lesson14][cpu][cuda]") {
    for (Device device : {Device::CPU, Device::CUDA}) {
        INFO(device_name(device));
        std::vector<float> w(12);
        for (int i = 0; i < 12; i++) w[size_t(i)] = float(i);
        const Tensor W = test::tensor_of({4, 3}, w, device);
        Tensor ids = Tensor::empty({3}, DType::I32);
        ids.data<int32_t>()[0] = 2, ids.data<int32_t>()[1] = 0, ids.data<int32_t>()[2] = 2;
        ids = ids.to(device);
        const Tensor y = host(embedding(ids, W));
        REQUIRE(y.shape() == Shape{3, 3});
        CHECK(y.get({0, 0}) == 6);
        CHECK(y.get({1, 2}) == 2);
        CHECK(y.get({2, 1}) == 7);
        Tensor dW = Tensor::zeros({4, 3}, DType::F32, device);
        embedding_backward(ids, test::tensor_of({3, 3}, {1, 1, 1, 2, 2, 2, 10, 20, 30}, device), dW);
        const Tensor g = host(dW);
        CHECK(g.get({0, 0}) == 2);
        CHECK(g.get({1, 1}) == 0);
        CHECK(g.get({2, 0}) == 11);
        CHECK(g.get({2, 2}) == 31);
        CHECK(g.get({3, 2}) == 0);

        Tensor bad = Tensor::zeros({2}, DType::I32);
        bad.data<int32_t>()[1] = 4;
        CHECK_THROWS_WITH(embedding(bad.to(device), W),
                          Contains("token id 4 at position 1 is outside the vocabulary [0, 4)"));
        CHECK_THROWS_WITH(embedding(Tensor::zeros({2}, DType::F32, device), W), Contains("'ids'"));
    }
}

TEST_CASE("embedding: the scatter-add of many repeated tokens gives one set of bits on every backend and thread count",
          "[embedding][attention][lesson14][cpu][cuda]") {
    Rng rng(3);
    const int64_t N = 500, V = 7, C = 40;
    Tensor ids = Tensor::empty({N}, DType::I32);
    for (int64_t n = 0; n < N; n++) ids.data<int32_t>()[n] = int32_t(rng.next_below(V));
    const Tensor dy = Tensor::uniform({N, C}, -1, 1, rng);
    const auto grad = [&](Device device) {
        Tensor dW = Tensor::zeros({V, C}, DType::F32, device);
        embedding_backward(ids.to(device), dy.to(device), dW);
        return dW.to(Device::CPU);
    };
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    const Tensor one = grad(Device::CPU);
    omp_set_num_threads(2);
    const Tensor two = grad(Device::CPU);
    omp_set_num_threads(saved);
    test::require_identical(two, one);
    test::under_schedules([&] { test::require_identical(grad(Device::CUDA), one); });
    // and the sum is the sum: row v of dW = Σ_{n: ids[n] = v} dy[n]
    double want = 0.0;
    for (int64_t n = 0; n < N; n++)
        if (ids.data<int32_t>()[n] == 3) want += dy.get({n, 5});
    CHECK(one.get({3, 5}) == Approx(want).epsilon(1e-5));
}

// ==== softmax ====================================================================================
//   softmax([1, 2, 3]) = [e⁻², e⁻¹, 1] / (e⁻² + e⁻¹ + 1) = [0.0900306, 0.2447285, 0.6652410]
TEST_CASE("softmax: rows sum to 1, no overflow far from 0, backward is y ⊙ (dy − Σ dy·y)",
          "[softmax][attention][lesson14][cpu][cuda]") {
    for (Device device : {Device::CPU, Device::CUDA}) {
        INFO(device_name(device));
        const Tensor y = host(softmax(test::tensor_of({2, 3}, {1, 2, 3, 1001, 1002, 1003}, device)));
        for (int64_t r = 0; r < 2; r++) {
            CHECK(y.get({r, 0}) == Approx(0.0900306).epsilon(1e-6));
            CHECK(y.get({r, 1}) == Approx(0.2447285).epsilon(1e-6));
            CHECK(y.get({r, 2}) == Approx(0.6652410).epsilon(1e-6));
        }
        // dy = [1, 0, 0]: dx = y ⊙ (e₀ − y₀) = [y₀(1 − y₀), −y₀y₁, −y₀y₂]
        const Tensor dx = host(softmax_backward(y.to(device), test::tensor_of({2, 3}, {1, 0, 0, 1, 0, 0}, device)));
        const double y0 = 0.0900306, y1 = 0.2447285, y2 = 0.6652410;
        CHECK(dx.get({0, 0}) == Approx(y0 * (1 - y0)).epsilon(1e-5));
        CHECK(dx.get({1, 1}) == Approx(-y0 * y1).epsilon(1e-5));
        CHECK(dx.get({1, 2}) == Approx(-y0 * y2).epsilon(1e-5));
    }
    Rng rng(5);
    const Tensor x = Tensor::uniform({37, 300}, -8, 8, rng);
    test::under_schedules([&] { test::require_close(softmax(x.to(Device::CUDA)), softmax(x), 2e-6); });
}

// ==== causal self-attention ======================================================================
TEST_CASE("attention: the reference's gradients are the derivatives of its forward (central differences, double)",
          "[attention][lesson14][cpu]") {
    const Sizes z{1, 5, 4, 2};
    const AttentionDropout drop{0.3f, 99, 7};
    const std::vector<double> qkv = values_of(random_values({1, 5, 12}, 1.0f, 1));
    const std::vector<double> r = values_of(random_values({1, 5, 4}, 1.0f, 2));
    const Ref ref = ref_attention(qkv, z, &r, drop);
    const auto loss = [&](const std::vector<double>& x) {
        const std::vector<double> y = ref_attention(x, z, nullptr, drop).y;
        double l = 0.0;
        for (size_t i = 0; i < y.size(); i++) l += y[i] * r[i];
        return l;
    };
    for (size_t i = 0; i < qkv.size(); i++) {
        std::vector<double> plus = qkv, minus = qkv;
        plus[i] += 1e-6, minus[i] -= 1e-6;
        INFO("element " << i);
        CHECK(ref.dqkv[i] == Approx((loss(plus) - loss(minus)) / 2e-6).margin(1e-7));
    }
}

TEST_CASE("attention: both versions compute the reference's output and gradients, on the CPU and CUDA, across tiles",
          "[attention][lesson14][cpu][cuda]") {
    // T = 100 spans two of the CPU's 64-row tiles and four of CUDA's 32 (a partial last one);
    // T = 3 is less than one tile; D = 8 and 16.
    for (const Sizes z : {Sizes{2, 100, 16, 2}, Sizes{3, 3, 16, 1}, Sizes{1, 70, 24, 3}}) {
        for (const AttentionDropout drop : {AttentionDropout{}, AttentionDropout{0.25f, 1234, 55}}) {
            const Tensor qkv = random_values({z.B, z.T, 3 * z.C}, 1.5f, 11);
            const Tensor dy = random_values({z.B, z.T, z.C}, 1.0f, 12);
            const std::vector<double> g = values_of(dy);
            const Ref ref = ref_attention(values_of(qkv), z, &g, drop);
            const Tensor want_y = tensor_from({z.B, z.T, z.C}, ref.y), want_d = tensor_from(qkv.shape(), ref.dqkv);
            for (AttentionKind kind : kKinds)
                for (Device device : {Device::CPU, Device::CUDA}) {
                    INFO("B=" << z.B << " T=" << z.T << " C=" << z.C << " H=" << z.H << " dropout " << drop.p << " "
                              << attention_kind_name(kind) << " on " << device_name(device));
                    const Run r = run_attention(qkv, dy, z.H, kind, device, DType::F32, drop);
                    test::require_close(r.y, want_y, 2e-5);
                    test::require_close(r.dqkv, want_d, 2e-5);
                }
        }
    }
}

TEST_CASE("attention: FlashAttention's forward and backward equal the textbook version's",
          "[attention][lesson14][cpu][cuda]") {
    const Tensor qkv = random_values({2, 130, 3 * 32}, 2.0f, 21), dy = random_values({2, 130, 32}, 1.0f, 22);
    for (Device device : {Device::CPU, Device::CUDA}) {
        INFO(device_name(device));
        const Run textbook = run_attention(qkv, dy, 4, AttentionKind::Textbook, device);
        const Run flash = run_attention(qkv, dy, 4, AttentionKind::Flash, device);
        test::require_close(flash.y, textbook.y, 1e-5);
        test::require_close(flash.dqkv, textbook.dqkv, 1e-5);
        // what each keeps: P [B, H, T, T] in qkv's type, or the log-sum-exp f32 [B, H, T]
        CHECK(textbook.saved.shape() == Shape{2, 4, 130, 130});
        CHECK(flash.saved.shape() == Shape{2, 4, 130});
        CHECK(flash.saved.dtype() == DType::F32);
    }
}

// The causal mask: a position's output may not depend on anything after it. Changing the tokens
// from position t + 1 on (their q, k and v) must leave rows 0..t of y exactly as they were, and
// leave dq, dk, dv of rows 0..t unchanged when dy is zero after t. (Chapter 14's exercise 2: a
// mask that lets query i see key i + 1 fails here.)
TEST_CASE("attention: no position sees the future — later tokens change nothing before them",
          "[attention][causal][lesson14][cpu][cuda]") {
    const int64_t B = 2, T = 40, C = 16, t = 17;
    const Tensor qkv = random_values({B, T, 3 * C}, 1.0f, 31);
    Tensor later = qkv.clone();  // positions t + 1 .. T − 1 replaced
    const Tensor noise = random_values({B, T, 3 * C}, 1.0f, 32);
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = t + 1; s < T; s++)
            for (int64_t c = 0; c < 3 * C; c++) later.set({b, s, c}, noise.get({b, s, c}));
    Tensor dy = random_values({B, T, C}, 1.0f, 33);
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = t + 1; s < T; s++)
            for (int64_t c = 0; c < C; c++) dy.set({b, s, c}, 0.0);
    for (AttentionKind kind : kKinds)
        for (Device device : {Device::CPU, Device::CUDA}) {
            INFO(attention_kind_name(kind) << " on " << device_name(device));
            const Run a = run_attention(qkv, dy, 2, kind, device), b = run_attention(later, dy, 2, kind, device);
            int64_t y_changed = 0, grad_changed = 0;  // values of positions 0..t that the later tokens moved
            for (int64_t n = 0; n < B; n++)
                for (int64_t s = 0; s <= t; s++) {
                    for (int64_t c = 0; c < C; c++) y_changed += a.y.get({n, s, c}) != b.y.get({n, s, c});
                    for (int64_t c = 0; c < 3 * C; c++) grad_changed += a.dqkv.get({n, s, c}) != b.dqkv.get({n, s, c});
                }
            CHECK(y_changed == 0);
            CHECK(grad_changed == 0);
            // and the first position sees only itself: its output is its own v
            for (int64_t c = 0; c < C; c++) CHECK(a.y.get({0, 0, c}) == Approx(qkv.get({0, 0, 2 * C + c})).epsilon(1e-6));
        }
}

TEST_CASE("attention: the same bits on 1 and 2 threads, and under every emulator schedule",
          "[attention][lesson14][cpu][cuda]") {
    const Tensor qkv = random_values({3, 70, 48}, 1.0f, 41), dy = random_values({3, 70, 16}, 1.0f, 42);
    for (AttentionKind kind : kKinds) {
        INFO(attention_kind_name(kind));
        const int saved = omp_get_max_threads();
        omp_set_num_threads(1);
        const Run one = run_attention(qkv, dy, 2, kind, Device::CPU);
        omp_set_num_threads(2);
        const Run two = run_attention(qkv, dy, 2, kind, Device::CPU);
        omp_set_num_threads(saved);
        test::require_identical(two.y, one.y);
        test::require_identical(two.dqkv, one.dqkv);
        const Run first = run_attention(qkv, dy, 2, kind, Device::CUDA);
        test::under_schedules([&] {
            const Run again = run_attention(qkv, dy, 2, kind, Device::CUDA);
            test::require_identical(again.y, first.y);
            test::require_identical(again.dqkv, first.dqkv);
        });
    }
}

TEST_CASE("attention: f16 and bf16 within chapter 09's bound of f32, both versions, CPU and CUDA",
          "[attention][lowp][lesson14][cpu][cuda]") {
    const Sizes z{2, 45, 16, 2};
    for (DType t : {DType::F16, DType::BF16}) {
        const test::LowFormat f = test::low_format(t);
        const Tensor qkv = random_values({z.B, z.T, 3 * z.C}, 1.5f, 51, t), dy = random_values({z.B, z.T, z.C}, 1.0f, 52, t);
        const std::vector<double> g = values_of(dy);
        const Ref ref = ref_attention(values_of(qkv), z, &g);
        for (AttentionKind kind : kKinds)
            for (Device device : {Device::CPU, Device::CUDA}) {
                INFO(dtype_name(t) << " " << attention_kind_name(kind) << " on " << device_name(device));
                const Run r = run_attention(qkv, dy, z.H, kind, device, t);
                const double r_y = kind == AttentionKind::Flash ? 1 : 2, f32 = 2.0 * double(z.T) * 0x1p-24;
                int64_t bad = 0;
                for (int64_t i = 0; i < r.y.numel(); i++) {
                    const double S = ref.y_abs[size_t(i)];
                    bad += std::fabs(r.y.data<float>()[i] - ref.y[size_t(i)]) > (r_y * f.u + f32) * S + f.tiny;
                }
                CHECK(bad == 0);
                for (int64_t i = 0; i < r.dqkv.numel(); i++) {
                    const bool is_v = i / z.C % 3 == 2;
                    const double S = is_v ? ref.dv_abs[size_t(i)] : ref.dq_abs[size_t(i)], rr = is_v ? 2 : 4;
                    const double err = std::fabs(r.dqkv.data<float>()[i] - ref.dqkv[size_t(i)]);
                    if (err > (rr * f.u + f32) * S + f.tiny && bad++ == 0)
                        FAIL_CHECK("dqkv element " << i << ": " << r.dqkv.data<float>()[i] << " against "
                                                   << ref.dqkv[size_t(i)] << ", bound " << (rr * f.u + f32) * S);
                }
                CHECK(bad == 0);
            }
    }
}

TEST_CASE("attention with a KV cache: new positions against the cached ones are the full forward's rows",
          "[attention][kvcache][lesson14][cpu][cuda]") {
    const int64_t B = 2, T = 37, C = 16, H = 4, Tmax = 50;
    const Tensor qkv = random_values({B, T, 3 * C}, 1.0f, 61);
    for (Device device : {Device::CPU, Device::CUDA}) {
        INFO(device_name(device));
        Tensor saved;
        const Tensor y = host(causal_self_attention(qkv.to(device), H, AttentionKind::Flash, {}, &saved));
        // positions 0 .. 33 in one go, then 34, then 35 and 36: the caches fill as generation fills them
        Tensor k = random_values({B, Tmax, C}, 9.0f, 62).to(device), v = random_values({B, Tmax, C}, 9.0f, 63).to(device);
        const auto part = [&](int64_t first, int64_t n) {
            Tensor out = Tensor::empty({B, n, 3 * C});
            for (int64_t b = 0; b < B; b++)
                for (int64_t t = 0; t < n; t++)
                    for (int64_t c = 0; c < 3 * C; c++) out.set({b, t, c}, qkv.get({b, first + t, c}));
            return out.to(device);
        };
        const Tensor y0 = host(cached_attention(part(0, 34), k, v, 0, H));
        const Tensor y1 = host(cached_attention(part(34, 1), k, v, 34, H));
        const Tensor y2 = host(cached_attention(part(35, 2), k, v, 35, H));
        for (int64_t b = 0; b < B; b++)
            for (int64_t c = 0; c < C; c++) {
                CHECK(y0.get({b, 33, c}) == Approx(y.get({b, 33, c})).epsilon(1e-5));
                CHECK(y1.get({b, 0, c}) == Approx(y.get({b, 34, c})).epsilon(1e-5));
                CHECK(y2.get({b, 1, c}) == Approx(y.get({b, 36, c})).epsilon(1e-5));
                CHECK(host(k).get({b, 36, c}) == qkv.get({b, 36, C + c}));  // the keys it was given, kept
            }
        CHECK_THROWS_WITH(cached_attention(part(0, 2), k, v, 49, H), Contains("do not fit in the cache's 50"));
    }
}

TEST_CASE("attention: wrong shapes are refused, naming the tensor", "[attention][lesson14][cpu]") {
    Tensor saved;
    CHECK_THROWS_WITH(causal_self_attention(Tensor::zeros({2, 5, 10}), 2, AttentionKind::Flash, {}, &saved),
                      Contains("qkv should be [B, T, 3C]"));
    CHECK_THROWS_WITH(causal_self_attention(Tensor::zeros({2, 5, 12}), 3, AttentionKind::Flash, {}, &saved),
                      Contains("4 channels do not split into 3 heads"));
    const Tensor qkv = Tensor::zeros({1, 4, 12});
    const Tensor y = causal_self_attention(qkv, 2, AttentionKind::Flash, {}, &saved);
    CHECK_THROWS_WITH(causal_self_attention_backward(qkv, y, saved, y, 2, AttentionKind::Textbook, {}),
                      Contains("saved (P)"));
    CHECK_THROWS_WITH(causal_self_attention_backward(qkv, y, saved, Tensor::zeros({1, 4, 5}), 2, AttentionKind::Flash, {}),
                      Contains("'dy'"));
}
