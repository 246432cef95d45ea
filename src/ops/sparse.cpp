// sparse.cpp — the CSR format's conversions (on the CPU, then copied to the matrix's device)
// and csr_linear's checks and dispatch to the kernel of x's device (ops/kernels/sparse.h). The
// arithmetic of the format is in sparse.h.
#include "ops/sparse.h"

#include <limits>
#include <vector>

#include "ops/check.h"  // Arg
#include "ops/kernels/sparse.h"

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

namespace {

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

}  // namespace

Tensor to_dense(const CsrMatrix& w) {
    check_csr(w, w.device(), "w.values", "to_dense");
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
    check_csr(w, d, "x", op);
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
