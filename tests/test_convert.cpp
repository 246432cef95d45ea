// test_convert.cpp — converting between dtypes (chapters 01 and 09), every backend: the scalar
// f16/bf16 conversions of core/dtype.h (round to nearest even, inf, NaN, subnormals), Tensor::to
// between every pair of types on the CPU and on CUDA (bit for bit as the CPU), f16 -> bf16
// through the exact f32 value, float_format's constants; and the CPU's vector f16/bf16 <-> f32
// kernels (ops/cpu/convert_simd.h), which must give dtype.h's bits for every input, as must
// Tensor::to whichever path runs, and the bf16 pairs the bf16 GEMM packs.
//
// The widening directions are tested on all 65536 inputs. The narrowing ones take 2^32 inputs,
// too many; instead, every exponent (with the mantissas that sit on a rounding boundary of f16
// and of bf16: ties with an even and an odd result, one ulp either side), subnormals, ±0, ±inf,
// quiet and signalling NaNs with payloads, then 4 million random bit patterns.
// On a CPU without AVX2 + F16C only the portable kernels exist; the cases check those.
//
//   make test T='[convert]'
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/cpu_features.h"
#include "core/dtype.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "fixtures.h"
#include "ops/cpu/convert_simd.h"

using namespace kiln;
using test::require_identical;
using test::runnable_levels;
using test::under_each_level;
using test::under_schedules;

namespace {

uint32_t bits(float x) { return bits_of(x); }
float from_bits(uint32_t u) {
    float x;
    std::memcpy(&x, &u, 4);
    return x;
}

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

// ---- the scalar conversions and Tensor::to on the CPU --------------------------------------------
TEST_CASE("f16 conversion rounds to nearest even and keeps specials", "[dtype][convert][cpu][lesson01]") {
    // exact values survive
    for (float v : {0.0f, 1.0f, -2.0f, 0.5f, 65504.0f, 6.103515625e-05f /* 2^-14 */, 5.960464477539063e-08f /* 2^-24 */})
        REQUIRE(f16_to_f32(f32_to_f16(v)) == v);
    REQUIRE(f32_to_f16(1.0f) == 0x3c00);
    REQUIRE(f32_to_f16(-0.0f) == 0x8000);
    // 1 + 2^-11 lies halfway between 1 and 1 + 2^-10: ties go to the even mantissa (1.0)
    REQUIRE(f32_to_f16(1.0f + 0.00048828125f) == 0x3c00);
    // 1 + 3·2^-11 lies halfway between 1+2^-10 (odd) and 1+2^-9 (even): rounds up
    REQUIRE(f32_to_f16(1.0f + 3 * 0.00048828125f) == 0x3c02);
    // just above halfway rounds up
    REQUIRE(f32_to_f16(from_bits(bits(1.0f + 0.00048828125f) + 1)) == 0x3c01);
    // overflow: 65519 rounds to 65504, 65520 (halfway to 2^16) to inf
    REQUIRE(f32_to_f16(65519.0f) == 0x7bff);
    REQUIRE(f32_to_f16(65520.0f) == 0x7c00);
    REQUIRE(f32_to_f16(-1e9f) == 0xfc00);
    REQUIRE(std::isinf(f16_to_f32(0x7c00)));
    REQUIRE(std::isnan(f16_to_f32(f32_to_f16(std::numeric_limits<float>::quiet_NaN()))));
    REQUIRE(f32_to_f16(std::numeric_limits<float>::infinity()) == 0x7c00);
    // subnormals: 2^-24 is the smallest; half of it ties to even (0); 1.5·2^-24 rounds to 2·2^-24
    REQUIRE(f32_to_f16(5.960464477539063e-08f) == 0x0001);
    REQUIRE(f32_to_f16(2.9802322387695312e-08f) == 0x0000);
    REQUIRE(f32_to_f16(8.940696716308594e-08f) == 0x0002);
    REQUIRE(f16_to_f32(0x03ff) == 0x3ff * 5.960464477539063e-08f);  // largest subnormal
    // the largest subnormal plus a bit rounds up into the smallest normal
    REQUIRE(f32_to_f16(1023.6f * 5.960464477539063e-08f) == 0x0400);
}

TEST_CASE("bf16 conversion rounds to nearest even and keeps specials", "[dtype][convert][cpu][lesson01]") {
    REQUIRE(f32_to_bf16(1.0f) == 0x3f80);
    REQUIRE(bf16_to_f32(0x3f80) == 1.0f);
    // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0)
    REQUIRE(f32_to_bf16(1.0f + 0.00390625f) == 0x3f80);
    REQUIRE(f32_to_bf16(1.0f + 3 * 0.00390625f) == 0x3f82);
    REQUIRE(f32_to_bf16(std::numeric_limits<float>::infinity()) == 0x7f80);
    REQUIRE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
    REQUIRE(f32_to_bf16(std::numeric_limits<float>::max()) == 0x7f80);  // rounds up to inf
    float sub = std::numeric_limits<float>::denorm_min() * 65536.0f;     // a subnormal bf16 keeps
    REQUIRE(bf16_to_f32(f32_to_bf16(sub)) == sub);
}

TEST_CASE("to(dtype) converts every element", "[dtype][convert][cpu][lesson01]") {
    Tensor x = Tensor::arange(5);
    x.set({4}, 1e6);
    Tensor h = x.to(DType::F16);
    REQUIRE(h.dtype() == DType::F16);
    REQUIRE(h.get({3}) == 3.0);
    REQUIRE(std::isinf(h.get({4})));
    REQUIRE(x.to(DType::F32).raw() == x.raw());
}

TEST_CASE("to(integer dtype) rounds to nearest even and saturates; NaN becomes 0", "[dtype][convert][cpu][lesson01]") {
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    //                       x:  3.7  2.5  3.5  -2.5  -0.4  127.4  127.5  300  -1e9  -128.5  NaN  inf  -inf
    const float x[] = {3.7f, 2.5f, 3.5f, -2.5f, -0.4f, 127.4f, 127.5f, 300.0f, -1e9f, -128.5f, nan, inf, -inf};
    const double i8[] = {4, 2, 4, -2, 0, 127, 127, 127, -128, -128, 0, 127, -128};
    const double u8[] = {4, 2, 4, 0, 0, 127, 128, 255, 0, 0, 0, 255, 0};
    const double i32[] = {4, 2, 4, -2, 0, 127, 128, 300, -1e9, -128, 0, 2147483647.0, -2147483648.0};
    Tensor t = Tensor::empty({13});
    for (int64_t i = 0; i < 13; i++) t.data<float>()[i] = x[i];
    Tensor a = t.to(DType::I8), b = t.to(DType::U8), c = t.to(DType::I32);
    for (int64_t i = 0; i < 13; i++) {
        INFO("x = " << x[i]);
        REQUIRE(a.get({i}) == i8[i]);
        REQUIRE(b.get({i}) == u8[i]);
        REQUIRE(c.get({i}) == i32[i]);
    }
    // Between integer types the same rule saturates: i32 300 -> i8 127, i8 -5 -> u8 0.
    REQUIRE(Tensor::full({1}, 300, DType::I32).to(DType::I8).get({0}) == 127);
    REQUIRE(Tensor::full({1}, -5, DType::I8).to(DType::U8).get({0}) == 0);
    // 2^31 - 64 is a float; it converts exactly, and the next float up saturates.
    REQUIRE(Tensor::full({1}, 2147483520.0).to(DType::I32).get({0}) == 2147483520.0);
    REQUIRE(Tensor::full({1}, 2147483648.0).to(DType::I32).get({0}) == 2147483647.0);
}

// ---- on CUDA, and between the 16-bit types ------------------------------------------------------
TEST_CASE("to(dtype) on CUDA converts on the device, bit for bit as the CPU does", "[dtype][convert][cuda][lesson09]") {
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

TEST_CASE("f16 -> bf16 rounds to nearest, through the exact f32 value", "[dtype][convert][cpu][lesson09]") {
    // f16 1 + 2^-9 + 2^-10 = 1.0029296875 lies between the bf16 neighbours 1 and 1 + 2^-7, below
    // the halfway point 1 + 2^-8: it rounds to 1.
    const Tensor h = Tensor::full({1}, 1.0029296875, DType::F16);
    REQUIRE(h.get({0}) == 1.0029296875);
    REQUIRE(h.to(DType::BF16).get({0}) == 1.0);
    REQUIRE(Tensor::full({1}, 1.0068359375, DType::F16).to(DType::BF16).get({0}) == 1.0078125);  // above: up
}

// ---- the formats' constants -------------------------------------------------------------------------
TEST_CASE("float_format reads each type's range and epsilon off its bits", "[dtype][convert][cpu][lesson09]") {
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

// ---- the vector kernels (ops/cpu/convert_simd.h) and Tensor::to on every CPU path (chapter 09) ----
TEST_CASE("f16 -> f32 in vectors: all 65536 patterns as dtype.h", "[convert][cpu][lowp][lesson09]") {
    check_every_level<f16, float>(all_16bit<f16>(),
                                  [](f16 h, float y) { return bits(y) == bits(f16_to_f32(h.bits)); });
}

TEST_CASE("bf16 -> f32 in vectors: all 65536 patterns as dtype.h", "[convert][cpu][lowp][lesson09]") {
    check_every_level<bf16, float>(all_16bit<bf16>(),
                                   [](bf16 b, float y) { return bits(y) == bits(bf16_to_f32(b.bits)); });
}

TEST_CASE("f32 -> f16 in vectors: every exponent, ties, subnormals, inf, NaN, 4M random", "[convert][cpu][lowp][lesson09]") {
    check_every_level<float, f16>(narrowing_inputs(), [](float x, f16 h) { return h.bits == f32_to_f16(x); });
}

TEST_CASE("f32 -> bf16 in vectors: every exponent, ties, subnormals, inf, NaN, 4M random", "[convert][cpu][lowp][lesson09]") {
    check_every_level<float, bf16>(narrowing_inputs(), [](float x, bf16 b) { return b.bits == f32_to_bf16(x); });
}

TEST_CASE("vector conversions handle every run length and leave what follows alone", "[convert][cpu][lowp][lesson09]") {
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
          "[convert][gemm][cpu][lowp][lesson09]") {
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

TEST_CASE("convert_kernel and interleave_kernel refuse a level above the CPU's", "[convert][cpu][lowp][lesson09]") {
    if (detected_cpu_level() == CpuLevel::Amx) {
        test::skip("this CPU runs the highest level (amx): there is no level above it to refuse");
        return;
    }
    const CpuLevel above = CpuLevel(uint8_t(detected_cpu_level()) + 1);
    CHECK_THROWS_WITH((cpu::convert_kernel<f16, float>(above)),
                      Catch::Contains("convert_kernel") && Catch::Contains("above what this CPU supports") &&
                          Catch::Contains("cpu_level()"));
    CHECK_THROWS_WITH(cpu::interleave_kernel(above),
                      Catch::Contains("interleave_kernel") && Catch::Contains("above what this CPU supports"));
}

TEST_CASE("Tensor::to between f32 and f16/bf16 gives the same bits on every path", "[convert][cpu][lowp][lesson09]") {
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
