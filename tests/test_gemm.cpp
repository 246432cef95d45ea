// test_gemm.cpp — kiln::cpu::gemm against the textbook triple loop (gemm_reference), for odd
// shapes, every transpose combination, padded rows, general alpha/beta; plus determinism:
// the same bits whatever the number of OpenMP threads; each micro-kernel the CPU can run; a
// small product read in place and a packed A (PackedA) giving gemm's own bits. The CUDA GEMMs
// (chapter 04: the engine's version 6, its 128×128 tiles, the split along K, the lab's versions 1
// to 3, alpha = 0 or K = 0, matmul on the device) against cpu::gemm: make test T='[cuda][gemm]'.
// In f16 and bf16 (chapter 09), on the CPU and on CUDA, against the f32 GEMM on the same values
// within the bound of one rounding (lowp_check.h): make test T='[gemm][dtype]'; and on each CPU
// path (chapter 09): the same bits on the portable and the vector paths, every layout of the bf16
// pairs the same bits, and the paths that sum in their own order (vdpbf16ps, AMX tiles, emulated
// and real) within the f32 sums' bound of the FMA path: make test T='[gemm][lowp]'. On the tensor
// cores (chapter 09: the lab's wmma version 5, the engine's mma.sync version 7 and cp.async version 8,
// and matmul's choice of them), in f16 and bf16 against the f32 CPU: make test T='[gemm][wmma]'.
//
//   make test T='[gemm]'   (every backend and type)
#include <omp.h>

#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "fixtures.h"
#include "gemm_versions.h"
#include "lowp_check.h"
#include "ops/all.h"
#include "ops/cpu/gemm.h"
#include "ops/cpu/gemm_blocks.h"
#include "ops/cpu/gemm_tile.h"
#include "ops/ops.h"
#ifndef KILN_CUDA
#include "kiln_cuda.h"  // the emulator: its wmma, launches and counters
#else
#include <cuda_runtime.h>
#endif

using kiln::cpu::gemm;
using kiln::cpu::gemm_reference;

namespace {

std::vector<float> random_vector(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng);
    return v;
}

// One GEMM problem with its operands stored as the arguments say (pad = extra floats at the
// end of each row, so that lda/ldb/ldc exceed the row length).
struct Case {
    bool ta, tb;
    int64_t M, N, K;
    float alpha, beta;
    int64_t pad = 0;
    int64_t lda() const { return (ta ? M : K) + pad; }
    int64_t ldb() const { return (tb ? K : N) + pad; }
    int64_t ldc() const { return N + pad; }
    size_t a_size() const { return static_cast<size_t>((ta ? K : M) * lda()); }
    size_t b_size() const { return static_cast<size_t>((tb ? N : K) * ldb()); }
    size_t c_size() const { return static_cast<size_t>(M * ldc()); }
};

std::vector<float> abs_of(std::vector<float> v) {
    for (float& x : v) x = std::fabs(x);
    return v;
}

// Runs gemm and gemm_reference on the same inputs and checks each C element within the
// rounding-error bound of a K-term dot product:
//   |got - want| <= 2 (K+2) eps · (|alpha| Σ_k |a_ik||b_kj| + |beta||c_ij|)
// (the bound is computed with a second reference product on absolute values).
void check_case(const Case& c, uint32_t seed = 1) {
    INFO("ta=" << c.ta << " tb=" << c.tb << " M=" << c.M << " N=" << c.N << " K=" << c.K
               << " alpha=" << c.alpha << " beta=" << c.beta << " pad=" << c.pad);
    const auto A = random_vector(c.a_size(), seed), B = random_vector(c.b_size(), seed + 1);
    const auto C0 = random_vector(c.c_size(), seed + 2);
    auto got = C0, want = C0, bound = abs_of(C0);
    gemm(c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.data(), c.lda(), B.data(), c.ldb(), c.beta,
         got.data(), c.ldc());
    gemm_reference(c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.data(), c.lda(), B.data(), c.ldb(),
                   c.beta, want.data(), c.ldc());
    const auto absA = abs_of(A), absB = abs_of(B);
    gemm_reference(c.ta, c.tb, c.M, c.N, c.K, std::fabs(c.alpha), absA.data(), c.lda(),
                   absB.data(), c.ldb(), std::fabs(c.beta), bound.data(), c.ldc());
    const float eps = std::numeric_limits<float>::epsilon();
    int64_t bad = 0;
    for (int64_t i = 0; i < c.M; ++i)
        for (int64_t j = 0; j < c.N; ++j) {
            const size_t at = static_cast<size_t>(i * c.ldc() + j);
            const float tol = 2.0f * (c.K + 2) * eps * bound[at] + 1e-30f;
            if (!(std::fabs(got[at] - want[at]) <= tol)) {
                if (bad++ < 3)
                    UNSCOPED_INFO("C[" << i << "," << j << "] = " << got[at] << ", reference "
                                       << want[at] << ", tolerance " << tol);
            }
        }
    CHECK(bad == 0);
    // The padding at the end of each C row is not C: it must be left as it was.
    for (int64_t i = 0; i < c.M; ++i)
        for (int64_t j = c.N; j < c.ldc(); ++j) {
            const size_t at = static_cast<size_t>(i * c.ldc() + j);
            REQUIRE(got[at] == C0[at]);
        }
}

// C = op(A)·B (A M×K, B K×N, or N×K when trans_b) at every fused kernel's level: the same bits
// on each.
void check_same_bits_on_fused_levels(int64_t M, int64_t N, int64_t K, const std::vector<float>& A,
                                     const std::vector<float>& B, bool trans_b) {
    const auto C = kiln::test::under_levels(kiln::test::fused_gemm_levels(), [&] {
        std::vector<float> c(size_t(M * N));
        gemm(false, trans_b, M, N, K, 1.0f, A.data(), K, B.data(), trans_b ? K : N, 0.0f, c.data(), N);
        return c;
    });
    for (size_t i = 1; i < C.size(); ++i)
        CHECK(std::memcmp(C[i].data(), C[0].data(), C[0].size() * sizeof(float)) == 0);
}

}  // namespace

TEST_CASE("gemm matches the reference for odd shapes, all transposes", "[gemm][cpu][lesson03]") {
    const int64_t sizes[] = {1, 7, 13, 31, 65, 127, 257};
    for (bool ta : {false, true})
        for (bool tb : {false, true})
            for (int64_t s : sizes) {
                check_case({ta, tb, s, s, s, 1.0f, 0.0f});
                check_case({ta, tb, s, 2 * s + 3, (s + 1) / 2, 1.0f, 0.0f});  // mixed
            }
}

TEST_CASE("gemm matches the reference for mixed and layer shapes", "[gemm][cpu][lesson03]") {
    const int64_t shapes[][3] = {
        {1, 1, 1},     {1, 1000, 1},   {1000, 1, 1},  {1, 1, 1000},  {3, 5, 600},
        {64, 64, 64},  {64, 100, 784}, {256, 256, 784}, {10, 576, 25}, {20, 64, 250},
        {13, 33, 514}, {481, 37, 19},  {97, 4103, 3},  {12, 32, 256}, {24, 64, 513},
    };
    for (bool ta : {false, true})
        for (bool tb : {false, true})
            for (const auto& s : shapes) check_case({ta, tb, s[0], s[1], s[2], 1.0f, 0.0f});
}

TEST_CASE("gemm handles row strides larger than the rows", "[gemm][cpu][lesson03]") {
    for (bool ta : {false, true})
        for (bool tb : {false, true})
            for (int64_t pad : {1, 5, 16, 33}) {
                check_case({ta, tb, 37, 45, 29, 1.0f, 0.0f, pad});
                check_case({ta, tb, 130, 70, 300, 0.5f, 2.0f, pad});
            }
}

TEST_CASE("gemm applies alpha and beta", "[gemm][cpu][lesson03]") {
    const float alphas[] = {1.0f, -1.0f, 0.5f, 3.25f};
    const float betas[] = {0.0f, 1.0f, -1.0f, 0.25f};
    for (bool ta : {false, true})
        for (float alpha : alphas)
            for (float beta : betas) {
                check_case({ta, !ta, 19, 41, 67, alpha, beta});
                check_case({ta, ta, 100, 150, 600, alpha, beta});  // several K blocks
            }
}

TEST_CASE("gemm with alpha == 0 or K == 0 only scales C", "[gemm][cpu][lesson03]") {
    std::vector<float> C = {1, 2, 3, 4, 5, 6};
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> A(6, nan), B(6, nan);  // never read
    gemm(false, false, 2, 3, 2, 0.0f, A.data(), 2, B.data(), 3, 2.0f, C.data(), 3);
    CHECK(C == std::vector<float>{2, 4, 6, 8, 10, 12});
    gemm<float>(false, false, 2, 3, 0, 1.0f, nullptr, 0, nullptr, 3, 0.5f, C.data(), 3);
    CHECK(C == std::vector<float>{1, 2, 3, 4, 5, 6});
    gemm<float>(false, false, 2, 3, 0, 1.0f, nullptr, 0, nullptr, 3, 0.0f, C.data(), 3);
    CHECK(C == std::vector<float>(6, 0.0f));
    gemm<float>(false, false, 0, 0, 5, 1.0f, nullptr, 5, nullptr, 0, 0.0f, nullptr, 0);  // nothing
}

TEST_CASE("gemm with beta == 0 ignores NaN in C", "[gemm][cpu][lesson03]") {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (bool ta : {false, true})
        for (bool tb : {false, true})
            for (int64_t s : {1, 13, 65, 200}) {
                const int64_t M = s, N = s + 7, K = s + 3;
                const auto A = random_vector(static_cast<size_t>(M * K), 5);
                const auto B = random_vector(static_cast<size_t>(K * N), 6);
                std::vector<float> C(static_cast<size_t>(M * N), nan);
                gemm(ta, tb, M, N, K, 1.0f, A.data(), ta ? M : K, B.data(), tb ? K : N, 0.0f,
                     C.data(), N);
                int64_t nans = 0;
                for (float x : C) nans += std::isnan(x) ? 1 : 0;
                CHECK(nans == 0);
            }
}

TEST_CASE("gemm works on unaligned pointers", "[gemm][cpu][lesson03]") {
    // Offsetting by one float makes every row start off the 32/64-byte grid.
    const int64_t M = 45, N = 71, K = 83;
    const auto A = random_vector(static_cast<size_t>(M * K + 1), 7);
    const auto B = random_vector(static_cast<size_t>(K * N + 1), 8);
    std::vector<float> got(static_cast<size_t>(M * N + 1), 0.0f), want = got;
    gemm(false, false, M, N, K, 1.0f, A.data() + 1, K, B.data() + 1, N, 0.0f, got.data() + 1, N);
    gemm_reference(false, false, M, N, K, 1.0f, A.data() + 1, K, B.data() + 1, N, 0.0f,
                   want.data() + 1, N);
    for (size_t i = 1; i < got.size(); ++i) REQUIRE(got[i] == Approx(want[i]).margin(1e-4));
}

TEST_CASE("gemm rejects bad strides with a message", "[gemm][cpu][lesson03]") {
    std::vector<float> A(16), B(16), C(16);
    CHECK_THROWS_WITH(gemm(false, false, 4, 4, 4, 1, A.data(), 3, B.data(), 4, 0, C.data(), 4),
                      Catch::Contains("lda=3"));
    CHECK_THROWS_WITH(gemm(false, true, 4, 4, 4, 1, A.data(), 4, B.data(), 2, 0, C.data(), 4),
                      Catch::Contains("ldb=2"));
    CHECK_THROWS_WITH(gemm(false, false, 4, 4, 4, 1, A.data(), 4, B.data(), 4, 0, C.data(), 1),
                      Catch::Contains("ldc=1"));
    CHECK_THROWS(gemm(false, false, -1, 4, 4, 1, A.data(), 4, B.data(), 4, 0, C.data(), 4));
}

TEST_CASE("gemm gives the same bits with 1, 2 and 3 threads", "[gemm][cpu][lesson03]") {
    const int saved = omp_get_max_threads();
    const int64_t shapes[][3] = {{300, 517, 700}, {64, 4096, 576}, {256, 100, 784},
                                 {1000, 40, 300}, {97, 97, 97}};
    for (bool ta : {false, true})
        for (bool tb : {false, true})
            for (const auto& s : shapes) {
                const int64_t M = s[0], N = s[1], K = s[2];
                INFO("ta=" << ta << " tb=" << tb << " M=" << M << " N=" << N << " K=" << K);
                const auto A = random_vector(static_cast<size_t>(M * K), 11);
                const auto B = random_vector(static_cast<size_t>(K * N), 12);
                const auto C0 = random_vector(static_cast<size_t>(M * N), 13);
                std::vector<std::vector<float>> results;
                for (int threads : {1, 2, 3}) {
                    omp_set_num_threads(threads);
                    auto C = C0;
                    gemm(ta, tb, M, N, K, 0.75f, A.data(), ta ? M : K, B.data(), tb ? K : N,
                         0.5f, C.data(), N);
                    results.push_back(std::move(C));
                }
                // Bitwise: compare the float patterns, not with a tolerance.
                CHECK(std::memcmp(results[0].data(), results[1].data(),
                                  results[0].size() * sizeof(float)) == 0);
                CHECK(std::memcmp(results[0].data(), results[2].data(),
                                  results[0].size() * sizeof(float)) == 0);
            }
    omp_set_num_threads(saved);
}

TEST_CASE("a product on the pool is cut into 1 to 4 rectangles a thread, as many for each", "[gemm][cpu][lesson03]") {
    using kiln::cpu::choose_grid;
    using kiln::cpu::rectangles_for;
    const double min = 2.0 * 256 * 256 * 256;  // gemm.cpp's RECTANGLE_MIN_FLOPS
    CHECK(rectangles_for(2.0 * 64 * 512 * 784, 2, min) == 2);     // the MLP's first layer: 0.77·min
    CHECK(rectangles_for(2.0 * 64 * 4096 * 576, 2, min) == 8);    // a conv layer: 9·min, 4 a thread
    CHECK(rectangles_for(2.0 * 1024 * 1024 * 1024, 2, min) == 8);
    CHECK(rectangles_for(5.0 * min, 2, min) == 4);  // 2.5 a thread: 2 each, not 5 in all
    CHECK(rectangles_for(1.0, 3, min) == 3);        // however little, one a thread
    for (int64_t threads = 1; threads <= 4; threads++)
        for (double flops = 1e6; flops < 1e11; flops *= 1.7) {
            const int64_t r = rectangles_for(flops, threads, min);
            INFO("threads " << threads << ", flops " << flops << ": " << r << " rectangles");
            CHECK(r % threads == 0);
            CHECK(r >= threads);
            CHECK(r <= 4 * threads);
        }
    // The grid packs least: for 256×784 (6×16 tiles) in 8 rectangles, 2 rows of 4 pack A 4 times
    // and B twice (4·256 + 2·784 rows and columns), less than 1 × 8 (8·256 + 784) or 4 × 2.
    const auto g = choose_grid(256, 784, 6, 16, 8);
    CHECK(g.tm == 2);
    CHECK(g.tn == 4);
    // Never more rectangles than tiles: 64 columns are one 64-wide tile.
    const auto thin = choose_grid(64, 64, 6, 64, 8);
    CHECK(thin.tm * thin.tn == 8);
    CHECK(thin.tn == 1);
}

TEST_CASE("every micro-kernel this CPU runs matches the reference; the fused ones agree bit for bit",
          "[gemm][cpu][lesson03]") {
    using namespace kiln;
    for (CpuLevel level : test::runnable_levels()) {
        const CpuLevel before = set_cpu_level_cap(level);
        INFO("level " << cpu_level_name(level) << ", micro-kernel " << cpu::micro_kernel(level).name);
        CHECK(std::string(cpu::gemm_path<float>(level)) == cpu::micro_kernel(level).name);
        // Edge tiles of every kernel's width (NR = 8, 16, 64), several KC-blocks and B chunks.
        for (bool ta : {false, true})
            for (bool tb : {false, true}) {
                check_case({ta, tb, 37, 45, 301, 0.75f, 0.5f});
                check_case({ta, tb, 13, 300, 40, 1.0f, 1.0f, 3});
            }
        set_cpu_level_cap(before);
    }
    if (detected_cpu_level() >= CpuLevel::Avx2) CHECK(std::string(cpu::micro_kernel(CpuLevel::Avx2).name) == "avx2-fma");
    if (detected_cpu_level() >= CpuLevel::Avx512) CHECK(std::string(cpu::micro_kernel(CpuLevel::Avx512).name) == "avx512");
    const int64_t M = 64, N = 333, K = 600;  // 3 KC-blocks, a partial B chunk and panel
    const auto A = random_vector(size_t(M * K), 5), B = random_vector(size_t(K * N), 6);
    for (bool tb : {false, true}) {  // tb: B packed by each kernel's own transposing copy
        INFO("trans_b " << tb);
        check_same_bits_on_fused_levels(M, N, K, A, B, tb);
    }
}

TEST_CASE("a product at most 48 columns wide, or its last columns, take a narrower AVX-512 kernel", "[gemm][cpu][lesson03]") {
    using namespace kiln;
    // At avx512: N <= 16 the 6×16 tile, N <= 32 the 6×32 one, N <= 48 the 6×48 one; below avx512
    // the level's own kernel.
    for (CpuLevel level : test::runnable_levels())
        for (int64_t N : {1, 9, 16, 17, 32, 33, 48, 49, 64, 80, 300}) {
            INFO("level " << cpu_level_name(level) << ", N = " << N);
            const bool avx512 = level >= CpuLevel::Avx512;
            const std::string want = !avx512 || N > 48 ? cpu::micro_kernel(level).name
                                     : N <= 16         ? "avx512-16"
                                     : N <= 32         ? "avx512-32"
                                                       : "avx512-48";
            CHECK(std::string(cpu::micro_kernel(level, N).name) == want);
        }
    // The narrow products themselves, and wide ones whose last 13, 16, 32 or 40 columns take a narrow
    // kernel (gemm.cpp, product), partial tiles and several KC-blocks, against the reference; and
    // their bits on every fused kernel's level (the narrow kernels at avx512, the AVX2 one's 6×16
    // tiles at avx2).
    const int64_t M = 13, K = 301;
    const auto A = random_vector(size_t(M * K), 7);
    for (int64_t N : {9, 16, 17, 32, 40, 48, 77, 80, 96, 104}) {
        for (bool ta : {false, true})
            for (bool tb : {false, true}) check_case({ta, tb, M, N, K, 0.75f, 0.5f});
        INFO("N = " << N);
        check_same_bits_on_fused_levels(M, N, K, A, random_vector(size_t(K * N), 8), false);
    }
}

TEST_CASE("a small product, read in place, gives the bits of the same rows of a packed one", "[gemm][cpu][lesson03]") {
    using namespace kiln;
    // The small product's A is the first M rows (or, transposed, columns) of the big one's, with
    // the same strides; the big one is packed (cpu::gemm_in_place says no), the small one not.
    // A partial A panel (M = 7), two MC blocks on the pool's threads (M = 300), a partial B panel
    // (N = 77: 64 columns, then 13 on the AVX2 kernel at the avx512 level; 4·16 + 13 at avx2), two
    // KC-blocks (K = 300), alpha and beta, every level this CPU runs.
    const int64_t big_M = 2048, N = 77, K = 300;
    for (int64_t M : {1, 7, 64, 300}) REQUIRE(cpu::gemm_in_place(M, N, K));
    REQUIRE(!cpu::gemm_in_place(big_M, N, K));
    for (CpuLevel level : test::runnable_levels())
        for (bool ta : {false, true})
            for (bool tb : {false, true})
                for (int64_t M : {1, 7, 64, 300}) {
                    INFO("level " << cpu_level_name(level) << " ta=" << ta << " tb=" << tb << " M=" << M);
                    const CpuLevel before = set_cpu_level_cap(level);
                    const int64_t lda = ta ? big_M : K, ldb = tb ? K : N;
                    const auto A = random_vector(size_t(big_M * K), 31), B = random_vector(size_t(K * N), 32);
                    auto big = random_vector(size_t(big_M * N), 33);
                    std::vector<float> small(big.begin(), big.begin() + M * N);
                    gemm(ta, tb, big_M, N, K, 0.75f, A.data(), lda, B.data(), ldb, 0.5f, big.data(), N);
                    gemm(ta, tb, M, N, K, 0.75f, A.data(), lda, B.data(), ldb, 0.5f, small.data(), N);
                    CHECK(std::memcmp(small.data(), big.data(), small.size() * sizeof(float)) == 0);
                    set_cpu_level_cap(before);
                }
}

TEST_CASE("gemm with a packed A gives the bits of gemm on A itself", "[gemm][cpu][lesson03]") {
    using kiln::cpu::PackedA;
    const int saved = omp_get_max_threads();
    // Edge panels (M not a multiple of 6), several KC-blocks (K = 600), several MC blocks and
    // rectangles of C (M = 1000), a layer's shape (64 × 4096 × 576).
    const int64_t shapes[][3] = {{37, 45, 301}, {1000, 40, 600}, {64, 4096, 576}, {5, 3, 2}};
    for (bool ta : {false, true})
        for (bool tb : {false, true})
            for (const auto& s : shapes)
                for (float beta : {0.0f, 1.0f, 0.5f})
                    for (int threads : {1, 2}) {
                        const int64_t M = s[0], N = s[1], K = s[2];
                        INFO("ta=" << ta << " tb=" << tb << " M=" << M << " N=" << N << " K=" << K << " beta=" << beta
                                   << " threads=" << threads);
                        omp_set_num_threads(threads);
                        const auto A = random_vector(size_t(M * K), 21), B = random_vector(size_t(K * N), 22);
                        auto want = random_vector(size_t(M * N), 23), got = want;
                        gemm(ta, tb, M, N, K, 0.75f, A.data(), ta ? M : K, B.data(), tb ? K : N, beta, want.data(), N);
                        const PackedA packed(ta, M, K, A.data(), ta ? M : K);
                        REQUIRE(packed.rows() == M);
                        REQUIRE(packed.depth() == K);
                        gemm_packed(packed, tb, N, 0.75f, B.data(), tb ? K : N, beta, got.data(), N);
                        CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
                    }
    omp_set_num_threads(saved);
}

TEST_CASE("gemm with a packed A in f16 and bf16 gives the bits of gemm on A itself", "[gemm][cpu][lowp][lesson09]") {
    using kiln::cpu::PackedA;
    auto run = [](auto tag) {
        using T = decltype(tag);
        const int64_t M = 37, N = 45, K = 301;
        auto lowp = [](const std::vector<float>& v) {
            std::vector<T> r;
            for (float x : v) r.push_back(T(x));
            return r;
        };
        const auto A = lowp(random_vector(size_t(M * K), 31)), B = lowp(random_vector(size_t(K * N), 32));
        for (bool ta : {false, true}) {
            INFO("ta=" << ta);
            auto want = lowp(random_vector(size_t(M * N), 33)), got = want;
            gemm(ta, false, M, N, K, 0.75f, A.data(), ta ? M : K, B.data(), N, 0.5f, want.data(), N);
            const PackedA packed(ta, M, K, A.data(), ta ? M : K);
            gemm_packed(packed, false, N, 0.75f, B.data(), N, 0.5f, got.data(), N);
            CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(T)) == 0);
            if (packed.pair_kernel()) {  // bf16 pairs (vdpbf16ps) multiply bf16 only
                std::vector<float> B32(size_t(K * N)), C32(size_t(M * N));
                CHECK_THROWS_WITH(gemm_packed(packed, false, N, 1.0f, B32.data(), N, 0.0f, C32.data(), N),
                                  Catch::Contains("holds bf16 pairs"));
            }
        }
    };
    run(kiln::f16{});
    run(kiln::bf16{});
}

// ---- on CUDA (chapter 04; cuda/gemm.cu and the lab's versions; on the emulator without a GPU,
// under three schedules) ---------------------------------------------------------------------------
// Every transpose, beta 0 and 1, sizes that are not multiples of the tile, against cpu::gemm.
using namespace kiln;
using test::cuda_copy;
using test::require_near;
using test::under_schedules;

namespace {

using GemmFn = void (*)(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*, int64_t,
                        float, float*, int64_t);

// One GEMM on device copies, compared with cpu::gemm on the same inputs. The leading
// dimensions are padded (lda = K + 3, ...) so that a kernel mixing up a size and a stride fails.
void check_gemm(GemmFn gpu_gemm, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, float beta,
                Rng& rng) {
    INFO("M = " << M << ", N = " << N << ", K = " << K << ", trans_a = " << ta << ", trans_b = " << tb
                << ", alpha = " << alpha << ", beta = " << beta);
    const int64_t a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
    const int64_t lda = a_cols + 3, ldb = b_cols + 1, ldc = N + 2;
    Tensor A = Tensor::uniform({a_rows, lda}, -1.0f, 1.0f, rng), B = Tensor::uniform({b_rows, ldb}, -1.0f, 1.0f, rng);
    Tensor C = Tensor::uniform({M, ldc}, -1.0f, 1.0f, rng);
    if (beta == 0.0f)  // beta = 0 must not read C
        for (int64_t i = 0; i < C.numel(); i++) C.data<float>()[i] = std::numeric_limits<float>::quiet_NaN();
    Tensor dA = cuda_copy(A), dB = cuda_copy(B), dC = cuda_copy(C);
    cpu::gemm(ta, tb, M, N, K, alpha, A.data<float>(), lda, B.data<float>(), ldb, beta, C.data<float>(), ldc);
    gpu_gemm(ta, tb, M, N, K, alpha, dA.data<float>(), lda, dB.data<float>(), ldb, beta, dC.data<float>(), ldc);
    Tensor got = dC.to(Device::CPU);
    // Padding columns stay untouched (NaN for beta = 0): compare everything, NaN matching NaN.
    // Tolerance: the GPU adds the K products in another order than the CPU (tiles, fma), so each
    // element may differ by a few ulps of Σ|a·b| ≤ K for values in [-1, 1].
    require_near(got, C, 1e-5, 2e-6 * double(K + 1));
}

}  // namespace

TEST_CASE("cuda gemm (version 6, the engine's) matches the CPU", "[cuda][lesson04][gemm]") {
    Rng rng(17);
    // Edges of the 64×64 tile, K not a multiple of BK = 16, a single element, a tall thin matrix;
    // K a multiple of 4 (A's rows as float4s) and not (one by one).
    const int64_t shapes[][3] = {{1, 1, 1}, {3, 5, 7}, {17, 33, 65}, {64, 64, 16}, {65, 63, 17}, {130, 129, 20},
                                 {64, 512, 100}, {300, 2, 3}};
    under_schedules([&] {
        for (auto [M, N, K] : shapes)
            for (bool ta : {false, true})
                for (bool tb : {false, true})
                    for (float beta : {0.0f, 1.0f}) check_gemm(cuda::gemm, ta, tb, M, N, K, 0.75f, beta, rng);
    });
}

TEST_CASE("cuda gemm's 128×128 tiles (big matrices) match the CPU", "[cuda][lesson04][gemm]") {
    Rng rng(19);
    // Two 128×128 tiles per SM select the big configuration (289 tiles here: the emulator's SMs
    // are its OpenMP threads); 2049 and 2050 leave partial tiles.
    under_schedules([&] {
        for (bool ta : {false, true})
            for (bool tb : {false, true}) check_gemm(cuda::gemm, ta, tb, 2049, 2050, 9, 1.0f, ta ? 1.0f : 0.0f, rng);
    });
}

TEST_CASE("cuda gemm split along K (convolution weight gradients) matches the CPU", "[cuda][lesson05][gemm]") {
    Rng rng(21);
    // One 64×64 tile of C and a long K, as LeNet's weight gradients (Og × Kc = 6 × 25, 16 × 150,
    // K = L the chunk's output pixels): fewer tiles than two per SM, so K is split (S ≥ 2 on the
    // emulator too, whose SMs are its OpenMP threads). K not a multiple of the 32-wide slices
    // leaves a short last slice. Tolerance (check_gemm's): each slice sums K/S products, then S
    // partials are added: an error bound of (K/S + S)·u·Σ|a·b| ≤ K·u·Σ|a·b|, as for one sum.
    const int64_t shapes[][3] = {{6, 25, 3000}, {16, 64, 1000}, {33, 50, 777}};
    for (auto [M, N, K] : shapes) {
        INFO("M = " << M << ", N = " << N << ", K = " << K);
        REQUIRE(cuda::gemm_split_k_slices(M, N, K) >= 2);
        under_schedules([&] {
            for (bool ta : {false, true})
                for (bool tb : {false, true})
                    for (float beta : {0.0f, 1.0f}) check_gemm(cuda::gemm_split_k<float>, ta, tb, M, N, K, 0.75f, beta, rng);
        });
    }
    // Enough tiles to fill the device already: no split.
    REQUIRE(cuda::gemm_split_k_slices(64 * 100, 64 * 100, 100000) == 1);
    // The same bytes on every run: the partials are added in a fixed order, without atomics.
    Tensor A = Tensor::uniform({6, 3000}, -1.0f, 1.0f, rng), B = Tensor::uniform({25, 3000}, -1.0f, 1.0f, rng);
    Tensor C1 = Tensor::zeros({6, 25}).to(Device::CUDA), C2 = Tensor::zeros({6, 25}).to(Device::CUDA);
    const Tensor dA = cuda_copy(A), dB = cuda_copy(B);
    for (Tensor* C : {&C1, &C2})
        cuda::gemm_split_k(false, true, 6, 25, 3000, 1.0f, dA.data<float>(), 3000, dB.data<float>(), 3000, 0.0f,
                           C->data<float>(), 25);
    test::require_identical(C1, C2);
}

TEST_CASE("cuda gemm versions 1 to 3 (naive, shared-memory tiles, register tiles) match the CPU",
          "[cuda][lesson04][gemm]") {
    Rng rng(23);
    const int64_t shapes[][3] = {{1, 1, 1}, {16, 16, 16}, {17, 33, 65}, {40, 7, 31}, {130, 129, 20}};
    under_schedules([&] {
        for (GemmFn f : {cuda::lab::gemm_naive<float>, cuda::lab::gemm_smem<float>,
                         cuda::lab::gemm_register_tiled<float>})
            for (auto [M, N, K] : shapes)
                for (bool ta : {false, true})
                    for (bool tb : {false, true})
                        for (float beta : {0.0f, 1.0f}) check_gemm(f, ta, tb, M, N, K, 1.5f, beta, rng);
    });
}

TEST_CASE("cuda gemm version 6 gives version 3's bits: each C value sums its products in k order",
          "[cuda][lesson04][gemm]") {
    // Warp tiling and double buffering move data, not arithmetic: both add op(A)[m, k]·op(B)[k, n]
    // to one float accumulator for k = 0, 1, ..., K − 1, so switching the engine changed no bit.
    Rng rng(29);
    const int64_t shapes[][3] = {{17, 33, 65}, {64, 512, 100}, {300, 260, 48}};
    for (auto [M, N, K] : shapes)
        for (bool ta : {false, true})
            for (bool tb : {false, true}) {
                INFO("M = " << M << ", N = " << N << ", K = " << K << ", trans_a " << ta << ", trans_b " << tb);
                const Tensor A = cuda_copy(Tensor::uniform({ta ? K : M, ta ? M : K}, -1.0f, 1.0f, rng));
                const Tensor B = cuda_copy(Tensor::uniform({tb ? N : K, tb ? K : N}, -1.0f, 1.0f, rng));
                Tensor C6 = Tensor::zeros({M, N}).to(Device::CUDA), C3 = Tensor::zeros({M, N}).to(Device::CUDA);
                cuda::gemm(ta, tb, M, N, K, 1.0f, A.data<float>(), ta ? M : K, B.data<float>(), tb ? K : N, 0.0f,
                           C6.data<float>(), N);
                cuda::lab::gemm_register_tiled(ta, tb, M, N, K, 1.0f, A.data<float>(), ta ? M : K, B.data<float>(),
                                               tb ? K : N, 0.0f, C3.data<float>(), N);
                test::require_identical(C6, C3);
            }
}

TEST_CASE("cuda gemm: alpha = 0 or K = 0 gives beta·C and reads neither A nor B", "[cuda][lesson04][gemm]") {
    //   C = [1 2 3],  beta = 2  ->  [2 4 6];   beta = 0  ->  [0 0 0] even where C was NaN
    Tensor C = Tensor::zeros({1, 3});
    for (int i = 0; i < 3; i++) C.set({0, i}, i + 1);
    Tensor nan = Tensor::full({1, 1}, std::nan("")).to(Device::CUDA);  // A and B: NaN if read
    for (int64_t K : {int64_t(0), int64_t(1)}) {
        Tensor dC = cuda_copy(C);
        const float alpha = K == 0 ? 1.0f : 0.0f;
        cuda::gemm(false, false, 1, 3, K, alpha, nan.data<float>(), 1, nan.data<float>(), 3, 2.0f, dC.data<float>(), 3);
        Tensor got = dC.to(Device::CPU);
        for (int i = 0; i < 3; i++) REQUIRE(got.get({0, i}) == 2.0 * (i + 1));
        Tensor dn = Tensor::full({1, 3}, std::nan("")).to(Device::CUDA);
        cuda::gemm(false, false, 1, 3, K, alpha, nan.data<float>(), 1, nan.data<float>(), 3, 0.0f, dn.data<float>(), 3);
        for (int i = 0; i < 3; i++) REQUIRE(dn.to(Device::CPU).get({0, i}) == 0.0);
    }
    cuda::gemm<float>(false, false, 0, 5, 5, 1.0f, nullptr, 5, nullptr, 5, 0.0f, nullptr, 5);  // M = 0: no launch
}

TEST_CASE("matmul shapes and errors", "[ops][gemm][cpu][lesson02]") {
    Tensor a = test::tensor_of({2, 3}, {1, 2, 3, 4, 5, 6});  // [[1 2 3] [4 5 6]]
    Tensor c = matmul(a, a, false, true);          // a·aᵀ = [[14 32] [32 77]]
    REQUIRE((c.get({0, 0}) == 14 && c.get({0, 1}) == 32 && c.get({1, 1}) == 77));
    Tensor d = matmul(a, a, true, false);          // aᵀ·a is 3×3
    REQUIRE(d.shape() == Shape({3, 3}));
    REQUIRE(d.get({2, 2}) == 45);
    REQUIRE_THROWS_WITH(matmul(a, a), Catch::Contains("inner sizes differ"));
}

TEST_CASE("cuda matmul through the ops layer, as Linear uses it", "[cuda][lesson04][gemm]") {
    Rng rng(29);
    Tensor x = Tensor::uniform({64, 784}, -1.0f, 1.0f, rng), w = Tensor::uniform({10, 784}, -1.0f, 1.0f, rng);
    Tensor want = matmul(x, w, false, true);
    under_schedules([&] { require_near(matmul(cuda_copy(x), cuda_copy(w), false, true), want, 1e-5, 2e-6 * 785); });
}

// ---- in f16 and bf16 (chapter 09), on the CPU and on CUDA ---------------------------------------------
// The inputs are drawn in f32 and rounded to T; "want" is the f32 GEMM (CPU) on exactly those values.
// The T kernels sum in f32 and round C to T once: lowp_check.h's require_rounded_once, with R = K
// and S = |alpha|·|op(a)|·|op(b)| + |beta|·|c| (a second f32 GEMM on the absolute values).
namespace {

using test::lowp::kBF16;
using test::lowp::kF16;
using test::lowp::LowType;

// c = alpha·op(a)·op(b) + beta·c in T on `device`, against the f32 GEMM (CPU) of the same values.
void check_gemm_lowp(const LowType& f, Device device, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                     float beta, Rng& rng) {
    INFO(dtype_name(f.dtype) << " on " << device_name(device) << ": M = " << M << ", N = " << N << ", K = " << K
                             << ", trans_a = " << ta << ", trans_b = " << tb << ", beta = " << beta);
    const auto random = [&](const Shape& shape) { return Tensor::uniform(shape, -1.0f, 1.0f, rng).to(f.dtype); };
    const Tensor a = random(ta ? Shape{K, M} : Shape{M, K});
    const Tensor b = random(tb ? Shape{N, K} : Shape{K, N});
    const Tensor c = random({M, N});
    Tensor got = c.clone().to(device);  // c itself stays for the reference
    matmul_into(a.to(device), ta, b.to(device), tb, got, alpha, beta);

    const Tensor a32 = a.to(DType::F32), b32 = b.to(DType::F32);
    Tensor want = c.to(DType::F32);
    matmul_into(a32, ta, b32, tb, want, alpha, beta);
    Tensor S = test::lowp::abs_of(c);  // |alpha|·|op(a)|·|op(b)| + |beta|·|c|
    matmul_into(test::lowp::abs_of(a32), ta, test::lowp::abs_of(b32), tb, S, std::fabs(alpha), std::fabs(beta));
    REQUIRE(got.device() == device);
    test::lowp::require_rounded_once(got, want, f, K, S);
}

// All four transposes, beta 0 and 0.5, for each shape and both types.
void check_gemm_lowp_shapes(Device device, std::initializer_list<std::array<int64_t, 3>> shapes, Rng& rng) {
    for (const LowType& f : {kF16, kBF16})
        for (auto [M, N, K] : shapes)
            for (bool ta : {false, true})
                for (bool tb : {false, true})
                    for (float beta : {0.0f, 0.5f}) check_gemm_lowp(f, device, ta, tb, M, N, K, 1.25f, beta, rng);
}

}  // namespace

// Sizes that are multiples of no tile: 7×13 with K = 29, 67×45 with K = 300 (two of the CPU's
// KC-blocks: the partial sums stay in f32 between them).
TEST_CASE("f16 and bf16 GEMM on the CPU: f32 sums, one rounding", "[dtype][cpu][gemm][lesson09]") {
    Rng rng(101);
    check_gemm_lowp_shapes(Device::CPU, {{1, 1, 1}, {7, 13, 29}, {67, 45, 300}, {130, 70, 64}}, rng);
}

TEST_CASE("f16 and bf16 GEMM on CUDA: f32 sums, one rounding", "[dtype][cuda][gemm][lesson09]") {
    Rng rng(103);
    under_schedules([&] { check_gemm_lowp_shapes(Device::CUDA, {{1, 1, 1}, {17, 33, 65}, {65, 63, 17}, {70, 40, 300}}, rng); });
}

TEST_CASE("f16 and bf16 GEMM on CUDA with the 128×128 tiles", "[dtype][cuda][gemm][lesson09]") {
    Rng rng(107);
    // ≥ 256 tiles of 128×128 picks the big configuration; 2049 and 2050 leave partial tiles.
    under_schedules([&] {
        check_gemm_lowp(kF16, Device::CUDA, false, true, 2049, 2050, 5, 1.0f, 0.0f, rng);
        check_gemm_lowp(kBF16, Device::CUDA, true, false, 2049, 2050, 5, 1.0f, 0.5f, rng);
    });
}

TEST_CASE("f16 GEMM sums in f32: 4096 ones do not stop at 2048", "[dtype][cpu][cuda][gemm][lesson09]") {
    // In f16, 2048 + 1 rounds back to 2048: a kernel that summed in f16 would return 2048.
    const int64_t K = 4096;
    const Tensor a = Tensor::ones({1, K}, DType::F16), b = Tensor::ones({K, 1}, DType::F16);
    REQUIRE(matmul(a, b).get({0, 0}) == 4096.0);
    under_schedules([&] { REQUIRE(matmul(a.to(Device::CUDA), b.to(Device::CUDA)).to(Device::CPU).get({0, 0}) == 4096.0); });
}

// ---- f16 and bf16 on each CPU path: the same bits on every path that fuses, within the f32 sums'
// bound where a path sums in its own order (vdpbf16ps, AMX tiles) --------------------------------------
namespace {

using test::random_lowp;

template <typename T>
std::vector<uint16_t> bits_of_all(const std::vector<T>& v) {
    std::vector<uint16_t> b(v.size());
    for (size_t i = 0; i < v.size(); ++i) b[i] = v[i].bits;
    return b;
}

// C = alpha·op(A)·op(B) + beta·C in T, for one shape, under the current cap.
template <typename T>
std::vector<uint16_t> lowp_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float beta) {
    const auto A = random_lowp<T>(size_t(M * K), 1), B = random_lowp<T>(size_t(K * N), 2);
    auto C = random_lowp<T>(size_t(M * N), 3);
    cpu::gemm<T>(ta, tb, M, N, K, 0.75f, A.data(), ta ? M : K, B.data(), tb ? K : N, beta, C.data(), N);
    return bits_of_all(C);
}

template <typename T>
void check_gemm_paths_agree() {
    // Edge tiles (M, N not multiples of 6 or 16; K across two KC-blocks), every transpose,
    // beta 0, 1 and general (C's store widens, fuses and narrows). The levels each pick their
    // micro-kernel too: those that fuse give the same sums (fixtures.h).
    // (A level whose bf16 product is vdpbf16ps's or AMX's sums is left out: their own tests are below.)
    std::vector<CpuLevel> levels;
    for (CpuLevel level : test::fused_gemm_levels())
        if (!std::is_same_v<T, bf16> || !(cpu::bf16_pair_kernel(level) || cpu::amx_kernel(level))) levels.push_back(level);
    for (bool ta : {false, true})
        for (bool tb : {false, true})
            for (float beta : {0.0f, 1.0f, -0.5f}) {
                INFO("ta " << ta << " tb " << tb << " beta " << beta);
                const auto r = test::under_levels(levels, [&] { return lowp_gemm<T>(ta, tb, 37, 45, 301, beta); });
                for (size_t i = 1; i < r.size(); ++i) CHECK(r[i] == r[0]);
            }
    const auto big = test::under_levels(levels, [] { return lowp_gemm<T>(false, true, 130, 200, 96, 0.0f); });
    for (size_t i = 1; i < big.size(); ++i) CHECK(big[i] == big[0]);
}

}  // namespace

TEST_CASE("f16 gemm gives the same bits on the portable and the vector path", "[cpu][lowp][lesson09][gemm]") {
    check_gemm_paths_agree<f16>();
}

TEST_CASE("bf16 gemm gives the same bits on the portable and the vector path", "[cpu][lowp][lesson09][gemm]") {
    check_gemm_paths_agree<bf16>();
}

namespace {

// Runs a bf16 path whose sums round in their own order (`other`: vdpbf16ps, AMX) and the FMA path
// (the avx2 level) on the same products, and checks C within their difference's bound:
// vdpbf16ps and tdpbf16ps sum (a_hi·b_hi + a_lo·b_lo) + acc, exact products and two roundings per
// pair, as the FMA path does but in another order. Both then round C to bf16 once, so they may
// differ by 1 bf16 ulp (2^-7 of |C| at most), plus the two f32 sums' error, each within
// (K + 2)·2^-24 · Σ|a·b| (the bound of test_gemm.cpp).
// Shapes: edge tiles, odd K (a zero in the last pair), several KC-blocks, every transpose; an
// even K (600) takes the 32-bit transposing copy of a transposed B, an odd one the pair loop.
void check_within_fma_bound(const std::function<void(const std::function<void()>&)>& on_other_path) {
    const int64_t shapes[][3] = {{37, 45, 301}, {6, 64, 2}, {13, 130, 1}, {64, 200, 513}, {7, 5, 3}, {20, 70, 600}};
    for (const auto& sh : shapes)
        for (bool ta : {false, true})
            for (bool tb : {false, true})
                for (float beta : {0.0f, 1.0f}) {
                    const int64_t M = sh[0], N = sh[1], K = sh[2];
                    INFO("M " << M << " N " << N << " K " << K << " ta " << ta << " tb " << tb << " beta " << beta);
                    const auto A = random_lowp<bf16>(size_t(M * K), 1), B = random_lowp<bf16>(size_t(K * N), 2);
                    const auto C0 = random_lowp<bf16>(size_t(M * N), 3);
                    auto other = C0, fma = C0;
                    const auto run = [&](std::vector<bf16>& C) {
                        cpu::gemm<bf16>(ta, tb, M, N, K, 0.75f, A.data(), ta ? M : K, B.data(), tb ? K : N, beta,
                                        C.data(), N);
                    };
                    on_other_path([&] { run(other); });
                    const CpuLevel before = set_cpu_level_cap(CpuLevel::Avx2);
                    run(fma);
                    set_cpu_level_cap(before);
                    int64_t bad = 0;
                    for (int64_t i = 0; i < M; ++i)
                        for (int64_t j = 0; j < N; ++j) {
                            double bound = std::fabs(beta * float(C0[size_t(i * N + j)]));
                            for (int64_t k = 0; k < K; ++k)
                                bound += 0.75 * std::fabs(float(A[size_t(ta ? k * M + i : i * K + k)]) *
                                                          float(B[size_t(tb ? j * K + k : k * N + j)]));
                            const double p = float(other[size_t(i * N + j)]), f = float(fma[size_t(i * N + j)]);
                            const double tol = std::ldexp(std::max(std::fabs(p), std::fabs(f)), -7) +
                                               2.0 * (K + 2) * std::ldexp(bound, -24);
                            if (!(std::fabs(p - f) <= tol) && bad++ < 3)
                                UNSCOPED_INFO("C[" << i << "," << j << "]: other path " << p << ", fma " << f
                                                   << ", tolerance " << tol);
                        }
                    CHECK(bad == 0);
                }
}

}  // namespace

TEST_CASE("bf16 gemm on the vdpbf16ps kernel stays within the f32 sums' bound of the FMA path",
          "[cpu][lowp][lesson09][gemm]") {
    if (!cpu::bf16_pair_kernel(detected_cpu_level())) {
        test::skip("this CPU has no AVX512-BF16 kernel that runs faster than its f32 one: the bf16-pair path is not checked");
        return;
    }
    check_within_fma_bound([](const std::function<void()>& run) {
        const CpuLevel before = set_cpu_level_cap(CpuLevel::Avx512);
        run();
        set_cpu_level_cap(before);
    });
}

TEST_CASE("bf16 pairs: every layout of A and B, with even or odd leading dimensions, gives the same bits",
          "[cpu][lowp][lesson09][gemm]") {
    // The pairs' panels hold the same words however A and B lie (gemm.cpp, "bf16 pairs"), packed
    // by different copies: A's rows as 32-bit words (even lda) or pair by pair (odd lda, or Aᵀ);
    // B's rows interleaved 16 columns a vector, Bᵀ's columns as words (even ldb) or through rows
    // an even number of elements apart (odd ldb, odd K). So the products agree bit for bit.
    // M = 20: three full panels and a partial one; N = 70: a partial panel, not a multiple of 16;
    // K = 301 (a zero in the last pair) and 600 (three KC-blocks).
    if (!cpu::bf16_pair_kernel(detected_cpu_level())) {
        test::skip("this CPU has no AVX512-BF16 kernel that runs faster than its f32 one: the bf16-pair path is not checked");
        return;
    }
    const int64_t M = 20, N = 70;
    for (int64_t K : {301, 600}) {
        const auto a = random_lowp<bf16>(size_t(M * K), 11), b = random_lowp<bf16>(size_t(K * N), 12);
        // op(X) (rows × cols, row-major in x) stored transposed or not, ld = its row length + pad.
        const auto store = [](const std::vector<bf16>& x, int64_t rows, int64_t cols, bool trans, int64_t pad) {
            const int64_t ld = (trans ? rows : cols) + pad;
            std::vector<bf16> out(size_t((trans ? cols : rows) * ld));
            for (int64_t i = 0; i < rows; ++i)
                for (int64_t j = 0; j < cols; ++j) out[size_t(trans ? j * ld + i : i * ld + j)] = x[size_t(i * cols + j)];
            return std::make_pair(out, ld);
        };
        std::vector<bf16> first;
        for (bool ta : {false, true})
            for (bool tb : {false, true})
                for (int64_t pad : {0, 1}) {
                    INFO("K " << K << " ta " << ta << " tb " << tb << " pad " << pad);
                    const auto [A, lda] = store(a, M, K, ta, pad);
                    const auto [B, ldb] = store(b, K, N, tb, pad);
                    std::vector<bf16> C(size_t(M * N));
                    const CpuLevel before = set_cpu_level_cap(CpuLevel::Avx512);
                    CHECK(std::string(cpu::gemm_path<bf16>(CpuLevel::Avx512)) == "avx512-bf16");
                    cpu::gemm<bf16>(ta, tb, M, N, K, 1.0f, A.data(), lda, B.data(), ldb, 0.0f, C.data(), N);
                    set_cpu_level_cap(before);
                    if (first.empty()) first = C;
                    CHECK(std::memcmp(C.data(), first.data(), C.size() * sizeof(bf16)) == 0);
                }
    }
}

TEST_CASE("bf16 gemm on AMX tiles, emulated and (where the CPU has them) real, stays within the bound of the FMA path",
          "[cpu][lowp][lesson09][gemm][amx]") {
    {
        INFO("the emulated tiles (amx_tiles.h)");
        check_within_fma_bound([](const std::function<void()>& run) {
            const test::AmxEmulation emulated;
            CHECK(std::string(cpu::gemm_path<bf16>(cpu_level())) == "amx-bf16-emulated");
            run();
        });
    }
    if (!cpu::amx_kernel(detected_cpu_level())) {
        test::skip("this CPU runs no AMX kernel (none, no permission, or not faster): only the emulated tiles are checked");
        return;
    }
    INFO("the CPU's tiles");
    check_within_fma_bound([](const std::function<void()>& run) {
        const CpuLevel before = set_cpu_level_cap(CpuLevel::Amx);
        CHECK(std::string(cpu::gemm_path<bf16>(CpuLevel::Amx)) == "amx-bf16");
        run();
        set_cpu_level_cap(before);
    });
}

// ---- on the tensor cores (chapter 09): the lab's wmma GEMM (version 5), the engine's mma.sync GEMM
// (version 7) and its cp.async pipeline (version 8), in f16 and bf16 against cpu::gemm in f32 on the
// same values, within the bound of one rounding (lowp_check.h's require_rounded_once, R = K); and
// matmul's choice of them (the emulator counts wmma operations: not in the GPU build) ---------------------
namespace {

using test::lowp::abs_of;
using test::lowp::require_rounded_once;

Tensor random(const Shape& shape, Rng& rng, DType dtype) { return Tensor::uniform(shape, -1.0f, 1.0f, rng).to(dtype); }

// The device's multiprocessors (on the emulator: its OpenMP threads), which decide the GEMM's tiles.
int64_t multiprocessors() {
    cudaDeviceProp prop{};
    int device = 0;
    REQUIRE(cudaGetDevice(&device) == cudaSuccess);
    REQUIRE(cudaGetDeviceProperties(&prop, device) == cudaSuccess);
    return prop.multiProcessorCount;
}

// c = alpha·op(a)·op(b) + beta·c by `gemm` (a cuda GEMM in T) against cpu::gemm in f32. The
// leading dimensions are padded: by 3, 1 and 2 (so that a size used as a stride fails, and rows
// are not 16-byte aligned: the one-by-one loads), or, with `aligned`, up to the next multiple of
// 8 (rows 16-byte aligned: the vector loads where the dimension allows them).
template <typename T>
using GemmFn16 = void (*)(bool, bool, int64_t, int64_t, int64_t, float, const T*, int64_t, const T*, int64_t, float, T*,
                        int64_t);

template <typename T>
void check_gemm_16bit(GemmFn16<T> gemm, const LowType& f, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                      float beta, Rng& rng, bool aligned = false) {
    INFO(dtype_name(f.dtype) << ": M = " << M << ", N = " << N << ", K = " << K << ", trans_a = " << ta
                             << ", trans_b = " << tb << ", beta = " << beta << (aligned ? ", aligned rows" : ""));
    const auto pad = [&](int64_t cols, int64_t by) { return aligned ? (cols + 7) / 8 * 8 : cols + by; };
    const int64_t a_cols = ta ? M : K, b_cols = tb ? K : N, lda = pad(a_cols, 3), ldb = pad(b_cols, 1),
                  ldc = pad(N, 2);
    const Tensor a = random({ta ? K : M, lda}, rng, f.dtype), b = random({tb ? N : K, ldb}, rng, f.dtype);
    const Tensor c = random({M, ldc}, rng, f.dtype);
    Tensor got = c.to(Device::CUDA);
    const Tensor da = a.to(Device::CUDA), db = b.to(Device::CUDA);
    gemm(ta, tb, M, N, K, alpha, da.data<T>(), lda, db.data<T>(), ldb, beta, got.data<T>(), ldc);

    const Tensor a32 = a.to(DType::F32), b32 = b.to(DType::F32);
    Tensor want = c.to(DType::F32).clone(), S = abs_of(c);
    cpu::gemm(ta, tb, M, N, K, alpha, a32.data<float>(), lda, b32.data<float>(), ldb, beta, want.data<float>(), ldc);
    const Tensor a_abs = abs_of(a32), b_abs = abs_of(b32);
    cpu::gemm(ta, tb, M, N, K, std::fabs(alpha), a_abs.data<float>(), lda, b_abs.data<float>(), ldb,
              std::fabs(beta), S.data<float>(), ldc);
    require_rounded_once(got, want, f, K, S);  // the padding columns too: beta·c there, as the CPU
}

// Version 8 with a fixed number of stages, as a GemmFn.
template <int kStages, typename T>
void gemm_async(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const T* A, int64_t lda, const T* B,
                int64_t ldb, float beta, T* C, int64_t ldc) {
    cuda::lab::gemm_tensor_cores_async(kStages, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

template <typename T>
void check_gemm_wmma(const LowType& f, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, float beta,
                     Rng& rng) {
    check_gemm_16bit<T>(cuda::lab::gemm_wmma<T>, f, ta, tb, M, N, K, alpha, beta, rng);
}

}  // namespace

TEST_CASE("wmma gemm (version 5) matches the CPU for f16 and bf16", "[gemm][wmma][cuda][lesson09]") {
    Rng rng(911);
    // A single element (one fragment, almost all padding), edges of no tile with K < 16 and
    // K = 33 (a partial 32-wide step), and two full 64×64 tiles with three K steps.
    const int64_t shapes[][3] = {{1, 1, 1}, {17, 33, 5}, {65, 31, 33}, {64, 128, 96}};
    under_schedules([&] {
        for (auto [M, N, K] : shapes)
            for (bool ta : {false, true})
                for (bool tb : {false, true})
                    for (float beta : {0.0f, 0.5f}) {
                        check_gemm_wmma<f16>(kF16, ta, tb, M, N, K, 1.25f, beta, rng);
                        check_gemm_wmma<bf16>(kBF16, ta, tb, M, N, K, -0.75f, beta, rng);
                    }
    });
}

TEST_CASE("mma.sync gemm (version 7, the engine's) matches the CPU for f16 and bf16",
          "[gemm][wmma][mma][cuda][lesson09]") {
    Rng rng(923);
    // The smallest product the engine sends to the tensor cores (16³), edges of no tile with a
    // partial 32-wide k step, several 64×64 tiles, and a product big enough for the 128×128 tiles
    // (at least two per SM: the emulator counts its OpenMP threads as SMs).
    const int64_t shapes[][3] = {{16, 16, 16}, {17, 33, 40}, {65, 31, 33}, {64, 128, 96}, {130, 70, 100}};
    const int64_t big = 128 * int64_t(std::ceil(std::sqrt(2.0 * multiprocessors())));
    under_schedules([&] {
        for (auto [M, N, K] : shapes)
            for (bool ta : {false, true})
                for (bool tb : {false, true})
                    for (bool aligned : {false, true}) {
                        check_gemm_16bit<f16>(cuda::gemm<f16>, kF16, ta, tb, M, N, K, 1.25f, aligned ? 0.0f : 0.5f,
                                              rng, aligned);
                        check_gemm_16bit<bf16>(cuda::gemm<bf16>, kBF16, ta, tb, M, N, K, -0.75f,
                                               aligned ? 0.5f : 0.0f, rng, aligned);
                    }
    });
    for (bool ta : {false, true})
        for (bool tb : {false, true})
            check_gemm_16bit<bf16>(cuda::gemm<bf16>, kBF16, ta, tb, big, big + 8, 40, 1.0f, 0.0f, rng, true);
}

TEST_CASE("cp.async gemm (version 8, 3 and 4 stages) matches the CPU for f16 and bf16",
          "[gemm][wmma][mma][cuda][lesson09]") {
    Rng rng(931);
    // K of 1 to 5 steps of 32 (fewer steps than stages, and more), edges of the 128×128 tile;
    // unaligned rows fall back to version 7 (the `aligned` false runs).
    const int64_t shapes[][3] = {{16, 16, 16}, {130, 136, 72}, {64, 200, 160}};
    under_schedules([&] {
        for (auto [M, N, K] : shapes)
            for (bool ta : {false, true})
                for (bool tb : {false, true})
                    for (bool aligned : {false, true}) {
                        check_gemm_16bit<f16>(gemm_async<3, f16>, kF16, ta, tb, M, N, K, 1.25f, 0.5f, rng, aligned);
                        check_gemm_16bit<bf16>(gemm_async<4, bf16>, kBF16, ta, tb, M, N, K, -0.75f, 0.0f, rng, aligned);
                    }
    });
}

#ifndef KILN_CUDA
TEST_CASE("wmma: f16 and bf16 matmul on CUDA take the tensor cores when the shapes allow",
          "[gemm][wmma][cuda][lesson09]") {
    Rng rng(913);
    // Linear's product y = x·wᵀ, 40×24 from K = 48: every dimension ≥ 16, the wmma rule.
    for (const LowType& f : {kF16, kBF16}) {
        INFO(dtype_name(f.dtype));
        const Tensor x = random({40, 48}, rng, f.dtype), w = random({24, 48}, rng, f.dtype);
        const Tensor dx = x.to(Device::CUDA), dw = w.to(Device::CUDA);
        under_schedules([&] {
            const uint64_t before = kiln::emu::warp_calls_run();
            const Tensor y = matmul(dx, dw, false, true);
            CHECK(kiln::emu::warp_calls_run() > before);  // wmma operations ran
            Tensor S = Tensor::zeros({40, 24});
            const Tensor x_abs = abs_of(x), w_abs = abs_of(w);
            cpu::gemm(false, true, 40, 24, 48, 1.0f, x_abs.data<float>(), 48, w_abs.data<float>(), 48, 0.0f,
                      S.data<float>(), 24);
            require_rounded_once(y, matmul(x.to(DType::F32), w.to(DType::F32), false, true), f, 48, S);

            // Below the rule (K = 8), and in f32, cuda::gemm stays on gemm_tiled: no wmma at all.
            // (The generator runs on the host; its tensors are copied to the device.)
            const uint64_t after = kiln::emu::warp_calls_run();
            matmul(random({40, 8}, rng, f.dtype).to(Device::CUDA), random({24, 8}, rng, f.dtype).to(Device::CUDA),
                   false, true);
            matmul(dx.to(DType::F32), dw.to(DType::F32), false, true);
            CHECK(kiln::emu::warp_calls_run() == after);
        });
    }
}
#endif  // KILN_CUDA
