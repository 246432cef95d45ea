// pool.cpp — max, average and global average pooling on the CPU (chapter 03).
//
// Letters as in ops/params.h: x [N, C, H, W] → y [N, C, P, Q], windows KH×KW, S = H·W.
//
// Every (n, c) plane is independent, so planes are shared among threads and each plane is
// done by one thread, in a fixed order: the results (including the backward sums where
// windows overlap) never depend on the thread count.
//
// Window bounds are clipped once per output row and column (no test per element), so the
// inner loop is a plain scan of a row segment.
//
// Max pooling saves, for each output, where its maximum came from (argmax, an index into its
// input plane): backward is then a scatter, dx[argmax] += dy, with no comparison repeated.
// It costs one i32 per output — the memory chapter counts it. (Batch norm with the 2×2 pool
// fused in front keeps a byte per output instead: which of the window's four won, ops/norm.h.)
//
// f16 and bf16: values are compared and summed in float and rounded once when stored; where
// backward windows overlap, a dx element's terms are summed in a float plane first (F32Plane,
// f32_blocks.h), so dx too is rounded once.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "ops/cpu/f32_blocks.h"
#include "ops/cpu/max2x2.h"
#include "ops/pool.h"

namespace kiln::cpu {
namespace {

constexpr int64_t kParallelMin = 1 << 14;  // elements; below this one thread is faster

void check_params(const Pool2dParams& p, const char* op) {
    KILN_CHECK(p.N >= 0 && p.C > 0 && p.H > 0 && p.W > 0 && p.KH > 0 && p.KW > 0 && p.stride > 0 && p.padding >= 0,
               op, ": bad sizes N=", p.N, " C=", p.C, " H=", p.H, " W=", p.W, " K=", p.KH, "x", p.KW,
               " stride=", p.stride, " padding=", p.padding);
    KILN_CHECK(p.P() > 0 && p.Q() > 0, op, ": a ", p.KH, "x", p.KW, " window does not fit a ", p.H, "x", p.W,
               " input with padding ", p.padding);
}

// Window [lo, hi) of output position o along a dimension of size n, clipped to the input.
inline void window(int64_t o, int64_t stride, int64_t pad, int64_t k, int64_t n, int64_t& lo, int64_t& hi) {
    const int64_t start = o * stride - pad;
    lo = std::max<int64_t>(start, 0);
    hi = std::min<int64_t>(start + k, n);
}

}  // namespace

// ---- max --------------------------------------------------------------------------------------
// The 2×2, stride 2, no padding case (LeNet's and the CIFAR nets' pooling) is max2x2.h's.
template <typename T>
void maxpool2d_forward(const T* x, T* y, int32_t* argmax, const Pool2dParams& p) {
    check_params(p, "maxpool2d_forward");
    const int64_t H = p.H, W = p.W, P = p.P(), Q = p.Q();
    KILN_CHECK(H * W <= std::numeric_limits<int32_t>::max(), "maxpool2d_forward: plane too large for i32 argmax");
    const bool two_by_two = p.KH == 2 && p.KW == 2 && p.stride == 2 && p.padding == 0;
    parallel_for(p.N * p.C, grain_of(kParallelMin, H * W), [&](int64_t nc0, int64_t nc1) {
        std::vector<float> xf, yf;  // f16/bf16 planes widened (max2x2.h)
        for (int64_t nc = nc0; nc < nc1; nc++) {
            const T* xp = x + nc * H * W;
            T* yp = y + nc * P * Q;
            int32_t* ap = argmax + nc * P * Q;
            if (two_by_two) {  // the window's place k at (2p + k / 2, 2q + k mod 2)
                const auto index = [W](int32_t corner, int32_t k) { return corner + (k >> 1) * int32_t(W) + (k & 1); };
                maxpool2x2_plane(xp, yp, ap, H, W, index, xf, yf);
                continue;
            }
            for (int64_t op = 0; op < P; op++) {
                int64_t h0, h1;
                window(op, p.stride, p.padding, p.KH, H, h0, h1);
                for (int64_t oq = 0; oq < Q; oq++) {
                    int64_t w0, w1;
                    window(oq, p.stride, p.padding, p.KW, W, w0, w1);
                    float m = -std::numeric_limits<float>::infinity();
                    int64_t at = -1;  // stays −1 only if the window lies wholly in the padding
                    for (int64_t ih = h0; ih < h1; ih++) {
                        const T* row = xp + ih * W;
                        for (int64_t iw = w0; iw < w1; iw++) {
                            const float v = float(row[iw]);
                            // the first value, any larger one, or a NaN (which then stays: v > NaN is false)
                            if (at < 0 || v > m || (std::isnan(v) && !std::isnan(m))) {
                                m = v;
                                at = ih * W + iw;
                            }
                        }
                    }
                    yp[op * Q + oq] = T(m);
                    ap[op * Q + oq] = int32_t(at);
                }
            }
        }
    });
}

template <typename T>
void maxpool2d_backward(const T* dy, const int32_t* argmax, T* dx, const Pool2dParams& p) {
    check_params(p, "maxpool2d_backward");
    const int64_t S = p.H * p.W, PQ = p.P() * p.Q();
    parallel_for(p.N * p.C, grain_of(kParallelMin, S), [&](int64_t nc0, int64_t nc1) {
        for (int64_t nc = nc0; nc < nc1; nc++) {
            T* dxp = dx + nc * S;
            const T* dyp = dy + nc * PQ;
            const int32_t* ap = argmax + nc * PQ;
            F32Plane<T> plane(dxp, S);  // overlapping windows add into one dx in f32, rounded once
            float* acc = plane.data();
            for (int64_t i = 0; i < PQ; i++)
                if (ap[i] >= 0) acc[ap[i]] += float(dyp[i]);
            plane.store();
        }
    });
}

// ---- average ------------------------------------------------------------------------------------
template <typename T>
void avgpool2d_forward(const T* x, T* y, const Pool2dParams& p) {
    check_params(p, "avgpool2d_forward");
    const int64_t H = p.H, W = p.W, P = p.P(), Q = p.Q();
    const float inv = 1.0f / float(p.KH * p.KW);  // count_include_pad: always the full window
    parallel_for(p.N * p.C, grain_of(kParallelMin, H * W), [&](int64_t nc0, int64_t nc1) {
        for (int64_t nc = nc0; nc < nc1; nc++) {
            const T* xp = x + nc * H * W;
            T* yp = y + nc * P * Q;
            for (int64_t op = 0; op < P; op++) {
                int64_t h0, h1;
                window(op, p.stride, p.padding, p.KH, H, h0, h1);
                for (int64_t oq = 0; oq < Q; oq++) {
                    int64_t w0, w1;
                    window(oq, p.stride, p.padding, p.KW, W, w0, w1);
                    float s = 0.0f;
                    for (int64_t ih = h0; ih < h1; ih++)
                        for (int64_t iw = w0; iw < w1; iw++) s += float(xp[ih * W + iw]);
                    yp[op * Q + oq] = T(s * inv);
                }
            }
        }
    });
}

template <typename T>
void avgpool2d_backward(const T* dy, T* dx, const Pool2dParams& p) {
    check_params(p, "avgpool2d_backward");
    const int64_t H = p.H, W = p.W, P = p.P(), Q = p.Q();
    const float inv = 1.0f / float(p.KH * p.KW);
    parallel_for(p.N * p.C, grain_of(kParallelMin, H * W), [&](int64_t nc0, int64_t nc1) {
        for (int64_t nc = nc0; nc < nc1; nc++) {
            T* dxp = dx + nc * H * W;
            const T* dyp = dy + nc * P * Q;
            F32Plane<T> plane(dxp, H * W);  // overlapping windows add into one dx in f32, rounded once
            float* acc = plane.data();
            for (int64_t op = 0; op < P; op++) {
                int64_t h0, h1;
                window(op, p.stride, p.padding, p.KH, H, h0, h1);
                for (int64_t oq = 0; oq < Q; oq++) {
                    int64_t w0, w1;
                    window(oq, p.stride, p.padding, p.KW, W, w0, w1);
                    const float g = float(dyp[op * Q + oq]) * inv;
                    for (int64_t ih = h0; ih < h1; ih++)
                        for (int64_t iw = w0; iw < w1; iw++) acc[ih * W + iw] += g;
                }
            }
            plane.store();
        }
    });
}

// ---- global average: [N·C planes of S] → [N·C] ---------------------------------------------------
// Eight float lanes (a fixed pattern: vectorizable and the same on any thread count), then a
// double total.
template <typename T>
void global_avgpool_forward(const T* x, T* y, int64_t NC, int64_t S) {
    KILN_CHECK(NC >= 0 && S > 0, "global_avgpool_forward: bad sizes NC=", NC, " S=", S);
    parallel_for(NC, grain_of(kParallelMin, S), [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; i++) {
            const T* xp = x + i * S;
            float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            int64_t s = 0;
            for (; s + 8 <= S; s += 8)
                for (int j = 0; j < 8; j++) lane[j] += float(xp[s + j]);
            double total = 0.0;
            for (int j = 0; j < 8; j++) total += lane[j];
            for (; s < S; s++) total += float(xp[s]);
            y[i] = T(total / double(S));
        }
    });
}

template <typename T>
void global_avgpool_backward(const T* dy, T* dx, int64_t NC, int64_t S) {
    KILN_CHECK(NC >= 0 && S > 0, "global_avgpool_backward: bad sizes NC=", NC, " S=", S);
    const float inv = 1.0f / float(S);
    parallel_for(NC, grain_of(kParallelMin, S), [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; i++) {
            const T g = T(float(dy[i]) * inv);
            std::fill(dx + i * S, dx + (i + 1) * S, g);
        }
    });
}

KILN_POOL_KERNELS(KILN_INSTANTIATE_FLOAT);

}  // namespace kiln::cpu
