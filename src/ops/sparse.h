// sparse.h — the sparse family (chapter 10): a weight matrix in compressed sparse rows (CSR), and
// the product of a dense batch with it: what makes an unstructured-pruned Linear smaller and, past
// some sparsity, faster. The kernel's contract, declared once for both backends (core/backend.h;
// src/ops/cpu/sparse.cpp ↔ cuda/sparse.cu), then the format and the ops on tensors: each checks
// its arguments once (the error names the op and the tensor) and runs the kernel of x's device.
// They are f32 only and name no autocast class (ops/autocast.h). The layer is nn/sparse_linear.h.
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

#include "core/backend.h"
#include "core/tensor.h"

namespace kiln {

// ==== the kernel ==============================================================================
// y [N, out] = x [N, in] · Wᵀ + b with W [out, in] in compressed sparse rows:
//   y[n, o] = Σ_{k = row_start[o]}^{row_start[o+1] − 1} values[k] · x[n, col_index[k]]  (+ bias[o])
// the terms added in k's order, then the bias; bias may be null. f32 only. y is overwritten.
KILN_KERNEL(csr_linear, void csr_linear(const float* x, const float* values, const int32_t* col_index,
                                        const int32_t* row_start, const float* bias, float* y, int64_t N, int64_t in,
                                        int64_t out));

// ==== the format and the ops on tensors =======================================================
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

// ==== the definitions ===========================================================================
// The CSR format's conversions (on the CPU, then copied to the matrix's device) and csr_linear's
// checks and dispatch.
#ifdef KILN_DEFINE_OPS  // compiled once, in src/ops/ops.cpp (see there)
#include <limits>
#include <vector>

#include "ops/check.h"  // Arg

namespace kiln {

int64_t CsrMatrix::bytes() const {
    return int64_t(values.nbytes() + col_index.nbytes() + row_start.nbytes());
}

CsrMatrix CsrMatrix::to(Device device) const {
    return CsrMatrix{rows, cols, nnz, values.to(device), col_index.to(device), row_start.to(device)};
}

CsrMatrix to_csr(const Tensor& dense) {
    check_dtype(dense, DType::F32, "to_csr", "dense");
    KILN_CHECK(dense.ndim() == 2, "to_csr: 'dense' should be a matrix [rows, cols] (a Linear's weight) but is ",
               dense.desc());
    const Tensor w = dense.to(Device::CPU);
    const int64_t rows = w.size(0), cols = w.size(1);
    const float* a = w.data<float>();
    std::vector<float> values;
    std::vector<int32_t> col_index, row_start{0};
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t c = 0; c < cols; c++) {
            if (a[r * cols + c] == 0.0f) continue;
            values.push_back(a[r * cols + c]);
            col_index.push_back(int32_t(c));
        }
        KILN_CHECK(values.size() <= size_t(std::numeric_limits<int32_t>::max()), "to_csr: ", dense.desc(),
                   " has more than 2^31 − 1 nonzeros, past what the i32 row_start can index; split the matrix");
        row_start.push_back(int32_t(values.size()));
    }
    const int64_t nnz = int64_t(values.size());
    CsrMatrix m{rows, cols, nnz, Tensor::empty({nnz}, DType::F32, Device::CPU, Category::Parameter),
                Tensor::empty({nnz}, DType::I32, Device::CPU, Category::Parameter),
                Tensor::empty({rows + 1}, DType::I32, Device::CPU, Category::Parameter)};
    std::copy(values.begin(), values.end(), m.values.data<float>());
    std::copy(col_index.begin(), col_index.end(), m.col_index.data<int32_t>());
    std::copy(row_start.begin(), row_start.end(), m.row_start.data<int32_t>());
    return m.to(dense.device());
}

namespace detail {

// The three arrays are what the CsrMatrix says they are (dtypes, lengths) and all on `device`,
// the device of `where` ("x", or "w.values" itself); `op` names the caller in the message.
void check_csr(const CsrMatrix& w, Device device, const char* where, const char* op) {
    check_dtype(w.values, DType::F32, op, "w.values");
    check_dtype(w.col_index, DType::I32, op, "w.col_index");
    check_dtype(w.row_start, DType::I32, op, "w.row_start");
    check_shape(w.values, Shape{w.nnz}, op, "w.values");
    check_shape(w.col_index, Shape{w.nnz}, op, "w.col_index");
    check_shape(w.row_start, Shape{w.rows + 1}, op, "w.row_start");
    for (const Arg& a : {Arg{w.values, "w.values"}, Arg{w.col_index, "w.col_index"}, Arg{w.row_start, "w.row_start"}})
        KILN_CHECK(a.t.device() == device, op, ": '", a.name, "' is on ", device_name(a.t.device()), " but '", where,
                   "' is on ", device_name(device), "; move the weight with w.to(Device::...) (a SparseLinear with ",
                   "model.to(device))");
}

}  // namespace detail

Tensor to_dense(const CsrMatrix& w) {
    detail::check_csr(w, w.device(), "w.values", "to_dense");
    const CsrMatrix h = w.to(Device::CPU);
    Tensor dense = Tensor::zeros({w.rows, w.cols});
    const float* v = h.values.data<float>();
    const int32_t* col = h.col_index.data<int32_t>();
    const int32_t* start = h.row_start.data<int32_t>();
    float* a = dense.data<float>();
    for (int64_t r = 0; r < w.rows; r++)
        for (int32_t k = start[r]; k < start[r + 1]; k++) a[r * w.cols + col[k]] = v[k];
    return dense.to(w.device());
}

Tensor csr_linear(const Tensor& x, const CsrMatrix& w, const Tensor& bias) {
    const char* op = "csr_linear";
    check_dtype(x, DType::F32, op, "x");
    KILN_CHECK(x.ndim() == 2 && x.size(1) == w.cols, op, ": 'x' should be [N, ", w.cols, "] for a CSR weight [",
               w.rows, ", ", w.cols, "] but is ", x.desc(), " (a Flatten before it turns [N, C, H, W] into [N, C·H·W])");
    const Device d = x.device();
    detail::check_csr(w, d, "x", op);
    if (bias.defined()) {
        check_dtype(bias, DType::F32, op, "bias");
        check_shape(bias, Shape{w.rows}, op, "bias");
        check_same_device(bias, x, op);
    }
    const int64_t N = x.size(0);
    Tensor y = Tensor::empty({N, w.rows}, DType::F32, d, Category::Activation);
    const float* b = bias.defined() ? bias.data<float>() : nullptr;
    on_backend(d, [&](auto be) {
        kernel::csr_linear(be, x.data<float>(), w.values.data<float>(), w.col_index.data<int32_t>(),
                           w.row_start.data<int32_t>(), b, y.data<float>(), N, w.cols, w.rows);
    });
    return y;
}

}  // namespace kiln
#endif  // KILN_DEFINE_OPS
