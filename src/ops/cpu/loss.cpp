// loss.cpp — the softmax cross-entropy loss and its gradient on the CPU (the twin of
// cuda/loss.cu). The logits may be f32, f16 or bf16; the loss is computed in double, and the
// gradient is rounded once to the logits' type.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/parallel.h"
#include "ops/loss.h"
#include "ops/reduce.h"  // argmax_rows

namespace kiln::cpu {

// Below this many logits the rows run on the calling thread.
static constexpr int64_t kParallelMin = 1 << 14;

// loss_n = log Σ_c exp(z_c) − z_y = (m + log Σ_c exp(z_c − m)) − z_y,   m = max_c z_c
// dz_c   = (exp(z_c − m) / Σ exp(z − m) − [c = y]) / N
// With label smoothing ε the target q_c = (1 − ε)·[c = y] + ε/C replaces [c = y] in both:
// loss_n = lse − (1 − ε)·z_y − (ε/C)·Σ_c z_c, dz_c = (softmax_c − q_c) / N.
// Each row's loss is kept apart and the rows are added in order: the same bits on any thread count.
// The labels are checked first: one outside [0, C) would read outside its row.
template <typename T>
void softmax_cross_entropy(const T* z, const int32_t* y, T* dz, int64_t N, int64_t C, float smoothing,
                           LossTotals* out) {
    *out = LossTotals{0.0, 0, 0, static_cast<unsigned long long>(C)};
    for (int64_t n = 0; n < N; n++)
        if (y[n] < 0 || y[n] >= C) {
            out->bad = static_cast<unsigned long long>(N - n);
            return;
        }
    std::vector<int32_t> predicted(static_cast<size_t>(N));
    argmax_rows(z, predicted.data(), N, C);
    for (int64_t n = 0; n < N; n++) out->correct += predicted[size_t(n)] == y[n];
    std::vector<double> row_loss(static_cast<size_t>(N));
    parallel_for(N, grain_of(kParallelMin, C), [&](int64_t n0, int64_t n1) {
        for (int64_t n = n0; n < n1; n++) {
            const T* zn = z + n * C;
            float m = float(zn[0]);
            for (int64_t c = 1; c < C; c++) m = std::max(m, float(zn[c]));
            double s = 0.0;
            for (int64_t c = 0; c < C; c++) s += std::exp(double(float(zn[c]) - m));
            double lse = double(m) + std::log(s);
            double target = double(float(zn[y[n]]));  // Σ_c q_c z_c: z_y, or smoothed
            if (smoothing != 0.0f) {
                double zsum = 0.0;
                for (int64_t c = 0; c < C; c++) zsum += double(float(zn[c]));
                target = (1.0 - smoothing) * target + smoothing * zsum / double(C);
            }
            row_loss[size_t(n)] = lse - target;
            if (dz) {
                T* dn = dz + n * C;
                const float spread = smoothing / float(C) / float(N), hit = (1.0f - smoothing) / float(N);
                for (int64_t c = 0; c < C; c++) {
                    float g = float(std::exp(double(float(zn[c])) - lse) / double(N));
                    if (smoothing != 0.0f) g -= spread;
                    if (c == y[n]) g -= smoothing != 0.0f ? hit : 1.0f / float(N);
                    dn[c] = T(g);
                }
            }
        }
    });
    for (double l : row_loss) out->total += l;
}

KILN_INSTANTIATE_FLOAT(softmax_cross_entropy);

}  // namespace kiln::cpu
