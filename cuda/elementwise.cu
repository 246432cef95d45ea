// elementwise.cu — the CUDA twins of src/ops/cpu/elementwise.cpp: fill, add, mul, axpy, scale, ReLU
// forward and backward (with ReLU6's upper bound), GELU, dropout and the dtype conversions
// (declared once for both in ops/elementwise.h and core/convert.h). Each is the CPU
// loop body run by one thread per element, a template on the element type T (float, f16, bf16):
// read as float, compute in float, round once on the store.
//
// How they work: thread t of block b handles element i = b·T + t, then i + gridDim.x·T, ...
// (a grid-stride loop), so one launch shape serves any n. Consecutive threads of a warp touch
// consecutive elements: each warp reads and writes 32 contiguous elements at a time — coalesced,
// the only thing that matters for a kernel that does one multiply per element it moves.
//
// Launch shape (every kernel here): block = 256 threads, grid = min(ceil(n / 256), 1024)
// blocks (detail::blocks_for); n == 0 launches nothing.
//
// GELU uses the device's erff and expf (accurate to ~1 ulp) where the CPU uses inlined
// approximations accurate to 1e-6 absolute; the tests compare within 2e-6.
// Dropout draws u_i = Rng::to_unit(splitmix64(seed_hash ^ splitmix64(first + i))) with the
// CPU's own functions (core/rng.h, compiled for the device too): the mask is the CPU's, bit for
// bit, and so are y and dx.
//
// Build and run: part of the engine (make, or make CUDA=1); tested against the CPU versions by
//   make test T='[cuda][elementwise]'    make test T='[gelu][cuda]'    make test T='[dropout][cuda]'
#include "common.cuh"
#include "core/convert.h"
#include "core/rng.h"
#include "gelu.cuh"
#include "ops/elementwise.h"

namespace kiln::cuda {

using detail::blocks_for;
using detail::kBlock;

// x[i] = value
template <typename T>
__global__ void fill_kernel(T* x, int64_t n, float value) {
    const T v = T(value);
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        x[i] = v;
}

// y[i] = a[i] + b[i]
template <typename T>
__global__ void add_kernel(const T* a, const T* b, T* y, int64_t n) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        y[i] = T(float(a[i]) + float(b[i]));
}

// y[i] = a[i] · b[i]  (y may be a)
template <typename T>
__global__ void mul_kernel(const T* a, const T* b, T* y, int64_t n) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        y[i] = T(float(a[i]) * float(b[i]));
}

// y[i] += alpha·x[i]
template <typename T>
__global__ void axpy_kernel(float alpha, const T* x, T* y, int64_t n) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        y[i] = T(float(y[i]) + alpha * float(x[i]));
}

// x[i] *= s
template <typename T>
__global__ void scale_kernel(T* x, int64_t n, float s) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        x[i] = T(float(x[i]) * s);
}

// y[i] = min(max(x[i], 0), cap)    (cap = +∞: ReLU; 6: ReLU6)
template <typename T>
__global__ void relu_forward_kernel(const T* x, T* y, int64_t n, float cap) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        y[i] = T(fminf(fmaxf(float(x[i]), 0.0f), cap));
}

// dx[i] = dy[i]·[0 < y[i] < cap]    (y is the layer's output; without a cap only y > 0 is asked)
template <typename T>
__global__ void relu_backward_kernel(const T* y, const T* dy, T* dx, int64_t n, float cap) {
    const bool capped = isfinite(cap);
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        const float v = float(y[i]);
        const bool inside = (v > 0.0f) & (!capped | (v < cap));
        dx[i] = inside ? dy[i] : T(0.0f);
    }
}

// y[i] = cast<To>(x[i])   (core/dtype.h: the same rounding as the CPU's, bit for bit)
template <typename From, typename To>
__global__ void convert_kernel(const From* x, To* y, int64_t n) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        y[i] = cast<To>(x[i]);
}

// ---- launchers: the names and arguments of ops/elementwise.h ---------------------------------
// Launches kernel<<<blocks_for(n), 256>>>(args...); n == 0 launches nothing. The kernel is
// named by a constexpr variable (fill_kernel_t = fill_kernel<T>): the launch macros need a
// name without template brackets.
#define KILN_LAUNCH_1D(kernel, n, ...)                                   \
    do {                                                                 \
        if ((n) == 0) return;                                            \
        const dim3 grid(blocks_for(n)), block(kBlock);                   \
        KILN_LAUNCH(kernel, grid, block, 0)(__VA_ARGS__);                \
        KILN_CHECK_LAUNCH(kernel, grid, block);                          \
    } while (0)

template <typename T>
void fill(T* x, int64_t n, float value) {
    constexpr auto fill_kernel_t = fill_kernel<T>;
    KILN_LAUNCH_1D(fill_kernel_t, n, x, n, value);
}

template <typename T>
void add(const T* a, const T* b, T* y, int64_t n) {
    constexpr auto add_kernel_t = add_kernel<T>;
    KILN_LAUNCH_1D(add_kernel_t, n, a, b, y, n);
}

template <typename T>
void mul(const T* a, const T* b, T* y, int64_t n) {
    constexpr auto mul_kernel_t = mul_kernel<T>;
    KILN_LAUNCH_1D(mul_kernel_t, n, a, b, y, n);
}

template <typename T>
void axpy(float alpha, const T* x, T* y, int64_t n) {
    constexpr auto axpy_kernel_t = axpy_kernel<T>;
    KILN_LAUNCH_1D(axpy_kernel_t, n, alpha, x, y, n);
}

template <typename T>
void scale(T* x, int64_t n, float s) {
    constexpr auto scale_kernel_t = scale_kernel<T>;
    KILN_LAUNCH_1D(scale_kernel_t, n, x, n, s);
}

template <typename T>
void relu_forward(const T* x, T* y, int64_t n, float cap) {
    constexpr auto relu_forward_kernel_t = relu_forward_kernel<T>;
    KILN_LAUNCH_1D(relu_forward_kernel_t, n, x, y, n, cap);
}

template <typename T>
void relu_backward(const T* y, const T* dy, T* dx, int64_t n, float cap) {
    constexpr auto relu_backward_kernel_t = relu_backward_kernel<T>;
    KILN_LAUNCH_1D(relu_backward_kernel_t, n, y, dy, dx, n, cap);
}

template <typename From, typename To>
void convert(const From* x, To* y, int64_t n) {
    constexpr auto convert_kernel_t = convert_kernel<From, To>;
    KILN_LAUNCH_1D(convert_kernel_t, n, x, y, n);
}

// ---- GELU (gelu.cuh) ---------------------------------------------------------------------------
// y = GELU(x)
template <typename T>
__global__ void gelu_forward_kernel(const T* x, T* y, int64_t n) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        y[i] = T(gelu(float(x[i])));
}

// dx = dy · GELU'(x)
template <typename T>
__global__ void gelu_backward_kernel(const T* x, const T* dy, T* dx, int64_t n) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        dx[i] = T(__fmul_rn(float(dy[i]), gelu_grad(float(x[i]))));  // the rounding fused batch norm repeats
}

template <typename T>
void gelu_forward(const T* x, T* y, int64_t n) {
    if (n == 0) return;
    const dim3 grid(blocks_for(n)), block(kBlock);
    KILN_LAUNCH(gelu_forward_kernel<T>, grid, block, 0)(x, y, n);
    KILN_CHECK_LAUNCH(gelu_forward_kernel<T>, grid, block);
}

template <typename T>
void gelu_backward(const T* x, const T* dy, T* dx, int64_t n) {
    if (n == 0) return;
    const dim3 grid(blocks_for(n)), block(kBlock);
    KILN_LAUNCH(gelu_backward_kernel<T>, grid, block, 0)(x, dy, dx, n);
    KILN_CHECK_LAUNCH(gelu_backward_kernel<T>, grid, block);
}

// ---- dropout -------------------------------------------------------------------------------------
// keep_i = u_i ≥ drop_p,  u_i = Rng::to_unit(splitmix64(seed_hash ^ splitmix64(first + i)))
// mask[i] = keep_i;   y[i] = keep_i ? x[i] · scale : 0,   scale = 1 / (1 − drop_p)  (0 when drop_p = 1)
template <typename T>
__global__ void dropout_forward_kernel(const T* x, T* y, uint8_t* mask, int64_t n, float drop_p,
                                       float scale, uint64_t seed_hash, uint64_t first) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        const float u = Rng::to_unit(splitmix64(seed_hash ^ splitmix64(first + uint64_t(i))));
        const uint8_t keep = u >= drop_p ? 1 : 0;
        mask[i] = keep;
        y[i] = T(keep ? float(x[i]) * scale : 0.0f);
    }
}

// dx[i] = mask[i] ? dy[i] · scale : 0
template <typename T>
__global__ void dropout_backward_kernel(const T* dy, const uint8_t* mask, T* dx, int64_t n, float scale) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        dx[i] = T(mask[i] ? float(dy[i]) * scale : 0.0f);
}

namespace {
float dropout_scale(float drop_p) { return drop_p < 1.0f ? 1.0f / (1.0f - drop_p) : 0.0f; }
}  // namespace

template <typename T>
void dropout_forward(const T* x, T* y, uint8_t* mask, int64_t n, float drop_p, uint64_t seed_hash,
                     uint64_t first) {
    if (n == 0) return;
    const dim3 grid(blocks_for(n)), block(kBlock);
    KILN_LAUNCH(dropout_forward_kernel<T>, grid, block, 0)(x, y, mask, n, drop_p, dropout_scale(drop_p), seed_hash,
                                                        first);
    KILN_CHECK_LAUNCH(dropout_forward_kernel<T>, grid, block);
}

template <typename T>
void dropout_backward(const T* dy, const uint8_t* mask, T* dx, int64_t n, float drop_p) {
    if (n == 0) return;
    const dim3 grid(blocks_for(n)), block(kBlock);
    KILN_LAUNCH(dropout_backward_kernel<T>, grid, block, 0)(dy, mask, dx, n, dropout_scale(drop_p));
    KILN_CHECK_LAUNCH(dropout_backward_kernel<T>, grid, block);
}

KILN_ELEMENTWISE_KERNELS(KILN_INSTANTIATE_FLOAT);
KILN_FOR_EACH_TYPE_PAIR(KILN_CONVERT)

}  // namespace kiln::cuda
