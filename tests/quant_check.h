// quant_check.h — what the int8 kernels' CUDA cases (chapter 11) share: random integers and
// floats, device copies of host vectors, the bit-for-bit comparison, a run under every emulator
// schedule, and a layer's output side (bias, per-channel requantization, zero point, ReLU clamp)
// on both devices. The cases: test_qgemm.cpp (qgemm, qlinear, qconv2d, pooling, qadd) and
// test_quant_model.cpp (quantize, dequantize, fake quantization, the Tensor-level ops), each
// beside the same kernel's CPU cases.
//
// No tolerance anywhere: the integer kernels add exact products (integer sums do not depend on
// their order), and quantize, dequantize and fake quantization run the same float operations on
// both sides (ops/qparams.h), so every result must have the CPU's bits.
#pragma once
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <functional>
#include <sstream>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "fixtures.h"
#include "ops/all.h"
#ifndef KILN_CUDA
#include "kiln_cuda.h"  // the emulator's schedule switch
#endif

namespace kiln::test::quant {

// ---- data ------------------------------------------------------------------------------------------
// n integers uniform in [lo, hi]
template <typename T>
std::vector<T> random_ints(int64_t n, int64_t lo, int64_t hi, Rng& rng) {
    std::vector<T> v(static_cast<size_t>(n));
    for (T& x : v) x = T(lo + int64_t(rng.next_below(uint64_t(hi - lo + 1))));
    return v;
}

inline std::vector<float> random_floats(int64_t n, float lo, float hi, Rng& rng) {
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
inline void require_varied(const std::vector<uint8_t>& y) {
    std::vector<bool> seen(256);
    int distinct = 0;
    for (uint8_t v : y) distinct += seen[v] ? 0 : (seen[v] = true, 1);
    REQUIRE(distinct >= 3);
}

// under_schedules (in order, reversed), then, on the emulator, threads shuffled between barriers.
inline void under_every_schedule(const std::function<void()>& f) {
    test::under_schedules(f);
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
inline double acc_spread(int64_t K) { return 5476.0 * std::sqrt(double(K)) + 1.0; }

}  // namespace kiln::test::quant
