// reduce.cu — the CUDA twins of src/ops/cpu/reduce.cpp: sum, sum_squares and max, and the row
// kernels add_bias, sum_rows (column sums of an N×C matrix) and argmax_rows. Each is a
// template on the element type T (float, f16, bf16), reading elements as float.
//
// Letters: n = element count, N = rows, C = columns, T = threads per block, P = partials.
//
// sum, sum_squares and max — two passes, no atomics, so the result is the same on every run:
//   pass 1  reduce_kernel<<<P, 256>>>        P = min(ceil(n / 256), 1024) blocks. Thread t of
//           block b folds x[b·256 + t] (squared, for sum_squares: exact in double), then every
//           P·256-th element after it (grid-stride) into
//           one value, then the block folds its 256 values with detail::block_reduce (a tree in
//           shared memory, then warp shuffles) and writes partial[b].
//   pass 2  reduce_kernel<<<1, 256>>>        one block folds the P partials the same way.
//   The assignment of elements to threads depends on n only (not on the GPU), so the order of
//   the additions — and the rounding — is fixed. Sums accumulate in double, like the CPU's.
//
// add_bias      1-D grid-stride over N·C, block 256: y[i] += b[i mod C].
// sum_rows      block (32, 8), grid = ceil(C / 32) column strips (at most 65535, looping
//               beyond): thread (x, y) sums rows y, y + 8, y + 16, ... of column strip·32 + x,
//               a warp reading 32 consecutive floats of one row (coalesced); then row y = 0 adds
//               the 8 partial sums in order. Each column is summed in a fixed order.
// argmax_rows   one thread per row (grid-stride), the CPU's loop: the first maximum wins.
//               Fine for the class counts kiln sees (C = 10 or 100).
//
//   make test T='[cuda][reduce]'
#include <cmath>

#include "common.cuh"
#include "core/cuda_memory.h"  // copy_to_host
#include "ops/reduce.h"

namespace kiln::cuda {

using detail::blocks_for;
using detail::kBlock;

// ---- sum, sum_squares and max ---------------------------------------------------------------
// What pass 1 folds: each value as it is, or its square.
struct Identity {
    template <typename T>
    __device__ T operator()(T a) const { return a; }
};
struct Square {
    __device__ double operator()(double a) const { return a * a; }
};

// x as an Acc: f32, f16 and bf16 through their exact float value, Acc itself as it is.
template <typename Acc, typename In>
__device__ Acc as_acc(In x) {
    if constexpr (is_float_type<In>) return Acc(float(x));
    else return Acc(x);
}

// partial[b] = op over map(x[i]) for the elements block b owns (see above); with gridDim.x == 1
// it is the total.
//   In: the input type (T for pass 1, Acc for pass 2)   Acc: what the values are folded in.
template <typename In, typename Acc, typename Op, typename Map = Identity>
__global__ void reduce_kernel(const In* x, int64_t n, Acc identity, Acc* partial) {
    __shared__ Acc sh[kBlock];
    const Op op{};
    const Map map{};
    Acc v = identity;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        v = op(v, map(as_acc<Acc>(x[i])));
    v = detail::block_reduce(v, sh, op);
    if (threadIdx.x == 0) partial[blockIdx.x] = v;
}

// Names without commas, for the launch macros (pass 1 is named in sum, sum_squares and max).
constexpr auto sum_pass2 = reduce_kernel<double, double, detail::SumOp>;
constexpr auto max_pass2 = reduce_kernel<float, float, detail::MaxOp>;

// *total (device memory) = Σ_i x[i] (pass1 = reduce_kernel<T, double, SumOp>) or Σ_i x[i]²
// (with Square), in double; n ≥ 1. Nothing waits for the GPU.
template <typename T>
static void two_pass_sum_on_device(void (*pass1)(const T*, int64_t, double, double*), const T* x, int64_t n,
                                   double* total) {
    const unsigned P = blocks_for(n, kBlock, 1024);
    detail::Workspace ws(P * sizeof(double));  // the P partials
    double* partial = ws.as<double>();
    const dim3 grid1(P), grid2(1), block(kBlock);
    KILN_LAUNCH(pass1, grid1, block, 0)(x, n, 0.0, partial);
    KILN_CHECK_LAUNCH(pass1, grid1, block);
    KILN_LAUNCH(sum_pass2, grid2, block, 0)(partial, int64_t(P), 0.0, total);
    KILN_CHECK_LAUNCH(sum_pass2, grid2, block);
}

// The same, read back to the host (the copy waits for both passes).
template <typename T>
static double two_pass_sum(void (*pass1)(const T*, int64_t, double, double*), const T* x, int64_t n) {
    if (n == 0) return 0.0;
    detail::Workspace ws(sizeof(double));
    two_pass_sum_on_device(pass1, x, n, ws.as<double>());
    double total = 0.0;
    copy_to_host(&total, ws.as<double>(), sizeof total);
    return total;
}

template <typename T>
double sum(const T* x, int64_t n) {
    return two_pass_sum(reduce_kernel<T, double, detail::SumOp>, x, n);
}

void sum_on_device(const float* x, int64_t n, double* total) {
    two_pass_sum_on_device(reduce_kernel<float, double, detail::SumOp>, x, n, total);
}

template <typename T>
double sum_squares(const T* x, int64_t n) {
    return two_pass_sum(reduce_kernel<T, double, detail::SumOp, Square>, x, n);
}

// max_i x[i] (−inf for n == 0; the op max, ops/reduce.h, refuses empty tensors). fmaxf ignores NaN, as the
// CPU's std::max(m, x) does when m is a number.
template <typename T>
float max(const T* x, int64_t n) {
    if (n == 0) return -INFINITY;
    constexpr auto max_pass1 = reduce_kernel<T, float, detail::MaxOp>;
    const unsigned P = blocks_for(n, kBlock, 1024);
    detail::Workspace ws((P + 1) * sizeof(float));
    float* partial = ws.as<float>();
    const dim3 grid1(P), grid2(1), block(kBlock);
    KILN_LAUNCH(max_pass1, grid1, block, 0)(x, n, -INFINITY, partial);
    KILN_CHECK_LAUNCH(max_pass1, grid1, block);
    KILN_LAUNCH(max_pass2, grid2, block, 0)(partial, int64_t(P), -INFINITY, partial + P);
    KILN_CHECK_LAUNCH(max_pass2, grid2, block);
    float m = 0.0f;
    copy_to_host(&m, partial + P, sizeof m);
    return m;
}

// ---- rows of an N×C matrix ---------------------------------------------------------------------
// y[n,c] += b[c]
template <typename T>
__global__ void add_bias_kernel(T* y, const T* b, int64_t N, int64_t C) {
    const int64_t total = N * C;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x)
        y[i] = T(float(y[i]) + float(b[i % C]));
}

template <typename T>
void add_bias(T* y, const T* b, int64_t N, int64_t C) {
    if (N * C == 0) return;
    constexpr auto add_bias_kernel_t = add_bias_kernel<T>;
    const dim3 grid(blocks_for(N * C)), block(kBlock);
    KILN_LAUNCH(add_bias_kernel_t, grid, block, 0)(y, b, N, C);
    KILN_CHECK_LAUNCH(add_bias_kernel_t, grid, block);
}

constexpr int kStrip = 32;    // columns per block: one warp across a row
constexpr int kSlices = 8;    // row slices per block: blockDim.y

// db[c] = Σ_n dy[n,c] + beta·db[c]   (beta == 0: db is overwritten, never read)
//   thread (x, y):  s = dy[y, c] + dy[y + 8, c] + dy[y + 16, c] + ...     c = strip·32 + x
//   then            db[c] = ((s_0 + s_1) + s_2) + ... + s_7  (+ beta·db[c])
template <typename T>
__global__ void sum_rows_kernel(const T* dy, T* db, int64_t N, int64_t C, float beta) {
    __shared__ float part[kSlices][kStrip];
    const int x = threadIdx.x, y = threadIdx.y;
    const int64_t strips = (C + kStrip - 1) / kStrip;
    for (int64_t strip = blockIdx.x; strip < strips; strip += gridDim.x) {
        const int64_t c = strip * kStrip + x;
        float s = 0.0f;
        if (c < C)
            for (int64_t n = y; n < N; n += kSlices) s += float(dy[n * C + c]);
        part[y][x] = s;
        __syncthreads();
        if (y == 0 && c < C) {
            float total = part[0][x];
            for (int k = 1; k < kSlices; k++) total += part[k][x];
            db[c] = T(total + (beta == 0.0f ? 0.0f : beta * float(db[c])));
        }
        __syncthreads();  // part is reused by the next strip
    }
}

template <typename T>
void sum_rows(const T* dy, T* db, int64_t N, int64_t C, float beta) {
    if (C == 0) return;
    constexpr auto sum_rows_kernel_t = sum_rows_kernel<T>;
    const dim3 grid(unsigned(std::min<int64_t>((C + kStrip - 1) / kStrip, 65535))), block(kStrip, kSlices);
    KILN_LAUNCH(sum_rows_kernel_t, grid, block, 0)(dy, db, N, C, beta);
    KILN_CHECK_LAUNCH(sum_rows_kernel_t, grid, block);
}


// out[n] = the first c with x[n,c] = max_c' x[n,c']
template <typename T>
__global__ void argmax_rows_kernel(const T* x, int32_t* out, int64_t N, int64_t C) {
    for (int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; n < N; n += int64_t(gridDim.x) * blockDim.x) {
        const T* row = x + n * C;
        int64_t best = 0;
        for (int64_t c = 1; c < C; c++)
            if (float(row[c]) > float(row[best])) best = c;
        out[n] = int32_t(best);
    }
}

template <typename T>
void argmax_rows(const T* x, int32_t* out, int64_t N, int64_t C) {
    if (N == 0) return;
    constexpr auto argmax_rows_kernel_t = argmax_rows_kernel<T>;
    const dim3 grid(blocks_for(N)), block(kBlock);
    KILN_LAUNCH(argmax_rows_kernel_t, grid, block, 0)(x, out, N, C);
    KILN_CHECK_LAUNCH(argmax_rows_kernel_t, grid, block);
}

KILN_REDUCE_KERNELS(KILN_INSTANTIATE_FLOAT);

}  // namespace kiln::cuda
