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
// The segments' table — the starts and each array's pointers — travels as a kernel argument
// (SegmentTable, at most 1.6 KB of the 4 KB a launch may carry; the GPU keeps it in its constant
// bank): no copy to device memory, so no cudaMemcpy that would make the host wait for the step's
// kernels before it can queue the update. A table holds kMaxSegments parameters; a larger group
// takes one launch per kMaxSegments of them.
//
// Launch shape: block = 256 threads, grid = min(ceil(n / 256), 1024); n == 0 launches nothing.
//
//   make test T='[cuda][optim]'
#include <algorithm>
#include <array>
#include <cstdint>

#include "common.cuh"
#include "core/cuda_memory.h"  // copy_to_host
#include "ops/optim.h"

namespace kiln::cuda {

namespace {

// The most segments one launch's table holds.
constexpr int kMaxSegments = 32;

// Up to kMaxSegments segments of a group, passed by value to the kernel: start[t] = sizes[0] +
// ... + sizes[t−1] (start[count] = n, the elements of the launch) and, per array, each segment's
// pointer (null where the array is not given: no momentum buffer, no AMSGrad maximum).
template <int Arrays>
struct SegmentTable {
    int64_t start[kMaxSegments + 1];
    void* ptr[Arrays][kMaxSegments];
    int count;
};

// Calls launch(table) for each run of up to kMaxSegments segments of the group (sizes[count],
// arrays[a][count]) that holds at least one element.
template <int Arrays, typename Launch>
void for_each_table(const int64_t* sizes, int64_t count, const std::array<const void* const*, Arrays>& arrays,
                    Launch launch) {
    for (int64_t first = 0; first < count; first += kMaxSegments) {
        SegmentTable<Arrays> table{};
        table.count = int(std::min<int64_t>(kMaxSegments, count - first));
        for (int t = 0; t < table.count; t++) {
            table.start[t + 1] = table.start[t] + sizes[first + t];
            for (int a = 0; a < Arrays; a++)
                table.ptr[a][t] = arrays[size_t(a)] ? const_cast<void*>(arrays[size_t(a)][first + t]) : nullptr;
        }
        if (table.start[table.count] > 0) launch(table);
    }
}

// Element e's segment: the last t with start[t] ≤ e (an empty segment starts where the next one
// does, so it is passed over).
template <int Arrays>
__device__ __forceinline__ int segment_of(const SegmentTable<Arrays>& table, int64_t e) {
    int lo = 0, hi = table.count - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (table.start[mid] <= e) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

// Array a's pointer for segment t, as T*.
template <typename T, int Arrays>
__device__ __forceinline__ T* array_at(const SegmentTable<Arrays>& table, int a, int t) {
    return static_cast<T*>(table.ptr[a][t]);
}

}  // namespace

// PyTorch's SGD, per parameter i (element i of segment t):
//   g = grad + wd·p
//   if momentum ≠ 0:  buf = first ? g : momentum·buf + (1 − dampening)·g
//                     g   = nesterov ? g + momentum·buf : buf
//   p −= lr·g
// lr_at: a capturable optimizer's lr in device memory (read when the kernel runs), or null.
__global__ void sgd_update_kernel(SegmentTable<3> table, float lr, const float* lr_at, float momentum,
                                  float dampening, float weight_decay, bool nesterov, bool first_step) {
    if (lr_at) lr = *lr_at;
    const int64_t n = table.start[table.count];
    for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
        const int t = segment_of(table, e);
        const int64_t i = e - table.start[t];
        float* p = array_at<float>(table, 0, t);
        float g = array_at<const float>(table, 1, t)[i] + weight_decay * p[i];
        if (momentum != 0.0f) {
            float* buf = array_at<float>(table, 2, t);
            buf[i] = first_step ? g : momentum * buf[i] + (1.0f - dampening) * g;
            g = nesterov ? g + momentum * buf[i] : buf[i];
        }
        p[i] -= lr * g;
    }
}

void sgd_update(float* const* p, const float* const* grad, float* const* buf, const int64_t* sizes, int64_t count,
                const SgdParams& s) {
    const std::array<const void* const*, 3> arrays = {reinterpret_cast<const void* const*>(p),
                                                      reinterpret_cast<const void* const*>(grad),
                                                      reinterpret_cast<const void* const*>(buf)};
    for_each_table<3>(sizes, count, arrays, [&](const SegmentTable<3>& table) {
        const dim3 grid(detail::blocks_for(table.start[table.count])), block(detail::kBlock);
        KILN_LAUNCH(sgd_update_kernel, grid, block, 0)(table, s.lr, s.scalars, s.momentum, s.dampening,
                                                       s.weight_decay, s.nesterov, s.first_step);
        KILN_CHECK_LAUNCH(sgd_update_kernel, grid, block);
    });
}

// PyTorch's Adam / AdamW, per parameter i (step_size = lr / (1 − β1^t), bc2_sqrt = sqrt(1 − β2^t),
// decay = 1 − lr·wd, computed once on the host, or read from a.scalars when the kernel runs):
//   AdamW: p = decay·p     Adam: g = grad + wd·p
//   m = β1·m + (1 − β1)·g;   v = β2·v + (1 − β2)·g²;   v_max = max(v_max, v)   (AMSGrad: v_max ≠ null)
//   p −= step_size · m / (sqrt(v or v_max) / bc2_sqrt + eps)
__global__ void adam_update_kernel(SegmentTable<5> table, AdamParams a, float step_size, float bc2_sqrt,
                                   float decay) {
    if (a.scalars) step_size = a.scalars[0], bc2_sqrt = a.scalars[1], decay = a.scalars[2];
    const int64_t n = table.start[table.count];
    for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
        const int t = segment_of(table, e);
        const int64_t i = e - table.start[t];
        float *p = array_at<float>(table, 0, t), *m = array_at<float>(table, 2, t), *v = array_at<float>(table, 3, t);
        float* v_max = array_at<float>(table, 4, t);
        float g = array_at<const float>(table, 1, t)[i];
        if (a.decoupled) p[i] *= decay;
        else g += a.weight_decay * p[i];
        m[i] = a.beta1 * m[i] + (1.0f - a.beta1) * g;
        v[i] = a.beta2 * v[i] + (1.0f - a.beta2) * g * g;
        const float v_used = v_max ? (v_max[i] = fmaxf(v_max[i], v[i])) : v[i];
        p[i] -= step_size * m[i] / (sqrtf(v_used) / bc2_sqrt + a.eps);
    }
}

void adam_update(float* const* p, const float* const* grad, float* const* m, float* const* v, float* const* v_max,
                 const int64_t* sizes, int64_t count, const AdamParams& a) {
    const std::array<const void* const*, 5> arrays = {
        reinterpret_cast<const void* const*>(p), reinterpret_cast<const void* const*>(grad),
        reinterpret_cast<const void* const*>(m), reinterpret_cast<const void* const*>(v),
        reinterpret_cast<const void* const*>(v_max)};
    for_each_table<5>(sizes, count, arrays, [&](const SegmentTable<5>& table) {
        const dim3 grid(detail::blocks_for(table.start[table.count])), block(detail::kBlock);
        KILN_LAUNCH(adam_update_kernel, grid, block, 0)(table, a, float(a.step_size()),
                                                        float(a.bias_correction2_sqrt()), float(a.decay()));
        KILN_CHECK_LAUNCH(adam_update_kernel, grid, block);
    });
}

// GradScaler's unscale_ (cpu::unscale_and_check is the twin), per element i:
//   if g[i] is inf or NaN:  found_inf = 1        (tested before the multiply)
//   g[i] *= inv_scale
// found_inf is one int in device memory for the whole grid, zeroed before the launch and read
// back after it. Any thread that meets a non-finite value sets it with atomicOr: a healthy step
// has none, so the usual cost is one read and one write per element; an integer OR gives the
// same flag whatever the order of the threads.
__global__ void unscale_and_check_kernel(SegmentTable<1> table, float inv_scale, int* found_inf) {
    const int64_t n = table.start[table.count];
    for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
        const int t = segment_of(table, e);
        float* g = array_at<float>(table, 0, t) + (e - table.start[t]);
        const float v = *g;
        if (!isfinite(v)) atomicOr(found_inf, 1);
        *g = v * inv_scale;
    }
}

// One flag for all the tensors: zeroed once, read back once (one launch per kMaxSegments of them).
bool unscale_and_check(float* const* grads, const int64_t* sizes, int64_t count, float inv_scale) {
    detail::Workspace flag(sizeof(int));
    KILN_CUDA_CHECK(cudaMemsetAsync(flag.as<int>(), 0, sizeof(int), cuda_detail::launch_stream()));
    bool any = false;
    for_each_table<1>(sizes, count, {reinterpret_cast<const void* const*>(grads)}, [&](const SegmentTable<1>& table) {
        const dim3 grid(detail::blocks_for(table.start[table.count])), block(detail::kBlock);
        KILN_LAUNCH(unscale_and_check_kernel, grid, block, 0)(table, inv_scale, flag.as<int>());
        KILN_CHECK_LAUNCH(unscale_and_check_kernel, grid, block);
        any = true;
    });
    if (!any) return false;
    int found_inf = 0;
    copy_to_host(&found_inf, flag.as<int>(), sizeof(int));
    return found_inf != 0;
}

}  // namespace kiln::cuda
