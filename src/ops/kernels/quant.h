// quant.h — the kernels of int8 inference and of quantization-aware training (chapter 11),
// declared once for both backends (core/backend.h): src/ops/cpu/quant.cpp (and qgemm.cpp, the
// int8 GEMM) ↔ cuda/quant.cu. The arithmetic (quantize_value, requantize_value, Requant) is in
// ops/qparams.h; the Tensor-level ops that check shapes and pick a backend are in ops/quant.h.
// Integer kernels give exactly the same integers on both backends and for every thread count and
// CPU path: integer sums do not depend on their order.
//
// Types: activations u8 (asymmetric, zero point z_x), weights i8 (symmetric, zero point 0),
// accumulators int32. Letters as in ops/params.h (N, C, H, W, O, KH, KW, P, Q).
#pragma once
#include <cstdint>

#include "core/backend.h"
#include "ops/params.h"
#include "ops/qparams.h"

namespace kiln {

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

}  // namespace kiln
