// sparse.h — a weight matrix in compressed sparse rows (CSR), and the product of a dense batch
// with it: what makes an unstructured-pruned Linear smaller and, past some sparsity, faster
// (chapter 10).
//
// After magnitude pruning most of a Linear's weight W [out, in] is exactly zero, but a dense
// tensor still stores and multiplies every zero. CSR keeps only the nonzeros, row by row:
//
//   W = [ 0  2  0  0 ]      values    = [2, 1, 3, 4]          the nonzeros, row after row
//       [ 0  0  0  0 ]      col_index = [1, 0, 2, 3]          the column of each
//       [ 1  0  3  4 ]      row_start = [0, 1, 1, 4]          row r is values[row_start[r] .. row_start[r+1])
//
// Storage (f32 values, i32 indices), with nnz nonzeros and s = 1 − nnz/(out·in) the sparsity:
//   dense   4·out·in bytes
//   CSR     4·nnz (values) + 4·nnz (col_index) + 4·(out + 1) (row_start) bytes
// Each nonzero costs 8 bytes instead of 4, so CSR is smaller only when nnz < out·in/2 (less
// the row_start term): past 50% sparsity. At 90% it is 0.2 of the dense size (plus row_start).
// With 16-bit column indices (possible while in < 65536) a nonzero costs 6 bytes, and CSR wins
// past 33%; kiln implements the i32 indices only, which serve every size.
//
// The product y = x · Wᵀ + b (csr_linear) does 2·N·nnz flops against the dense GEMM's
// 2·N·out·in, but each of them costs more: the GEMM multiplies every value it loads into a
// register by many others (a tile of 6 rows of x by 16 of W), while CSR loads a value, its
// column index and a run of x for each nonzero, whose next address it cannot know before
// reading the index. So CSR loses at moderate sparsity and wins past a crossover, which
// bench/bench_sparse.cpp measures: 70% on this course's 2-core CPU for the MNIST MLP's layers
// and a 1024→1024 one at batch 64 and 256 (50–80% from run to run on a busy machine), about
// 3× faster than dense at 90% (lessons/10-pruning/figures/csr-speed.svg).
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace kiln {

// Made by to_csr. csr_linear and to_dense check the arrays' dtypes, lengths and device, and
// trust their contents as to_csr writes them (row_start ascending from 0 to nnz, every column
// index in [0, cols)).
struct CsrMatrix {
    int64_t rows = 0, cols = 0, nnz = 0;
    Tensor values;     // f32 [nnz]: the nonzeros in row-major order
    Tensor col_index;  // i32 [nnz]: the column of each value, ascending within a row
    Tensor row_start;  // i32 [rows + 1]: row r's values are [row_start[r], row_start[r+1])
    int64_t bytes() const;  // what the three arrays take: 8·nnz + 4·(rows + 1)
    Device device() const { return values.device(); }
    CsrMatrix to(Device device) const;  // the three arrays copied to `device`
};

// The CSR form of a 2-D f32 matrix: every entry that is exactly 0 (or −0) is left out, every
// other one (NaN included) kept. On dense's device (built on the CPU, then copied).
CsrMatrix to_csr(const Tensor& dense);

// The dense [rows, cols] f32 matrix back, zeros filled in, on w's device.
Tensor to_dense(const CsrMatrix& w);

// y [N, rows] = x [N, cols] · Wᵀ + b: what a Linear with weight W computes, with W in CSR.
//   y[n, o] = Σ_{k in row o} values[k] · x[n, col_index[k]]  (+ b[o])
// x f32 [N, cols]; bias f32 [rows] or undefined (no bias); all on one device (CPU or CUDA).
Tensor csr_linear(const Tensor& x, const CsrMatrix& w, const Tensor& bias = Tensor());

}  // namespace kiln
