// norm.cpp — batch normalization on the CPU (chapter 06) and layer normalization; their contracts
// are in ops/norm.h.
//
// Letters as in ops/params.h: x [N, C, S], S = H·W (1 for BatchNorm1d), M = N·S values per channel.
// Layer norm: x [R, D], R rows of D values.
//
// ---- Batch norm: the passes over memory ------------------------------------------------------
// Each channel is done by one thread, start to finish: its M values are read for the mean,
// read again for the variance, and read a third time to write y. A channel of a CIFAR batch
// (256 × 32 × 32 floats = 1 MiB) stays in L2 between the passes, so memory sees it about once.
// Why two passes for the variance and not one (Σx², Σx)? var = E[x²] − E[x]² subtracts two
// nearly equal numbers when |mean| ≫ std, and loses every digit; Σ(x − mean)² does not.
// With a 2×2 max-pool fused in front (maxpool2x2_batchnorm_*), the thread first pools its
// channel's N planes (max2x2.h, max pooling's own loop) into the kept pool, then runs the same
// passes over it while it is in cache; its backward writes each row of batch norm's dx to a row
// of its own and from there, through the windows' winner bytes, into the plane of dx.
//
// ---- Determinism ---------------------------------------------------------------------------
// A channel's sums are taken by one thread, in a fixed pattern (8 float lanes along each row
// segment of S, then rows added in double in order), so any thread count gives the same bits.
// Layer norm likewise: a row's sums belong to one thread; dgamma and dbeta, sums over rows, are
// split by columns, each column adding its rows in order.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "ops/cpu/f32_blocks.h"
#include "ops/cpu/gelu.h"
#include "ops/cpu/max2x2.h"
#include "ops/norm.h"

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

// One row of S values: y = (x − mean)·scale + shift, in f32 blocks (f32_blocks.h).
template <typename T>
void normalize_row(const T* x, T* y, int64_t S, float mean, float scale, float shift) {
    f32_blocks(S, x, y, [=](const float* x, float* y, int64_t m, int64_t) {
#pragma omp simd
        for (int64_t s = 0; s < m; s++) y[s] = (x[s] - mean) * scale + shift;
    });
}

// One row of S values normalized, then with gelu GELU over the row as stored (the GELU kernel's
// loop, ops/cpu/gelu.h).
template <typename T>
void normalize_row_gelu(const T* x, T* y, int64_t S, float mean, float scale, float shift, bool gelu) {
    normalize_row(x, y, S, mean, scale, shift);
    if (gelu) f32_blocks(S, y, y, [](const float* y, float* z, int64_t m, int64_t) { gelu_block(y, z, m); });
}

// Pass 3 of the forward over the M values of channel c, a row of S at a time.
template <typename T>
void normalize_channel(const T* x, T* y, const BatchNormParams& p, int64_t c, float mean, float scale, float shift) {
    for (int64_t n = 0; n < p.N; n++) {
        const int64_t base = (n * p.C + c) * p.S;
        normalize_row_gelu(x + base, y + base, p.S, mean, scale, shift, p.gelu);
    }
}

// The forward of channel c in training: pass 1 the mean, pass 2 the biased variance around it,
// pass 3 y = gamma · (x − mean) · invstd + beta; then the saved and running statistics.
template <typename T>
void train_channel(const T* x, const float* gamma, const float* beta, T* y, float* running_mean, float* running_var,
                   float* save_mean, float* save_invstd, const BatchNormParams& p, int64_t c) {
    const int64_t M = p.N * p.S;
    const double mean_d = channel_sum(p, c, [&](int64_t i) { return float(x[i]); }) / double(M);
    const float mean = float(mean_d);
    const double var = channel_sum(p, c, [&](int64_t i) {
                           const float d = float(x[i]) - mean;
                           return d * d;
                       }) /
                       double(M);
    const float invstd = float(1.0 / std::sqrt(var + double(p.eps)));
    normalize_channel(x, y, p, c, mean, gamma[c] * invstd, beta[c]);
    save_mean[c] = mean;
    save_invstd[c] = invstd;
    const double m = p.momentum;
    running_mean[c] = float((1.0 - m) * running_mean[c] + m * mean_d);
    running_var[c] = float((1.0 - m) * running_var[c] + m * var * double(M) / double(M - 1));
}

// The backward of channel c, its rows of dy at dy_row(n) (S values each): pass 1 Σ dy and
// Σ dy·(x − mean), row by row in order; pass 2 dx, row n written to dx_row(n), then
// row_done(n) called (max pooling fused in front moves the row into the unpooled gradient).
template <typename T, typename DyRow, typename DxRow, typename RowDone>
void batchnorm_backward_channel(DyRow dy_row, const T* x, DxRow dx_row, RowDone row_done, const BatchNormParams& p,
                                int64_t c, float mean, float invstd, float g, float* dgamma, float* dbeta) {
    const int64_t M = p.N * p.S;
    double sum_dy = 0.0, sum_dy_xm = 0.0;
    for (int64_t n = 0; n < p.N; n++) {
        const T* dy = dy_row(n);
        const T* xr = x + (n * p.C + c) * p.S;
        sum_dy += lane_sum(p.S, [&](int64_t s) { return float(dy[s]); });
        sum_dy_xm += lane_sum(p.S, [&](int64_t s) { return float(dy[s]) * (float(xr[s]) - mean); });
    }
    const double sum_dy_xhat = sum_dy_xm * invstd;
    const float k_dy = float(sum_dy / double(M));                       // Σdy / M
    const float k_x = float(sum_dy_xhat * double(invstd) / double(M));  // Σ(dy·x̂)·invstd / M
    for (int64_t n = 0; n < p.N; n++) {
        const int64_t base = (n * p.C + c) * p.S;
        f32_blocks(p.S, dy_row(n), x + base, dx_row(n), [=](const float* dy, const float* x, float* dx, int64_t m, int64_t) {
#pragma omp simd
            for (int64_t s = 0; s < m; s++) dx[s] = g * (dy[s] - k_dy - (x[s] - mean) * k_x);
        });
        row_done(n);
    }
    dgamma[c] += float(sum_dy_xhat);
    dbeta[c] += float(sum_dy);
}

// The backward of channel c (x its input, as kept), dx row n written to dx_row(n), then
// row_done(n). With p.gelu, dy is dz: y = (x − mean)·g + beta (the forward's rows, g = gamma·invstd
// its scale) and dy = dz · GELU'(y) are written to channel_dy (the channel's M values) first, by
// the loops the separate layers run, so the sums read the same T values those layers stored.
template <typename T, typename DxRow, typename RowDone>
void backward_channel(const T* dy, const T* x, const float* gamma, const float* beta, const float* save_mean,
                      const float* save_invstd, DxRow dx_row, RowDone row_done, float* dgamma, float* dbeta,
                      const BatchNormParams& p, int64_t c, std::vector<T>& channel_dy) {
    const float mean = save_mean[c], invstd = save_invstd[c], g = gamma[c] * invstd;
    if (!p.gelu) {
        const auto rows = [&](int64_t n) { return dy + (n * p.C + c) * p.S; };
        batchnorm_backward_channel(rows, x, dx_row, row_done, p, c, mean, invstd, g, dgamma, dbeta);
        return;
    }
    channel_dy.resize(size_t(p.N * p.S));
    for (int64_t n = 0; n < p.N; n++) {
        const int64_t base = (n * p.C + c) * p.S;
        T* row = channel_dy.data() + n * p.S;
        normalize_row(x + base, row, p.S, mean, g, beta[c]);
        f32_blocks(p.S, row, dy + base, row, [](const float* y, const float* dz, float* d, int64_t m, int64_t) {
            gelu_backward_block(y, dz, d, m);
        });
    }
    const auto rows = [&](int64_t n) { return static_cast<const T*>(channel_dy.data() + n * p.S); };
    batchnorm_backward_channel(rows, x, dx_row, row_done, p, c, mean, invstd, g, dgamma, dbeta);
}

// dx of one plane [H, W] from the gradient d of its pool [H/2, W/2] and the windows' winners:
//   dx[2p + dh][2q + dw] = 0 + d[p][q] where 2·dh + dw = window[p][q] (max pooling's backward adds
//   into a zeroed plane: a −0 becomes +0), 0 at each window's three other places and at an odd H's
//   last row, an odd W's last column.
template <typename T>
void unpool2x2_plane(const T* d, const uint8_t* window, T* dx, int64_t H, int64_t W) {
    const int64_t P = H / 2, Q = W / 2;
    const T zero = T(0.0f);
    for (int64_t op = 0; op < P; op++) {
        T* r0 = dx + 2 * op * W;
        T* r1 = r0 + W;
        for (int64_t oq = 0; oq < Q; oq++) {
            const int k = window[op * Q + oq];
            const T v = T(0.0f + float(d[op * Q + oq]));
            r0[2 * oq] = k == 0 ? v : zero;
            r0[2 * oq + 1] = k == 1 ? v : zero;
            r1[2 * oq] = k == 2 ? v : zero;
            r1[2 * oq + 1] = k == 3 ? v : zero;
        }
        if (W % 2) r0[W - 1] = r1[W - 1] = zero;
    }
    if (H % 2) std::fill(dx + (H - 1) * W, dx + H * W, zero);
}

}  // namespace

// ---- batch norm --------------------------------------------------------------------------------
template <typename T>
void batchnorm_forward_train(const T* x, const float* gamma, const float* beta, T* y, float* running_mean,
                             float* running_var, float* save_mean, float* save_invstd, const BatchNormParams& p) {
    check_params(p, "batchnorm_forward_train");
    const int64_t M = p.N * p.S;
    KILN_CHECK(M > 1, "batchnorm_forward_train: needs more than one value per channel to train, got N=", p.N,
               " S=", p.S);
    parallel_for(p.C, grain_of(kParallelMin, p.N * p.S), [&](int64_t c0, int64_t c1) {
        for (int64_t c = c0; c < c1; c++)
            train_channel(x, gamma, beta, y, running_mean, running_var, save_mean, save_invstd, p, c);
    });
}

template <typename T>
void batchnorm_forward_eval(const T* x, const float* gamma, const float* beta, const float* running_mean,
                            const float* running_var, T* y, const BatchNormParams& p) {
    check_params(p, "batchnorm_forward_eval");
    parallel_for(p.C, grain_of(kParallelMin, p.N * p.S), [&](int64_t c0, int64_t c1) {
        for (int64_t c = c0; c < c1; c++) {
            normalize_channel(x, y, p, c, running_mean[c], gamma[c] / std::sqrt(running_var[c] + p.eps), beta[c]);
        }
    });
}

// pass 1: Σ dy and Σ dy·(x − mean);   pass 2: dx = gamma·invstd·(dy − Σdy/M − (x − mean)·invstd²·Σdy(x−mean)/M)
// (the formula of ops/norm.h with x̂ = (x − mean)·invstd written out); with p.gelu, backward_channel.
template <typename T>
void batchnorm_backward(const T* dy, const T* x, const float* gamma, const float* beta, const float* save_mean,
                        const float* save_invstd, T* dx, float* dgamma, float* dbeta, const BatchNormParams& p) {
    check_params(p, "batchnorm_backward");
    KILN_CHECK(!p.gelu || beta, "batchnorm_backward: GELU fused after batch norm needs beta to recompute its input");
    parallel_for(p.C, grain_of(kParallelMin, p.N * p.S), [&](int64_t c0, int64_t c1) {
        std::vector<T> channel_dy;
        for (int64_t c = c0; c < c1; c++) {
            const auto dx_row = [&](int64_t n) { return dx + (n * p.C + c) * p.S; };
            backward_channel(dy, x, gamma, beta, save_mean, save_invstd, dx_row, [](int64_t) {}, dgamma, dbeta, p, c,
                             channel_dy);
        }
    });
}

// ---- max pooling 2×2 fused in front of batch norm ----------------------------------------------
// One thread per channel, as batch norm: its N planes pooled (max2x2.h, max pooling's own loop)
// into pooled and window, then the batch norm's passes over pooled while it is in cache.
template <typename T>
void maxpool2x2_batchnorm_forward_train(const T* x, const float* gamma, const float* beta, T* pooled,
                                        uint8_t* window, T* y, float* running_mean, float* running_var,
                                        float* save_mean, float* save_invstd, const BatchNormParams& p,
                                        const MaxPool2x2& pool) {
    check_params(p, "maxpool2x2_batchnorm_forward_train");
    KILN_CHECK(p.N * p.S > 1, "maxpool2x2_batchnorm_forward_train: needs more than one value per channel, got N=",
               p.N, " S=", p.S);
    const int64_t HW = pool.H * pool.W;
    const auto place = [](int32_t, int32_t k) { return uint8_t(k); };
    parallel_for(p.C, grain_of(kParallelMin, p.N * HW), [&](int64_t c0, int64_t c1) {
        std::vector<float> xf, yf;
        for (int64_t c = c0; c < c1; c++) {
            for (int64_t n = 0; n < p.N; n++) {
                const int64_t plane = n * p.C + c;
                maxpool2x2_plane(x + plane * HW, pooled + plane * p.S, window + plane * p.S, pool.H, pool.W, place, xf,
                                 yf);
            }
            train_channel(pooled, gamma, beta, y, running_mean, running_var, save_mean, save_invstd, p, c);
        }
    });
}

// Each plane pooled into a row of this thread's, then normalized from it.
template <typename T>
void maxpool2x2_batchnorm_forward_eval(const T* x, const float* gamma, const float* beta, const float* running_mean,
                                       const float* running_var, T* y, const BatchNormParams& p,
                                       const MaxPool2x2& pool) {
    check_params(p, "maxpool2x2_batchnorm_forward_eval");
    const int64_t HW = pool.H * pool.W;
    const auto place = [](int32_t, int32_t k) { return uint8_t(k); };
    parallel_for(p.C, grain_of(kParallelMin, p.N * HW), [&](int64_t c0, int64_t c1) {
        std::vector<float> xf, yf;
        std::vector<T> row(size_t(p.S));
        std::vector<uint8_t> window(size_t(p.S));
        for (int64_t c = c0; c < c1; c++) {
            const float scale = gamma[c] / std::sqrt(running_var[c] + p.eps);
            for (int64_t n = 0; n < p.N; n++) {
                const int64_t plane = n * p.C + c;
                maxpool2x2_plane(x + plane * HW, row.data(), window.data(), pool.H, pool.W, place, xf, yf);
                normalize_row_gelu(row.data(), y + plane * p.S, p.S, running_mean[c], scale, beta[c], p.gelu);
            }
        }
    });
}

// Batch norm's backward per channel, each row of its dx (one pooled plane) written to a row of
// this thread's and from there into dx's plane (unpool2x2_plane): no pooled-sized gradient in
// memory, and dx written once.
template <typename T>
void maxpool2x2_batchnorm_backward(const T* dy, const T* pooled, const uint8_t* window, const float* gamma,
                                   const float* beta, const float* save_mean, const float* save_invstd, T* dx,
                                   float* dgamma, float* dbeta, const BatchNormParams& p, const MaxPool2x2& pool) {
    check_params(p, "maxpool2x2_batchnorm_backward");
    KILN_CHECK(!p.gelu || beta,
               "maxpool2x2_batchnorm_backward: GELU fused after batch norm needs beta to recompute its input");
    const int64_t HW = pool.H * pool.W;
    parallel_for(p.C, grain_of(kParallelMin, p.N * HW), [&](int64_t c0, int64_t c1) {
        std::vector<T> channel_dy, row(size_t(p.S));
        for (int64_t c = c0; c < c1; c++) {
            const auto dx_row = [&](int64_t) { return row.data(); };
            const auto row_done = [&](int64_t n) {
                const int64_t plane = n * p.C + c;
                unpool2x2_plane(row.data(), window + plane * p.S, dx + plane * HW, pool.H, pool.W);
            };
            backward_channel(dy, pooled, gamma, beta, save_mean, save_invstd, dx_row, row_done, dgamma, dbeta, p, c,
                             channel_dy);
        }
    });
}

// ---- layer norm ----------------------------------------------------------------------------------
// One row per thread: pass 1 the mean, pass 2 the biased variance around it (both as lane_sum:
// 8 float lanes, then double), pass 3 y = (x − mean) · invstd · gamma + beta.
template <typename T>
void layernorm_forward(const T* x, const float* gamma, const float* beta, T* y, float* save_mean, float* save_invstd,
                       int64_t R, int64_t D, float eps) {
    KILN_CHECK(R >= 0 && D > 0, "layernorm_forward: bad sizes R=", R, " D=", D);
    parallel_for(R, grain_of(kParallelMin, D), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; r++) {
            const T* xr = x + r * D;
            const float mean = float(lane_sum(D, [&](int64_t d) { return float(xr[d]); }) / double(D));
            const double var = lane_sum(D, [&](int64_t d) {
                                   const float c = float(xr[d]) - mean;
                                   return c * c;
                               }) /
                               double(D);
            const float invstd = float(1.0 / std::sqrt(var + double(eps)));
            f32_blocks(D, xr, y + r * D, [&](const float* x, float* y, int64_t m, int64_t d0) {
#pragma omp simd
                for (int64_t d = 0; d < m; d++) y[d] = (x[d] - mean) * invstd * gamma[d0 + d] + beta[d0 + d];
            });
            save_mean[r] = mean;
            save_invstd[r] = invstd;
        }
    });
}

// dx: one row per thread, pass 1 Σ g and Σ g·x̂ (g = gamma·dy), pass 2 dx.
// dgamma, dbeta: blocks of kColumns columns per thread; each block adds the rows in order into
// double accumulators, then adds them to dgamma and dbeta once.
template <typename T>
void layernorm_backward(const T* dy, const T* x, const float* gamma, const float* save_mean, const float* save_invstd,
                        T* dx, float* dgamma, float* dbeta, int64_t R, int64_t D) {
    KILN_CHECK(R >= 0 && D > 0, "layernorm_backward: bad sizes R=", R, " D=", D);
    parallel_for(R, grain_of(kParallelMin, D), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; r++) {
            const T* xr = x + r * D;
            const T* gr = dy + r * D;
            const float mean = save_mean[r], invstd = save_invstd[r];
            const float sum_g = float(lane_sum(D, [&](int64_t d) { return gamma[d] * float(gr[d]); }));
            const float sum_gx = float(
                lane_sum(D, [&](int64_t d) { return gamma[d] * float(gr[d]) * ((float(xr[d]) - mean) * invstd); }));
            const float k_g = sum_g / float(D), k_x = sum_gx / float(D);
            f32_blocks(D, gr, xr, dx + r * D, [&](const float* g, const float* x, float* dx, int64_t m, int64_t d0) {
#pragma omp simd
                for (int64_t d = 0; d < m; d++) {
                    const float xhat = (x[d] - mean) * invstd;
                    dx[d] = invstd * (gamma[d0 + d] * g[d] - k_g - xhat * k_x);
                }
            });
        }
    });
    constexpr int64_t kColumns = 64;
    const int64_t blocks = (D + kColumns - 1) / kColumns;
    parallel_for(blocks, grain_of(kParallelMin, R * kColumns), [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; b++) {
            const int64_t d0 = b * kColumns, d1 = std::min(D, d0 + kColumns);
            double acc_gamma[kColumns] = {}, acc_beta[kColumns] = {};
            for (int64_t r = 0; r < R; r++) {
                const float mean = save_mean[r], invstd = save_invstd[r];
                for (int64_t d = d0; d < d1; d++) {
                    const float g = float(dy[r * D + d]);
                    acc_gamma[d - d0] += g * ((float(x[r * D + d]) - mean) * invstd);
                    acc_beta[d - d0] += g;
                }
            }
            for (int64_t d = d0; d < d1; d++) {
                dgamma[d] += float(acc_gamma[d - d0]);
                dbeta[d] += float(acc_beta[d - d0]);
            }
        }
    });
}

KILN_NORM_KERNELS(KILN_INSTANTIATE_FLOAT);

}  // namespace kiln::cpu
