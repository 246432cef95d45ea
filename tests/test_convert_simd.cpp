// test_convert_simd.cpp — the vector f16/bf16 ↔ f32 kernels (ops/cpu/convert_simd.h) give
// dtype.h's bits for every input, and so do the GEMM, Tensor::to and the elementwise kernels
// (ops/cpu/f32_blocks.h) that use them, whichever path runs (chapter 09).
//
//   ./kiln_tests '[lowp]'
//
// The widening directions are tested on all 65536 inputs. The narrowing ones take 2^32 inputs,
// too many; instead, every exponent (with the mantissas that sit on a rounding boundary of f16
// and of bf16: ties with an even and an odd result, one ulp either side), subnormals, ±0, ±inf,
// quiet and signalling NaNs with payloads, then 4 million random bit patterns.
// On a CPU without AVX2 + F16C only the portable kernels exist; the cases say so and check those.
#include <catch2/catch.hpp>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iterator>
#include <random>
#include <type_traits>
#include <vector>

#include "core/cpu_features.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "ops/kernels/all.h"
#include "ops/cpu/convert_simd.h"
#include "ops/cpu/gemm.h"
#include "ops/cpu/gemm_tile.h"
#include "fixtures.h"

using namespace kiln;
using test::runnable_levels;
using test::under_each_level;

namespace {

uint32_t bits(float x) { return bits_of(x); }

// Every 16-bit pattern, as T.
template <typename T>
std::vector<T> all_16bit() {
    std::vector<T> v(65536);
    for (uint32_t i = 0; i < 65536; ++i) v[i].bits = uint16_t(i);
    return v;
}

// f32 inputs for the narrowing kernels (see the header comment).
std::vector<float> narrowing_inputs() {
    std::vector<uint32_t> u;
    const uint32_t mantissas[] = {
        0, 1, 0x7fffff, 0x400000, 0x3fffff,
        0x1000, 0x0fff, 0x1001, 0x3000, 0x2fff, 0x3001,  // f16: ties at bit 12, even and odd result
        0x8000, 0x7fff, 0x8001, 0x18000, 0x17fff, 0x18001,  // bf16: ties at bit 15
        0x7fe000, 0x7ff000, 0x7fefff, 0x7ff001, 0x7f8000, 0x7fffff};  // round up into the next exponent
    for (uint32_t sign : {0u, 0x80000000u})
        for (uint32_t e = 0; e < 256; ++e)  // e = 0: f32 subnormals; e = 255: inf and NaNs
            for (uint32_t m : mantissas) u.push_back(sign | e << 23 | m);
    // Around f16's limits: the largest finite 65504, the overflow threshold 65520, the
    // smallest normal 2^-14, the subnormals down to 2^-24 and the half of it that rounds to 0.
    for (float x : {65504.0f, 65519.996f, 65520.0f, 65536.0f, 6.1035156e-05f, 5.9604645e-08f,
                    2.9802322e-08f, 2.9802326e-08f, 8.940697e-08f, 1.0f, 0.5f})
        for (int d = -3; d <= 3; ++d) u.push_back(bits(x) + uint32_t(d)), u.push_back((bits(x) + uint32_t(d)) | 0x80000000u);
    std::mt19937 rng(2026);
    for (int i = 0; i < (1 << 22); ++i) u.push_back(rng());
    std::vector<float> x(u.size());
    std::memcpy(x.data(), u.data(), u.size() * 4);
    return x;
}

// Runs kernel at every runnable level on x and checks each result's bits against `want`.
template <typename From, typename To, typename Want>
void check_every_level(const std::vector<From>& x, Want want) {
    for (CpuLevel level : runnable_levels()) {
        const cpu::ConvertKernel<From, To> k = cpu::convert_kernel<From, To>(level);
        INFO("level " << cpu_level_name(level) << ", kernel " << k.name);
        std::vector<To> y(x.size());
        k.run(x.data(), y.data(), int64_t(x.size()));
        size_t wrong = 0, first = 0;
        for (size_t i = 0; i < x.size(); ++i)
            if (!want(x[i], y[i]) && wrong++ == 0) first = i;
        INFO(wrong << " wrong results, the first at index " << first);
        CHECK(wrong == 0);
    }
}

}  // namespace

TEST_CASE("f16 -> f32 in vectors: all 65536 patterns as dtype.h", "[cpu][lowp][lesson09]") {
    check_every_level<f16, float>(all_16bit<f16>(),
                                  [](f16 h, float y) { return bits(y) == bits(f16_to_f32(h.bits)); });
}

TEST_CASE("bf16 -> f32 in vectors: all 65536 patterns as dtype.h", "[cpu][lowp][lesson09]") {
    check_every_level<bf16, float>(all_16bit<bf16>(),
                                   [](bf16 b, float y) { return bits(y) == bits(bf16_to_f32(b.bits)); });
}

TEST_CASE("f32 -> f16 in vectors: every exponent, ties, subnormals, inf, NaN, 4M random", "[cpu][lowp][lesson09]") {
    check_every_level<float, f16>(narrowing_inputs(), [](float x, f16 h) { return h.bits == f32_to_f16(x); });
}

TEST_CASE("f32 -> bf16 in vectors: every exponent, ties, subnormals, inf, NaN, 4M random", "[cpu][lowp][lesson09]") {
    check_every_level<float, bf16>(narrowing_inputs(), [](float x, bf16 b) { return b.bits == f32_to_bf16(x); });
}

TEST_CASE("vector conversions handle every run length and leave what follows alone", "[cpu][lowp][lesson09]") {
    // Runs of 0..64 elements starting at every offset 0..15 (the kernels go 8 or 16 at a time,
    // the AVX-512 ones' last n % 16 by the AVX2 ones).
    std::vector<float> x(80);
    for (size_t i = 0; i < x.size(); ++i) x[i] = 1.0f + 0.37f * float(i);
    for (CpuLevel level : runnable_levels()) {
        const auto narrow = cpu::convert_kernel<float, f16>(level);
        for (int64_t offset = 0; offset < 16; ++offset)
            for (int64_t n = 0; offset + n <= 80; ++n) {
                std::vector<f16> y(80, f16(-7.0f));
                narrow.run(x.data() + offset, y.data() + offset, n);
                for (int64_t i = 0; i < 80; ++i) {
                    const bool inside = i >= offset && i < offset + n;
                    INFO("level " << cpu_level_name(level) << " offset " << offset << " n " << n << " i " << i);
                    REQUIRE(y[size_t(i)].bits == (inside ? f32_to_f16(x[size_t(i)]) : f32_to_f16(-7.0f)));
                }
            }
    }
}

TEST_CASE("bf16 pairs interleaved: every slot's bits on every level and run length, nothing after the run",
          "[cpu][lowp][lesson09]") {
    // slots[j] = x0[j] | x1[j] << 16 (x1 null: high halves 0). Runs of 0..64 slots from every
    // offset 0..15 (the AVX-512 kernel goes 16 at a time, the rest one by one); the bit patterns
    // include NaNs and subnormals, which a copy of bits must not touch.
    std::vector<bf16> x0(80), x1(80);
    for (size_t i = 0; i < x0.size(); ++i) {
        x0[i].bits = uint16_t(0x7f81 + 977 * i);  // a signalling NaN first, then every exponent
        x1[i].bits = uint16_t(0x0001 + 1231 * i);
    }
    for (CpuLevel level : runnable_levels()) {
        const auto interleave = cpu::interleave_kernel(level);
        for (bool second : {true, false})
            for (int64_t offset = 0; offset < 16; ++offset)
                for (int64_t n = 0; offset + n <= 80; ++n) {
                    std::vector<uint32_t> slots(80, 0xdeadbeefu);
                    interleave.run(x0.data() + offset, second ? x1.data() + offset : nullptr, n,
                                   reinterpret_cast<float*>(slots.data()) + offset);
                    for (int64_t i = 0; i < 80; ++i) {
                        const bool inside = i >= offset && i < offset + n;
                        const uint32_t pair = x0[size_t(i)].bits | (second ? uint32_t(x1[size_t(i)].bits) << 16 : 0u);
                        INFO(interleave.name << " x1 " << (second ? "given" : "null") << " offset " << offset
                                             << " n " << n << " i " << i);
                        REQUIRE(slots[size_t(i)] == (inside ? pair : 0xdeadbeefu));
                    }
                }
    }
}

TEST_CASE("convert_kernel and interleave_kernel refuse a level above the CPU's", "[cpu][lowp][lesson09]") {
    if (detected_cpu_level() == CpuLevel::Amx) return;  // nothing is above
    const CpuLevel above = CpuLevel(uint8_t(detected_cpu_level()) + 1);
    CHECK_THROWS_WITH((cpu::convert_kernel<f16, float>(above)),
                      Catch::Contains("convert_kernel") && Catch::Contains("above what this CPU supports") &&
                          Catch::Contains("cpu_level()"));
    CHECK_THROWS_WITH(cpu::interleave_kernel(above),
                      Catch::Contains("interleave_kernel") && Catch::Contains("above what this CPU supports"));
}

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

TEST_CASE("Tensor::to between f32 and f16/bf16 gives the same bits on every path", "[cpu][lowp][lesson09]") {
    // 100003 elements: past the kernel's parallel threshold, not a multiple of 8; a standard
    // deviation of 3e4 reaches f16's overflow (65520) and its subnormals (below 2^-14).
    Rng rng(7);
    const Tensor x = Tensor::normal({100003}, 0.0f, 3e4f, rng);
    const auto bytes = [](const Tensor& t) {
        const char* p = static_cast<const char*>(t.raw());
        return std::vector<char>(p, p + t.nbytes());
    };
    for (DType t : {DType::F16, DType::BF16}) {
        INFO(dtype_name(t));
        const auto low = under_each_level([&] { return bytes(x.to(t)); });
        const auto back = under_each_level([&] { return bytes(x.to(t).to(DType::F32)); });
        for (size_t i = 1; i < low.size(); ++i) {
            CHECK(low[i] == low[0]);
            CHECK(back[i] == back[0]);
        }
    }
}

// ---- the kernels that run their f32 loop in blocks (ops/cpu/f32_blocks.h) ---------------------
namespace {

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
std::vector<float> widen_each(const std::vector<T>& v) {
    std::vector<float> w(v.size());
    for (size_t i = 0; i < v.size(); ++i) w[i] = float(v[i]);
    return w;
}

// op(a, b, y) run on T and on float: y in T must hold, bit for bit, the float y rounded element
// by element with dtype.h's T(float).
template <typename T, typename Op>
void check_rounded_once(const char* name, const std::vector<T>& a, const std::vector<T>& b, Op op) {
    INFO(name << " on " << a.size() << " elements");
    std::vector<T> y(a.size());
    std::vector<float> y32(a.size());
    op(a, b, y);
    op(widen_each(a), widen_each(b), y32);
    REQUIRE(y.size() == y32.size());
    size_t wrong = 0, first = 0;
    for (size_t i = 0; i < y.size(); ++i)
        if (y[i].bits != T(y32[i]).bits && wrong++ == 0) first = i;
    INFO(wrong << " wrong results, the first at index " << first);
    CHECK(wrong == 0);
}

template <typename T>
void check_elementwise_blocks() {
    // 1 and 7: one short block; 4095 and 4097 either side of a block (4096); 37865 = 9 blocks and
    // 1001 more: past the parallel threshold (2^15), not a multiple of 8.
    for (size_t n : {size_t(1), size_t(7), size_t(4095), size_t(4097), size_t(37865)}) {
        const std::vector<T> a = with_specials<T>(n, 11, 0), b = with_specials<T>(n, 12, 18);
        const int64_t m = int64_t(n);
        check_rounded_once("add", a, b, [m](const auto& a, const auto& b, auto& y) {
            cpu::add(a.data(), b.data(), y.data(), m);
        });
        check_rounded_once("mul", a, b, [m](const auto& a, const auto& b, auto& y) {
            cpu::mul(a.data(), b.data(), y.data(), m);
        });
        check_rounded_once("mul into a", a, b, [m](const auto& a, const auto& b, auto& y) {
            y = a;
            cpu::mul(y.data(), b.data(), y.data(), m);
        });
        check_rounded_once("axpy", a, b, [m](const auto& a, const auto& b, auto& y) {
            y = b;
            cpu::axpy(-0.75f, a.data(), y.data(), m);
        });
        check_rounded_once("scale", a, b, [m](const auto& a, const auto&, auto& y) {
            y = a;
            cpu::scale(y.data(), m, 1.7f);
        });
        for (float cap : {INFINITY, 6.0f}) {
            check_rounded_once("relu_forward", a, b, [m, cap](const auto& a, const auto&, auto& y) {
                cpu::relu_forward(a.data(), y.data(), m, cap);
            });
            check_rounded_once("relu_backward", a, b, [m, cap](const auto& a, const auto& b, auto& y) {
                cpu::relu_backward(a.data(), b.data(), y.data(), m, cap);
            });
        }
        check_rounded_once("gelu_forward", a, b, [m](const auto& a, const auto&, auto& y) {
            cpu::gelu_forward(a.data(), y.data(), m);
        });
        check_rounded_once("gelu_backward", a, b, [m](const auto& a, const auto& b, auto& y) {
            cpu::gelu_backward(a.data(), b.data(), y.data(), m);
        });
        std::vector<uint8_t> mask(n);
        check_rounded_once("dropout_forward", a, b, [m, &mask](const auto& a, const auto&, auto& y) {
            cpu::dropout_forward(a.data(), y.data(), mask.data(), m, 0.3f, 0x5eedu, 1000);
        });
        check_rounded_once("dropout_backward", a, b, [m, &mask](const auto&, const auto& b, auto& y) {
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

// Rows of S values in {-2, -1.5, ..., 2}, each row's value at s and at S - 1 - s opposite (0 in
// the middle): every row sums to exactly 0, and the norms' sums below (of x, x², dy, dy·x,
// γ·dy·x̂ with γ in quarters and x̂ = 2x) are exact in any order, fused or not. So f32 and T
// compute the same statistics, and the T kernel's y must be the f32 kernel's y rounded once.
template <typename T>
std::vector<T> opposite_pairs(int64_t rows, int64_t S, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> half(-4, 4);
    std::vector<T> v(size_t(rows * S), T(0.0f));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t s = 0; s < S / 2; s++) {
            const float x = 0.5f * float(half(rng));
            v[size_t(r * S + s)] = T(x);
            v[size_t(r * S + S - 1 - s)] = T(-x);
        }
    return v;
}

// The norms and the pooling backwards: y in T is the f32 kernel's y rounded once.
template <typename T>
void check_norm_and_pool_blocks() {
    // S = 5: rows shorter than a block; S = 4100: a row of a whole block and 4 more.
    for (int64_t S : {int64_t(5), int64_t(4100)}) {
        BatchNormParams p;
        p.N = 3, p.C = 4, p.S = S;
        const std::vector<T> x = opposite_pairs<T>(p.N * p.C, S, 21), dy = opposite_pairs<T>(p.N * p.C, S, 22);
        const std::vector<float> gamma = {0.5f, 1.25f, -0.75f, 2.0f}, beta = {0.1f, -0.2f, 0.0f, 0.3f};
        check_rounded_once("batchnorm_forward_train", x, dy, [&](const auto& x, const auto&, auto& y) {
            std::vector<float> rm(4), rv(4, 1.0f), sm(4), si(4);
            cpu::batchnorm_forward_train(x.data(), gamma.data(), beta.data(), y.data(), rm.data(), rv.data(),
                                         sm.data(), si.data(), p);
        });
        check_rounded_once("batchnorm_forward_eval", x, dy, [&](const auto& x, const auto&, auto& y) {
            const std::vector<float> rm = {0.1f, -0.3f, 0.0f, 0.5f}, rv = {0.9f, 1.1f, 2.0f, 0.5f};
            cpu::batchnorm_forward_eval(x.data(), gamma.data(), beta.data(), rm.data(), rv.data(), y.data(), p);
        });
        check_rounded_once("batchnorm_backward", x, dy, [&](const auto& x, const auto& dy, auto& dx) {
            const std::vector<float> sm(4, 0.0f), si = {1.1f, 0.9f, 0.7f, 1.3f};
            std::vector<float> dg(4), db(4);
            cpu::batchnorm_backward(dy.data(), x.data(), gamma.data(), beta.data(), sm.data(), si.data(), dx.data(),
                                    dg.data(), db.data(), p);
        });
        // layer norm: R = N·C rows of D = S
        const int64_t R = p.N * p.C, D = S;
        const size_t rows = static_cast<size_t>(R), cols = static_cast<size_t>(D);
        std::vector<float> lg(cols), lb(cols);
        for (size_t d = 0; d < cols; d++) lg[d] = 1.0f + 0.25f * float(d % 4), lb[d] = 0.01f * float(d % 7);
        check_rounded_once("layernorm_forward", x, dy, [&](const auto& x, const auto&, auto& y) {
            std::vector<float> mean(rows), invstd(rows);
            cpu::layernorm_forward(x.data(), lg.data(), lb.data(), y.data(), mean.data(), invstd.data(), R, D, 1e-5f);
        });
        check_rounded_once("layernorm_backward", x, dy, [&](const auto& x, const auto& dy, auto& dx) {
            std::vector<float> mean(rows, 0.0f), invstd(rows, 2.0f), dg(cols), db(cols);
            cpu::layernorm_backward(dy.data(), x.data(), lg.data(), mean.data(), invstd.data(), dx.data(), dg.data(),
                                    db.data(), R, D);
        });
    }
    // Pooling backward: overlapping 3×3 windows, stride 2, summed in an F32Plane and rounded once.
    Pool2dParams p;
    p.N = 2, p.C = 3, p.H = 13, p.W = 11, p.KH = 3, p.KW = 3, p.stride = 2, p.padding = 1;
    const size_t nx = size_t(p.N * p.C * p.H * p.W);
    const std::vector<T> x = random_lowp<T>(nx, 31), dy = random_lowp<T>(nx, 32);  // dy: the first N·C·P·Q
    std::vector<int32_t> argmax(size_t(p.N * p.C * p.P() * p.Q()));
    std::vector<T> y(argmax.size());
    cpu::maxpool2d_forward(x.data(), y.data(), argmax.data(), p);
    check_rounded_once("maxpool2d_backward", x, dy, [&](const auto&, const auto& dy, auto& dx) {
        cpu::maxpool2d_backward(dy.data(), argmax.data(), dx.data(), p);
    });
    check_rounded_once("avgpool2d_backward", x, dy, [&](const auto&, const auto& dy, auto& dx) {
        cpu::avgpool2d_backward(dy.data(), dx.data(), p);
    });
}

// Each check at every runnable level (the portable and the vector conversions) on 1 and 2 threads.
template <typename F>
void on_each_level_and_thread_count(F check) {
    const int saved = omp_get_max_threads();
    for (int threads : {1, 2}) {
        omp_set_num_threads(threads);
        INFO(threads << " thread(s)");
        under_each_level([&] {
            INFO("level " << cpu_level_name(cpu_level()));
            check();
            return 0;
        });
    }
    omp_set_num_threads(saved);
}

}  // namespace

TEST_CASE("f16 and bf16 elementwise kernels in f32 blocks give the f32 kernel's result rounded once, bit for bit",
          "[cpu][lowp][lesson09][elementwise][relu][gelu][dropout]") {
    on_each_level_and_thread_count(check_elementwise_blocks<f16>);
    on_each_level_and_thread_count(check_elementwise_blocks<bf16>);
}

TEST_CASE("f16 and bf16 batch norm, layer norm and pooling backward give the f32 kernel's result rounded once",
          "[cpu][lowp][lesson09][batchnorm][layernorm][pool]") {
    on_each_level_and_thread_count(check_norm_and_pool_blocks<f16>);
    on_each_level_and_thread_count(check_norm_and_pool_blocks<bf16>);
}
