// conv.cpp — 2-D convolution on the CPU: im2col + GEMM, and two direct paths (chapter 03).
//
// Build and test just the convolution:
//   make build/src/ops/cpu/conv.o build/src/nn/conv.o build/tests/test_conv.o
//   (link with build/libkiln.a, see tests/test_conv.cpp)  then  ./kiln_tests '[conv]'
//
// Letters as in cnn_ops.h: N C H W (input), O (output channels), KH KW (kernel), P Q (output),
// G (groups); one group has Cg = C/G input and Og = O/G output channels.
//
// ---- Versions, from the textbook to this file ---------------------------------------------
//   v1  the direct 7-loop convolution (n, o, p, q, c, kh, kw): the reference in
//       tests/test_conv.cpp. Each output is a short dot product with strided reads; slow.
//   v2  im2col + GEMM (Caffe's way, this file): unfold the input so that every output
//       position's receptive field is one column,
//           col[(c·KH + kh)·KW + kw][p·Q + q] = x[c][p·stride − pad + kh·dil][q·stride − pad + kw·dil]
//       and the convolution of one image becomes one matrix product per group:
//           y_n[Og, P·Q] = w[Og, Cg·KH·KW] · col_n[Cg·KH·KW, P·Q]
//       The column matrix is KH·KW times bigger than the image (the memory price), but the
//       product runs on the tuned GEMM of gemm.cpp at tens of GFLOP/s.
//   v3  special cases that skip the unfolding:
//       Pointwise  1×1, stride 1, no padding: col_n would be x_n itself ([C, H·W]), so the
//                  GEMM reads the input directly — no workspace, no copy.
//       Depthwise  G == C == O: each channel has one KH×KW filter; a GEMM with M = 1 is all
//                  overhead, so direct loops, vectorized along a row of the output.
//
// ---- The backward pass ----------------------------------------------------------------------
//   dx:  dcol_n = wᵀ · dy_n   (per group), then col2im scatters dcol back onto the image
//        (col2im is the adjoint of im2col: every entry goes back where im2col copied it from).
//   dw:  dw += dy_n · col_nᵀ  for n = 0, 1, ..., N−1 in order (im2col recomputed: cheaper in
//        memory than keeping every image's columns from the forward pass).
//   db:  db[o] += Σ_n Σ_pq dy[n, o, p, q]
//
// ---- Bounded workspace ------------------------------------------------------------------------
// The column matrix of a whole batch can be huge (CIFAR, 64 channels, 3×3, 32×32, batch 256:
// 576 × 1024 × 256 floats = 604 MB). So the caller passes a workspace for `col_images` images
// and the batch is processed that many images at a time (nn/conv.cpp sizes it from a byte
// bound, 32 MiB by default).
//
// ---- Threads, and why the result never depends on their number --------------------------------
// forward and dx: the images of a chunk are shared among the threads (each image: its own
// im2col, its own GEMM on one thread). Every output element is computed by one image's GEMM,
// whose arithmetic does not depend on where it runs. A chunk of one image instead gives
// all threads to the GEMM, which is itself bitwise independent of the thread count.
// dw: a sum over images. The columns of a chunk are built in parallel, then each thread takes
// a band of dw's columns and adds the images into it one after the other, in image order.
// The order of the sum depends on N only, never on threads or on the chunk size, so even a
// tiny workspace gives bitwise the same dw.
#include <algorithm>
#include <cstring>

#include <omp.h>

#include "core/error.h"
#include "ops/cpu/cnn_ops.h"
#include "ops/cpu/gemm.h"

namespace kiln::cpu {

ConvAlgo conv2d_algo(const Conv2dParams& p) {
    if (p.groups == p.C && p.O == p.C) return ConvAlgo::Depthwise;
    if (p.KH == 1 && p.KW == 1 && p.stride == 1 && p.padding == 0) return ConvAlgo::Pointwise;
    return ConvAlgo::Im2col;
}

const char* conv_algo_name(ConvAlgo a) {
    switch (a) {
        case ConvAlgo::Im2col: return "im2col";
        case ConvAlgo::Pointwise: return "pointwise";
        case ConvAlgo::Depthwise: return "depthwise";
    }
    return "?";
}

int64_t conv2d_col_floats_per_image(const Conv2dParams& p) {
    if (conv2d_algo(p) != ConvAlgo::Im2col) return 0;
    return p.C * p.KH * p.KW * p.P() * p.Q();
}

namespace {

void check_params(const Conv2dParams& p, const char* op) {
    KILN_CHECK(p.N >= 0 && p.C > 0 && p.H > 0 && p.W > 0 && p.O > 0 && p.KH > 0 && p.KW > 0 && p.stride > 0 &&
                   p.padding >= 0 && p.dilation > 0 && p.groups > 0,
               op, ": bad sizes N=", p.N, " C=", p.C, " H=", p.H, " W=", p.W, " O=", p.O, " K=", p.KH, "x", p.KW,
               " stride=", p.stride, " padding=", p.padding, " dilation=", p.dilation, " groups=", p.groups);
    KILN_CHECK(p.C % p.groups == 0 && p.O % p.groups == 0, op, ": groups=", p.groups, " must divide C=", p.C,
               " and O=", p.O);
    KILN_CHECK(p.P() > 0 && p.Q() > 0, op, ": a ", p.KH, "x", p.KW, " kernel (dilation ", p.dilation,
               ") does not fit a ", p.H, "x", p.W, " input with padding ", p.padding);
}

// The range [lo, hi) of output positions q whose input position q·stride + off lies in [0, W).
// Computed once per kernel offset, so the inner loops need no test and no division.
inline void valid_range(int64_t off, int64_t W, int64_t stride, int64_t Q, int64_t& lo, int64_t& hi) {
    lo = off >= 0 ? 0 : (-off + stride - 1) / stride;
    hi = (W - 1 - off) >= 0 ? std::min(Q, (W - 1 - off) / stride + 1) : 0;
    lo = std::min(lo, hi);
}

// Below this many flops a parallel region costs more than it saves (waking a team and its
// barrier take microseconds — much more when the cores are shared with other programs).
constexpr double kParallelMinFlops = 2.0 * 96 * 96 * 96;  // the same bar as gemm.cpp's

// Runs body(n, slot) for the images n0 .. n0 + count − 1, slot = n − n0 (which workspace slice).
// Several images: one image per thread at a time. One image, or little work: on this thread
// (the GEMMs inside then use every thread if they are big enough).
template <typename Body> void for_images(int64_t n0, int64_t count, double flops_per_image, Body body) {
#pragma omp parallel for schedule(static) if (count > 1 && double(count) * flops_per_image >= kParallelMinFlops)
    for (int64_t i = 0; i < count; i++) body(n0 + i, i);
}

// Multiply-adds ×2 of one image's convolution (any of the three passes).
double flops_per_image(const Conv2dParams& p) {
    return 2.0 * double(p.O) * double(p.P() * p.Q()) * double(p.Cg() * p.KH * p.KW);
}

// ---- depthwise: G == C == O, w [C, 1, KH, KW] --------------------------------------------------
// y[n, c, p, q] = b[c] + Σ_{kh, kw} w[c, kh, kw] · x[n, c, p·s − pad + kh·d, q·s − pad + kw·d]
void depthwise_forward(const float* x, const float* w, const float* b, float* y, const Conv2dParams& p) {
    const int64_t H = p.H, W = p.W, P = p.P(), Q = p.Q(), s = p.stride, C = p.C;
#pragma omp parallel for schedule(static) if (double(p.N) * flops_per_image(p) >= kParallelMinFlops)
    for (int64_t nc = 0; nc < p.N * C; nc++) {
        const int64_t c = nc % C;
        const float* xp = x + nc * H * W;
        float* yp = y + nc * P * Q;
        std::fill(yp, yp + P * Q, b ? b[c] : 0.0f);
        for (int64_t kh = 0; kh < p.KH; kh++)
            for (int64_t kw = 0; kw < p.KW; kw++) {
                const float wv = w[(c * p.KH + kh) * p.KW + kw];
                const int64_t off_w = kw * p.dilation - p.padding;
                int64_t q_lo, q_hi;
                valid_range(off_w, W, s, Q, q_lo, q_hi);
                for (int64_t op = 0; op < P; op++) {
                    const int64_t ih = op * s + kh * p.dilation - p.padding;
                    if (ih < 0 || ih >= H) continue;
                    const float* src = xp + ih * W + off_w;
                    float* dst = yp + op * Q;
                    for (int64_t q = q_lo; q < q_hi; q++) dst[q] += wv * src[q * s];
                }
            }
    }
}

// dx[n, c, ih, iw] = Σ over the (p, q, kh, kw) that read it of w[c, kh, kw] · dy[n, c, p, q]
void depthwise_backward_data(const float* dy, const float* w, float* dx, const Conv2dParams& p) {
    const int64_t H = p.H, W = p.W, P = p.P(), Q = p.Q(), s = p.stride, C = p.C;
#pragma omp parallel for schedule(static) if (double(p.N) * flops_per_image(p) >= kParallelMinFlops)
    for (int64_t nc = 0; nc < p.N * C; nc++) {
        const int64_t c = nc % C;
        const float* dyp = dy + nc * P * Q;
        float* dxp = dx + nc * H * W;
        std::fill(dxp, dxp + H * W, 0.0f);
        for (int64_t kh = 0; kh < p.KH; kh++)
            for (int64_t kw = 0; kw < p.KW; kw++) {
                const float wv = w[(c * p.KH + kh) * p.KW + kw];
                const int64_t off_w = kw * p.dilation - p.padding;
                int64_t q_lo, q_hi;
                valid_range(off_w, W, s, Q, q_lo, q_hi);
                for (int64_t op = 0; op < P; op++) {
                    const int64_t ih = op * s + kh * p.dilation - p.padding;
                    if (ih < 0 || ih >= H) continue;
                    float* dst = dxp + ih * W + off_w;
                    const float* src = dyp + op * Q;
                    for (int64_t q = q_lo; q < q_hi; q++) dst[q * s] += wv * src[q];
                }
            }
    }
}

// dw[c, kh, kw] += Σ_n Σ_{p,q} dy[n, c, p, q] · x[n, c, ih, iw]: one channel per thread, images
// in order, each (n, kh, kw) partial sum in double.
void depthwise_backward_weight(const float* x, const float* dy, float* dw, const Conv2dParams& p) {
    const int64_t H = p.H, W = p.W, P = p.P(), Q = p.Q(), s = p.stride, C = p.C;
#pragma omp parallel for schedule(static) if (double(p.N) * flops_per_image(p) >= kParallelMinFlops)
    for (int64_t c = 0; c < C; c++) {
        for (int64_t kh = 0; kh < p.KH; kh++)
            for (int64_t kw = 0; kw < p.KW; kw++) {
                const int64_t off_w = kw * p.dilation - p.padding;
                int64_t q_lo, q_hi;
                valid_range(off_w, W, s, Q, q_lo, q_hi);
                double acc = 0.0;
                for (int64_t n = 0; n < p.N; n++) {
                    const float* xp = x + (n * C + c) * H * W;
                    const float* dyp = dy + (n * C + c) * P * Q;
                    float part = 0.0f;  // one image's sum; every lane pattern fixed by the sizes
                    for (int64_t op = 0; op < P; op++) {
                        const int64_t ih = op * s + kh * p.dilation - p.padding;
                        if (ih < 0 || ih >= H) continue;
                        const float* src = xp + ih * W + off_w;
                        const float* g = dyp + op * Q;
                        for (int64_t q = q_lo; q < q_hi; q++) part += g[q] * src[q * s];
                    }
                    acc += part;
                }
                dw[(c * p.KH + kh) * p.KW + kw] += float(acc);
            }
    }
}

}  // namespace

// ---- im2col / col2im ------------------------------------------------------------------------
// One row of col per (c, kh, kw); within it, one run of Q per output row p: zeros where the
// window hangs over the padding, a copy of an input row segment (memcpy at stride 1) between.
void im2col(const float* x, int64_t C, const Conv2dParams& p, float* col) {
    const int64_t H = p.H, W = p.W, P = p.P(), Q = p.Q(), s = p.stride;
    for (int64_t c = 0; c < C; c++) {
        const float* xc = x + c * H * W;
        for (int64_t kh = 0; kh < p.KH; kh++)
            for (int64_t kw = 0; kw < p.KW; kw++) {
                float* row = col + ((c * p.KH + kh) * p.KW + kw) * P * Q;
                const int64_t off_w = kw * p.dilation - p.padding;
                int64_t q_lo, q_hi;
                valid_range(off_w, W, s, Q, q_lo, q_hi);
                for (int64_t op = 0; op < P; op++) {
                    float* dst = row + op * Q;
                    const int64_t ih = op * s + kh * p.dilation - p.padding;
                    if (ih < 0 || ih >= H) {
                        std::memset(dst, 0, size_t(Q) * sizeof(float));
                        continue;
                    }
                    const float* src = xc + ih * W + off_w;  // src[q·s] is x[c][ih][q·s + off_w]
                    for (int64_t q = 0; q < q_lo; q++) dst[q] = 0.0f;
                    if (s == 1)
                        std::memcpy(dst + q_lo, src + q_lo, size_t(q_hi - q_lo) * sizeof(float));
                    else
                        for (int64_t q = q_lo; q < q_hi; q++) dst[q] = src[q * s];
                    for (int64_t q = q_hi; q < Q; q++) dst[q] = 0.0f;
                }
            }
    }
}

// The same walk as im2col with the arrows reversed: dx[c][ih][iw] += col[row][p·Q + q].
// Entries that fell on padding are dropped. Fixed order (c, kh, kw, p, q): deterministic.
void col2im(const float* col, int64_t C, const Conv2dParams& p, float* dx) {
    const int64_t H = p.H, W = p.W, P = p.P(), Q = p.Q(), s = p.stride;
    std::memset(dx, 0, size_t(C * H * W) * sizeof(float));
    for (int64_t c = 0; c < C; c++) {
        float* dxc = dx + c * H * W;
        for (int64_t kh = 0; kh < p.KH; kh++)
            for (int64_t kw = 0; kw < p.KW; kw++) {
                const float* row = col + ((c * p.KH + kh) * p.KW + kw) * P * Q;
                const int64_t off_w = kw * p.dilation - p.padding;
                int64_t q_lo, q_hi;
                valid_range(off_w, W, s, Q, q_lo, q_hi);
                for (int64_t op = 0; op < P; op++) {
                    const int64_t ih = op * s + kh * p.dilation - p.padding;
                    if (ih < 0 || ih >= H) continue;
                    float* dst = dxc + ih * W + off_w;
                    const float* src = row + op * Q;
                    if (s == 1)
                        for (int64_t q = q_lo; q < q_hi; q++) dst[q] += src[q];
                    else
                        for (int64_t q = q_lo; q < q_hi; q++) dst[q * s] += src[q];
                }
            }
    }
}

// ---- forward ------------------------------------------------------------------------------------
// Per image n and group g (Kc = Cg·KH·KW rows of col per group):
//   y_n[g·Og .. , P·Q] = w[g·Og .. , Kc] · col_n[g·Kc .. , P·Q]  (+ b, put in y first: beta = 1)
void conv2d_forward(const float* x, const float* w, const float* b, float* y, const Conv2dParams& p, float* col,
                    int64_t col_images) {
    check_params(p, "conv2d_forward");
    const ConvAlgo algo = conv2d_algo(p);
    if (algo == ConvAlgo::Depthwise) return depthwise_forward(x, w, b, y, p);
    const int64_t G = p.groups, Og = p.Og(), PQ = p.P() * p.Q(), Kc = p.Cg() * p.KH * p.KW;
    const int64_t CHW = p.C * p.H * p.W, col_size = conv2d_col_floats_per_image(p);
    const int64_t chunk = algo == ConvAlgo::Im2col ? col_images : p.N;
    KILN_CHECK(algo != ConvAlgo::Im2col || (col && col_images >= 1), "conv2d_forward: needs a workspace of ",
               col_size, " floats per image");

    auto one_image = [&](int64_t n, int64_t slot) {
        const float* cols = x + n * CHW;  // Pointwise: x_n is [C, H·W], its own column matrix
        if (algo == ConvAlgo::Im2col) {
            cols = col + slot * col_size;
            im2col(x + n * CHW, p.C, p, col + slot * col_size);
        }
        float* yn = y + n * p.O * PQ;
        if (b)
            for (int64_t o = 0; o < p.O; o++) std::fill(yn + o * PQ, yn + (o + 1) * PQ, b[o]);
        for (int64_t g = 0; g < G; g++)
            gemm(false, false, Og, PQ, Kc, 1.0f, w + g * Og * Kc, Kc, cols + g * Kc * PQ, PQ, b ? 1.0f : 0.0f,
                 yn + g * Og * PQ, PQ);
    };
    for (int64_t n0 = 0; n0 < p.N; n0 += chunk)
        for_images(n0, std::min(chunk, p.N - n0), flops_per_image(p), one_image);
}

// ---- backward: dx ---------------------------------------------------------------------------------
//   dcol_n[g·Kc .. , P·Q] = w[g·Og .. , Kc]ᵀ · dy_n[g·Og .. , P·Q];   dx_n = col2im(dcol_n)
void conv2d_backward_data(const float* dy, const float* w, float* dx, const Conv2dParams& p, float* col,
                          int64_t col_images) {
    check_params(p, "conv2d_backward_data");
    const ConvAlgo algo = conv2d_algo(p);
    if (algo == ConvAlgo::Depthwise) return depthwise_backward_data(dy, w, dx, p);
    const int64_t G = p.groups, Og = p.Og(), PQ = p.P() * p.Q(), Kc = p.Cg() * p.KH * p.KW;
    const int64_t CHW = p.C * p.H * p.W, col_size = conv2d_col_floats_per_image(p);
    const int64_t chunk = algo == ConvAlgo::Im2col ? col_images : p.N;
    KILN_CHECK(algo != ConvAlgo::Im2col || (col && col_images >= 1), "conv2d_backward_data: needs a workspace of ",
               col_size, " floats per image");

    auto one_image = [&](int64_t n, int64_t slot) {
        const float* dyn = dy + n * p.O * PQ;
        // Pointwise: dcol_n is dx_n itself
        float* dcol = algo == ConvAlgo::Im2col ? col + slot * col_size : dx + n * CHW;
        for (int64_t g = 0; g < G; g++)
            gemm(true, false, Kc, PQ, Og, 1.0f, w + g * Og * Kc, Kc, dyn + g * Og * PQ, PQ, 0.0f, dcol + g * Kc * PQ,
                 PQ);
        if (algo == ConvAlgo::Im2col) col2im(dcol, p.C, p, dx + n * CHW);
    };
    for (int64_t n0 = 0; n0 < p.N; n0 += chunk)
        for_images(n0, std::min(chunk, p.N - n0), flops_per_image(p), one_image);
}

// ---- backward: dw and db -----------------------------------------------------------------------
//   dw[g·Og .. , Kc] += dy_n[g·Og .. , P·Q] · col_n[g·Kc .. , P·Q]ᵀ     for n = 0 .. N−1 in order
//   db[o] += Σ_n Σ_pq dy[n, o, pq]                                       (one channel per thread)
void conv2d_backward_weight(const float* x, const float* dy, float* dw, float* db, const Conv2dParams& p, float* col,
                            int64_t col_images) {
    check_params(p, "conv2d_backward_weight");
    const int64_t PQ = p.P() * p.Q();
    if (db) {
#pragma omp parallel for schedule(static) if (double(p.N * p.O * PQ) >= kParallelMinFlops)
        for (int64_t o = 0; o < p.O; o++) {
            double acc = 0.0;
            for (int64_t n = 0; n < p.N; n++) {
                const float* g = dy + (n * p.O + o) * PQ;
                float part = 0.0f;
                for (int64_t i = 0; i < PQ; i++) part += g[i];
                acc += part;
            }
            db[o] += float(acc);
        }
    }
    const ConvAlgo algo = conv2d_algo(p);
    if (algo == ConvAlgo::Depthwise) return depthwise_backward_weight(x, dy, dw, p);
    const int64_t G = p.groups, Og = p.Og(), Kc = p.Cg() * p.KH * p.KW;
    const int64_t CHW = p.C * p.H * p.W, col_size = conv2d_col_floats_per_image(p);
    const int64_t chunk = algo == ConvAlgo::Im2col ? col_images : p.N;
    KILN_CHECK(algo != ConvAlgo::Im2col || (col && col_images >= 1), "conv2d_backward_weight: needs a workspace of ",
               col_size, " floats per image");

    // One parallel region per chunk: the chunk's columns are built (one image per thread),
    // then thread t adds every image of the chunk, in order, into its own band of dw's columns
    // [j0, j1) — bands are multiples of 64 columns (a multiple of the GEMM's NR tile), so each
    // dw element goes through exactly the arithmetic of one full GEMM, whatever the bands.
    const int64_t bands = (Kc + 63) / 64;
    const double chunk_flops = double(std::min(chunk, p.N)) * flops_per_image(p);
    for (int64_t n0 = 0; n0 < p.N; n0 += chunk) {
        const int64_t count = std::min(chunk, p.N - n0);
#pragma omp parallel if (chunk_flops >= kParallelMinFlops)
        {
            if (algo == ConvAlgo::Im2col) {
#pragma omp for schedule(static)
                for (int64_t i = 0; i < count; i++) im2col(x + (n0 + i) * CHW, p.C, p, col + i * col_size);
            }  // (the implicit barrier: every column is ready)
            const int64_t T = omp_get_num_threads(), t = omp_get_thread_num();
            const int64_t j0 = std::min(Kc, bands * t / T * 64), j1 = std::min(Kc, bands * (t + 1) / T * 64);
            for (int64_t i = 0; i < count && j0 < j1; i++) {  // in image order: the sum's order is fixed
                const int64_t n = n0 + i;
                const float* cols = algo == ConvAlgo::Im2col ? col + i * col_size : x + n * CHW;
                const float* dyn = dy + n * p.O * PQ;
                for (int64_t g = 0; g < G; g++)
                    gemm(false, true, Og, j1 - j0, PQ, 1.0f, dyn + g * Og * PQ, PQ, cols + (g * Kc + j0) * PQ, PQ,
                         1.0f, dw + g * Og * Kc + j0, Kc);
            }
        }
    }
}

}  // namespace kiln::cpu
