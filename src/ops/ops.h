// ops.h — kiln's operations on tensors. Each checks its arguments (shapes, dtypes, devices:
// the error names the op and the tensor) and runs the CPU kernel (ops/cpu/) or the CUDA
// kernel (cuda/) according to the tensors' device, instantiated for their dtype. New tensors
// come from the current allocator with the category given (activation by default).
//
// Element types: every op here takes f32, f16 or bf16 tensors (all of an op's float tensors of
// one dtype; outputs get it too). They compute and sum in f32 (the reductions in double) and
// round each result once. Scalars (value, alpha, beta) are float.
#pragma once
#include "core/tensor.h"
#include "ops/elementwise.h"  // fill_, add, relu, ...: the elementwise family
#include "ops/reduce.h"       // add_bias_, sum, argmax_rows, ...: the reduce family

namespace kiln {

// ---- matrices (the reduce family's add_bias_ and sum_rows_into: ops/reduce.h) ----------------
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
