// cuda_ops.h — the CUDA kernels' launchers, the twins of ops/cpu/cpu_ops.h and gemm.h: same
// names, same arguments, but every pointer is device memory. Implemented in cuda/*.cu, which
// nvcc compiles for a GPU (make CUDA=1) or g++ runs on the kernel emulator (the default).
#pragma once
#include <cstdint>

namespace kiln::cuda {

// ---- elementwise -------------------------------------------------------------------------
void fill(float* x, int64_t n, float value);
void add(const float* a, const float* b, float* y, int64_t n);
void axpy(float alpha, const float* x, float* y, int64_t n);
void scale(float* x, int64_t n, float s);
void relu_forward(const float* x, float* y, int64_t n);
void relu_backward(const float* y, const float* dy, float* dx, int64_t n);

// ---- rows of an N×C matrix ---------------------------------------------------------------
void add_bias(float* y, const float* b, int64_t N, int64_t C);
void sum_rows(const float* dy, float* db, int64_t N, int64_t C, float beta);
void argmax_rows(const float* x, int32_t* out, int64_t N, int64_t C);

// ---- reductions --------------------------------------------------------------------------
double sum(const float* x, int64_t n);
float max(const float* x, int64_t n);

// ---- GEMM (row-major, like cpu::gemm) ----------------------------------------------------
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// ---- loss --------------------------------------------------------------------------------
float softmax_cross_entropy(const float* z, const int32_t* y, float* dz, int64_t N, int64_t C);

// ---- optimizer update (one fused pass over n parameters) -----------------------------------
// PyTorch's SGD:  g = grad + wd·p;  buf = first ? g : momentum·buf + (1 − dampening)·g;
//                 g = nesterov ? g + momentum·buf : buf   (when momentum ≠ 0);   p −= lr·g
void sgd_update(float* p, const float* grad, float* buf, int64_t n, float lr, float momentum, float dampening,
                float weight_decay, bool nesterov, bool first_step);

}  // namespace kiln::cuda
