// gradcheck.cpp — see gradcheck.h.
#include "gradcheck.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "core/rng.h"

namespace {

constexpr double kEps = 1e-2;
constexpr int64_t kMaxChecked = 96;

// L = Σ y · r in double (y brought to the CPU, r lives there).
double loss_of(kiln::Module& m, const kiln::Tensor& x, const kiln::Tensor& r) {
    kiln::Tensor y = m.forward(x).to(kiln::Device::CPU);
    REQUIRE(y.shape() == r.shape());
    const float* py = y.data<float>();
    const float* pr = r.data<float>();
    double L = 0.0;
    for (int64_t i = 0; i < y.numel(); i++) L += double(py[i]) * double(pr[i]);
    return L;
}

// Which elements of a tensor of n to check: all, or kMaxChecked distinct ones at random.
std::vector<int64_t> pick(int64_t n, kiln::Rng& rng) {
    std::vector<int64_t> idx(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; i++) idx[size_t(i)] = i;
    if (n <= kMaxChecked) return idx;
    for (int64_t i = 0; i < kMaxChecked; i++) std::swap(idx[size_t(i)], idx[size_t(i + int64_t(rng.next_below(uint64_t(n - i))))]);
    idx.resize(size_t(kMaxChecked));
    return idx;
}

// Compares the analytic gradient of `values` (grad, on the CPU) with central differences of L.
// values may live on the CUDA device: v is then a CPU copy, written back after each change.
void check_tensor(const std::string& what, kiln::Module& m, const kiln::Tensor& x, const kiln::Tensor& r,
                  kiln::Tensor values, const kiln::Tensor& grad, double tol, kiln::Rng& rng) {
    kiln::Tensor host = values.to(kiln::Device::CPU);  // values itself when on the CPU
    float* v = host.data<float>();
    auto store = [&](int64_t i, float value) {
        v[i] = value;
        if (values.device() != kiln::Device::CPU) values.copy_from(host);
    };
    const float* g = grad.data<float>();
    const int64_t n = values.numel();
    double gmax = 0.0;
    for (int64_t i = 0; i < n; i++) gmax = std::max(gmax, std::fabs(double(g[i])));
    const double floor = tol * 0.05 * (1.0 + gmax);

    double worst = 0.0;  // the largest error / allowed ratio
    std::ostringstream report;
    for (int64_t i : pick(n, rng)) {
        const float orig = v[i];
        const float plus = float(double(orig) + kEps), minus = float(double(orig) - kEps);
        store(i, plus);
        const double Lp = loss_of(m, x, r);
        store(i, minus);
        const double Lm = loss_of(m, x, r);
        store(i, orig);
        const double numeric = (Lp - Lm) / (double(plus) - double(minus));
        const double analytic = g[i];
        const double err = std::fabs(analytic - numeric);
        const double allowed = tol * std::max(std::fabs(analytic), std::fabs(numeric)) + floor;
        if (err / allowed > worst) {
            worst = err / allowed;
            report.str("");
            report << what << "[" << i << "]: analytic " << analytic << ", numeric " << numeric << ", error " << err
                   << ", allowed " << allowed;
        }
    }
    INFO(m.name() << ": worst element of " << what << " (" << n << " elements): " << report.str());
    CHECK(worst <= 1.0);
}

}  // namespace

void check_module_gradients(kiln::Module& m, const kiln::Tensor& x_in, uint64_t seed, double tol) {
    kiln::Rng rng(seed ^ 0x6772616463686b);  // "gradchk"
    kiln::Tensor x = x_in.clone();           // perturbed in place below, on x_in's device

    // The analytic gradients: one forward, backward(r) with r = dL/dy (drawn on the CPU, moved
    // to x's device). The gradients are kept as CPU copies.
    m.zero_grad();
    kiln::Tensor y = m.forward(x);
    kiln::Tensor r = kiln::Tensor::normal(y.shape(), 0.0f, 1.0f, rng);
    kiln::Tensor dx = m.backward(r.to(x.device())).clone().to(kiln::Device::CPU);
    REQUIRE(dx.shape() == x.shape());
    std::vector<kiln::Tensor> grads;
    for (kiln::Parameter* p : m.parameters()) grads.push_back(p->grad.clone().to(kiln::Device::CPU));

    check_tensor("dx", m, x, r, x, dx, tol, rng);
    size_t k = 0;
    for (kiln::Parameter* p : m.parameters()) check_tensor("d" + p->name, m, x, r, p->value, grads[k++], tol, rng);
}
