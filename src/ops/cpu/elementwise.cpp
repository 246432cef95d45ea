// elementwise.cpp — CPU kernels that touch each element once: fill, add, axpy, scale, ReLU,
// bias rows. Each is one OpenMP loop that g++ vectorizes; memory bandwidth is the limit. (The
// optimizers' fused updates are in optim.cpp.)
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
