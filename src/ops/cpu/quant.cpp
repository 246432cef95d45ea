// quant.cpp — the CPU kernels of chapter 11 (declared, with their formulas, in ops/quant.h):
// quantize and dequantize, requantization, the int8 Linear and convolution (groups 1 and
// depthwise), u8 max and global average pooling, table lookups, the sum of two u8 tensors, and
// fake quantization for quantization-aware training. The int8 matrix product itself, with its
// SIMD paths, is in qgemm.cpp.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/cpu_features.h"
#include "core/error.h"
#include "core/parallel.h"
#include "ops/cpu/short_rows.h"
#include "ops/cpu/conv_tasks.h"
#include "ops/cpu/qgemm.h"
#include "ops/conv.h"  // im2col
#include "ops/quant.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KILN_QUANT_X86 1
#define KILN_TARGET_AVX2 __attribute__((target("avx2")))  // called only where cpu_level() ≥ avx2
#endif

namespace kiln {

// ==== qadd's fixed-point numbers (ops/quant.h has the formula) ====================================
QAddParams qadd_params(const QParams& a, const QParams& b, const QParams& out) {
    const char* op = "qadd";
    for (const QParams* qp : {&a, &b, &out})
        KILN_CHECK(std::isfinite(qp->scale) && qp->scale > 0, op, ": a scale of ", qp->scale,
                   " is not a positive number; take the scales from the tensors' QParams");
    const double lo = std::min({a.scale, b.scale, out.scale}), hi = std::max({a.scale, b.scale, out.scale});
    KILN_CHECK(hi <= kQAddMaxScaleRatio * lo, op, ": the scales of a (", a.scale, "), b (", b.scale,
               ") and the sum (", out.scale, ") are more than ", kQAddMaxScaleRatio,
               " times apart, past what its fixed point adds within 1");
    KILN_CHECK(0 <= a.zero_point && a.zero_point <= 255 && 0 <= b.zero_point && b.zero_point <= 255, op,
               ": the zero points of a (", a.zero_point, ") and b (", b.zero_point, ") should be u8 values");
    KILN_CHECK(0 <= out.qmin && out.qmin <= out.zero_point && out.zero_point <= out.qmax && out.qmax <= 255, op,
               ": the output range qmin ", out.qmin, " ≤ zero_point ", out.zero_point, " ≤ qmax ", out.qmax,
               " must lie in [0, 255]");
    const double m = 2.0 * std::max(a.scale, b.scale);
    return QAddParams{a.zero_point, b.zero_point, make_requant(a.scale / m), make_requant(b.scale / m),
                      make_requant(m / (double(1 << kQAddShift) * out.scale)), out.zero_point, out.qmin, out.qmax};
}

}  // namespace kiln

namespace kiln::cpu {

// ==== quantize / dequantize =====================================================================
namespace {

// Runs f(begin, end, c) over runs of elements of a tensor viewed as [outer, C, inner] that all
// belong to channel c, the runs spread over the threads. A per-tensor call (C = 1) is cut into
// runs of 4096 elements, so that it spreads too.
template <typename F>
void for_each_run(int64_t outer, int64_t C, int64_t inner, F&& f) {
    if (C == 1) inner *= outer, outer = 1;
    const int64_t run = C == 1 ? 4096 : inner;
    const int64_t runs_per_block = inner == 0 ? 0 : (inner + run - 1) / run;
    const int64_t total = outer * C * runs_per_block;
    parallel_for(total, grain_of(1 << 15, run), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; r++) {
            const int64_t block = r / runs_per_block, begin = block * inner + r % runs_per_block * run;
            f(begin, std::min(begin + run, (block + 1) * inner), block % C);
        }
    });
}

}  // namespace

template <typename Q>
void quantize(const float* x, Q* q, int64_t n, float scale, int32_t zero_point, int32_t qmin, int32_t qmax) {
    quantize_per_channel(x, q, 1, 1, n, &scale, &zero_point, qmin, qmax);
}

template <typename Q>
void dequantize(const Q* q, float* x, int64_t n, float scale, int32_t zero_point) {
    dequantize_per_channel(q, x, 1, 1, n, &scale, &zero_point);
}

template <typename Q>
void quantize_per_channel(const float* x, Q* q, int64_t outer, int64_t C, int64_t inner, const float* scale,
                          const int32_t* zero_point, int32_t qmin, int32_t qmax) {
    for_each_run(outer, C, inner, [&](int64_t begin, int64_t end, int64_t c) {
        const float inv = 1.0f / scale[c];
        for (int64_t i = begin; i < end; i++) q[i] = Q(quantize_value(x[i], inv, zero_point[c], qmin, qmax));
    });
}

template <typename Q>
void dequantize_per_channel(const Q* q, float* x, int64_t outer, int64_t C, int64_t inner, const float* scale,
                            const int32_t* zero_point) {
    for_each_run(outer, C, inner, [&](int64_t begin, int64_t end, int64_t c) {
        for (int64_t i = begin; i < end; i++) x[i] = dequantize_value(q[i], scale[c], zero_point[c]);
    });
}

KILN_QUANTIZE_KERNELS(KILN_INSTANTIATE_INT8);

// ==== the reference product ======================================================================
void qgemm_u8s8_reference(int64_t M, int64_t N, int64_t K, const uint8_t* A, int64_t lda, const int8_t* B,
                          int64_t ldb, int32_t* C, int64_t ldc) {
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            int32_t acc = 0;
            for (int64_t k = 0; k < K; k++) acc += int32_t(A[m * lda + k]) * int32_t(B[n * ldb + k]);
            C[m * ldc + n] = acc;
        }
}

// ==== requantization and the int8 Linear =========================================================
// Below kParallelMinValues values a team costs more than it saves (a Linear's output at batch 64).
constexpr int64_t kParallelMinValues = int64_t(1) << 16;

void requantize_rows(const int32_t* acc, uint8_t* y, int64_t M, int64_t O, const QOutput& out) {
    parallel_for(M, grain_of(kParallelMinValues, O), [&](int64_t m0, int64_t m1) {
        for (int64_t m = m0; m < m1; m++)
            for (int64_t o = 0; o < O; o++)
                y[m * O + o] = requantize_value(acc[m * O + o] + out.bias[o], out.requant[o], out.zero_point, out.lo, out.hi);
    });
}

void qlinear(const uint8_t* x, const int8_t* w, uint8_t* y, int64_t N, int64_t K, int64_t O, int32_t x_max,
             const QOutput& out, int32_t* work) {
    qgemm_u8s8(N, O, K, x, K, w, K, work, O, x_max);
    requantize_rows(work, y, N, O, out);
}

// ==== the int8 convolution ========================================================================
// groups = 1: a group of k images at a time, as one matrix product with the weight first
// (qgemm_s8u8), the images' columns side by side (L = k·P·Q):
//   cols [C·KH·KW, L] u8: cols[(c·KH + kh)·KW + kw][i·P·Q + p·Q + q] = x_i[c][ih][iw]  (z_x in the padding)
//   acc  [O, L]  int32  = w [O, C·KH·KW] · cols
//   y_i[o][p·Q + q] = requantize(acc[o][i·P·Q + p·Q + q] + bias[o])   (runs of P·Q values)
// cols is chapter 03's im2col, in u8, padded with z_x (the u8 of the real 0). k is chapter 03's
// ⌈256 / P·Q⌉ ("Several images in one GEMM"): each product packs the weights again, and for
// LeNet's conv2 (20 × 250 weights, 8×8 outputs) a product per image packed as many bytes as it
// did multiply-adds per 64-lane instruction — one image at a time ran at half the speed. A 1×1
// convolution with stride 1 and no padding, one image at a time (planes of 256 and more), needs
// no cols: they would be the image [C, H·W] itself.
//
// The groups are spread over the threads: each runs all three steps on its group, in its own
// slot of the workspace (cols and acc of k images), and the product on that thread alone. There
// are min(groups, kConvSlots) slots, so the workspace depends on the sizes only, not on the
// thread count; at most that many threads share the groups. With fewer groups than threads the
// groups go one at a time through slot 0, and the product splits its rows over the threads.
// Depthwise layers take direct loops instead (below): a product of K = KH·KW would be all overhead.
namespace {

constexpr int64_t kConvSlots = 16;

int64_t group_images(const Conv2dParams& p) { return images_per_group(p.P() * p.Q(), std::max<int64_t>(p.N, 1)); }
int64_t conv_groups(const Conv2dParams& p) { return (p.N + group_images(p) - 1) / group_images(p); }
int64_t conv_slots(const Conv2dParams& p) { return std::min(conv_groups(p), kConvSlots); }

// Whether the product reads the image as it lies, with no cols (above).
bool reads_image(const Conv2dParams& p) {
    return group_images(p) == 1 && p.KH == 1 && p.KW == 1 && p.stride == 1 && p.padding == 0;
}

// One slot: cols of a group (rounded up to 4 bytes, so that acc is aligned; none when
// reads_image), then its acc.
int64_t cols_bytes(const Conv2dParams& p) {
    return reads_image(p) ? 0 : (group_images(p) * p.C * p.KH * p.KW * p.P() * p.Q() + 3) / 4 * 4;
}
int64_t slot_bytes(const Conv2dParams& p) {
    return cols_bytes(p) + group_images(p) * p.P() * p.Q() * p.O * int64_t(sizeof(int32_t));
}

// One output channel: y[i] = requantize_value(acc[i] + bias, r, z_y, lo, hi) for i < n.
using RequantizeChannel = void (*)(const int32_t* acc, int64_t n, int32_t bias, Requant r, const QOutput& out,
                                   uint8_t* y);

void requantize_channel(const int32_t* acc, int64_t n, int32_t bias, Requant r, const QOutput& out, uint8_t* y) {
    for (int64_t i = 0; i < n; i++) y[i] = requantize_value(acc[i] + bias, r, out.zero_point, out.lo, out.hi);
}

#if defined(KILN_QUANT_X86)
// The same, 8 values at a time with AVX2 (with a kernel as short as K = 12, the scalar 64-bit
// arithmetic of requantize_value would cost more than the product). For t = 31 + shift:
//   p = (acc + bias) · m0                 vpmuldq: the even lanes, then the odd ones, in 64 bits
//   (p + 2^(t−1)) >> t = ((p + 2^(t−1) + 2^62) >>> t) − 2^(62−t)   apply_requant's rounding; AVX2
//                                         shifts 64-bit lanes only logically (>>>): |p| < 2^62, so
//                                         the sum is ≥ 0, and 2^62 / 2^t is an integer: exact
//   q = z_y + clamp(low 32 bits, lo − z_y, hi − z_y)     = clamp(z_y + ·, lo, hi), no overflow
KILN_TARGET_AVX2 inline __m256i shift_rounded(__m256i p, __m256i offset, __m128i t, __m256i unbias) {
    return _mm256_sub_epi64(_mm256_srl_epi64(_mm256_add_epi64(p, offset), t), unbias);
}

KILN_TARGET_AVX2 void requantize_channel_avx2(const int32_t* acc, int64_t n, int32_t bias, Requant r,
                                              const QOutput& out, uint8_t* y) {
    const int t = 31 + r.shift;
    if (t < 1 || t > 62) return requantize_channel(acc, n, bias, r, out, y);  // not a make_requant multiplier
    const __m256i m0 = _mm256_set1_epi32(r.m0), b = _mm256_set1_epi32(bias);
    const __m256i offset = _mm256_set1_epi64x((int64_t(1) << (t - 1)) + (int64_t(1) << 62));
    const __m256i unbias = _mm256_set1_epi64x(int64_t(1) << (62 - t));
    const __m128i count = _mm_cvtsi32_si128(t);
    const __m256i lo = _mm256_set1_epi32(out.lo - out.zero_point), hi = _mm256_set1_epi32(out.hi - out.zero_point);
    const __m256i zp = _mm256_set1_epi32(out.zero_point);
    const __m256i first_dwords = _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256i v = _mm256_add_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(acc + i)), b);
        const __m256i even = shift_rounded(_mm256_mul_epi32(v, m0), offset, count, unbias);  // lanes 0, 2, 4, 6
        const __m256i odd = shift_rounded(_mm256_mul_epi32(_mm256_srli_epi64(v, 32), m0), offset, count, unbias);
        __m256i q = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xaa);
        q = _mm256_add_epi32(_mm256_min_epi32(_mm256_max_epi32(q, lo), hi), zp);
        // 8 values in [0, 255] to 8 bytes: packs work within 128-bit halves, so q0-3 end up in
        // dword 0 and q4-7 in dword 4
        const __m256i bytes = _mm256_packus_epi16(_mm256_packus_epi32(q, q), _mm256_packus_epi32(q, q));
        _mm_storel_epi64(reinterpret_cast<__m128i*>(y + i),
                         _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(bytes, first_dwords)));
    }
    requantize_channel(acc + i, n - i, bias, r, out, y + i);
}
#endif

RequantizeChannel requantize_channel_kernel() {
#if defined(KILN_QUANT_X86)
    if (cpu_level() >= CpuLevel::Avx2) return requantize_channel_avx2;
#endif
    return requantize_channel;
}

// The k images from x (each [C, H, W]) -> y (each [O, P, Q]), with one slot of workspace.
void qconv2d_group(const uint8_t* x, int64_t k, const int8_t* w, uint8_t* y, const Conv2dParams& p,
                   int32_t x_zero_point, int32_t x_max, const QOutput& out, RequantizeChannel requantize,
                   uint8_t* slot) {
    const int64_t PQ = p.P() * p.Q(), L = k * PQ, K = p.C * p.KH * p.KW;
    uint8_t* cols = slot;
    int32_t* acc = reinterpret_cast<int32_t*>(slot + cols_bytes(p));
    const uint8_t* b = x;  // [K, L]: the image itself, or the images' im2col
    if (!reads_image(p)) {
        for (int64_t i = 0; i < k; i++)
            im2col(x + i * p.C * p.H * p.W, p.C, p, cols + i * PQ, L, uint8_t(x_zero_point));
        b = cols;
    }
    qgemm_s8u8(p.O, L, K, w, K, b, L, acc, L, x_max);
    for (int64_t i = 0; i < k; i++)
        for (int64_t o = 0; o < p.O; o++)
            requantize(acc + o * L + i * PQ, PQ, out.bias[o], out.requant[o], out, y + (i * p.O + o) * PQ);
}

// ---- depthwise: G = C = O, w [C, 1, KH, KW] ---------------------------------------------------------
// Each plane (n, c) is its own small convolution, with no product and no workspace: the plane is
// copied into one padded with z_x on every side (H + 2·padding rows of W + 2·padding), where every
// tap reads, then
//   acc[p, q] = Σ_{kh, kw} w[c, kh, kw] · xpad[p·stride + kh·dilation, q·stride + kw·dilation]
//   y[n, c]   = requantize(acc + bias[c])      (one run of P·Q values, as qconv2d_group's channels)
// a tap at a time. The sums are integers, exact in any order.

// acc[q] += w · x[q·s] for q < n; with s = 1 a loop of its own, which g++ vectorizes.
inline void tap_row(int32_t w, const uint8_t* x, int64_t s, int32_t* acc, int64_t n) {
    if (s == 1) {
#pragma omp simd
        for (int64_t q = 0; q < n; q++) acc[q] += w * int32_t(x[q]);
    } else {
        for (int64_t q = 0; q < n; q++) acc[q] += w * int32_t(x[q * s]);
    }
}

// Stride s: a tap at a time along each row of acc (P·KH·KW runs of Q values).
void taps_by_row(const uint8_t* xpad, int64_t Wp, const int8_t* wc, const Conv2dParams& p, int32_t* acc) {
    const int64_t P = p.P(), Q = p.Q(), s = p.stride, d = p.dilation;
    std::fill(acc, acc + P * Q, 0);
    for (int64_t op = 0; op < P; op++)
        for (int64_t kh = 0; kh < p.KH; kh++)
            for (int64_t kw = 0; kw < p.KW; kw++)
                tap_row(wc[kh * p.KW + kw], xpad + (op * s + kh * d) * Wp + kw * d, s, acc + op * Q, Q);
}

// Stride 1: a tap reads the padded plane shifted by (kh·d, kw·d), so over rows as wide as the
// padded plane's, acc's P rows are one run: acc[i] += w · xpad[i + kh·d·Wp + kw·d] for i up to
// (P−1)·Wp + Q, the Wp − Q values past Q in each row computed and dropped. One loop of ~P·Wp
// values per tap where the rows gave loops of Q: MobileNetV2's 8×8 and 4×4 planes were too short to
// vectorize, and int8 depthwise took 70% of its int8 network's time (more than f32's). Then the
// rows are moved together: acc[p·Q + q] = acc[p·Wp + q].
void taps_flat(const uint8_t* xpad, int64_t Wp, const int8_t* wc, const Conv2dParams& p, int32_t* acc) {
    const int64_t P = p.P(), Q = p.Q(), d = p.dilation, n = (P - 1) * Wp + Q;
    std::fill(acc, acc + n, 0);
    for (int64_t kh = 0; kh < p.KH; kh++)
        for (int64_t kw = 0; kw < p.KW; kw++) tap_row(wc[kh * p.KW + kw], xpad + kh * d * Wp + kw * d, 1, acc, n);
    for (int64_t op = 1; op < P; op++) std::memmove(acc + op * Q, acc + op * Wp, size_t(Q) * sizeof(int32_t));
}

void qconv2d_depthwise(const uint8_t* x, const int8_t* w, uint8_t* y, const Conv2dParams& p, int32_t x_zero_point,
                       const QOutput& out) {
    const int64_t P = p.P(), Q = p.Q(), pad = p.padding;
    const int64_t Wp = p.W + 2 * pad, taps = p.KH * p.KW;
    const RequantizeChannel requantize = requantize_channel_kernel();
    parallel_for(p.N * p.C, grain_of(kParallelMinValues, P * Q * taps), [&](int64_t nc0, int64_t nc1) {
        std::vector<uint8_t> xpad(static_cast<size_t>((p.H + 2 * pad) * Wp), uint8_t(x_zero_point));  // [H+2pad, Wp]
        std::vector<int32_t> acc(static_cast<size_t>(P * Wp));                                          // [P, Wp]
        for (int64_t nc = nc0; nc < nc1; nc++) {
            const int64_t c = nc % p.C;
            for (int64_t h = 0; h < p.H; h++)  // the border keeps z_x
                std::memcpy(xpad.data() + (h + pad) * Wp + pad, x + (nc * p.H + h) * p.W, static_cast<size_t>(p.W));
            if (p.stride == 1)
                taps_flat(xpad.data(), Wp, w + c * taps, p, acc.data());
            else
                taps_by_row(xpad.data(), Wp, w + c * taps, p, acc.data());
            requantize(acc.data(), P * Q, out.bias[c], out.requant[c], out, y + nc * P * Q);
        }
    });
}

}  // namespace

int64_t qconv2d_work_bytes(const Conv2dParams& p) {
    return qconv2d_is_depthwise(p) ? 0 : conv_slots(p) * slot_bytes(p);
}

void qconv2d(const uint8_t* x, const int8_t* w, uint8_t* y, const Conv2dParams& p, int32_t x_zero_point,
             int32_t x_max, const QOutput& out, uint8_t* work) {
    check_conv2d_params(p, "qconv2d");
    if (qconv2d_is_depthwise(p)) return qconv2d_depthwise(x, w, y, p, x_zero_point, out);
    KILN_CHECK(p.groups == 1, "qconv2d: groups=", p.groups, " but the int8 convolution takes groups = 1 or "
               "depthwise (groups = C = O; here C=", p.C, ", O=", p.O, "); run another grouped layer in f32");
    const int64_t x_image = p.C * p.H * p.W, y_image = p.O * p.P() * p.Q(), k = group_images(p);
    const RequantizeChannel requantize = requantize_channel_kernel();
    auto group = [&](int64_t j, uint8_t* slot) {  // images j·k .. j·k + k − 1 (fewer in the last group)
        const int64_t n = j * k;
        qconv2d_group(x + n * x_image, std::min(k, p.N - n), w, y + n * y_image, p, x_zero_point, x_max, out,
                      requantize, slot);
    };
    // One task per workspace slot, each taking the next group until none is left; fewer groups
    // than threads: one at a time through slot 0.
    for_groups_in_slots(conv_groups(p), conv_slots(p), conv_groups(p) >= max_threads(),
                        [&](int64_t j, int64_t slot) { group(j, work + slot * slot_bytes(p)); });
}

// ==== pooling and tables ==========================================================================
// 2×2 windows at stride 2 without padding (LeNet's and the CIFAR net's pools): each window four
// loads at known offsets, in blocks of 8 that g++ vectorizes; the general loop below took a sixth of LeNet's
// int8 inference. (Odd H or W: the last row or column is in no window, as in PyTorch.)
//   y[p][q] = max(x[2p][2q], x[2p][2q+1], x[2p+1][2q], x[2p+1][2q+1])
static void qmaxpool2x2_plane(const uint8_t* xp, uint8_t* yp, int64_t W, int64_t P, int64_t Q) {
    for (int64_t op = 0; op < P; op++) {
        const uint8_t* r0 = xp + 2 * op * W;
        const uint8_t* r1 = r0 + W;
        uint8_t* yr = yp + op * Q;
        for_blocks(0, Q, [&](int64_t q0, int64_t n) {  // blocks of 8: a row of 12 fills no 64-byte vector
#pragma omp simd
            for (int64_t oq = q0; oq < q0 + n; oq++)
                yr[oq] = std::max(std::max(r0[2 * oq], r0[2 * oq + 1]), std::max(r1[2 * oq], r1[2 * oq + 1]));
        });
    }
}

void qmaxpool2d(const uint8_t* x, uint8_t* y, const Pool2dParams& p) {
    const int64_t P = p.P(), Q = p.Q();
    const bool two_by_two = p.KH == 2 && p.KW == 2 && p.stride == 2 && p.padding == 0 && p.H >= 2 && p.W >= 2;
    parallel_for(p.N * p.C, grain_of(1 << 15, p.H * p.W), [&](int64_t plane0, int64_t plane1) {
        for (int64_t plane = plane0; plane < plane1; plane++) {
            const uint8_t* xp = x + plane * p.H * p.W;
            if (two_by_two) {
                qmaxpool2x2_plane(xp, y + plane * P * Q, p.W, P, Q);
                continue;
            }
            for (int64_t op = 0; op < P; op++) {
                // the window's rows and columns inside the image: [h0, h1) × [w0, w1)
                const int64_t top = op * p.stride - p.padding;
                const int64_t h0 = std::max<int64_t>(top, 0), h1 = std::min(top + p.KH, p.H);
                for (int64_t oq = 0; oq < Q; oq++) {
                    const int64_t left = oq * p.stride - p.padding;
                    const int64_t w0 = std::max<int64_t>(left, 0), w1 = std::min(left + p.KW, p.W);
                    uint8_t m = 0;
                    for (int64_t ih = h0; ih < h1; ih++)
                        for (int64_t iw = w0; iw < w1; iw++) m = std::max(m, xp[ih * p.W + iw]);
                    y[(plane * P + op) * Q + oq] = m;
                }
            }
        }
    });
}

void qglobal_avgpool(const uint8_t* x, uint8_t* y, int64_t NC, int64_t S) {
    parallel_for(NC, grain_of(1 << 15, S), [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; i++) {
            int64_t sum = 0;
            for (int64_t s = 0; s < S; s++) sum += x[i * S + s];
            y[i] = uint8_t((sum + S / 2) / S);
        }
    });
}

void lookup_u8(const uint8_t* x, uint8_t* y, int64_t outer, int64_t C, int64_t inner, const uint8_t* table) {
    for_each_run(outer, C, inner, [&](int64_t begin, int64_t end, int64_t c) {
        const uint8_t* t = table + c * 256;
        for (int64_t i = begin; i < end; i++) y[i] = t[x[i]];
    });
}

// ==== the sum of two u8 tensors ======================================================================
void qadd(const uint8_t* a, const uint8_t* b, uint8_t* y, int64_t n, const QAddParams& q) {
    for_each_run(1, 1, n, [&](int64_t begin, int64_t end, int64_t) {
        for (int64_t i = begin; i < end; i++) y[i] = qadd_value(a[i], b[i], q);
    });
}

// ==== fake quantization ============================================================================
void fake_quantize_forward(const float* x, float* y, int64_t outer, int64_t C, int64_t inner, const float* scale,
                           const int32_t* zero_point, int32_t qmin, int32_t qmax) {
    for_each_run(outer, C, inner, [&](int64_t begin, int64_t end, int64_t c) {
        const float inv = 1.0f / scale[c];
        for (int64_t i = begin; i < end; i++)
            y[i] = dequantize_value(quantize_value(x[i], inv, zero_point[c], qmin, qmax), scale[c], zero_point[c]);
    });
}

void fake_quantize_backward(const float* x, const float* dy, float* dx, int64_t outer, int64_t C, int64_t inner,
                            const float* scale, const int32_t* zero_point, int32_t qmin, int32_t qmax) {
    for_each_run(outer, C, inner, [&](int64_t begin, int64_t end, int64_t c) {
        const float inv = 1.0f / scale[c];
        for (int64_t i = begin; i < end; i++) {
            const float q = rintf(x[i] * inv) + float(zero_point[c]);
            dx[i] = q >= float(qmin) && q <= float(qmax) ? dy[i] : 0.0f;
        }
    });
}

}  // namespace kiln::cpu
