// norm.cu — the CUDA twins of src/ops/cpu/norm.cpp: batch normalization (training, evaluation,
// backward) and layer normalization, declared once for both in ops/norm.h; pointers are
// device memory. Templates on the element type T of x, y, dy, dx (gamma, beta and
// the statistics are float; sums in float or double); T = float, f16 or bf16.
//
// Letters as in ops/params.h: x [N, C, S], S = H·W (1 for BatchNorm1d), M = N·S values per
// channel; layer norm's x [R, D], R rows of D values; t = threadIdx.x, B = blockDim.x (T is the
// element type).
// Value m < M of channel c sits at x[(n·C + c)·S + s] with n = m / S, s = m mod S.
//
// Thread/block mapping and formulas:
//   batchnorm_forward_train   one block of 256 per channel (grid-stride over C), three passes
//       over the channel's M values, thread t taking m = t, t + B, ... (consecutive threads
//       read consecutive floats of a row: coalesced when S ≥ 32):
//         pass 1  mean = Σ x / M                  (each thread sums in double, then the block)
//         pass 2  var  = Σ (x − mean)² / M        (two passes, not Σx² − (Σx)²/M, which loses
//                                                  every digit when |mean| ≫ std)
//                 invstd = 1 / sqrt(var + eps)
//         pass 3  y = (x − mean) · (gamma · invstd) + beta
//       then thread 0 writes save_mean, save_invstd and the running statistics
//         running_mean = (1 − momentum) · running_mean + momentum · mean
//         running_var  = (1 − momentum) · running_var  + momentum · var · M / (M − 1)
//   batchnorm_forward_eval    one thread per element (1-D grid-stride), channel c = i / S mod C:
//         y = (x − running_mean) · gamma / sqrt(running_var + eps) + beta
//   batchnorm_backward        one block per channel, like the forward:
//         pass 1  Σ dy and Σ dy·(x − mean)   (two block reductions, in double)
//         pass 2  dx = gamma·invstd · (dy − Σdy/M − (x − mean) · invstd² · Σdy·(x − mean) / M)
//       then thread 0: dgamma[c] += Σ dy·x̂ = invstd · Σ dy·(x − mean),   dbeta[c] += Σ dy
//   maxpool2x2_batchnorm_*   max pooling 2×2 fused in front (ops/norm.h): the same kernels, one
//       launch each way. Forward: pass 1 reads value i of the batch norm's input as the max of its
//       window of the unpooled x (max_window.cuh: max pooling's rule), stores it to the pool (which
//       passes 2 and 3 read back: each thread its own values) and the winner's place, a byte, to
//       window. Backward: pass 2 runs over the channel's N·H·W places of the unpooled dx, one per
//       thread (consecutive threads, consecutive places: coalesced stores; the four threads of a
//       window all read its dy, x and winner, so no lane skips a load): the winner gets batch
//       norm's dx as max pooling's backward adds it, 0 + dx; the others 0. Evaluation: one thread
//       per pooled value, the window's max, then the formula above.
//   layernorm_forward        one block of 256 per row of D values (grid-stride over the R rows),
//       the batch-norm forward's three passes over the row: mean, biased variance, then
//         y = (x − mean) · invstd · gamma[d] + beta[d]
//   layernorm_backward       two kernels:
//       layernorm_backward_data     one block per row: Σ g and Σ g·x̂ (g = gamma·dy, two block
//                                   reductions in double), then dx = invstd·(g − Σg/D − x̂·Σg·x̂/D)
//       layernorm_backward_params   one thread per column d (1-D grid-stride): adds the R rows in
//                                   order, in double: dgamma[d] += Σ dy·x̂,  dbeta[d] += Σ dy.
//                                   Consecutive threads read consecutive floats of a row.
//
// Determinism: no atomics. A channel's sums belong to one block: each thread adds its values
// in a fixed order and detail::block_reduce folds the 256 partial sums in a tree fixed by t, so
// the result is the same on every run. Against the CPU (one thread per channel, 8 float lanes
// summed in double) the order differs; both sum in double, so mean and var agree to ~1e-7
// relative, and y, dx to a few float ulps (tests: relative 1e-5). The dgamma/dbeta update of
// channel c is one thread's plain +=: channels never share an output. Layer norm is the same
// with rows for channels, and its dgamma[d], dbeta[d] belong to one thread each.
//
// The engine's batch-norm forward is batchnorm_forward_train; cuda/lab/ times versions of it.
//
// Build and run: part of the engine (make, or make CUDA=1); tested against the CPU by
//   make test T='[batchnorm][cuda]'    make test T='[layernorm][cuda]'
#include <cmath>

#include "common.cuh"
#include "gelu.cuh"
#include "max_window.cuh"
#include "ops/norm.h"

namespace kiln::cuda {

using detail::blocks_for;
using detail::kBlock;

// ---- batch norm (and max pooling in front): helpers ----------------------------------------------
namespace {

// Where value m of channel c lives in x [N, C, S].
__device__ int64_t channel_at(const BatchNormParams& p, int64_t c, int64_t m) {
    return (m / p.S * p.C + c) * p.S + m % p.S;
}

// v as a tensor of T stores it: rounded to T and read back.
template <typename T> __device__ float as_stored(float v) { return float(T(v)); }

// With GELU fused after batch norm (p.gelu): the forward's output z = GELU(y) of y as T stores it.
template <typename T> __device__ T bn_output(float y, bool gelu) { return T(gelu ? kiln::cuda::gelu(as_stored<T>(y)) : y); }

// One block per channel (or layer-norm row), at most this many blocks (more: each block loops).
unsigned channel_blocks(int64_t C) { return unsigned(std::min<int64_t>(C, 65535)); }

}  // namespace

// ---- max pooling 2×2 fused in front --------------------------------------------------------------
// The forward's input then comes from the unpooled x [N, C, H, W]: pass 1 takes value i of the
// batch norm's input [N, C, P, Q] as the max of its window, stores it to pooled (the batch norm's
// x, which passes 2 and 3 read back: each thread its own values) and the winner's place to window.
template <typename T> struct PoolIn {
    const T* x = nullptr;  // null: no pooling, the batch norm's input is as given
    T* pooled = nullptr;
    uint8_t* window = nullptr;
    MaxPool2x2 size;

    // Where the window of pooled value i (plane i / S, place i mod S) starts in x.
    __device__ int64_t corner(int64_t i, int64_t S) const {
        const int64_t Q = size.W / 2, s = i % S;
        return i / S * size.H * size.W + 2 * (s / Q) * size.W + 2 * (s % Q);
    }
    // Value i as the pooled tensor stores it (for the batch norm's sums: what max pooling wrote).
    __device__ float take(int64_t i, int64_t S) const {
        int k;
        const T m = T(max2x2(x + corner(i, S), size.W, k));
        pooled[i] = m;
        window[i] = uint8_t(k);
        return float(m);
    }
    // Value i for evaluation: the same, nothing stored.
    __device__ float peek(int64_t i, int64_t S) const {
        int k;
        return as_stored<T>(max2x2(x + corner(i, S), size.W, k));
    }
};

// The backward's output then is the unpooled dx [N, C, H, W], written one place per thread.
template <typename T> struct PoolOut {
    T* dx = nullptr;  // null: no pooling, batch norm's dx is the output
    const uint8_t* window = nullptr;
    MaxPool2x2 size;

    // Channel c's places of dx, thread t taking t, t + B, ... of its N·H·W, so that consecutive
    // threads store consecutive places (coalesced): the winner of a window gets batch norm's
    // gradient d(i) of its pooled value i as max pooling's backward adds it (0 + d: its gather
    // starts from 0), every other place 0 — a window's three others, an odd H's last row, an odd
    // W's last column.
    template <typename D> __device__ void scatter(const BatchNormParams& p, int64_t c, D d) const {
        const int64_t H = size.H, W = size.W, P = H / 2, Q = W / 2;
        for (int64_t m = threadIdx.x; m < p.N * H * W; m += blockDim.x) {
            const int64_t plane = m / (H * W) * p.C + c, ih = m / W % H, iw = m % W;
            // Every lane reads its window's d and winner, the last row and column the window
            // before theirs: no lane skips the loads, so a warp's loads stay whole requests.
            const int64_t i = plane * p.S + (ih / 2 < P ? ih / 2 : P - 1) * Q + (iw / 2 < Q ? iw / 2 : Q - 1);
            const T d_i = d(i);
            const bool winner = ih < 2 * P && iw < 2 * Q && window[i] == 2 * (ih % 2) + iw % 2;
            dx[plane * H * W + ih * W + iw] = winner ? T(__fadd_rn(0.0f, float(d_i))) : T(0.0f);
        }
    }
};

// ---- batch norm ----------------------------------------------------------------------------------
template <typename T>
__global__ void batchnorm_forward_train_kernel(const T* x, const float* gamma, const float* beta, T* y,
                                               float* running_mean, float* running_var, float* save_mean,
                                               float* save_invstd, BatchNormParams p, PoolIn<T> pool) {
    __shared__ double sh[kBlock];
    const int64_t M = p.N * p.S;
    for (int64_t c = blockIdx.x; c < p.C; c += gridDim.x) {  // the same count for every thread
        // pass 1: mean (with pooling in front, of each window's max, stored on the way)
        double s1 = 0.0;
        for (int64_t m = threadIdx.x; m < M; m += blockDim.x) {
            const int64_t i = channel_at(p, c, m);
            s1 += pool.x ? pool.take(i, p.S) : float(x[i]);
        }
        const double mean_d = detail::block_reduce(s1, sh, detail::SumOp{}) / double(M);
        const float mean = float(mean_d);
        // pass 2: biased variance around it
        double s2 = 0.0;
        for (int64_t m = threadIdx.x; m < M; m += blockDim.x) {
            const float d = float(x[channel_at(p, c, m)]) - mean;
            s2 += d * d;
        }
        const double var = detail::block_reduce(s2, sh, detail::SumOp{}) / double(M);
        const float invstd = float(1.0 / sqrt(var + double(p.eps)));
        // pass 3: y = (x − mean) · scale + shift
        const float scale = gamma[c] * invstd, shift = beta[c];
        for (int64_t m = threadIdx.x; m < M; m += blockDim.x) {
            const int64_t i = channel_at(p, c, m);
            y[i] = bn_output<T>((float(x[i]) - mean) * scale + shift, p.gelu);
        }
        if (threadIdx.x == 0) {
            save_mean[c] = mean;
            save_invstd[c] = invstd;
            const double k = p.momentum;
            running_mean[c] = float((1.0 - k) * running_mean[c] + k * mean_d);
            running_var[c] = float((1.0 - k) * running_var[c] + k * var * double(M) / double(M - 1));
        }
    }
}

// y = (x − running_mean[c]) · gamma[c] / sqrt(running_var[c] + eps) + beta[c],   c = i / S mod C
// (with pooling in front, x the window's max)
template <typename T>
__global__ void batchnorm_forward_eval_kernel(const T* x, const float* gamma, const float* beta,
                                              const float* running_mean, const float* running_var, T* y,
                                              BatchNormParams p, PoolIn<T> pool) {
    const int64_t total = p.N * p.C * p.S;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t c = i / p.S % p.C;
        const float scale = gamma[c] / sqrtf(running_var[c] + p.eps);
        const float v = pool.x ? pool.peek(i, p.S) : float(x[i]);
        y[i] = bn_output<T>((v - running_mean[c]) * scale + beta[c], p.gelu);
    }
}

// With p.gelu, dy holds dz and batch norm's dy is dz · GELU'(y), y = (x − mean)·g + beta recomputed.
// With pooling in front, dx goes to the unpooled gradient (PoolOut).
template <typename T>
__global__ void batchnorm_backward_kernel(const T* dy, const T* x, const float* gamma, const float* beta,
                                          const float* save_mean, const float* save_invstd, T* dx, float* dgamma,
                                          float* dbeta, BatchNormParams p, PoolOut<T> pool) {
    __shared__ double sh[kBlock];
    const int64_t M = p.N * p.S;
    for (int64_t c = blockIdx.x; c < p.C; c += gridDim.x) {
        const float mean = save_mean[c], invstd = save_invstd[c];
        const float g = gamma[c] * invstd, shift = p.gelu ? beta[c] : 0.0f;
        const auto dy_at = [&](int64_t i) {
            const float d = float(dy[i]);
            // __fmul_rn: the product rounded, as the GELU kernel stores it (never fused into the fma that follows)
            return p.gelu ? as_stored<T>(__fmul_rn(d, gelu_grad(as_stored<T>((float(x[i]) - mean) * g + shift)))) : d;
        };
        // pass 1: Σ dy and Σ dy·(x − mean)
        double s_dy = 0.0, s_dy_xm = 0.0;
        for (int64_t m = threadIdx.x; m < M; m += blockDim.x) {
            const int64_t i = channel_at(p, c, m);
            const float d = dy_at(i);
            s_dy += d;
            s_dy_xm += d * (float(x[i]) - mean);
        }
        const double sum_dy = detail::block_reduce(s_dy, sh, detail::SumOp{});
        const double sum_dy_xhat = detail::block_reduce(s_dy_xm, sh, detail::SumOp{}) * invstd;
        // pass 2: dx = g · (dy − k_dy − (x − mean) · k_x)
        const float k_dy = float(sum_dy / double(M));                       // Σdy / M
        const float k_x = float(sum_dy_xhat * double(invstd) / double(M));  // Σ(dy·x̂)·invstd / M
        const auto dx_at = [&](int64_t i) { return T(g * (dy_at(i) - k_dy - (float(x[i]) - mean) * k_x)); };
        if (pool.dx) {
            pool.scatter(p, c, dx_at);
        } else {
            for (int64_t m = threadIdx.x; m < M; m += blockDim.x) {
                const int64_t i = channel_at(p, c, m);
                dx[i] = dx_at(i);
            }
        }
        if (threadIdx.x == 0) {
            dgamma[c] += float(sum_dy_xhat);
            dbeta[c] += float(sum_dy);
        }
    }
}

template <typename T>
void batchnorm_forward_train(const T* x, const float* gamma, const float* beta, T* y, float* running_mean,
                             float* running_var, float* save_mean, float* save_invstd, const BatchNormParams& p) {
    if (p.C == 0) return;
    const dim3 grid(channel_blocks(p.C)), block(kBlock);
    KILN_LAUNCH(batchnorm_forward_train_kernel<T>, grid, block, 0)(x, gamma, beta, y, running_mean, running_var,
                                                                save_mean, save_invstd, p, PoolIn<T>{});
    KILN_CHECK_LAUNCH(batchnorm_forward_train_kernel<T>, grid, block);
}

template <typename T>
void batchnorm_forward_eval(const T* x, const float* gamma, const float* beta, const float* running_mean,
                            const float* running_var, T* y, const BatchNormParams& p) {
    const int64_t total = p.N * p.C * p.S;
    if (total == 0) return;
    const dim3 grid(blocks_for(total)), block(kBlock);
    KILN_LAUNCH(batchnorm_forward_eval_kernel<T>, grid, block, 0)(x, gamma, beta, running_mean, running_var, y, p,
                                                               PoolIn<T>{});
    KILN_CHECK_LAUNCH(batchnorm_forward_eval_kernel<T>, grid, block);
}

template <typename T>
void batchnorm_backward(const T* dy, const T* x, const float* gamma, const float* beta, const float* save_mean,
                        const float* save_invstd, T* dx, float* dgamma, float* dbeta, const BatchNormParams& p) {
    if (p.C == 0) return;
    const dim3 grid(channel_blocks(p.C)), block(kBlock);
    KILN_LAUNCH(batchnorm_backward_kernel<T>, grid, block, 0)(dy, x, gamma, beta, save_mean, save_invstd, dx, dgamma,
                                                           dbeta, p, PoolOut<T>{});
    KILN_CHECK_LAUNCH(batchnorm_backward_kernel<T>, grid, block);
}

// The same kernels with pooling in front: one launch each way, as batch norm alone.
template <typename T>
void maxpool2x2_batchnorm_forward_train(const T* x, const float* gamma, const float* beta, T* pooled,
                                        uint8_t* window, T* y, float* running_mean, float* running_var,
                                        float* save_mean, float* save_invstd, const BatchNormParams& p,
                                        const MaxPool2x2& pool) {
    if (p.C == 0) return;
    const dim3 grid(channel_blocks(p.C)), block(kBlock);
    KILN_LAUNCH(batchnorm_forward_train_kernel<T>, grid, block, 0)(pooled, gamma, beta, y, running_mean, running_var,
                                                                save_mean, save_invstd, p,
                                                                PoolIn<T>{x, pooled, window, pool});
    KILN_CHECK_LAUNCH(batchnorm_forward_train_kernel<T>, grid, block);
}

template <typename T>
void maxpool2x2_batchnorm_forward_eval(const T* x, const float* gamma, const float* beta, const float* running_mean,
                                       const float* running_var, T* y, const BatchNormParams& p,
                                       const MaxPool2x2& pool) {
    const int64_t total = p.N * p.C * p.S;
    if (total == 0) return;
    const dim3 grid(blocks_for(total)), block(kBlock);
    KILN_LAUNCH(batchnorm_forward_eval_kernel<T>, grid, block, 0)(nullptr, gamma, beta, running_mean, running_var, y,
                                                               p, PoolIn<T>{x, nullptr, nullptr, pool});
    KILN_CHECK_LAUNCH(batchnorm_forward_eval_kernel<T>, grid, block);
}

template <typename T>
void maxpool2x2_batchnorm_backward(const T* dy, const T* pooled, const uint8_t* window, const float* gamma,
                                   const float* beta, const float* save_mean, const float* save_invstd, T* dx,
                                   float* dgamma, float* dbeta, const BatchNormParams& p, const MaxPool2x2& pool) {
    if (p.C == 0) return;
    const dim3 grid(channel_blocks(p.C)), block(kBlock);
    KILN_LAUNCH(batchnorm_backward_kernel<T>, grid, block, 0)(dy, pooled, gamma, beta, save_mean, save_invstd, nullptr,
                                                           dgamma, dbeta, p, PoolOut<T>{dx, window, pool});
    KILN_CHECK_LAUNCH(batchnorm_backward_kernel<T>, grid, block);
}

// ---- layer norm ----------------------------------------------------------------------------------
// Block b does rows b, b + gridDim.x, ... of x [R, D]; in each, thread t takes d = t, t + B, ...
template <typename T>
__global__ void layernorm_forward_kernel(const T* x, const float* gamma, const float* beta, T* y, float* save_mean,
                                         float* save_invstd, int64_t R, int64_t D, float eps) {
    __shared__ double sh[kBlock];
    for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {  // the same count for every thread
        const T* xr = x + r * D;
        // pass 1: mean
        double s1 = 0.0;
        for (int64_t d = threadIdx.x; d < D; d += blockDim.x) s1 += float(xr[d]);
        const float mean = float(detail::block_reduce(s1, sh, detail::SumOp{}) / double(D));
        // pass 2: biased variance around it
        double s2 = 0.0;
        for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
            const float c = float(xr[d]) - mean;
            s2 += c * c;
        }
        const double var = detail::block_reduce(s2, sh, detail::SumOp{}) / double(D);
        const float invstd = float(1.0 / sqrt(var + double(eps)));
        // pass 3: y = x̂ · gamma + beta
        for (int64_t d = threadIdx.x; d < D; d += blockDim.x)
            y[r * D + d] = T((float(xr[d]) - mean) * invstd * gamma[d] + beta[d]);
        if (threadIdx.x == 0) {
            save_mean[r] = mean;
            save_invstd[r] = invstd;
        }
    }
}

// dx = invstd · (g − Σg/D − x̂ · Σ(g·x̂)/D),  g = gamma · dy, one block per row
template <typename T>
__global__ void layernorm_backward_data_kernel(const T* dy, const T* x, const float* gamma, const float* save_mean,
                                               const float* save_invstd, T* dx, int64_t R, int64_t D) {
    __shared__ double sh[kBlock];
    for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
        const T* xr = x + r * D;
        const T* gr = dy + r * D;
        const float mean = save_mean[r], invstd = save_invstd[r];
        double s_g = 0.0, s_gx = 0.0;
        for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
            const float g = gamma[d] * float(gr[d]);
            s_g += g;
            s_gx += g * ((float(xr[d]) - mean) * invstd);
        }
        const float k_g = float(detail::block_reduce(s_g, sh, detail::SumOp{})) / float(D);
        const float k_x = float(detail::block_reduce(s_gx, sh, detail::SumOp{})) / float(D);
        for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
            const float xhat = (float(xr[d]) - mean) * invstd;
            dx[r * D + d] = T(invstd * (gamma[d] * float(gr[d]) - k_g - xhat * k_x));
        }
    }
}

// dgamma[d] += Σ_r dy[r, d] · x̂[r, d],  dbeta[d] += Σ_r dy[r, d]: one thread per column, rows in order
template <typename T>
__global__ void layernorm_backward_params_kernel(const T* dy, const T* x, const float* save_mean,
                                                 const float* save_invstd, float* dgamma, float* dbeta, int64_t R,
                                                 int64_t D) {
    for (int64_t d = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; d < D; d += int64_t(gridDim.x) * blockDim.x) {
        double acc_gamma = 0.0, acc_beta = 0.0;
        for (int64_t r = 0; r < R; r++) {
            const float g = float(dy[r * D + d]);
            acc_gamma += g * ((float(x[r * D + d]) - save_mean[r]) * save_invstd[r]);
            acc_beta += g;
        }
        dgamma[d] += float(acc_gamma);
        dbeta[d] += float(acc_beta);
    }
}

template <typename T>
void layernorm_forward(const T* x, const float* gamma, const float* beta, T* y, float* save_mean, float* save_invstd,
                       int64_t R, int64_t D, float eps) {
    if (R == 0) return;
    const dim3 grid(channel_blocks(R)), block(kBlock);
    KILN_LAUNCH(layernorm_forward_kernel<T>, grid, block, 0)(x, gamma, beta, y, save_mean, save_invstd, R, D, eps);
    KILN_CHECK_LAUNCH(layernorm_forward_kernel<T>, grid, block);
}

template <typename T>
void layernorm_backward(const T* dy, const T* x, const float* gamma, const float* save_mean, const float* save_invstd,
                        T* dx, float* dgamma, float* dbeta, int64_t R, int64_t D) {
    if (R == 0) return;
    const dim3 grid(channel_blocks(R)), block(kBlock);
    KILN_LAUNCH(layernorm_backward_data_kernel<T>, grid, block, 0)(dy, x, gamma, save_mean, save_invstd, dx, R, D);
    KILN_CHECK_LAUNCH(layernorm_backward_data_kernel<T>, grid, block);
    const dim3 column_grid(blocks_for(D));
    KILN_LAUNCH(layernorm_backward_params_kernel<T>, column_grid, block, 0)(dy, x, save_mean, save_invstd, dgamma,
                                                                             dbeta, R, D);
    KILN_CHECK_LAUNCH(layernorm_backward_params_kernel<T>, column_grid, block);
}

KILN_NORM_KERNELS(KILN_INSTANTIATE_FLOAT);

}  // namespace kiln::cuda
