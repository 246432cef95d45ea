// optim.cu — the CUDA twins of cpu::sgd_update and cpu::adam_update (src/ops/cpu/optim.cpp):
// one fused pass that reads each parameter, its gradient and its optimizer buffers once and
// writes the new values, so an optimizer step costs one trip through memory instead of one per
// line of the rule (four for SGD with momentum, about ten for Adam). And the twin of
// cpu::unscale_and_check, GradScaler's unscale with its grid-wide inf/NaN flag (chapter 09).
//
// How it works: a whole parameter group is one launch (PyTorch's foreach and fused optimizers,
// llm.c's one update kernel): its segments (one per parameter) are laid end to end as the
// elements e = 0 .. n−1 of the group, and one thread per element (grid-stride loop) finds its
// segment t by a binary search of the segments' starts and runs the CPU loop body unchanged on
// element e − start[t]: no reduction, no reordering. The only possible difference from the CPU is
// that a compiler may contract a·b + c into one fused multiply-add (rounded once instead of
// twice), so the tests compare with a tolerance of a few ulps. (sqrtf and / are correctly
// rounded on the GPU unless nvcc is given --use_fast_math, which kiln's Makefile does not.)
//
// The segments' table — the starts and each array's pointers — is copied to device memory once
// per call (one cudaMemcpy of 8·(count + 1) bytes plus 8 per pointer).
//
// Launch shape: block = 256 threads, grid = min(ceil(n / 256), 1024); n == 0 launches nothing.
//
//   make test T='[cuda][optim]'
#include <cstdint>
#include <memory>
#include <vector>

#include "common.cuh"
#include "ops/kernels/optim.h"

namespace kiln::cuda {

namespace {

// A group's segments in device memory: start[0..count] (start[t] = sizes[0] + ... + sizes[t−1])
// and, for each array given, its `count` pointers (a null array stays null). An empty group
// (total() == 0) allocates nothing.
class Segments {
public:
    template <typename... Arrays>
    Segments(const int64_t* sizes, int64_t count, Arrays... arrays) : table_(size_t(count) + 1, 0) {
        for (int64_t t = 0; t < count; t++) table_[t + 1] = table_[t] + sizes[t];
        total_ = table_[count];
        (add(arrays, count), ...);
        if (total_ == 0) return;
        ws_ = std::make_unique<detail::Workspace>(table_.size() * sizeof(int64_t));
        KILN_CUDA_CHECK(cudaMemcpy(ws_->as<int64_t>(), table_.data(), table_.size() * sizeof(int64_t),
                                   cudaMemcpyHostToDevice));
    }
    int64_t total() const { return total_; }
    const int64_t* start() const { return ws_->as<int64_t>(); }
    // The device copy of the a-th array's pointers, or null.
    template <typename T>
    T* const* array(size_t a) const {
        return offsets_[a] < 0 ? nullptr : reinterpret_cast<T* const*>(ws_->as<int64_t>() + offsets_[a]);
    }

private:
    template <typename T>
    void add(T* const* array, int64_t count) {
        offsets_.push_back(array ? int64_t(table_.size()) : -1);
        if (array)
            for (int64_t t = 0; t < count; t++) table_.push_back(int64_t(reinterpret_cast<uintptr_t>(array[t])));
    }

    std::vector<int64_t> table_;    // the starts, then each array's pointers
    std::vector<int64_t> offsets_;  // where each array's pointers begin in the table
    int64_t total_ = 0;
    std::unique_ptr<detail::Workspace> ws_;
};

// The segment that element e of the group falls in: the last t with start[t] ≤ e (an empty
// segment starts where the next one does, so it is passed over).
__device__ __forceinline__ int64_t segment_of(const int64_t* start, int64_t count, int64_t e) {
    int64_t lo = 0, hi = count - 1;
    while (lo < hi) {
        const int64_t mid = (lo + hi + 1) / 2;
        if (start[mid] <= e) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

}  // namespace

// PyTorch's SGD, per parameter i (element i of segment t):
//   g = grad + wd·p
//   if momentum ≠ 0:  buf = first ? g : momentum·buf + (1 − dampening)·g
//                     g   = nesterov ? g + momentum·buf : buf
//   p −= lr·g
__global__ void sgd_update_kernel(float* const* ps, const float* const* grads, float* const* bufs,
                                  const int64_t* start, int64_t count, float lr, float momentum, float dampening,
                                  float weight_decay, bool nesterov, bool first_step) {
    const int64_t n = start[count];
    for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
        const int64_t t = segment_of(start, count, e), i = e - start[t];
        float* p = ps[t];
        float g = grads[t][i] + weight_decay * p[i];
        if (momentum != 0.0f) {
            float* buf = bufs[t];
            buf[i] = first_step ? g : momentum * buf[i] + (1.0f - dampening) * g;
            g = nesterov ? g + momentum * buf[i] : buf[i];
        }
        p[i] -= lr * g;
    }
}

void sgd_update(float* const* p, const float* const* grad, float* const* buf, const int64_t* sizes, int64_t count,
                const SgdParams& s) {
    const Segments seg(sizes, count, p, grad, buf);
    if (seg.total() == 0) return;
    const dim3 grid(detail::blocks_for(seg.total())), block(detail::kBlock);
    KILN_LAUNCH(sgd_update_kernel, grid, block, 0)(seg.array<float>(0), seg.array<const float>(1),
                                                   seg.array<float>(2), seg.start(), count, s.lr, s.momentum,
                                                   s.dampening, s.weight_decay, s.nesterov, s.first_step);
    KILN_CHECK_LAUNCH(sgd_update_kernel, grid, block);
}

// PyTorch's Adam / AdamW, per parameter i (step_size = lr / (1 − β1^t), bc2_sqrt = sqrt(1 − β2^t),
// decay = 1 − lr·wd, computed once on the host):
//   AdamW: p = decay·p     Adam: g = grad + wd·p
//   m = β1·m + (1 − β1)·g;   v = β2·v + (1 − β2)·g²;   v_max = max(v_max, v)   (AMSGrad: v_max ≠ null)
//   p −= step_size · m / (sqrt(v or v_max) / bc2_sqrt + eps)
__global__ void adam_update_kernel(float* const* ps, const float* const* grads, float* const* ms, float* const* vs,
                                   float* const* v_maxs, const int64_t* start, int64_t count, AdamParams a,
                                   float step_size, float bc2_sqrt, float decay) {
    const int64_t n = start[count];
    for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
        const int64_t t = segment_of(start, count, e), i = e - start[t];
        float *p = ps[t], *m = ms[t], *v = vs[t];
        float g = grads[t][i];
        if (a.decoupled) p[i] *= decay;
        else g += a.weight_decay * p[i];
        m[i] = a.beta1 * m[i] + (1.0f - a.beta1) * g;
        v[i] = a.beta2 * v[i] + (1.0f - a.beta2) * g * g;
        const float v_used = v_maxs ? (v_maxs[t][i] = fmaxf(v_maxs[t][i], v[i])) : v[i];
        p[i] -= step_size * m[i] / (sqrtf(v_used) / bc2_sqrt + a.eps);
    }
}

void adam_update(float* const* p, const float* const* grad, float* const* m, float* const* v, float* const* v_max,
                 const int64_t* sizes, int64_t count, const AdamParams& a) {
    const Segments seg(sizes, count, p, grad, m, v, v_max);
    if (seg.total() == 0) return;
    const dim3 grid(detail::blocks_for(seg.total())), block(detail::kBlock);
    KILN_LAUNCH(adam_update_kernel, grid, block, 0)(seg.array<float>(0), seg.array<const float>(1),
                                                    seg.array<float>(2), seg.array<float>(3), seg.array<float>(4),
                                                    seg.start(), count, a, float(a.step_size()),
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
__global__ void unscale_and_check_kernel(float* const* gs, const int64_t* start, int64_t count, float inv_scale,
                                         int* found_inf) {
    const int64_t n = start[count];
    for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
        const int64_t t = segment_of(start, count, e);
        float* g = gs[t] + (e - start[t]);
        const float v = *g;
        if (!isfinite(v)) atomicOr(found_inf, 1);
        *g = v * inv_scale;
    }
}

// One launch for all the tensors, on one flag: zeroed once, read back once.
bool unscale_and_check(float* const* grads, const int64_t* sizes, int64_t count, float inv_scale) {
    const Segments seg(sizes, count, grads);
    if (seg.total() == 0) return false;
    detail::Workspace flag(sizeof(int));
    KILN_CUDA_CHECK(cudaMemset(flag.as<int>(), 0, sizeof(int)));
    const dim3 grid(detail::blocks_for(seg.total())), block(detail::kBlock);
    KILN_LAUNCH(unscale_and_check_kernel, grid, block, 0)(seg.array<float>(0), seg.start(), count, inv_scale,
                                                          flag.as<int>());
    KILN_CHECK_LAUNCH(unscale_and_check_kernel, grid, block);
    int found_inf = 0;
    KILN_CUDA_CHECK(cudaMemcpy(&found_inf, flag.as<int>(), sizeof(int), cudaMemcpyDeviceToHost));
    return found_inf != 0;
}

}  // namespace kiln::cuda
