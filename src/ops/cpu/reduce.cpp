// reduce.cpp — sums and maxima over all elements, and the row kernels of an N×C matrix: bias
// rows (add_bias), column sums (sum_rows, the bias gradient) and argmax (the twin of
// cuda/reduce.cu).
//
// Determinism: a float sum depends on the order of its terms. Splitting the work by thread
// would make the result depend on the thread count, so we split it into fixed chunks of
// kChunk elements instead, sum each chunk in order (in double), and add the chunk sums in
// order. Any number of threads computes exactly the same number.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/parallel.h"
#include "ops/reduce.h"

namespace kiln::cpu {

static constexpr int64_t kChunk = 1 << 14;

// Σ_i term(i) over i < n, in double, chunk by chunk as above.
template <typename Term> static double chunked_sum(int64_t n, Term term) {
    int64_t chunks = (n + kChunk - 1) / kChunk;
    std::vector<double> part(size_t(std::max<int64_t>(chunks, 1)), 0.0);
    parallel_chunks(chunks, [&](int64_t c) {
        double s = 0.0;
        for (int64_t i = c * kChunk; i < std::min(n, (c + 1) * kChunk); i++) s += term(i);
        part[size_t(c)] = s;
    });
    double total = 0.0;
    for (double p : part) total += p;
    return total;
}

template <typename T> double sum(const T* x, int64_t n) {
    return chunked_sum(n, [x](int64_t i) { return double(float(x[i])); });
}

// A float's square has at most 48 significant bits: exact in double's 53.
template <typename T> double sum_squares(const T* x, int64_t n) {
    return chunked_sum(n, [x](int64_t i) {
        const double v = double(float(x[i]));
        return v * v;
    });
}

template <typename T> float max(const T* x, int64_t n) {
    const int64_t chunks = (n + kChunk - 1) / kChunk;
    std::vector<float> part(size_t(std::max<int64_t>(chunks, 1)), -std::numeric_limits<float>::infinity());
    parallel_chunks(chunks, [&](int64_t c) {
        float m = part[size_t(c)];
        for (int64_t i = c * kChunk; i < std::min(n, (c + 1) * kChunk); i++) m = std::max(m, float(x[i]));
        part[size_t(c)] = m;
    });
    return *std::max_element(part.begin(), part.end());  // max is exact: the order does not matter
}

// ---- rows of an N×C matrix ---------------------------------------------------------------------
template <typename T> void add_bias(T* y, const T* b, int64_t N, int64_t C) {
    parallel_for(N, grain_of(kChunk, C), [&](int64_t n0, int64_t n1) {
        for (int64_t n = n0; n < n1; n++)
            for (int64_t c = 0; c < C; c++) y[n * C + c] = T(float(y[n * C + c]) + float(b[c]));
    });
}

// db[c] = Σ_n dy[n,c] + beta·db[c]. Each column is summed (in float) by one thread in row order,
// so the result does not depend on the thread count.
template <typename T> void sum_rows(const T* dy, T* db, int64_t N, int64_t C, float beta) {
    parallel_for(C, grain_of(kChunk, N), [&](int64_t c0, int64_t c1) {
        for (int64_t c = c0; c < c1; c++) {
            float s = 0.0f;
            for (int64_t n = 0; n < N; n++) s += float(dy[n * C + c]);
            db[c] = T(s + (beta == 0.0f ? 0.0f : beta * float(db[c])));
        }
    });
}

template <typename T> void argmax_rows(const T* x, int32_t* out, int64_t N, int64_t C) {
    parallel_for(N, grain_of(kChunk, C), [&](int64_t n0, int64_t n1) {
        for (int64_t n = n0; n < n1; n++) {
            const T* row = x + n * C;
            int64_t best = 0;
            for (int64_t c = 1; c < C; c++)
                if (float(row[c]) > float(row[best])) best = c;  // first maximum wins, like PyTorch
            out[n] = int32_t(best);
        }
    });
}

KILN_REDUCE_KERNELS(KILN_INSTANTIATE_FLOAT);

}  // namespace kiln::cpu
