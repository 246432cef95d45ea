// ops.cpp — where the ops of every family header (src/ops/<family>.h) are compiled, once: each
// header defines its ops under KILN_DEFINE_OPS, which only this file defines (the stb-style
// "implementation macro"), so the files that call an op compile a declaration only.
#define KILN_DEFINE_OPS
#include "ops/elementwise.h"
#include "ops/loss.h"
#include "ops/norm.h"
#include "ops/pool.h"
#include "ops/reduce.h"

// Then the ops of ops.h, whose families are not yet in headers of their own: an op in a class of
// autocast's table (ops/autocast.h) first casts its inputs to the type its class gives, then each
// op checks its tensors once (check_args) and calls its kernel through dispatch
// (core/backend.h), which picks the backend by the tensors' device and the kernel's
// instantiation by their dtype (float, f16 or bf16).
#include "ops/ops.h"

#include <initializer_list>

#include "ops/autocast.h"
#include "ops/check.h"
#include "ops/kernels/gemm.h"

namespace kiln {

// ---- matrices ------------------------------------------------------------------------------
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
