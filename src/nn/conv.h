// conv.h — the 2-D convolution layer (chapter 03). It calls the op conv2d (ops/conv.h), whose
// kernels are in src/ops/cpu/conv.cpp and, on the CUDA device, cuda/conv.cu (chapter 05).
//
// Letters: N = batch, C = input channels, H, W = input size, O = output channels,
// K = kernel size (KH × KW when not square), P, Q = output size, G = groups.
#pragma once
#include <cstdint>
#include <string>

#include "core/rng.h"
#include "nn/module.h"
#include "ops/conv.h"  // kDefaultConvWorkspace

namespace kiln {

struct ConvOptions {
    int64_t stride = 1;
    int64_t padding = 0;   // zeros on every side
    int64_t dilation = 1;  // spacing between kernel taps
    int64_t groups = 1;    // C and O split in G independent groups; G == C == O is depthwise
    bool bias = true;
};

// y[n, o, p, q] = b[o] + Σ_{c in o's group} Σ_{kh, kw} w[o, c, kh, kw] · x[n, c, p·s − pad + kh·d, q·s − pad + kw·d]
//   x [N, C, H, W]   w [O, C/G, KH, KW]   b [O]   y [N, O, P, Q]
//   P = (H + 2·pad − d·(KH − 1) − 1) / s + 1        Q likewise
// backward:  dx = conv_transpose(dy, w)   dw += Σ_n dy_n ⋆ x_n   db += Σ_{n,p,q} dy
// Initialized like PyTorch: w, b ~ U(−1/√fan_in, 1/√fan_in), fan_in = C/G · KH · KW.
// On the CPU computed by im2col + GEMM, or directly for 1×1 convolutions and depthwise ones
// (conv.cpp); on CUDA by im2col + GEMM or an implicit GEMM (cuda/conv.cu).
class Conv2d : public Module {
public:
    Conv2d(int64_t in, int64_t out, int64_t kernel, Rng& rng, ConvOptions options = {}, std::string name = "conv");
    Conv2d(int64_t in, int64_t out, int64_t kernel_h, int64_t kernel_w, Rng& rng, ConvOptions options = {},
           std::string name = "conv");
    Tensor forward(const Tensor& x) override;
    Tensor backward(const Tensor& dy) override;

    Parameter weight, bias;  // "weight", "bias"; bias undefined when built without one
    int64_t in_channels, out_channels, kernel_h, kernel_w;
    ConvOptions options;
    int64_t workspace_limit = kDefaultConvWorkspace;  // bytes of im2col columns at once

    // The output shape for an input shape (checks it, throwing a kiln::Error naming the layer).
    Shape output_shape(const Shape& in) const;

    // x [N, C, H, W] -> y [N, O, P, Q]: 4·N·O·P·Q bytes; parameters 4·(O·C/G·KH·KW + O) bytes
    // (+ as much gradient); keeps x; dx [N, C, H, W]. The im2col workspace of a pass, from the
    // pool (ops/conv.h conv2d_workspace): on the CPU's im2col path
    //   4 · images · (C·KH·KW + O)·P·Q bytes,   images = clamp(workspace_limit / that per image, 1, N)
    // in forward and again in backward (dw recomputes the columns; dx shares them). On a GPU, in
    // backward after dx, dw's split-K partial sums for a moment (ops/conv.h conv2d_backward_scratch).
    LayerMemory memory(const Shape& in, Device device) const override;

private:
    Tensor x_;  // the input as the op read it (ops/conv.h conv2d), kept for dw
};

// Sets workspace_limit on every Conv2d in the model: im2col's columns for as many images as fit
// in `bytes` at a time (at least one). Less memory, smaller GEMMs (chapter 08).
void set_conv_workspace_limit(Module& model, int64_t bytes);

}  // namespace kiln
