// cpu_ops.h — the CPU kernels behind kiln's operations, on raw pointers.
//
// Each function here has a twin with the same name and arguments in cuda/ (the CUDA kernels),
// and the file that holds it has the same name too (elementwise.cpp ↔ cuda/elementwise.cu,
// reduce.cpp ↔ reduce.cu, loss.cpp ↔ loss.cu), so a reader can put the two side by side.
// src/ops/ops.cpp checks the tensors and picks one of the two by the tensors' device and the
// kernel's instantiation by their dtype. GEMM lives in gemm.h.
//
// Element types: T is float, f16 or bf16 (core/dtype.h); each kernel reads elements into
// float, computes in float (sums too) and rounds once when it stores a T. Scalars (alpha,
// value, beta) are float whatever T is. For T = float the code is what it was before templates.
//
// Letters: N = batch rows, C = columns (features or classes), n = element count.
#pragma once
#include <cmath>
#include <cstdint>

#include "core/dtype.h"
#include "ops/optim.h"  // AdamParams

namespace kiln::cpu {

// ---- elementwise (n elements; elementwise.cpp) ---------------------------------------------
template <typename T> void fill(T* x, int64_t n, float value);
template <typename T> void add(const T* a, const T* b, T* y, int64_t n);              // y = a + b
template <typename T> void mul(const T* a, const T* b, T* y, int64_t n);              // y = a ⊙ b (y may be a)
template <typename T> void axpy(float alpha, const T* x, T* y, int64_t n);            // y += alpha·x
template <typename T> void scale(T* x, int64_t n, float s);                           // x *= s
// ReLU with an upper bound (ops.h relu): cap = +∞ for ReLU, 6 for ReLU6.
template <typename T> void relu_forward(const T* x, T* y, int64_t n, float cap);      // y = min(max(x, 0), cap)
template <typename T> void relu_backward(const T* y, const T* dy, T* dx, int64_t n, float cap);  // dx = dy·[0 < y < cap]
// y[i] = cast<To>(x[i]) (dtype.h: floats round to nearest even, integers also saturate), for
// every pair of the six element types: what Tensor::to(DType) runs.
template <typename From, typename To> void convert(const From* x, To* y, int64_t n);

// The explicit instantiations of the above, for elementwise.cpp and its twin elementwise.cu
// (one list, since the two declare the same functions): KILN_FOR_EACH_FLOAT_TYPE(KILN_ELEMENTWISE)
// and KILN_FOR_EACH_TYPE_PAIR(KILN_CONVERT) inside the namespace.
#define KILN_ELEMENTWISE(T)                                                 \
    template void fill<T>(T*, int64_t, float);                              \
    template void add<T>(const T*, const T*, T*, int64_t);                  \
    template void mul<T>(const T*, const T*, T*, int64_t);                  \
    template void axpy<T>(float, const T*, T*, int64_t);                    \
    template void scale<T>(T*, int64_t, float);                             \
    template void relu_forward<T>(const T*, T*, int64_t, float);            \
    template void relu_backward<T>(const T*, const T*, T*, int64_t, float);
#define KILN_CONVERT(From, To) template void convert<From, To>(const From*, To*, int64_t);

// ---- rows of an N×C matrix (reduce.cpp) ------------------------------------------------------
template <typename T> void add_bias(T* y, const T* b, int64_t N, int64_t C);  // y[n,c] += b[c]
// db[c] = Σ_n dy[n,c] + beta·db[c], summed in float
template <typename T> void sum_rows(const T* dy, T* db, int64_t N, int64_t C, float beta);
template <typename T> void argmax_rows(const T* x, int32_t* out, int64_t N, int64_t C);

// ---- reductions (reduce.cpp; deterministic: fixed-size chunks summed in a fixed order) ------
template <typename T> double sum(const T* x, int64_t n);          // summed in double
template <typename T> double sum_squares(const T* x, int64_t n);  // Σ x², each square exact in double
template <typename T> float max(const T* x, int64_t n);

// The explicit instantiations of the row kernels and reductions, for reduce.cpp and reduce.cu.
#define KILN_REDUCE(T)                                                      \
    template void add_bias<T>(T*, const T*, int64_t, int64_t);              \
    template void sum_rows<T>(const T*, T*, int64_t, int64_t, float);       \
    template void argmax_rows<T>(const T*, int32_t*, int64_t, int64_t);     \
    template double sum<T>(const T*, int64_t);                              \
    template double sum_squares<T>(const T*, int64_t);                      \
    template float max<T>(const T*, int64_t);

// ---- loss (loss.cpp) ---------------------------------------------------------------------------
// Mean softmax cross-entropy of N rows of C logits against integer labels:
//   loss = 1/N Σ_n [ log Σ_c exp(z[n,c]) − z[n,y_n] ]
// computed as m + log Σ exp(z − m) with m = max_c z[n,c], so exp never overflows; in double
// whatever T is. dz (if not null) = (softmax(z) − onehot(y)) / N, rounded once to T. Returns
// the loss. With label smoothing ε > 0 the target is q = (1 − ε)·onehot(y) + ε/C instead of
// onehot(y) (ops.h): loss_n = log Σ exp(z) − Σ_c q_c z_c, dz = (softmax(z) − q) / N.
template <typename T>
float softmax_cross_entropy(const T* z, const int32_t* y, T* dz, int64_t N, int64_t C, float smoothing = 0.0f);

// ---- optimizer update (one fused pass over n parameters; optim.cpp) -------------------------
// PyTorch's SGD:  g = grad + wd·p;  buf = first ? g : momentum·buf + (1 − dampening)·g;
//                 g = nesterov ? g + momentum·buf : buf   (when momentum ≠ 0);   p −= lr·g
void sgd_update(float* p, const float* grad, float* buf, int64_t n, float lr, float momentum, float dampening,
                float weight_decay, bool nesterov, bool first_step);

// One step of PyTorch's Adam or AdamW (AdamParams and the rule: ops/optim.h, src/optim/adam.h).
// Adam: g = grad + wd·p, AdamW: p = decay·p;  m = β1·m + (1 − β1)·g;  v = β2·v + (1 − β2)·g²;
// v_max = max(v_max, v) when v_max is not null (AMSGrad: v_max then replaces v below);
// p −= step_size · m / (sqrt(v) / bias_correction2_sqrt + eps)
void adam_update(float* p, const float* grad, float* m, float* v, float* v_max, int64_t n, const AdamParams& a);

// GradScaler's unscale_ (chapter 09), over `count` tensors (grads[t] of sizes[t] elements):
// g[i] *= inv_scale for every i, in the same pass; returns whether any g[i] was inf or NaN
// before it was multiplied.
bool unscale_and_check(float* const* grads, const int64_t* sizes, int64_t count, float inv_scale);


// ---- sparse × dense (sparse.cpp; chapter 10) ---------------------------------------------------
// y [N, out] = x [N, in] · Wᵀ + b with W [out, in] in compressed sparse rows (ops/sparse.h):
//   y[n, o] = Σ_{k = row_start[o]}^{row_start[o+1] − 1} values[k] · x[n, col_index[k]]  (+ bias[o])
// the terms added in k's order, then the bias; bias may be null. f32 only. y is overwritten.
void csr_linear(const float* x, const float* values, const int32_t* col_index, const int32_t* row_start,
                const float* bias, float* y, int64_t N, int64_t in, int64_t out);

}  // namespace kiln::cpu
