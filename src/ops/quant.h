// quant.h — the Tensor-level ops of int8 inference and quantization-aware training (chapter 11):
// each checks its tensors' dtypes, shapes and devices once, then calls the CPU kernel
// (ops/kernels/quant.h, which has the formulas) or its CUDA twin (cuda/quant.cu).
//
//   f32 ──quantize──> u8 ──qconv2d / qlinear──> u8 ──qmaxpool2d, qglobal_avgpool, lookup_u8, qadd──> u8
//       ──dequantize──> f32
//
// Activations are u8 with one (scale, zero point) per tensor; weights are i8, symmetric, one
// scale per output channel; a layer's bias and requantization come in a QLayerOutput.
#pragma once
#include <cstdint>

#include "core/tensor.h"
#include "ops/qparams.h"

namespace kiln {

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
// What turns a layer's int32 accumulators into its u8 output (ops/kernels/quant.h, QOutput):
// bias i32 [O] (the real bias and the input zero point's correction, folded), requant i32 [O, 2]
// (the Requant {m0, shift} of each channel), the output's zero point and clamp range. The
// tensors are on the layer's device.
struct QLayerOutput {
    Tensor bias, requant;
    int32_t zero_point = 0, lo = 0, hi = 255;
};
// x_max is the largest value x may hold (its qmax: 255, or 127 with reduce_range); it lets a
// CPU path whose 16-bit sums would saturate on larger values run (ops/kernels/quant.h).
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
// formula is ops/kernels/quant.h's QAddParams), so the CPU and CUDA give the same integers; within
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
