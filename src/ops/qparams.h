// qparams.h — the arithmetic of affine quantization (chapter 11): how a real number becomes an
// 8-bit integer and back, and how an int32 sum of products becomes the next layer's 8-bit input
// with integer operations only. Everything here is inline and runs the same on the CPU, in CUDA
// device code and on the kernel emulator, so the two backends' int8 kernels give the same bits.
//
// ---- Affine quantization (PyTorch's torch/ao/quantization/observer.py) ----------------------
// A tensor whose values lie in [min, max] is stored as integers q in [qmin, qmax]:
//   x ≈ scale · (q − zero_point)                                     dequantize
//   q = clamp(round(x · (1/scale)) + zero_point, qmin, qmax)          quantize
// round is to nearest, ties to even (std::nearbyint); 1/scale is taken in float, as ATen's
// quantize_val does, so kiln's q are PyTorch's q for the same scale and zero point.
//
// Activations: u8, affine per tensor (qmin = 0, qmax = 255, or 127 with a reduced range):
//   min' = min(min, 0), max' = max(max, 0)                 the range always contains 0, so that
//   scale = (max' − min') / (qmax − qmin)                  0 (ReLU's output, zero padding) is
//   zero_point = clamp(qmin − round(min' / scale), qmin, qmax)   exactly representable
// Weights: i8, symmetric per output channel (zero_point 0, qmin = −128, qmax = 127):
//   scale[c] = max(|min_c|, |max_c|) / ((qmax − qmin) / 2) = amax_c / 127.5
// A scale of 0 (an all-zero range) becomes PyTorch's eps, float32's epsilon (2^-23).
//
// ---- Requantization, integer only ------------------------------------------------------------
// A layer y = Σ_k w·x + b with x = s_x·(q_x − z_x), w = s_w·q_w, y = s_y·(q_y − z_y) gives
//   q_y = z_y + (s_x·s_w / s_y) · (Σ_k q_w·q_x − z_x·Σ_k q_w + b / (s_x·s_w))
//       = z_y + M · acc,      acc = Σ_k q_w·q_x + bias_q   (int32; bias_q folds −z_x·Σ q_w in)
// The real multiplier M (usually < 1) is stored as a 31-bit fraction and a shift, as gemmlowp
// and TFLite do:  M = m0 · 2^(−31 − shift),  2^30 ≤ m0 < 2^31,  so  M · acc is
//   (acc · m0) >> (31 + shift)  rounded half up (add 2^(30 + shift) first), in 64 bits.
// No float touches a value between the input's quantize and the logits' dequantize.
#pragma once
#include <cmath>
#include <cstdint>

#include "core/dtype.h"  // KILN_HOST_DEVICE

namespace kiln {

// The scale and zero point of one tensor (or of one channel), and its integer range.
struct QParams {
    float scale = 1.0f;
    int32_t zero_point = 0;
    int32_t qmin = 0, qmax = 255;
};

// The integer ranges kiln uses: activations u8 [0, 255], or [0, 127] with reduce_range (for a
// CPU whose int8 products can saturate in 16 bits: ops/cpu/qgemm.h); weights i8 [−128, 127].
constexpr int32_t kActQmin = 0, kActQmax = 255, kActQmaxReduced = 127;
constexpr int32_t kWeightQmin = -128, kWeightQmax = 127;

// ---- one value ---------------------------------------------------------------------------------
// q = clamp(nearbyint(x · inv_scale) + zero_point, qmin, qmax), inv_scale = 1/scale in float.
// NaN becomes qmin (a NaN activation is a bug upstream; quantize() in ops/quant.h refuses it).
KILN_HOST_DEVICE inline int32_t quantize_value(float x, float inv_scale, int32_t zero_point, int32_t qmin,
                                               int32_t qmax) {
    const float r = rintf(x * inv_scale);  // nearest, ties to even (the default rounding mode)
    const float lo = float(qmin - zero_point), hi = float(qmax - zero_point);
    const float c = r > lo ? (r < hi ? r : hi) : lo;  // clamp before converting: no overflow
    return int32_t(c) + zero_point;
}

// x = scale · (q − zero_point)
KILN_HOST_DEVICE inline float dequantize_value(int32_t q, float scale, int32_t zero_point) {
    return scale * float(q - zero_point);
}

// ---- requantization ----------------------------------------------------------------------------
// M = m0 · 2^(−31 − shift) with 2^30 ≤ m0 < 2^31 (m0 = 0 for M = 0). shift may be negative when
// M ≥ 1 (down to −30 here: M < 2^30).
struct Requant {
    int32_t m0 = 0;
    int32_t shift = 0;
};

// The fixed-point form of a real multiplier 0 ≤ M < 2^30; exact to 2^-31 relative.
inline Requant make_requant(double M) {
    if (!(M > 0)) return Requant{};
    int exp = 0;
    const double frac = std::frexp(M, &exp);  // M = frac · 2^exp, 0.5 ≤ frac < 1
    int64_t m0 = std::llround(frac * 2147483648.0);  // frac · 2^31, in [2^30, 2^31]
    if (m0 == (int64_t(1) << 31)) {  // frac rounded up to 1: use 0.5 · 2^(exp+1)
        m0 /= 2;
        exp += 1;
    }
    return Requant{int32_t(m0), -exp};
}

// round(acc · M) = (acc · m0 + 2^(30 + shift)) >> (31 + shift), in 64 bits (|acc| < 2^31 and
// m0 < 2^31, so the product fits; the shift is arithmetic: floor, so +half rounds half up).
KILN_HOST_DEVICE inline int32_t apply_requant(int32_t acc, Requant r) {
    const int total = 31 + r.shift;  // 1 ≤ total ≤ 62 for the multipliers make_requant makes
    const int64_t p = int64_t(acc) * int64_t(r.m0);
    return int32_t((p + (int64_t(1) << (total - 1))) >> total);
}

// q_y = clamp(zero_point + round(acc · M), lo, hi): an int32 accumulator as the next layer's u8.
KILN_HOST_DEVICE inline uint8_t requantize_value(int32_t acc, Requant r, int32_t zero_point, int32_t lo, int32_t hi) {
    int64_t q = int64_t(zero_point) + apply_requant(acc, r);
    q = q < lo ? lo : (q > hi ? hi : q);
    return uint8_t(q);
}

// ---- choosing scale and zero point from a range (PyTorch's _calculate_qparams) -----------------
// Affine, per tensor, for activations: the range is widened to contain 0, then spread over
// [qmin, qmax]. min > max (nothing observed) is refused by the observers before this is called.
QParams choose_qparams_affine(float min, float max, int32_t qmin, int32_t qmax);
// Symmetric, for one channel of weights: zero_point 0, scale = max(|min|, |max|) / ((qmax−qmin)/2).
QParams choose_qparams_symmetric(float min, float max, int32_t qmin, int32_t qmax);

}  // namespace kiln
