// test_tf32.cpp — TF32 for f32 products on CUDA (cuda::set_tf32, the trainers' --tf32): the
// emulator's cvt.rna.tf32.f32 on hand-picked bit patterns and its mma.m16n8k8.tf32 at the PTX
// ISA's fragment places; the engine's f32 GEMM with TF32 on against a reference from rna-rounded
// inputs; TF32 off giving the CUDA cores' bits. (The convolutions' three passes: test_conv.cpp.)
//
// The reference's tolerance: with TF32 on, each product of two tf32 values (11 significant bits
// each) is exact in f32, and the K products are added in f32, each addition rounded once, so
// |got − Σ r(a)·r(b)| ≤ K·2⁻²⁴·Σ|r(a)·r(b)|, and alpha, beta and the store add three roundings:
// (K + 3)·2⁻²⁴·S with S = |alpha|·Σ|r(a)·r(b)| + |beta|·|c|, per element. Forgetting the rounding
// (the tensor cores then truncate), a product's error is up to 2⁻¹⁰ relative: far outside it.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "core/cuda_memory.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "fixtures.h"
#include "gemm_versions.h"
#include "ops/all.h"
#ifndef KILN_CUDA
#include "kiln_cuda.h"  // the emulator: its cvt, mma and counters
#endif

using namespace kiln;
using test::require_identical;
using test::under_schedules;

namespace {

// TF32 on for a scope (and off after it, as every other test expects).
struct ScopedTf32 {
    explicit ScopedTf32(bool on) { cuda::set_tf32(on); }
    ~ScopedTf32() { cuda::set_tf32(false); }
};

double rna(float x) { return test::tf32_reference(x); }

std::vector<float> host(const Tensor& t) {
    const Tensor c = t.to(Device::CPU);
    return std::vector<float>(c.data<float>(), c.data<float>() + c.numel());
}

// C = alpha·op(A)·op(B) + beta·C by cuda::gemm with TF32 on, against the reference from rna-rounded
// A and B summed in double; and the un-rounded product, which must miss that tolerance somewhere.
// Leading dimensions padded, so that a size mixed up with a stride fails. Returns how many elements
// of the un-rounded product lie outside the tolerance.
int64_t check_tf32_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, float beta, Rng& rng) {
    INFO("M = " << M << ", N = " << N << ", K = " << K << ", trans_a = " << ta << ", trans_b = " << tb
                << ", beta = " << beta);
    const int64_t a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
    const int64_t lda = a_cols + 3, ldb = b_cols + 1, ldc = N + 2;
    const Tensor A = Tensor::uniform({a_rows, lda}, -1.0f, 1.0f, rng), B = Tensor::uniform({b_rows, ldb}, -1.0f, 1.0f, rng);
    const Tensor C = Tensor::uniform({M, ldc}, -1.0f, 1.0f, rng);
    const float* a = A.data<float>();
    const float* b = B.data<float>();
    const float* c = C.data<float>();
    Tensor got = C.to(Device::CUDA);
    {
        ScopedTf32 tf32(true);
#ifndef KILN_CUDA
        const uint64_t before = emu::warp_calls_run();
#endif
        cuda::gemm(ta, tb, M, N, K, alpha, A.to(Device::CUDA).data<float>(), lda, B.to(Device::CUDA).data<float>(), ldb,
                   beta, got.data<float>(), ldc);
#ifndef KILN_CUDA
        CHECK(emu::warp_calls_run() > before);  // the tensor cores ran it
#endif
    }
    const std::vector<float> g = host(got);
    int64_t plain_outside = 0;
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double want = 0, plain = 0, s = 0;
            for (int64_t k = 0; k < K; k++) {
                const float x = ta ? a[k * lda + m] : a[m * lda + k], y = tb ? b[n * ldb + k] : b[k * ldb + n];
                want += rna(x) * rna(y), plain += double(x) * y, s += std::fabs(rna(x) * rna(y));
            }
            const double cv = c[m * ldc + n];
            want = alpha * want + beta * cv, plain = alpha * plain + beta * cv;
            const double tol = double(K + 3) * std::ldexp(std::fabs(alpha) * s + std::fabs(beta * cv), -24);
            const double v = g[size_t(m * ldc + n)];
            INFO("C[" << m << ", " << n << "] = " << v << ", want " << want << " ± " << tol);
            REQUIRE(std::fabs(v - want) <= tol);
            plain_outside += std::fabs(plain - want) > tol;
        }
    return plain_outside;
}

}  // namespace

#ifndef KILN_CUDA
TEST_CASE("the emulator's cvt.rna.tf32.f32: nearest, ties away from zero, 10 mantissa bits", "[cuda][tf32]") {
    using emu::ptx::cvt_rna_tf32;
    const struct {
        uint32_t in, out;
        const char* what;
    } cases[] = {
        {0x3f800000u, 0x3f800000u, "1 is tf32 already"},
        {0x3f800fffu, 0x3f800000u, "below half of the kept unit: down"},
        {0x3f801000u, 0x3f802000u, "a tie, even kept bit: away from zero (nearest-even would keep 1)"},
        {0x3f803000u, 0x3f804000u, "a tie, odd kept bit: away from zero"},
        {0xbf801000u, 0xbf802000u, "a negative tie: away from zero, towards -inf"},
        {0x3f801001u, 0x3f802000u, "above half: up"},
        {0x3fffffffu, 0x40000000u, "the carry moves into the exponent: 1.99999988 -> 2"},
        {0x3ffff000u, 0x40000000u, "a tie below 2 carries as well"},
        {0x7f7ff000u, 0x7f800000u, "a tie above the largest tf32: infinity"},
        {0x7f7fefffu, 0x7f7fe000u, "just below that tie: the largest tf32"},
        {0x00000fffu, 0x00000000u, "a subnormal below half a unit: zero"},
        {0x80000000u, 0x80000000u, "-0 stays -0"},
        {0x7f800000u, 0x7f800000u, "+inf"},
        {0xff800000u, 0xff800000u, "-inf"},
    };
    for (const auto& k : cases) {
        INFO(k.what << ": " << std::hex << k.in);
        CHECK(cvt_rna_tf32(float_of(k.in)) == k.out);
    }
    // NaNs stay NaNs, even one whose set bits are all among the 13 cleared (it must not become inf)
    for (uint32_t nan : {0x7fc00000u, 0x7f800001u, 0xff800fffu, 0x7fbfffffu}) {
        INFO(std::hex << nan);
        CHECK(std::isnan(float_of(cvt_rna_tf32(float_of(nan)))));
        CHECK((cvt_rna_tf32(float_of(nan)) & 0x1fffu) == 0);
    }
    // every result has its low 13 bits clear and is the nearest tf32, ties away (the rna reference)
    Rng rng(5);
    const Tensor r = Tensor::uniform({4096}, -1e6f, 1e6f, rng);
    for (int64_t i = 0; i < r.numel(); i++) {
        const float x = r.data<float>()[i];
        INFO(x);
        REQUIRE(double(float_of(cvt_rna_tf32(x))) == rna(x));
    }
}

namespace {

// One warp: d = a·b + c by the emulator's mma.m16n8k8.tf32, each lane passing the registers the
// PTX ISA's figures give it (A 16×8 and C, D 16×8 row-major, B 8×8 row-major here), g = lane / 4,
// t = lane % 4:  a = A[g][t], A[g+8][t], A[g][t+4], A[g+8][t+4];  b = B[t][g], B[t+4][g];
// c, d = C[g][2t], C[g][2t+1], C[g+8][2t], C[g+8][2t+1].
__global__ void mma_tf32_places(const float* A, const float* B, const float* C, float* D) {
    const int l = int(threadIdx.x), g = l / 4, t = l % 4;
    const uint32_t a[4] = {bits_of(A[g * 8 + t]), bits_of(A[(g + 8) * 8 + t]), bits_of(A[g * 8 + t + 4]),
                           bits_of(A[(g + 8) * 8 + t + 4])};
    const uint32_t b[2] = {bits_of(B[t * 8 + g]), bits_of(B[(t + 4) * 8 + g])};
    float d[4] = {C[g * 8 + 2 * t], C[g * 8 + 2 * t + 1], C[(g + 8) * 8 + 2 * t], C[(g + 8) * 8 + 2 * t + 1]};
    emu::ptx::mma_m16n8k8_tf32(d, a, b);
    D[g * 8 + 2 * t] = d[0], D[g * 8 + 2 * t + 1] = d[1], D[(g + 8) * 8 + 2 * t] = d[2], D[(g + 8) * 8 + 2 * t + 1] = d[3];
}

// D = A·B + C on the emulator, for 16×8 A, 8×8 B, 16×8 C.
std::vector<float> mma_tf32_once(const std::vector<float>& a, const std::vector<float>& b, const std::vector<float>& c) {
    const auto device = [](const std::vector<float>& v) {
        return test::tensor_of({int64_t(v.size())}, v, Device::CUDA);
    };
    const Tensor A = device(a), B = device(b), C = device(c);
    Tensor D = Tensor::zeros({16 * 8}).to(Device::CUDA);
    KILN_LAUNCH(mma_tf32_places, 1, 32, 0)(A.data<float>(), B.data<float>(), C.data<float>(), D.data<float>());
    KILN_CHECK_LAUNCH(mma_tf32_places, 1, 32);
    return host(D);
}

}  // namespace

TEST_CASE("the emulator's mma.m16n8k8.tf32 takes each value from its PTX fragment place", "[cuda][tf32][mma]") {
    // Small integers, all different where it matters, so that every product and sum is exact
    // and a value read from a wrong place changes the result.
    std::vector<float> a(16 * 8), b(8 * 8), c(16 * 8);
    for (int i = 0; i < 16; i++)
        for (int k = 0; k < 8; k++) a[size_t(i * 8 + k)] = float((i * 8 + k) % 13 - 6);
    for (int k = 0; k < 8; k++)
        for (int j = 0; j < 8; j++) b[size_t(k * 8 + j)] = float((k * 5 + j * 3) % 11 - 5);
    for (int i = 0; i < 16 * 8; i++) c[size_t(i)] = float(i % 7);
    const std::vector<float> d = mma_tf32_once(a, b, c);
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 8; j++) {
            float want = c[size_t(i * 8 + j)];
            for (int k = 0; k < 8; k++) want += a[size_t(i * 8 + k)] * b[size_t(k * 8 + j)];
            INFO("D[" << i << "][" << j << "]");
            CHECK(d[size_t(i * 8 + j)] == want);
        }
}

TEST_CASE("the emulator's tensor cores truncate an operand that was not rounded to tf32", "[cuda][tf32][mma]") {
    // 1 + 3·2⁻¹² has bits below tf32's 10: the tensor cores read 1 (the low 13 bits ignored);
    // rounded first (cvt.rna) it is 1 + 2⁻¹⁰. Each D = Σ_k a·1 over 8 values of k.
    const float x = 1.0f + 3.0f / 4096.0f;
    const std::vector<float> ones(8 * 8, 1.0f), zeros(16 * 8, 0.0f);
    CHECK(mma_tf32_once(std::vector<float>(16 * 8, x), ones, zeros)[0] == 8.0f);
    const float rounded = float_of(emu::ptx::cvt_rna_tf32(x));
    CHECK(rounded == 1.0f + 1.0f / 1024.0f);
    CHECK(mma_tf32_once(std::vector<float>(16 * 8, rounded), ones, zeros)[0] == 8.0f + 8.0f / 1024.0f);
}
#endif

TEST_CASE("cuda gemm with TF32: rna-rounded operands, f32 sums, every transpose", "[cuda][tf32][gemm][lesson09]") {
    Rng rng(61);
    // one mma block; tile edges and K not a multiple of the 16-wide step; the 128×128 tiles
    // (2×2 of them fill the emulator's 1 or 2 SMs twice over)
    const int64_t shapes[][3] = {{16, 16, 16}, {17, 33, 65}, {65, 63, 17}, {130, 129, 40}};
    int64_t plain_outside = 0;
    under_schedules([&] {
        for (auto [M, N, K] : shapes)
            for (bool ta : {false, true})
                for (bool tb : {false, true})
                    for (float beta : {0.0f, 0.5f}) plain_outside += check_tf32_gemm(ta, tb, M, N, K, 1.25f, beta, rng);
    });
    CHECK(plain_outside > 0);  // the un-rounded f32 product is not what TF32 computes
}

TEST_CASE("cuda gemm with TF32 rounds to nearest (not truncating), and without it keeps f32", "[cuda][tf32][gemm][lesson09]") {
    // A = 1 + 3·2⁻¹² everywhere, B = 1: each C value is K·r(a). Rounded to nearest, r(a) = 1 + 2⁻¹⁰;
    // truncated, 1; f32 keeps 1 + 3·2⁻¹². All three sums are exact in f32 at K = 64.
    const int64_t M = 32, N = 24, K = 64;
    const float x = 1.0f + 3.0f / 4096.0f;
    const Tensor A = Tensor::full({M, K}, double(x)).to(Device::CUDA), B = Tensor::ones({K, N}).to(Device::CUDA);
    const auto product = [&](bool tf32) {
        ScopedTf32 scope(tf32);
        Tensor C = Tensor::zeros({M, N}).to(Device::CUDA);
        cuda::gemm(false, false, M, N, K, 1.0f, A.data<float>(), K, B.data<float>(), N, 0.0f, C.data<float>(), N);
        return host(C);
    };
    const std::vector<float> on = product(true), off = product(false);
    for (size_t i = 0; i < on.size(); i++) {
        INFO(i);
        REQUIRE(on[i] == float(K) * (1.0f + 1.0f / 1024.0f));
        REQUIRE(off[i] == float(K) * x);
    }
}

TEST_CASE("cuda gemm with TF32 off gives the CUDA cores' bits (version 3's), no tensor core at work",
          "[cuda][tf32][gemm][lesson09]") {
    Rng rng(67);
    cuda::set_tf32(true);  // on, then off again: the switch must leave nothing behind
    cuda::set_tf32(false);
    REQUIRE(!cuda::tf32_on());
    const int64_t shapes[][3] = {{17, 33, 65}, {130, 129, 40}};
    for (auto [M, N, K] : shapes)
        for (bool ta : {false, true})
            for (bool tb : {false, true}) {
                INFO("M = " << M << ", N = " << N << ", K = " << K << ", trans_a " << ta << ", trans_b " << tb);
                const Tensor A = Tensor::uniform({ta ? K : M, ta ? M : K}, -1.0f, 1.0f, rng).to(Device::CUDA);
                const Tensor B = Tensor::uniform({tb ? N : K, tb ? K : N}, -1.0f, 1.0f, rng).to(Device::CUDA);
                Tensor C = Tensor::zeros({M, N}).to(Device::CUDA), C3 = Tensor::zeros({M, N}).to(Device::CUDA);
#ifndef KILN_CUDA
                const uint64_t before = emu::warp_calls_run();
#endif
                cuda::gemm(ta, tb, M, N, K, 1.0f, A.data<float>(), ta ? M : K, B.data<float>(), tb ? K : N, 0.0f,
                           C.data<float>(), N);
#ifndef KILN_CUDA
                CHECK(emu::warp_calls_run() == before);
#endif
                cuda::lab::gemm_register_tiled(ta, tb, M, N, K, 1.0f, A.data<float>(), ta ? M : K, B.data<float>(),
                                               tb ? K : N, 0.0f, C3.data<float>(), N);
                require_identical(C, C3);
            }
}
