// cnn.cpp — argument checks and the dispatch for every operation in cnn.h.
//
// Each op has the same shape: check the tensors (once, here: the kernels trust their pointers),
// fill the kernel's params struct from the shapes, take the outputs from the current allocator,
// then call the kernel through dispatch (core/backend.h), which picks the backend by the device
// and the instantiation by the element type T (float, f16 or bf16). Every tensor of an op has
// x's dtype.
#include "ops/cnn.h"

#include <algorithm>

#include "ops/autocast.h"
#include "ops/check.h"
#include "ops/kernels/conv.h"

namespace kiln {

namespace {

template <typename T> const T* ptr_or_null(const Tensor& t) { return t.defined() ? t.data<T>() : nullptr; }
template <typename T> T* ptr_or_null(Tensor& t) { return t.defined() ? t.data<T>() : nullptr; }

// ---- convolution ---------------------------------------------------------------------------------
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

}  // namespace

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
    const Conv2dParams p = conv_params(x, w, a, "conv2d");
    check_conv_bias(b, p, "conv2d", "b");
    Tensor y = Tensor::empty({p.N, p.O, p.P(), p.Q()}, x.dtype(), d, Category::Activation);
    int64_t images = 0;
    Tensor col = column_workspace(p, x, true, a.workspace_limit, &images);
    dispatch(d, x.dtype(), [&](auto be, auto tag) {
        using T = decltype(tag);
        kernel::conv2d_forward(be, x.data<T>(), w.data<T>(), ptr_or_null<T>(b), y.data<T>(), p, ptr_or_null<T>(col),
                               images);
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
    const Conv2dParams p = conv_params(x, w, a, op);
    check_shape(dy, Shape{p.N, p.O, p.P(), p.Q()}, op, "dy");
    check_shape(dw, w.shape(), op, "dw");
    check_conv_bias(db, p, op, "db");
    int64_t images = 0;
    Tensor col = column_workspace(p, x, false, a.workspace_limit, &images);  // shared by the two passes
    Tensor dx = need_dx ? Tensor::empty(x.shape(), x.dtype(), d, Category::Activation) : Tensor();
    dispatch(d, x.dtype(), [&](auto be, auto tag) {
        using T = decltype(tag);
        T* ws = ptr_or_null<T>(col);
        // dw += Σ_n dy_n ⋆ x_n,  db += Σ dy
        kernel::conv2d_backward_weight(be, x.data<T>(), dy.data<T>(), dw.data<T>(), ptr_or_null<T>(db), p, ws, images);
        // dx = conv_transpose(dy, w)
        if (need_dx) kernel::conv2d_backward_data(be, dy.data<T>(), w.data<T>(), dx.data<T>(), p, ws, images);
    });
    col = Tensor();  // the workspace goes back to the pool before the low gradients are widened
    gw.add_to_grad();
    gb.add_to_grad();
    return dx;
}

}  // namespace kiln
