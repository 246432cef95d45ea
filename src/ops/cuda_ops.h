// cuda_ops.h — the CUDA kernels' launchers, the twins of ops/cpu/cpu_ops.h and gemm.h: same
// names, same arguments, but every pointer is device memory. Implemented in cuda/*.cu, which
// nvcc compiles for a GPU (make CUDA=1) or g++ runs on the kernel emulator (the default).
#pragma once
#include <cstdint>

#include "ops/cpu/cnn_ops.h"  // Conv2dParams, Pool2dParams, BatchNormParams: shared with the CPU
#include "ops/optim.h"        // AdamParams: shared with the CPU

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
double sum_squares(const float* x, int64_t n);
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
// PyTorch's Adam / AdamW (cpu_ops.h has the rule): one thread per element, as on the CPU.
void adam_update(float* p, const float* grad, float* m, float* v, float* v_max, int64_t n, const AdamParams& a);

// ---- convolution (chapter 05) ------------------------------------------------------------
// The twins of cpu::conv2d_* (ops/cpu/cnn_ops.h): the same Conv2dParams, the same workspace
// contract (col holds col_images ≥ 1 images of cuda::conv2d_col_floats_per_image(p) floats;
// the batch is done that many images at a time) and the same results: dx is overwritten,
// dw and db accumulate, b and db may be null. cuda/conv.cu explains each kernel.
enum class ConvAlgo {
    Im2col,        // im2col kernel + cuda::gemm, several images per GEMM; needs the workspace
    ImplicitGemm,  // one kernel gathers x's columns into shared memory as it goes; no workspace
};
ConvAlgo conv2d_algo(const cpu::Conv2dParams& p);  // the forward strategy for a shape
const char* conv_algo_name(ConvAlgo a);
// (C·KH·KW + O)·P·Q: one image's columns and its rows of y (or dy). Every shape needs it, since
// the backward passes always unfold; only the implicit-GEMM forward leaves it unused.
int64_t conv2d_col_floats_per_image(const cpu::Conv2dParams& p);

// The forward by conv2d_algo(p), and each strategy by name (one signature, so the kernel lab
// can time them side by side; the implicit GEMM ignores col and col_images).
void conv2d_forward(const float* x, const float* w, const float* b, float* y, const cpu::Conv2dParams& p,
                    float* col, int64_t col_images);
void conv2d_forward_im2col(const float* x, const float* w, const float* b, float* y, const cpu::Conv2dParams& p,
                           float* col, int64_t col_images);
void conv2d_forward_implicit_gemm(const float* x, const float* w, const float* b, float* y,
                                  const cpu::Conv2dParams& p, float* col, int64_t col_images);
void conv2d_backward_data(const float* dy, const float* w, float* dx, const cpu::Conv2dParams& p, float* col,
                          int64_t col_images);
void conv2d_backward_weight(const float* x, const float* dy, float* dw, float* db, const cpu::Conv2dParams& p,
                            float* col, int64_t col_images);

// ---- pooling, batch norm, GELU, dropout (chapters 05–06) ----------------------------------
// The twins of the cpu:: functions of the same names (ops/cpu/cnn_ops.h has the formulas):
// same arguments, same overwrite/accumulate rules. cuda/pool.cu and cuda/norm.cu explain the
// kernels; none uses atomics, so every result is the same on every run.
void maxpool2d_forward(const float* x, float* y, int32_t* argmax, const cpu::Pool2dParams& p);
void maxpool2d_backward(const float* dy, const int32_t* argmax, float* dx, const cpu::Pool2dParams& p);
void avgpool2d_forward(const float* x, float* y, const cpu::Pool2dParams& p);
void avgpool2d_backward(const float* dy, float* dx, const cpu::Pool2dParams& p);
void global_avgpool_forward(const float* x, float* y, int64_t NC, int64_t S);
void global_avgpool_backward(const float* dy, float* dx, int64_t NC, int64_t S);

void batchnorm_forward_train(const float* x, const float* gamma, const float* beta, float* y, float* running_mean,
                             float* running_var, float* save_mean, float* save_invstd, const cpu::BatchNormParams& p);
void batchnorm_forward_eval(const float* x, const float* gamma, const float* beta, const float* running_mean,
                            const float* running_var, float* y, const cpu::BatchNormParams& p);
void batchnorm_backward(const float* dy, const float* x, const float* gamma, const float* save_mean,
                        const float* save_invstd, float* dx, float* dgamma, float* dbeta,
                        const cpu::BatchNormParams& p);

void gelu_forward(const float* x, float* y, int64_t n);
void gelu_backward(const float* x, const float* dy, float* dx, int64_t n);
void dropout_forward(const float* x, float* y, uint8_t* mask, int64_t n, float drop_p, uint64_t seed_hash,
                     uint64_t first);
void dropout_backward(const float* dy, const uint8_t* mask, float* dx, int64_t n, float drop_p);

}  // namespace kiln::cuda
