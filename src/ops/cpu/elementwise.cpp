// elementwise.cpp — CPU kernels that touch each element once: fill, add, axpy, scale, ReLU,
// the dtype conversions, and the optimizers' fused updates (SGD, Adam). Each is one OpenMP
// loop that g++ vectorizes; memory bandwidth is the limit. The kernels for tensors are
// templates on the element type T (float, f16, bf16): read as float, compute, round once.
#include <algorithm>
#include <cmath>

#include "ops/cpu/cpu_ops.h"

namespace kiln::cpu {

// Below this many elements a parallel region costs more than it saves.
static constexpr int64_t kParallelMin = 1 << 15;

template <typename T> void fill(T* x, int64_t n, float value) {
    const T v = T(value);
#pragma omp parallel for simd if (n > kParallelMin)
    for (int64_t i = 0; i < n; i++) x[i] = v;
}

template <typename T> void add(const T* a, const T* b, T* y, int64_t n) {
#pragma omp parallel for simd if (n > kParallelMin)
    for (int64_t i = 0; i < n; i++) y[i] = T(float(a[i]) + float(b[i]));
}

template <typename T> void axpy(float alpha, const T* x, T* y, int64_t n) {
#pragma omp parallel for simd if (n > kParallelMin)
    for (int64_t i = 0; i < n; i++) y[i] = T(float(y[i]) + alpha * float(x[i]));
}

template <typename T> void scale(T* x, int64_t n, float s) {
#pragma omp parallel for simd if (n > kParallelMin)
    for (int64_t i = 0; i < n; i++) x[i] = T(float(x[i]) * s);
}

template <typename T> void relu_forward(const T* x, T* y, int64_t n) {
#pragma omp parallel for simd if (n > kParallelMin)
    for (int64_t i = 0; i < n; i++) y[i] = T(std::max(float(x[i]), 0.0f));
}

// The gradient flows where the output was positive: dx = dy · [y > 0].
template <typename T> void relu_backward(const T* y, const T* dy, T* dx, int64_t n) {
    const T zero = T(0.0f);
#pragma omp parallel for simd if (n > kParallelMin)
    for (int64_t i = 0; i < n; i++) dx[i] = float(y[i]) > 0.0f ? dy[i] : zero;
}

template <typename From, typename To> void convert(const From* x, To* y, int64_t n) {
#pragma omp parallel for if (n > kParallelMin)
    for (int64_t i = 0; i < n; i++) y[i] = cast<To>(x[i]);
}

KILN_FOR_EACH_FLOAT_TYPE(KILN_ELEMENTWISE)  // the lists are in cpu_ops.h
KILN_FOR_EACH_TYPE_PAIR(KILN_CONVERT)

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
