// quant.cpp — the CPU kernels of chapter 11 (declared, with their formulas, in quant_ops.h):
// quantize and dequantize, requantization, the int8 Linear and convolution, u8 max pooling,
// table lookups, and fake quantization for quantization-aware training. The int8 matrix
// product itself, with its SIMD paths, is in qgemm.cpp.
#include <omp.h>

#include <algorithm>

#include "core/error.h"
#include "ops/cpu/quant_ops.h"

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
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < total; r++) {
        const int64_t block = r / runs_per_block, begin = block * inner + r % runs_per_block * run;
        f(begin, std::min(begin + run, (block + 1) * inner), block % C);
    }
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

#define KILN_QUANTIZE(Q)                                                                                      \
    template void quantize<Q>(const float*, Q*, int64_t, float, int32_t, int32_t, int32_t);                   \
    template void dequantize<Q>(const Q*, float*, int64_t, float, int32_t);                                   \
    template void quantize_per_channel<Q>(const float*, Q*, int64_t, int64_t, int64_t, const float*,          \
                                          const int32_t*, int32_t, int32_t);                                  \
    template void dequantize_per_channel<Q>(const Q*, float*, int64_t, int64_t, int64_t, const float*,        \
                                            const int32_t*);
KILN_QUANTIZE(uint8_t)
KILN_QUANTIZE(int8_t)
#undef KILN_QUANTIZE

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
void requantize_rows(const int32_t* acc, uint8_t* y, int64_t M, int64_t O, const QOutput& out) {
#pragma omp parallel for schedule(static)
    for (int64_t m = 0; m < M; m++)
        for (int64_t o = 0; o < O; o++)
            y[m * O + o] = requantize_value(acc[m * O + o] + out.bias[o], out.requant[o], out.zero_point, out.lo, out.hi);
}

void qlinear(const uint8_t* x, const int8_t* w, uint8_t* y, int64_t N, int64_t K, int64_t O, int32_t x_max,
             const QOutput& out, int32_t* work) {
    qgemm_u8s8(N, O, K, x, K, w, K, work, O, x_max);
    requantize_rows(work, y, N, O, out);
}

// ==== the int8 convolution ========================================================================
// One image at a time, as a matrix product whose operands are both read along k:
//   rows [P·Q, C·KH·KW] u8: rows[p·Q + q][(c·KH + kh)·KW + kw] = x[c][ih][iw]  (z_x in the padding)
//   acc  [P·Q, O]  int32  = rows · wᵀ                      (qgemm_u8s8, w [O, C·KH·KW] as stored)
//   y[o][p·Q + q] = requantize(acc[p·Q + q][o] + bias[o])  (the transpose back to [O, P, Q])
// rows is im2col's matrix transposed ("im2row"): one output pixel's receptive field per row.
//
// The images are spread over the threads: each runs all three steps on its image, in its own
// slot of the workspace (rows and acc of one image, in its L2), and the product on that thread
// alone. There are min(N, kConvSlots) slots, so the workspace depends on the sizes only, not on
// the thread count; at most that many threads share the images. With fewer images than threads
// the images go one at a time through slot 0, and the product splits its rows over the threads.
namespace {

constexpr int64_t kConvSlots = 16;

int64_t conv_slots(const Conv2dParams& p) { return std::min(p.N, kConvSlots); }

// One slot: rows (rounded up to 4 bytes, so that acc is aligned), then acc.
int64_t rows_bytes(const Conv2dParams& p) { return (p.P() * p.Q() * p.C * p.KH * p.KW + 3) / 4 * 4; }
int64_t slot_bytes(const Conv2dParams& p) { return rows_bytes(p) + p.P() * p.Q() * p.O * int64_t(sizeof(int32_t)); }

// One image x [C, H, W] -> rows [P·Q, C·KH·KW].
void im2row_u8(const uint8_t* x, const Conv2dParams& p, uint8_t pad, uint8_t* rows) {
    const int64_t P = p.P(), Q = p.Q(), K = p.C * p.KH * p.KW;
    for (int64_t op = 0; op < P; op++)
        for (int64_t oq = 0; oq < Q; oq++) {
            uint8_t* row = rows + (op * Q + oq) * K;
            for (int64_t c = 0; c < p.C; c++)
                for (int64_t kh = 0; kh < p.KH; kh++)
                    for (int64_t kw = 0; kw < p.KW; kw++) {
                        const int64_t ih = op * p.stride - p.padding + kh * p.dilation;
                        const int64_t iw = oq * p.stride - p.padding + kw * p.dilation;
                        const bool inside = ih >= 0 && ih < p.H && iw >= 0 && iw < p.W;
                        row[(c * p.KH + kh) * p.KW + kw] = inside ? x[(c * p.H + ih) * p.W + iw] : pad;
                    }
        }
}

// One image: x [C, H, W] -> y [O, P, Q], with one slot of workspace.
void qconv2d_image(const uint8_t* x, const int8_t* w, uint8_t* y, const Conv2dParams& p, int32_t x_zero_point,
                   int32_t x_max, const QOutput& out, uint8_t* slot) {
    const int64_t PQ = p.P() * p.Q(), K = p.C * p.KH * p.KW, O = p.O;
    uint8_t* rows = slot;
    int32_t* acc = reinterpret_cast<int32_t*>(slot + rows_bytes(p));
    im2row_u8(x, p, uint8_t(x_zero_point), rows);
    qgemm_u8s8(PQ, O, K, rows, K, w, K, acc, O, x_max);
    for (int64_t o = 0; o < O; o++)
        for (int64_t i = 0; i < PQ; i++)
            y[o * PQ + i] = requantize_value(acc[i * O + o] + out.bias[o], out.requant[o], out.zero_point, out.lo, out.hi);
}

}  // namespace

int64_t qconv2d_work_bytes(const Conv2dParams& p) { return conv_slots(p) * slot_bytes(p); }

void qconv2d(const uint8_t* x, const int8_t* w, uint8_t* y, const Conv2dParams& p, int32_t x_zero_point,
             int32_t x_max, const QOutput& out, uint8_t* work) {
    check_conv2d_params(p, "qconv2d");
    KILN_CHECK(p.groups == 1, "qconv2d: groups=", p.groups, " but the int8 convolution has groups = 1 only; "
               "run a grouped layer in f32");
    const int64_t x_image = p.C * p.H * p.W, y_image = p.O * p.P() * p.Q();
    const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
    if (p.N < threads || threads == 1) {
        for (int64_t n = 0; n < p.N; n++)
            qconv2d_image(x + n * x_image, w, y + n * y_image, p, x_zero_point, x_max, out, work);
        return;
    }
#pragma omp parallel num_threads(int(std::min<int64_t>(threads, conv_slots(p))))
    {
        uint8_t* slot = work + omp_get_thread_num() * slot_bytes(p);
#pragma omp for schedule(dynamic, 1)
        for (int64_t n = 0; n < p.N; n++)
            qconv2d_image(x + n * x_image, w, y + n * y_image, p, x_zero_point, x_max, out, slot);
    }
}

// ==== pooling and tables ==========================================================================
void qmaxpool2d(const uint8_t* x, uint8_t* y, const Pool2dParams& p) {
    const int64_t P = p.P(), Q = p.Q();
#pragma omp parallel for schedule(static)
    for (int64_t plane = 0; plane < p.N * p.C; plane++) {
        const uint8_t* xp = x + plane * p.H * p.W;
        for (int64_t op = 0; op < P; op++)
            for (int64_t oq = 0; oq < Q; oq++) {
                uint8_t m = 0;
                for (int64_t kh = 0; kh < p.KH; kh++)
                    for (int64_t kw = 0; kw < p.KW; kw++) {
                        const int64_t ih = op * p.stride - p.padding + kh, iw = oq * p.stride - p.padding + kw;
                        if (ih >= 0 && ih < p.H && iw >= 0 && iw < p.W) m = std::max(m, xp[ih * p.W + iw]);
                    }
                y[(plane * P + op) * Q + oq] = m;
            }
    }
}

void lookup_u8(const uint8_t* x, uint8_t* y, int64_t outer, int64_t C, int64_t inner, const uint8_t* table) {
    for_each_run(outer, C, inner, [&](int64_t begin, int64_t end, int64_t c) {
        const uint8_t* t = table + c * 256;
        for (int64_t i = begin; i < end; i++) y[i] = t[x[i]];
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
