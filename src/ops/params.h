// params.h — the sizes of a convolution, a pooling and a batch norm, as the kernels of both
// backends take them (ops/conv.h, pool.h, norm.h), and the one list of convolution
// strategies. The Tensor-level ops (in the same headers) fill these from the tensors' shapes.
//
// Letters, used in every shape comment of the CNN kernels:
//   N = batch, C = input channels, H, W = input height and width,
//   O = output channels, KH, KW = kernel height and width (K when square),
//   P, Q = output height and width, G = groups, S = H·W (spatial size of one channel plane).
#pragma once
#include <cstdint>

namespace kiln {

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

// How a convolution's forward is computed. Each backend's conv2d_algo(p) returns one of the
// strategies it implements: the CPU Im2col, Pointwise, Depthwise or Winograd (ops/cpu/conv.cpp
// explains them), CUDA Im2col or ImplicitGemm (cuda/conv.cu).
enum class ConvAlgo {
    Im2col,        // unfold each image into columns, then GEMMs; needs a workspace
    Pointwise,     // 1×1, stride 1, no padding: the image already is its column matrix
    Depthwise,     // G == C == O: one small K×K filter per channel, direct loops, no GEMM
    ImplicitGemm,  // one kernel gathers x's columns into shared memory as it goes; no workspace
    Winograd,      // 3×3, stride 1: 4×4 output tiles by F(4×4, 3×3), 36 GEMMs; needs a workspace
};
const char* conv_algo_name(ConvAlgo a);  // "im2col", "pointwise", "depthwise", "implicit-gemm", "winograd"

// Throws a kiln::Error naming op when the sizes are not a valid convolution (non-positive
// sizes, groups not dividing C and O, a kernel that does not fit). Both backends' kernels call it.
void check_conv2d_params(const Conv2dParams& p, const char* op);

// ==== pooling ===============================================================================
// Windows of KH×KW at (p·stride − padding, q·stride − padding); P, Q as for convolution with
// dilation 1. x [N, C, H, W]  →  y [N, C, P, Q]. Planes (n, c) are independent.
struct Pool2dParams {
    int64_t N = 1, C = 1, H = 1, W = 1;
    int64_t KH = 1, KW = 1, stride = 1, padding = 0;

    int64_t P() const { return (H + 2 * padding - KH) / stride + 1; }
    int64_t Q() const { return (W + 2 * padding - KW) / stride + 1; }
};

// ==== batch normalization ===================================================================
// x [N, C, S]: S = H·W for BatchNorm2d, 1 for BatchNorm1d. Statistics are per channel over
// the M = N·S values of that channel.
// gelu: GELU fused after the normalization (nn/fuse.h): the forward writes z = GELU(y) instead
// of y, and the backward takes dz and recomputes y from x and the statistics, so the layer pair
// runs one kernel each way and keeps no y.
struct BatchNormParams {
    int64_t N = 1, C = 1, S = 1;
    float eps = 1e-5f;
    float momentum = 0.1f;
    bool gelu = false;
};

// Max-pooling 2×2 (stride 2, no padding) fused in front of a batch norm (nn/fuse.h): the batch
// norm's input is the pool of x [N, C, H, W], and its BatchNormParams describe that pooled
// tensor [N, C, P, Q] (S = P·Q) with P = H / 2, Q = W / 2 rounded down (an odd H's last row, an
// odd W's last column lies in no window, as in PyTorch). Each window's winner is kept as one
// byte, its place k = 2·dh + dw (0 to 3) at (2p + dh, 2q + dw), not as an i32 index: 3 bytes less
// per pooled value, and all the backward needs.
struct MaxPool2x2 {
    int64_t H = 0, W = 0;  // x's plane; H = 0: no pooling in front
};

}  // namespace kiln
