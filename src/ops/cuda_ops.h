// cuda_ops.h — the CUDA kernels' launchers, the twins of ops/cpu/cpu_ops.h and gemm.h: same
// names, same arguments, same element types (T = float, f16 or bf16, computed in float), and
// the same file names (cuda/elementwise.cu ↔ cpu/elementwise.cpp, ...), but every pointer is
// device memory. Implemented in cuda/*.cu, which nvcc compiles for a GPU (make CUDA=1) or g++
// runs on the kernel emulator (the default).
#pragma once
#include <cstdint>

#include "core/dtype.h"
#include "ops/cpu/cnn_ops.h"  // the instantiation lists both twins use (KILN_CONV, KILN_POOL, KILN_NORM)
#include "ops/cpu/cpu_ops.h"  // the instantiation lists both twins use (KILN_ELEMENTWISE, ...)
#include "ops/optim.h"   // AdamParams: shared with the CPU
#include "ops/params.h"  // Conv2dParams, Pool2dParams, BatchNormParams, ConvAlgo
#include "ops/cpu/quant_ops.h"  // QOutput: shared with the CPU

namespace kiln::cuda {

// ---- elementwise (elementwise.cu) ----------------------------------------------------------
template <typename T> void fill(T* x, int64_t n, float value);
template <typename T> void add(const T* a, const T* b, T* y, int64_t n);
template <typename T> void mul(const T* a, const T* b, T* y, int64_t n);
template <typename T> void axpy(float alpha, const T* x, T* y, int64_t n);
template <typename T> void scale(T* x, int64_t n, float s);
template <typename T> void relu_forward(const T* x, T* y, int64_t n, float cap);
template <typename T> void relu_backward(const T* y, const T* dy, T* dx, int64_t n, float cap);
template <typename From, typename To> void convert(const From* x, To* y, int64_t n);

// ---- rows of an N×C matrix (reduce.cu) -------------------------------------------------------
template <typename T> void add_bias(T* y, const T* b, int64_t N, int64_t C);
template <typename T> void sum_rows(const T* dy, T* db, int64_t N, int64_t C, float beta);
template <typename T> void argmax_rows(const T* x, int32_t* out, int64_t N, int64_t C);

// ---- reductions (reduce.cu) ------------------------------------------------------------------
template <typename T> double sum(const T* x, int64_t n);
template <typename T> double sum_squares(const T* x, int64_t n);
template <typename T> float max(const T* x, int64_t n);
// *total (device memory) = Σ x[i] in double, as sum adds them, without reading it back; n ≥ 1.
void sum_on_device(const float* x, int64_t n, double* total);

// ---- GEMM (gemm.cu; row-major, like cpu::gemm) -------------------------------------------------
template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const T* A, int64_t lda,
          const T* B, int64_t ldb, float beta, T* C, int64_t ldc);

// Split-K (gemm.cu) for a small C and a long K — the convolution's weight gradient, M = Og,
// N = Kc, K = L, whose 64×64 tiles number 1 to 36 where a GPU has 132 SMs: K is cut into S
// slices summed by S times more blocks into float partials, which a second pass adds in order
// (deterministic, no atomics) into C = alpha·Σ + beta·C. S = gemm_split_k_slices: enough blocks
// for two per SM, slices of at least 256; S = 1, and f16/bf16 (their tensor-core path), is gemm.
template <typename T>
void gemm_split_k(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const T* A, int64_t lda,
                  const T* B, int64_t ldb, float beta, T* C, int64_t ldc);
int64_t gemm_split_k_slices(int64_t M, int64_t N, int64_t K);

// ---- loss (loss.cu) ------------------------------------------------------------------------------
// With the mean loss, in the same read-back: *correct (if not null) = the rows whose first
// maximum is their label (argmax_rows's answer), and the labels' check (a kiln::Error naming the
// first row with a label outside [0, C)). smoothing: label smoothing ε (ops.h).
template <typename T>
float softmax_cross_entropy(const T* z, const int32_t* y, T* dz, int64_t N, int64_t C, int64_t* correct = nullptr,
                            float smoothing = 0.0f);

// ---- optimizer update (one fused pass over n parameters) -----------------------------------
// PyTorch's SGD:  g = grad + wd·p;  buf = first ? g : momentum·buf + (1 − dampening)·g;
//                 g = nesterov ? g + momentum·buf : buf   (when momentum ≠ 0);   p −= lr·g
void sgd_update(float* p, const float* grad, float* buf, int64_t n, float lr, float momentum, float dampening,
                float weight_decay, bool nesterov, bool first_step);
// PyTorch's Adam / AdamW (cpu_ops.h has the rule): one thread per element, as on the CPU.
void adam_update(float* p, const float* grad, float* m, float* v, float* v_max, int64_t n, const AdamParams& a);
// GradScaler's unscale_, over `count` tensors (grads[t] of sizes[t] elements): g[i] *= inv_scale;
// returns whether any g[i] was inf or NaN (a flag in device memory that any thread of any of
// the launches may set, read back once at the end).
bool unscale_and_check(float* const* grads, const int64_t* sizes, int64_t count, float inv_scale);

// ---- convolution (chapter 05) ------------------------------------------------------------
// The twins of cpu::conv2d_* (ops/cpu/cnn_ops.h): the same Conv2dParams, the same workspace
// contract (col holds col_images ≥ 1 images of cuda::conv2d_col_elems_per_image(p) elements;
// the batch is done that many images at a time) and the same results: dx is overwritten,
// dw and db accumulate, b and db may be null. Templates on the element type T (float, f16 or
// bf16), like the CPU's; cuda/conv.cu explains each kernel.
ConvAlgo conv2d_algo(const Conv2dParams& p);  // the strategy: Depthwise, else ImplicitGemm or Im2col
// (C·KH·KW + O)·P·Q: one image's columns and its rows of y (or dy). Every shape but a depthwise
// one needs it, since the backward passes unfold; the implicit-GEMM forward leaves it unused.
int64_t conv2d_col_elems_per_image(const Conv2dParams& p);

// The forward by conv2d_algo(p), and each strategy by name (one signature, so the kernel lab
// can time them side by side; the implicit GEMM ignores col and col_images).
template <typename T>
void conv2d_forward(const T* x, const T* w, const T* b, T* y, const Conv2dParams& p, T* col, int64_t col_images);
template <typename T>
void conv2d_forward_im2col(const T* x, const T* w, const T* b, T* y, const Conv2dParams& p, T* col,
                           int64_t col_images);
template <typename T>
void conv2d_forward_implicit_gemm(const T* x, const T* w, const T* b, T* y, const Conv2dParams& p, T* col,
                                  int64_t col_images);
template <typename T>
void conv2d_backward_data(const T* dy, const T* w, T* dx, const Conv2dParams& p, T* col, int64_t col_images);
template <typename T>
void conv2d_backward_weight(const T* x, const T* dy, T* dw, T* db, const Conv2dParams& p, T* col, int64_t col_images);
// The backward passes as chapter 05 first wrote them (im2col, col2im and GEMMs, in chunks of
// col_images images of the workspace), kept for the kernel lab beside the engine's implicit GEMMs.
template <typename T>
void conv2d_backward_data_im2col(const T* dy, const T* w, T* dx, const Conv2dParams& p, T* col, int64_t col_images);
template <typename T>
void conv2d_backward_weight_im2col(const T* x, const T* dy, T* dw, T* db, const Conv2dParams& p, T* col,
                                   int64_t col_images);

// ---- pooling, batch norm, layer norm, GELU, dropout (chapters 05–06) ----------------------
// The twins of the cpu:: functions of the same names (ops/cpu/cnn_ops.h has the formulas):
// same arguments, same overwrite/accumulate rules. cuda/pool.cu and cuda/norm.cu explain the
// kernels; none uses atomics, so every result is the same on every run.
template <typename T>
void maxpool2d_forward(const T* x, T* y, int32_t* argmax, const Pool2dParams& p);
template <typename T>
void maxpool2d_backward(const T* dy, const int32_t* argmax, T* dx, const Pool2dParams& p);
template <typename T>
void avgpool2d_forward(const T* x, T* y, const Pool2dParams& p);
template <typename T>
void avgpool2d_backward(const T* dy, T* dx, const Pool2dParams& p);
template <typename T>
void global_avgpool_forward(const T* x, T* y, int64_t NC, int64_t S);
template <typename T>
void global_avgpool_backward(const T* dy, T* dx, int64_t NC, int64_t S);

template <typename T>
void batchnorm_forward_train(const T* x, const float* gamma, const float* beta, T* y, float* running_mean,
                             float* running_var, float* save_mean, float* save_invstd, const BatchNormParams& p);
template <typename T>
void batchnorm_forward_eval(const T* x, const float* gamma, const float* beta, const float* running_mean,
                            const float* running_var, T* y, const BatchNormParams& p);
template <typename T>
void batchnorm_backward(const T* dy, const T* x, const float* gamma, const float* save_mean,
                        const float* save_invstd, T* dx, float* dgamma, float* dbeta, const BatchNormParams& p);

template <typename T>
void layernorm_forward(const T* x, const float* gamma, const float* beta, T* y, float* save_mean, float* save_invstd,
                       int64_t R, int64_t D, float eps);
template <typename T>
void layernorm_backward(const T* dy, const T* x, const float* gamma, const float* save_mean, const float* save_invstd,
                        T* dx, float* dgamma, float* dbeta, int64_t R, int64_t D);

template <typename T>
void gelu_forward(const T* x, T* y, int64_t n);
template <typename T>
void gelu_backward(const T* x, const T* dy, T* dx, int64_t n);
template <typename T>
void dropout_forward(const T* x, T* y, uint8_t* mask, int64_t n, float drop_p, uint64_t seed_hash, uint64_t first);
template <typename T>
void dropout_backward(const T* dy, const uint8_t* mask, T* dx, int64_t n, float drop_p);


// ---- sparse × dense (sparse.cu; chapter 10) ------------------------------------------------------
// The twin of cpu::csr_linear (ops/cpu/cpu_ops.h has the formula): y [N, out] overwritten, the
// terms of each output added in the same order.
void csr_linear(const float* x, const float* values, const int32_t* col_index, const int32_t* row_start,
                const float* bias, float* y, int64_t N, int64_t in, int64_t out);

// ---- int8 inference and fake quantization (quant.cu; chapter 11) --------------------------------
// The twins of ops/cpu/quant_ops.h (which has the formulas): the same integers, bit for bit.
// QOutput's pointers, scale and zero_point arrays are device memory.
template <typename Q>
void quantize(const float* x, Q* q, int64_t n, float scale, int32_t zero_point, int32_t qmin, int32_t qmax);
template <typename Q>
void dequantize(const Q* q, float* x, int64_t n, float scale, int32_t zero_point);
template <typename Q>
void quantize_per_channel(const float* x, Q* q, int64_t outer, int64_t C, int64_t inner, const float* scale,
                          const int32_t* zero_point, int32_t qmin, int32_t qmax);
template <typename Q>
void dequantize_per_channel(const Q* q, float* x, int64_t outer, int64_t C, int64_t inner, const float* scale,
                            const int32_t* zero_point);
void qgemm_u8s8(int64_t M, int64_t N, int64_t K, const uint8_t* A, int64_t lda, const int8_t* B, int64_t ldb,
                int32_t* C, int64_t ldc, int32_t a_max);
void requantize_rows(const int32_t* acc, uint8_t* y, int64_t M, int64_t O, const QOutput& out);
void qlinear(const uint8_t* x, const int8_t* w, uint8_t* y, int64_t N, int64_t K, int64_t O, int32_t x_max,
             const QOutput& out, int32_t* work);
int64_t qconv2d_work_bytes(const Conv2dParams& p);
void qconv2d(const uint8_t* x, const int8_t* w, uint8_t* y, const Conv2dParams& p, int32_t x_zero_point,
             int32_t x_max, const QOutput& out, uint8_t* work);
void qmaxpool2d(const uint8_t* x, uint8_t* y, const Pool2dParams& p);
void qglobal_avgpool(const uint8_t* x, uint8_t* y, int64_t NC, int64_t S);
void qadd(const uint8_t* a, const uint8_t* b, uint8_t* y, int64_t n, const QAddParams& q);
void lookup_u8(const uint8_t* x, uint8_t* y, int64_t outer, int64_t C, int64_t inner, const uint8_t* table);
void fake_quantize_forward(const float* x, float* y, int64_t outer, int64_t C, int64_t inner, const float* scale,
                           const int32_t* zero_point, int32_t qmin, int32_t qmax);
void fake_quantize_backward(const float* x, const float* dy, float* dx, int64_t outer, int64_t C, int64_t inner,
                            const float* scale, const int32_t* zero_point, int32_t qmin, int32_t qmax);

}  // namespace kiln::cuda
