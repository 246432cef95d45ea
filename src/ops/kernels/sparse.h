// sparse.h — sparse × dense (chapter 10), declared once for both backends (core/backend.h):
// src/ops/cpu/sparse.cpp ↔ cuda/sparse.cu. The CSR format: ops/sparse.h.
#pragma once
#include <cstdint>

#include "core/backend.h"

namespace kiln {

// y [N, out] = x [N, in] · Wᵀ + b with W [out, in] in compressed sparse rows:
//   y[n, o] = Σ_{k = row_start[o]}^{row_start[o+1] − 1} values[k] · x[n, col_index[k]]  (+ bias[o])
// the terms added in k's order, then the bias; bias may be null. f32 only. y is overwritten.
KILN_KERNEL(csr_linear, void csr_linear(const float* x, const float* values, const int32_t* col_index,
                                        const int32_t* row_start, const float* bias, float* y, int64_t N, int64_t in,
                                        int64_t out));

}  // namespace kiln
