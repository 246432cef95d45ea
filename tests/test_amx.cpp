// test_amx.cpp — the model of AMX's tiles (ops/cpu/amx_tiles.h) on hand-computed cases and on
// the faults the CPU would raise, and the bf16 GEMM on AMX tiles (ops/cpu/gemm_amx.h) through
// it: the same bits whatever the threads, a packed A giving gemm's own bits. (Its results
// against the FMA path: tests/test_gemm.cpp.)
//
//   ./kiln_tests '[amx]'
#include <omp.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "fixtures.h"
#include "ops/cpu/amx_tiles.h"
#include "ops/cpu/gemm.h"

using namespace kiln;
namespace amx = kiln::cpu::amx;

namespace {

// Tiles t = 0, 1, 2 of `rows` rows × `bytes` bytes each.
amx::TileConfig config_of(int rows, int bytes) {
    amx::TileConfig c;
    c.palette = 1;
    for (int t = 0; t < 3; ++t) c.rows[t] = uint8_t(rows), c.colsb[t] = uint16_t(bytes);
    return c;
}

std::vector<bf16> bf16s(std::initializer_list<float> xs) {
    std::vector<bf16> v;
    for (float x : xs) v.push_back(bf16(x));
    return v;
}

std::vector<bf16> random_bf16(size_t n, uint32_t seed) { return test::random_lowp<bf16>(n, seed); }

}  // namespace

TEST_CASE("the AMX model computes tdpbf16ps as the manual does, on a hand-computed case", "[amx][cpu][lesson09]") {
    // C (2×2 f32) += A (2×4 bf16) · B (4×2), B in pairs of k:
    //   A = | 1 2 3 4 |   B = | 1  0 |   A·B = | 1+0+3+8   0+2+3-4 | = | 12 1 |
    //       | 5 6 7 8 |       | 0  1 |         | 5+0+7+16  0+6+7-8 |   | 28 5 |
    //                         | 1  1 |
    //                         | 2 -1 |
    // B's tile row r holds (B[2r][n], B[2r+1][n]) for n = 0, 1: row 0 = 1 0 | 0 1, row 1 = 1 2 | 1 -1.
    // Each tile is 2 rows of 8 bytes (2 f32, 4 bf16 or 2 pairs).
    const amx::TileConfig config = config_of(2, 8);
    amx::load_config(&config);
    const auto A = bf16s({1, 2, 3, 4, 5, 6, 7, 8});
    const auto B = bf16s({1, 0, 0, 1, 1, 2, 1, -1});
    float C[2][2] = {{0.5f, 0.0f}, {0.0f, -1.0f}};
    amx::load(0, C, sizeof C[0]);
    amx::load(1, A.data(), 8);
    amx::load(2, B.data(), 8);
    amx::dpbf16ps(0, 1, 2);
    float out[2][2];
    amx::store(0, out, sizeof out[0]);
    CHECK(out[0][0] == 12.5f);
    CHECK(out[0][1] == 1.0f);
    CHECK(out[1][0] == 28.0f);
    CHECK(out[1][1] == 4.0f);
    // tilezero, and a store with a stride: row 1 lands 3 floats after row 0, nothing in between.
    amx::zero(0);
    float strided[6] = {9, 9, 9, 9, 9, 9};
    amx::store(0, strided, 3 * sizeof(float));
    CHECK(std::vector<float>(strided, strided + 6) == std::vector<float>{0, 0, 9, 0, 0, 9});
    amx::release();
}

TEST_CASE("the AMX model reads subnormal bf16 as zero and flushes subnormal sums", "[amx][cpu][lesson09]") {
    const amx::TileConfig config = config_of(1, 4);  // one row: C one f32, A one pair, B one pair
    amx::load_config(&config);
    const auto run = [](float a0, float b0, uint16_t a1_bits, float b1) {
        float c = 0.0f;
        bf16 a[2] = {bf16(a0), bf16{}}, b[2] = {bf16(b0), bf16(b1)};
        a[1].bits = a1_bits;
        amx::load(0, &c, 4);
        amx::load(1, a, 4);
        amx::load(2, b, 4);
        amx::dpbf16ps(0, 1, 2);
        amx::store(0, &c, 4);
        return c;
    };
    // 0x0040: a subnormal bf16 (2^-127·0.5); times 2^100 it would be 2^-28, but it counts as 0.
    CHECK(run(1.0f, 3.0f, 0x0040, 0x1p100f) == 3.0f);
    // 2^-70 · 2^-70 = 2^-140: exact, but subnormal in f32, so flushed to 0.
    CHECK(run(0x1p-70f, 0x1p-70f, 0, 0.0f) == 0.0f);
    amx::release();
}

TEST_CASE("the AMX model faults where the CPU would, with a message", "[amx][cpu][lesson09]") {
    float buffer[256] = {};
    amx::release();
    CHECK_THROWS_WITH(amx::load(0, buffer, 64), Catch::Contains("before ldtilecfg"));
    amx::TileConfig too_big = config_of(17, 64);
    CHECK_THROWS_WITH(amx::load_config(&too_big), Catch::Contains("up to 16 rows of 64 bytes"));
    amx::TileConfig half = config_of(4, 64);
    half.colsb[2] = 0;
    CHECK_THROWS_WITH(amx::load_config(&half), Catch::Contains("both or neither"));
    amx::TileConfig palette2 = config_of(4, 64);
    palette2.palette = 2;
    CHECK_THROWS_WITH(amx::load_config(&palette2), Catch::Contains("only palette 1"));
    // C 4 rows × 64 bytes, A 4 × 64 (32 values of k), B 4 rows: 16 pairs of k needed, 4 given.
    const amx::TileConfig mismatch = config_of(4, 64);
    amx::load_config(&mismatch);
    CHECK_THROWS_WITH(amx::dpbf16ps(0, 1, 2), Catch::Contains("one row per 4 bytes"));
    CHECK_THROWS_WITH(amx::dpbf16ps(0, 0, 2), Catch::Contains("must differ"));
    CHECK_THROWS_WITH(amx::load(5, buffer, 64), Catch::Contains("no rows"));
    CHECK_THROWS_WITH(amx::zero(8), Catch::Contains("there is no tmm8"));
    amx::release();
    CHECK_THROWS_WITH(amx::dpbf16ps(0, 1, 2), Catch::Contains("before ldtilecfg"));
}

TEST_CASE("bf16 gemm on AMX tiles gives the same bits with 1, 2 and 3 threads", "[amx][gemm][cpu][lesson09]") {
    const test::AmxEmulation emulated;
    const int saved = omp_get_max_threads();
    const int64_t shapes[][3] = {{130, 100, 600}, {64, 520, 96}, {300, 40, 64}};
    for (bool ta : {false, true})
        for (bool tb : {false, true})
            for (const auto& s : shapes) {
                const int64_t M = s[0], N = s[1], K = s[2];
                INFO("ta=" << ta << " tb=" << tb << " M=" << M << " N=" << N << " K=" << K);
                const auto A = random_bf16(size_t(M * K), 11), B = random_bf16(size_t(K * N), 12);
                const auto C0 = random_bf16(size_t(M * N), 13);
                std::vector<std::vector<bf16>> results;
                for (int threads : {1, 2, 3}) {
                    omp_set_num_threads(threads);
                    auto C = C0;
                    cpu::gemm(ta, tb, M, N, K, 0.75f, A.data(), ta ? M : K, B.data(), tb ? K : N, 0.5f, C.data(), N);
                    results.push_back(std::move(C));
                }
                CHECK(std::memcmp(results[0].data(), results[1].data(), results[0].size() * sizeof(bf16)) == 0);
                CHECK(std::memcmp(results[0].data(), results[2].data(), results[0].size() * sizeof(bf16)) == 0);
            }
    omp_set_num_threads(saved);
}

TEST_CASE("a bf16 PackedA on AMX tiles gives the bits of gemm on A itself", "[amx][gemm][cpu][lesson09]") {
    const test::AmxEmulation emulated;
    // Two KC-blocks (K = 600), rows past a 32-row block, columns past a 32-column one.
    const int64_t M = 37, N = 45, K = 600;
    const auto A = random_bf16(size_t(M * K), 31), B = random_bf16(size_t(K * N), 32);
    for (bool ta : {false, true})
        for (bool tb : {false, true}) {
            INFO("ta=" << ta << " tb=" << tb);
            auto want = random_bf16(size_t(M * N), 33), got = want;
            cpu::gemm(ta, tb, M, N, K, 0.75f, A.data(), ta ? M : K, B.data(), tb ? K : N, 0.5f, want.data(), N);
            const cpu::PackedA packed(ta, M, K, A.data(), ta ? M : K);
            REQUIRE(packed.amx_tile_kernel() != nullptr);
            cpu::gemm_packed(packed, tb, N, 0.75f, B.data(), tb ? K : N, 0.5f, got.data(), N);
            CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(bf16)) == 0);
        }
    const cpu::PackedA packed(false, M, K, A.data(), K);
    std::vector<float> B32(size_t(K * N)), C32(size_t(M * N));
    CHECK_THROWS_WITH(cpu::gemm_packed(packed, false, N, 1.0f, B32.data(), N, 0.0f, C32.data(), N),
                      Catch::Contains("holds AMX tiles"));
}
