// quant.cpp — chapter 11's Tensor-level ops: the checks, then the kernel of the tensors' device
// through on_backend (core/backend.h). The formulas are in ops/kernels/quant.h and ops/qparams.h.
#include "ops/quant.h"

#include <cmath>
#include <string>

#include "ops/kernels/quant.h"
#include "ops/params.h"

namespace kiln {

namespace {

// x viewed as [outer, C, inner] around dimension `axis` (−1: the whole tensor is one channel).
struct ChannelView {
    int64_t outer = 1, C = 1, inner = 1;
};

ChannelView channel_view(const Tensor& x, int axis, const char* op) {
    ChannelView v;
    if (axis < 0) {
        v.inner = x.numel();
        return v;
    }
    KILN_CHECK(axis < x.ndim(), op, ": axis ", axis, " is past the last dimension of ", x.desc(),
               "; weights are quantized per output channel, axis 0");
    for (int d = 0; d < axis; d++) v.outer *= x.size(d);
    v.C = x.size(axis);
    for (int d = axis + 1; d < x.ndim(); d++) v.inner *= x.size(d);
    return v;
}

// scale f32 [C] and zero_point i32 [C] on x's device.
void check_channel_params(const Tensor& x, const Tensor& scale, const Tensor& zero_point, int64_t C,
                          const char* op) {
    check_dtype(scale, DType::F32, op, "scale");
    check_dtype(zero_point, DType::I32, op, "zero_point");
    check_shape(scale, Shape{C}, op, "scale");
    check_shape(zero_point, Shape{C}, op, "zero_point");
    check_same_device(scale, x, op);
    check_same_device(zero_point, x, op);
}

void check_range_fits(int32_t qmin, int32_t qmax, DType dtype, const char* op) {
    KILN_CHECK(dtype == DType::U8 || dtype == DType::I8, op, ": quantizes to u8 or i8, not ", dtype_name(dtype));
    const int32_t lo = dtype == DType::U8 ? 0 : -128, hi = dtype == DType::U8 ? 255 : 127;
    KILN_CHECK(lo <= qmin && qmin <= qmax && qmax <= hi, op, ": the range [", qmin, ", ", qmax, "] does not fit ",
               dtype_name(dtype), " [", lo, ", ", hi, "]");
}

// An activation's values are all finite: a NaN or inf has no integer (and means a bug upstream).
void check_finite(const Tensor& x, const char* op) {
    const Tensor h = x.to(Device::CPU);
    const float* p = h.data<float>();
    for (int64_t i = 0; i < h.numel(); i++)
        KILN_CHECK(std::isfinite(p[i]), op, ": ", x.desc(), " holds ", p[i], " at element ", i,
                   "; quantization needs finite values — look for the layer that produced it");
}

QOutput kernel_output(const QLayerOutput& out, int64_t O, const Tensor& like, const char* op) {
    check_dtype(out.bias, DType::I32, op, "out.bias");
    check_dtype(out.requant, DType::I32, op, "out.requant");
    check_shape(out.bias, Shape{O}, op, "out.bias");
    check_shape(out.requant, Shape{O, 2}, op, "out.requant");
    check_same_device(out.bias, like, op);
    check_same_device(out.requant, like, op);
    KILN_CHECK(0 <= out.lo && out.lo <= out.zero_point && out.zero_point <= out.hi && out.hi <= 255, op,
               ": the output range lo ", out.lo, " ≤ zero_point ", out.zero_point, " ≤ hi ", out.hi,
               " must lie in [0, 255]");
    static_assert(sizeof(Requant) == 2 * sizeof(int32_t), "Requant is read as two int32 per channel");
    return QOutput{out.bias.data<int32_t>(), reinterpret_cast<const Requant*>(out.requant.data<int32_t>()),
                   out.zero_point, out.lo, out.hi};
}

// Runs f(Q{}) with Q the C++ type of an 8-bit dtype: uint8_t or int8_t (the kernels' two).
template <typename F> void for_int8(DType dtype, const char* op, const Tensor& t, F&& f) {
    KILN_CHECK(dtype == DType::U8 || dtype == DType::I8, op, ": '", t.desc(), "' should be u8 or i8");
    if (dtype == DType::U8) f(uint8_t{});
    else f(int8_t{});
}

}  // namespace

// ---- f32 <-> 8 bits ------------------------------------------------------------------------------
Tensor quantize(const Tensor& x, const QParams& qp, DType dtype) {
    const char* op = "quantize";
    check_dtype(x, DType::F32, op, "x");
    check_range_fits(qp.qmin, qp.qmax, dtype, op);
    check_finite(x, op);
    Tensor q = Tensor::empty(x.shape(), dtype, x.device(), Category::Activation);
    on_backend(x.device(), [&](auto be) {
        for_int8(dtype, op, q, [&](auto tag) {
            using Q = decltype(tag);
            kernel::quantize(be, x.data<float>(), q.data<Q>(), x.numel(), qp.scale, qp.zero_point, qp.qmin, qp.qmax);
        });
    });
    return q;
}

Tensor dequantize(const Tensor& q, const QParams& qp) {
    Tensor x = Tensor::empty(q.shape(), DType::F32, q.device(), Category::Activation);
    on_backend(q.device(), [&](auto be) {
        for_int8(q.dtype(), "dequantize", q, [&](auto tag) {
            using Q = decltype(tag);
            kernel::dequantize(be, q.data<Q>(), x.data<float>(), q.numel(), qp.scale, qp.zero_point);
        });
    });
    return x;
}

Tensor quantize_per_channel(const Tensor& x, const Tensor& scale, const Tensor& zero_point, int axis, int32_t qmin,
                            int32_t qmax, DType dtype) {
    const char* op = "quantize_per_channel";
    check_dtype(x, DType::F32, op, "x");
    check_range_fits(qmin, qmax, dtype, op);
    const ChannelView v = channel_view(x, axis, op);
    check_channel_params(x, scale, zero_point, v.C, op);
    check_finite(x, op);
    Tensor q = Tensor::empty(x.shape(), dtype, x.device(), Category::Parameter);
    on_backend(x.device(), [&](auto be) {
        for_int8(dtype, op, q, [&](auto tag) {
            using Q = decltype(tag);
            kernel::quantize_per_channel(be, x.data<float>(), q.data<Q>(), v.outer, v.C, v.inner, scale.data<float>(),
                                         zero_point.data<int32_t>(), qmin, qmax);
        });
    });
    return q;
}

Tensor dequantize_per_channel(const Tensor& q, const Tensor& scale, const Tensor& zero_point, int axis) {
    const char* op = "dequantize_per_channel";
    const ChannelView v = channel_view(q, axis, op);
    check_channel_params(q, scale, zero_point, v.C, op);
    Tensor x = Tensor::empty(q.shape(), DType::F32, q.device(), Category::Activation);
    on_backend(q.device(), [&](auto be) {
        for_int8(q.dtype(), op, q, [&](auto tag) {
            using Q = decltype(tag);
            kernel::dequantize_per_channel(be, q.data<Q>(), x.data<float>(), v.outer, v.C, v.inner,
                                           scale.data<float>(), zero_point.data<int32_t>());
        });
    });
    return x;
}

// ---- int8 layers ---------------------------------------------------------------------------------
Tensor qlinear(const Tensor& x, const Tensor& w, const QLayerOutput& out, int32_t x_max) {
    const char* op = "qlinear";
    check_dtype(x, DType::U8, op, "x");
    check_dtype(w, DType::I8, op, "w");
    KILN_CHECK(w.ndim() == 2, op, ": 'w' should be [out, in] but is ", w.desc());
    const int64_t O = w.size(0), K = w.size(1);
    KILN_CHECK(x.ndim() == 2 && x.size(1) == K, op, ": 'x' should be [N, ", K, "] for a weight ", w.desc(),
               " but is ", x.desc(), " (a Flatten before it turns [N, C, H, W] into [N, C·H·W])");
    check_same_device(w, x, op);
    const QOutput o = kernel_output(out, O, x, op);
    const int64_t N = x.size(0);
    const Device d = x.device();
    Tensor y = Tensor::empty({N, O}, DType::U8, d, Category::Activation);
    Tensor work = Tensor::empty({N, O}, DType::I32, d, Category::Workspace);
    on_backend(d, [&](auto be) {
        kernel::qlinear(be, x.data<uint8_t>(), w.data<int8_t>(), y.data<uint8_t>(), N, K, O, x_max, o,
                        work.data<int32_t>());
    });
    return y;
}

Tensor qconv2d(const Tensor& x, const Tensor& w, const QLayerOutput& out, int64_t stride, int64_t padding,
               int64_t dilation, int64_t groups, int32_t x_zero_point, int32_t x_max) {
    const char* op = "qconv2d";
    check_dtype(x, DType::U8, op, "x");
    check_dtype(w, DType::I8, op, "w");
    KILN_CHECK(x.ndim() == 4 && w.ndim() == 4 && groups > 0 && w.size(1) * groups == x.size(1), op,
               ": 'x' should be [N, C, H, W] and 'w' [O, C/groups, KH, KW] with groups=", groups,
               ", but they are ", x.desc(), " and ", w.desc());
    check_same_device(w, x, op);
    Conv2dParams p;
    p.N = x.size(0), p.C = x.size(1), p.H = x.size(2), p.W = x.size(3);
    p.O = w.size(0), p.KH = w.size(2), p.KW = w.size(3);
    p.stride = stride, p.padding = padding, p.dilation = dilation, p.groups = groups;
    check_conv2d_params(p, op);
    KILN_CHECK(groups == 1 || qconv2d_is_depthwise(p), op, ": groups=", groups,
               " but the int8 convolution takes groups 1 or depthwise (groups = C = O), and 'x' is ", x.desc(),
               ", 'w' ", w.desc());
    const QOutput o = kernel_output(out, p.O, x, op);
    const Device d = x.device();
    Tensor y = Tensor::empty({p.N, p.O, p.P(), p.Q()}, DType::U8, d, Category::Activation);
    on_backend(d, [&](auto be) {
        Tensor work = Tensor::empty({kernel::qconv2d_work_bytes(be, p)}, DType::U8, d, Category::Workspace);
        kernel::qconv2d(be, x.data<uint8_t>(), w.data<int8_t>(), y.data<uint8_t>(), p, x_zero_point, x_max, o,
                        work.data<uint8_t>());
    });
    return y;
}

Tensor qadd(const Tensor& a, const QParams& a_qp, const Tensor& b, const QParams& b_qp, const QParams& out) {
    const char* op = "qadd";
    check_dtype(a, DType::U8, op, "a");
    check_dtype(b, DType::U8, op, "b");
    check_shape(b, a.shape(), op, "b");
    check_same_device(b, a, op);
    const QAddParams q = qadd_params(a_qp, b_qp, out);
    Tensor y = Tensor::empty(a.shape(), DType::U8, a.device(), Category::Activation);
    on_backend(a.device(), [&](auto be) {
        kernel::qadd(be, a.data<uint8_t>(), b.data<uint8_t>(), y.data<uint8_t>(), a.numel(), q);
    });
    return y;
}

Tensor qmaxpool2d(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding) {
    const char* op = "qmaxpool2d";
    check_dtype(x, DType::U8, op, "x");
    KILN_CHECK(x.ndim() == 4, op, ": 'x' should be [N, C, H, W] but is ", x.desc());
    Pool2dParams p;
    p.N = x.size(0), p.C = x.size(1), p.H = x.size(2), p.W = x.size(3);
    p.KH = p.KW = kernel, p.stride = stride == 0 ? kernel : stride, p.padding = padding;
    KILN_CHECK(kernel > 0 && p.stride > 0 && padding >= 0 && 2 * padding <= kernel && p.P() > 0 && p.Q() > 0, op,
               ": a ", kernel, "×", kernel, " window with stride ", p.stride, " and padding ", padding,
               " does not fit ", x.desc());
    Tensor y = Tensor::empty({p.N, p.C, p.P(), p.Q()}, DType::U8, x.device(), Category::Activation);
    on_backend(x.device(), [&](auto be) { kernel::qmaxpool2d(be, x.data<uint8_t>(), y.data<uint8_t>(), p); });
    return y;
}

Tensor qglobal_avgpool(const Tensor& x) {
    const char* op = "qglobal_avgpool";
    check_dtype(x, DType::U8, op, "x");
    KILN_CHECK(x.ndim() == 4 && x.size(2) * x.size(3) > 0, op, ": 'x' should be [N, C, H, W] with H·W > 0 but is ",
               x.desc());
    const int64_t N = x.size(0), C = x.size(1);
    Tensor y = Tensor::empty({N, C}, DType::U8, x.device(), Category::Activation);
    on_backend(x.device(), [&](auto be) {
        kernel::qglobal_avgpool(be, x.data<uint8_t>(), y.data<uint8_t>(), N * C, x.size(2) * x.size(3));
    });
    return y;
}

Tensor lookup_u8(const Tensor& x, const Tensor& table) {
    const char* op = "lookup_u8";
    check_dtype(x, DType::U8, op, "x");
    check_dtype(table, DType::U8, op, "table");
    KILN_CHECK(x.ndim() >= 2, op, ": 'x' should be [N, C, ...] but is ", x.desc());
    KILN_CHECK(table.ndim() == 2 && table.size(1) == 256 && (table.size(0) == 1 || table.size(0) == x.size(1)), op,
               ": 'table' should be [1, 256] or [", x.size(1), ", 256] for ", x.desc(), " but is ", table.desc());
    check_same_device(table, x, op);
    const bool per_channel = table.size(0) > 1;
    const int64_t outer = per_channel ? x.size(0) : 1, C = per_channel ? x.size(1) : 1;
    Tensor y = Tensor::empty(x.shape(), DType::U8, x.device(), Category::Activation);
    on_backend(x.device(), [&](auto be) {
        kernel::lookup_u8(be, x.data<uint8_t>(), y.data<uint8_t>(), outer, C, x.numel() / (outer * C),
                          table.data<uint8_t>());
    });
    return y;
}

const char* int8_kernel_path(Device device, int32_t x_max) {
    return on_backend(device, [&](auto be) { return kernel::qgemm_path_for(be, x_max); });
}

bool reduced_range_is_faster(Device device) {
    return on_backend(device, [&](auto be) {
        return std::string(kernel::qgemm_path_for(be, kActQmaxReduced)) != kernel::qgemm_path_for(be, kActQmax);
    });
}

// ---- fake quantization ---------------------------------------------------------------------------
Tensor fake_quantize(const Tensor& x, const Tensor& scale, const Tensor& zero_point, int axis, int32_t qmin,
                     int32_t qmax) {
    const char* op = "fake_quantize";
    check_dtype(x, DType::F32, op, "x");
    const ChannelView v = channel_view(x, axis, op);
    check_channel_params(x, scale, zero_point, v.C, op);
    Tensor y = Tensor::empty(x.shape(), DType::F32, x.device(), Category::Activation);
    on_backend(x.device(), [&](auto be) {
        kernel::fake_quantize_forward(be, x.data<float>(), y.data<float>(), v.outer, v.C, v.inner, scale.data<float>(),
                                      zero_point.data<int32_t>(), qmin, qmax);
    });
    return y;
}

Tensor fake_quantize_backward(const Tensor& x, const Tensor& dy, const Tensor& scale, const Tensor& zero_point,
                              int axis, int32_t qmin, int32_t qmax) {
    const char* op = "fake_quantize_backward";
    check_dtype(x, DType::F32, op, "x");
    check_dtype(dy, DType::F32, op, "dy");
    check_shape(dy, x.shape(), op, "dy");
    check_same_device(dy, x, op);
    const ChannelView v = channel_view(x, axis, op);
    check_channel_params(x, scale, zero_point, v.C, op);
    Tensor dx = Tensor::empty(x.shape(), DType::F32, x.device(), Category::Activation);
    on_backend(x.device(), [&](auto be) {
        kernel::fake_quantize_backward(be, x.data<float>(), dy.data<float>(), dx.data<float>(), v.outer, v.C, v.inner,
                                       scale.data<float>(), zero_point.data<int32_t>(), qmin, qmax);
    });
    return dx;
}

}  // namespace kiln
