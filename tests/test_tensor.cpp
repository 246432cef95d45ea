// test_tensor.cpp — tensors: creation, views, element access, printing, the counter-based RNG.
// Converting a tensor to another dtype (Tensor::to, f16/bf16 rounding): test_convert.cpp.
//
//   make test T='[tensor]'
#include <omp.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>

#include "core/rng.h"
#include "core/tensor.h"

using namespace kiln;

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
