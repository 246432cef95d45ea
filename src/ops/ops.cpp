// ops.cpp — argument checks and the CPU/CUDA dispatch for every operation in ops.h.
#include "ops/ops.h"

#include <algorithm>
#include <cmath>

#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/gemm.h"
#include "ops/cuda_ops.h"

namespace kiln {

// Every op reads f32 tensors on one device; this checks both and returns the device.
static Device f32_on_one_device(const char* op, std::initializer_list<const Tensor*> ts) {
    const Tensor* first = *ts.begin();
    for (const Tensor* t : ts) {
        check_dtype(*t, DType::F32, op, "input");
        check_same_device(*first, *t, op);
    }
    return first->device();
}

static void check_same_shape(const Tensor& a, const Tensor& b, const char* op) {
    KILN_CHECK(a.shape() == b.shape(), op, ": shapes differ: ", a.desc(), " and ", b.desc());
}

static bool on_cuda(Device d) { return d == Device::CUDA; }

// ---- elementwise -------------------------------------------------------------------------
void fill_(Tensor& x, float value) {
    Device d = f32_on_one_device("fill_", {&x});
    if (on_cuda(d)) cuda::fill(x.data<float>(), x.numel(), value);
    else cpu::fill(x.data<float>(), x.numel(), value);
}

Tensor add(const Tensor& a, const Tensor& b) {
    Device d = f32_on_one_device("add", {&a, &b});
    check_same_shape(a, b, "add");
    Tensor y = Tensor::empty(a.shape(), DType::F32, d, Category::Activation);
    if (on_cuda(d)) cuda::add(a.data<float>(), b.data<float>(), y.data<float>(), a.numel());
    else cpu::add(a.data<float>(), b.data<float>(), y.data<float>(), a.numel());
    return y;
}

void axpy_(Tensor& y, float alpha, const Tensor& x) {
    Device d = f32_on_one_device("axpy_", {&y, &x});
    check_same_shape(y, x, "axpy_");
    if (on_cuda(d)) cuda::axpy(alpha, x.data<float>(), y.data<float>(), x.numel());
    else cpu::axpy(alpha, x.data<float>(), y.data<float>(), x.numel());
}

void scale_(Tensor& x, float s) {
    Device d = f32_on_one_device("scale_", {&x});
    if (on_cuda(d)) cuda::scale(x.data<float>(), x.numel(), s);
    else cpu::scale(x.data<float>(), x.numel(), s);
}

Tensor relu(const Tensor& x) {
    Device d = f32_on_one_device("relu", {&x});
    Tensor y = Tensor::empty(x.shape(), DType::F32, d, Category::Activation);
    if (on_cuda(d)) cuda::relu_forward(x.data<float>(), y.data<float>(), x.numel());
    else cpu::relu_forward(x.data<float>(), y.data<float>(), x.numel());
    return y;
}

Tensor relu_backward(const Tensor& y, const Tensor& dy) {
    Device d = f32_on_one_device("relu_backward", {&y, &dy});
    check_same_shape(y, dy, "relu_backward");
    Tensor dx = Tensor::empty(y.shape(), DType::F32, d, Category::Activation);
    if (on_cuda(d)) cuda::relu_backward(y.data<float>(), dy.data<float>(), dx.data<float>(), y.numel());
    else cpu::relu_backward(y.data<float>(), dy.data<float>(), dx.data<float>(), y.numel());
    return dx;
}

// ---- matrices ------------------------------------------------------------------------------
void matmul_into(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, float alpha, float beta) {
    Device d = f32_on_one_device("matmul", {&a, &b, &c});
    KILN_CHECK(a.ndim() == 2 && b.ndim() == 2 && c.ndim() == 2, "matmul: needs 2-D tensors, got ", a.desc(), ", ",
               b.desc(), ", ", c.desc());
    // op(a) is M×K, op(b) is K×N, c is M×N
    int64_t M = trans_a ? a.size(1) : a.size(0), K = trans_a ? a.size(0) : a.size(1);
    int64_t Kb = trans_b ? b.size(1) : b.size(0), N = trans_b ? b.size(0) : b.size(1);
    KILN_CHECK(K == Kb, "matmul: inner sizes differ: op(a) is ", M, "×", K, " (", a.desc(), trans_a ? ", transposed" : "",
               ") and op(b) is ", Kb, "×", N, " (", b.desc(), trans_b ? ", transposed" : "", ")");
    KILN_CHECK(c.size(0) == M && c.size(1) == N, "matmul: output should be [", M, ", ", N, "] but is ", c.desc());
    if (on_cuda(d))
        cuda::gemm(trans_a, trans_b, M, N, K, alpha, a.data<float>(), a.size(1), b.data<float>(), b.size(1), beta,
                   c.data<float>(), N);
    else
        cpu::gemm(trans_a, trans_b, M, N, K, alpha, a.data<float>(), a.size(1), b.data<float>(), b.size(1), beta,
                  c.data<float>(), N);
}

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
    check_defined(a, "matmul", "a");
    check_defined(b, "matmul", "b");
    KILN_CHECK(a.ndim() == 2 && b.ndim() == 2, "matmul: needs 2-D tensors, got ", a.desc(), " and ", b.desc());
    int64_t M = trans_a ? a.size(1) : a.size(0), N = trans_b ? b.size(0) : b.size(1);
    Tensor c = Tensor::empty({M, N}, DType::F32, a.device(), Category::Activation);
    matmul_into(a, trans_a, b, trans_b, c);
    return c;
}

void add_bias_(Tensor& y, const Tensor& bias) {
    Device d = f32_on_one_device("add_bias_", {&y, &bias});
    KILN_CHECK(y.ndim() == 2 && bias.ndim() == 1 && bias.size(0) == y.size(1), "add_bias_: y should be [N, C] and bias [C], got ",
               y.desc(), " and ", bias.desc());
    if (on_cuda(d)) cuda::add_bias(y.data<float>(), bias.data<float>(), y.size(0), y.size(1));
    else cpu::add_bias(y.data<float>(), bias.data<float>(), y.size(0), y.size(1));
}

void sum_rows_into(const Tensor& dy, Tensor& db, float beta) {
    Device d = f32_on_one_device("sum_rows_into", {&dy, &db});
    KILN_CHECK(dy.ndim() == 2 && db.ndim() == 1 && db.size(0) == dy.size(1),
               "sum_rows_into: dy should be [N, C] and db [C], got ", dy.desc(), " and ", db.desc());
    if (on_cuda(d)) cuda::sum_rows(dy.data<float>(), db.data<float>(), dy.size(0), dy.size(1), beta);
    else cpu::sum_rows(dy.data<float>(), db.data<float>(), dy.size(0), dy.size(1), beta);
}

Tensor argmax_rows(const Tensor& x) {
    Device d = f32_on_one_device("argmax_rows", {&x});
    KILN_CHECK(x.ndim() == 2 && x.size(1) > 0, "argmax_rows: needs [N, C] with C > 0, got ", x.desc());
    Tensor out = Tensor::empty({x.size(0)}, DType::I32, d, Category::Activation);
    if (on_cuda(d)) cuda::argmax_rows(x.data<float>(), out.data<int32_t>(), x.size(0), x.size(1));
    else cpu::argmax_rows(x.data<float>(), out.data<int32_t>(), x.size(0), x.size(1));
    return out;
}

// ---- reductions ------------------------------------------------------------------------------
double sum(const Tensor& x) {
    Device d = f32_on_one_device("sum", {&x});
    return on_cuda(d) ? cuda::sum(x.data<float>(), x.numel()) : cpu::sum(x.data<float>(), x.numel());
}

double sum_squares(const Tensor& x) {
    Device d = f32_on_one_device("sum_squares", {&x});
    return on_cuda(d) ? cuda::sum_squares(x.data<float>(), x.numel()) : cpu::sum_squares(x.data<float>(), x.numel());
}

double mean(const Tensor& x) {
    KILN_CHECK(x.numel() > 0, "mean of an empty tensor ", x.desc());
    return sum(x) / double(x.numel());
}

float max(const Tensor& x) {
    Device d = f32_on_one_device("max", {&x});
    KILN_CHECK(x.numel() > 0, "max of an empty tensor ", x.desc());
    return on_cuda(d) ? cuda::max(x.data<float>(), x.numel()) : cpu::max(x.data<float>(), x.numel());
}

// ---- loss ------------------------------------------------------------------------------------
float softmax_cross_entropy(const Tensor& logits, const Tensor& labels, Tensor* dlogits) {
    Device d = f32_on_one_device("softmax_cross_entropy", {&logits});
    check_dtype(labels, DType::I32, "softmax_cross_entropy", "labels");
    check_same_device(logits, labels, "softmax_cross_entropy");
    KILN_CHECK(logits.ndim() == 2 && labels.ndim() == 1 && labels.size(0) == logits.size(0) && logits.size(0) > 0,
               "softmax_cross_entropy: logits should be [N, C] and labels [N], got ", logits.desc(), " and ",
               labels.desc());
    int64_t N = logits.size(0), C = logits.size(1);
    // Labels out of range would read outside a row: check them (on the CPU copy).
    Tensor host_labels = labels.to(Device::CPU);
    const int32_t* y = host_labels.data<int32_t>();
    for (int64_t n = 0; n < N; n++)
        KILN_CHECK(y[n] >= 0 && y[n] < C, "softmax_cross_entropy: label ", y[n], " at row ", n,
                   " is outside [0, ", C, ") classes");
    if (dlogits) {
        if (!dlogits->defined() || dlogits->shape() != logits.shape() || dlogits->device() != d)
            *dlogits = Tensor::empty(logits.shape(), DType::F32, d, Category::Activation);
    }
    float* dz = dlogits ? dlogits->data<float>() : nullptr;
    if (on_cuda(d)) return cuda::softmax_cross_entropy(logits.data<float>(), labels.data<int32_t>(), dz, N, C);
    return cpu::softmax_cross_entropy(logits.data<float>(), y, dz, N, C);
}

}  // namespace kiln
