// quant.h — the quant family (chapter 11): the kernels of int8 inference and of
// quantization-aware training, declared once for both backends (core/backend.h):
// src/ops/cpu/quant.cpp (and qgemm.cpp, the int8 GEMM) ↔ cuda/quant.cu; then the Tensor-level ops:
// each checks its tensors' dtypes, shapes and devices once, then runs the kernel of the tensors'
// device. The ops take u8, i8 and f32 tensors of fixed types and name no autocast class
// (ops/autocast.h). The arithmetic (quantize_value, requantize_value, Requant) is in
// ops/qparams.h.
//
//   f32 ──quantize──> u8 ──qconv2d / qlinear──> u8 ──qmaxpool2d, qglobal_avgpool, lookup_u8, qadd──> u8
//       ──dequantize──> f32
//
// Activations are u8 with one (scale, zero point) per tensor; weights are i8, symmetric, one
// scale per output channel; a layer's bias and requantization come in a QLayerOutput.
//
// Integer kernels give exactly the same integers on both backends and for every thread count and
// CPU path: integer sums do not depend on their order.
//
// Types: activations u8 (asymmetric, zero point z_x), weights i8 (symmetric, zero point 0),
// accumulators int32. Letters as in ops/params.h (N, C, H, W, O, KH, KW, P, Q).
#pragma once
#include <cstdint>

#include "core/backend.h"
#include "core/tensor.h"
#include "ops/params.h"
#include "ops/qparams.h"

namespace kiln {

// ==== the kernels ================================================================================
// ==== from int32 accumulators to the next layer's u8 (both backends) =============================
// Per output channel o: bias[o] (int32: round(b / (s_x·s_w[o])) − z_x·Σ_k w[o, k]) and the
// multiplier requant[o] = s_x·s_w[o] / s_y in fixed point; one zero point z_y and a clamp range
// [lo, hi] ⊆ [0, 255] for the output (lo = z_y when a ReLU is fused: max(0, y) in u8 is
// max(z_y, q)). Pointers are on the kernel's device.
struct QOutput {
    const int32_t* bias = nullptr;     // [O]
    const Requant* requant = nullptr;  // [O]
    int32_t zero_point = 0;
    int32_t lo = 0, hi = 255;
};

// ==== the two int8 convolutions (both backends) ==================================================
// Whether qconv2d takes p as depthwise (groups = C = O > 1: one KH×KW filter per channel) rather
// than as a product over all C channels (groups = 1). Any other groups is refused.
inline bool qconv2d_is_depthwise(const Conv2dParams& p) { return p.groups > 1 && p.groups == p.C && p.O == p.C; }

// ==== the sum of two u8 tensors, each with its own range (a residual connection's add) ===========
//   y = clamp(z_y + round((s_a·(a − z_a) + s_b·(b − z_b)) / s_y), qmin, qmax)
// in fixed point, as TFLite's quantized ADD: with m = 2·max(s_a, s_b) and 20 bits of headroom,
//   a' = round((a − z_a)·2^20 · s_a/m)          s_a/m ≤ 1/2: |a'| < 2^27
//   b' = round((b − z_b)·2^20 · s_b/m)
//   y  = clamp(z_y + round((a' + b') · m/(2^20·s_y)), qmin, qmax)
// each multiplier a Requant and each round apply_requant's (half up), so both backends give the
// same integers. Within 1 of the formula in double, when the three scales lie within a factor
// kQAddMaxScaleRatio = 2^12 of each other (qadd_params refuses others): the multipliers are exact
// to 2^-31 relative, so a' and b' are each within 1/2 + 2^27·2^-31 = 9/16 of their exact values,
// and with m/(2^20·s_y) ≤ 2^-7 the value rounded last is within 1.125·2^-7 + 2^21·2^-31 of the
// exact quotient (whose size is at most 510·2^12 < 2^21); two values less than 1 apart round to
// integers at most 1 apart, and the clamp keeps them so. The ratio also keeps every multiplier
// in apply_requant's range: s_a/m, s_b/m ≥ 2^-13 and m/(2^20·s_y) ≥ 2^-31.
constexpr int kQAddShift = 20;
constexpr double kQAddMaxScaleRatio = 4096.0;

struct QAddParams {
    int32_t a_zero_point = 0, b_zero_point = 0;
    Requant a_mult, b_mult, y_mult;  // s_a/m, s_b/m, m/(2^20·s_y)
    int32_t y_zero_point = 0, qmin = 0, qmax = 255;
};

// The fixed-point numbers of a, b and out's QParams; a kiln::Error naming qadd for a scale that is
// not positive and finite, scales further apart than kQAddMaxScaleRatio, an input zero point
// outside [0, 255] or an output range that is not 0 ≤ qmin ≤ zero_point ≤ qmax ≤ 255.
QAddParams qadd_params(const QParams& a, const QParams& b, const QParams& out);

// The formula above for one pair (a, b): both twins call it. (a − z_a)·2^20 is exact in int32.
KILN_HOST_DEVICE inline uint8_t qadd_value(int32_t a, int32_t b, const QAddParams& q) {
    const int32_t a2 = apply_requant((a - q.a_zero_point) * (1 << kQAddShift), q.a_mult);
    const int32_t b2 = apply_requant((b - q.b_zero_point) * (1 << kQAddShift), q.b_mult);
    return requantize_value(a2 + b2, q.y_mult, q.y_zero_point, q.qmin, q.qmax);
}

// ==== quantize / dequantize (ops/qparams.h has the formulas) ==================================
// Per tensor: x f32 [n] <-> q [n], Q = uint8_t or int8_t.
KILN_KERNEL(quantize, template <typename Q> void quantize(const float* x, Q* q, int64_t n, float scale,
                                                          int32_t zero_point, int32_t qmin, int32_t qmax));
KILN_KERNEL(dequantize,
            template <typename Q> void dequantize(const Q* q, float* x, int64_t n, float scale, int32_t zero_point));
// Per channel: x viewed as [outer, C, inner], channel c with scale[c] and zero_point[c] (a
// conv weight [O, C, KH, KW] along dim 0: outer = 1, C = O, inner = C·KH·KW).
KILN_KERNEL(quantize_per_channel,
            template <typename Q>
            void quantize_per_channel(const float* x, Q* q, int64_t outer, int64_t C, int64_t inner, const float* scale,
                                      const int32_t* zero_point, int32_t qmin, int32_t qmax));
KILN_KERNEL(dequantize_per_channel,
            template <typename Q>
            void dequantize_per_channel(const Q* q, float* x, int64_t outer, int64_t C, int64_t inner,
                                        const float* scale, const int32_t* zero_point));

// ==== int8 matrix product ========================================================================
// C[m, n] = Σ_k A[m, k] · B[n, k]        A u8 [M, K] (row stride lda), B i8 [N, K] (row stride ldb),
//                                        C int32 [M, N] (row stride ldc), overwritten
// Both operands are read along k (B is a Linear's weight [out, in] as stored). Exact: no
// rounding, no overflow while K·255·128 < 2^31 (K < 65793). a_max is the largest value A may
// hold (255, or 127 for reduce_range): a fast path whose 16-bit pair sums would saturate on
// larger values is taken only when a_max ≤ 127 (ops/cpu/qgemm.cpp).
KILN_KERNEL(qgemm_u8s8, void qgemm_u8s8(int64_t M, int64_t N, int64_t K, const uint8_t* A, int64_t lda, const int8_t* B,
                                        int64_t ldb, int32_t* C, int64_t ldc, int32_t a_max));
// C[m, n] = Σ_k A[m, k] · B[k, n]        A i8 [M, K] (row stride lda), B u8 [K, N] (row stride ldb),
//                                        C int32 [M, N] (row stride ldc), overwritten
// The weights first: a convolution's w [O, C·KH·KW] times one image's pixels [C·KH·KW, P·Q] (the
// image itself for a 1×1 conv, else its im2col), C a row per output channel, as y lies. The same
// exactness and K bound; b_max is the largest value B may hold (255, or 127 for reduce_range).
KILN_CPU_KERNEL(void qgemm_s8u8(int64_t M, int64_t N, int64_t K, const int8_t* A, int64_t lda, const uint8_t* B,
                                int64_t ldb, int32_t* C, int64_t ldc, int32_t b_max));
// The name of the path qgemm_u8s8 takes for A's values up to a_max: the CPU's, picked at run time
// from what it reports (ops/cpu/qgemm.h: "avx512-vnni", "avx2-maddubs", ...), or CUDA's "dp4a".
KILN_KERNEL(qgemm_path_for, const char* qgemm_path_for(int32_t a_max));
// The triple loop qgemm_u8s8 is tested against (tests only).
KILN_CPU_KERNEL(void qgemm_u8s8_reference(int64_t M, int64_t N, int64_t K, const uint8_t* A, int64_t lda,
                                          const int8_t* B, int64_t ldb, int32_t* C, int64_t ldc));

// ==== requantization (QOutput: above) =============================================================
// Rows of M accumulators, channels along the row (a Linear's output [N, O]):
//   y[m, o] = clamp(z_y + round((acc[m, o] + bias[o]) · M_o), lo, hi)
KILN_KERNEL(requantize_rows,
            void requantize_rows(const int32_t* acc, uint8_t* y, int64_t M, int64_t O, const QOutput& out));

// ==== int8 layers ===============================================================================
// y [N, O] u8 = requantize(x [N, K] u8 · w [O, K]ᵀ i8): a quantized Linear.
// work: N·O int32 of workspace (the accumulators).
KILN_KERNEL(qlinear, void qlinear(const uint8_t* x, const int8_t* w, uint8_t* y, int64_t N, int64_t K, int64_t O,
                                  int32_t x_max, const QOutput& out, int32_t* work));

// y [N, O, P, Q] u8 = requantize(conv(x [N, C, H, W] u8, w [O, C/G, KH, KW] i8)), groups = 1 or
// depthwise (qconv2d_is_depthwise: G = C = O, w [C, 1, KH, KW], output channel c reads channel c
// only): padding reads as z_x (the u8 of the real value 0), so the zero-point correction in bias
// holds at the borders too.
// work: qconv2d_work_bytes(p) bytes of workspace; it depends on the sizes p only, never on the
// thread count (the CPU kernel: the im2col columns and accumulators of a group of images — one
// image, or several small ones side by side — for each of up to 16 groups in flight; the
// accumulators alone for a 1×1 conv with stride 1 and no padding on planes of 256 or more;
// depthwise: none, 0).
KILN_KERNEL(qconv2d_work_bytes, int64_t qconv2d_work_bytes(const Conv2dParams& p));
KILN_KERNEL(qconv2d, void qconv2d(const uint8_t* x, const int8_t* w, uint8_t* y, const Conv2dParams& p,
                                  int32_t x_zero_point, int32_t x_max, const QOutput& out, uint8_t* work));

// Max pooling on u8 (padding never wins): the max of quantized values is the quantized max,
// since q ↦ s·(q − z) is increasing; y keeps x's scale and zero point.
KILN_KERNEL(qmaxpool2d, void qmaxpool2d(const uint8_t* x, uint8_t* y, const Pool2dParams& p));

// Global average pooling on u8, x [NC, S] (S = H·W) → y [NC]:
//   y[i] = round-half-up(Σ_s x[i, s] / S) = (Σ_s x[i, s] + ⌊S/2⌋) / S   in integers (an odd S has
// no ties); y keeps x's scale and zero point: the mean of s·(q − z) is s·(mean q − z).
KILN_KERNEL(qglobal_avgpool, void qglobal_avgpool(const uint8_t* x, uint8_t* y, int64_t NC, int64_t S));

// y[i] = qadd_value(a[i], b[i], q) for i < n (QAddParams: above).
KILN_KERNEL(qadd, void qadd(const uint8_t* a, const uint8_t* b, uint8_t* y, int64_t n, const QAddParams& q));

// Any function of one value, as a table: y[i] = table[c][x[i]], x viewed as [outer, C, inner]
// and table [C, 256] (C = 1: one table for the whole tensor). A unary op (GELU, ReLU, a batch
// norm's per-channel affine, or both) on u8 in and u8 out has only 256 possible inputs per
// channel, so its table is computed once (quant/convert.cpp, make_table) and applied with one load per value.
KILN_KERNEL(lookup_u8, void lookup_u8(const uint8_t* x, uint8_t* y, int64_t outer, int64_t C, int64_t inner,
                                      const uint8_t* table));

// ==== fake quantization (quantization-aware training) ===========================================
// Forward: y = (clamp(round(x / s) + z, qmin, qmax) − z) · s, i.e. dequantize(quantize(x)), in f32.
// Backward (straight-through estimator, as PyTorch's fake_quantize_*_affine): the rounding is
// treated as the identity, the clamp is not:
//   dx = dy where qmin ≤ round(x / s) + z ≤ qmax, 0 elsewhere.
// Per channel with x viewed as [outer, C, inner] and scale[c], zero_point[c]; per tensor: C = 1.
KILN_KERNEL(fake_quantize_forward,
            void fake_quantize_forward(const float* x, float* y, int64_t outer, int64_t C, int64_t inner,
                                       const float* scale, const int32_t* zero_point, int32_t qmin, int32_t qmax));
KILN_KERNEL(fake_quantize_backward,
            void fake_quantize_backward(const float* x, const float* dy, float* dx, int64_t outer, int64_t C,
                                        int64_t inner, const float* scale, const int32_t* zero_point, int32_t qmin,
                                        int32_t qmax));

// The templates above that both backends define, for the kernel files' explicit instantiations
// (u8 and i8): KILN_QUANTIZE_KERNELS(KILN_INSTANTIATE_INT8);
#define KILN_QUANTIZE_KERNELS(X)                                                   \
    X(quantize); X(dequantize); X(quantize_per_channel); X(dequantize_per_channel)


// ==== the ops on tensors =========================================================================
// ---- f32 <-> 8 bits ------------------------------------------------------------------------------
// Per tensor: q = clamp(round(x / scale) + zero_point, qp.qmin, qp.qmax) as `dtype` (U8 or I8;
// the range must fit it). x f32; a NaN in x is an error naming the op (a NaN has no integer).
Tensor quantize(const Tensor& x, const QParams& qp, DType dtype);
// x ≈ scale · (q − zero_point), f32, q u8 or i8.
Tensor dequantize(const Tensor& q, const QParams& qp);
// Per channel along `axis` (a weight [O, C, KH, KW] along 0): scale f32 [size(axis)] and
// zero_point i32 [size(axis)] on x's device, one range [qmin, qmax] for all channels.
Tensor quantize_per_channel(const Tensor& x, const Tensor& scale, const Tensor& zero_point, int axis, int32_t qmin,
                            int32_t qmax, DType dtype);
Tensor dequantize_per_channel(const Tensor& q, const Tensor& scale, const Tensor& zero_point, int axis);

// ---- int8 layers ---------------------------------------------------------------------------------
// What turns a layer's int32 accumulators into its u8 output (the kernels' QOutput, above):
// bias i32 [O] (the real bias and the input zero point's correction, folded), requant i32 [O, 2]
// (the Requant {m0, shift} of each channel), the output's zero point and clamp range. The
// tensors are on the layer's device.
struct QLayerOutput {
    Tensor bias, requant;
    int32_t zero_point = 0, lo = 0, hi = 255;
};
// x_max is the largest value x may hold (its qmax: 255, or 127 with reduce_range); it lets a
// CPU path whose 16-bit sums would saturate on larger values run (qgemm_u8s8, above).
// y u8 [N, O] from x u8 [N, K] and w i8 [O, K].
Tensor qlinear(const Tensor& x, const Tensor& w, const QLayerOutput& out, int32_t x_max);
// y u8 [N, O, P, Q] from x u8 [N, C, H, W] and w i8 [O, C/groups, KH, KW]: groups 1, or
// depthwise (groups = C = O, w [C, 1, KH, KW]); other groups are an error naming the op.
// padding reads as x_zero_point.
Tensor qconv2d(const Tensor& x, const Tensor& w, const QLayerOutput& out, int64_t stride, int64_t padding,
               int64_t dilation, int64_t groups, int32_t x_zero_point, int32_t x_max);
// The sum of two u8 tensors of the same shape and device with their own ranges, into a third
// range (a residual connection's add):
//   y = clamp(z_y + round((s_a·(a − z_a) + s_b·(b − z_b)) / s_y), out.qmin, out.qmax)
// in integer arithmetic (fixed-point multipliers, ops/qparams.h's Requant / make_requant; the
// formula is above, at QAddParams), so the CPU and CUDA give the same integers; within
// 1 of the formula evaluated in double. Scales more than 4096 times apart are an error.
Tensor qadd(const Tensor& a, const QParams& a_qp, const Tensor& b, const QParams& b_qp, const QParams& out);
// u8 max pooling (stride 0 means stride = kernel); y keeps x's scale and zero point.
Tensor qmaxpool2d(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding);
// Global average pooling on u8: y[n, c] = round-half-up(Σ_hw x[n, c, h, w] / (H·W)), x u8 [N, C, H, W] → y u8
// [N, C]; y keeps x's scale and zero point (the mean of s·(q − z) is s·(mean q − z)).
Tensor qglobal_avgpool(const Tensor& x);
// y[n, c, ...] = table[c][x[n, c, ...]] with table u8 [C, 256] (C = x.size(1), per channel) or
// [1, 256] (one table for every value). x u8 of rank ≥ 2 ([N, C] or [N, C, H, W]).
Tensor lookup_u8(const Tensor& x, const Tensor& table);

// Which int8 product runs on `device` for inputs of at most x_max (255, or 127 with reduce_range):
// on the CPU ops/cpu/qgemm.h's path ("avx512-vnni", "avx-vnni", "avx2-maddubs", "avx2-madd",
// "portable"), on CUDA "dp4a". And whether a reduced range (7-bit activations) picks a faster
// one: on a CPU with AVX2 but no VNNI, where vpmaddubsw's 16-bit sums need it.
const char* int8_kernel_path(Device device, int32_t x_max);
bool reduced_range_is_faster(Device device);

// ---- fake quantization (quantization-aware training) ----------------------------------------------
// y = dequantize(quantize(x)) in f32, per channel along `axis` (scale f32, zero_point i32, both
// [x.size(axis)]), or per tensor with axis = −1 and scale, zero_point of one element.
// fake_quantize_backward gives dx = dy where x quantized inside [qmin, qmax], 0 elsewhere.
Tensor fake_quantize(const Tensor& x, const Tensor& scale, const Tensor& zero_point, int axis, int32_t qmin,
                     int32_t qmax);
Tensor fake_quantize_backward(const Tensor& x, const Tensor& dy, const Tensor& scale, const Tensor& zero_point,
                              int axis, int32_t qmin, int32_t qmax);

}  // namespace kiln

// ==== the definitions ============================================================================
// The checks, then the kernel of the tensors' device through on_backend (core/backend.h).
#ifdef KILN_DEFINE_OPS  // compiled once, in src/ops/ops.cpp (see there)
#include <cmath>
#include <string>

namespace kiln {

namespace detail {

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

}  // namespace detail

// ---- f32 <-> 8 bits ------------------------------------------------------------------------------
Tensor quantize(const Tensor& x, const QParams& qp, DType dtype) {
    const char* op = "quantize";
    check_dtype(x, DType::F32, op, "x");
    detail::check_range_fits(qp.qmin, qp.qmax, dtype, op);
    detail::check_finite(x, op);
    Tensor q = Tensor::empty(x.shape(), dtype, x.device(), Category::Activation);
    on_backend(x.device(), [&](auto be) {
        detail::for_int8(dtype, op, q, [&](auto tag) {
            using Q = decltype(tag);
            kernel::quantize(be, x.data<float>(), q.data<Q>(), x.numel(), qp.scale, qp.zero_point, qp.qmin, qp.qmax);
        });
    });
    return q;
}

Tensor dequantize(const Tensor& q, const QParams& qp) {
    Tensor x = Tensor::empty(q.shape(), DType::F32, q.device(), Category::Activation);
    on_backend(q.device(), [&](auto be) {
        detail::for_int8(q.dtype(), "dequantize", q, [&](auto tag) {
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
    detail::check_range_fits(qmin, qmax, dtype, op);
    const detail::ChannelView v = detail::channel_view(x, axis, op);
    detail::check_channel_params(x, scale, zero_point, v.C, op);
    detail::check_finite(x, op);
    Tensor q = Tensor::empty(x.shape(), dtype, x.device(), Category::Parameter);
    on_backend(x.device(), [&](auto be) {
        detail::for_int8(dtype, op, q, [&](auto tag) {
            using Q = decltype(tag);
            kernel::quantize_per_channel(be, x.data<float>(), q.data<Q>(), v.outer, v.C, v.inner, scale.data<float>(),
                                         zero_point.data<int32_t>(), qmin, qmax);
        });
    });
    return q;
}

Tensor dequantize_per_channel(const Tensor& q, const Tensor& scale, const Tensor& zero_point, int axis) {
    const char* op = "dequantize_per_channel";
    const detail::ChannelView v = detail::channel_view(q, axis, op);
    detail::check_channel_params(q, scale, zero_point, v.C, op);
    Tensor x = Tensor::empty(q.shape(), DType::F32, q.device(), Category::Activation);
    on_backend(q.device(), [&](auto be) {
        detail::for_int8(q.dtype(), op, q, [&](auto tag) {
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
    const QOutput o = detail::kernel_output(out, O, x, op);
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
    const QOutput o = detail::kernel_output(out, p.O, x, op);
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
    const detail::ChannelView v = detail::channel_view(x, axis, op);
    detail::check_channel_params(x, scale, zero_point, v.C, op);
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
    const detail::ChannelView v = detail::channel_view(x, axis, op);
    detail::check_channel_params(x, scale, zero_point, v.C, op);
    Tensor dx = Tensor::empty(x.shape(), DType::F32, x.device(), Category::Activation);
    on_backend(x.device(), [&](auto be) {
        kernel::fake_quantize_backward(be, x.data<float>(), dy.data<float>(), dx.data<float>(), v.outer, v.C, v.inner,
                                       scale.data<float>(), zero_point.data<int32_t>(), qmin, qmax);
    });
    return dx;
}

}  // namespace kiln
#endif  // KILN_DEFINE_OPS
