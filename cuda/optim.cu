// optim.cu — the CUDA twins of cpu::sgd_update and cpu::adam_update (src/ops/cpu/optim.cpp):
// one fused pass that reads each parameter, its gradient and its optimizer buffers once and
// writes the new values, so an optimizer step costs one trip through memory instead of one per
// line of the rule (four for SGD with momentum, about ten for Adam). And the twin of
// cpu::unscale_and_check, GradScaler's unscale with its grid-wide inf/NaN flag (chapter 09).
//
// How it works: one thread per parameter (grid-stride loop) runs the CPU loop body unchanged:
// no reduction, no reordering. The only possible difference from the CPU is that a compiler may
// contract a·b + c into one fused multiply-add (rounded once instead of twice), so the tests
// compare with a tolerance of a few ulps. (sqrtf and / are correctly rounded on the GPU unless
// nvcc is given --use_fast_math, which kiln's Makefile does not.)
//
// Launch shape: block = 256 threads, grid = min(ceil(n / 256), 1024); n == 0 launches nothing.
//
//   make test T='[cuda][optim]'
#include "common.cuh"
#include "ops/kernels/optim.h"

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

void sgd_update(float* p, const float* grad, float* buf, int64_t n, const SgdParams& s) {
    if (n == 0) return;
    const dim3 grid(detail::blocks_for(n)), block(detail::kBlock);
    KILN_LAUNCH(sgd_update_kernel, grid, block, 0)(p, grad, buf, n, s.lr, s.momentum, s.dampening, s.weight_decay,
                                                   s.nesterov, s.first_step);
    KILN_CHECK_LAUNCH(sgd_update_kernel, grid, block);
}

// PyTorch's Adam / AdamW, per parameter i (step_size = lr / (1 − β1^t), bc2_sqrt = sqrt(1 − β2^t),
// decay = 1 − lr·wd, computed once on the host):
//   AdamW: p = decay·p     Adam: g = grad + wd·p
//   m = β1·m + (1 − β1)·g;   v = β2·v + (1 − β2)·g²;   v_max = max(v_max, v)   (AMSGrad: v_max ≠ null)
//   p −= step_size · m / (sqrt(v or v_max) / bc2_sqrt + eps)
__global__ void adam_update_kernel(float* p, const float* grad, float* m, float* v, float* v_max, int64_t n,
                                   AdamParams a, float step_size, float bc2_sqrt, float decay) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        float g = grad[i];
        if (a.decoupled) p[i] *= decay;
        else g += a.weight_decay * p[i];
        m[i] = a.beta1 * m[i] + (1.0f - a.beta1) * g;
        v[i] = a.beta2 * v[i] + (1.0f - a.beta2) * g * g;
        const float v_used = v_max ? (v_max[i] = fmaxf(v_max[i], v[i])) : v[i];
        p[i] -= step_size * m[i] / (sqrtf(v_used) / bc2_sqrt + a.eps);
    }
}

void adam_update(float* p, const float* grad, float* m, float* v, float* v_max, int64_t n, const AdamParams& a) {
    if (n == 0) return;
    const dim3 grid(detail::blocks_for(n)), block(detail::kBlock);
    KILN_LAUNCH(adam_update_kernel, grid, block, 0)(p, grad, m, v, v_max, n, a, float(a.step_size()),
                                                    float(a.bias_correction2_sqrt()), float(a.decay()));
    KILN_CHECK_LAUNCH(adam_update_kernel, grid, block);
}

// GradScaler's unscale_ (cpu::unscale_and_check is the twin), per element i:
//   if g[i] is inf or NaN:  found_inf = 1        (tested before the multiply)
//   g[i] *= inv_scale
// found_inf is one int in device memory for the whole grid, zeroed before the launch and read
// back after it. Any thread that meets a non-finite value sets it with atomicOr: a healthy step
// has none, so the usual cost is one read and one write per element; an integer OR gives the
// same flag whatever the order of the threads.
__global__ void unscale_and_check_kernel(float* g, int64_t n, float inv_scale, int* found_inf) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        const float v = g[i];
        if (!isfinite(v)) atomicOr(found_inf, 1);
        g[i] = v * inv_scale;
    }
}

// One launch per tensor, all on one flag: zeroed once, read back once.
bool unscale_and_check(float* const* grads, const int64_t* sizes, int64_t count, float inv_scale) {
    detail::Workspace flag(sizeof(int));
    KILN_CUDA_CHECK(cudaMemset(flag.as<int>(), 0, sizeof(int)));
    for (int64_t t = 0; t < count; t++) {
        if (sizes[t] == 0) continue;
        const dim3 grid(detail::blocks_for(sizes[t])), block(detail::kBlock);
        KILN_LAUNCH(unscale_and_check_kernel, grid, block, 0)(grads[t], sizes[t], inv_scale, flag.as<int>());
        KILN_CHECK_LAUNCH(unscale_and_check_kernel, grid, block);
    }
    int found_inf = 0;
    KILN_CUDA_CHECK(cudaMemcpy(&found_inf, flag.as<int>(), sizeof(int), cudaMemcpyDeviceToHost));
    return found_inf != 0;
}

}  // namespace kiln::cuda
