// test_tensor.cpp — tensors: creation, views, element access, printing, dtype conversion edge
// cases (f16/bf16 rounding, inf, NaN, subnormals), the counter-based RNG.
#include <omp.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/rng.h"
#include "core/tensor.h"

using namespace kiln;

static uint32_t bits(float x) { uint32_t u; std::memcpy(&u, &x, 4); return u; }
static float from_bits(uint32_t u) { float x; std::memcpy(&x, &u, 4); return x; }

TEST_CASE("creation fills shape, dtype and values", "[tensor][cpu][lesson01]") {
    Tensor z = Tensor::zeros({2, 3});
    REQUIRE(z.shape() == Shape({2, 3}));
    REQUIRE(z.numel() == 6);
    REQUIRE(z.dtype() == DType::F32);
    REQUIRE(z.nbytes() == 24);
    REQUIRE(z.get({1, 2}) == 0.0);
    Tensor o = Tensor::ones({4}, DType::I32);
    REQUIRE(o.data<int32_t>()[3] == 1);
    Tensor f = Tensor::full({2, 2}, 2.5, DType::BF16);
    REQUIRE(f.get({1, 1}) == 2.5);
    Tensor a = Tensor::arange(5, DType::U8);
    REQUIRE(a.get({4}) == 4);
    Tensor five = Tensor::zeros({1, 2, 3, 4, 5});
    REQUIRE(five.ndim() == 5);
    REQUIRE(five.size(-1) == 5);
    REQUIRE_THROWS_WITH(Tensor::zeros({1, 2, 3, 4, 5, 6}), Catch::Contains("at most 5 dims"));
}

TEST_CASE("reshape is a view; -1 infers a dim; bad shapes are named", "[tensor][cpu][lesson01]") {
    Tensor x = Tensor::arange(12);
    Tensor v = x.reshape({3, -1});
    REQUIRE(v.shape() == Shape({3, 4}));
    v.set({2, 3}, 100);
    REQUIRE(x.get({11}) == 100);  // same bytes
    Tensor c = x.clone();
    c.set({0}, -1);
    REQUIRE(x.get({0}) == 0);     // clone has its own
    REQUIRE_THROWS_WITH(x.reshape({5, -1}), Catch::Contains("f32[12]"));
    REQUIRE_THROWS_WITH(x.reshape({-1, -1}), Catch::Contains("only one dim may be -1"));
}

TEST_CASE("view: a tensor at a byte offset of another's bytes", "[tensor][cpu][lesson01]") {
    Tensor x = Tensor::arange(12);  // 48 bytes
    Tensor v = x.view(16, {2, 3});  // elements 4..9
    REQUIRE(v.offset() == 16);
    REQUIRE(v.get({0, 0}) == 4);
    REQUIRE(v.data<float>() == x.data<float>() + 4);
    v.set({1, 2}, -9);
    REQUIRE(x.get({9}) == -9);                    // the same bytes
    Tensor flat = v.reshape({6});                 // reshape keeps the offset
    REQUIRE(flat.get({0}) == 4);
    Tensor inner = v.view(4, {2});                // a view of a view: offsets add
    REQUIRE(inner.offset() == 20);
    REQUIRE(inner.get({1}) == 6);
    Tensor c = v.clone();                         // a copy of the view's 24 bytes only
    REQUIRE(c.nbytes() == 24);
    REQUIRE(c.offset() == 0);
    REQUIRE(c.get({1, 2}) == -9);
    REQUIRE(v.to(DType::F16).get({0, 1}) == 5);   // conversions read the view too
    REQUIRE(v.shares_storage(x));
    REQUIRE(!c.shares_storage(x));
    REQUIRE_THROWS_WITH(x.view(40, {3}), Catch::Contains("does not fit"));
}

TEST_CASE("make_slab: views at 256-byte aligned offsets of one zeroed allocation", "[tensor][cpu][lesson01]") {
    Slab s = make_slab({{3}, {2, 2}, {70}}, DType::F32, Device::CPU, Category::Parameter);
    REQUIRE(s.views.size() == 3);
    REQUIRE(s.views[0].offset() == 0);
    REQUIRE(s.views[1].offset() == 256);  // 12 bytes, rounded up
    REQUIRE(s.views[2].offset() == 512);
    REQUIRE(s.whole.nbytes() == 512 + 70 * 4);
    REQUIRE(s.whole.category() == Category::Parameter);
    for (const Tensor& v : s.views) {
        REQUIRE(v.shares_storage(s.whole));
        REQUIRE(reinterpret_cast<uintptr_t>(v.raw()) % 256 == 0);
    }
    s.views[1].set({1, 1}, 5);
    REQUIRE(s.whole.get({64 + 3}) == 5);
    REQUIRE(s.whole.get({10}) == 0);  // padding is zero
}

TEST_CASE("typed access checks dtype and bounds", "[tensor][cpu][lesson01]") {
    Tensor x = Tensor::zeros({2, 2}, DType::I32);
    REQUIRE_THROWS_WITH(x.data<float>(), Catch::Contains("i32[2, 2]"));
    REQUIRE_THROWS_WITH(x.get({2, 0}), Catch::Contains("out of range"));
    REQUIRE_THROWS_WITH(x.get({0}), Catch::Contains("1 indices"));
    Tensor h = Tensor::zeros({3}, DType::F16);
    REQUIRE_NOTHROW(h.data<f16>());
    REQUIRE_THROWS_WITH(h.data<bf16>(), Catch::Contains("data<bf16>() on a f16[3] on cpu"));
    REQUIRE_THROWS(Tensor().item());
}

TEST_CASE("printing shows shape, dtype, device and elides long dims", "[tensor][cpu][lesson01]") {
    Tensor x = Tensor::arange(6).reshape({2, 3});
    REQUIRE(x.str() == "tensor f32[2, 3] on cpu\n[[0, 1, 2],\n [3, 4, 5]]");
    std::string s = Tensor::arange(100).str(6);
    REQUIRE(s.find("0, 1, 2, ..., 97, 98, 99") != std::string::npos);
}

TEST_CASE("f16 conversion rounds to nearest even and keeps specials", "[dtype][cpu][lesson01]") {
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

TEST_CASE("bf16 conversion rounds to nearest even and keeps specials", "[dtype][cpu][lesson01]") {
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

TEST_CASE("to(dtype) converts every element", "[dtype][cpu][lesson01]") {
    Tensor x = Tensor::arange(5);
    x.set({4}, 1e6);
    Tensor h = x.to(DType::F16);
    REQUIRE(h.dtype() == DType::F16);
    REQUIRE(h.get({3}) == 3.0);
    REQUIRE(std::isinf(h.get({4})));
    REQUIRE(x.to(DType::F32).raw() == x.raw());
}

TEST_CASE("to(integer dtype) rounds to nearest even and saturates; NaN becomes 0", "[dtype][cpu][lesson01]") {
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

TEST_CASE("random tensors depend on the seed, not on the thread count", "[rng][cpu][lesson01]") {
    Rng a(7);
    omp_set_num_threads(1);
    Tensor u1 = Tensor::uniform({1000}, -1, 1, a);
    Tensor n1 = Tensor::normal({1000}, 0, 1, a);
    Rng b(7);
    omp_set_num_threads(3);
    Tensor u2 = Tensor::uniform({1000}, -1, 1, b);
    Tensor n2 = Tensor::normal({1000}, 0, 1, b);
    omp_set_num_threads(2);
    REQUIRE(std::memcmp(u1.raw(), u2.raw(), u1.nbytes()) == 0);
    REQUIRE(std::memcmp(n1.raw(), n2.raw(), n1.nbytes()) == 0);
    double mean = 0, var = 0;
    const float* p = n1.data<float>();
    for (int i = 0; i < 1000; i++) mean += p[i] / 1000.0;
    for (int i = 0; i < 1000; i++) var += (p[i] - mean) * (p[i] - mean) / 1000.0;
    REQUIRE(std::fabs(mean) < 0.1);
    REQUIRE(std::fabs(var - 1) < 0.15);
    for (int i = 0; i < 1000; i++) REQUIRE((u1.data<float>()[i] >= -1 && u1.data<float>()[i] < 1));
    Rng c(8);
    REQUIRE(Tensor::uniform({4}, 0, 1, c).get({0}) != u1.get({0}));
}
