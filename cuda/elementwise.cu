// elementwise.cu — the CUDA twins of src/ops/cpu/elementwise.cpp: fill, add, axpy, scale, ReLU
// forward and backward. Each is the CPU loop body run by one thread per element.
//
// How they work: thread t of block b handles element i = b·T + t, then i + gridDim.x·T, ...
// (a grid-stride loop), so one launch shape serves any n. Consecutive threads of a warp touch
// consecutive floats: each warp reads and writes 128 contiguous bytes at a time — coalesced,
// the only thing that matters for a kernel that does one multiply per 8 bytes it moves.
//
// Launch shape (every kernel here): block = 256 threads, grid = min(ceil(n / 256), 1024)
// blocks (detail::blocks_for); n == 0 launches nothing.
//
// Build and run: part of the engine (make, or make CUDA=1); tested against the CPU versions by
//   make test T='[cuda][elementwise]'
#include "common.cuh"
#include "ops/cuda_ops.h"

namespace kiln::cuda {

using detail::blocks_for;
using detail::kBlock;

// x[i] = value
__global__ void fill_kernel(float* x, int64_t n, float value) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        x[i] = value;
}

// y[i] = a[i] + b[i]
__global__ void add_kernel(const float* a, const float* b, float* y, int64_t n) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        y[i] = a[i] + b[i];
}

// y[i] += alpha·x[i]
__global__ void axpy_kernel(float alpha, const float* x, float* y, int64_t n) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        y[i] += alpha * x[i];
}

// x[i] *= s
__global__ void scale_kernel(float* x, int64_t n, float s) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        x[i] *= s;
}

// y[i] = max(x[i], 0)
__global__ void relu_forward_kernel(const float* x, float* y, int64_t n) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        y[i] = fmaxf(x[i], 0.0f);
}

// dx[i] = dy[i]·[y[i] > 0]    (y is ReLU's output)
__global__ void relu_backward_kernel(const float* y, const float* dy, float* dx, int64_t n) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

// ---- launchers: the names and arguments of cpu_ops.h ---------------------------------------
void fill(float* x, int64_t n, float value) {
    if (n == 0) return;
    const dim3 grid(blocks_for(n)), block(kBlock);
    KILN_LAUNCH(fill_kernel, grid, block, 0)(x, n, value);
    KILN_CHECK_LAUNCH(fill_kernel, grid, block);
}

void add(const float* a, const float* b, float* y, int64_t n) {
    if (n == 0) return;
    const dim3 grid(blocks_for(n)), block(kBlock);
    KILN_LAUNCH(add_kernel, grid, block, 0)(a, b, y, n);
    KILN_CHECK_LAUNCH(add_kernel, grid, block);
}

void axpy(float alpha, const float* x, float* y, int64_t n) {
    if (n == 0) return;
    const dim3 grid(blocks_for(n)), block(kBlock);
    KILN_LAUNCH(axpy_kernel, grid, block, 0)(alpha, x, y, n);
    KILN_CHECK_LAUNCH(axpy_kernel, grid, block);
}

void scale(float* x, int64_t n, float s) {
    if (n == 0) return;
    const dim3 grid(blocks_for(n)), block(kBlock);
    KILN_LAUNCH(scale_kernel, grid, block, 0)(x, n, s);
    KILN_CHECK_LAUNCH(scale_kernel, grid, block);
}

void relu_forward(const float* x, float* y, int64_t n) {
    if (n == 0) return;
    const dim3 grid(blocks_for(n)), block(kBlock);
    KILN_LAUNCH(relu_forward_kernel, grid, block, 0)(x, y, n);
    KILN_CHECK_LAUNCH(relu_forward_kernel, grid, block);
}

void relu_backward(const float* y, const float* dy, float* dx, int64_t n) {
    if (n == 0) return;
    const dim3 grid(blocks_for(n)), block(kBlock);
    KILN_LAUNCH(relu_backward_kernel, grid, block, 0)(y, dy, dx, n);
    KILN_CHECK_LAUNCH(relu_backward_kernel, grid, block);
}

}  // namespace kiln::cuda
