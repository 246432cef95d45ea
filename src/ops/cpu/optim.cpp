// optim.cpp — the optimizers' fused updates on the CPU (the twins of cuda/optim.cu): one pass
// that reads each parameter, its gradient and its optimizer buffers once and writes the new
// values, for a whole parameter group: one parallel_for (core/parallel.h) over all the group's
// elements, the segments (one per parameter) laid end to end; memory bandwidth is the limit.
// Also GradScaler's unscale with its inf/NaN check (chapter 09), one pass over the gradients.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

#include "core/parallel.h"
#include "ops/optim.h"

// Below this many elements a parallel region costs more than it saves.
static constexpr int64_t kParallelMin = 1 << 15;

namespace kiln::cpu {

namespace {

// One parallel region over the group's elements, segment after segment: element e of the group
// is element e − start[t] of segment t, start[t] = sizes[0] + ... + sizes[t−1]. Each chunk of the
// region runs body(t, j0, j1) for the part [j0, j1) of every segment it covers. Every element is
// updated on its own, so neither the chunks nor the segments change a bit of the result.
template <typename Body>
void for_each_segment(const int64_t* sizes, int64_t count, Body body) {
    std::vector<int64_t> start(size_t(count) + 1, 0);
    for (int64_t t = 0; t < count; t++) start[t + 1] = start[t] + sizes[t];
    parallel_for(start[count], kParallelMin, [&](int64_t e0, int64_t e1) {
        // the last segment that starts at or before e0 (an empty one is skipped by its range)
        int64_t t = int64_t(std::upper_bound(start.begin(), start.end(), e0) - start.begin()) - 1;
        for (; t < count && start[t] < e1; t++) {
            const int64_t j0 = std::max(e0, start[t]) - start[t], j1 = std::min(e1, start[t + 1]) - start[t];
            if (j0 < j1) body(t, j0, j1);
        }
    });
}

}  // namespace

// The fields of s are copied, as in adam_update below, so that the compiler need not reload them
// after each store through p.
void sgd_update(float* const* params, const float* const* grads, float* const* bufs, const int64_t* sizes,
                int64_t count, const SgdParams& s) {
    const float lr = s.scalars ? s.scalars[0] : s.lr;
    const float momentum = s.momentum, dampening = s.dampening, weight_decay = s.weight_decay;
    const bool nesterov = s.nesterov, first_step = s.first_step;
    for_each_segment(sizes, count, [&](int64_t t, int64_t i0, int64_t i1) {
        float* p = params[t];
        const float* grad = grads[t];
        float* buf = bufs ? bufs[t] : nullptr;
#pragma omp simd
        for (int64_t i = i0; i < i1; i++) {
            float g = grad[i] + weight_decay * p[i];
            if (momentum != 0.0f) {
                buf[i] = first_step ? g : momentum * buf[i] + (1.0f - dampening) * g;
                g = nesterov ? g + momentum * buf[i] : buf[i];
            }
            p[i] -= lr * g;
        }
    });
}

// The scalars are rounded to float once, as PyTorch passes them to its float kernels; then each
// element is independent (no reduction), so any thread count gives the same bits. (The fields of
// a are copied so that the compiler need not reload them after each store through p.) g++ leaves
// this loop scalar (it reads and writes 7 floats per element, 9 with AMSGrad): std::sqrt must set
// errno for a negative input, a branch in the loop that only -fno-math-errno would remove.
void adam_update(float* const* params, const float* const* grads, float* const* ms, float* const* vs,
                 float* const* v_maxs, const int64_t* sizes, int64_t count, const AdamParams& a) {
    const float beta1 = a.beta1, beta2 = a.beta2, eps = a.eps, wd = a.weight_decay;
    const float step_size = a.scalars ? a.scalars[0] : float(a.step_size());
    const float bc2_sqrt = a.scalars ? a.scalars[1] : float(a.bias_correction2_sqrt());
    const float decay = a.scalars ? a.scalars[2] : float(a.decay());
    const bool decoupled = a.decoupled;
    for_each_segment(sizes, count, [&](int64_t t, int64_t i0, int64_t i1) {
        float *p = params[t], *m = ms[t], *v = vs[t], *v_max = v_maxs ? v_maxs[t] : nullptr;
        const float* grad = grads[t];
#pragma omp simd
        for (int64_t i = i0; i < i1; i++) {
            float g = grad[i];
            if (decoupled) p[i] *= decay;
            else g += wd * p[i];
            m[i] = beta1 * m[i] + (1.0f - beta1) * g;
            v[i] = beta2 * v[i] + (1.0f - beta2) * g * g;
            const float v_used = v_max ? (v_max[i] = std::max(v_max[i], v[i])) : v[i];
            p[i] -= step_size * m[i] / (std::sqrt(v_used) / bc2_sqrt + eps);
        }
    });
}

// One read and one write per element; the flag is an OR over the elements (each chunk's, then
// the chunks'), so the result does not depend on the thread count.
bool unscale_and_check(float* const* grads, const int64_t* sizes, int64_t count, float inv_scale) {
    std::atomic<bool> found_inf{false};
    for_each_segment(sizes, count, [&](int64_t t, int64_t i0, int64_t i1) {
        float* g = grads[t];
        int found = 0;
#pragma omp simd reduction(| : found)
        for (int64_t i = i0; i < i1; i++) {
            found |= !std::isfinite(g[i]);
            g[i] *= inv_scale;
        }
        if (found) found_inf.store(true, std::memory_order_relaxed);
    });
    return found_inf.load();
}

}  // namespace kiln::cpu
