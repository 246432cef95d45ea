// conv.h — the convolution kernels (chapters 03 and 05), declared once for both backends
// (core/backend.h): src/ops/cpu/conv.cpp ↔ cuda/conv.cu. Their sizes come in Conv2dParams
// (ops/params.h, with the formula); how each backend computes them is in its file's header.
//
// T is float, f16 or bf16, the type of x, w, b, y (and dy, dx, dw, db) and of the workspace;
// products are summed in float and each result rounded to T once (cpu/conv.cpp says where a
// convolution rounds more than once). Every kernel gives the same bits on every run and, on the
// CPU, any thread count.
#pragma once
#include <cstdint>

#include "core/backend.h"
#include "core/dtype.h"
#include "ops/params.h"

namespace kiln {

// ---- the three passes (both backends) -------------------------------------------------------------
// col is workspace for col_images images (col_images ≥ 1 and col_images times the backend's
// elements per image, below), or may be null when that is 0. The batch is processed col_images
// images at a time, so the workspace stays bounded.
//   forward          y  = conv(x, w) + b                          (b may be null)
//   backward_data    dx = conv_transpose(dy, w)                   (dx is overwritten)
//   backward_weight  dw += Σ_n dy_n ⋆ x_n,   db += Σ_{n,p,q} dy   (db may be null)
KILN_KERNEL(conv2d_forward, template <typename T> void conv2d_forward(const T* x, const T* w, const T* b, T* y,
                                                                      const Conv2dParams& p, T* col,
                                                                      int64_t col_images));
KILN_KERNEL(conv2d_backward_data,
            template <typename T> void conv2d_backward_data(const T* dy, const T* w, T* dx, const Conv2dParams& p,
                                                            T* col, int64_t col_images));
KILN_KERNEL(conv2d_backward_weight,
            template <typename T> void conv2d_backward_weight(const T* x, const T* dy, T* dw, T* db,
                                                              const Conv2dParams& p, T* col, int64_t col_images));

// ---- the workspace (both backends) ----------------------------------------------------------------
// Elements (of the dtype) of workspace one image needs for a pass (forward, or the two backward
// passes, which share one workspace); 0 when the pass needs none.
KILN_KERNEL(conv2d_workspace_per_image,
            int64_t conv2d_workspace_per_image(const Conv2dParams& p, DType dtype, bool forward));
// The images per workspace chunk when `fit` of them fit in the byte limit (1 ≤ fit ≤ N): fit,
// except for the CPU's Winograd, whose chunks are whole numbers of its image groups (winograd.h).
KILN_KERNEL(conv2d_chunk_images, int64_t conv2d_chunk_images(const Conv2dParams& p, DType dtype, int64_t fit));
// Bytes backward_weight takes for a moment beyond that workspace (the memory model counts them,
// train/memory_model.h): CUDA's split-K partial sums, S·O·(C/G)·KH·KW floats whatever the dtype
// when it cuts N·P·Q into S > 1 slices (S from the GPU's SM count: gemm_split_k_slices), 0 for
// depthwise shapes; none on the CPU, whose dw sums in place.
KILN_KERNEL(conv2d_backward_weight_scratch, int64_t conv2d_backward_weight_scratch(const Conv2dParams& p));

// ---- the CPU's strategy (cpu/conv.cpp) -------------------------------------------------------------
// The strategy for a shape and element type: Depthwise, Pointwise, Winograd (f32 only) or Im2col
// (ops/params.h); all three passes follow it.
KILN_CPU_KERNEL(ConvAlgo conv2d_algo(const Conv2dParams& p, DType dtype));
// Elements (of the dtype) of workspace one image needs on the CPU: (C·KH·KW + O) · P·Q for Im2col —
// its columns, and its output (or dy) as rows of the GEMM that does several images at once
// (conv.cpp, "Several images in one GEMM"); 36·⌈H/4⌉·⌈W/4⌉·(C + O) for Winograd (winograd.h); 0
// for Pointwise and Depthwise.
KILN_CPU_KERNEL(int64_t conv2d_col_elems_per_image(const Conv2dParams& p, DType dtype));

// One image (or one group of channels of it), C channels of H×W:
//   col[(c·KH + kh)·KW + kw][p·Q + q] = x[c][ih][iw]   (pad where (ih, iw) is padding)
// col is [C·KH·KW, P·Q] with rows ld elements apart (ld ≥ P·Q: several images side by side).
// Only the H, W, KH, KW, stride, padding, dilation of p are used. T is a float type, or uint8_t
// for the int8 convolution (chapter 11), whose padding is the zero point z_x.
KILN_CPU_KERNEL(template <typename T> void im2col(const T* x, int64_t C, const Conv2dParams& p, T* col, int64_t ld,
                                                  T pad = T(0)));
// The adjoint of im2col: dx = 0, then dx[c][ih][iw] += col[...] for every column entry that
// im2col read from (c, ih, iw). dx is [C, H, W] and is overwritten. col is scratch: the entries
// that fell on padding may be set to 0 (conv.cpp says why).
KILN_CPU_KERNEL(template <typename T> void col2im(T* col, int64_t C, const Conv2dParams& p, T* dx, int64_t ld));

// ---- CUDA's strategy (cuda/conv.cu) ----------------------------------------------------------------
// The strategy: Depthwise, else ImplicitGemm.
KILN_CUDA_KERNEL(ConvAlgo conv2d_algo(const Conv2dParams& p));
// (C·KH·KW + O)·P·Q: one image's columns and its rows of y (or dy), the workspace of the im2col
// passes below (the engine's own passes, implicit GEMMs and depthwise, need none).
KILN_CUDA_KERNEL(int64_t conv2d_col_elems_per_image(const Conv2dParams& p));
// Each forward strategy by name, with conv2d_forward's arguments (so the kernel lab times them
// side by side; the implicit GEMM ignores col and col_images).
KILN_CUDA_KERNEL(template <typename T> void conv2d_forward_im2col(const T* x, const T* w, const T* b, T* y,
                                                                  const Conv2dParams& p, T* col,
                                                                  int64_t col_images));
KILN_CUDA_KERNEL(template <typename T> void conv2d_forward_implicit_gemm(const T* x, const T* w, const T* b, T* y,
                                                                         const Conv2dParams& p, T* col,
                                                                         int64_t col_images));
// The backward passes as chapter 05 first wrote them (im2col, col2im and GEMMs, in chunks of
// col_images images of the workspace), kept for the kernel lab beside the engine's implicit GEMMs.
KILN_CUDA_KERNEL(template <typename T> void conv2d_backward_data_im2col(const T* dy, const T* w, T* dx,
                                                                        const Conv2dParams& p, T* col,
                                                                        int64_t col_images));
KILN_CUDA_KERNEL(template <typename T> void conv2d_backward_weight_im2col(const T* x, const T* dy, T* dw, T* db,
                                                                          const Conv2dParams& p, T* col,
                                                                          int64_t col_images));

// The templates above that both backends define, for the kernel files' explicit instantiations
// (the float types): KILN_CONV_KERNELS(KILN_INSTANTIATE_FLOAT);
#define KILN_CONV_KERNELS(X)                                              \
    X(conv2d_forward); X(conv2d_backward_data); X(conv2d_backward_weight)

}  // namespace kiln
