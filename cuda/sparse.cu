// sparse.cu — the CUDA twin of src/ops/cpu/sparse.cpp: y = x · Wᵀ + b with W in compressed
// sparse rows (ops/sparse.h), chapter 10. Same name and arguments as cpu::csr_linear (both
// declared once there); pointers are device memory. f32 only.
//
//   y[n, o] = Σ_{k in row o} values[k] · x[n, col_index[k]]  (+ b[o])
//
// Thread/block mapping: one thread per output element y[n, o], 1-D grid-stride, block 256,
// consecutive threads on consecutive o of one batch row n. Why this one:
//   - it is the simplest correct kernel: no shared memory, no reduction between threads, and
//     each output adds its terms in k's order, as the CPU does: the same bits on every run.
//     Not always the CPU's bits: whether a term's product and sum are fused into one FMA is
//     the compiler's choice (nvcc fuses; g++ fused the CPU's vector loop but not this scalar
//     one on the emulator here), so the tests allow the bound of a sum in any order;
//   - the stores y[n, o], o = o0 .. o0 + 31, of a warp are one coalesced transaction, and the
//     32 threads read x's row n, which the L1 cache keeps after the first misses.
// What it leaves on the table: the threads of a warp walk rows of different lengths (a warp
// waits for its longest row) and read values/col_index at scattered places. A warp per row
// (lanes over k, then a warp shuffle reduction) suits long rows better, and cuSPARSE's SpMM
// tiles the batch like the CPU's panels; both change the order of the sum, so they would give
// other bits than the CPU. At chapter 10's sizes (rows of 78 nonzeros at 90% sparsity of a
// 784-wide layer) the simple mapping is enough to teach with and to check against the CPU.
//
// Build and run: part of the engine (make, or make CUDA=1); tested against the CPU by
//   make test T='[sparse][cuda]'
#include "common.cuh"
#include "ops/sparse.h"

namespace kiln::cuda {

using detail::blocks_for;
using detail::kBlock;

__global__ void csr_linear_kernel(const float* x, const float* values, const int32_t* col_index,
                                  const int32_t* row_start, const float* bias, float* y, int64_t N, int64_t in,
                                  int64_t out) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < N * out; i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t n = i / out, o = i % out;
        const float* xn = x + n * in;
        float acc = 0.0f;
        for (int32_t k = row_start[o]; k < row_start[o + 1]; k++) acc += values[k] * xn[col_index[k]];
        y[i] = acc + (bias ? bias[o] : 0.0f);
    }
}

void csr_linear(const float* x, const float* values, const int32_t* col_index, const int32_t* row_start,
                const float* bias, float* y, int64_t N, int64_t in, int64_t out) {
    if (N * out == 0) return;
    const dim3 grid(blocks_for(N * out)), block(kBlock);
    KILN_LAUNCH(csr_linear_kernel, grid, block, 0)(x, values, col_index, row_start, bias, y, N, in, out);
    KILN_CHECK_LAUNCH(csr_linear_kernel, grid, block);
}

}  // namespace kiln::cuda
