// test_convert.cpp — converting between dtypes (chapters 01 and 09): the scalar f16/bf16
// conversions of core/dtype.h (round to nearest even, inf, NaN, subnormals), Tensor::to between
// every pair of types on the CPU and on CUDA (bit for bit as the CPU), f16 -> bf16 through the
// exact f32 value, and float_format's constants.
//
//   make test T='[convert]'
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "fixtures.h"

using namespace kiln;
using test::require_identical;
using test::under_schedules;

namespace {

uint32_t bits(float x) { return bits_of(x); }
float from_bits(uint32_t u) {
    float x;
    std::memcpy(&x, &u, 4);
    return x;
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
