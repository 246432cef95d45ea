// cnn_ops.h — the CPU kernels of convolutional networks, on raw pointers (chapters 03 and 06).
//
// Each function has (or will have) a twin with the same name and arguments in cuda/, so the
// two can be read side by side. The layers in src/nn/ (conv, pool, norm,
// misc) check the tensors and call these. Every kernel here gives bitwise the same result
// for any OpenMP thread count: a sum is never split across threads in a way that depends on
// their number.
//
// Letters, used in every shape comment below:
//   N = batch, C = input channels, H, W = input height and width,
//   O = output channels, KH, KW = kernel height and width (K when square),
//   P, Q = output height and width, G = groups, S = H·W (spatial size of one channel plane).
//
// Files: conv.cpp (im2col, col2im, the three convolution passes), pool.cpp (max, average,
// global average), norm.cpp (batch norm, and the two elementwise kernels of chapter 06's
// layers: GELU and dropout).
#pragma once
#include <cstdint>

namespace kiln::cpu {

// ==== convolution ===========================================================================
// y[n, o, p, q] = b[o] + Σ_{c in o's group} Σ_{kh, kw} w[o, c, kh, kw] · x[n, c', ih, iw]
//   ih = p·stride − padding + kh·dilation,   iw = q·stride − padding + kw·dilation
//   (x outside [0, H) × [0, W) reads as 0: zero padding)
//   P = (H + 2·padding − dilation·(KH − 1) − 1) / stride + 1,   Q likewise with W, KW
// Tensors: x [N, C, H, W]   w [O, C/G, KH, KW]   b [O]   y [N, O, P, Q]
struct Conv2dParams {
    int64_t N = 1, C = 1, H = 1, W = 1;  // input
    int64_t O = 1, KH = 1, KW = 1;       // output channels and kernel
    int64_t stride = 1, padding = 0, dilation = 1, groups = 1;

    int64_t P() const { return (H + 2 * padding - dilation * (KH - 1) - 1) / stride + 1; }
    int64_t Q() const { return (W + 2 * padding - dilation * (KW - 1) - 1) / stride + 1; }
    int64_t Cg() const { return C / groups; }  // input channels per group
    int64_t Og() const { return O / groups; }  // output channels per group
};

// How a convolution is computed (conv.cpp's header explains each).
enum class ConvAlgo {
    Im2col,     // general: unfold each image into columns, then one GEMM per image and group
    Pointwise,  // 1×1, stride 1, no padding: the image already is its column matrix
    Depthwise,  // G == C == O: one small K×K filter per channel, direct loops, no GEMM
};
ConvAlgo conv2d_algo(const Conv2dParams& p);
const char* conv_algo_name(ConvAlgo a);

// Throws a kiln::Error naming op when the sizes are not a valid convolution (non-positive
// sizes, groups not dividing C and O, a kernel that does not fit). cuda/conv.cu uses it too.
void check_conv2d_params(const Conv2dParams& p, const char* op);

// Floats of workspace one image needs: (C·KH·KW + O) · P·Q for Im2col — its columns, and its
// output (or dy) as rows of the GEMM that does several images at once (conv.cpp, "Several
// images in one GEMM"); 0 for Pointwise and Depthwise.
int64_t conv2d_col_floats_per_image(const Conv2dParams& p);

// One image (or one group of channels of it), C channels of H×W:
//   col[(c·KH + kh)·KW + kw][p·Q + q] = x[c][ih][iw]   (0 where (ih, iw) is padding)
// col is [C·KH·KW, P·Q] with rows ld floats apart (ld ≥ P·Q: several images side by side).
// Only the H, W, KH, KW, stride, padding, dilation of p are used.
void im2col(const float* x, int64_t C, const Conv2dParams& p, float* col, int64_t ld);
inline void im2col(const float* x, int64_t C, const Conv2dParams& p, float* col) {
    im2col(x, C, p, col, p.P() * p.Q());
}
// The adjoint of im2col: dx = 0, then dx[c][ih][iw] += col[...] for every column entry that
// im2col read from (c, ih, iw). dx is [C, H, W] and is overwritten.
void col2im(const float* col, int64_t C, const Conv2dParams& p, float* dx, int64_t ld);
inline void col2im(const float* col, int64_t C, const Conv2dParams& p, float* dx) {
    col2im(col, C, p, dx, p.P() * p.Q());
}

// The three passes. col is workspace for col_images images (col_images ≥ 1 and
// col_images · conv2d_col_floats_per_image(p) floats), or may be null when that is 0.
// The batch is processed col_images images at a time, so the workspace stays bounded.
//   forward          y  = conv(x, w) + b                          (b may be null)
//   backward_data    dx = conv_transpose(dy, w)                   (dx is overwritten)
//   backward_weight  dw += Σ_n dy_n ⋆ x_n,   db += Σ_{n,p,q} dy   (db may be null)
void conv2d_forward(const float* x, const float* w, const float* b, float* y, const Conv2dParams& p, float* col,
                    int64_t col_images);
void conv2d_backward_data(const float* dy, const float* w, float* dx, const Conv2dParams& p, float* col,
                          int64_t col_images);
void conv2d_backward_weight(const float* x, const float* dy, float* dw, float* db, const Conv2dParams& p, float* col,
                            int64_t col_images);

// ==== pooling ===============================================================================
// Windows of KH×KW at (p·stride − padding, q·stride − padding); P, Q as for convolution with
// dilation 1. x [N, C, H, W]  →  y [N, C, P, Q]. Planes (n, c) are independent.
struct Pool2dParams {
    int64_t N = 1, C = 1, H = 1, W = 1;
    int64_t KH = 1, KW = 1, stride = 1, padding = 0;

    int64_t P() const { return (H + 2 * padding - KH) / stride + 1; }
    int64_t Q() const { return (W + 2 * padding - KW) / stride + 1; }
};

// y = max over the window (padding counts as −inf; NaN wins, like PyTorch).
// argmax [N, C, P, Q] = ih·W + iw of the maximum inside its (n, c) plane (first one on ties).
void maxpool2d_forward(const float* x, float* y, int32_t* argmax, const Pool2dParams& p);
// dx = 0, then dx[n, c, argmax] += dy[n, c, p, q]  (dx [N, C, H, W] is overwritten)
void maxpool2d_backward(const float* dy, const int32_t* argmax, float* dx, const Pool2dParams& p);

// y = (Σ over the window of x) / (KH·KW)   — padding counts as 0 and is counted in the
// divisor (PyTorch's count_include_pad = true).   dx[i] = Σ over windows holding i of dy/(KH·KW)
void avgpool2d_forward(const float* x, float* y, const Pool2dParams& p);
void avgpool2d_backward(const float* dy, float* dx, const Pool2dParams& p);  // dx overwritten

// [N·C planes of S values] → [N·C]:   y = mean of the plane;   dx = dy / S on the whole plane.
void global_avgpool_forward(const float* x, float* y, int64_t NC, int64_t S);
void global_avgpool_backward(const float* dy, float* dx, int64_t NC, int64_t S);

// ==== batch normalization ===================================================================
// x [N, C, S]: S = H·W for BatchNorm2d, 1 for BatchNorm1d. Statistics are per channel over
// the M = N·S values of that channel.
struct BatchNormParams {
    int64_t N = 1, C = 1, S = 1;
    float eps = 1e-5f;
    float momentum = 0.1f;
};

// Training: batch statistics, two passes (mean, then Σ(x − mean)², in double):
//   mean = Σ x / M      var = Σ (x − mean)² / M      invstd = 1 / sqrt(var + eps)
//   y = gamma · (x − mean) · invstd + beta
//   running_mean = (1 − momentum) · running_mean + momentum · mean
//   running_var  = (1 − momentum) · running_var  + momentum · var · M / (M − 1)  (unbiased)
// save_mean, save_invstd [C] keep mean and invstd for the backward pass. M must be > 1.
void batchnorm_forward_train(const float* x, const float* gamma, const float* beta, float* y, float* running_mean,
                             float* running_var, float* save_mean, float* save_invstd, const BatchNormParams& p);
// Evaluation: y = gamma · (x − running_mean) / sqrt(running_var + eps) + beta
void batchnorm_forward_eval(const float* x, const float* gamma, const float* beta, const float* running_mean,
                            const float* running_var, float* y, const BatchNormParams& p);
// With x̂ = (x − mean) · invstd recomputed from x and the saved statistics:
//   dbeta  += Σ dy        dgamma += Σ dy · x̂
//   dx = gamma · invstd / M · (M · dy − Σ dy − x̂ · Σ dy · x̂)
// dx is overwritten; dgamma and dbeta accumulate.
void batchnorm_backward(const float* dy, const float* x, const float* gamma, const float* save_mean,
                        const float* save_invstd, float* dx, float* dgamma, float* dbeta, const BatchNormParams& p);

// ==== elementwise: GELU and dropout (n elements) ============================================
// GELU, exact (erf) form, PyTorch's default:
//   y = x · Φ(x) = x/2 · (1 + erf(x / √2))        dy/dx = Φ(x) + x · φ(x),  φ(x) = e^(−x²/2) / √(2π)
void gelu_forward(const float* x, float* y, int64_t n);
void gelu_backward(const float* x, const float* dy, float* dx, int64_t n);

// Inverted dropout. Element i is kept when its uniform number u_i ≥ drop_p, where
//   u_i = Rng::to_unit(splitmix64(seed_hash ^ splitmix64(first + i)))   (= Rng::at(first + i))
// so the mask is a pure function of (seed, counter, i): any thread count, any device, same mask.
//   mask[i] = kept ? 1 : 0        y = x · mask / (1 − drop_p)       (y = 0 when drop_p = 1)
void dropout_forward(const float* x, float* y, uint8_t* mask, int64_t n, float drop_p, uint64_t seed_hash,
                     uint64_t first);
// dx = dy · mask / (1 − drop_p)
void dropout_backward(const float* dy, const uint8_t* mask, float* dx, int64_t n, float drop_p);

}  // namespace kiln::cpu
