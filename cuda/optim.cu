// optim.cu — the CUDA twin of cpu::sgd_update (src/ops/cpu/elementwise.cpp): one fused pass
// that reads each parameter, its gradient and its momentum buffer once and writes the new
// values, so an optimizer step costs one trip through memory instead of four.
//
// How it works: one thread per parameter (grid-stride loop) runs the CPU loop body unchanged:
// no reduction, no reordering. The only possible difference from the CPU is that a compiler may
// contract a·b + c into one fused multiply-add (rounded once instead of twice), so the tests
// compare with a tolerance of a few ulps.
//
// Launch shape: block = 256 threads, grid = min(ceil(n / 256), 1024); n == 0 launches nothing.
//
//   make test T='[cuda][optim]'
#include "common.cuh"
#include "ops/cuda_ops.h"

namespace kiln::cuda {

// PyTorch's SGD, per parameter i:
//   g = grad + wd·p
//   if momentum ≠ 0:  buf = first ? g : momentum·buf + (1 − dampening)·g
//                     g   = nesterov ? g + momentum·buf : buf
//   p −= lr·g
__global__ void sgd_update_kernel(float* p, const float* grad, float* buf, int64_t n, float lr, float momentum,
                                  float dampening, float weight_decay, bool nesterov, bool first_step) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        float g = grad[i] + weight_decay * p[i];
        if (momentum != 0.0f) {
            buf[i] = first_step ? g : momentum * buf[i] + (1.0f - dampening) * g;
            g = nesterov ? g + momentum * buf[i] : buf[i];
        }
        p[i] -= lr * g;
    }
}

void sgd_update(float* p, const float* grad, float* buf, int64_t n, float lr, float momentum, float dampening,
                float weight_decay, bool nesterov, bool first_step) {
    if (n == 0) return;
    const dim3 grid(detail::blocks_for(n)), block(detail::kBlock);
    KILN_LAUNCH(sgd_update_kernel, grid, block, 0)(p, grad, buf, n, lr, momentum, dampening, weight_decay, nesterov,
                                                   first_step);
    KILN_CHECK_LAUNCH(sgd_update_kernel, grid, block);
}

}  // namespace kiln::cuda
