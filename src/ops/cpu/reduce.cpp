// reduce.cpp — sums and maxima over all elements, and the softmax cross-entropy loss.
//
// Determinism: a float sum depends on the order of its terms. Splitting the work by thread
// would make the result depend on the thread count, so we split it into fixed chunks of
// kChunk elements instead, sum each chunk in order (in double), and add the chunk sums in
// order. Any number of threads computes exactly the same number.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ops/cpu/cpu_ops.h"

namespace kiln::cpu {

static constexpr int64_t kChunk = 1 << 14;

// Σ_i term(i) over i < n, in double, chunk by chunk as above.
template <typename Term> static double chunked_sum(int64_t n, Term term) {
    int64_t chunks = (n + kChunk - 1) / kChunk;
    std::vector<double> part(size_t(std::max<int64_t>(chunks, 1)), 0.0);
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (int64_t c = 0; c < chunks; c++) {
        double s = 0.0;
        for (int64_t i = c * kChunk; i < std::min(n, (c + 1) * kChunk); i++) s += term(i);
        part[size_t(c)] = s;
    }
    double total = 0.0;
    for (double p : part) total += p;
    return total;
}

double sum(const float* x, int64_t n) {
    return chunked_sum(n, [x](int64_t i) { return double(x[i]); });
}

// A float's square has at most 48 significant bits: exact in double's 53.
double sum_squares(const float* x, int64_t n) {
    return chunked_sum(n, [x](int64_t i) { return double(x[i]) * double(x[i]); });
}

float max(const float* x, int64_t n) {
    float m = -std::numeric_limits<float>::infinity();
#pragma omp parallel for reduction(max : m) if (n > kChunk)
    for (int64_t i = 0; i < n; i++) m = std::max(m, x[i]);
    return m;  // max is exact: the order does not matter
}

// loss_n = log Σ_c exp(z_c) − z_y = (m + log Σ_c exp(z_c − m)) − z_y,   m = max_c z_c
// dz_c   = (exp(z_c − m) / Σ exp(z − m) − [c = y]) / N
float softmax_cross_entropy(const float* z, const int32_t* y, float* dz, int64_t N, int64_t C) {
    std::vector<double> row_loss(static_cast<size_t>(N));
#pragma omp parallel for schedule(static) if (N * C > kChunk)
    for (int64_t n = 0; n < N; n++) {
        const float* zn = z + n * C;
        float m = zn[0];
        for (int64_t c = 1; c < C; c++) m = std::max(m, zn[c]);
        double s = 0.0;
        for (int64_t c = 0; c < C; c++) s += std::exp(double(zn[c] - m));
        double lse = double(m) + std::log(s);
        row_loss[size_t(n)] = lse - double(zn[y[n]]);
        if (dz) {
            float* dn = dz + n * C;
            for (int64_t c = 0; c < C; c++) dn[c] = float(std::exp(double(zn[c]) - lse) / double(N));
            dn[y[n]] -= 1.0f / float(N);
        }
    }
    double total = 0.0;
    for (double l : row_loss) total += l;
    return float(total / double(N));
}

}  // namespace kiln::cpu
