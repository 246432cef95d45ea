// lowp_check.cpp — the f16/bf16 checks against f32 (lowp_check.h).
#include "lowp_check.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

namespace kiln::test::lowp {

const LowType kF16 = low_format(DType::F16);
const LowType kBF16 = low_format(DType::BF16);

Tensor values_in(const LowType& t, const Shape& shape, float lo, float hi, Rng& rng) {
    return Tensor::uniform(shape, lo, hi, rng).to(t.dtype).to(DType::F32);
}

Tensor host_f32(const Tensor& t) { return t.to(Device::CPU).to(DType::F32); }

Tensor abs_of(const Tensor& t) {
    Tensor a = host_f32(t).clone();
    float* v = a.data<float>();
    for (int64_t i = 0; i < a.numel(); i++) v[i] = std::fabs(v[i]);
    return a;
}

void require_within(const Tensor& got_t, const Tensor& want_t, const Tensor& S_t, double rel, double tiny) {
    const Tensor got = host_f32(got_t), want = host_f32(want_t), S = host_f32(S_t);
    REQUIRE(got.shape() == want.shape());
    REQUIRE(S.shape() == want.shape());
    const float *g = got.data<float>(), *w = want.data<float>(), *s = S.data<float>();
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < got.numel(); i++)
        if (!(std::fabs(double(g[i]) - double(w[i])) <= rel * double(s[i]) + tiny) && bad++ == 0) first = i;
    INFO("mismatches: " << bad << " of " << got.numel());
    if (bad) INFO("first at " << first << ": got " << g[first] << ", f32 " << w[first] << ", bound "
                              << rel * double(s[first]) + tiny);
    REQUIRE(bad == 0);
}

void require_rounded_once(const Tensor& got, const Tensor& want_t, const LowType& t, int64_t R, const Tensor& S_t) {
    REQUIRE(got.dtype() == t.dtype);
    // The bound of each element as one tensor: u·|want| + 2(R + 2)·eps_f32·S.
    Tensor bound = abs_of(want_t);
    const Tensor S = S_t.defined() ? host_f32(S_t) : Tensor();
    float* b = bound.data<float>();
    for (int64_t i = 0; i < bound.numel(); i++) {
        const double exact = t.u * double(b[i]) + (S.defined() ? 4.0 * double(R + 2) * kF32Unit * S.data<float>()[i] : 0.0);
        b[i] = float(exact);
        if (double(b[i]) > exact) b[i] = std::nextafter(b[i], 0.0f);  // held in f32, never looser
    }
    require_within(got, want_t, bound, 1.0, t.tiny);
}

void check_against_f32(const OpCheck& op, Device device, const LowType& t) {
    const std::vector<Tensor> want = op.run(device, DType::F32), got = op.run(device, t.dtype);
    REQUIRE(got.size() == op.bounds.size());
    for (size_t i = 0; i < got.size(); i++) {
        INFO("result " << i << " on " << device_name(device) << " in " << dtype_name(t.dtype));
        const Bound& b = op.bounds[i];
        const double r = device == Device::CUDA ? b.r_cuda : b.r_cpu;
        require_within(got[i], want[i], b.S, r * t.u + 2.0 * b.n * kF32Unit, t.tiny);
    }
}

void check_cpu_against_cuda(const OpCheck& op) {
    const std::vector<Tensor> cpu = op.run(Device::CPU, DType::F16), gpu = op.run(Device::CUDA, DType::F16);
    for (size_t i = 0; i < cpu.size(); i++) {
        INFO("result " << i << ", CUDA against the CPU in f16");
        const Bound& b = op.bounds[i];
        require_within(gpu[i], cpu[i], b.S, (b.r_cpu + b.r_cuda) * kF16.u + 2.0 * b.n * kF32Unit,
                       kF16.tiny + b.gap);
    }
}

void check_op(Device device, const std::function<OpCheck(const LowType&)>& make) {
    for (const LowType& t : {kF16, kBF16}) {
        const OpCheck op = make(t);
        if (device == Device::CPU) check_against_f32(op, device, t);
        else test::under_schedules([&] { check_against_f32(op, device, t); });
    }
    if (device == Device::CUDA) check_cpu_against_cuda(make(kF16));
}

double max_abs(const Tensor& t) {
    const Tensor a = abs_of(t);
    return double(*std::max_element(a.data<float>(), a.data<float>() + a.numel()));
}

}  // namespace kiln::test::lowp
