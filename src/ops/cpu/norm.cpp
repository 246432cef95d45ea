// norm.cpp — batch normalization on the CPU (chapter 06), and the two elementwise kernels of
// chapter 06's layers: GELU and dropout.
//
// Letters as in cnn_ops.h: x [N, C, S], S = H·W (1 for BatchNorm1d), M = N·S values per channel.
//
// ---- Batch norm: the passes over memory ------------------------------------------------------
// Each channel is done by one thread, start to finish: its M values are read for the mean,
// read again for the variance, and read a third time to write y. A channel of a CIFAR batch
// (256 × 32 × 32 floats = 1 MiB) stays in L2 between the passes, so memory sees it about once.
// Why two passes for the variance and not one (Σx², Σx)? var = E[x²] − E[x]² subtracts two
// nearly equal numbers when |mean| ≫ std, and loses every digit; Σ(x − mean)² does not.
//
// ---- Determinism ---------------------------------------------------------------------------
// A channel's sums are taken by one thread, in a fixed pattern (8 float lanes along each row
// segment of S, then rows added in double in order), so any thread count gives the same bits.
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/rng.h"
#include "ops/cpu/cnn_ops.h"

namespace kiln::cpu {
namespace {

constexpr int64_t kParallelMin = 1 << 14;

void check_params(const BatchNormParams& p, const char* op) {
    KILN_CHECK(p.N > 0 && p.C > 0 && p.S > 0, op, ": bad sizes N=", p.N, " C=", p.C, " S=", p.S);
}

// Σ f(i) for i < n, as 8 float lanes (vectorizable, fixed order) summed in double.
template <typename F> inline double lane_sum(int64_t n, F f) {
    float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) lane[j] += f(i + j);
    double total = 0.0;
    for (int j = 0; j < 8; j++) total += lane[j];
    for (; i < n; i++) total += f(i);
    return total;
}

// Σ over the M values of channel c of f(value pointer offset): row by row (N rows of S).
template <typename F> inline double channel_sum(const BatchNormParams& p, int64_t c, F f) {
    double total = 0.0;
    for (int64_t n = 0; n < p.N; n++) {
        const int64_t base = (n * p.C + c) * p.S;
        total += lane_sum(p.S, [&](int64_t s) { return f(base + s); });
    }
    return total;
}

}  // namespace

// ---- batch norm --------------------------------------------------------------------------------
void batchnorm_forward_train(const float* x, const float* gamma, const float* beta, float* y, float* running_mean,
                             float* running_var, float* save_mean, float* save_invstd, const BatchNormParams& p) {
    check_params(p, "batchnorm_forward_train");
    const int64_t M = p.N * p.S;
    KILN_CHECK(M > 1, "batchnorm_forward_train: needs more than one value per channel to train, got N=", p.N,
               " S=", p.S);
#pragma omp parallel for schedule(static) if (p.N * p.C * p.S > kParallelMin)
    for (int64_t c = 0; c < p.C; c++) {
        // pass 1: mean;  pass 2: biased variance around it
        const double mean_d = channel_sum(p, c, [&](int64_t i) { return x[i]; }) / double(M);
        const float mean = float(mean_d);
        const double var = channel_sum(p, c, [&](int64_t i) {
                               const float d = x[i] - mean;
                               return d * d;
                           }) /
                           double(M);
        const float invstd = float(1.0 / std::sqrt(var + double(p.eps)));
        // pass 3: y = gamma · (x − mean) · invstd + beta
        const float scale = gamma[c] * invstd, shift = beta[c];
        for (int64_t n = 0; n < p.N; n++) {
            const int64_t base = (n * p.C + c) * p.S;
            for (int64_t s = 0; s < p.S; s++) y[base + s] = (x[base + s] - mean) * scale + shift;
        }
        save_mean[c] = mean;
        save_invstd[c] = invstd;
        const double m = p.momentum;
        running_mean[c] = float((1.0 - m) * running_mean[c] + m * mean_d);
        running_var[c] = float((1.0 - m) * running_var[c] + m * var * double(M) / double(M - 1));
    }
}

void batchnorm_forward_eval(const float* x, const float* gamma, const float* beta, const float* running_mean,
                            const float* running_var, float* y, const BatchNormParams& p) {
    check_params(p, "batchnorm_forward_eval");
#pragma omp parallel for schedule(static) if (p.N * p.C * p.S > kParallelMin)
    for (int64_t c = 0; c < p.C; c++) {
        const float mean = running_mean[c];
        const float scale = gamma[c] / std::sqrt(running_var[c] + p.eps), shift = beta[c];
        for (int64_t n = 0; n < p.N; n++) {
            const int64_t base = (n * p.C + c) * p.S;
            for (int64_t s = 0; s < p.S; s++) y[base + s] = (x[base + s] - mean) * scale + shift;
        }
    }
}

// pass 1: Σ dy and Σ dy·(x − mean);   pass 2: dx = gamma·invstd·(dy − Σdy/M − (x − mean)·invstd²·Σdy(x−mean)/M)
// (the formula of cnn_ops.h with x̂ = (x − mean)·invstd written out)
void batchnorm_backward(const float* dy, const float* x, const float* gamma, const float* save_mean,
                        const float* save_invstd, float* dx, float* dgamma, float* dbeta, const BatchNormParams& p) {
    check_params(p, "batchnorm_backward");
    const int64_t M = p.N * p.S;
#pragma omp parallel for schedule(static) if (p.N * p.C * p.S > kParallelMin)
    for (int64_t c = 0; c < p.C; c++) {
        const float mean = save_mean[c], invstd = save_invstd[c];
        const double sum_dy = channel_sum(p, c, [&](int64_t i) { return dy[i]; });
        const double sum_dy_xm = channel_sum(p, c, [&](int64_t i) { return dy[i] * (x[i] - mean); });
        const double sum_dy_xhat = sum_dy_xm * invstd;
        const float k_dy = float(sum_dy / double(M));                               // Σdy / M
        const float k_x = float(sum_dy_xhat * double(invstd) / double(M));          // Σ(dy·x̂)·invstd / M
        const float g = gamma[c] * invstd;
        for (int64_t n = 0; n < p.N; n++) {
            const int64_t base = (n * p.C + c) * p.S;
            for (int64_t s = 0; s < p.S; s++) {
                const int64_t i = base + s;
                dx[i] = g * (dy[i] - k_dy - (x[i] - mean) * k_x);
            }
        }
        dgamma[c] += float(sum_dy_xhat);
        dbeta[c] += float(sum_dy);
    }
}

// ---- GELU --------------------------------------------------------------------------------------
// y = x·Φ(x),  Φ(x) = (1 + erf(x/√2)) / 2;   dy/dx = Φ(x) + x·φ(x),  φ(x) = exp(−x²/2) / √(2π)
void gelu_forward(const float* x, float* y, int64_t n) {
    constexpr float kInvSqrt2 = 0.70710678118654752f;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; i++) y[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * kInvSqrt2));
}

void gelu_backward(const float* x, const float* dy, float* dx, int64_t n) {
    constexpr float kInvSqrt2 = 0.70710678118654752f, kInvSqrt2Pi = 0.39894228040143268f;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; i++) {
        const float v = x[i];
        const float cdf = 0.5f * (1.0f + std::erf(v * kInvSqrt2));
        const float pdf = kInvSqrt2Pi * std::exp(-0.5f * v * v);
        dx[i] = dy[i] * (cdf + v * pdf);
    }
}

// ---- dropout -------------------------------------------------------------------------------------
// keep_i = u_i ≥ drop_p with u_i = Rng::to_unit(Rng::at(first + i)): a pure function of i.
void dropout_forward(const float* x, float* y, uint8_t* mask, int64_t n, float drop_p, uint64_t seed_hash,
                     uint64_t first) {
    KILN_CHECK(drop_p >= 0.0f && drop_p <= 1.0f, "dropout_forward: drop probability ", drop_p,
               " is outside [0, 1]");
    const float scale = drop_p < 1.0f ? 1.0f / (1.0f - drop_p) : 0.0f;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; i++) {
        const float u = Rng::to_unit(splitmix64(seed_hash ^ splitmix64(first + uint64_t(i))));
        const uint8_t keep = u >= drop_p ? 1 : 0;
        mask[i] = keep;
        y[i] = keep ? x[i] * scale : 0.0f;
    }
}

void dropout_backward(const float* dy, const uint8_t* mask, float* dx, int64_t n, float drop_p) {
    const float scale = drop_p < 1.0f ? 1.0f / (1.0f - drop_p) : 0.0f;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; i++) dx[i] = mask[i] ? dy[i] * scale : 0.0f;
}

}  // namespace kiln::cpu
