// conv.cu — 2-D convolution on the GPU: the twins of cpu::conv2d_forward, conv2d_backward_data
// and conv2d_backward_weight (src/ops/conv.h, cpu/conv.cpp): same Conv2dParams, same
// workspace contract, same results up to the order of the sums; every pointer device memory.
// Kernels and launchers are templates on the element type T, instantiated for float, f16 and
// bf16: x, w, b, y, dy, dx, dw, db and the workspace hold T, every sum is taken in float (or
// double) and each result is rounded to T once, when stored. As on the CPU (conv.cpp, "f16 and
// bf16"), backward data's dcols are rounded to T in the workspace before col2im adds them (dx
// is rounded twice), and dw once per workspace chunk (the chunk's images are the GEMM's K). The
// im2col forward puts the bias into the GEMM for f16 and bf16 (rows = b, then beta = 1), so that
// y is not rounded once in rows and again after + b.
//
// Letters as in ops/params.h: N C H W (input), O (output channels), KH KW (kernel), P Q (output),
// G (groups), Cg = C/G and Og = O/G per group, and
//   Kc = Cg·KH·KW (the reduction length of one group)   CK = C·KH·KW (all groups)
//   k = images in a chunk of the workspace               L = k·P·Q (columns of one chunk)
//
// Seen as a matrix product, each group of a convolution is
//   y[Og, N·P·Q] = w[Og, Kc] · X[Kc, N·P·Q],   X[(c·KH + kh)·KW + kw][(n·P + p)·Q + q] = x[n, c, ih, iw]
// with ih = p·stride − padding + kh·dilation, iw likewise (0 outside the image). X is the
// "column matrix" of im2col. The two forward strategies differ in whether X is ever stored.
//
// ---- forward, strategy 1: conv2d_forward_im2col (im2col + the engine's GEMM) ---------------------
//   per chunk of k images:
//     im2col_kernel       1-D grid-stride, one thread per element of cols [CK, L]: decodes
//                         (c, kh, kw) from its row and (image, p, q) from its column, copies
//                         x there (or 0 on padding). Writes are coalesced (consecutive threads,
//                         consecutive columns), and so are reads for stride 1.
//     cuda::gemm × G      rows[g·Og.., L] = w[g·Og.., Kc] · cols[g·Kc.., L]    (cuda/gemm.cu)
//     rows_to_nchw_kernel 1-D, one thread per element of rows [O, L]: y[n, o, p, q] = rows + b[o]
//   Memory: the workspace, (CK + O)·P·Q floats per image — KH·KW times the input, plus the
//   output once more. nn/conv.cpp bounds it (32 MiB by default) by choosing k, as on the CPU.
//
// ---- forward, strategy 2: conv2d_forward_implicit_gemm (one kernel, no workspace) --------------
//   The same product, but the tiles of X are gathered from x straight into shared memory, so
//   X never exists in global memory ("implicit GEMM", as cuDNN calls it). The whole batch is
//   one product of N·P·Q columns: no chunks, no workspace, no copy of y.
//     grid (ceil(N·P·Q / BN), ceil(Og / BM), G), block 256 threads; block (bx, by, g) computes
//     the BM×BN tile of y's group g at output channels by·BM.. and columns bx·BN..
//     per step of BK along Kc:
//       Ws[k][o] = w[g·Og + o, k0 + k]        the weight tile, loaded as a plain matrix
//       Xs[k][j] = x[n, g·Cg + c, ih, iw]     the column tile, gathered: (n, p, q) of a thread's
//                                             column are decoded once per block (its column is the
//                                             same in every step); its rows k advance by a fixed
//                                             step, so (c, kh, kw) are stepped, not divided out
//       barrier; each thread multiplies a TM×TN patch from registers (as GEMM version 3 does,
//       lab/versions/gemm_versions.cu);
//       barrier
//     store: y[n, g·Og + o, p, q] = acc + b[g·Og + o]
//   Two tile shapes: 64×64 (BM×BN, 4×4 per thread), and 16×128 (2×4 per thread) when a group has
//   at most 16 output channels (LeNet's first layers, depthwise), where a 64-row tile would
//   leave most of its rows empty.
//   Memory: none beyond x, w and y.
//
// ---- which is faster, and the rule of conv2d_algo -------------------------------------------------
// im2col writes CK·L floats and the GEMM reads them back: traffic proportional to CK·N·P·Q, while
// the arithmetic is Og times that per group. With few output channels per group the unfolding
// costs about as much as the product, and the implicit GEMM, which reads x through the cache
// instead (each x value serves up to KH·KW columns from L1/L2), is faster and needs no memory.
// With many (Og ≥ 64), the unfolding is amortized over Og rows and the engine's GEMM, whose
// 128×128 tiles do 8×8 multiply-adds per thread and step against the implicit kernel's 4×4,
// wins. So:   conv2d_algo(p) = ImplicitGemm when Og < 64, else Im2col (and Depthwise, below,
// for one filter per channel).
// (A rule from the traffic count, not from timings: the kernel lab, cuda/lab/, times both on the
// LeNet and CIFAR-net shapes on a GPU.)
//
// ---- backward ---------------------------------------------------------------------------------------
//   dx  per chunk: nchw_to_rows_kernel gathers dy into rows [O, L]; cuda::gemm × G:
//       dcols[g·Kc.., L] = w[g·Og.., Kc]ᵀ · rows[g·Og.., L]; col2im_kernel: one thread per element
//       of dx (a gather, the CPU's col2im turned around): it adds, in a fixed (kh, kw) order, the
//       entries of dcols that im2col copied from its position — no two threads write one place,
//       so no atomics, and dx is overwritten.
//   dw  per chunk: im2col, rows = dy as above; cuda::gemm_split_k × G with beta = 1:
//       dw[g·Og.., Kc] += rows[g·Og.., L] · cols[g·Kc.., L]ᵀ   (the sum over the chunk's images is
//       the GEMM's K dimension; chunks are added in order). C is small (Og × Kc: 1 to 36 tiles of
//       64×64 in kiln's models) and K long, so the product is split along K into slices summed
//       by more blocks, then added in order by a second pass (gemm.cu's split-K): enough blocks
//       to fill the GPU, and the same result on every run.
//   db  bias_grad_kernel: one block of 256 threads per output channel o; thread t sums
//       dy[n, o, i] for the flat indices n·P·Q + i = t, t + 256, ... in double, then
//       detail::block_reduce (a fixed tree): db[o] += Σ.
//   No float atomics anywhere: each result is summed in an order fixed by the sizes alone, so it
//   is the same on every run and under every emulator schedule. (It may differ from the CPU in the
//   last bits: the GEMMs add in another order.)
//
// ---- depthwise: G == C == O, w [C, 1, KH, KW] (MobileNet's 3×3 layers) ----------------------------
//   Each channel is convolved with its own KH×KW filter: no sum over channels at all.
//     y[n, c, p, q] = b[c] + Σ_{kh, kw} w[c, kh, kw] · x[n, c, p·stride − padding + kh·dilation,
//                                                          q·stride − padding + kw·dilation]
//   Seen as the product above, each of the C groups is y[1, N·P·Q] = w[1, K] · X[K, N·P·Q] with
//   K = KH·KW (9 for 3×3): a matrix "product" with one row. A GEMM earns its speed by reusing
//   each loaded value across a tile's rows and columns; here there is one row, so a loaded x
//   value meets one weight per tap and nothing is reused: the implicit GEMM's 16×128 tiles are
//   15/16 padding rows (C layers of them in the grid), and im2col would write and read back K
//   copies of x to do K multiply-adds per output (the backward passes did, with one GEMM call
//   per group: C calls per chunk). So, directly:
//     forward       depthwise_forward_kernel        1-D grid-stride, one thread per element of y
//                   (consecutive threads: consecutive q, so reads and writes coalesce); it adds
//                   b[c], then the taps in (kh, kw) order, skipping those on the padding.
//     dx            depthwise_backward_data_kernel  one thread per element of dx, a gather: it
//                   adds, in (kh, kw) order, w·dy of the outputs (p, q) that read it — p = (ih +
//                   padding − kh·dilation) / stride when that is a whole number in [0, P), q
//                   likewise. No two threads write one place: no atomics, dx overwritten.
//     dw            depthwise_backward_weight_kernel  one block of 256 per (c, kh, kw): the box
//                   of outputs (n, p, q) whose input for that tap is inside the image, in flat
//                   order, is dealt to the threads (t, t + 256, ...; BoxWalk steps (n, p, q)
//                   without dividing), each summing dy·x in double; then detail::block_reduce
//                   (a fixed tree), and dw[c, kh, kw] += Σ.
//     db            bias_grad_kernel, as above (one block per channel; db += Σ).
//   Traffic per output: KH·KW reads of x, most of them hits in L1/L2 (neighbouring threads read
//   the same rows), and one write of y; what DRAM sees is about x once and y once, the least any
//   forward can move. With K multiply-adds per output the layer is bound by memory (and by the
//   index arithmetic), never by the multiply-adds: tiles and tensor cores have nothing to win.
//   Indices are 32-bit when every element count of x and y fits (depthwise_int_indices), so that
//   decoding e into (plane, p, q) costs a few 32-bit divisions; 64-bit otherwise.
//   Memory: none beyond x, w and y: the depthwise paths ignore col and col_images (null and 0
//   are fine), and conv2d_algo says Depthwise, so the layer allocates no workspace for them.
//   (cuda::conv2d_col_elems_per_image still counts the im2col workspace, which the named
//   strategies conv2d_forward_im2col and _implicit_gemm may be asked to use on these shapes.)
//   Each result is summed in an order fixed by the sizes — y and dx in the CPU's own order
//   (depthwise_forward, _backward_data in cpu/conv.cpp) — and rounded to T once when stored.
//   The kernel lab (cuda/lab/depthwise.cu) times this kernel against the groups-of-one implicit
//   GEMM, cuDNN and a variant that stages planes in shared memory (4 outputs per thread).
//
// Build and run: part of the engine (make, or make CUDA=1); tested against the CPU by
//   make test T='[conv][cuda]'        (the depthwise kernels alone: T='[depthwise]')
#include <optional>
#include <type_traits>

#include "common.cuh"
#include "core/cuda_memory.h"
#include "gemm_tiles.cuh"
#include "gemm_versions.h"
#include "ops/conv.h"
#include "ops/gemm.h"
#include "tensor_tiles.cuh"

namespace kiln::cuda {

using detail::blocks_for;
using detail::kBlock;

// The sizes a kernel needs, worked out on the host (Conv2dParams' methods are host code).
struct ConvDims {
    int64_t N, C, H, W, O, KH, KW, stride, padding, dilation;
    int64_t P, Q, Cg, Og, Kc;
};

static ConvDims dims_of(const Conv2dParams& p) {
    return {p.N,       p.C,        p.H,   p.W,   p.O,    p.KH,   p.KW, p.stride,
            p.padding, p.dilation, p.P(), p.Q(), p.Cg(), p.Og(), p.Cg() * p.KH * p.KW};
}

// ---- the column matrix ------------------------------------------------------------------------------
// cols[(c·KH + kh)·KW + kw][i·P·Q + p·Q + q] = x[n0 + i, c, ih, iw]   (0 on padding), L = k·P·Q
template <typename T>
__global__ void im2col_kernel(const T* x, ConvDims d, int64_t n0, int64_t k, T* cols) {
    const int64_t PQ = d.P * d.Q, L = k * PQ, total = d.C * d.KH * d.KW * L;
    for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
        const int64_t row = e / L, j = e % L;
        const int64_t c = row / (d.KH * d.KW), kh = row / d.KW % d.KH, kw = row % d.KW;
        const int64_t i = j / PQ, p = j % PQ / d.Q, q = j % d.Q;
        const int64_t ih = p * d.stride - d.padding + kh * d.dilation;
        const int64_t iw = q * d.stride - d.padding + kw * d.dilation;
        const bool inside = ih >= 0 && ih < d.H && iw >= 0 && iw < d.W;
        cols[e] = inside ? x[(((n0 + i) * d.C + c) * d.H + ih) * d.W + iw] : T(0);
    }
}

// The adjoint, as a gather: one thread per element (i, c, ih, iw) of the chunk's dx,
//   dx[n0 + i, c, ih, iw] = Σ_{kh, kw} dcols[(c·KH + kh)·KW + kw][i·P·Q + p·Q + q]
// over the (kh, kw) for which p = (ih + padding − kh·dilation) / stride is a whole number in
// [0, P) (and q likewise): exactly the column entries im2col copied from (ih, iw).
template <typename T>
__global__ void col2im_kernel(const T* dcols, ConvDims d, int64_t n0, int64_t k, T* dx) {
    const int64_t PQ = d.P * d.Q, L = k * PQ, CHW = d.C * d.H * d.W, total = k * CHW;
    for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
        const int64_t i = e / CHW, c = e % CHW / (d.H * d.W), ih = e % (d.H * d.W) / d.W, iw = e % d.W;
        float sum = 0.0f;
        for (int64_t kh = 0; kh < d.KH; kh++) {
            const int64_t tp = ih + d.padding - kh * d.dilation;  // = p·stride
            if (tp < 0 || tp % d.stride != 0 || tp / d.stride >= d.P) continue;
            const int64_t p = tp / d.stride;
            for (int64_t kw = 0; kw < d.KW; kw++) {
                const int64_t tq = iw + d.padding - kw * d.dilation;  // = q·stride
                if (tq < 0 || tq % d.stride != 0 || tq / d.stride >= d.Q) continue;
                const int64_t q = tq / d.stride;
                sum += float(dcols[((c * d.KH + kh) * d.KW + kw) * L + i * PQ + p * d.Q + q]);
            }
        }
        dx[n0 * CHW + e] = T(sum);
    }
}

// ---- y and dy between NCHW and the GEMM's rows [O, L] --------------------------------------------
// y[n0 + i, o, pq] = rows[o][i·P·Q + pq] + b[o]   (b may be null)
template <typename T>
__global__ void rows_to_nchw_kernel(const T* rows, const T* b, ConvDims d, int64_t n0, int64_t k, T* y) {
    const int64_t PQ = d.P * d.Q, L = k * PQ, total = d.O * L;
    for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
        const int64_t o = e / L, i = e % L / PQ, pq = e % PQ;
        y[((n0 + i) * d.O + o) * PQ + pq] = b ? T(float(rows[e]) + float(b[o])) : rows[e];
    }
}

// rows[o][j] = b[o] for the L columns of a chunk: the GEMM then adds w·cols onto them (beta = 1)
template <typename T>
__global__ void bias_rows_kernel(const T* b, ConvDims d, int64_t L, T* rows) {
    const int64_t total = d.O * L;
    for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x)
        rows[e] = b[e / L];
}

// rows[o][i·P·Q + pq] = dy[n0 + i, o, pq]
template <typename T>
__global__ void nchw_to_rows_kernel(const T* dy, ConvDims d, int64_t n0, int64_t k, T* rows) {
    const int64_t PQ = d.P * d.Q, L = k * PQ, total = d.O * L;
    for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
        const int64_t o = e / L, i = e % L / PQ, pq = e % PQ;
        rows[e] = dy[((n0 + i) * d.O + o) * PQ + pq];
    }
}

// ---- db: one block per output channel ---------------------------------------------------------------
// db[o] += Σ_{n, pq} dy[n, o, pq]: thread t takes the flat indices t, t + B, ... of the N·P·Q
// values (in double; B = blockDim.x), then the block folds its B partial sums in a fixed tree.
template <typename T>
__global__ void bias_grad_kernel(const T* dy, ConvDims d, T* db) {
    __shared__ double sh[kBlock];
    const int64_t o = blockIdx.x, PQ = d.P * d.Q, total = d.N * PQ;
    double v = 0.0;
    for (int64_t e = threadIdx.x; e < total; e += blockDim.x) v += double(float(dy[(e / PQ * d.O + o) * PQ + e % PQ]));
    v = detail::block_reduce(v, sh, detail::SumOp{});
    if (threadIdx.x == 0) db[o] = T(float(db[o]) + float(v));
}

// ---- the implicit GEMM ------------------------------------------------------------------------------
// The rows first, first + s, first + 2s, ... of a reduction index k = (a·KH + kh)·KW + kw, as
// (a, kh, kw) (a is the channel c for x's rows, the filter o for dy's): s is decomposed once,
// s = (sa·KH + skh)·KW + skw, and each move adds it with two carries (skw < KW, skh < KH), instead
// of dividing k by KH·KW and KW for every row (a 64-bit division is a ~70-instruction subroutine
// on a GPU, a 32-bit one about 20 instructions).
struct TapCursor {
    int a, kh, kw;     // the current row
    int sa, skh, skw;  // the step, decomposed
    __device__ TapCursor(int first, int s, int KH, int KW) {
        const int KK = KH * KW;
        a = first / KK, kh = first % KK / KW, kw = first % KW;
        sa = s / KK, skh = s % KK / KW, skw = s % KW;
    }
    __device__ void next(int KH, int KW) {
        kw += skw, kh += skh, a += sa;
        if (kw >= KW) kw -= KW, kh++;
        if (kh >= KH) kh -= KH, a++;
    }
};

// One column j = (n·P + p)·Q + q of the virtual column matrix of group g, gathered by one thread:
// its row kg = (c·KH + kh)·KW + kw is x[n, g·Cg + c, ih, iw] with ih = p·stride − padding +
// kh·dilation, iw = q·stride − padding + kw·dilation (0 on padding, and for a column or row past
// the end). The thread reads the rows kg = first, first + s, first + 2s, ... in that order (s:
// the threads of a block over the tile's width), so a TapCursor steps (c, kh, kw). Indices
// within one image group are 32-bit (the launchers check Cg·H·W < 2^31).
template <typename T>
struct ImplicitColumn {
    const T* xn;       // image n, the group's first channel
    int ih0, iw0;      // the window's top-left corner in x
    bool ok;           // j < N·P·Q
    TapCursor row;     // the next row to gather: (c, kh, kw)

    __device__ ImplicitColumn(const T* x, const ConvDims& d, int64_t j, int64_t g, int first, int s)
        : row(first, s, int(d.KH), int(d.KW)) {
        const int64_t PQ = d.P * d.Q;
        ok = j < d.N * PQ;
        const int64_t n = ok ? j / PQ : 0;
        ih0 = int(j % PQ / d.Q * d.stride - d.padding);
        iw0 = int(j % d.Q * d.stride - d.padding);
        xn = x + (n * d.C + g * d.Cg) * d.H * d.W;
    }
    // x at the next row (0 past Kc or on padding), then the cursor moves s rows on.
    __device__ float next(const ConvDims& d) {
        const int H = int(d.H), W = int(d.W), c = row.a;
        const int ih = ih0 + row.kh * int(d.dilation), iw = iw0 + row.kw * int(d.dilation);
        const bool inside = ok && c < d.Cg && ih >= 0 && ih < H && iw >= 0 && iw < W;
        const float v = inside ? float(xn[(c * H + ih) * W + iw]) : 0.0f;
        row.next(int(d.KH), int(d.KW));
        return v;
    }
};

// Block (bx, by, g) computes y's group g at output channels o0 + [0, BM) and columns j0 + [0, BN)
// of the virtual product (column j = (n·P + p)·Q + q); see the header for the steps.
template <typename T, int BM, int BN, int BK, int TM, int TN>
__global__ void __launch_bounds__((BM / TM) * (BN / TN))
    conv2d_implicit_gemm_kernel(const T* x, const T* w, const T* b, T* y, ConvDims d) {
    constexpr int kThreadsX = BN / TN, kThreadsY = BM / TM, kThreads = kThreadsX * kThreadsY;
    static_assert(kThreads % BN == 0 && (BM * BK) % kThreads == 0 && (BN * BK) % kThreads == 0,
                  "each thread loads whole columns of Xs, and the tiles divide evenly among the threads");
    __shared__ float Ws[BK][BM + 4];  // Ws[k][o]: k-major, a thread's TM values for one k are in one row
    __shared__ float Xs[BK][BN + 4];  // Xs[k][j]
    const int tid = threadIdx.x, tx = tid % kThreadsX, ty = tid / kThreadsX;
    const int64_t PQ = d.P * d.Q, NPQ = d.N * PQ, g = blockIdx.z;
    const int64_t o0 = int64_t(blockIdx.y) * BM, j0 = int64_t(blockIdx.x) * BN;
    const T* wg = w + g * d.Og * d.Kc;  // [Og, Kc]

    // This thread fills column jl of Xs in every step (rows tid / BN, + kThreads / BN, ...):
    // decode its output position once. Consecutive threads: consecutive q, so for stride 1 a
    // warp reads consecutive floats of one input row.
    const int jl = tid % BN;
    ImplicitColumn<T> column(x, d, j0 + jl, g, tid / BN, kThreads / BN);

    float acc[TM][TN];
    KILN_UNROLL
    for (int i = 0; i < TM; i++) {
        KILN_UNROLL
        for (int jj = 0; jj < TN; jj++) acc[i][jj] = 0.0f;
    }
    for (int64_t k0 = 0; k0 < d.Kc; k0 += BK) {
        for (int r = 0; r < BM * BK / kThreads; r++) {  // consecutive threads: consecutive k of a w row
            const int e = tid + r * kThreads, m = e / BK, kk = e % BK;
            const bool ok = o0 + m < d.Og && k0 + kk < d.Kc;
            Ws[kk][m] = ok ? float(wg[(o0 + m) * d.Kc + k0 + kk]) : 0.0f;
        }
        for (int r = 0; r < BN * BK / kThreads; r++) Xs[tid / BN + r * (kThreads / BN)][jl] = column.next(d);
        __syncthreads();  // both tiles are complete
        KILN_UNROLL
        for (int kk = 0; kk < BK; kk++) {
            float a[TM], bv[TN];
            KILN_UNROLL
            for (int i = 0; i < TM; i++) a[i] = Ws[kk][ty + i * kThreadsY];
            KILN_UNROLL
            for (int jj = 0; jj < TN; jj++) bv[jj] = Xs[kk][tx * TN + jj];
            KILN_UNROLL
            for (int i = 0; i < TM; i++) {
                KILN_UNROLL
                for (int jj = 0; jj < TN; jj++) acc[i][jj] += a[i] * bv[jj];
            }
        }
        __syncthreads();  // everyone is done with the tiles before the next step overwrites them
    }
    KILN_UNROLL
    for (int i = 0; i < TM; i++) {
        const int64_t o = o0 + ty + i * kThreadsY;
        if (o >= d.Og) continue;
        const int64_t oc = g * d.Og + o;  // the output channel
        const float bias = b ? float(b[oc]) : 0.0f;
        KILN_UNROLL
        for (int jj = 0; jj < TN; jj++) {
            const int64_t col = j0 + tx * TN + jj;
            if (col < NPQ) y[(col / PQ * d.O + oc) * PQ + col % PQ] = T(acc[i][jj] + bias);
        }
    }
}

// ---- the implicit GEMM on tensor cores (T = f16 or bf16) ----------------------------------------------
// conv2d_implicit_gemm_kernel's product done as GEMM version 5 (lab/versions/gemm_versions.cu):
// block (bx, by, g) computes the 64×64 tile of y's group g at output channels o0 + [0, 64) and
// columns j0 + [0, 64); its 4 warps multiply 32×32 patches on the tensor cores
// (detail::WmmaWarpTile, common.cuh).
//   per step of 32 along Kc:  Ws[k][o] = w[g·Og + o0 + o, k0 + k],  Xs[k][j] = x gathered as
//                             above, both as T (zeros outside)           barrier
//                             acc += Ws-rows · Xs-columns (wmma, f32)   barrier
//   Cs = acc, barrier;  y[n, g·Og + o, p, q] = Cs[o][j] + b[g·Og + o]   (column j = (n·P + p)·Q + q)
template <typename T>
__global__ void __launch_bounds__(detail::wmma_tile::kThreads)
    conv2d_implicit_gemm_wmma_kernel(const T* x, const T* w, const T* b, T* y, ConvDims d) {
    using namespace detail::wmma_tile;
    __shared__ __align__(32) T Ws[kBK][kLdA];
    __shared__ __align__(32) T Xs[kBK][kLdB];
    __shared__ __align__(32) float Cs[kBM][kLdC];
    const int tid = threadIdx.x;
    const int64_t PQ = d.P * d.Q, NPQ = d.N * PQ, g = blockIdx.z;
    const int64_t o0 = int64_t(blockIdx.y) * kBM, j0 = int64_t(blockIdx.x) * kBN;
    const T* wg = w + g * d.Og * d.Kc;  // [Og, Kc]
    // This thread fills column jl of Xs, rows tid / 64 + 2r: its output position, decoded once.
    const int jl = tid % kBN;
    ImplicitColumn<T> column(x, d, j0 + jl, g, tid / kBN, kThreads / kBN);

    detail::WmmaWarpTile<T> warp_tile;
    for (int64_t k0 = 0; k0 < d.Kc; k0 += kBK) {
        for (int r = 0; r < kBM * kBK / kThreads; r++) {
            const int e = tid + r * kThreads, m = e / kBK, kk = e % kBK;
            const bool ok = o0 + m < d.Og && k0 + kk < d.Kc;
            Ws[kk][m] = ok ? wg[(o0 + m) * d.Kc + k0 + kk] : T(0.0f);
        }
        for (int r = 0; r < kBN * kBK / kThreads; r++)  // T → float → T: exact
            Xs[tid / kBN + r * (kThreads / kBN)][jl] = T(column.next(d));
        __syncthreads();
        warp_tile.mma(Ws, Xs);
        __syncthreads();
    }
    warp_tile.store(Cs);
    __syncthreads();
    for (int e = tid; e < kBM * kBN; e += kThreads) {  // consecutive threads: consecutive (p, q)
        const int64_t o = o0 + e / kBN, col = j0 + e % kBN;
        if (o >= d.Og || col >= NPQ) continue;
        const int64_t oc = g * d.Og + o;
        y[(col / PQ * d.O + oc) * PQ + col % PQ] = T(Cs[e / kBN][e % kBN] + (b ? float(b[oc]) : 0.0f));
    }
}

// ---- the engine's implicit GEMMs: forward, dx and dw on one block tile -------------------------------
// The three passes are three matrix products whose operands are gathered from the tensors as the
// tiles are loaded (no column matrix in memory), each computed by the engine's block tile:
// detail::fma_tile on the CUDA cores (gemm_tiles.cuh: warp tiling, two stages) for every type,
// detail::mma_tile on the tensor cores (tensor_tiles.cuh) for f16 and bf16 (and f32 as TF32). Per group g:
//
//   forward  y[o, (n,p,q)]       = Σ_{(c,kh,kw)} w[o, (c,kh,kw)] · x[n, c, p·s − pad + kh·dil, q·s − pad + kw·dil]
//            M = Og, N = N·P·Q, K = Kc = Cg·KH·KW        A: w as stored; B: ConvColumns
//   dx       dx[c, (n,ih,iw)]    = Σ_{(o,kh,kw)} w[o, c, kh, kw] · dy[n, o, p, q]
//                                  where p·s = ih + pad − kh·dil and q·s = iw + pad − kw·dil (whole, in range)
//            M = Cg, N = N·H·W, K = Og·KH·KW             A: ConvWeightsT; B: ConvGradColumns
//   dw       dw[o, (c,kh,kw)]   += Σ_{(n,p,q)} dy[n, o, p, q] · x[n, c, p·s − pad + kh·dil, q·s − pad + kw·dil]
//            M = Og, N = Kc, K = N·P·Q                   A: ConvGradRows; B: ConvPatches
//
// dx's sum is a gather (each thread sums what reaches its own dx element), so no two threads
// write one place; dw's long K is split into slices summed in order by a second pass
// (gemm_sum_slices_kernel, as cuda::gemm_split_k), so no atomics anywhere. Each loader gives every
// thread fixed columns (or rows) of the tile; consecutive threads take the index that is
// contiguous in memory (q or iw), so a warp's gathers are coalesced. The gathered index that
// runs over (c, kh, kw) or (o, kh, kw) is looked up in an offset table (ConvTap, below) instead
// of being stepped and multiplied out per element. Loaders write through put_a / put_b, which
// know the stage's layout: float [k][m] for the CUDA cores, 16-bit (or TF32's tf32-rounded float)
// [m][k] or [k][m] for the tensor cores.
//
// ---- offset tables ----------------------------------------------------------------------------------
// A gathered element is x[n, c, ih0 + kh·dil, iw0 + kw·dil] (forward, dw) or dy[n, o, p, q] with
// p·s = th − kh·dil (dx): its address is the column's part (n, ih0, iw0 or th, tw: fixed for a
// thread) plus the row's part ((c, kh, kw) or (o, kh, kw): the same for every column). So the
// row's part is worked out once per row, into a 16-byte ConvTap that every thread of the block
// reads from shared memory, and an element costs one table read, two adds, two unsigned compares
// and its load. Where each table lives:
//   forward, dx   rows advance BK per step: TapRing, the rows of this step and the next, 2·BK
//                 entries (256 B for BK = 8, 1 KiB for BK = 32); threads 0..BK−1 write the next
//                 step's row each step, stepping (a, kh, kw) with a TapCursor: no division at all
//   dw            the BN columns are the block's for the whole loop: BN entries (1–2 KiB), one
//                 division per thread once per block
// Shared memory, not a table over all of K in global or constant memory: it needs no workspace,
// no extra launch and no host copy per call (constant memory is one per module, not per launch),
// its size does not grow with C·KH·KW (2,304 rows of 16 B = 36 KiB for a 256-channel 3×3 layer),
// and a warp's 32 lanes reading one entry is one broadcast.
// In NCHW the gathered elements of one thread are not contiguous (rows are other channels or
// taps; a row's neighbouring columns are other threads'), so the gathers stay scalar loads; the
// vector loads are where a matrix is stored as the tile reads it: forward's w (GemmLoaderA).
struct alignas(16) ConvTap {
    int offset;  // the row's part of the element's index
    int dh, dw;  // forward, dw: kh·dil, kw·dil;  dx: ⌊kh·dil / s⌋, ⌊kw·dil / s⌋
    int key;     // dx: (kh·dil mod s) | (kw·dil mod s) << 16;  −1 (dx) or dh = kPastEnd (x): past the end
};
constexpr int kPastEnd = -(1 << 30);  // no ih0 + kPastEnd is inside an image

// x's row (c, kh, kw): x[n, c, ih0 + dh, iw0 + dw] = xn[ih0·W + iw0 + offset] with
//   offset = (c·H + kh·dil)·W + kw·dil,  dh = kh·dil,  dw = kw·dil     (c ≥ Cg: past the end)
__device__ inline ConvTap x_tap(const ConvDims& d, int c, int kh, int kw) {
    const int dh = kh * int(d.dilation), dw = kw * int(d.dilation);
    if (c >= d.Cg) return {0, kPastEnd, 0, 0};
    return {(c * int(d.H) + dh) * int(d.W) + dw, dh, dw, 0};
}
__device__ inline ConvTap x_tap(const ConvDims& d, const TapCursor& t) { return x_tap(d, t.a, t.kh, t.kw); }

// dy's row (o, kh, kw) for dx's column (n, ih, iw), th = ih + pad = a·s + rh, tw = b·s + rw:
// p·s = th − kh·dil is a whole multiple of s exactly when kh·dil mod s = rh, and then
// p = a − ⌊kh·dil / s⌋ (q likewise), so
//   dy[n, o, p, q] = dyn[a·Q + b + offset],  offset = o·P·Q − dh·Q − dw,  p = a − dh,  q = b − dw
// when key = rh | rw << 16 and 0 ≤ p < P, 0 ≤ q < Q: no division per element.   (o ≥ Og: key −1)
__device__ inline ConvTap dy_tap(const ConvDims& d, const TapCursor& t) {
    const int h = t.kh * int(d.dilation), w = t.kw * int(d.dilation);
    if (t.a >= d.Og) return {0, 0, 0, -1};
    const int s = int(d.stride), dh = h / s, dw = w / s;
    return {(t.a * int(d.P) - dh) * int(d.Q) - dw, dh, dw, h % s | w % s << 16};
}

// The table of the BK rows of one step, for the loaders whose rows move on by BK per step
// (forward's x rows, dx's dy rows): two slots in shared memory, this step's and the next one's.
// fetch(step t) reads slot t mod 2, then threads 0..BK−1 write the rows of step t + 1 into the
// other slot. The tile's loop (two_stages) has one barrier between two fetches, which orders
// both: the slot written in fetch(t) is read in fetch(t + 1), past one barrier; the slot it
// overwrites was last read in fetch(t − 1), before another. The kernel waits at a barrier after
// the constructor has filled slot 0 (step 0), before the loop.
template <int BK, bool kDy>
struct TapRing {
    ConvTap (*slots)[BK];
    int slot;
    TapCursor row;  // thread t < BK: row t of the next step to write
    __device__ TapRing(ConvTap (*slots_)[BK], const ConvDims& d)
        : slots(slots_), slot(0), row(int(threadIdx.x), BK, int(d.KH), int(d.KW)) {
        write(d, 0);
    }
    __device__ void write(const ConvDims& d, int into) {
        if (int(threadIdx.x) < BK) {
            slots[into][threadIdx.x] = kDy ? dy_tap(d, row) : x_tap(d, row);
            row.next(int(d.KH), int(d.KW));
        }
    }
    __device__ const ConvTap* current() const { return slots[slot]; }
    __device__ void advance(const ConvDims& d) { write(d, slot ^ 1), slot ^= 1; }
};

// A thread's window of x for one column (forward) or one k row (dw): image n, corner (ih0, iw0).
template <typename T>
struct XWindow {
    const T* xn;   // x[n, g·Cg]
    int ih0, iw0;  // the corner
    bool ok;       // the column (or row) is inside the product
    //   x[n, g·Cg + c, ih0 + kh·dil, iw0 + kw·dil] for the tap's (c, kh, kw), 0 outside. The tap
    //   is a copy: all of it is read (one 16-byte load), whatever the test decides.
    __device__ float at(const ConvTap t, int H, int W) const {
        const int ih = ih0 + t.dh, iw = iw0 + t.dw;
        const bool inside = ok && unsigned(ih) < unsigned(H) && unsigned(iw) < unsigned(W);
        return inside ? float(xn[ih0 * W + iw0 + t.offset]) : 0.0f;
    }
};

template <class S, typename T>
__device__ __forceinline__ void put_a(float (*As)[S::kLdA], int m, int k, float v) { As[k][m] = v; }
template <class S, typename T>
__device__ __forceinline__ void put_a(uint16_t* As, int m, int k, float v) { As[S::a_index(m, k)] = detail::bits_of(T(v)); }
template <class S, typename T>
__device__ __forceinline__ void put_a(float* As, int m, int k, float v) { As[S::a_index(m, k)] = detail::tf32_round(v); }
template <class S, typename T>
__device__ __forceinline__ void put_b(float (*Bs)[S::kLdB], int k, int n, float v) { Bs[k][n] = v; }
template <class S, typename T>
__device__ __forceinline__ void put_b(uint16_t* Bs, int k, int n, float v) { Bs[S::b_index(k, n)] = detail::bits_of(T(v)); }
template <class S, typename T>
__device__ __forceinline__ void put_b(float* Bs, int k, int n, float v) { Bs[S::b_index(k, n)] = detail::tf32_round(v); }

// forward's B: column n = (img, p, q) of the virtual column matrix; this thread owns column
// tid % BN of the tile (its window decoded once) and its rows tid / BN, + kThreads/BN, ... of
// each step, looked up in the step's table.
template <class S, typename T>
struct ConvColumns {
    static constexpr int kStep = S::kThreads / S::BN, kPer = S::BK / kStep;
    static_assert(S::kThreads % S::BN == 0 && S::BK % kStep == 0, "whole columns per thread");
    XWindow<T> window;
    TapRing<S::BK, false> rows;
    float r[kPer];
    __device__ ConvColumns(const T* x, const ConvDims& d, int64_t g, int64_t j0, ConvTap (*taps)[S::BK])
        : rows(taps, d) {
        const int64_t PQ = d.P * d.Q, j = j0 + int(threadIdx.x) % S::BN;
        window.ok = j < d.N * PQ;
        const int64_t n = window.ok ? j / PQ : 0;
        window.ih0 = int(j % PQ / d.Q * d.stride - d.padding);
        window.iw0 = int(j % d.Q * d.stride - d.padding);
        window.xn = x + (n * d.C + g * d.Cg) * d.H * d.W;
    }
    __device__ void fetch(const ConvDims& d, int64_t) {
        const ConvTap* taps = rows.current();
        KILN_UNROLL
        for (int i = 0; i < kPer; i++) r[i] = window.at(taps[int(threadIdx.x) / S::BN + i * kStep], int(d.H), int(d.W));
        rows.advance(d);
    }
    template <typename Stage>
    __device__ void stash(Stage Bs) const {
        KILN_UNROLL
        for (int i = 0; i < kPer; i++) put_b<S, T>(Bs, int(threadIdx.x) / S::BN + i * kStep, int(threadIdx.x) % S::BN, r[i]);
    }
};

// dx's A: A[c][(o, kh, kw)] = w[g·Og + o, c, kh, kw]; this thread owns row c = tid % BM of the
// tile and the k rows tid / BM, + kThreads/BM, ...: its cursor (o, kk) steps by kThreads/BM.
template <class S, typename T>
struct ConvWeightsT {
    static constexpr int kStep = S::kThreads / S::BM, kPer = S::BK / kStep;
    static_assert(S::kThreads % S::BM == 0 && S::BK % kStep == 0, "whole rows per thread");
    const T* wc;      // w[g·Og, c, 0, 0]: the thread's channel in the group's first filter
    bool ok;          // c < Cg
    int o, kk;        // the next k row: filter o, tap kk = kh·KW + kw
    int so, skk;      // the step, decomposed
    float r[kPer];
    __device__ ConvWeightsT(const T* w, const ConvDims& d, int64_t g, int64_t c0) {
        const int KK = int(d.KH * d.KW), c = int(c0) + int(threadIdx.x) % S::BM, first = int(threadIdx.x) / S::BM;
        ok = c < d.Cg;
        wc = w + (g * d.Og * d.Cg + (ok ? c : 0)) * KK;
        o = first / KK, kk = first % KK, so = kStep / KK, skk = kStep % KK;
    }
    __device__ void fetch(const ConvDims& d, int64_t) {
        const int KK = int(d.KH * d.KW);
        KILN_UNROLL
        for (int i = 0; i < kPer; i++) {
            r[i] = ok && o < d.Og ? float(wc[(int64_t(o) * d.Cg) * KK + kk]) : 0.0f;
            kk += skk, o += so;
            if (kk >= KK) kk -= KK, o++;
        }
    }
    template <typename Stage>
    __device__ void stash(Stage As) const {
        KILN_UNROLL
        for (int i = 0; i < kPer; i++) put_a<S, T>(As, int(threadIdx.x) % S::BM, int(threadIdx.x) / S::BM + i * kStep, r[i]);
    }
};

// dx's B: B[(o, kh, kw)][(img, ih, iw)] = dy[img, g·Og + o, p, q] for p·s = ih + pad − kh·dil and
// q·s = iw + pad − kw·dil when those are whole and in range, else 0. This thread owns column
// tid % BN (its (img, ih, iw) decoded once, as a, b and their remainders: see dy_tap) and its rows
// of each step, looked up in the step's table.
template <class S, typename T>
struct ConvGradColumns {
    static constexpr int kStep = S::kThreads / S::BN, kPer = S::BK / kStep;
    static_assert(S::kThreads % S::BN == 0 && S::BK % kStep == 0, "whole columns per thread");
    const T* dyn;  // dy[img, g·Og]
    int a, b;      // ⌊(ih + pad) / s⌋, ⌊(iw + pad) / s⌋
    int key;       // (ih + pad) mod s | (iw + pad) mod s << 16; −2 past the end of N·H·W
    TapRing<S::BK, true> rows;
    float r[kPer];
    __device__ ConvGradColumns(const T* dy, const ConvDims& d, int64_t g, int64_t j0, ConvTap (*taps)[S::BK])
        : rows(taps, d) {
        const int64_t HW = d.H * d.W, j = j0 + int(threadIdx.x) % S::BN;
        const bool ok = j < d.N * HW;
        const int64_t img = ok ? j / HW : 0;
        const int s = int(d.stride), th = int(j % HW / d.W + d.padding), tw = int(j % d.W + d.padding);
        a = th / s, b = tw / s, key = ok ? th % s | tw % s << 16 : -2;
        dyn = dy + (img * d.O + g * d.Og) * d.P * d.Q;
    }
    __device__ void fetch(const ConvDims& d, int64_t) {
        const ConvTap* taps = rows.current();
        const unsigned P = unsigned(d.P), Q = unsigned(d.Q);
        KILN_UNROLL
        for (int i = 0; i < kPer; i++) {
            const ConvTap t = taps[int(threadIdx.x) / S::BN + i * kStep];  // all 16 bytes, as one load
            const bool inside = t.key == key && unsigned(a - t.dh) < P && unsigned(b - t.dw) < Q;
            r[i] = inside ? float(dyn[a * int(Q) + b + t.offset]) : 0.0f;
        }
        rows.advance(d);
    }
    template <typename Stage>
    __device__ void stash(Stage Bs) const {
        KILN_UNROLL
        for (int i = 0; i < kPer; i++) put_b<S, T>(Bs, int(threadIdx.x) / S::BN + i * kStep, int(threadIdx.x) % S::BN, r[i]);
    }
};

// dw's A: A[o][(img, pq)] = dy[img, g·Og + o, pq]; this thread owns k column tid % BK of the tile
// (its (img, pq) cursor moves BK on per step) and rows o = tid / BK, + kThreads/BK, ....
template <class S, typename T>
struct ConvGradRows {
    static constexpr int kStep = S::kThreads / S::BK, kPer = S::BM / kStep;
    static_assert(S::kThreads % S::BK == 0 && S::BM % kStep == 0, "whole k columns per thread");
    const T* dyg;        // dy[0, g·Og]
    int64_t k, k_end;    // this thread's next k = img·P·Q + pq
    int img, pq, simg, spq;
    int64_t o0;
    float r[kPer];
    __device__ ConvGradRows(const T* dy, const ConvDims& d, int64_t g, int64_t o0_, int64_t k_begin, int64_t k_end_)
        : dyg(dy + g * d.Og * d.P * d.Q), k(k_begin + int(threadIdx.x) % S::BK), k_end(k_end_), o0(o0_) {
        const int64_t PQ = d.P * d.Q;
        img = int(k / PQ), pq = int(k % PQ), simg = int(S::BK / PQ), spq = int(S::BK % PQ);
    }
    __device__ void fetch(const ConvDims& d, int64_t) {
        const int64_t PQ = d.P * d.Q;
        const T* plane = dyg + (int64_t(img) * d.O + o0) * PQ + pq;  // dy[img, g·Og + o0, pq]
        KILN_UNROLL
        for (int i = 0; i < kPer; i++) {
            const int64_t o = o0 + int(threadIdx.x) / S::BK + i * kStep;
            r[i] = k < k_end && o < d.Og ? float(plane[(o - o0) * PQ]) : 0.0f;
        }
        k += S::BK, pq += spq, img += simg;
        if (pq >= PQ) pq -= int(PQ), img++;
    }
    template <typename Stage>
    __device__ void stash(Stage As) const {
        KILN_UNROLL
        for (int i = 0; i < kPer; i++) put_a<S, T>(As, int(threadIdx.x) / S::BK + i * kStep, int(threadIdx.x) % S::BK, r[i]);
    }
};

// dw's B: B[(img, p, q)][(c, kh, kw)] = x[img, g·Cg + c, p·s − pad + kh·dil, q·s − pad + kw·dil];
// this thread owns k row tid % BK (its (img, p, q) cursor moves BK on per step) and the columns
// n = tid / BK, + kThreads/BK, ..., whose (c, kh, kw) are the block's table of its BN columns.
template <class S, typename T>
struct ConvPatches {
    static constexpr int kStep = S::kThreads / S::BK, kPer = S::BN / kStep;
    static_assert(S::kThreads % S::BK == 0 && S::BN % kStep == 0, "whole k rows per thread");
    static_assert(S::kThreads >= S::BN, "one thread per column of the table");
    const T* xg;       // x[0, g·Cg]
    int64_t k, k_end;  // this thread's next k = (img·P + p)·Q + q
    int img, p, q, simg, sp, sq;
    const ConvTap* columns;  // the block's BN columns: the constructor writes them (one each)
    float r[kPer];
    __device__ ConvPatches(const T* x, const ConvDims& d, int64_t g, int64_t n0, int64_t k_begin, int64_t k_end_,
                           ConvTap* table)
        : xg(x + g * d.Cg * d.H * d.W), k(k_begin + int(threadIdx.x) % S::BK), k_end(k_end_), columns(table) {
        const int Q = int(d.Q), PQ = int(d.P * d.Q);
        img = int(k / PQ), p = int(k % PQ) / Q, q = int(k % Q);
        simg = S::BK / PQ, sp = S::BK % PQ / Q, sq = S::BK % Q;
        if (int(threadIdx.x) < S::BN)
            table[threadIdx.x] = x_tap(d, TapCursor(int(n0) + int(threadIdx.x), 1, int(d.KH), int(d.KW)));
    }
    __device__ void fetch(const ConvDims& d, int64_t) {
        const XWindow<T> window{xg + int64_t(img) * d.C * d.H * d.W, p * int(d.stride) - int(d.padding),
                                q * int(d.stride) - int(d.padding), k < k_end};
        KILN_UNROLL
        for (int i = 0; i < kPer; i++) r[i] = window.at(columns[int(threadIdx.x) / S::BK + i * kStep], int(d.H), int(d.W));
        k += S::BK, q += sq, p += sp, img += simg;
        if (q >= d.Q) q -= int(d.Q), p++;
        if (p >= d.P) p -= int(d.P), img++;
    }
    template <typename Stage>
    __device__ void stash(Stage Bs) const {
        KILN_UNROLL
        for (int i = 0; i < kPer; i++) put_b<S, T>(Bs, int(threadIdx.x) % S::BK, int(threadIdx.x) / S::BK + i * kStep, r[i]);
    }
};

// The GEMM loaders take fetch(k0); these take fetch(d, k0): an adapter gives both one shape.
template <class L>
struct WithDims {
    L& loader;
    const ConvDims& d;
    __device__ void fetch(int64_t k0) { loader.fetch(d, k0); }
    template <typename Stage>
    __device__ void stash(Stage s) const { loader.stash(s); }
};

// forward's epilogue: y[img, g·Og + o, pq] = acc + b[g·Og + o], column j = img·P·Q + pq.
template <typename T>
struct ConvForwardOut {
    T* y;
    const T* b;
    const ConvDims& d;
    int64_t g, o0, j0;
    template <int kCount>
    __device__ void store(int mt, int nt, const float (&v)[kCount]) {
        const int64_t o = o0 + mt, PQ = d.P * d.Q, NPQ = d.N * PQ;
        if (o >= d.Og) return;
        const int64_t oc = g * d.Og + o;
        const float bias = b ? float(b[oc]) : 0.0f;
        KILN_UNROLL
        for (int i = 0; i < kCount; i++) {
            const int64_t j = j0 + nt + i;
            if (j < NPQ) y[(j / PQ * d.O + oc) * PQ + j % PQ] = T(v[i] + bias);
        }
    }
};

// dx's epilogue: dx[img, g·Cg + c, hw] = acc (overwritten), column j = img·H·W + hw.
template <typename T>
struct ConvDataOut {
    T* dx;
    const ConvDims& d;
    int64_t g, c0, j0;
    template <int kCount>
    __device__ void store(int mt, int nt, const float (&v)[kCount]) {
        const int64_t c = c0 + mt, HW = d.H * d.W, NHW = d.N * HW;
        if (c >= d.Cg) return;
        KILN_UNROLL
        for (int i = 0; i < kCount; i++) {
            const int64_t j = j0 + nt + i;
            if (j < NHW) dx[(j / HW * d.C + g * d.Cg + c) * HW + j % HW] = T(v[i]);
        }
    }
};

// The block tile on the CUDA cores (kTensor false) or the tensor cores (true; T = f16, bf16, or
// float as TF32).
template <class S, typename T, bool kTensor>
struct ConvTile {
    using Stages = std::conditional_t<kTensor, detail::MmaStages<S>, detail::FmaStages<S>>;
    template <class LA, class LB, class Out>
    __device__ static void run(LA& la, LB& lb, int64_t k_begin, int64_t k_end, Stages& sm, Out& out) {
        if constexpr (kTensor) detail::mma_tile<S, T>(la, lb, k_begin, k_end, sm, out);
        else detail::fma_tile<S>(la, lb, k_begin, k_end, sm, out);
    }
};

// The blocks per SM the forward and dx kernels' launch bounds ask the compiler to make room for:
// on the CUDA cores 512 threads (two blocks of 256, four of 128), so at most 128 registers a
// thread and 25% occupancy, as gemm_warp_tiled asks. The tensor cores' tiles hold more
// accumulators and fragments per thread, and dw's loaders two running cursors (its rows and
// the (n, p, q) of its k): at 128 registers they spill, so those are left to the compiler
// (make CUDA=1 kernel-report shows each). 0 asks for nothing (nvcc then writes no .minnctapersm:
// the same as leaving the argument out; 1 would not be, it moves ptxas's choices).
template <class S, bool kTensor>
constexpr int kMinBlocks = kTensor ? 0 : 512 / S::kThreads;

// Block (bx, by, g): y's group g, output channels o0 = by·BM.., columns j0 = bx·BN.. .
template <class S, typename T, bool kTensor>
__global__ void __launch_bounds__(S::kThreads, kMinBlocks<S, kTensor>)
    conv2d_forward_tiled_kernel(const T* x, const T* w, const T* b, T* y, ConvDims d, bool vec_w) {
    using Tile = ConvTile<S, T, kTensor>;
    __shared__ typename Tile::Stages stages;
    const int64_t g = blockIdx.z, o0 = int64_t(blockIdx.y) * S::BM, j0 = int64_t(blockIdx.x) * S::BN;
    using LoadW = std::conditional_t<kTensor, detail::MmaGemmLoaderA<S, false, T>, detail::GemmLoaderA<S, false, T>>;
    LoadW la(w + g * d.Og * d.Kc, d.Kc, d.Og, d.Kc, o0, vec_w);
    __shared__ ConvTap taps[2][S::BK];
    ConvColumns<S, T> columns(x, d, g, j0, taps);
    WithDims<ConvColumns<S, T>> lb{columns, d};
    ConvForwardOut<T> out{y, b, d, g, o0, j0};
    __syncthreads();  // step 0's table is complete
    Tile::run(la, lb, 0, d.Kc, stages, out);
}

// Block (bx, by, g): dx's group g, channels c0 = by·BM.., columns j0 = bx·BN.. of N·H·W.
template <class S, typename T, bool kTensor>
__global__ void __launch_bounds__(S::kThreads, kMinBlocks<S, kTensor>)
    conv2d_backward_data_tiled_kernel(const T* dy, const T* w, T* dx, ConvDims d) {
    using Tile = ConvTile<S, T, kTensor>;
    __shared__ typename Tile::Stages stages;
    const int64_t g = blockIdx.z, c0 = int64_t(blockIdx.y) * S::BM, j0 = int64_t(blockIdx.x) * S::BN;
    ConvWeightsT<S, T> weights(w, d, g, c0);
    __shared__ ConvTap taps[2][S::BK];
    ConvGradColumns<S, T> columns(dy, d, g, j0, taps);
    WithDims<ConvWeightsT<S, T>> la{weights, d};
    WithDims<ConvGradColumns<S, T>> lb{columns, d};
    ConvDataOut<T> out{dx, d, g, c0, j0};
    __syncthreads();  // step 0's table is complete
    Tile::run(la, lb, 0, d.Og * d.KH * d.KW, stages, out);
}

// Block (bx, by, z): group g = z / slices, slice z % slices of the N·P·Q sum, its tile of
// dw[g·Og + o0.., n0..]: onto dw itself (one slice: beta 1, dw += Σ) or into the slice's own
// partial sums part + slice·O·Kc (beta 0), which gemm_sum_slices_kernel then adds in order.
template <class S, typename T, bool kTensor, typename CT>
__global__ void __launch_bounds__(S::kThreads)
    conv2d_backward_weight_tiled_kernel(const T* x, const T* dy, CT* out_base, ConvDims d, int64_t slices,
                                        int64_t k_slice) {
    using Tile = ConvTile<S, T, kTensor>;
    __shared__ typename Tile::Stages stages;
    const int64_t g = blockIdx.z / slices, slice = blockIdx.z % slices;
    const int64_t o0 = int64_t(blockIdx.y) * S::BM, n0 = int64_t(blockIdx.x) * S::BN, NPQ = d.N * d.P * d.Q;
    const int64_t k_begin = slice * k_slice, k_end = NPQ < k_begin + k_slice ? NPQ : k_begin + k_slice;
    ConvGradRows<S, T> rows(dy, d, g, o0, k_begin, k_end);
    __shared__ ConvTap columns[S::BN];
    ConvPatches<S, T> patches(x, d, g, n0, k_begin, k_end, columns);
    WithDims<ConvGradRows<S, T>> la{rows, d};
    WithDims<ConvPatches<S, T>> lb{patches, d};
    const bool partial = slices > 1;
    detail::GemmEpilogue<CT> out{out_base + slice * d.O * d.Kc + g * d.Og * d.Kc, d.Kc, d.Og, d.Kc, o0, n0, 1.0f,
                                 partial ? 0.0f : 1.0f, false};
    __syncthreads();  // the columns' table is complete
    Tile::run(la, lb, k_begin, k_end, stages, out);
}

// ---- depthwise: G == C == O, w [C, 1, KH, KW] --------------------------------------------------------
// See the header. The element-wise kernels index with I = int or int64_t (depthwise_int_indices);
// a plane is one (n, c): plane = n·C + c, so x[n, c] starts at plane·H·W and y[n, c] at plane·P·Q.

// y[n, c, p, q] = b[c] + Σ_{kh, kw} w[c, kh, kw] · x[n, c, p·stride − padding + kh·dilation,
//                                                      q·stride − padding + kw·dilation]
// thread e → y[e], e = (plane·P + p)·Q + q: consecutive threads, consecutive q.
template <typename T, typename I>
__global__ void depthwise_forward_kernel(const T* x, const T* w, const T* b, T* y, ConvDims d) {
    const I C = I(d.C), H = I(d.H), W = I(d.W), P = I(d.P), Q = I(d.Q), KH = I(d.KH), KW = I(d.KW);
    const I stride = I(d.stride), pad = I(d.padding), dil = I(d.dilation), total = I(d.N) * C * P * Q;
    for (I e = I(blockIdx.x) * I(blockDim.x) + I(threadIdx.x); e < total; e += I(gridDim.x) * I(blockDim.x)) {
        const I plane = e / (P * Q), p = e / Q % P, q = e % Q, c = plane % C;
        const T* xp = x + plane * H * W;  // x[n, c]   [H, W]
        const T* wc = w + c * KH * KW;    // w[c, 0]   [KH, KW]
        float acc = b ? float(b[c]) : 0.0f;
        for (I kh = 0; kh < KH; kh++) {
            const I ih = p * stride - pad + kh * dil;
            if (ih < 0 || ih >= H) continue;  // the whole row of taps is on the padding
            for (I kw = 0; kw < KW; kw++) {
                const I iw = q * stride - pad + kw * dil;
                if (iw >= 0 && iw < W) acc += float(wc[kh * KW + kw]) * float(xp[ih * W + iw]);
            }
        }
        y[e] = T(acc);
    }
}

// dx[n, c, ih, iw] = Σ_{kh, kw} w[c, kh, kw] · dy[n, c, p, q]   over the taps that read (ih, iw):
//   p = (ih + padding − kh·dilation) / stride a whole number in [0, P), q = (iw + ...) / stride likewise
// thread e → dx[e], e = (plane·H + ih)·W + iw. A gather: no two threads write one place.
template <typename T, typename I>
__global__ void depthwise_backward_data_kernel(const T* dy, const T* w, T* dx, ConvDims d) {
    const I C = I(d.C), H = I(d.H), W = I(d.W), P = I(d.P), Q = I(d.Q), KH = I(d.KH), KW = I(d.KW);
    const I stride = I(d.stride), pad = I(d.padding), dil = I(d.dilation), total = I(d.N) * C * H * W;
    for (I e = I(blockIdx.x) * I(blockDim.x) + I(threadIdx.x); e < total; e += I(gridDim.x) * I(blockDim.x)) {
        const I plane = e / (H * W), ih = e / W % H, iw = e % W, c = plane % C;
        const T* dyp = dy + plane * P * Q;  // dy[n, c]   [P, Q]
        const T* wc = w + c * KH * KW;      // w[c, 0]    [KH, KW]
        float acc = 0.0f;
        for (I kh = 0; kh < KH; kh++) {
            const I tp = ih + pad - kh * dil;  // = p·stride
            if (tp < 0) break;                 // and for every later kh too
            if (tp % stride != 0 || tp / stride >= P) continue;
            for (I kw = 0; kw < KW; kw++) {
                const I tq = iw + pad - kw * dil;  // = q·stride
                if (tq < 0) break;
                if (tq % stride == 0 && tq / stride < Q)
                    acc += float(wc[kh * KW + kw]) * float(dyp[tp / stride * Q + tq / stride]);
            }
        }
        dx[e] = T(acc);
    }
}

// [lo, hi): the output positions o in [0, O) whose input o·stride + off lies in [0, size) (empty:
// lo = hi). The CPU's valid_range (cpu/conv.cpp).
__device__ inline void depthwise_valid_range(int off, int size, int stride, int O, int& lo, int& hi) {
    lo = off >= 0 ? 0 : (-off + stride - 1) / stride;
    hi = size - 1 - off >= 0 ? (size - 1 - off) / stride + 1 : 0;
    hi = hi < O ? hi : O;
    lo = lo < hi ? lo : hi;
}

// The positions j = first, first + step, ... of a box [N, Pb, Qb] (j = (n·Pb + p)·Qb + q), as
// (n, p, q): the step is decomposed once, step = (sn·Pb + sp)·Qb + sq, and each move adds it
// with one carry per coordinate (sq < Qb, sp < Pb) — no division per position (ImplicitColumn's
// trick). The walk is over when n ≥ N. Pb, Qb ≥ 1.
struct BoxWalk {
    int n, p, q;     // the current position
    int sn, sp, sq;  // the step
    int Pb, Qb;

    __device__ BoxWalk(int Pb_, int Qb_, int first, int step) : Pb(Pb_), Qb(Qb_) {
        n = first / (Pb * Qb), p = first / Qb % Pb, q = first % Qb;
        sn = step / (Pb * Qb), sp = step / Qb % Pb, sq = step % Qb;
    }
    __device__ void next() {
        q += sq, p += sp, n += sn;
        if (q >= Qb) q -= Qb, p++;
        if (p >= Pb) p -= Pb, n++;
    }
};

// dw[c, kh, kw] += Σ_{n, p, q} dy[n, c, p, q] · x[n, c, p·stride + off_h, q·stride + off_w]
//   off_h = kh·dilation − padding, off_w likewise; only the box N × [p_lo, p_hi) × [q_lo, q_hi) of
//   outputs whose input is inside the image contributes (the rest reads padding: 0)
// Block cell = (c·KH + kh)·KW + kw (dw's own index), blockDim.x = kBlock threads: thread t sums
// the box's positions t, t + B, ... in double, then the block folds them in a fixed tree.
template <typename T>
__global__ void depthwise_backward_weight_kernel(const T* x, const T* dy, T* dw, ConvDims d) {
    __shared__ double sh[kBlock];
    const int64_t cell = blockIdx.x, KK = d.KH * d.KW, c = cell / KK;
    const int kh = int(cell % KK / d.KW), kw = int(cell % d.KW), stride = int(d.stride);
    const int off_h = kh * int(d.dilation) - int(d.padding), off_w = kw * int(d.dilation) - int(d.padding);
    int p_lo, p_hi, q_lo, q_hi;
    depthwise_valid_range(off_h, int(d.H), stride, int(d.P), p_lo, p_hi);
    depthwise_valid_range(off_w, int(d.W), stride, int(d.Q), q_lo, q_hi);
    double acc = 0.0;
    if (p_lo < p_hi && q_lo < q_hi) {  // else the tap only ever reads padding
        for (BoxWalk at(p_hi - p_lo, q_hi - q_lo, int(threadIdx.x), int(blockDim.x)); at.n < d.N; at.next()) {
            const int64_t plane = at.n * d.C + c, p = p_lo + at.p, q = q_lo + at.q;
            const float g = float(dy[(plane * d.P + p) * d.Q + q]);
            acc += double(g * float(x[(plane * d.H + p * stride + off_h) * d.W + q * stride + off_w]));
        }
    }
    acc = detail::block_reduce(acc, sh, detail::SumOp{});
    if (threadIdx.x == 0) dw[cell] = T(float(dw[cell]) + float(acc));
}

// ---- launchers ----------------------------------------------------------------------------------------
namespace {

template <typename T>
void check_workspace(const Conv2dParams& p, const T* col, int64_t col_images, const char* op) {
    KILN_CHECK(col && col_images >= 1, op, ": needs a device workspace of ", cuda::conv2d_col_elems_per_image(p),
               " elements per image and at least one image (got ", col_images,
               "); size it with cuda::conv2d_col_elems_per_image");
}

// The 1-D kernels: block 256, grid detail::blocks_for(elements); nothing to launch for 0 elements
// (the callers return early when N == 0).
template <typename T>
void im2col(const T* x, const ConvDims& d, int64_t n0, int64_t k, T* cols) {
    const dim3 grid(blocks_for(d.C * d.KH * d.KW * k * d.P * d.Q)), block(kBlock);
    KILN_LAUNCH(im2col_kernel<T>, grid, block, 0)(x, d, n0, k, cols);
    KILN_CHECK_LAUNCH(im2col_kernel<T>, grid, block);
}

template <typename T>
void col2im(const T* dcols, const ConvDims& d, int64_t n0, int64_t k, T* dx) {
    const dim3 grid(blocks_for(k * d.C * d.H * d.W)), block(kBlock);
    KILN_LAUNCH(col2im_kernel<T>, grid, block, 0)(dcols, d, n0, k, dx);
    KILN_CHECK_LAUNCH(col2im_kernel<T>, grid, block);
}

template <typename T>
void rows_to_nchw(const T* rows, const T* b, const ConvDims& d, int64_t n0, int64_t k, T* y) {
    const dim3 grid(blocks_for(d.O * k * d.P * d.Q)), block(kBlock);
    KILN_LAUNCH(rows_to_nchw_kernel<T>, grid, block, 0)(rows, b, d, n0, k, y);
    KILN_CHECK_LAUNCH(rows_to_nchw_kernel<T>, grid, block);
}

template <typename T>
void bias_rows(const T* b, const ConvDims& d, int64_t L, T* rows) {
    const dim3 grid(blocks_for(d.O * L)), block(kBlock);
    KILN_LAUNCH(bias_rows_kernel<T>, grid, block, 0)(b, d, L, rows);
    KILN_CHECK_LAUNCH(bias_rows_kernel<T>, grid, block);
}

template <typename T>
void nchw_to_rows(const T* dy, const ConvDims& d, int64_t n0, int64_t k, T* rows) {
    const dim3 grid(blocks_for(d.O * k * d.P * d.Q)), block(kBlock);
    KILN_LAUNCH(nchw_to_rows_kernel<T>, grid, block, 0)(dy, d, n0, k, rows);
    KILN_CHECK_LAUNCH(nchw_to_rows_kernel<T>, grid, block);
}

// f16 and bf16 take the tensor cores when a group has at least 16 output channels and a
// reduction of at least 16 (one fragment each way); below that the 64×64 tiles would be mostly
// padding (LeNet's first layer: 6 channels, Kc = 25), and the float kernel's 16×128 tiles fit.
bool conv_wmma_fits(const ConvDims& d) { return d.Og >= 16 && d.Kc >= 16; }

// ---- depthwise --------------------------------------------------------------------------------------
// The CPU's rule (cpu::conv2d_algo): one filter per channel, one channel per filter.
bool is_depthwise(const Conv2dParams& p) { return p.groups == p.C && p.O == p.C; }

// The element-wise depthwise kernels may index with int when x's and y's element counts, plus
// the grid-stride loop's last step past the end (≤ 1024 blocks of kBlock: blocks_for), stay
// below 2^31. Otherwise they take int64_t (and the 64-bit divisions that come with it).
bool depthwise_int_indices(const ConvDims& d) {
    return d.N * d.C * std::max(d.H * d.W, d.P * d.Q) + int64_t(1024) * kBlock <= 0x7fffffff;
}

// 1-D grid over y (forward) or dx (backward data), block 256.
template <typename I, typename T>
void depthwise_forward_indexed(const T* x, const T* w, const T* b, T* y, const ConvDims& d) {
    constexpr auto depthwise_forward = depthwise_forward_kernel<T, I>;
    const dim3 grid(blocks_for(d.N * d.C * d.P * d.Q)), block(kBlock);
    KILN_LAUNCH(depthwise_forward, grid, block, 0)(x, w, b, y, d);
    KILN_CHECK_LAUNCH(depthwise_forward, grid, block);
}

template <typename I, typename T>
void depthwise_backward_data_indexed(const T* dy, const T* w, T* dx, const ConvDims& d) {
    constexpr auto depthwise_backward_data = depthwise_backward_data_kernel<T, I>;
    const dim3 grid(blocks_for(d.N * d.C * d.H * d.W)), block(kBlock);
    KILN_LAUNCH(depthwise_backward_data, grid, block, 0)(dy, w, dx, d);
    KILN_CHECK_LAUNCH(depthwise_backward_data, grid, block);
}

template <typename T>
void conv2d_forward_depthwise(const T* x, const T* w, const T* b, T* y, const Conv2dParams& p) {
    check_conv2d_params(p, "cuda::conv2d_forward (depthwise)");
    if (p.N == 0) return;
    const ConvDims d = dims_of(p);
    if (depthwise_int_indices(d)) depthwise_forward_indexed<int>(x, w, b, y, d);
    else depthwise_forward_indexed<int64_t>(x, w, b, y, d);
}

template <typename T>
void conv2d_backward_data_depthwise(const T* dy, const T* w, T* dx, const Conv2dParams& p) {
    check_conv2d_params(p, "cuda::conv2d_backward_data (depthwise)");
    if (p.N == 0) return;
    const ConvDims d = dims_of(p);
    if (depthwise_int_indices(d)) depthwise_backward_data_indexed<int>(dy, w, dx, d);
    else depthwise_backward_data_indexed<int64_t>(dy, w, dx, d);
}

// db: bias_grad_kernel (one block per channel); dw: one block of kBlock per (c, kh, kw).
template <typename T>
void conv2d_backward_weight_depthwise(const T* x, const T* dy, T* dw, T* db, const Conv2dParams& p) {
    check_conv2d_params(p, "cuda::conv2d_backward_weight (depthwise)");
    if (p.N == 0) return;
    const ConvDims d = dims_of(p);
    KILN_CHECK(d.N <= 0x7fffffff && d.H * d.W <= 0x7fffffff && d.P * d.Q <= 0x7fffffff &&
                   d.C * d.KH * d.KW <= 0x7fffffff,
               "cuda::conv2d_backward_weight (depthwise): N=", d.N, ", H·W=", d.H * d.W, " or C·KH·KW=",
               d.C * d.KH * d.KW, " exceed the 32-bit positions or the grid of its dw kernel");
    if (db) {
        const dim3 grid(unsigned(d.C)), block(kBlock);
        KILN_LAUNCH(bias_grad_kernel<T>, grid, block, 0)(dy, d, db);
        KILN_CHECK_LAUNCH(bias_grad_kernel<T>, grid, block);
    }
    const dim3 grid(unsigned(d.C * d.KH * d.KW)), block(kBlock);
    KILN_LAUNCH(depthwise_backward_weight_kernel<T>, grid, block, 0)(x, dy, dw, d);
    KILN_CHECK_LAUNCH(depthwise_backward_weight_kernel<T>, grid, block);
}

// ---- the engine's implicit GEMMs: shapes and launches --------------------------------------------------
// The tile shapes: 128×128 when there are two such tiles per SM, else 64×64; 16×128 when the
// product has at most 16 rows (LeNet's first layers), where taller tiles would be mostly
// padding. The tensor cores take f16 and bf16, and f32 with TF32 on (set_tf32), when the product
// has at least 16 rows, columns and k (one mma block each way); below that, the CUDA cores.
using FmaNarrow = detail::FmaShape<16, 128, 32, 1, 4, 1, 1>;

enum class TileShape { Narrow, Small, Big };

TileShape tile_shape(int64_t M, int64_t N, int64_t groups) {
    if (M <= 16) return TileShape::Narrow;
    const int64_t big_tiles = (M + 127) / 128 * ((N + 127) / 128) * groups;
    return big_tiles >= 2 * detail::multiprocessors() ? TileShape::Big : TileShape::Small;
}

template <typename T>
bool tensor_cores_take(int64_t M, int64_t N, int64_t K) {
    return (!std::is_same_v<T, float> || tf32_on()) && M >= 16 && N >= 16 && K >= 16;
}

// Calls launch(shape, tensor) with the shape (a type) and whether it is the tensor cores'.
template <typename T, bool A_KC, bool B_KC, typename Launch>
void with_tile(int64_t M, int64_t N, int64_t K, int64_t groups, Launch launch) {
    const TileShape shape = tile_shape(M, N, groups);
    if (tensor_cores_take<T>(M, N, K)) {
        if (shape == TileShape::Big) return launch(detail::MmaBig<T, A_KC, B_KC>{}, std::true_type{});
        return launch(detail::MmaSmall<T, A_KC, B_KC>{}, std::true_type{});
    }
    if (shape == TileShape::Narrow) return launch(FmaNarrow{}, std::false_type{});
    if (shape == TileShape::Big) return launch(detail::FmaBig{}, std::false_type{});
    launch(detail::FmaSmall{}, std::false_type{});
}

// What every tiled pass checks: its grid and 32-bit indices within one image and group, and a
// stride whose remainders fit dx's 16-bit halves of ConvTap::key.
void check_tiled(const ConvDims& d, int64_t groups, int64_t M, int64_t columns, const char* op) {
    KILN_CHECK(groups <= 65535 && (M + 15) / 16 <= 65535 && (columns + 15) / 16 <= 0x7fffffff &&
                   d.C * std::max(d.H * d.W, d.P * d.Q) <= 0x7fffffff && d.O * d.P * d.Q <= 0x7fffffff &&
                   d.stride <= 0xffff,
               op, ": groups=", groups, ", ", M, " rows, ", columns, " columns, C·H·W=", d.C * d.H * d.W,
               ", O·P·Q=", d.O * d.P * d.Q, " or stride=", d.stride,
               " exceed the grid's, 32-bit indices' or offset tables' limits of the tiled kernels");
}

template <typename T>
void conv2d_forward_tiled(const T* x, const T* w, const T* b, T* y, const Conv2dParams& p) {
    const ConvDims d = dims_of(p);
    const int64_t NPQ = d.N * d.P * d.Q;
    check_tiled(d, p.groups, d.Og, NPQ, "cuda::conv2d_forward");
    with_tile<T, true, false>(d.Og, NPQ, d.Kc, p.groups, [&](auto shape, auto tensor) {
        using S = decltype(shape);
        constexpr auto conv_forward = conv2d_forward_tiled_kernel<S, T, decltype(tensor)::value>;
        bool vec_w = false;  // the weights' rows as 16-byte vectors
        if constexpr (decltype(tensor)::value) vec_w = detail::vector_chunks16(w, d.Kc, d.Kc);
        else vec_w = detail::vector_chunks(w, d.Kc, d.Kc);
        const dim3 grid(unsigned((NPQ + S::BN - 1) / S::BN), unsigned((d.Og + S::BM - 1) / S::BM), unsigned(p.groups));
        const dim3 block(S::kThreads);
        KILN_LAUNCH(conv_forward, grid, block, 0)(x, w, b, y, d, vec_w);
        KILN_CHECK_LAUNCH(conv_forward, grid, block);
    });
}

template <typename T>
void conv2d_backward_data_tiled(const T* dy, const T* w, T* dx, const Conv2dParams& p) {
    const ConvDims d = dims_of(p);
    const int64_t NHW = d.N * d.H * d.W, K = d.Og * d.KH * d.KW;
    check_tiled(d, p.groups, d.Cg, NHW, "cuda::conv2d_backward_data");
    with_tile<T, false, false>(d.Cg, NHW, K, p.groups, [&](auto shape, auto tensor) {
        using S = decltype(shape);
        constexpr auto conv_backward_data = conv2d_backward_data_tiled_kernel<S, T, decltype(tensor)::value>;
        const dim3 grid(unsigned((NHW + S::BN - 1) / S::BN), unsigned((d.Cg + S::BM - 1) / S::BM), unsigned(p.groups));
        const dim3 block(S::kThreads);
        KILN_LAUNCH(conv_backward_data, grid, block, 0)(dy, w, dx, d);
        KILN_CHECK_LAUNCH(conv_backward_data, grid, block);
    });
}

// dw += Σ over N·P·Q, split into S slices (gemm_split_k_slices: enough blocks to fill the GPU)
// of whole 32-long steps (S recounted from that length); with S > 1 the slices' partial sums go
// to a workspace of S·O·Kc floats and gemm_sum_slices_kernel adds them onto dw in order.
struct WeightSlices {
    int64_t S, k_slice;
};
WeightSlices weight_slices(const ConvDims& d, int64_t groups) {
    const int64_t NPQ = d.N * d.P * d.Q;
    const int64_t S = gemm_split_k_slices(d.Og, d.Kc * groups, NPQ);
    const int64_t k_slice = ((NPQ + S - 1) / S + 31) / 32 * 32;
    return {(NPQ + k_slice - 1) / k_slice, k_slice};
}

template <typename T>
void conv2d_backward_weight_tiled(const T* x, const T* dy, T* dw, const Conv2dParams& p) {
    const ConvDims d = dims_of(p);
    const int64_t NPQ = d.N * d.P * d.Q;
    check_tiled(d, p.groups, d.Og, d.Kc, "cuda::conv2d_backward_weight");
    const WeightSlices slices = weight_slices(d, p.groups);
    const int64_t S = slices.S, k_slice = slices.k_slice;
    KILN_CHECK(S * p.groups <= 65535, "cuda::conv2d_backward_weight: ", S, " slices of ", p.groups,
               " groups exceed the grid's limit");
    std::optional<detail::Workspace> ws;
    if (S > 1) ws.emplace(size_t(S * d.O * d.Kc) * sizeof(float));
    with_tile<T, true, true>(d.Og, d.Kc, NPQ, p.groups, [&](auto shape, auto tensor) {
        using Shape = decltype(shape);
        constexpr bool kTensor = decltype(tensor)::value;
        const dim3 grid(unsigned((d.Kc + Shape::BN - 1) / Shape::BN), unsigned((d.Og + Shape::BM - 1) / Shape::BM),
                        unsigned(S * p.groups));
        const dim3 block(Shape::kThreads);
        if (S > 1) {
            constexpr auto conv_backward_weight_slices = conv2d_backward_weight_tiled_kernel<Shape, T, kTensor, float>;
            KILN_LAUNCH(conv_backward_weight_slices, grid, block, 0)(x, dy, ws->as<float>(), d, S, k_slice);
            KILN_CHECK_LAUNCH(conv_backward_weight_slices, grid, block);
        } else {
            constexpr auto conv_backward_weight = conv2d_backward_weight_tiled_kernel<Shape, T, kTensor, T>;
            KILN_LAUNCH(conv_backward_weight, grid, block, 0)(x, dy, dw, d, S, k_slice);
            KILN_CHECK_LAUNCH(conv_backward_weight, grid, block);
        }
    });
    if (S > 1) {
        constexpr auto gemm_sum_slices = detail::gemm_sum_slices_kernel<T>;
        const dim3 grid(blocks_for(d.O * d.Kc)), block(kBlock);
        KILN_LAUNCH(gemm_sum_slices, grid, block, 0)(ws->as<float>(), S, d.O, d.Kc, 1.0f, 1.0f, dw, d.Kc);
        KILN_CHECK_LAUNCH(gemm_sum_slices, grid, block);
    }
}

}  // namespace

ConvAlgo conv2d_algo(const Conv2dParams& p) { return is_depthwise(p) ? ConvAlgo::Depthwise : ConvAlgo::ImplicitGemm; }

int64_t conv2d_col_elems_per_image(const Conv2dParams& p) {
    return (p.C * p.KH * p.KW + p.O) * p.P() * p.Q();  // its columns + its rows of y (or dy)
}

// Every strategy the engine runs, forward or backward, gathers in place: no workspace (the lab's
// im2col passes size theirs with conv2d_col_elems_per_image).
int64_t conv2d_workspace_per_image(const Conv2dParams& p, DType, bool) {
    const ConvAlgo algo = conv2d_algo(p);
    return algo == ConvAlgo::Depthwise || algo == ConvAlgo::ImplicitGemm ? 0 : conv2d_col_elems_per_image(p);
}

int64_t conv2d_chunk_images(const Conv2dParams&, DType, int64_t fit) { return fit; }

// conv2d_backward_weight_tiled's partial sums when it splits N·P·Q (weight_slices).
int64_t conv2d_backward_weight_scratch(const Conv2dParams& p) {
    if (is_depthwise(p) || p.N == 0) return 0;
    const int64_t S = weight_slices(dims_of(p), p.groups).S;
    return S > 1 ? S * p.O * p.Cg() * p.KH * p.KW * int64_t(sizeof(float)) : 0;
}

// Per chunk of k images (workspace: cols [CK, L], then rows [O, L]):
//   cols = im2col(x);   rows[g·Og.., L] = w[g·Og.., Kc] · cols[g·Kc.., L];   y = rows + b
// f16 and bf16 start rows at b and the GEMM adds onto it (beta = 1): y is rounded to T once.
template <typename T>
void conv2d_forward_im2col(const T* x, const T* w, const T* b, T* y, const Conv2dParams& p, T* col,
                           int64_t col_images) {
    check_conv2d_params(p, "cuda::conv2d_forward_im2col");
    if (p.N == 0) return;
    check_workspace(p, col, col_images, "cuda::conv2d_forward_im2col");
    const ConvDims d = dims_of(p);
    const bool bias_in_gemm = b && !std::is_same_v<T, float>;
    for (int64_t n0 = 0; n0 < d.N; n0 += col_images) {
        const int64_t k = std::min(col_images, d.N - n0), L = k * d.P * d.Q;
        T* cols = col;
        T* rows = col + d.C * d.KH * d.KW * L;
        im2col(x, d, n0, k, cols);
        if (bias_in_gemm) bias_rows(b, d, L, rows);
        for (int64_t g = 0; g < p.groups; g++)
            gemm(false, false, d.Og, L, d.Kc, 1.0f, w + g * d.Og * d.Kc, d.Kc, cols + g * d.Kc * L, L,
                 bias_in_gemm ? 1.0f : 0.0f, rows + g * d.Og * L, L);
        rows_to_nchw(rows, bias_in_gemm ? nullptr : b, d, n0, k, y);
    }
}

template <typename T>
void conv2d_forward_implicit_gemm(const T* x, const T* w, const T* b, T* y, const Conv2dParams& p, T*, int64_t) {
    check_conv2d_params(p, "cuda::conv2d_forward_implicit_gemm");
    if (p.N == 0) return;
    const ConvDims d = dims_of(p);
    if constexpr (!std::is_same_v<T, float>) {  // f16, bf16: the tensor cores, when the shapes allow
        if (conv_wmma_fits(d)) return conv2d_forward_implicit_gemm_wmma(x, w, b, y, p);
    }
    const int64_t NPQ = d.N * d.P * d.Q;
    const bool narrow = d.Og <= 16;
    const int64_t BM = narrow ? 16 : 64, BN = narrow ? 128 : 64;
    KILN_CHECK(p.groups <= 65535 && (d.Og + BM - 1) / BM <= 65535 && (NPQ + BN - 1) / BN <= 0x7fffffff &&
                   d.Cg * d.H * d.W <= 0x7fffffff,
               "cuda::conv2d_forward_implicit_gemm: groups=", p.groups, ", O/G=", d.Og, ", N·P·Q=", NPQ, " or C/G·H·W=",
               d.Cg * d.H * d.W, " exceed the grid's or 32-bit indices' limits; use cuda::conv2d_forward_im2col");
    const dim3 grid(unsigned((NPQ + BN - 1) / BN), unsigned((d.Og + BM - 1) / BM), unsigned(p.groups)), block(256);
    // 64×64 tiles (4×4 per thread), or 16×128 tiles (2×4 per thread) for groups of at most 16
    // output channels; 256 threads each. (Names without commas, for the launch macros.)
    if (narrow) {
        const auto conv_implicit_16x128 = conv2d_implicit_gemm_kernel<T, 16, 128, 16, 2, 4>;
        KILN_LAUNCH(conv_implicit_16x128, grid, block, 0)(x, w, b, y, d);
        KILN_CHECK_LAUNCH(conv_implicit_16x128, grid, block);
    } else {
        const auto conv_implicit_64x64 = conv2d_implicit_gemm_kernel<T, 64, 64, 16, 4, 4>;
        KILN_LAUNCH(conv_implicit_64x64, grid, block, 0)(x, w, b, y, d);
        KILN_CHECK_LAUNCH(conv_implicit_64x64, grid, block);
    }
}

// The tensor-core variant: 64×64 tiles of 4 warps, 128 threads (see its kernel).
template <typename T>
void conv2d_forward_implicit_gemm_wmma(const T* x, const T* w, const T* b, T* y, const Conv2dParams& p) {
    check_conv2d_params(p, "cuda::conv2d_forward_implicit_gemm_wmma");
    if (p.N == 0) return;
    const ConvDims d = dims_of(p);
    const int64_t NPQ = d.N * d.P * d.Q, tile = detail::wmma_tile::kBM;
    KILN_CHECK(p.groups <= 65535 && (d.Og + tile - 1) / tile <= 65535 && (NPQ + tile - 1) / tile <= 0x7fffffff &&
                   d.Cg * d.H * d.W <= 0x7fffffff,
               "cuda::conv2d_forward_implicit_gemm_wmma: groups=", p.groups, ", O/G=", d.Og, ", N·P·Q=", NPQ,
               " or C/G·H·W=", d.Cg * d.H * d.W, " exceed the grid's or 32-bit indices' limits; use "
               "cuda::conv2d_forward_im2col");
    constexpr auto conv_implicit_wmma = conv2d_implicit_gemm_wmma_kernel<T>;
    const dim3 grid(unsigned((NPQ + tile - 1) / tile), unsigned((d.Og + tile - 1) / tile), unsigned(p.groups));
    const dim3 block(detail::wmma_tile::kThreads);
    KILN_LAUNCH(conv_implicit_wmma, grid, block, 0)(x, w, b, y, d);
    KILN_CHECK_LAUNCH(conv_implicit_wmma, grid, block);
}
template void conv2d_forward_implicit_gemm_wmma<f16>(const f16*, const f16*, const f16*, f16*, const Conv2dParams&);
template void conv2d_forward_implicit_gemm_wmma<bf16>(const bf16*, const bf16*, const bf16*, bf16*,
                                                      const Conv2dParams&);

// Depthwise shapes take the direct kernel; the others the strategy conv2d_algo names.
template <typename T>
void conv2d_forward(const T* x, const T* w, const T* b, T* y, const Conv2dParams& p, T*, int64_t) {
    if (is_depthwise(p)) return conv2d_forward_depthwise(x, w, b, y, p);
    check_conv2d_params(p, "cuda::conv2d_forward");
    if (p.N > 0) conv2d_forward_tiled(x, w, b, y, p);
}

// Per chunk: rows = dy;   dcols[g·Kc.., L] = w[g·Og.., Kc]ᵀ · rows[g·Og.., L];   dx = col2im(dcols)
// (depthwise: the direct gather, no workspace)
template <typename T>
void conv2d_backward_data(const T* dy, const T* w, T* dx, const Conv2dParams& p, T*, int64_t) {
    if (is_depthwise(p)) return conv2d_backward_data_depthwise(dy, w, dx, p);
    check_conv2d_params(p, "cuda::conv2d_backward_data");
    if (p.N > 0) conv2d_backward_data_tiled(dy, w, dx, p);
}

// The lab's strategy 2 backward (chapter 05's): per chunk, rows = dy;
// dcols[g·Kc.., L] = w[g·Og.., Kc]ᵀ · rows[g·Og.., L];   dx = col2im(dcols)
template <typename T>
void conv2d_backward_data_im2col(const T* dy, const T* w, T* dx, const Conv2dParams& p, T* col, int64_t col_images) {
    check_conv2d_params(p, "cuda::conv2d_backward_data_im2col");
    if (p.N == 0) return;
    check_workspace(p, col, col_images, "cuda::conv2d_backward_data");
    const ConvDims d = dims_of(p);
    for (int64_t n0 = 0; n0 < d.N; n0 += col_images) {
        const int64_t k = std::min(col_images, d.N - n0), L = k * d.P * d.Q;
        T* dcols = col;
        T* rows = col + d.C * d.KH * d.KW * L;
        nchw_to_rows(dy, d, n0, k, rows);
        for (int64_t g = 0; g < p.groups; g++)
            gemm(true, false, d.Kc, L, d.Og, 1.0f, w + g * d.Og * d.Kc, d.Kc, rows + g * d.Og * L, L, 0.0f,
                 dcols + g * d.Kc * L, L);
        col2im(dcols, d, n0, k, dx);
    }
}

// db[o] += Σ dy[:, o];   per chunk: cols = im2col(x), rows = dy,
//   dw[g·Og.., Kc] += rows[g·Og.., L] · cols[g·Kc.., L]ᵀ        (depthwise: the direct kernels, no workspace)
// db[o] += Σ dy[:, o]: one block per output channel.
template <typename T>
void bias_grad(const T* dy, const ConvDims& d, T* db) {
    const dim3 grid(unsigned(d.O)), block(kBlock);
    KILN_LAUNCH(bias_grad_kernel<T>, grid, block, 0)(dy, d, db);
    KILN_CHECK_LAUNCH(bias_grad_kernel<T>, grid, block);
}

template <typename T>
void conv2d_backward_weight(const T* x, const T* dy, T* dw, T* db, const Conv2dParams& p, T*, int64_t) {
    if (is_depthwise(p)) return conv2d_backward_weight_depthwise(x, dy, dw, db, p);
    check_conv2d_params(p, "cuda::conv2d_backward_weight");
    if (p.N == 0) return;
    if (db) bias_grad(dy, dims_of(p), db);
    conv2d_backward_weight_tiled(x, dy, dw, p);
}

// The lab's strategy 2 backward (chapter 05's): db as above; per chunk, cols = im2col(x), rows = dy,
//   dw[g·Og.., Kc] += rows[g·Og.., L] · cols[g·Kc.., L]ᵀ      (cuda::gemm_split_k, beta 1)
template <typename T>
void conv2d_backward_weight_im2col(const T* x, const T* dy, T* dw, T* db, const Conv2dParams& p, T* col,
                                   int64_t col_images) {
    check_conv2d_params(p, "cuda::conv2d_backward_weight_im2col");
    if (p.N == 0) return;
    check_workspace(p, col, col_images, "cuda::conv2d_backward_weight_im2col");
    const ConvDims d = dims_of(p);
    if (db) bias_grad(dy, d, db);
    for (int64_t n0 = 0; n0 < d.N; n0 += col_images) {
        const int64_t k = std::min(col_images, d.N - n0), L = k * d.P * d.Q;
        T* cols = col;
        T* rows = col + d.C * d.KH * d.KW * L;
        im2col(x, d, n0, k, cols);
        nchw_to_rows(dy, d, n0, k, rows);
        for (int64_t g = 0; g < p.groups; g++)
            gemm_split_k(false, true, d.Og, d.Kc, L, 1.0f, rows + g * d.Og * L, L, cols + g * d.Kc * L, L, 1.0f,
                         dw + g * d.Og * d.Kc, d.Kc);
    }
}

KILN_CONV_KERNELS(KILN_INSTANTIATE_FLOAT);
KILN_INSTANTIATE_FLOAT(conv2d_forward_im2col);
KILN_INSTANTIATE_FLOAT(conv2d_forward_implicit_gemm);
KILN_INSTANTIATE_FLOAT(conv2d_backward_data_im2col);
KILN_INSTANTIATE_FLOAT(conv2d_backward_weight_im2col);

}  // namespace kiln::cuda
