// pool.cu — the CUDA twins of src/ops/cpu/pool.cpp: max, average and global average pooling,
// forward and backward. Declared once for both in ops/pool.h; pointers are device
// memory. Templates on the element type T = float, f16 or bf16 (compared and summed in float or
// double, each result rounded to T once).
//
// Letters as in ops/params.h: x [N, C, H, W] → y [N, C, P, Q], windows KH×KW at
// (p·stride − padding, q·stride − padding), S = H·W, B = threads per block.
//
// Thread/block mapping:
//   maxpool2d_forward, avgpool2d_forward    one thread per output (n, c, p, q), 1-D grid-stride,
//        block 256: the CPU's loop over the clipped window, in the same row-major order.
//   maxpool2d_backward, avgpool2d_backward  one thread per INPUT element (n, c, ih, iw): a
//        gather. The CPU scatters (dx[argmax] += dy, one output at a time); on the GPU many
//        outputs would scatter into the same dx at once and need atomics, whose order — and
//        rounding — changes from run to run. Instead each dx element visits the windows that
//        cover it,
//            p from ceil((ih + padding − KH + 1) / stride) to floor((ih + padding) / stride)
//        (clipped to [0, P)), q likewise, and adds their contributions itself, in ascending
//        (p, q) — the order in which the CPU's scatter adds them (see Determinism below).
//   global_avgpool_forward   one warp per plane (8 warps per block of 256, grid-stride over
//        the N·C planes): lane l sums values l, l + 32, ... in double, then detail::warp_reduce
//        (shuffles: no shared memory, no barrier). The planes are small — 3×3 to 8×8 in kiln's
//        models — so a block of 256 per plane would leave 247 of 256 threads idle at S = 9.
//   global_avgpool_backward  one thread per element: dx = dy[plane] / S.
//
// Determinism: no atomics anywhere; every output is computed by one thread (or one block's
// fixed reduction tree) in a fixed order, so the same binary on the same GPU gives the same
// bits on every run. Against the CPU: max pooling, forward and backward (same argmax: NaN wins,
// the first maximum on ties), and average pooling's forward (the CPU's additions in the CPU's
// order, then one multiply) match it bit for bit, but for a NaN's own bits: a NaN in a window
// gives NaN out (PyTorch's contract, which leaves the bits unspecified), and a GPU's arithmetic
// returns its canonical NaN (0x7fffffff) where the CPU passes its operand's along. Average pooling's backward adds dy·inv over
// the covering windows; nvcc contracts that multiply-add into one FMA (rounded once, where the
// CPU rounds the product first), so where windows overlap (stride < K) dx may differ from the
// CPU's in the last bits (the tests allow 1e-6). The global average differs from the CPU's
// (8 float lanes, then double) only in the last bit of a float.
//
// Build and run: part of the engine (make, or make CUDA=1); tested against the CPU by
//   make test T='[pool][cuda]'
#include <cmath>

#include "common.cuh"
#include "max_window.cuh"
#include "ops/pool.h"

namespace kiln::cuda {

using detail::blocks_for;
using detail::kBlock;

// Pool2dParams::P() and Q() are host functions (nvcc refuses them in a kernel), so the launchers
// compute P and Q and pass them to the kernels.

namespace {

// The windows of one dimension that cover input position i: outputs o in [lo, hi) with
//   o·stride − pad ≤ i < o·stride − pad + k,   0 ≤ o < outputs
__device__ void covering(int64_t i, int64_t stride, int64_t pad, int64_t k, int64_t outputs, int64_t& lo,
                         int64_t& hi) {
    const int64_t first = i + pad - k + 1;  // o·stride ≥ first
    lo = first <= 0 ? 0 : (first + stride - 1) / stride;
    hi = (i + pad) / stride + 1;
    if (hi > outputs) hi = outputs;
}

// The window of output o along one dimension, clipped to the input: [lo, hi).
__device__ void window(int64_t o, int64_t stride, int64_t pad, int64_t k, int64_t n, int64_t& lo, int64_t& hi) {
    const int64_t start = o * stride - pad;
    lo = start < 0 ? 0 : start;
    hi = start + k < n ? start + k : n;
}

}  // namespace

// ---- max ---------------------------------------------------------------------------------------
// y[n,c,p,q] = max over the window (first maximum, or the first NaN);  argmax = ih·W + iw of it
// (−1 if the window lies wholly in the padding: y is then −inf)
template <typename T>
__global__ void maxpool2d_forward_kernel(const T* x, T* y, int32_t* argmax, Pool2dParams p, int64_t P,
                                         int64_t Q) {
    const int64_t total = p.N * p.C * P * Q;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t nc = i / (P * Q), op = i / Q % P, oq = i % Q;
        const T* xp = x + nc * p.H * p.W;
        int64_t h0, h1, w0, w1;
        window(op, p.stride, p.padding, p.KH, p.H, h0, h1);
        window(oq, p.stride, p.padding, p.KW, p.W, w0, w1);
        float m = -INFINITY;
        int64_t at = -1;
        for (int64_t ih = h0; ih < h1; ih++)
            for (int64_t iw = w0; iw < w1; iw++) {
                const float v = float(xp[ih * p.W + iw]);
                if (at < 0 || takes_max(v, m)) {  // the first value, a larger one, or a NaN (max_window.cuh)
                    m = v;
                    at = ih * p.W + iw;
                }
            }
        y[i] = T(m);
        argmax[i] = int32_t(at);
    }
}

// dx[n,c,ih,iw] = Σ over the windows (p, q) covering it whose argmax is ih·W + iw of dy[n,c,p,q]
template <typename T>
__global__ void maxpool2d_backward_kernel(const T* dy, const int32_t* argmax, T* dx, Pool2dParams p,
                                          int64_t P, int64_t Q) {
    const int64_t S = p.H * p.W, total = p.N * p.C * S;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t nc = i / S, ih = i / p.W % p.H, iw = i % p.W;
        const T* dyp = dy + nc * P * Q;
        const int32_t* ap = argmax + nc * P * Q;
        const int32_t me = int32_t(ih * p.W + iw);
        int64_t p0, p1, q0, q1;
        covering(ih, p.stride, p.padding, p.KH, P, p0, p1);
        covering(iw, p.stride, p.padding, p.KW, Q, q0, q1);
        float g = 0.0f;
        for (int64_t op = p0; op < p1; op++)
            for (int64_t oq = q0; oq < q1; oq++)
                if (ap[op * Q + oq] == me) g += float(dyp[op * Q + oq]);
        dx[i] = T(g);
    }
}

template <typename T>
void maxpool2d_forward(const T* x, T* y, int32_t* argmax, const Pool2dParams& p) {
    const int64_t total = p.N * p.C * p.P() * p.Q();
    if (total == 0) return;
    const dim3 grid(blocks_for(total)), block(kBlock);
    KILN_LAUNCH(maxpool2d_forward_kernel<T>, grid, block, 0)(x, y, argmax, p, p.P(), p.Q());
    KILN_CHECK_LAUNCH(maxpool2d_forward_kernel<T>, grid, block);
}

template <typename T>
void maxpool2d_backward(const T* dy, const int32_t* argmax, T* dx, const Pool2dParams& p) {
    const int64_t total = p.N * p.C * p.H * p.W;
    if (total == 0) return;
    const dim3 grid(blocks_for(total)), block(kBlock);
    KILN_LAUNCH(maxpool2d_backward_kernel<T>, grid, block, 0)(dy, argmax, dx, p, p.P(), p.Q());
    KILN_CHECK_LAUNCH(maxpool2d_backward_kernel<T>, grid, block);
}

// ---- average -----------------------------------------------------------------------------------
// y[n,c,p,q] = (Σ over the window of x) / (KH·KW)      (count_include_pad: padding adds 0)
template <typename T>
__global__ void avgpool2d_forward_kernel(const T* x, T* y, Pool2dParams p, int64_t P, int64_t Q) {
    const int64_t total = p.N * p.C * P * Q;
    const float inv = 1.0f / float(p.KH * p.KW);
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t nc = i / (P * Q), op = i / Q % P, oq = i % Q;
        const T* xp = x + nc * p.H * p.W;
        int64_t h0, h1, w0, w1;
        window(op, p.stride, p.padding, p.KH, p.H, h0, h1);
        window(oq, p.stride, p.padding, p.KW, p.W, w0, w1);
        float s = 0.0f;
        for (int64_t ih = h0; ih < h1; ih++)
            for (int64_t iw = w0; iw < w1; iw++) s += float(xp[ih * p.W + iw]);
        y[i] = T(s * inv);
    }
}

// dx[n,c,ih,iw] = Σ over the windows (p, q) covering it of dy[n,c,p,q] / (KH·KW)
template <typename T>
__global__ void avgpool2d_backward_kernel(const T* dy, T* dx, Pool2dParams p, int64_t P, int64_t Q) {
    const int64_t S = p.H * p.W, total = p.N * p.C * S;
    const float inv = 1.0f / float(p.KH * p.KW);
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t nc = i / S, ih = i / p.W % p.H, iw = i % p.W;
        const T* dyp = dy + nc * P * Q;
        int64_t p0, p1, q0, q1;
        covering(ih, p.stride, p.padding, p.KH, P, p0, p1);
        covering(iw, p.stride, p.padding, p.KW, Q, q0, q1);
        float g = 0.0f;
        for (int64_t op = p0; op < p1; op++)
            for (int64_t oq = q0; oq < q1; oq++) g += float(dyp[op * Q + oq]) * inv;
        dx[i] = T(g);
    }
}

template <typename T>
void avgpool2d_forward(const T* x, T* y, const Pool2dParams& p) {
    const int64_t total = p.N * p.C * p.P() * p.Q();
    if (total == 0) return;
    const dim3 grid(blocks_for(total)), block(kBlock);
    KILN_LAUNCH(avgpool2d_forward_kernel<T>, grid, block, 0)(x, y, p, p.P(), p.Q());
    KILN_CHECK_LAUNCH(avgpool2d_forward_kernel<T>, grid, block);
}

template <typename T>
void avgpool2d_backward(const T* dy, T* dx, const Pool2dParams& p) {
    const int64_t total = p.N * p.C * p.H * p.W;
    if (total == 0) return;
    const dim3 grid(blocks_for(total)), block(kBlock);
    KILN_LAUNCH(avgpool2d_backward_kernel<T>, grid, block, 0)(dy, dx, p, p.P(), p.Q());
    KILN_CHECK_LAUNCH(avgpool2d_backward_kernel<T>, grid, block);
}

// ---- global average: [N·C planes of S] → [N·C] ------------------------------------------------------
// y[plane] = (Σ_s x[plane, s]) / S, the sum in double: warp w of the grid (W warps in all) does
// planes w, w + W, ...
constexpr int kWarpsPerBlock = kBlock / 32;

template <typename T>
__global__ void global_avgpool_forward_kernel(const T* x, T* y, int64_t NC, int64_t S) {
    const int lane = threadIdx.x % 32;
    const int64_t warps = int64_t(gridDim.x) * kWarpsPerBlock;
    // the same count for the 32 lanes of a warp, as warp_reduce needs
    for (int64_t plane = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32; plane < NC; plane += warps) {
        const T* xp = x + plane * S;
        double s = 0.0;
        for (int64_t i = lane; i < S; i += 32) s += float(xp[i]);
        s = detail::warp_reduce(s, detail::SumOp{});
        if (lane == 0) y[plane] = T(s / double(S));
    }
}

// dx[plane, s] = dy[plane] / S
template <typename T>
__global__ void global_avgpool_backward_kernel(const T* dy, T* dx, int64_t NC, int64_t S) {
    const float inv = 1.0f / float(S);
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < NC * S; i += int64_t(gridDim.x) * blockDim.x)
        dx[i] = T(float(dy[i / S]) * inv);
}

template <typename T>
void global_avgpool_forward(const T* x, T* y, int64_t NC, int64_t S) {
    if (NC == 0) return;
    const dim3 grid(blocks_for(NC, kWarpsPerBlock)), block(kBlock);
    KILN_LAUNCH(global_avgpool_forward_kernel<T>, grid, block, 0)(x, y, NC, S);
    KILN_CHECK_LAUNCH(global_avgpool_forward_kernel<T>, grid, block);
}

template <typename T>
void global_avgpool_backward(const T* dy, T* dx, int64_t NC, int64_t S) {
    if (NC * S == 0) return;
    const dim3 grid(blocks_for(NC * S)), block(kBlock);
    KILN_LAUNCH(global_avgpool_backward_kernel<T>, grid, block, 0)(dy, dx, NC, S);
    KILN_CHECK_LAUNCH(global_avgpool_backward_kernel<T>, grid, block);
}

KILN_POOL_KERNELS(KILN_INSTANTIATE_FLOAT);

}  // namespace kiln::cuda
