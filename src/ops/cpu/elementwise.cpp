// elementwise.cpp — CPU kernels that touch each element once: fill, add, axpy, scale, ReLU,
// bias rows, and the optimizers' fused updates (SGD, Adam). Each is one OpenMP loop that g++
// vectorizes; memory bandwidth is the limit.
#include <algorithm>
#include <cmath>

#include "ops/cpu/cpu_ops.h"

namespace kiln::cpu {

// Below this many elements a parallel region costs more than it saves.
static constexpr int64_t kParallelMin = 1 << 15;

void fill(float* x, int64_t n, float value) {
#pragma omp parallel for simd if (n > kParallelMin)
    for (int64_t i = 0; i < n; i++) x[i] = value;
}

void add(const float* a, const float* b, float* y, int64_t n) {
#pragma omp parallel for simd if (n > kParallelMin)
    for (int64_t i = 0; i < n; i++) y[i] = a[i] + b[i];
}

void axpy(float alpha, const float* x, float* y, int64_t n) {
#pragma omp parallel for simd if (n > kParallelMin)
    for (int64_t i = 0; i < n; i++) y[i] += alpha * x[i];
}

void scale(float* x, int64_t n, float s) {
#pragma omp parallel for simd if (n > kParallelMin)
    for (int64_t i = 0; i < n; i++) x[i] *= s;
}

void relu_forward(const float* x, float* y, int64_t n) {
#pragma omp parallel for simd if (n > kParallelMin)
    for (int64_t i = 0; i < n; i++) y[i] = std::max(x[i], 0.0f);
}

// The gradient flows where the output was positive: dx = dy · [y > 0].
void relu_backward(const float* y, const float* dy, float* dx, int64_t n) {
#pragma omp parallel for simd if (n > kParallelMin)
    for (int64_t i = 0; i < n; i++) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

void add_bias(float* y, const float* b, int64_t N, int64_t C) {
#pragma omp parallel for if (N * C > kParallelMin)
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++) y[n * C + c] += b[c];
}

// db[c] = Σ_n dy[n,c] + beta·db[c]. Each column is summed by one thread in row order, so the
// result does not depend on the thread count.
void sum_rows(const float* dy, float* db, int64_t N, int64_t C, float beta) {
#pragma omp parallel for if (N * C > kParallelMin)
    for (int64_t c = 0; c < C; c++) {
        float s = 0.0f;
        for (int64_t n = 0; n < N; n++) s += dy[n * C + c];
        db[c] = s + (beta == 0.0f ? 0.0f : beta * db[c]);
    }
}

void argmax_rows(const float* x, int32_t* out, int64_t N, int64_t C) {
#pragma omp parallel for if (N * C > kParallelMin)
    for (int64_t n = 0; n < N; n++) {
        const float* row = x + n * C;
        int64_t best = 0;
        for (int64_t c = 1; c < C; c++)
            if (row[c] > row[best]) best = c;  // first maximum wins, like PyTorch
        out[n] = int32_t(best);
    }
}

}  // namespace kiln::cpu

namespace kiln::cpu {

void sgd_update(float* p, const float* grad, float* buf, int64_t n, float lr, float momentum, float dampening,
                float weight_decay, bool nesterov, bool first_step) {
#pragma omp parallel for simd if (n > kParallelMin)
    for (int64_t i = 0; i < n; i++) {
        float g = grad[i] + weight_decay * p[i];
        if (momentum != 0.0f) {
            buf[i] = first_step ? g : momentum * buf[i] + (1.0f - dampening) * g;
            g = nesterov ? g + momentum * buf[i] : buf[i];
        }
        p[i] -= lr * g;
    }
}

// The scalars are rounded to float once, as PyTorch passes them to its float kernels; then each
// element is independent (no reduction), so any thread count gives the same bits. (The fields of
// a are copied so that the compiler need not reload them after each store through p.) g++ leaves
// this loop scalar (it reads and writes 7 floats per element, 9 with AMSGrad): std::sqrt must set
// errno for a negative input, a branch in the loop that only -fno-math-errno would remove.
void adam_update(float* p, const float* grad, float* m, float* v, float* v_max, int64_t n, const AdamParams& a) {
    const float beta1 = a.beta1, beta2 = a.beta2, eps = a.eps, wd = a.weight_decay;
    const float step_size = float(a.step_size()), bc2_sqrt = float(a.bias_correction2_sqrt()),
                decay = float(a.decay());
    const bool decoupled = a.decoupled;
#pragma omp parallel for simd if (n > kParallelMin)
    for (int64_t i = 0; i < n; i++) {
        float g = grad[i];
        if (decoupled) p[i] *= decay;
        else g += wd * p[i];
        m[i] = beta1 * m[i] + (1.0f - beta1) * g;
        v[i] = beta2 * v[i] + (1.0f - beta2) * g * g;
        const float v_used = v_max ? (v_max[i] = std::max(v_max[i], v[i])) : v[i];
        p[i] -= step_size * m[i] / (std::sqrt(v_used) / bc2_sqrt + eps);
    }
}

}  // namespace kiln::cpu
