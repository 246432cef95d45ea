// conv.h — the 2-D convolution (chapters 03 and 05): the kernels' contract, declared once for
// both backends (core/backend.h; src/ops/cpu/conv.cpp ↔ cuda/conv.cu), then the ops on tensors
// that check their arguments and dispatch to those kernels: declared here, defined at the end of
// this file and compiled once, in src/ops/ops.cpp (KILN_DEFINE_OPS). The layer (nn/conv.h) calls
// the ops. Their sizes come in Conv2dParams (ops/params.h, with the formula; letters as there);
// how each backend computes them is in its file's header.
//
// T is float, f16 or bf16, the type of x, w, b, y (and dy, dx, dw, db) and of the workspace;
// products are summed in float and each result rounded to T once (cpu/conv.cpp says where a
// convolution rounds more than once). Every kernel gives the same bits on every run and, on the
// CPU, any thread count. Every tensor an op takes or returns has x's dtype (after autocast's
// cast): a mixed pair is an error naming the tensor.
//
// Autocast (ops/autocast.h): conv2d and conv2d_backward run in the class LowPrecision (the
// weights' low copies made once per step; the gradients added to the f32 ones). The ops take
// their outputs from the current allocator (Category::Activation), the im2col workspace from the
// device's pool (Category::Workspace).
#pragma once
#include <algorithm>
#include <cstdint>

#include "core/backend.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "ops/autocast.h"
#include "ops/check.h"
#include "ops/params.h"

namespace kiln {

// ==== the kernels ============================================================================
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


// ==== the ops on tensors =====================================================================
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


#ifdef KILN_DEFINE_OPS  // compiled once, in src/ops/ops.cpp (see there)
namespace kiln {

namespace detail {

template <typename T> const T* ptr_or_null(const Tensor& t) { return t.defined() ? t.data<T>() : nullptr; }
template <typename T> T* ptr_or_null(Tensor& t) { return t.defined() ? t.data<T>() : nullptr; }

// The kernel's sizes from x [N, C, H, W] and w [O, C/G, KH, KW], checked against each other.
Conv2dParams conv_params(const Tensor& x, const Tensor& w, const Conv2dArgs& a, const char* op) {
    KILN_CHECK(x.ndim() == 4, op, ": 'x' should be [N, C, H, W] but is ", x.desc());
    KILN_CHECK(w.ndim() == 4, op, ": 'w' should be [O, C/groups, KH, KW] but is ", w.desc());
    Conv2dParams p;
    p.N = x.size(0), p.C = x.size(1), p.H = x.size(2), p.W = x.size(3);
    p.O = w.size(0), p.KH = w.size(2), p.KW = w.size(3);
    p.stride = a.stride, p.padding = a.padding, p.dilation = a.dilation, p.groups = a.groups;
    KILN_CHECK(w.size(1) * a.groups == p.C, op, ": 'w' ", w.desc(), " has ", w.size(1),
               " input channels per group, so with groups=", a.groups, " 'x' should have ", w.size(1) * a.groups,
               " channels, but it is ", x.desc());
    check_conv2d_params(p, op);
    return p;
}

// A bias (or its gradient) is [O], or undefined: no bias.
void check_conv_bias(const Tensor& b, const Conv2dParams& p, const char* op, const char* name) {
    if (b.defined())
        KILN_CHECK(b.ndim() == 1 && b.size(0) == p.O, op, ": '", name, "' should be [", p.O, "] but is ", b.desc());
}

// The im2col columns (of x's dtype) for as many images as fit in `limit` bytes (at least one),
// on the device: a Workspace tensor freed when the caller's pass ends. It comes from the
// device's pool even inside a step's arena scope: an arena would keep every layer's workspace
// until the step ends, while the pool hands the same block to the next layer.
Tensor column_workspace(const Conv2dParams& p, const Tensor& x, bool forward, int64_t limit, int64_t* images) {
    const ConvWorkspace ws = conv2d_workspace(p, x.device(), forward, limit, x.dtype());
    *images = ws.images;
    if (ws.images == 0) return Tensor();
    AllocatorScope from_pool(pool_allocator(x.device()));
    return Tensor::empty({ws.images * ws.elems_per_image}, x.dtype(), x.device(), Category::Workspace);
}

}  // namespace detail

ConvWorkspace conv2d_workspace(const Conv2dParams& p, Device device, bool forward, int64_t limit, DType dtype) {
    return on_backend(device, [&](auto be) {
        const int64_t per_image = kernel::conv2d_workspace_per_image(be, p, dtype, forward);
        const int64_t elem_bytes = int64_t(dtype_size(dtype));
        if (per_image == 0 || p.N == 0) return ConvWorkspace{0, 0, elem_bytes};
        const int64_t fit = std::clamp<int64_t>(limit / (per_image * elem_bytes), 1, p.N);
        return ConvWorkspace{kernel::conv2d_chunk_images(be, p, dtype, fit), per_image, elem_bytes};
    });
}

int64_t conv2d_backward_scratch(const Conv2dParams& p, Device device) {
    return on_backend(device, [&](auto be) { return kernel::conv2d_backward_weight_scratch(be, p); });
}

Tensor conv2d(const Tensor& x_in, const Tensor& w_in, const Tensor& b_in, const Conv2dArgs& a, Tensor* saved_x) {
    const AmpCast amp(CastPolicy::LowPrecision, x_in.dtype());
    const Tensor x = amp.input(x_in), w = amp.weight(w_in), b = amp.weight(b_in);
    const Device d = check_args("conv2d", {{x, "x"}, {w, "w"}});
    if (b.defined()) check_args("conv2d", {{x, "x"}, {b, "b"}});
    const Conv2dParams p = detail::conv_params(x, w, a, "conv2d");
    detail::check_conv_bias(b, p, "conv2d", "b");
    Tensor y = Tensor::empty({p.N, p.O, p.P(), p.Q()}, x.dtype(), d, Category::Activation);
    int64_t images = 0;
    Tensor col = detail::column_workspace(p, x, true, a.workspace_limit, &images);
    dispatch(d, x.dtype(), [&](auto be, auto tag) {
        using T = decltype(tag);
        kernel::conv2d_forward(be, x.data<T>(), w.data<T>(), detail::ptr_or_null<T>(b), y.data<T>(), p,
                               detail::ptr_or_null<T>(col), images);
    });
    if (saved_x) *saved_x = x;
    return y;
}

Tensor conv2d_backward(const Tensor& x_in, const Tensor& w_in, const Tensor& dy_in, Tensor& dw_grad, Tensor& db_grad,
                       bool need_dx, const Conv2dArgs& a) {
    const char* op = "conv2d_backward";
    const AmpCast amp(CastPolicy::LowPrecision, x_in.dtype());
    const Tensor x = amp.input(x_in), w = amp.weight(w_in), dy = amp.input(dy_in);
    // dw and db in the forward's type; under autocast, low copies added to the f32 grads after
    GradInto gw(dw_grad, amp), gb(db_grad, amp);
    Tensor &dw = gw.target(), &db = gb.target();
    const Device d = check_args(op, {{x, "x"}, {w, "w"}, {dy, "dy"}, {dw, "dw"}});
    if (db.defined()) check_args(op, {{x, "x"}, {db, "db"}});
    const Conv2dParams p = detail::conv_params(x, w, a, op);
    check_shape(dy, Shape{p.N, p.O, p.P(), p.Q()}, op, "dy");
    check_shape(dw, w.shape(), op, "dw");
    detail::check_conv_bias(db, p, op, "db");
    int64_t images = 0;
    Tensor col = detail::column_workspace(p, x, false, a.workspace_limit, &images);  // shared by the two passes
    Tensor dx = need_dx ? Tensor::empty(x.shape(), x.dtype(), d, Category::Activation) : Tensor();
    dispatch(d, x.dtype(), [&](auto be, auto tag) {
        using T = decltype(tag);
        T* ws = detail::ptr_or_null<T>(col);
        // dw += Σ_n dy_n ⋆ x_n,  db += Σ dy
        kernel::conv2d_backward_weight(be, x.data<T>(), dy.data<T>(), dw.data<T>(), detail::ptr_or_null<T>(db), p, ws,
                                       images);
        // dx = conv_transpose(dy, w)
        if (need_dx) kernel::conv2d_backward_data(be, dy.data<T>(), w.data<T>(), dx.data<T>(), p, ws, images);
    });
    col = Tensor();  // the workspace goes back to the pool before the low gradients are widened
    gw.add_to_grad();
    gb.add_to_grad();
    return dx;
}

}  // namespace kiln
#endif  // KILN_DEFINE_OPS
