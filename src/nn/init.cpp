// init.cpp — dirac_init, whitening_init and the Jacobi eigen-solver they need (init.h).
#include "nn/init.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/error.h"

namespace kiln {
namespace {

// The conv's weight, checked to be an f32 CPU tensor: [O, C/G, KH, KW].
float* weight_data(Conv2d& conv, const char* fn) {
    Tensor& w = conv.weight.value;
    KILN_CHECK(w.device() == Device::CPU && w.dtype() == DType::F32, fn, ": the conv's weight must be f32 on the CPU (",
               "initialize before moving the model to its device or casting it)");
    KILN_CHECK(conv.options.groups == 1, fn, ": the conv must have one group, it has ", conv.options.groups);
    return w.data<float>();
}

}  // namespace

void dirac_init(Conv2d& conv) {
    float* w = weight_data(conv, "dirac_init");
    const int64_t C = conv.in_channels, KH = conv.kernel_h, KW = conv.kernel_w, per_filter = C * KH * KW;
    for (int64_t o = 0; o < std::min(conv.out_channels, C); ++o) {
        float* f = w + o * per_filter;
        std::fill(f, f + per_filter, 0.0f);
        f[(o * KH + (KH - 1) / 2) * KW + (KW - 1) / 2] = 1.0f;
    }
}

// ---- symmetric_eigen ----------------------------------------------------------------------------
// One Jacobi rotation in the (p, q) plane sets a[p][q] to 0:  a ← Jᵀ a J,  V ← V J, with
//   θ = (a_qq − a_pp) / (2 a_pq),  t = sign(θ) / (|θ| + sqrt(θ² + 1)),  c = 1/sqrt(t² + 1),  s = t·c
// (the smaller rotation angle, for stability). Sweeping every pair drives the off-diagonal sum of
// squares to 0; the diagonal is then the eigenvalues and V's columns the eigenvectors.
void symmetric_eigen(const std::vector<double>& a_in, int64_t n, std::vector<double>& values,
                     std::vector<double>& vectors) {
    KILN_CHECK(n > 0 && int64_t(a_in.size()) == n * n, "symmetric_eigen: expected ", n, "×", n, " values, got ",
               a_in.size());
    std::vector<double> a = a_in, v(size_t(n * n), 0.0);
    auto at = [n](std::vector<double>& m, int64_t i, int64_t j) -> double& { return m[size_t(i * n + j)]; };
    double total = 0;
    for (int64_t i = 0; i < n; ++i) {
        at(v, i, i) = 1.0;
        for (int64_t j = 0; j < n; ++j) {
            KILN_CHECK(std::fabs(at(a, i, j) - at(a, j, i)) <= 1e-9 * (std::fabs(at(a, i, j)) + 1e-300),
                       "symmetric_eigen: the matrix is not symmetric at (", i, ", ", j, ")");
            total += at(a, i, j) * at(a, i, j);
        }
    }
    for (int sweep = 0; sweep < 100; ++sweep) {
        double off = 0;
        for (int64_t p = 0; p < n; ++p)
            for (int64_t q = p + 1; q < n; ++q) off += 2 * at(a, p, q) * at(a, p, q);
        if (off <= 1e-24 * total) break;
        for (int64_t p = 0; p < n; ++p)
            for (int64_t q = p + 1; q < n; ++q) {
                const double apq = at(a, p, q);
                if (apq == 0.0) continue;
                const double theta = (at(a, q, q) - at(a, p, p)) / (2 * apq);
                const double t = (theta >= 0 ? 1.0 : -1.0) / (std::fabs(theta) + std::sqrt(theta * theta + 1));
                const double c = 1 / std::sqrt(t * t + 1), s = t * c;
                for (int64_t k = 0; k < n; ++k) {  // a ← a J (columns p, q)
                    const double akp = at(a, k, p), akq = at(a, k, q);
                    at(a, k, p) = c * akp - s * akq;
                    at(a, k, q) = s * akp + c * akq;
                }
                for (int64_t k = 0; k < n; ++k) {  // a ← Jᵀ a (rows p, q)
                    const double apk = at(a, p, k), aqk = at(a, q, k);
                    at(a, p, k) = c * apk - s * aqk;
                    at(a, q, k) = s * apk + c * aqk;
                }
                for (int64_t k = 0; k < n; ++k) {  // V ← V J
                    const double vkp = at(v, k, p), vkq = at(v, k, q);
                    at(v, k, p) = c * vkp - s * vkq;
                    at(v, k, q) = s * vkp + c * vkq;
                }
            }
    }
    std::vector<int64_t> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int64_t i, int64_t j) { return at(a, i, i) < at(a, j, j); });
    values.assign(size_t(n), 0.0);
    vectors.assign(size_t(n * n), 0.0);
    for (int64_t r = 0; r < n; ++r) {
        values[size_t(r)] = at(a, order[size_t(r)], order[size_t(r)]);
        for (int64_t j = 0; j < n; ++j) vectors[size_t(r * n + j)] = at(v, j, order[size_t(r)]);  // column → row
    }
}

// ---- whitening_init -----------------------------------------------------------------------------
void whitening_init(Conv2d& conv, const Tensor& x, float eps) {
    float* w = weight_data(conv, "whitening_init");
    const int64_t C = conv.in_channels, KH = conv.kernel_h, KW = conv.kernel_w, D = C * KH * KW;
    KILN_CHECK(conv.out_channels == 2 * D, "whitening_init: a ", C, "-channel ", KH, "×", KW, " conv needs ", 2 * D,
               " output channels (each whitened direction and its negative), it has ", conv.out_channels);
    KILN_CHECK(conv.options.stride == 1 && conv.options.padding == 0 && conv.options.dilation == 1,
               "whitening_init: the conv must have stride 1, no padding and no dilation");
    KILN_CHECK(x.ndim() == 4 && x.shape()[1] == C && x.device() == Device::CPU && x.dtype() == DType::F32,
               "whitening_init: the images must be f32 [N, ", C, ", H, W] on the CPU, got ", x.shape().str());
    const int64_t N = x.shape()[0], H = x.shape()[2], W = x.shape()[3];
    KILN_CHECK(N > 0 && H >= KH && W >= KW, "whitening_init: the images are smaller than the kernel");
    // Mean and covariance of the patches, in double: N·(H−KH+1)·(W−KW+1) of them.
    const float* px = x.data<float>();
    std::vector<double> mean(static_cast<size_t>(D), 0.0), cov(static_cast<size_t>(D * D), 0.0), p(static_cast<size_t>(D));
    int64_t count = 0;
    for (int64_t n = 0; n < N; ++n)
        for (int64_t i = 0; i + KH <= H; ++i)
            for (int64_t j = 0; j + KW <= W; ++j, ++count) {
                for (int64_t c = 0, d = 0; c < C; ++c)  // d = (c·KH + kh)·KW + kw: the weight's order
                    for (int64_t kh = 0; kh < KH; ++kh)
                        for (int64_t kw = 0; kw < KW; ++kw, ++d) p[size_t(d)] = px[((n * C + c) * H + i + kh) * W + j + kw];
                for (int64_t a = 0; a < D; ++a) {
                    mean[size_t(a)] += p[size_t(a)];
                    for (int64_t b = 0; b < D; ++b) cov[size_t(a * D + b)] += p[size_t(a)] * p[size_t(b)];
                }
            }
    for (double& m : mean) m /= double(count);
    for (int64_t a = 0; a < D; ++a)
        for (int64_t b = 0; b < D; ++b)
            cov[size_t(a * D + b)] = cov[size_t(a * D + b)] / double(count) - mean[size_t(a)] * mean[size_t(b)];
    for (int64_t a = 0; a < D; ++a)  // exactly symmetric despite rounding
        for (int64_t b = 0; b < a; ++b) cov[size_t(a * D + b)] = cov[size_t(b * D + a)];
    std::vector<double> values, vectors;
    symmetric_eigen(cov, D, values, vectors);
    for (int64_t i = 0; i < D; ++i) {
        const double scale = 1.0 / std::sqrt(std::max(values[size_t(i)], 0.0) + eps);
        for (int64_t d = 0; d < D; ++d) {
            w[i * D + d] = float(vectors[size_t(i * D + d)] * scale);
            w[(D + i) * D + d] = -w[i * D + d];
        }
    }
}

}  // namespace kiln
