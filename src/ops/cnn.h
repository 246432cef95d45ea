// cnn.h — the convolution on tensors (chapters 03 and 05; GELU and dropout are in
// ops/elementwise.h, pooling in ops/pool.h, the normalizations in ops/norm.h). Like
// ops.h, each casts its inputs to the type its autocast class gives it (ops/autocast.h: the
// class is named below), checks its arguments once (shapes, dtypes, devices: the error names the
// op and the tensor), takes its outputs from the current allocator (Category::Activation;
// convolution's workspace: Category::Workspace) and runs the kernel (ops/kernels/conv.h) of the
// tensors' device. The layers of src/nn/ call these.
//
// Element types: f32, f16 and bf16 (the kernels are templates on it). Every tensor an op takes
// or returns has x's dtype (after autocast's cast) — a mixed pair is an error naming the
// tensor. Sums are taken in f32 (or
// double), each result rounded to x's type once (ops/kernels/; cpu/conv.cpp says where a
// convolution rounds more than once). Letters as in ops/params.h.
#pragma once
#include <cstdint>

#include "core/tensor.h"
#include "ops/params.h"

namespace kiln {

// ---- convolution -------------------------------------------------------------------------
// The im2col workspace bound: the batch is convolved in chunks of images whose column matrices
// and outputs ((C·K·K + O) · P·Q elements each) fit in this many bytes; at least one image per
// chunk, whatever its size.
constexpr int64_t kDefaultConvWorkspace = int64_t(32) << 20;  // 32 MiB

struct Conv2dArgs {
    int64_t stride = 1, padding = 0, dilation = 1, groups = 1;
    int64_t workspace_limit = kDefaultConvWorkspace;  // bytes of im2col columns at once
};

// The im2col workspace conv2d (forward) or conv2d_backward takes from the device's pool, of x's
// dtype: the columns of `images` images at once, each (C·K·K + O)·P·Q elements on the CPU's
// im2col path, 16·⌈H/2⌉·⌈W/2⌉·(C + O) on its Winograd path (none for its pointwise and depthwise
// paths, none for the CUDA forward by implicit GEMM), and
//   images = clamp(limit / (elems_per_image · elem_bytes), 1, N)     elem_bytes = 4 (f32) or 2
// except that Winograd rounds it down to whole groups of images (at least one group: winograd.h).
// Chapter 08's memory model predicts the workspace from it.
struct ConvWorkspace {
    int64_t images = 0, elems_per_image = 0, elem_bytes = 4;
    int64_t bytes() const { return images * elems_per_image * elem_bytes; }
};
ConvWorkspace conv2d_workspace(const Conv2dParams& p, Device device, bool forward, int64_t limit,
                               DType dtype = DType::F32);
// What conv2d_backward takes from the pool for a moment on top of that workspace and dx: on a
// CUDA device, the split-K partial sums of the weight gradient (cuda/conv.cu, N·P·Q cut into S
// slices, S from the device's SM count):
//   S · O · C/G·KH·KW · 4 bytes      (floats, whatever the dtype)
// 0 when S is 1 (a big dw, or a GPU with few SMs), for depthwise convolutions and on the CPU.
int64_t conv2d_backward_scratch(const Conv2dParams& p, Device device);

// y = conv(x, w) + b (the formula: ops/params.h).  x [N, C, H, W]  w [O, C/G, KH, KW]
// b [O] or undefined  →  y [N, O, P, Q]. Autocast class LowPrecision. *saved_x (if not null) gets x as
// the kernel read it (under autocast its low copy), for conv2d_backward.
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dArgs& a, Tensor* saved_x = nullptr);
// dw += Σ_n dy_n ⋆ x_n and db += Σ_{n,p,q} dy (db may be undefined: no bias), computed in x's
// type (conv2d's saved x) and added to dw's and db's; then, when need_dx, returns
// dx = conv_transpose(dy, w) [N, C, H, W] in x's type, else an undefined tensor.
Tensor conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dw, Tensor& db, bool need_dx,
                       const Conv2dArgs& a);

}  // namespace kiln
