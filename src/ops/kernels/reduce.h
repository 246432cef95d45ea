// reduce.h — the kernels that sum or compare along rows or over a whole tensor, declared once
// for both backends (core/backend.h): src/ops/cpu/reduce.cpp ↔ cuda/reduce.cu.
//
// Deterministic on both: fixed-size chunks summed in a fixed order, so every run and every thread
// count gives the same bits. T is float, f16 or bf16, summed in float (the reductions in double).
// Letters: N = rows, C = columns, n = element count.
#pragma once
#include <cstdint>

#include "core/backend.h"

namespace kiln {

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

}  // namespace kiln
