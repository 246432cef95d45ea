// reduce.h — the ops that sum or compare along the rows of a matrix or over a whole tensor
// (chapters 01 and 02: a Linear layer's bias and its gradient, the predicted class, the loss's
// correct count; gradient clipping's norm, chapter 07). The kernels' contract, declared once for
// both backends (core/backend.h; src/ops/cpu/reduce.cpp ↔ cuda/reduce.cu), then the ops on
// tensors that check their arguments and dispatch to those kernels: declared here, defined at the
// end of this file and compiled once, in src/ops/ops.cpp (KILN_DEFINE_OPS).
//
// Deterministic on both: fixed-size chunks summed in a fixed order, so every run and every thread
// count gives the same bits. T is float, f16 or bf16, summed in float (the reductions in double).
// Letters: N = rows, C = columns, n = element count.
//
// Autocast (ops/autocast.h): none of these ops casts; they take the tensors as they are (all of
// an op's float tensors of one dtype).
#pragma once
#include <cstdint>

#include "core/backend.h"
#include "core/tensor.h"
#include "ops/check.h"

namespace kiln {

// ==== the kernels ============================================================================
// ---- rows of an N×C matrix ----------------------------------------------------------------------
// y[n,c] += b[c]
KILN_KERNEL(add_bias, template <typename T> void add_bias(T* y, const T* b, int64_t N, int64_t C));
// db[c] = Σ_n dy[n,c] + beta·db[c], summed in float
KILN_KERNEL(sum_rows, template <typename T> void sum_rows(const T* dy, T* db, int64_t N, int64_t C, float beta));
// out[n] = the first c with x[n,c] = max_c x[n,c]
KILN_KERNEL(argmax_rows, template <typename T> void argmax_rows(const T* x, int32_t* out, int64_t N, int64_t C));

// ---- a whole tensor -------------------------------------------------------------------------------
// Σ x, in double
KILN_KERNEL(sum, template <typename T> double sum(const T* x, int64_t n));
// Σ x², each square exact in double
KILN_KERNEL(sum_squares, template <typename T> double sum_squares(const T* x, int64_t n));
KILN_KERNEL(max, template <typename T> float max(const T* x, int64_t n));

// *total (device memory) = Σ x[i] in double, as sum adds them, without reading it back; n ≥ 1
// (the loss's row losses: cuda/loss.cu).
KILN_CUDA_KERNEL(void sum_on_device(const float* x, int64_t n, double* total));

// The templates above that both backends define, for the kernel files' explicit instantiations
// (the float types): KILN_REDUCE_KERNELS(KILN_INSTANTIATE_FLOAT);
#define KILN_REDUCE_KERNELS(X)                                               \
    X(add_bias); X(sum_rows); X(argmax_rows); X(sum); X(sum_squares); X(max)

// ==== the ops on tensors =====================================================================
// ---- rows of an N×C matrix ------------------------------------------------------------------
void add_bias_(Tensor& y, const Tensor& bias);                        // y[N,C] += bias[C] on each row
void sum_rows_into(const Tensor& dy, Tensor& db, float beta = 0.0f);  // db[C] = Σ_n dy[n,:] + beta·db
Tensor argmax_rows(const Tensor& x);                                  // x[N,C] -> i32[N]
int64_t count_equal(const Tensor& a, const Tensor& b);  // i32[N], i32[N]: #{n : a[n] = b[n]}, on the CPU

// ---- a whole tensor (deterministic on any thread count) -------------------------------------
double sum(const Tensor& x);
double sum_squares(const Tensor& x);  // Σ x² (gradient clipping's norm)
double mean(const Tensor& x);
float max(const Tensor& x);

}  // namespace kiln


#ifdef KILN_DEFINE_OPS  // compiled once, in src/ops/ops.cpp (see there)
namespace kiln {

void add_bias_(Tensor& y, const Tensor& bias) {
    check_args("add_bias_", {{y, "y"}, {bias, "bias"}});
    KILN_CHECK(y.ndim() == 2 && bias.ndim() == 1 && bias.size(0) == y.size(1),
               "add_bias_: y should be [N, C] and bias [C], got ", y.desc(), " and ", bias.desc());
    dispatch(y.device(), y.dtype(), [&](auto be, auto tag) {
        using T = decltype(tag);
        kernel::add_bias(be, y.data<T>(), bias.data<T>(), y.size(0), y.size(1));
    });
}

void sum_rows_into(const Tensor& dy, Tensor& db, float beta) {
    check_args("sum_rows_into", {{dy, "dy"}, {db, "db"}});
    KILN_CHECK(dy.ndim() == 2 && db.ndim() == 1 && db.size(0) == dy.size(1),
               "sum_rows_into: dy should be [N, C] and db [C], got ", dy.desc(), " and ", db.desc());
    dispatch(dy.device(), dy.dtype(), [&](auto be, auto tag) {
        using T = decltype(tag);
        kernel::sum_rows(be, dy.data<T>(), db.data<T>(), dy.size(0), dy.size(1), beta);
    });
}

Tensor argmax_rows(const Tensor& x) {
    check_args("argmax_rows", {{x, "x"}});
    KILN_CHECK(x.ndim() == 2 && x.size(1) > 0, "argmax_rows: needs [N, C] with C > 0, got ", x.desc());
    Tensor out = Tensor::empty({x.size(0)}, DType::I32, x.device(), Category::Activation);
    dispatch(x.device(), x.dtype(), [&](auto be, auto tag) {
        using T = decltype(tag);
        kernel::argmax_rows(be, x.data<T>(), out.data<int32_t>(), x.size(0), x.size(1));
    });
    return out;
}

int64_t count_equal(const Tensor& a, const Tensor& b) {
    check_dtype(a, DType::I32, "count_equal", "a");
    check_dtype(b, DType::I32, "count_equal", "b");
    check_shape(b, a.shape(), "count_equal", "b");
    const Tensor ha = a.to(Device::CPU), hb = b.to(Device::CPU);
    const int32_t *pa = ha.data<int32_t>(), *pb = hb.data<int32_t>();
    int64_t equal = 0;
    for (int64_t i = 0; i < ha.numel(); i++) equal += pa[i] == pb[i];
    return equal;
}

double sum(const Tensor& x) {
    check_args("sum", {{x, "x"}});
    return dispatch(x.device(), x.dtype(), [&](auto be, auto tag) {
        using T = decltype(tag);
        return kernel::sum(be, x.data<T>(), x.numel());
    });
}

double sum_squares(const Tensor& x) {
    check_args("sum_squares", {{x, "x"}});
    return dispatch(x.device(), x.dtype(), [&](auto be, auto tag) {
        using T = decltype(tag);
        return kernel::sum_squares(be, x.data<T>(), x.numel());
    });
}

double mean(const Tensor& x) {
    KILN_CHECK(x.numel() > 0, "mean of an empty tensor ", x.desc());
    return sum(x) / double(x.numel());
}

float max(const Tensor& x) {
    check_args("max", {{x, "x"}});
    KILN_CHECK(x.numel() > 0, "max of an empty tensor ", x.desc());
    return dispatch(x.device(), x.dtype(), [&](auto be, auto tag) {
        using T = decltype(tag);
        return kernel::max(be, x.data<T>(), x.numel());
    });
}

}  // namespace kiln
#endif  // KILN_DEFINE_OPS
