// cnn_ops.h — the CPU kernels of convolutional networks (and of LayerNorm), on raw pointers
// (chapters 03 and 06). Their sizes come in the structs of ops/params.h.
//
// Each function has a twin with the same name and arguments in cuda/ (declared in
// ops/cuda_ops.h), so the two can be read side by side: cpu/conv.cpp ↔ cuda/conv.cu,
// cpu/pool.cpp ↔ cuda/pool.cu, cpu/norm.cpp ↔ cuda/norm.cu. The Tensor-level ops (ops/cnn.h)
// check the tensors and call one of the two. Every kernel here gives bitwise the same result
// for any OpenMP thread count: a sum is never split across threads in a way that depends on
// their number.
//
// Element types: every kernel is a template on T, the type of the activations (x, y, dy, dx)
// and of a convolution's weights and workspace, T = float, f16 or bf16 (core/dtype.h). Sums
// and products are taken in float (or double) whatever T is, and each result is rounded to T
// once, when it is stored; the exceptions, where a GEMM's result is itself summed again, are
// in conv.cpp's header. The norms' gamma, beta, statistics and their gradients stay float
// (cuDNN's rule for half inputs). Each .cpp instantiates the three types with the lists at the
// end of this file, which the CUDA twins use too.
//
// Files: conv.cpp (im2col, col2im, the three convolution passes), pool.cpp (max, average,
// global average), norm.cpp (batch norm, layer norm, and the two elementwise kernels of
// chapter 06's layers: GELU and dropout).
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "ops/cpu/convert_simd.h"
#include "ops/params.h"

namespace kiln::cpu {

// ==== convolution (the formula: ops/params.h) ================================================
// The strategy for a shape and element type: Depthwise, Pointwise, Winograd (f32 only) or Im2col
// (ops/params.h); all three passes follow it.
ConvAlgo conv2d_algo(const Conv2dParams& p, DType dtype);

// Elements (of the dtype) of workspace one image needs: (C·KH·KW + O) · P·Q for Im2col — its
// columns, and its output (or dy) as rows of the GEMM that does several images at once (conv.cpp,
// "Several images in one GEMM"); 36·⌈H/4⌉·⌈W/4⌉·(C + O) for Winograd (winograd.h); 0 for
// Pointwise and Depthwise.
int64_t conv2d_col_elems_per_image(const Conv2dParams& p, DType dtype);
// The images per workspace chunk when `fit` of them fit in the byte limit (1 ≤ fit ≤ N): fit,
// except for Winograd, whose chunks are whole numbers of its image groups (winograd.h).
int64_t conv2d_chunk_images(const Conv2dParams& p, DType dtype, int64_t fit);

// One image (or one group of channels of it), C channels of H×W:
//   col[(c·KH + kh)·KW + kw][p·Q + q] = x[c][ih][iw]   (pad where (ih, iw) is padding)
// col is [C·KH·KW, P·Q] with rows ld elements apart (ld ≥ P·Q: several images side by side).
// Only the H, W, KH, KW, stride, padding, dilation of p are used. T is a float type, or uint8_t
// for the int8 convolution (chapter 11), whose padding is the zero point z_x.
template <typename T>
void im2col(const T* x, int64_t C, const Conv2dParams& p, T* col, int64_t ld, T pad = T(0));
template <typename T>
void im2col(const T* x, int64_t C, const Conv2dParams& p, T* col) {
    im2col(x, C, p, col, p.P() * p.Q());
}
// The adjoint of im2col: dx = 0, then dx[c][ih][iw] += col[...] for every column entry that
// im2col read from (c, ih, iw). dx is [C, H, W] and is overwritten. col is scratch: the entries
// that fell on padding may be set to 0 (conv.cpp says why).
template <typename T>
void col2im(T* col, int64_t C, const Conv2dParams& p, T* dx, int64_t ld);
template <typename T>
void col2im(T* col, int64_t C, const Conv2dParams& p, T* dx) {
    col2im(col, C, p, dx, p.P() * p.Q());
}

// The three passes. col is workspace for col_images images (col_images ≥ 1 and
// col_images · conv2d_col_elems_per_image(p, dtype) elements), or may be null when that is 0.
// The batch is processed col_images images at a time, so the workspace stays bounded.
//   forward          y  = conv(x, w) + b                          (b may be null)
//   backward_data    dx = conv_transpose(dy, w)                   (dx is overwritten)
//   backward_weight  dw += Σ_n dy_n ⋆ x_n,   db += Σ_{n,p,q} dy   (db may be null)
template <typename T>
void conv2d_forward(const T* x, const T* w, const T* b, T* y, const Conv2dParams& p, T* col, int64_t col_images);
template <typename T>
void conv2d_backward_data(const T* dy, const T* w, T* dx, const Conv2dParams& p, T* col, int64_t col_images);
template <typename T>
void conv2d_backward_weight(const T* x, const T* dy, T* dw, T* db, const Conv2dParams& p, T* col, int64_t col_images);

// ==== pooling (Pool2dParams: ops/params.h) ==================================================
// y = max over the window (padding counts as −inf; NaN wins, like PyTorch).
// argmax [N, C, P, Q] = ih·W + iw of the maximum inside its (n, c) plane (first one on ties).
template <typename T>
void maxpool2d_forward(const T* x, T* y, int32_t* argmax, const Pool2dParams& p);
// dx = 0, then dx[n, c, argmax] += dy[n, c, p, q]  (dx [N, C, H, W] is overwritten)
template <typename T>
void maxpool2d_backward(const T* dy, const int32_t* argmax, T* dx, const Pool2dParams& p);

// y = (Σ over the window of x) / (KH·KW)   — padding counts as 0 and is counted in the
// divisor (PyTorch's count_include_pad = true).   dx[i] = Σ over windows holding i of dy/(KH·KW)
template <typename T>
void avgpool2d_forward(const T* x, T* y, const Pool2dParams& p);
template <typename T>
void avgpool2d_backward(const T* dy, T* dx, const Pool2dParams& p);  // dx overwritten

// [N·C planes of S values] → [N·C]:   y = mean of the plane;   dx = dy / S on the whole plane.
template <typename T>
void global_avgpool_forward(const T* x, T* y, int64_t NC, int64_t S);
template <typename T>
void global_avgpool_backward(const T* dy, T* dx, int64_t NC, int64_t S);

// ==== batch normalization (BatchNormParams: ops/params.h) ===================================
// Training: batch statistics, two passes (mean, then Σ(x − mean)², in double):
//   mean = Σ x / M      var = Σ (x − mean)² / M      invstd = 1 / sqrt(var + eps)
//   y = gamma · (x − mean) · invstd + beta
//   running_mean = (1 − momentum) · running_mean + momentum · mean
//   running_var  = (1 − momentum) · running_var  + momentum · var · M / (M − 1)  (unbiased)
// save_mean, save_invstd [C] keep mean and invstd for the backward pass. M must be > 1.
template <typename T>
void batchnorm_forward_train(const T* x, const float* gamma, const float* beta, T* y, float* running_mean,
                             float* running_var, float* save_mean, float* save_invstd, const BatchNormParams& p);
// Evaluation: y = gamma · (x − running_mean) / sqrt(running_var + eps) + beta
template <typename T>
void batchnorm_forward_eval(const T* x, const float* gamma, const float* beta, const float* running_mean,
                            const float* running_var, T* y, const BatchNormParams& p);
// With x̂ = (x − mean) · invstd recomputed from x and the saved statistics:
//   dbeta  += Σ dy        dgamma += Σ dy · x̂
//   dx = gamma · invstd / M · (M · dy − Σ dy − x̂ · Σ dy · x̂)
// dx is overwritten; dgamma and dbeta accumulate.
template <typename T>
void batchnorm_backward(const T* dy, const T* x, const float* gamma, const float* save_mean,
                        const float* save_invstd, T* dx, float* dgamma, float* dbeta, const BatchNormParams& p);

// ==== layer normalization ===================================================================
// x [R, D]: R rows (every dimension but the last, flattened) of D values, each row normalized
// over its own D values (nn/norm.h has the derivation):
//   mean = Σ x / D      var = Σ (x − mean)² / D   (biased; two passes, in double)
//   invstd = 1 / sqrt(var + eps)      x̂ = (x − mean) · invstd      y = gamma · x̂ + beta
// gamma, beta [D]; save_mean, save_invstd [R] keep mean and invstd for the backward pass.
template <typename T>
void layernorm_forward(const T* x, const float* gamma, const float* beta, T* y, float* save_mean, float* save_invstd,
                       int64_t R, int64_t D, float eps);
// With x̂ recomputed from x and the saved statistics, and g = gamma · dy:
//   dx = invstd · (g − Σ_d g / D − x̂ · Σ_d g·x̂ / D)                (per row; overwritten)
//   dgamma += Σ_rows dy · x̂        dbeta += Σ_rows dy              (per column; accumulate)
template <typename T>
void layernorm_backward(const T* dy, const T* x, const float* gamma, const float* save_mean, const float* save_invstd,
                        T* dx, float* dgamma, float* dbeta, int64_t R, int64_t D);

// ==== elementwise: GELU and dropout (n elements) ============================================
// GELU, exact (erf) form, PyTorch's default:
//   y = x · Φ(x) = x/2 · (1 + erf(x / √2))        dy/dx = Φ(x) + x · φ(x),  φ(x) = e^(−x²/2) / √(2π)
template <typename T>
void gelu_forward(const T* x, T* y, int64_t n);
template <typename T>
void gelu_backward(const T* x, const T* dy, T* dx, int64_t n);

// Inverted dropout. Element i is kept when its uniform number u_i ≥ drop_p, where
//   u_i = Rng::to_unit(splitmix64(seed_hash ^ splitmix64(first + i)))   (= Rng::at(first + i))
// so the mask is a pure function of (seed, counter, i): any thread count, any device, same mask.
//   mask[i] = kept ? 1 : 0        y = x · mask / (1 − drop_p)       (y = 0 when drop_p = 1)
template <typename T>
void dropout_forward(const T* x, T* y, uint8_t* mask, int64_t n, float drop_p, uint64_t seed_hash,
                     uint64_t first);
// dx = dy · mask / (1 − drop_p)
template <typename T>
void dropout_backward(const T* dy, const uint8_t* mask, T* dx, int64_t n, float drop_p);

// ==== shared by the kernel files: a scatter's sums in f32 ===================================
// A pass that scatters (col2im, the pooling backwards, the depthwise convolution) adds several
// terms into one output element with +=. In f16 or bf16 each += would round; instead the plane
// is summed in a float scratch and rounded into the output once, at the end:
//     F32Plane<T> acc(out, n, init);   float* a = acc.data();   a[i] += term; ...   acc.store();
// a[0 .. n) starts at init. store() rounds the plane with the CPU's vector kernel
// (convert_simd.h). For T = float the scratch is the output itself: the f32 kernels add into it
// exactly as they would without it, and store() does nothing.
template <typename T>
class F32Plane {
public:
    F32Plane(T* out, int64_t n, float init = 0.0f) : out_(out), sum_(size_t(n), init) {}
    float* data() { return sum_.data(); }
    void store() { narrow_into(sum_.data(), int64_t(sum_.size()), out_); }

private:
    T* out_;
    std::vector<float> sum_;
};

template <>
class F32Plane<float> {
public:
    F32Plane(float* out, int64_t n, float init = 0.0f) : out_(out) {
        std::fill(out, out + n, init);
    }
    float* data() { return out_; }
    void store() {}

private:
    float* out_;
};

}  // namespace kiln::cpu

// ==== the explicit instantiations, for cpu/*.cpp and their twins cuda/*.cu ==================
// (one list per file pair, since the two declare the same functions):
//   KILN_FOR_EACH_FLOAT_TYPE(KILN_CONV)   KILN_FOR_EACH_FLOAT_TYPE(KILN_POOL)   ...(KILN_NORM)
// inside the namespace. conv.cpp and conv.cu add their own helpers' instantiations.
#define KILN_CONV(T)                                                                                          \
    template void conv2d_forward<T>(const T*, const T*, const T*, T*, const Conv2dParams&, T*, int64_t);      \
    template void conv2d_backward_data<T>(const T*, const T*, T*, const Conv2dParams&, T*, int64_t);          \
    template void conv2d_backward_weight<T>(const T*, const T*, T*, T*, const Conv2dParams&, T*, int64_t);
#define KILN_POOL(T)                                                                         \
    template void maxpool2d_forward<T>(const T*, T*, int32_t*, const Pool2dParams&);         \
    template void maxpool2d_backward<T>(const T*, const int32_t*, T*, const Pool2dParams&);  \
    template void avgpool2d_forward<T>(const T*, T*, const Pool2dParams&);                   \
    template void avgpool2d_backward<T>(const T*, T*, const Pool2dParams&);                  \
    template void global_avgpool_forward<T>(const T*, T*, int64_t, int64_t);                 \
    template void global_avgpool_backward<T>(const T*, T*, int64_t, int64_t);
#define KILN_NORM(T)                                                                                                \
    template void batchnorm_forward_train<T>(const T*, const float*, const float*, T*, float*, float*, float*,      \
                                             float*, const BatchNormParams&);                                       \
    template void batchnorm_forward_eval<T>(const T*, const float*, const float*, const float*, const float*, T*,   \
                                            const BatchNormParams&);                                                \
    template void batchnorm_backward<T>(const T*, const T*, const float*, const float*, const float*, T*, float*,   \
                                        float*, const BatchNormParams&);                                            \
    template void layernorm_forward<T>(const T*, const float*, const float*, T*, float*, float*, int64_t, int64_t,  \
                                       float);                                                                      \
    template void layernorm_backward<T>(const T*, const T*, const float*, const float*, const float*, T*, float*,   \
                                        float*, int64_t, int64_t);                                                  \
    template void gelu_forward<T>(const T*, T*, int64_t);                                                           \
    template void gelu_backward<T>(const T*, const T*, T*, int64_t);                                                \
    template void dropout_forward<T>(const T*, T*, uint8_t*, int64_t, float, uint64_t, uint64_t);                   \
    template void dropout_backward<T>(const T*, const uint8_t*, T*, int64_t, float);
