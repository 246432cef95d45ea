// test_cuda_quant.cpp — chapter 11's CUDA kernels (cuda/quant.cu) against their CPU twins
// (ops/kernels/quant.h), on random data and on the edges: odd sizes, K not a multiple of 4 (the
// dp4a words' padding), row strides wider than the rows, padding, stride and dilation, the extreme
// values (A = 255, B = −128, up to the largest K of the contract), per-channel requantization with
// a fused ReLU (lo = z_y); a MobileNetV2's other kernels: depthwise qconv2d, qglobal_avgpool and
// qadd (on every pair of u8 values), and their Tensor-level ops on both devices.
//
// No tolerance anywhere: the integer kernels add exact products (integer sums do not depend on
// their order), and quantize, dequantize and fake quantization run the same float operations on
// both sides (ops/qparams.h), so every result must have the CPU's bits.
//
// Without a GPU (make) the kernels run on the emulator, under each thread schedule (in order,
// reversed, and for the kernels with barriers shuffled too), so a missing __syncthreads() shows.
//
//   make test T='[quant][cuda]'
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <sstream>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "fixtures.h"
#include "ops/kernels/all.h"
#include "ops/quant.h"
#ifndef KILN_CUDA
#include "kiln_cuda.h"  // the emulator's schedule switch
#endif

using namespace kiln;
using test::require_identical;
using test::under_schedules;

namespace {

// ---- data ------------------------------------------------------------------------------------------
// n integers uniform in [lo, hi]
template <typename T>
std::vector<T> random_ints(int64_t n, int64_t lo, int64_t hi, Rng& rng) {
    std::vector<T> v(static_cast<size_t>(n));
    for (T& x : v) x = T(lo + int64_t(rng.next_below(uint64_t(hi - lo + 1))));
    return v;
}

std::vector<float> random_floats(int64_t n, float lo, float hi, Rng& rng) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = lo + (hi - lo) * Rng::to_unit(rng.next_u64());
    return v;
}

// A copy of v in device memory (a u8 tensor of its bytes: any element type), and back.
template <typename T>
class DeviceArray {
public:
    explicit DeviceArray(const std::vector<T>& v) {
        Tensor t = Tensor::empty({int64_t(v.size() * sizeof(T))}, DType::U8);
        if (!v.empty()) std::memcpy(t.raw(), v.data(), v.size() * sizeof(T));  // (an empty one has no pointer)
        bytes_ = t.to(Device::CUDA);
    }
    explicit DeviceArray(int64_t n) : DeviceArray(std::vector<T>(static_cast<size_t>(n))) {}
    T* get() { return static_cast<T*>(bytes_.raw()); }
    std::vector<T> host() const {
        const Tensor t = bytes_.to(Device::CPU);
        std::vector<T> v(t.nbytes() / sizeof(T));
        if (!v.empty()) std::memcpy(v.data(), t.raw(), t.nbytes());
        return v;
    }

private:
    Tensor bytes_;
};

// Every element the same bits (floats too: NaN against NaN, −0 against −0).
template <typename T>
void require_same_bits(const std::vector<T>& got, const std::vector<T>& want) {
    REQUIRE(got.size() == want.size());
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < want.size(); i++)
        if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0 && bad++ == 0) first = i;
    std::ostringstream msg;
    if (bad) msg << bad << " mismatches; the first at " << first << ": got " << +got[first] << ", want " << +want[first];
    INFO(msg.str());
    REQUIRE(bad == 0);
}

// A test whose outputs were all clamped to one value would compare nothing of interest.
void require_varied(const std::vector<uint8_t>& y) {
    std::vector<bool> seen(256);
    int distinct = 0;
    for (uint8_t v : y) distinct += seen[v] ? 0 : (seen[v] = true, 1);
    REQUIRE(distinct >= 3);
}

// under_schedules (in order, reversed), then, on the emulator, threads shuffled between barriers.
void under_every_schedule(const std::function<void()>& f) {
    under_schedules(f);
#ifndef KILN_CUDA
    emu::ScopedSchedule shuffled(emu::Schedule::Shuffle, 11);
    INFO("emulator schedule: shuffle");
    f();
#endif
}

// ---- a layer's output side (QOutput), on both devices ------------------------------------------------
// Multipliers M_o scaled to the size of the accumulators (acc_scale, about their spread), so
// outputs fall across the u8 range instead of all clamping; relu: lo = z_y, as when a ReLU is fused.
// Given the weights w [O, K], the bias also takes away 128·Σ_k w[o, k], as a layer folds in its
// input's zero point (here the middle of u8): the sums are then as often positive as negative.
struct Output {
    std::vector<int32_t> bias;
    std::vector<Requant> requant;
    int32_t zero_point, lo, hi;
    DeviceArray<int32_t> bias_d;
    DeviceArray<Requant> requant_d;

    Output(int64_t O, double acc_scale, bool relu, Rng& rng, const std::vector<int8_t>& w = {})
        : bias(make_bias(O, acc_scale, rng, w)),
          requant(make_multipliers(O, acc_scale, rng)),
          zero_point(int32_t(16 + rng.next_below(185))),  // in [16, 200]: room on both sides
          lo(relu ? zero_point : 0),
          hi(255),
          bias_d(bias),
          requant_d(requant) {}

    static std::vector<int32_t> make_bias(int64_t O, double acc_scale, Rng& rng, const std::vector<int8_t>& w) {
        std::vector<int32_t> b = random_ints<int32_t>(O, -int64_t(acc_scale), int64_t(acc_scale), rng);
        const size_t K = w.size() / size_t(O);
        for (size_t i = 0; i < w.size(); i++) b[i / K] -= 128 * w[i];
        return b;
    }
    static std::vector<Requant> make_multipliers(int64_t O, double acc_scale, Rng& rng) {
        std::vector<Requant> r(static_cast<size_t>(O));
        for (Requant& x : r) x = make_requant((40.0 + 80.0 * Rng::to_unit(rng.next_u64())) / acc_scale);
        return r;
    }
    QOutput on_host() const { return QOutput{bias.data(), requant.data(), zero_point, lo, hi}; }
    QOutput on_device() { return QOutput{bias_d.get(), requant_d.get(), zero_point, lo, hi}; }
};

// The spread of Σ_k (a_k − 128)·w_k over K terms, a a uniform u8 and w a uniform i8: each factor's
// standard deviation is about 74, so about 74·74·√K.
double acc_spread(int64_t K) { return 5476.0 * std::sqrt(double(K)) + 1.0; }

}  // namespace

// ---- quantize and dequantize -------------------------------------------------------------------------
namespace {

// x [outer, C, inner] quantized to Q and back on both devices, with channel c's scale[c] and
// zero_point[c]; per tensor (C = 1) through quantize/dequantize, which take them by value.
template <typename Q>
void check_round_trip(const std::vector<float>& x, int64_t outer, int64_t C, int64_t inner,
                      const std::vector<float>& scale, const std::vector<int32_t>& zero_point, int32_t qmin,
                      int32_t qmax) {
    const int64_t n = outer * C * inner;
    const bool per_tensor = C == 1;
    INFO((per_tensor ? "per tensor" : "per channel") << ", qmin " << qmin << ", qmax " << qmax);
    std::vector<Q> q(static_cast<size_t>(n));
    std::vector<float> back(static_cast<size_t>(n));
    if (per_tensor) {
        cpu::quantize(x.data(), q.data(), n, scale[0], zero_point[0], qmin, qmax);
        cpu::dequantize(q.data(), back.data(), n, scale[0], zero_point[0]);
    } else {
        cpu::quantize_per_channel(x.data(), q.data(), outer, C, inner, scale.data(), zero_point.data(), qmin, qmax);
        cpu::dequantize_per_channel(q.data(), back.data(), outer, C, inner, scale.data(), zero_point.data());
    }
    DeviceArray<float> x_d(x), scale_d(scale);
    DeviceArray<int32_t> zero_point_d(zero_point);
    under_schedules([&] {
        DeviceArray<Q> q_d(n);
        DeviceArray<float> back_d(n);
        if (per_tensor) {
            cuda::quantize(x_d.get(), q_d.get(), n, scale[0], zero_point[0], qmin, qmax);
            cuda::dequantize(q_d.get(), back_d.get(), n, scale[0], zero_point[0]);
        } else {
            cuda::quantize_per_channel(x_d.get(), q_d.get(), outer, C, inner, scale_d.get(), zero_point_d.get(), qmin,
                                       qmax);
            cuda::dequantize_per_channel(q_d.get(), back_d.get(), outer, C, inner, scale_d.get(), zero_point_d.get());
        }
        require_same_bits(q_d.host(), q);
        require_same_bits(back_d.host(), back);
    });
}

}  // namespace

TEST_CASE("cuda quantize and dequantize match the CPU bit for bit", "[lesson11][cuda][quant]") {
    Rng rng(3);
    const int64_t outer = 3, C = 5, inner = 37, n = outer * C * inner;
    std::vector<float> x = random_floats(n, -3.0f, 3.0f, rng);
    const std::vector<float> scale = random_floats(C, 0.005f, 0.05f, rng);
    // Ties (x = (k + 0.5)·scale rounds to even), out-of-range values, infinities and a NaN (qmin).
    x[0] = 2.5f * scale[0];
    x[1] = -3.5f * scale[0];
    x[2] = 1e9f;
    x[3] = -std::numeric_limits<float>::infinity();
    x[4] = std::numeric_limits<float>::quiet_NaN();
    // Per tensor: u8 with a reduced range, i8.
    check_round_trip<uint8_t>(x, 1, 1, n, {0.02f}, {37}, kActQmin, kActQmaxReduced);
    check_round_trip<int8_t>(x, 1, 1, n, {0.03f}, {0}, kWeightQmin, kWeightQmax);
    // Per channel: u8 affine along dim 1, i8 symmetric along dim 0 (a conv weight [O, C·KH·KW]).
    check_round_trip<uint8_t>(x, outer, C, inner, scale, random_ints<int32_t>(C, 0, 255, rng), kActQmin, kActQmax);
    check_round_trip<int8_t>(x, 1, C, outer * inner, scale, std::vector<int32_t>(static_cast<size_t>(C), 0),
                             kWeightQmin, kWeightQmax);
}

TEST_CASE("cuda fake quantization, forward and straight-through backward, matches the CPU", "[lesson11][cuda][quant]") {
    Rng rng(5);
    const int64_t outer = 4, C = 3, inner = 29, n = outer * C * inner;
    std::vector<float> x = random_floats(n, -2.0f, 2.0f, rng);
    const std::vector<float> dy = random_floats(n, -1.0f, 1.0f, rng);
    const std::vector<float> scale = {0.01f, 0.004f, 0.02f};
    const std::vector<int32_t> zp = {128, 0, 77};
    x[0] = 1.3f;  // channel 0: rint(130) + 128 = 258 > 255, outside: dx = 0
    x[1] = 0.0f;  // channel 0: 128, inside: dx = dy
    DeviceArray<float> x_d(x), dy_d(dy), scale_d(scale);
    DeviceArray<int32_t> zp_d(zp);
    std::vector<float> y(static_cast<size_t>(n)), dx(static_cast<size_t>(n));
    cpu::fake_quantize_forward(x.data(), y.data(), outer, C, inner, scale.data(), zp.data(), 0, 255);
    cpu::fake_quantize_backward(x.data(), dy.data(), dx.data(), outer, C, inner, scale.data(), zp.data(), 0, 255);
    under_schedules([&] {
        DeviceArray<float> y_d(n), dx_d(n);
        cuda::fake_quantize_forward(x_d.get(), y_d.get(), outer, C, inner, scale_d.get(), zp_d.get(), 0, 255);
        cuda::fake_quantize_backward(x_d.get(), dy_d.get(), dx_d.get(), outer, C, inner, scale_d.get(), zp_d.get(),
                                     0, 255);
        require_same_bits(y_d.host(), y);
        require_same_bits(dx_d.host(), dx);
    });
    REQUIRE(dx[0] == 0.0f);  // the clamp passes no gradient ...
    REQUIRE(dx[1] == dy[1]);  // ... the rounding passes it through
}

// ---- the dp4a matrix product ---------------------------------------------------------------------------
namespace {

// C = A·Bᵀ on both devices, A u8 [M, K] (row stride lda), B i8 [N, K] (ldb), C int32 [M, N] (ldc);
// C's padding columns must stay as they were.
void check_qgemm(int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc,
                 const std::vector<uint8_t>& A, const std::vector<int8_t>& B) {
    INFO("M=" << M << " N=" << N << " K=" << K << " lda=" << lda << " ldb=" << ldb << " ldc=" << ldc);
    std::vector<int32_t> want(static_cast<size_t>(M * ldc), -7);
    cpu::qgemm_u8s8(M, N, K, A.data(), lda, B.data(), ldb, want.data(), ldc, 255);
    DeviceArray<uint8_t> A_d(A);
    DeviceArray<int8_t> B_d(B);
    under_every_schedule([&] {
        DeviceArray<int32_t> C_d(std::vector<int32_t>(static_cast<size_t>(M * ldc), -7));
        cuda::qgemm_u8s8(M, N, K, A_d.get(), lda, B_d.get(), ldb, C_d.get(), ldc, 255);
        require_same_bits(C_d.host(), want);
    });
}

}  // namespace

TEST_CASE("cuda qgemm_u8s8 (dp4a) matches the CPU exactly", "[lesson11][cuda][quant][qgemm]") {
    Rng rng(7);
    struct Shape3 {
        int64_t M, N, K;
    };
    // Partial tiles (1, 63, 65, 130 against 64×64), K from 0 to past two 32-value steps and not a
    // multiple of 4 (1, 3, 5, 31, 33, 67), and one case per stride wider than its row.
    for (Shape3 s : {Shape3{1, 1, 1}, Shape3{7, 5, 3}, Shape3{65, 63, 67}, Shape3{130, 70, 33},
                     Shape3{64, 64, 32}, Shape3{3, 129, 31}, Shape3{20, 10, 0}, Shape3{33, 17, 5}}) {
        for (int64_t extra : {int64_t(0), int64_t(3)}) {
            const int64_t lda = s.K + extra, ldb = s.K + 2 * extra, ldc = s.N + extra;
            check_qgemm(s.M, s.N, s.K, lda, ldb, ldc, random_ints<uint8_t>(s.M * lda, 0, 255, rng),
                        random_ints<int8_t>(s.N * ldb, -128, 127, rng));
        }
    }
}

TEST_CASE("cuda qgemm_u8s8 is exact at the extremes, up to the contract's largest K", "[lesson11][cuda][quant][qgemm]") {
    // A = 255, B = −128 everywhere: every product is −32640, and the flip's two sums are at their
    // largest: Σ (a − 128)·b = −16256·K and 128·Σ b = −16384·K. K = 65792 is the largest K for which
    // K·255·128 < 2^31 (ops/kernels/quant.h): C = −2,147,450,880, 32,768 from int32's minimum.
    for (int64_t K : {int64_t(5), int64_t(1001), int64_t(65792)}) {
        const int64_t M = 3, N = 2;
        check_qgemm(M, N, K, K, K, N, std::vector<uint8_t>(static_cast<size_t>(M * K), 255),
                    std::vector<int8_t>(static_cast<size_t>(N * K), -128));
    }
    // And the other corners: a = 0 (−128 after the flip) against b = 127 and b = −128.
    Rng rng(8);
    std::vector<uint8_t> A = random_ints<uint8_t>(9 * 13, 0, 1, rng);
    for (uint8_t& a : A) a = a ? 255 : 0;
    std::vector<int8_t> B = random_ints<int8_t>(11 * 13, 0, 1, rng);
    for (int8_t& b : B) b = b ? 127 : -128;
    check_qgemm(9, 11, 13, 13, 13, 11, A, B);
}

// ---- requantization and the int8 Linear ----------------------------------------------------------------
TEST_CASE("cuda requantize_rows and qlinear match the CPU, ReLU fused or not", "[lesson11][cuda][quant]") {
    Rng rng(9);
    for (bool relu : {false, true}) {
        INFO("relu fused: " << relu);
        {  // requantize_rows on accumulators of every size, multipliers above 1 and tiny
            const int64_t M = 13, O = 11;
            const std::vector<int32_t> acc = random_ints<int32_t>(M * O, -(1 << 24), 1 << 24, rng);
            Output out(O, double(1 << 22), relu, rng);
            out.requant[0] = make_requant(1.75);  // M ≥ 1: a negative shift
            out.requant[1] = make_requant(3e-9);
            out.requant_d = DeviceArray<Requant>(out.requant);
            std::vector<uint8_t> want(static_cast<size_t>(M * O));
            cpu::requantize_rows(acc.data(), want.data(), M, O, out.on_host());
            DeviceArray<int32_t> acc_d(acc);
            under_schedules([&] {
                DeviceArray<uint8_t> got(M * O);
                cuda::requantize_rows(acc_d.get(), got.get(), M, O, out.on_device());
                require_same_bits(got.host(), want);
            });
            require_varied(want);
        }
        {  // qlinear: the accumulators (work) and y
            const int64_t N = 17, K = 150, O = 10;
            const std::vector<uint8_t> x = random_ints<uint8_t>(N * K, 0, 255, rng);
            const std::vector<int8_t> w = random_ints<int8_t>(O * K, -128, 127, rng);
            Output out(O, acc_spread(K), relu, rng, w);
            std::vector<uint8_t> want(static_cast<size_t>(N * O));
            std::vector<int32_t> work(static_cast<size_t>(N * O));
            cpu::qlinear(x.data(), w.data(), want.data(), N, K, O, 255, out.on_host(), work.data());
            DeviceArray<uint8_t> x_d(x);
            DeviceArray<int8_t> w_d(w);
            under_every_schedule([&] {
                DeviceArray<uint8_t> got(N * O);
                DeviceArray<int32_t> work_d(N * O);
                cuda::qlinear(x_d.get(), w_d.get(), got.get(), N, K, O, 255, out.on_device(), work_d.get());
                require_same_bits(work_d.host(), work);
                require_same_bits(got.host(), want);
            });
            require_varied(want);
        }
    }
}

// ---- the int8 convolution (and lesson 11's exercise, dp4a_conv_dot) -----------------------------------
// If you rewrote dp4a_conv_dot in cuda/quant.cu, this is the test that tells you whether it is right:
//   make test T='[qconv]'
TEST_CASE("cuda qconv2d (dp4a_conv_dot) matches the CPU exactly", "[lesson11][cuda][quant][qconv]") {
    Rng rng(11);
    auto params = [](int64_t N, int64_t C, int64_t H, int64_t W, int64_t O, int64_t KH, int64_t KW, int64_t stride,
                     int64_t padding, int64_t dilation) {
        Conv2dParams p;
        p.N = N, p.C = C, p.H = H, p.W = W, p.O = O, p.KH = KH, p.KW = KW;
        p.stride = stride, p.padding = padding, p.dilation = dilation;
        return p;
    };
    // LeNet's first layer (K = 25, O = 6 < 8 filters a thread); odd sizes, O = 17 (a partial group
    // of 8), K = 4 (1×1), stride 2 and 3, padding past the kernel's reach, dilation 2.
    for (const Conv2dParams& p : {params(2, 1, 28, 28, 6, 5, 5, 1, 2, 1), params(2, 3, 9, 11, 17, 3, 3, 2, 1, 1),
                                  params(1, 5, 7, 6, 9, 3, 2, 1, 2, 2), params(3, 4, 5, 5, 16, 1, 1, 1, 0, 1),
                                  params(1, 2, 8, 7, 3, 3, 3, 3, 0, 1), params(2, 6, 6, 6, 8, 3, 3, 1, 1, 1)}) {
        const int64_t K = p.C * p.KH * p.KW, ny = p.N * p.O * p.P() * p.Q();
        INFO("N=" << p.N << " C=" << p.C << " H=" << p.H << " W=" << p.W << " O=" << p.O << " K=" << p.KH << "x"
                  << p.KW << " stride=" << p.stride << " padding=" << p.padding << " dilation=" << p.dilation);
        const std::vector<uint8_t> x = random_ints<uint8_t>(p.N * p.C * p.H * p.W, 0, 255, rng);
        const std::vector<int8_t> w = random_ints<int8_t>(p.O * K, -128, 127, rng);
        DeviceArray<uint8_t> x_d(x);
        DeviceArray<int8_t> w_d(w);
        for (int32_t z_x : {0, 255, int32_t(rng.next_below(256))}) {
            const bool relu = z_x != 0;
            INFO("z_x = " << z_x << ", relu fused: " << relu);
            Output out(p.O, acc_spread(K), relu, rng, w);
            std::vector<uint8_t> want(static_cast<size_t>(ny)), work(static_cast<size_t>(cpu::qconv2d_work_bytes(p)));
            cpu::qconv2d(x.data(), w.data(), want.data(), p, z_x, 255, out.on_host(), work.data());
            under_every_schedule([&] {
                DeviceArray<uint8_t> got(ny), work_d(cuda::qconv2d_work_bytes(p));
                cuda::qconv2d(x_d.get(), w_d.get(), got.get(), p, z_x, 255, out.on_device(), work_d.get());
                require_same_bits(got.host(), want);
            });
            require_varied(want);
        }
    }
}

TEST_CASE("cuda qconv2d is exact at the extremes: x = 255, w = -128, padding at 0 and 255", "[lesson11][cuda][quant][qconv]") {
    Conv2dParams p;
    p.N = 1, p.C = 7, p.H = 5, p.W = 6, p.O = 9, p.KH = 3, p.KW = 3, p.padding = 1;
    const int64_t K = p.C * p.KH * p.KW, ny = p.N * p.O * p.P() * p.Q();
    const std::vector<uint8_t> x(static_cast<size_t>(p.N * p.C * p.H * p.W), 255);
    const std::vector<int8_t> w(static_cast<size_t>(p.O * K), -128);
    DeviceArray<uint8_t> x_d(x);
    DeviceArray<int8_t> w_d(w);
    Rng rng(12);
    // The padding reads 0 (border pixels see fewer 255s) or 255 (every pixel sees the same sum).
    for (int32_t z_x : {0, 255}) {
        INFO("z_x = " << z_x);
        Output out(p.O, 32640.0 * double(K), false, rng);
        std::vector<uint8_t> want(static_cast<size_t>(ny)), work(static_cast<size_t>(cpu::qconv2d_work_bytes(p)));
        cpu::qconv2d(x.data(), w.data(), want.data(), p, z_x, 255, out.on_host(), work.data());
        DeviceArray<uint8_t> got(ny), work_d(cuda::qconv2d_work_bytes(p));
        cuda::qconv2d(x_d.get(), w_d.get(), got.get(), p, z_x, 255, out.on_device(), work_d.get());
        require_same_bits(got.host(), want);
        require_varied(want);  // the channels' biases differ
    }
}

TEST_CASE("cuda qconv2d names what it does not take", "[lesson11][cuda][quant][qconv]") {
    Conv2dParams p;
    p.C = 4, p.H = 5, p.W = 5, p.O = 4, p.KH = 3, p.KW = 3;
    p.groups = 2;
    const QOutput out;
    REQUIRE_THROWS_WITH(cuda::qconv2d(nullptr, nullptr, nullptr, p, 0, 255, out, nullptr),
                        Catch::Contains("cuda::qconv2d: groups=2") && Catch::Contains("groups=1"));
    p.groups = 1;
    REQUIRE_THROWS_WITH(cuda::qconv2d(nullptr, nullptr, nullptr, p, 300, 255, out, nullptr),
                        Catch::Contains("x_zero_point=300") && Catch::Contains("QParams"));
}

// ---- pooling and tables --------------------------------------------------------------------------------
TEST_CASE("cuda qmaxpool2d and lookup_u8 match the CPU", "[lesson11][cuda][quant]") {
    Rng rng(13);
    Pool2dParams p;
    p.N = 2, p.C = 3, p.H = 9, p.W = 7;
    struct Window {
        int64_t k, stride, padding;
    };
    for (Window win : {Window{2, 2, 0}, Window{3, 2, 1}, Window{3, 1, 1}}) {
        p.KH = p.KW = win.k, p.stride = win.stride, p.padding = win.padding;
        INFO("kernel " << win.k << " stride " << win.stride << " padding " << win.padding);
        const std::vector<uint8_t> x = random_ints<uint8_t>(p.N * p.C * p.H * p.W, 0, 255, rng);
        std::vector<uint8_t> want(static_cast<size_t>(p.N * p.C * p.P() * p.Q()));
        cpu::qmaxpool2d(x.data(), want.data(), p);
        DeviceArray<uint8_t> x_d(x), got(int64_t(want.size()));
        under_schedules([&] {
            cuda::qmaxpool2d(x_d.get(), got.get(), p);
            require_same_bits(got.host(), want);
        });
    }
    for (int64_t C : {int64_t(1), int64_t(5)}) {  // one table, or one per channel
        const int64_t outer = 3, inner = 41, n = outer * C * inner;
        const std::vector<uint8_t> x = random_ints<uint8_t>(n, 0, 255, rng), table = random_ints<uint8_t>(C * 256, 0, 255, rng);
        std::vector<uint8_t> want(static_cast<size_t>(n));
        cpu::lookup_u8(x.data(), want.data(), outer, C, inner, table.data());
        DeviceArray<uint8_t> x_d(x), table_d(table), got(n);
        under_schedules([&] {
            cuda::lookup_u8(x_d.get(), got.get(), outer, C, inner, table_d.get());
            require_same_bits(got.host(), want);
        });
        require_varied(want);
    }
}

// ---- a MobileNetV2's other int8 kernels: depthwise qconv2d, qglobal_avgpool, qadd ------------------------
namespace {

// A depthwise convolution: groups = O = C, w [C, 1, K, K].
Conv2dParams depthwise_params(int64_t N, int64_t C, int64_t H, int64_t W, int64_t K, int64_t stride, int64_t padding,
                              int64_t dilation) {
    Conv2dParams p;
    p.N = N, p.C = C, p.H = H, p.W = W, p.O = C, p.KH = K, p.KW = K;
    p.stride = stride, p.padding = padding, p.dilation = dilation, p.groups = C;
    return p;
}

}  // namespace

TEST_CASE("cuda qconv2d depthwise matches the CPU exactly", "[lesson11][cuda][quant][qconv][depthwise]") {
    Rng rng(14);
    // MobileNetV2's 3×3 at stride 1 and 2 with padding 1, a 5×5, dilation 2, no padding at an odd size.
    for (const Conv2dParams& p : {depthwise_params(2, 5, 7, 9, 3, 1, 1, 1), depthwise_params(3, 8, 10, 10, 3, 2, 1, 1),
                                  depthwise_params(1, 3, 6, 5, 5, 1, 2, 1), depthwise_params(2, 4, 9, 9, 3, 1, 2, 2),
                                  depthwise_params(2, 6, 8, 7, 3, 2, 0, 1)}) {
        const int64_t K = p.KH * p.KW, ny = p.N * p.O * p.P() * p.Q();
        INFO("N=" << p.N << " C=" << p.C << " H=" << p.H << " W=" << p.W << " K=" << p.KH << "x" << p.KW
                  << " stride=" << p.stride << " padding=" << p.padding << " dilation=" << p.dilation);
        const std::vector<uint8_t> x = random_ints<uint8_t>(p.N * p.C * p.H * p.W, 0, 255, rng);
        const std::vector<int8_t> w = random_ints<int8_t>(p.C * K, -128, 127, rng);
        DeviceArray<uint8_t> x_d(x);
        DeviceArray<int8_t> w_d(w);
        REQUIRE(cpu::qconv2d_work_bytes(p) == 0);
        REQUIRE(cuda::qconv2d_work_bytes(p) == 0);
        for (int32_t z_x : {0, 255, int32_t(rng.next_below(256))}) {
            const bool relu = z_x != 0;
            INFO("z_x = " << z_x << ", relu fused: " << relu);
            Output out(p.O, acc_spread(K), relu, rng, w);
            std::vector<uint8_t> want(static_cast<size_t>(ny));
            cpu::qconv2d(x.data(), w.data(), want.data(), p, z_x, 255, out.on_host(), nullptr);
            under_schedules([&] {
                DeviceArray<uint8_t> got(ny);
                cuda::qconv2d(x_d.get(), w_d.get(), got.get(), p, z_x, 255, out.on_device(), nullptr);
                require_same_bits(got.host(), want);
            });
            require_varied(want);
        }
    }
}

TEST_CASE("cuda qglobal_avgpool matches the CPU", "[lesson11][cuda][quant]") {
    Rng rng(15);
    // Planes of 1, 16 (4×4), 49 (7×7) and 1000 values, and the largest sums (all 255).
    for (int64_t S : {int64_t(1), int64_t(16), int64_t(49), int64_t(1000)}) {
        for (bool full : {false, true}) {
            const int64_t NC = 2 * 37;
            INFO("S=" << S << (full ? ", all 255" : ""));
            const std::vector<uint8_t> x = full ? std::vector<uint8_t>(static_cast<size_t>(NC * S), 255)
                                                : random_ints<uint8_t>(NC * S, 0, 255, rng);
            std::vector<uint8_t> want(static_cast<size_t>(NC));
            cpu::qglobal_avgpool(x.data(), want.data(), NC, S);
            DeviceArray<uint8_t> x_d(x);
            under_schedules([&] {
                DeviceArray<uint8_t> got(NC);
                cuda::qglobal_avgpool(x_d.get(), got.get(), NC, S);
                require_same_bits(got.host(), want);
            });
        }
    }
}

TEST_CASE("cuda qadd matches the CPU bit for bit on every pair of u8 values", "[lesson11][cuda][quant][qadd]") {
    // s_a = s_b, s_a = 10·s_b, s_b = 10·s_a, a fused ReLU's range, the largest scale ratio allowed.
    struct Ranges {
        QParams a, b, y;
    };
    const Ranges cases[] = {{{0.05f, 128}, {0.05f, 100}, {0.1f, 110}},
                            {{0.5f, 0}, {0.05f, 200}, {0.6f, 40}},
                            {{0.02f, 30}, {0.2f, 128}, {0.25f, 128}},
                            {{0.1f, 10}, {0.1f, 10}, {0.2f, 30, 30, 255}},
                            {{1.0f, 5}, {1.0f / 4096, 128}, {1.0f, 0}}};
    std::vector<uint8_t> a(65536), b(65536);  // every pair once: a = i mod 256, b = i / 256
    for (size_t i = 0; i < a.size(); i++) a[i] = uint8_t(i % 256), b[i] = uint8_t(i / 256);
    DeviceArray<uint8_t> a_d(a), b_d(b);
    for (const Ranges& r : cases) {
        INFO("s_a " << r.a.scale << ", s_b " << r.b.scale << ", s_y " << r.y.scale);
        const QAddParams q = qadd_params(r.a, r.b, r.y);
        std::vector<uint8_t> want(a.size());
        cpu::qadd(a.data(), b.data(), want.data(), int64_t(a.size()), q);
        under_schedules([&] {
            DeviceArray<uint8_t> got(int64_t(a.size()));
            cuda::qadd(a_d.get(), b_d.get(), got.get(), int64_t(a.size()), q);
            require_same_bits(got.host(), want);
        });
        require_varied(want);
    }
}

TEST_CASE("the Tensor-level depthwise qconv2d, qadd and qglobal_avgpool on cuda give the CPU's bytes",
          "[lesson11][cuda][quant]") {
    Rng rng(16);
    const int64_t N = 2, C = 6;
    // A CPU tensor of `shape` holding v's bytes.
    auto tensor = [](const Shape& shape, DType dtype, const auto& v) {
        Tensor t = Tensor::empty(shape, dtype);
        std::memcpy(t.raw(), v.data(), t.nbytes());
        return t;
    };
    const Tensor x = tensor({N, C, 7, 5}, DType::U8, random_ints<uint8_t>(N * C * 35, 0, 255, rng));
    const Tensor x2 = tensor({N, C, 7, 5}, DType::U8, random_ints<uint8_t>(N * C * 35, 0, 255, rng));
    const std::vector<int8_t> wv = random_ints<int8_t>(C * 9, -128, 127, rng);
    const Tensor w = tensor({C, 1, 3, 3}, DType::I8, wv);
    Output o(C, acc_spread(9), true, rng, wv);
    const Tensor bias = tensor({C}, DType::I32, o.bias), requant = tensor({C, 2}, DType::I32, o.requant);
    const QLayerOutput out{bias, requant, o.zero_point, o.lo, o.hi};
    const QLayerOutput out_d{bias.to(Device::CUDA), requant.to(Device::CUDA), o.zero_point, o.lo, o.hi};
    const Tensor x_d = x.to(Device::CUDA);
    for (int64_t stride : {int64_t(1), int64_t(2)}) {
        const Tensor y = qconv2d(x, w, out, stride, 1, 1, C, 128, 255);
        require_identical(qconv2d(x_d, w.to(Device::CUDA), out_d, stride, 1, 1, C, 128, 255), y);
    }
    const QParams qa{0.04f, 120}, qb{0.03f, 70}, qy{0.06f, 100};
    require_identical(qadd(x_d, qa, x2.to(Device::CUDA), qb, qy), qadd(x, qa, x2, qb, qy));
    require_identical(qglobal_avgpool(x_d), qglobal_avgpool(x));
    REQUIRE_THROWS_WITH(qadd(x, qa, x_d, qb, qy), Catch::Contains("qadd: tensors on different devices"));
}
