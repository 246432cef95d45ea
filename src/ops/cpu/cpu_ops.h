// cpu_ops.h — the CPU kernels behind kiln's operations, on raw pointers.
//
// Each function here has a twin with the same name and arguments in cuda/ (the CUDA kernels),
// so a reader can put the two side by side. src/ops/ops.cpp checks the
// tensors and picks one of the two by the tensors' device. GEMM lives in gemm.h.
//
// Letters: N = batch rows, C = columns (features or classes), n = element count.
#pragma once
#include <cmath>
#include <cstdint>

namespace kiln::cpu {

// ---- elementwise (n elements) -------------------------------------------------------------
void fill(float* x, int64_t n, float value);
void add(const float* a, const float* b, float* y, int64_t n);       // y = a + b
void axpy(float alpha, const float* x, float* y, int64_t n);        // y += alpha·x
void scale(float* x, int64_t n, float s);                           // x *= s
void relu_forward(const float* x, float* y, int64_t n);             // y = max(x, 0)
void relu_backward(const float* y, const float* dy, float* dx, int64_t n);  // dx = dy·[y > 0]

// ---- rows of an N×C matrix -------------------------------------------------------------------
void add_bias(float* y, const float* b, int64_t N, int64_t C);      // y[n,c] += b[c]
void sum_rows(const float* dy, float* db, int64_t N, int64_t C, float beta);  // db = Σ_n dy[n,:] + beta·db
void argmax_rows(const float* x, int32_t* out, int64_t N, int64_t C);

// ---- reductions (deterministic: fixed-size chunks summed in a fixed order) -----------------
double sum(const float* x, int64_t n);
double sum_squares(const float* x, int64_t n);  // Σ x², each square exact in double
float max(const float* x, int64_t n);

// ---- loss --------------------------------------------------------------------------------------
// Mean softmax cross-entropy of N rows of C logits against integer labels:
//   loss = 1/N Σ_n [ log Σ_c exp(z[n,c]) − z[n,y_n] ]
// computed as m + log Σ exp(z − m) with m = max_c z[n,c], so exp never overflows.
// dz (if not null) = (softmax(z) − onehot(y)) / N. Returns the loss.
float softmax_cross_entropy(const float* z, const int32_t* y, float* dz, int64_t N, int64_t C);

// ---- optimizer update (one fused pass over n parameters) -----------------------------------
// PyTorch's SGD:  g = grad + wd·p;  buf = first ? g : momentum·buf + (1 − dampening)·g;
//                 g = nesterov ? g + momentum·buf : buf   (when momentum ≠ 0);   p −= lr·g
void sgd_update(float* p, const float* grad, float* buf, int64_t n, float lr, float momentum, float dampening,
                float weight_decay, bool nesterov, bool first_step);

// One step of PyTorch's Adam or AdamW (the rule, and what each buffer is: src/optim/adam.h).
struct AdamParams {
    float lr, beta1, beta2, eps, weight_decay;
    bool decoupled;  // AdamW: p = p·(1 − lr·wd) before the step; Adam: g = grad + wd·p
    int64_t step;    // t = 1, 2, ...: this update's number, for the bias corrections
    // The step's scalars, in double as PyTorch computes them (from Python floats):
    // lr / (1 − β1^t),  sqrt(1 − β2^t),  and AdamW's factor on p, 1 − lr·wd.
    double step_size() const { return double(lr) / (1.0 - std::pow(double(beta1), double(step))); }
    double bias_correction2_sqrt() const { return std::sqrt(1.0 - std::pow(double(beta2), double(step))); }
    double decay() const { return 1.0 - double(lr) * double(weight_decay); }
};
// Adam: g = grad + wd·p, AdamW: p = decay·p;  m = β1·m + (1 − β1)·g;  v = β2·v + (1 − β2)·g²;
// v_max = max(v_max, v) when v_max is not null (AMSGrad: v_max then replaces v below);
// p −= step_size · m / (sqrt(v) / bias_correction2_sqrt + eps)
void adam_update(float* p, const float* grad, float* m, float* v, float* v_max, int64_t n, const AdamParams& a);

}  // namespace kiln::cpu
