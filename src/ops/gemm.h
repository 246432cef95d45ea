// gemm.h — the matrix product and the Linear layer's op (chapters 01 and 02; the CUDA GEMM,
// chapter 04; its f16/bf16 tensor-core path, chapter 09). The kernels' contract, declared once for
// both backends (core/backend.h; src/ops/cpu/gemm.cpp ↔ cuda/gemm.cu; how the CPU computes it:
// ops/cpu/gemm.h), then the ops on tensors that check their arguments and dispatch to those
// kernels: declared here, defined at the end of this file and compiled once, in src/ops/ops.cpp
// (KILN_DEFINE_OPS). The bias's ops, add_bias_ and sum_rows_into, are the reduce family's
// (ops/reduce.h, with their kernels).
//
// Autocast (ops/autocast.h): linear and linear_backward run in the class LowPrecision (f16 or bf16
// under autocast, the weights' low copies made once per step); matmul and matmul_into cast nothing.
#pragma once
#include <cstdint>

#include "core/backend.h"
#include "core/tensor.h"
#include "ops/autocast.h"
#include "ops/check.h"
#include "ops/reduce.h"  // add_bias_, sum_rows_into: linear's bias

namespace kiln {

// ==== the kernels ============================================================================
//   C[M,N] = alpha · op(A)[M,K] · op(B)[K,N] + beta · C[M,N]          all row-major
//
//   op(A) = A   stored M×K, row stride lda (lda ≥ K)     trans_a = false
//         = Aᵀ  A stored K×M, row stride lda (lda ≥ M)   trans_a = true
//   op(B) = B   stored K×N, row stride ldb (ldb ≥ N)     trans_b = false
//         = Bᵀ  B stored N×K, row stride ldb (ldb ≥ K)   trans_b = true
//   C       stored M×N, row stride ldc (ldc ≥ N)
//
// beta == 0 means "overwrite": C's prior contents are never read (they may be NaN).
// alpha == 0 or K == 0 means C = beta · C (A and B are not read), as in BLAS.
// T is float, f16 or bf16: A, B and C hold T, alpha and beta are float, and the products are
// summed in f32 whatever T is; C is rounded to T once, at the end. The same bits on every run
// and, on the CPU, any thread count.
KILN_KERNEL(gemm, template <typename T> void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                                                  float alpha, const T* A, int64_t lda, const T* B, int64_t ldb,
                                                  float beta, T* C, int64_t ldc));

// Split-K (cuda/gemm.cu) for a small C and a long K — the convolution's weight gradient, M = Og,
// N = Kc, K = L, whose 64×64 tiles number 1 to 36 where a GPU has 132 SMs: K is cut into S
// slices summed by S times more blocks into float partials, which a second pass adds in order
// (deterministic, no atomics) into C = alpha·Σ + beta·C. S = gemm_split_k_slices: enough blocks
// for two per SM, slices of at least 256; S = 1, and f16/bf16 (their tensor-core path), is gemm.
KILN_CUDA_KERNEL(template <typename T> void gemm_split_k(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                                                         float alpha, const T* A, int64_t lda, const T* B,
                                                         int64_t ldb, float beta, T* C, int64_t ldc));
KILN_CUDA_KERNEL(int64_t gemm_split_k_slices(int64_t M, int64_t N, int64_t K));

// ==== the ops on tensors =====================================================================
// c = alpha · op(a) · op(b) + beta · c; all 2-D, one dtype; op transposes when asked.
void matmul_into(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c,
                 float alpha = 1.0f, float beta = 0.0f);
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);
// A Linear layer's op (autocast class LowPrecision): y [N, out] = x [N, in] · wᵀ + b, w [out, in], b [out] or
// undefined. *saved_x (if not null) gets x as the GEMM read it, for linear_backward.
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b, Tensor* saved_x = nullptr);
// dw += dyᵀ · x, db += Σ_n dy (db undefined: no bias); then, when need_dx, returns dx = dy · w
// in x's type, else an undefined tensor. x is linear's *saved_x; it is let go before dx is made.
Tensor linear_backward(Tensor x, const Tensor& w, const Tensor& dy, Tensor& dw, Tensor& db, bool need_dx);

}  // namespace kiln


#ifdef KILN_DEFINE_OPS  // compiled once, in src/ops/ops.cpp (see there)
namespace kiln {

void matmul_into(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, float alpha, float beta) {
    check_args("matmul", {{a, "a"}, {b, "b"}, {c, "c"}});
    KILN_CHECK(a.ndim() == 2 && b.ndim() == 2 && c.ndim() == 2, "matmul: needs 2-D tensors, got ", a.desc(), ", ",
               b.desc(), ", ", c.desc());
    // op(a) is M×K, op(b) is K×N, c is M×N
    int64_t M = trans_a ? a.size(1) : a.size(0), K = trans_a ? a.size(0) : a.size(1);
    int64_t Kb = trans_b ? b.size(1) : b.size(0), N = trans_b ? b.size(0) : b.size(1);
    KILN_CHECK(K == Kb, "matmul: inner sizes differ: op(a) is ", M, "×", K, " (", a.desc(),
               trans_a ? ", transposed" : "", ") and op(b) is ", Kb, "×", N, " (", b.desc(),
               trans_b ? ", transposed" : "", ")");
    KILN_CHECK(c.size(0) == M && c.size(1) == N, "matmul: output should be [", M, ", ", N, "] but is ", c.desc());
    dispatch(a.device(), a.dtype(), [&](auto be, auto tag) {
        using T = decltype(tag);
        kernel::gemm(be, trans_a, trans_b, M, N, K, alpha, a.data<T>(), a.size(1), b.data<T>(), b.size(1), beta,
                     c.data<T>(), N);
    });
}

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
    check_defined(a, "matmul", "a");
    check_defined(b, "matmul", "b");
    KILN_CHECK(a.ndim() == 2 && b.ndim() == 2, "matmul: needs 2-D tensors, got ", a.desc(), " and ", b.desc());
    int64_t M = trans_a ? a.size(1) : a.size(0), N = trans_b ? b.size(0) : b.size(1);
    Tensor c = Tensor::empty({M, N}, a.dtype(), a.device(), Category::Activation);
    matmul_into(a, trans_a, b, trans_b, c);
    return c;
}

// y = x · wᵀ + b, in autocast's type for class LowPrecision: matmul, then the bias on each row.
Tensor linear(const Tensor& x_in, const Tensor& w_in, const Tensor& b_in, Tensor* saved_x) {
    const AmpCast amp(CastPolicy::LowPrecision, x_in.dtype());
    const Tensor x = amp.input(x_in), w = amp.weight(w_in);
    Tensor y = matmul(x, w, false, true);  // [N, in] · [in, out]
    if (b_in.defined()) add_bias_(y, amp.weight(b_in));
    if (saved_x) *saved_x = x;
    return y;
}

// dW += dyᵀ · x and db += Σ_n dy in the forward's type (into the f32 grads through GradInto),
// then x is let go before dx = dy · W is made: Linear's cache is spent first.
Tensor linear_backward(Tensor x, const Tensor& w_in, const Tensor& dy_in, Tensor& dw, Tensor& db, bool need_dx) {
    const AmpCast amp(CastPolicy::LowPrecision, x.dtype());
    x = amp.input(x);
    const Tensor w = amp.weight(w_in), dy = amp.input(dy_in);
    GradInto gw(dw, amp), gb(db, amp);
    matmul_into(dy, true, x, false, gw.target(), 1.0f, 1.0f);   // dW += dyᵀ · x   [out, in]
    if (db.defined()) sum_rows_into(dy, gb.target(), 1.0f);     // db += Σ_n dy
    gw.add_to_grad();
    gb.add_to_grad();
    x = Tensor();
    return need_dx ? matmul(dy, w) : Tensor();                  // dx = dy · W  [N, out] · [out, in]
}

}  // namespace kiln
#endif  // KILN_DEFINE_OPS
