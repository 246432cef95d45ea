// conv.cpp — 2-D convolution on the CPU: im2col + GEMM, two direct paths, and the choice of
// Winograd's path for big 3×3 layers (chapter 03).
//
// Build and test just the convolution:
//   make build/src/ops/cpu/conv.o build/src/nn/conv.o build/tests/test_conv.o
//   (link with build/libkiln.a, see tests/test_conv.cpp)  then  ./kiln_tests '[conv]'
//
// Letters as in ops/params.h: N C H W (input), O (output channels), KH KW (kernel), P Q (output),
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
//   v4  fewer multiplications: a 3×3, stride-1 layer as 4×4 output tiles by Winograd's
//       F(4×4, 3×3), 36 GEMMs on transformed tiles with 4× fewer multiply-adds (winograd.cpp;
//       F(2×2, 3×3), 16 GEMMs and 2.25× fewer, with KILN_CONV=winograd2x2), where winograd.h's
//       bounds say it is faster (f32, at least 64 channels in and out).
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
// forward and dx: the images of a chunk are shared among the threads, a small group of
// consecutive images at a time (one im2col per image, one GEMM for the group, on one thread;
// see "Several images in one GEMM" below), each thread in its own slot of the workspace, reused
// group after group so that the columns it writes are still in its cache when its GEMM reads
// them (for_groups_in_slots, conv_tasks.h). Every output element is computed by one GEMM dot
// product whose arithmetic does not depend on where it runs or on the group. A chunk of one
// image instead gives all threads to the GEMM, which is itself bitwise independent of the
// thread count.
// dw: a sum over images. The columns of a chunk are built in parallel, then each task takes
// a band of dw's columns and adds the images into it one after the other, in image order. A
// small dw (f32) is summed in 8 slices of images instead, each into its own partial sum (an
// image's columns built just before they are added, in the thread's slot), added up in slice
// order at the end (conv2d_backward_weight_slices). Either way the order of the sum
// depends on N only, never on threads or on the chunk size, so even a tiny workspace gives
// bitwise the same dw.
//
// ---- f16 and bf16 ------------------------------------------------------------------------------
// The same code for T = float, f16 and bf16: x, w, b, y, dy, dx, dw, db and the workspace all
// hold T. The GEMMs (gemm.h) sum in f32 and round their output once; the direct loops sum in
// float (or double) and round once; scatters (col2im, depthwise's dx) add into a float plane
// (F32Plane, f32_blocks.h; depthwise's is padded) rounded once. Two places round twice:
//   dx (Im2col)  the GEMM's dcol is stored in T, then col2im adds up to KH·KW of its entries
//                (in f32) and rounds again: |dx_T − dx| ≤ 2u·Σ|terms| rather than u.
//   dw           adding image after image into a dw of T would round once per image (and in
//                bf16 a small image's share is lost once dw is large), so for f16 and bf16
//                the chunk's images lie side by side, as in the forward, and one GEMM sums them
//                along K = k·P·Q: dw is rounded once per workspace chunk — once when the
//                workspace holds the batch. (Pointwise, with no workspace, adds image by image.)
#include <algorithm>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "ops/cpu/conv_tasks.h"
#include "ops/cpu/f32_blocks.h"
#include "ops/cpu/gemm.h"
#include "ops/cpu/short_rows.h"
#include "ops/cpu/winograd.h"
#include "ops/conv.h"

namespace kiln::cpu {

// im2col's workspace per image: its columns and its rows of y (or dy), "Several images in one
// GEMM" below.
static int64_t im2col_elems_per_image(const Conv2dParams& p) { return (p.C * p.KH * p.KW + p.O) * p.P() * p.Q(); }

ConvAlgo conv2d_algo(const Conv2dParams& p, DType dtype) {
    if (p.groups == p.C && p.O == p.C) return ConvAlgo::Depthwise;
    if (p.KH == 1 && p.KW == 1 && p.stride == 1 && p.padding == 0) return ConvAlgo::Pointwise;
    if (dtype == DType::F32 && winograd_chosen(p)) return ConvAlgo::Winograd;
    return ConvAlgo::Im2col;
}

int64_t conv2d_col_elems_per_image(const Conv2dParams& p, DType dtype) {
    switch (conv2d_algo(p, dtype)) {
        case ConvAlgo::Im2col: return im2col_elems_per_image(p);
        case ConvAlgo::Winograd: return winograd_elems_per_image(p);
        default: return 0;
    }
}

int64_t conv2d_chunk_images(const Conv2dParams& p, DType dtype, int64_t fit) {
    return conv2d_algo(p, dtype) == ConvAlgo::Winograd ? winograd_chunk_images(p, fit) : fit;
}

int64_t conv2d_backward_weight_scratch(const Conv2dParams&) { return 0; }  // dw sums in place

// Both passes read the workspace the forward's strategy needs (the backward passes follow it).
int64_t conv2d_workspace_per_image(const Conv2dParams& p, DType dtype, bool) {
    return conv2d_col_elems_per_image(p, dtype);
}

namespace {

// The range [lo, hi) of output positions q whose input position q·stride + off lies in [0, W).
// Computed once per kernel offset, so the inner loops need no test and no division.
// (Stride 1, the common case, without the two integer divisions: they cost more than copying
// the 8-value rows of a small layer's im2col.)
inline void valid_range(int64_t off, int64_t W, int64_t stride, int64_t Q, int64_t& lo, int64_t& hi) {
    if (stride == 1) {
        lo = std::max<int64_t>(0, -off);
        hi = std::max<int64_t>(0, std::min(Q, W - off));
    } else {
        lo = off >= 0 ? 0 : (-off + stride - 1) / stride;
        hi = (W - 1 - off) >= 0 ? std::min(Q, (W - 1 - off) / stride + 1) : 0;
    }
    lo = std::min(lo, hi);
}

// ---- depthwise: G == C == O, w [C, 1, KH, KW] --------------------------------------------------
// Each channel is its own small convolution, a plane at a time: per tap (kh, kw), a run of each
// output row against a run of an input row. The runs are contiguous when the stride is 1, and the
// two helpers below give g++ that case as a loop of its own, which it vectorizes; with the
// stride a variable it vectorized none of them (MobileNetV2's depthwise layers ran at ~2 GFLOP/s,
// 40% of its training step on a Zen 3). Each keeps the order of every sum: the same bits.

// y[q·sy] += a · x[q·sx] for q in [0, n): the forward gathers (sx = stride, sy = 1), dx scatters
// (sx = 1, sy = stride). x and y never overlap (an input and an f32 plane), which `omp simd` tells
// g++: without it, it did not vectorize the loop even with both strides 1.
template <typename T>
inline void axpy_strided(float a, const T* x, int64_t sx, float* y, int64_t sy, int64_t n) {
    if (sx == 1 && sy == 1) {
#pragma omp simd
        for (int64_t q = 0; q < n; q++) y[q] += a * float(x[q]);
    } else {
        for (int64_t q = 0; q < n; q++) y[q * sy] += a * float(x[q * sx]);
    }
}

// One (image, tap) sum of dw: Σ_{op < P, q < Q} g[op·Q + q] · x[op·s·ld + q·s], in float, as 8
// running sums (sum j takes the q ≡ j mod 8 of each row's 8-element blocks, rows in order), then
// the rows' last Q mod 8 products, added in that order at the end. The order depends on the sizes
// only; with s = 1, g++ keeps the 8 sums in one vector register.
template <typename T>
float tap_dot(const T* g, const float* x, int64_t P, int64_t Q, int64_t s, int64_t ld) {
    float sums[8] = {}, rest = 0.0f;
    for (int64_t op = 0; op < P; op++) {
        const T* gr = g + op * Q;
        const float* xr = x + op * s * ld;
        int64_t q = 0;
        if (s == 1) {
            for (; q + 8 <= Q; q += 8)
                for (int j = 0; j < 8; j++) sums[j] += float(gr[q + j]) * xr[q + j];
        } else {
            for (; q + 8 <= Q; q += 8)
                for (int j = 0; j < 8; j++) sums[j] += float(gr[q + j]) * xr[(q + j) * s];
        }
        for (; q < Q; q++) rest += float(gr[q]) * xr[q * s];
    }
    for (float v : sums) rest += v;
    return rest;
}

// One image's plane of x, widened to float, with `pad` zeros on every side: H + 2·pad rows of
// W + 2·pad. Every tap's window lies inside it, so an output row meets the plane in one whole run
// of Q products: no valid range, and no short remainder where the window crosses the border
// (with the rows cut to their valid range, 31 of 32 long, those remainders were half of dw's time).
template <typename T>
void padded_plane(const T* x, int64_t H, int64_t W, int64_t pad, float* out) {
    const int64_t Wp = W + 2 * pad;
    std::fill(out, out + (H + 2 * pad) * Wp, 0.0f);
    for (int64_t h = 0; h < H; h++) {
        float* row = out + (h + pad) * Wp + pad;
#pragma omp simd
        for (int64_t w = 0; w < W; w++) row[w] = float(x[h * W + w]);
    }
}

// Stride 1: a tap reads the padded plane shifted by (kh·d, kw·d), so over rows as wide as the
// padded plane's, the P rows of y are one run (as in the int8 kernel, quant.cpp's taps_flat):
//   wide[i] = bias, then wide[i] += w[c, kh, kw] · xpad[i + kh·d·Wp + kw·d] for i < (P−1)·Wp + Q,
// taps in (kh, kw) order, and row p of y is wide[p·Wp .. p·Wp + Q). One loop of ~P·Wp values per
// tap where rows gave loops of Q (MobileNetV2's 4×4 and 8×8 planes: too short to vectorize); every
// value sees the same operations in the same order as row by row, so the same bits.
void taps_flat(const float* xpad, int64_t Wp, const float* wc, const Conv2dParams& p, float bias, float* wide,
               float* y) {
    const int64_t P = p.P(), Q = p.Q(), d = p.dilation, n = (P - 1) * Wp + Q;
    std::fill(wide, wide + n, bias);
    for (int64_t kh = 0; kh < p.KH; kh++)
        for (int64_t kw = 0; kw < p.KW; kw++) axpy_strided(wc[kh * p.KW + kw], xpad + kh * d * Wp + kw * d, 1, wide, 1, n);
    for (int64_t op = 0; op < P; op++) std::copy(wide + op * Wp, wide + op * Wp + Q, y + op * Q);
}

template <typename T>
void depthwise_forward(const T* x, const T* w, const T* b, T* y, const Conv2dParams& p) {
    const int64_t H = p.H, W = p.W, P = p.P(), Q = p.Q(), s = p.stride, C = p.C, d = p.dilation;
    const int64_t Wp = W + 2 * p.padding, taps = p.KH * p.KW;
    parallel_for(p.N * C, flop_grain(p.N * C, double(p.N) * flops_per_image(p)), [&](int64_t nc0, int64_t nc1) {
        std::vector<float> xpad(static_cast<size_t>((H + 2 * p.padding) * Wp));
        std::vector<float> wide(static_cast<size_t>(s == 1 ? P * Wp : 0)), wc(static_cast<size_t>(taps));
        for (int64_t nc = nc0; nc < nc1; nc++) {
            const int64_t c = nc % C;
            const float bias = b ? float(b[c]) : 0.0f;
            padded_plane(x + nc * H * W, H, W, p.padding, xpad.data());
            for (int64_t t = 0; t < taps; t++) wc[size_t(t)] = float(w[c * taps + t]);
            F32Plane<T> plane(y + nc * P * Q, P * Q, bias);
            if (s == 1) {
                taps_flat(xpad.data(), Wp, wc.data(), p, bias, wide.data(), plane.data());
            } else {
                for (int64_t op = 0; op < P; op++) {  // a row of y stays in L1 while its taps add in
                    float* yr = plane.data() + op * Q;
                    for (int64_t kh = 0; kh < p.KH; kh++) {
                        const float* xr = xpad.data() + (op * s + kh * d) * Wp;  // padded row op·s + kh·d
                        for (int64_t kw = 0; kw < p.KW; kw++) axpy_strided(wc[size_t(kh * p.KW + kw)], xr + kw * d, s, yr, 1, Q);
                    }
                }
            }
            plane.store();
        }
    });
}

// dx[n, c, ih, iw] = Σ over the (p, q, kh, kw) that read it of w[c, kh, kw] · dy[n, c, p, q]: added into
// a padded f32 plane (what lands on the padding is dropped), taps in (kh, kw) order, then rounded
// into dx once.
// Stride 1, as taps_flat: dy laid out in rows as wide as the padded plane, zeros past Q, is one run
// per tap: dxpad[i + kh·d·Wp + kw·d] += w · dy_wide[i] for i < (P−1)·Wp + Q. With finite weights the
// zeros add ±0, which leaves every sum as it was (dxpad starts at +0, and sums that start at +0 never
// reach −0), and each element takes its taps in the same (kh, kw) order: the bits of the row-by-row
// loop (below, for the other strides).
template <typename T>
void depthwise_backward_data(const T* dy, const T* w, T* dx, const Conv2dParams& p) {
    const int64_t H = p.H, W = p.W, P = p.P(), Q = p.Q(), s = p.stride, C = p.C, d = p.dilation;
    const int64_t Wp = W + 2 * p.padding, taps = p.KH * p.KW;
    parallel_for(p.N * C, flop_grain(p.N * C, double(p.N) * flops_per_image(p)), [&](int64_t nc0, int64_t nc1) {
        std::vector<float> dxpad(static_cast<size_t>((H + 2 * p.padding) * Wp));
        std::vector<float> dy_wide(static_cast<size_t>(s == 1 ? P * Wp : 0));  // [P, Wp], zeros past Q
        for (int64_t nc = nc0; nc < nc1; nc++) {
            const int64_t c = nc % C;
            const T* dyp = dy + nc * P * Q;
            std::fill(dxpad.begin(), dxpad.end(), 0.0f);
            if (s == 1) {
                const int64_t n = (P - 1) * Wp + Q;
                for (int64_t op = 0; op < P; op++)
                    for (int64_t q = 0; q < Q; q++) dy_wide[size_t(op * Wp + q)] = float(dyp[op * Q + q]);
                for (int64_t kh = 0; kh < p.KH; kh++)
                    for (int64_t kw = 0; kw < p.KW; kw++)
                        axpy_strided(float(w[c * taps + kh * p.KW + kw]), dy_wide.data(), 1,
                                     dxpad.data() + kh * d * Wp + kw * d, 1, n);
            } else {
                for (int64_t kh = 0; kh < p.KH; kh++)
                    for (int64_t kw = 0; kw < p.KW; kw++) {
                        const float wv = float(w[c * taps + kh * p.KW + kw]);
                        for (int64_t op = 0; op < P; op++)
                            axpy_strided(wv, dyp + op * Q, 1, dxpad.data() + (op * s + kh * d) * Wp + kw * d, s, Q);
                    }
            }
            T* out = dx + nc * H * W;
            for (int64_t h = 0; h < H; h++) {
                const float* row = dxpad.data() + (h + p.padding) * Wp + p.padding;
                for (int64_t iw = 0; iw < W; iw++) out[h * W + iw] = T(row[iw]);
            }
        }
    });
}

// dw[c, kh, kw] += Σ_n Σ_{p,q} dy[n, c, p, q] · x[n, c, ih, iw]: one channel per thread, images in
// order, each (n, kh, kw) partial sum in float (tap_dot, over x's padded plane: a product with a
// padding zero adds nothing), their sum over n in double. The images are the outer loop and the
// taps the inner one, so each image's planes are read from memory once and stay in L1 for their
// KH·KW dot products (taps outermost, a 3×3 layer read its activations 9 times).
template <typename T>
void depthwise_backward_weight(const T* x, const T* dy, T* dw, const Conv2dParams& p) {
    const int64_t H = p.H, W = p.W, P = p.P(), Q = p.Q(), s = p.stride, C = p.C, taps = p.KH * p.KW;
    const int64_t Wp = W + 2 * p.padding, d = p.dilation;
    parallel_for(C, flop_grain(C, double(p.N) * flops_per_image(p)), [&](int64_t c0, int64_t c1) {
        std::vector<double> acc(static_cast<size_t>(taps));
        std::vector<float> xpad(static_cast<size_t>((H + 2 * p.padding) * Wp));
        for (int64_t c = c0; c < c1; c++) {
            std::fill(acc.begin(), acc.end(), 0.0);
            for (int64_t n = 0; n < p.N; n++) {
                padded_plane(x + (n * C + c) * H * W, H, W, p.padding, xpad.data());
                const T* dyp = dy + (n * C + c) * P * Q;
                for (int64_t kh = 0; kh < p.KH; kh++)
                    for (int64_t kw = 0; kw < p.KW; kw++)  // the tap's window starts at padded (kh·d, kw·d)
                        acc[size_t(kh * p.KW + kw)] += tap_dot(dyp, xpad.data() + kh * d * Wp + kw * d, P, Q, s, Wp);
            }
            for (int64_t t = 0; t < taps; t++) {
                T& dwv = dw[c * taps + t];
                dwv = T(float(dwv) + float(acc[size_t(t)]));
            }
        }
    });
}

}  // namespace

// ---- im2col / col2im ------------------------------------------------------------------------
// One row of col per (c, kh, kw); within it, one run of Q per output row p: zeros where the
// window hangs over the padding, a copy of an input row segment between. Rows of col are ld
// floats apart: ld = P·Q for one image alone, k·P·Q for k images side by side (forward below).
//
// The common case, stride 1 with "same" padding (Q == W: a 3×3 kernel with padding 1), has a
// shortcut. There, consecutive output rows read consecutive input rows of the same length, so
// the valid rows op_lo .. op_hi−1 of one (c, kh, kw) are a single run of x shifted by a constant:
//   col_row[op·Q + q] = x_c[(op + off_h)·W + q + off_w]   for every valid (op, q)
// One long copy fills them (instead of one short copy of 3 to 31 floats per output row, each
// paying a call's set-up); the columns over the left and right padding, which the copy filled
// with the neighbouring row's ends, are zeroed after it.

// Where the run of one (kh, kw) starts and how long it is: from (op_lo, q_lo) to (op_hi−1, q_hi−1)
// in the col row, and from the input position they read. Only for stride 1 with Q == W.
struct SameWidthRun {
    int64_t col_start, x_start, length;
};
inline SameWidthRun same_width_run(int64_t op_lo, int64_t op_hi, int64_t q_lo, int64_t q_hi, int64_t off_h,
                                   int64_t off_w, int64_t W) {
    return {op_lo * W + q_lo, (op_lo + off_h) * W + q_lo + off_w, (op_hi - op_lo - 1) * W + q_hi - q_lo};
}

// Sets the columns q < q_lo and q ≥ q_hi of the rows op_lo .. op_hi − 1 of one col row to pad:
// one or two entries per row for a 3×3 kernel, so a loop down each column (a call to memset per
// entry would cost more than the entry).
template <typename T>
void fill_padding_columns(T* row, int64_t op_lo, int64_t op_hi, int64_t q_lo, int64_t q_hi, int64_t Q, T pad) {
    for (int64_t q = 0; q < q_lo; q++)
        for (int64_t op = op_lo; op < op_hi; op++) row[op * Q + q] = pad;
    for (int64_t q = q_hi; q < Q; q++)
        for (int64_t op = op_lo; op < op_hi; op++) row[op * Q + q] = pad;
}

template <typename T>
void im2col(const T* x, int64_t C, const Conv2dParams& p, T* col, int64_t ld, T pad) {
    const int64_t H = p.H, W = p.W, P = p.P(), Q = p.Q(), s = p.stride;
    const bool same_width = s == 1 && Q == W;
    for (int64_t c = 0; c < C; c++) {
        const T* xc = x + c * H * W;
        for (int64_t kh = 0; kh < p.KH; kh++)
            for (int64_t kw = 0; kw < p.KW; kw++) {
                T* row = col + ((c * p.KH + kh) * p.KW + kw) * ld;
                const int64_t off_h = kh * p.dilation - p.padding, off_w = kw * p.dilation - p.padding;
                int64_t q_lo, q_hi, op_lo, op_hi;
                valid_range(off_w, W, s, Q, q_lo, q_hi);
                valid_range(off_h, H, s, P, op_lo, op_hi);  // the rows: the same with H and P
                if (same_width && q_lo < q_hi && op_lo < op_hi) {
                    const SameWidthRun r = same_width_run(op_lo, op_hi, q_lo, q_hi, off_h, off_w, W);
                    std::fill(row, row + r.col_start, pad);
                    std::memcpy(row + r.col_start, xc + r.x_start, size_t(r.length) * sizeof(T));
                    std::fill(row + r.col_start + r.length, row + P * Q, pad);
                    fill_padding_columns(row, op_lo, op_hi, q_lo, q_hi, Q, pad);
                    continue;
                }
                // Rows op_lo .. op_hi − 1 from x, the others padding; in those, the columns
                // q_lo .. q_hi − 1 from x (x[c][op·s + off_h][q·s + off_w]), the others padding.
                std::fill(row, row + op_lo * Q, pad);
                std::fill(row + op_hi * Q, row + P * Q, pad);
                if (op_lo >= op_hi) continue;
                const T* src = xc + (op_lo * s + off_h) * W + off_w;  // row op_lo's q = 0
                if (s == 1) {
                    copy_short_rows(row + op_lo * Q + q_lo, Q, src + q_lo, W, op_hi - op_lo, q_hi - q_lo);
                } else {
                    for (int64_t op = op_lo; op < op_hi; op++)
                        for (int64_t q = q_lo; q < q_hi; q++) row[op * Q + q] = src[(op - op_lo) * s * W + q * s];
                }
                fill_padding_columns(row, op_lo, op_hi, q_lo, q_hi, Q, pad);
            }
    }
}

// x[0, n) as floats: for float x itself, for f16 and bf16 widened into buf by the CPU's vector
// kernel (convert_simd.h). A loop that widens element by element stays scalar: g++ vectorizes no
// load of dtype.h's f16 or bf16 (col2im and the bias gradient ran so, 16% and 10% of LeNet's f16
// training step).
template <typename T, typename F = std::conditional_t<std::is_const_v<T>, const float, float>>
F* as_floats(T* x, int64_t n, std::vector<float>& buf) {
    if constexpr (std::is_same_v<std::remove_const_t<T>, float>) {
        return x;
    } else {
        buf.resize(size_t(n));
        widened(x, n, buf.data());
        return buf.data();
    }
}

// The same walk as im2col with the arrows reversed: dx[c][ih][iw] += col[row][p·Q + q].
// Entries that fell on padding are dropped. Fixed order (c, kh, kw, p, q): deterministic.
// The sums are taken in a float plane, rounded into dx once (F32Plane: dx itself for float),
// from col's rows as floats (as_floats: widened first for f16 and bf16, exactly).
// Stride 1 with Q == W takes im2col's shortcut backwards: one long run of additions per
// (c, kh, kw). Its entries over the left and right padding would then be added to the
// neighbouring row's ends, so they are set to 0 in the row first (col is the GEMM's scratch
// output); adding 0 leaves every sum as it was.
template <typename T>
void col2im(T* col, int64_t C, const Conv2dParams& p, T* dx, int64_t ld) {
    const int64_t H = p.H, W = p.W, P = p.P(), Q = p.Q(), s = p.stride;
    const bool same_width = s == 1 && Q == W;
    F32Plane<T> plane(dx, C * H * W);
    std::vector<float> wide;  // f16, bf16: one row of col, widened
    for (int64_t c = 0; c < C; c++) {
        float* dxc = plane.data() + c * H * W;
        for (int64_t kh = 0; kh < p.KH; kh++)
            for (int64_t kw = 0; kw < p.KW; kw++) {
                float* row = as_floats(col + ((c * p.KH + kh) * p.KW + kw) * ld, P * Q, wide);
                const int64_t off_h = kh * p.dilation - p.padding, off_w = kw * p.dilation - p.padding;
                int64_t q_lo, q_hi, op_lo, op_hi;
                valid_range(off_w, W, s, Q, q_lo, q_hi);
                valid_range(off_h, H, s, P, op_lo, op_hi);  // the rows: the same with H and P
                if (same_width && q_lo < q_hi && op_lo < op_hi) {
                    const SameWidthRun r = same_width_run(op_lo, op_hi, q_lo, q_hi, off_h, off_w, W);
                    fill_padding_columns(row, op_lo, op_hi, q_lo, q_hi, Q, 0.0f);
                    float* dst = dxc + r.x_start;
                    const float* src = row + r.col_start;
#pragma omp simd
                    for (int64_t i = 0; i < r.length; i++) dst[i] += src[i];
                    continue;
                }
                for (int64_t op = op_lo; op < op_hi; op++) {
                    float* dst = dxc + (op * s + off_h) * W + off_w;
                    const float* src = row + op * Q;
                    if (s == 1) {
#pragma omp simd
                        for (int64_t q = q_lo; q < q_hi; q++) dst[q] += src[q];
                    } else
                        for (int64_t q = q_lo; q < q_hi; q++) dst[q * s] += src[q];
                }
            }
    }
    plane.store();
}

// ---- Several images in one GEMM --------------------------------------------------------------
// One GEMM per image is a thin product for CIFAR's later layers: an image has only 7×7 or 3×3
// output positions, so a 9-column product used 9 of the micro-tile's 64 columns, and the
// weights (256 × 2304 floats) were packed for 9 columns of work. (The weights are now packed
// once per call, for every GEMM of it: pack_weights below.) So a thread takes k consecutive
// images (k·P·Q ≥ kGroupColumns) and lays their columns side by side, image i at column i·P·Q
// of one matrix of L = k·P·Q columns:
//   cols [C·KH·KW, L]   (im2col with ld = L)        rows [O, L]   (y or dy of the k images)
// then does one GEMM with N = L. The price is a copy of y (or dy) between rows and NCHW, where
// each image's [O, P·Q] block is apart; with k = 1 (big planes) rows is the image's own block
// and nothing is copied. Each output element is still one dot product over the same K with the
// same blocking, so the bits do not depend on k (nor on the workspace or the threads).
// (kGroupColumns and images_per_group: conv_tasks.h.)

// Images per workspace chunk: col_images for Im2col (the caller must give a workspace of at
// least one image's columns), the whole batch for Pointwise, which needs no workspace.
template <typename T>
int64_t images_per_chunk(const Conv2dParams& p, ConvAlgo algo, const T* col, int64_t col_images, const char* op) {
    KILN_CHECK(algo != ConvAlgo::Im2col || (col && col_images >= 1), op, ": needs a workspace of ",
               im2col_elems_per_image(p), " elements per image");
    return algo == ConvAlgo::Im2col ? col_images : p.N;
}

// The weights of each conv group, packed once for every group GEMM of the call (gemm.h): as
// the GEMM's A, w_g [Og, Kc] for the forward, w_gᵀ [Kc, Og] for dx.
template <typename T>
std::vector<std::unique_ptr<PackedA>> pack_weights(const T* w, const Conv2dParams& p, bool transposed) {
    const int64_t Og = p.Og(), Kc = p.Cg() * p.KH * p.KW;
    std::vector<std::unique_ptr<PackedA>> packed;
    for (int64_t g = 0; g < p.groups; g++)
        packed.push_back(transposed ? std::make_unique<PackedA>(true, Kc, Og, w + g * Og * Kc, Kc)
                                    : std::make_unique<PackedA>(false, Og, Kc, w + g * Og * Kc, Kc));
    return packed;
}

// rows[o][i·P·Q + pq] = dy[n + i, o, pq] for the k images n .. n + k − 1 (rows [O, k·P·Q]).
template <typename T>
void gather_rows(const T* dy, const Conv2dParams& p, int64_t n, int64_t k, T* rows) {
    const int64_t PQ = p.P() * p.Q(), L = k * PQ;
    for (int64_t i = 0; i < k; i++)
        for (int64_t o = 0; o < p.O; o++)
            std::memcpy(rows + o * L + i * PQ, dy + ((n + i) * p.O + o) * PQ, size_t(PQ) * sizeof(T));
}

// ---- forward ------------------------------------------------------------------------------------
// Per group of k images and conv group g (Kc = Cg·KH·KW rows of cols per conv group):
//   rows[g·Og .. , L] = b (broadcast) + w[g·Og .. , Kc] · cols[g·Kc .. , L]      (beta = 1)
//   y_n[o, :] = rows[o, image n's P·Q columns]
template <typename T>
void conv2d_forward(const T* x, const T* w, const T* b, T* y, const Conv2dParams& p, T* col, int64_t col_images) {
    check_conv2d_params(p, "conv2d_forward");
    const ConvAlgo algo = conv2d_algo(p, dtype_of<T>::value);
    if (algo == ConvAlgo::Depthwise) return depthwise_forward(x, w, b, y, p);
    if constexpr (std::is_same_v<T, float>)
        if (algo == ConvAlgo::Winograd) return winograd_forward(x, w, b, y, p, col, col_images);
    const int64_t G = p.groups, Og = p.Og(), PQ = p.P() * p.Q(), Kc = p.Cg() * p.KH * p.KW;
    const int64_t CHW = p.C * p.H * p.W, per_image = im2col_elems_per_image(p), CK = p.C * p.KH * p.KW;
    const int64_t chunk = images_per_chunk(p, algo, col, col_images, "conv2d_forward");
    // Pointwise: x_n is [C, H·W], its own column matrix: one image per GEMM, no copies
    const int64_t k_max = algo == ConvAlgo::Im2col ? images_per_group(p.P() * p.Q(), chunk) : 1;
    const auto packed = pack_weights(w, p, false);

    auto group = [&](int64_t n, int64_t k, int64_t at) {
        const int64_t L = k * PQ;
        const T* cols = x + n * CHW;
        T* rows = y + n * p.O * PQ;  // one image: its own block of y
        if (algo == ConvAlgo::Im2col) {
            T* ws = col + at * per_image;
            for (int64_t i = 0; i < k; i++) im2col(x + (n + i) * CHW, p.C, p, ws + i * PQ, L);
            cols = ws;
            if (k > 1) rows = ws + CK * L;
        }
        if (b)
            for (int64_t o = 0; o < p.O; o++) std::fill(rows + o * L, rows + (o + 1) * L, b[o]);
        for (int64_t g = 0; g < G; g++)
            gemm_packed(*packed[g], false, L, 1.0f, cols + g * Kc * L, L, b ? 1.0f : 0.0f, rows + g * Og * L, L);
        if (rows != y + n * p.O * PQ)  // scatter the k images' rows back to NCHW
            for (int64_t i = 0; i < k; i++)
                for (int64_t o = 0; o < p.O; o++)
                    std::memcpy(y + ((n + i) * p.O + o) * PQ, rows + o * L + i * PQ, size_t(PQ) * sizeof(T));
    };
    for (int64_t n0 = 0; n0 < p.N; n0 += chunk)
        for_images(n0, std::min(chunk, p.N - n0), k_max, chunk / k_max, flops_per_image(p), group);
}

// ---- backward: dx ---------------------------------------------------------------------------------
//   rows = dy of the group's k images;   cols[g·Kc .. , L] = w[g·Og .. , Kc]ᵀ · rows[g·Og .. , L]
//   dx_n = col2im(cols, image n's columns)
template <typename T>
void conv2d_backward_data(const T* dy, const T* w, T* dx, const Conv2dParams& p, T* col, int64_t col_images) {
    check_conv2d_params(p, "conv2d_backward_data");
    const ConvAlgo algo = conv2d_algo(p, dtype_of<T>::value);
    if (algo == ConvAlgo::Depthwise) return depthwise_backward_data(dy, w, dx, p);
    if constexpr (std::is_same_v<T, float>)
        if (algo == ConvAlgo::Winograd) return winograd_backward_data(dy, w, dx, p, col, col_images);
    const int64_t G = p.groups, Og = p.Og(), PQ = p.P() * p.Q(), Kc = p.Cg() * p.KH * p.KW;
    const int64_t CHW = p.C * p.H * p.W, per_image = im2col_elems_per_image(p), CK = p.C * p.KH * p.KW;
    const int64_t chunk = images_per_chunk(p, algo, col, col_images, "conv2d_backward_data");
    const int64_t k_max = algo == ConvAlgo::Im2col ? images_per_group(p.P() * p.Q(), chunk) : 1;
    const auto packed = pack_weights(w, p, true);

    auto group = [&](int64_t n, int64_t k, int64_t at) {
        const int64_t L = k * PQ;
        const T* rows = dy + n * p.O * PQ;  // one image: its own block of dy
        T* dcol = dx + n * CHW;             // Pointwise: dcol_n is dx_n itself
        if (algo == ConvAlgo::Im2col) {
            T* ws = col + at * per_image;
            dcol = ws;
            if (k > 1) {  // gather the k images' dy as rows [O, L]
                gather_rows(dy, p, n, k, ws + CK * L);
                rows = ws + CK * L;
            }
        }
        for (int64_t g = 0; g < G; g++)
            gemm_packed(*packed[g], false, L, 1.0f, rows + g * Og * L, L, 0.0f, dcol + g * Kc * L, L);
        if (algo == ConvAlgo::Im2col)
            for (int64_t i = 0; i < k; i++) col2im(dcol + i * PQ, p.C, p, dx + (n + i) * CHW, L);
    };
    for (int64_t n0 = 0; n0 < p.N; n0 += chunk)
        for_images(n0, std::min(chunk, p.N - n0), k_max, chunk / k_max, flops_per_image(p), group);
}

// ---- backward: dw and db -----------------------------------------------------------------------
// f16 and bf16, Im2col (see "f16 and bf16" in the header): per chunk of k images, L = k·P·Q,
//   cols [CK, L] = the k images' columns side by side,  rows [O, L] = their dy
//   dw[g·Og .. , Kc] += rows[g·Og .. , L] · cols[g·Kc .. , L]ᵀ      (summed in f32, rounded once)
template <typename T>
void backward_weight_side_by_side(const T* x, const T* dy, T* dw, const Conv2dParams& p, T* col, int64_t chunk) {
    const int64_t G = p.groups, Og = p.Og(), PQ = p.P() * p.Q(), Kc = p.Cg() * p.KH * p.KW;
    const int64_t CHW = p.C * p.H * p.W, CK = p.C * p.KH * p.KW;
    for (int64_t n0 = 0; n0 < p.N; n0 += chunk) {
        const int64_t k = std::min(chunk, p.N - n0), L = k * PQ;
        T* cols = col;
        T* rows = col + CK * L;
        parallel_for(k, flop_grain(k, double(k) * flops_per_image(p)), [&](int64_t i0, int64_t i1) {
            for (int64_t i = i0; i < i1; i++) im2col(x + (n0 + i) * CHW, p.C, p, cols + i * PQ, L);
        });
        gather_rows(dy, p, n0, k, rows);
        for (int64_t g = 0; g < G; g++)
            gemm(false, true, Og, Kc, L, 1.0f, rows + g * Og * L, L, cols + g * Kc * L, L, 1.0f, dw + g * Og * Kc, Kc);
    }
}

// The columns of the chunk's images n0 .. n0 + count − 1, image i at col + i·(its workspace), one
// image per task.
template <typename T>
void build_columns(const T* x, const Conv2dParams& p, int64_t n0, int64_t count, double flops_per_chunk, T* col) {
    const int64_t CHW = p.C * p.H * p.W, col_size = im2col_elems_per_image(p);
    parallel_for(count, flop_grain(count, flops_per_chunk), [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; i++) im2col(x + (n0 + i) * CHW, p.C, p, col + i * col_size, p.P() * p.Q());
    });
}

// target[g·Og .. , j0:j1] += dy_n[g·Og .. , P·Q] · cols[g·Kc + j0 .. g·Kc + j1, P·Q]ᵀ for the one
// image n, whose columns are `cols` (its im2col, or x_n itself for Pointwise); target has dw's
// shape, rows Kc apart. One GEMM per conv group.
template <typename T>
void add_image_to_dw(const T* cols, const T* dy, int64_t n, const Conv2dParams& p, int64_t j0, int64_t j1,
                     T* target) {
    const int64_t Og = p.Og(), PQ = p.P() * p.Q(), Kc = p.Cg() * p.KH * p.KW;
    const T* dyn = dy + n * p.O * PQ;
    for (int64_t g = 0; g < p.groups; g++)
        gemm(false, true, Og, j1 - j0, PQ, 1.0f, dyn + g * Og * PQ, PQ, cols + (g * Kc + j0) * PQ, PQ, 1.0f,
             target + g * Og * Kc + j0, Kc);
}

// f32, small dw (the first layers: 64 × 216 floats): slices of images, partial sums.
// A band of such a dw's columns is too little work for a task — each band packed every dy_n
// again for a few dozen columns. So the images are dealt into kSlices slices, image n to
// slice n mod kSlices; each slice adds its images, in order, into a partial dw of its own (one
// task per slice, one GEMM per image, each operand packed once), and at the end
//   dw += partial_0 + partial_1 + ... + partial_{kSlices−1}        (in this order)
// An image's columns are built just before its GEMM, in the workspace slot of the thread that
// runs the slice (the workspace holds col_images ≥ 1 images: that many slots), where the GEMM
// finds them in cache; built for a whole chunk first, they went out to L3 and came back.
// The slices depend on n alone: the bits depend neither on the threads nor on the workspace.
// The partial sums are kSlices copies of dw, at most kSlicesBytesMax on the heap, outside the
// workspace (and outside the memory report of chapter 08, like the GEMM's packing buffers).
constexpr int64_t kSlices = 8;
constexpr int64_t kSlicesBytesMax = 8 << 20;

bool backward_weight_in_slices(const Conv2dParams& p) {
    const int64_t dw_floats = p.O * p.Cg() * p.KH * p.KW;
    return p.N >= kSlices && kSlices * dw_floats * int64_t(sizeof(float)) <= kSlicesBytesMax;
}

void conv2d_backward_weight_slices(const float* x, const float* dy, float* dw, const Conv2dParams& p, ConvAlgo algo,
                                   float* col, int64_t col_images) {
    const int64_t Kc = p.Cg() * p.KH * p.KW, dw_floats = p.O * Kc, CHW = p.C * p.H * p.W;
    std::vector<float> partial(size_t(kSlices * dw_floats), 0.0f);
    const bool parallel = double(p.N) * flops_per_image(p) >= kParallelMinFlops;
    for_groups_in_slots(kSlices, col_images, parallel, [&](int64_t slice, int64_t slot) {
        for (int64_t n = slice; n < p.N; n += kSlices) {
            const float* cols = x + n * CHW;  // Pointwise: x_n is its own column matrix
            if (algo == ConvAlgo::Im2col) {
                float* built = col + slot * im2col_elems_per_image(p);
                im2col(x + n * CHW, p.C, p, built, p.P() * p.Q());
                cols = built;
            }
            add_image_to_dw(cols, dy, n, p, 0, Kc, partial.data() + slice * dw_floats);
        }
    });
    parallel_for(dw_floats, grain_of(32768, kSlices), [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; i++) {
            float sum = dw[i];
            for (int64_t slice = 0; slice < kSlices; slice++) sum += partial[size_t(slice * dw_floats + i)];
            dw[i] = sum;
        }
    });
}

// Σ_n Σ_pq dy[n, o, pq] for the channel o: per image a float sum along pq, added into a double in
// image order. The sums of kSideBySide images run side by side: one alone waits for each
// addition's result (4 cycles) before the next, and took 5% of LeNet's step; several keep the
// adders busy. The same additions in the same order: the same bits.
constexpr int64_t kSideBySide = 8;
template <typename T>
double bias_grad(const T* dy, const Conv2dParams& p, int64_t o) {
    const int64_t PQ = p.P() * p.Q();
    std::vector<float> wide[kSideBySide];  // f16, bf16: the planes of the images summed side by side
    auto plane = [&](int64_t n, int64_t j) { return as_floats(dy + (n * p.O + o) * PQ, PQ, wide[j]); };
    double acc = 0.0;
    int64_t n = 0;
    for (; n + kSideBySide <= p.N; n += kSideBySide) {
        const float* g[kSideBySide];
        for (int64_t j = 0; j < kSideBySide; j++) g[j] = plane(n + j, j);
        float part[kSideBySide] = {};
        for (int64_t i = 0; i < PQ; i++)
#pragma GCC unroll 8  // part[] in registers: unrolled, the 8 sums are 8 scalars (or one vector)
            for (int64_t j = 0; j < kSideBySide; j++) part[j] += g[j][i];
        for (float s : part) acc += s;
    }
    for (; n < p.N; n++) {
        const float* g = plane(n, 0);
        float part = 0.0f;
        for (int64_t i = 0; i < PQ; i++) part += g[i];
        acc += part;
    }
    return acc;
}

// f32 with a big dw (and Pointwise in every type):
//   dw[g·Og .. , Kc] += dy_n[g·Og .. , P·Q] · col_n[g·Kc .. , P·Q]ᵀ     for n = 0 .. N−1 in order
//   db[o] += Σ_n Σ_pq dy[n, o, pq]                                       (one channel per thread)
template <typename T>
void conv2d_backward_weight(const T* x, const T* dy, T* dw, T* db, const Conv2dParams& p, T* col, int64_t col_images) {
    check_conv2d_params(p, "conv2d_backward_weight");
    const int64_t PQ = p.P() * p.Q();
    if (db) {
        parallel_for(p.O, flop_grain(p.O, double(p.N * p.O * PQ)), [&](int64_t o0, int64_t o1) {
            for (int64_t o = o0; o < o1; o++) db[o] = T(float(db[o]) + float(bias_grad(dy, p, o)));
        });
    }
    const ConvAlgo algo = conv2d_algo(p, dtype_of<T>::value);
    if (algo == ConvAlgo::Depthwise) return depthwise_backward_weight(x, dy, dw, p);
    if constexpr (std::is_same_v<T, float>)
        if (algo == ConvAlgo::Winograd) return winograd_backward_weight(x, dy, dw, p, col, col_images);
    const int64_t Kc = p.Cg() * p.KH * p.KW, CHW = p.C * p.H * p.W;
    const int64_t chunk = images_per_chunk(p, algo, col, col_images, "conv2d_backward_weight");
    if constexpr (std::is_same_v<T, float>) {
        if (backward_weight_in_slices(p)) return conv2d_backward_weight_slices(x, dy, dw, p, algo, col, chunk);
    } else {
        if (algo == ConvAlgo::Im2col) return backward_weight_side_by_side(x, dy, dw, p, col, chunk);
    }

    // Per chunk of images: their columns are built (one image per task), then each task adds
    // every image of the chunk, in order, into its own band of dw's columns [j0, j1) — bands are
    // multiples of 64 columns (a multiple of every GEMM tile width NR), so each dw element goes
    // through exactly the arithmetic of one full GEMM, whatever the bands. Up to 4 bands a
    // thread: one that loses its core for a while does fewer.
    const int64_t blocks = (Kc + 63) / 64;
    const double chunk_flops = double(std::min(chunk, p.N)) * flops_per_image(p);
    const int64_t bands = chunk_flops >= kParallelMinFlops ? std::min<int64_t>(blocks, 4 * max_threads()) : 1;
    for (int64_t n0 = 0; n0 < p.N; n0 += chunk) {
        const int64_t count = std::min(chunk, p.N - n0);
        if (algo == ConvAlgo::Im2col) build_columns(x, p, n0, count, chunk_flops, col);
        parallel_chunks(bands, [&](int64_t band) {
            const int64_t j0 = std::min(Kc, blocks * band / bands * 64);
            const int64_t j1 = std::min(Kc, blocks * (band + 1) / bands * 64);
            for (int64_t n = n0; n < n0 + count && j0 < j1; n++)  // in image order: the sum's order is fixed
                add_image_to_dw(algo == ConvAlgo::Im2col ? col + (n - n0) * im2col_elems_per_image(p) : x + n * CHW, dy,
                                n, p, j0, j1, dw);
        });
    }
}

KILN_CONV_KERNELS(KILN_INSTANTIATE_FLOAT);
KILN_INSTANTIATE_FLOAT(im2col);
KILN_INSTANTIATE(im2col, uint8_t);  // the int8 convolution (chapter 11)
KILN_INSTANTIATE_FLOAT(col2im);

}  // namespace kiln::cpu
