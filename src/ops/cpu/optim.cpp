// optim.cpp — the optimizers' fused updates on the CPU (the twins of cuda/optim.cu): one pass
// that reads each parameter, its gradient and its optimizer buffers once and writes the new
// values. Each is one parallel_for (core/parallel.h); memory bandwidth is the limit. Also GradScaler's unscale
// with its inf/NaN check (chapter 09), one pass over the gradients.
#include <algorithm>
#include <atomic>
#include <cmath>

#include "core/parallel.h"
#include "ops/kernels/optim.h"

// Below this many elements a parallel region costs more than it saves.
static constexpr int64_t kParallelMin = 1 << 15;

namespace kiln::cpu {

// The fields of s are copied, as in adam_update below, so that the compiler need not reload them
// after each store through p.
void sgd_update(float* p, const float* grad, float* buf, int64_t n, const SgdParams& s) {
    const float lr = s.lr, momentum = s.momentum, dampening = s.dampening, weight_decay = s.weight_decay;
    const bool nesterov = s.nesterov, first_step = s.first_step;
    parallel_for(n, kParallelMin, [&](int64_t i0, int64_t i1) {
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
void adam_update(float* p, const float* grad, float* m, float* v, float* v_max, int64_t n, const AdamParams& a) {
    const float beta1 = a.beta1, beta2 = a.beta2, eps = a.eps, wd = a.weight_decay;
    const float step_size = float(a.step_size()), bc2_sqrt = float(a.bias_correction2_sqrt()),
                decay = float(a.decay());
    const bool decoupled = a.decoupled;
    parallel_for(n, kParallelMin, [&](int64_t i0, int64_t i1) {
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
// the chunks', then the tensors'), so the result does not depend on the thread count.
bool unscale_and_check(float* const* grads, const int64_t* sizes, int64_t count, float inv_scale) {
    std::atomic<bool> found_inf{false};
    for (int64_t t = 0; t < count; t++) {
        float* g = grads[t];
        parallel_for(sizes[t], kParallelMin, [&](int64_t i0, int64_t i1) {
            int found = 0;
#pragma omp simd reduction(| : found)
            for (int64_t i = i0; i < i1; i++) {
                found |= !std::isfinite(g[i]);
                g[i] *= inv_scale;
            }
            if (found) found_inf.store(true, std::memory_order_relaxed);
        });
    }
    return found_inf.load();
}

}  // namespace kiln::cpu
