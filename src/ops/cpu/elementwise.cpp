// elementwise.cpp — CPU kernels that touch each element once: fill, add, mul, axpy, scale, ReLU
// (and ReLU6: the same kernels with an upper bound), GELU, dropout and the dtype conversions
// (their contracts: ops/elementwise.h and core/convert.h). Each is one parallel loop
// (core/parallel.h) that g++ vectorizes; memory bandwidth is the limit.
// The kernels for tensors are templates on the element type T (float, f16, bf16): read as
// float, compute, round once. (The optimizers' fused updates are in optim.cpp.)
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/convert.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "ops/cpu/convert_simd.h"
#include "ops/cpu/f32_blocks.h"
#include "ops/cpu/gelu.h"
#include "ops/elementwise.h"

namespace kiln::cpu {

// Below this many elements a parallel region costs more than it saves.
static constexpr int64_t kParallelMin = 1 << 15;

template <typename T> void fill(T* x, int64_t n, float value) {
    const T v = T(value);
    parallel_for(n, kParallelMin, [&](int64_t i0, int64_t i1) {
#pragma omp simd
        for (int64_t i = i0; i < i1; i++) x[i] = v;
    });
}

// The arithmetic kernels run their f32 loop over blocks (f32_blocks.h): for f16 and bf16 the
// inputs are widened and the output narrowed a block at a time by the vector conversion kernels.
template <typename T> void add(const T* a, const T* b, T* y, int64_t n) {
    parallel_f32_blocks(n, a, b, y, [](const float* a, const float* b, float* y, int64_t m, int64_t) {
#pragma omp simd
        for (int64_t i = 0; i < m; i++) y[i] = a[i] + b[i];
    });
}

template <typename T> void mul(const T* a, const T* b, T* y, int64_t n) {
    parallel_f32_blocks(n, a, b, y, [](const float* a, const float* b, float* y, int64_t m, int64_t) {
#pragma omp simd
        for (int64_t i = 0; i < m; i++) y[i] = a[i] * b[i];
    });
}

template <typename T> void axpy(float alpha, const T* x, T* y, int64_t n) {
    parallel_f32_blocks(n, y, x, y, [alpha](const float* old, const float* x, float* y, int64_t m, int64_t) {
#pragma omp simd
        for (int64_t i = 0; i < m; i++) y[i] = old[i] + alpha * x[i];
    });
}

template <typename T> void scale(T* x, int64_t n, float s) {
    parallel_f32_blocks(n, x, x, [s](const float* old, float* x, int64_t m, int64_t) {
#pragma omp simd
        for (int64_t i = 0; i < m; i++) x[i] = old[i] * s;
    });
}

// y = min(max(x, 0), cap): ReLU with cap = +∞ (the min then changes nothing), ReLU6 with cap = 6.
// Written as two selects, in std::max's and std::min's order (a NaN stays NaN), with cap captured
// by value: std::min and std::max return references, and with them (and cap read through a
// reference y might alias) g++ leaves this loop scalar, with branches.
template <typename T> void relu_forward(const T* x, T* y, int64_t n, float cap) {
    parallel_f32_blocks(n, x, y, [cap](const float* x, float* y, int64_t m, int64_t) {
#pragma omp simd
        for (int64_t i = 0; i < m; i++) {
            const float v = x[i], positive = v < 0.0f ? 0.0f : v;
            y[i] = cap < positive ? cap : positive;
        }
    });
}

// pick(c, a, b) = c ? a : b, with a and b loaded before the choice. Written `c ? dy[i] : zero`,
// the load is conditional: g++ made it a gather for floats (2× slower), and for f16 and bf16 a
// choice between two structs, a copy through memory that it left scalar. pick chooses between
// the 16 bits, which g++ vectorizes.
inline float pick(bool c, float a, float b) { return c ? a : b; }
template <typename T> T pick(bool c, T a, T b) {
    a.bits = c ? a.bits : b.bits;
    return a;
}

// The gradient flows where the output is strictly inside (0, cap): dx = dy · [0 < y < cap].
// Without a cap (ReLU) only y > 0 is asked, so y = +∞ lets dy through. Only y is widened (for
// the comparisons, f32_blocks.h): dy's elements are copied as they are, so a NaN in dy keeps its
// bits (through f32 an f16 NaN would come back as the one quiet NaN).
template <typename T> void relu_backward(const T* y, const T* dy, T* dx, int64_t n, float cap) {
    const T zero = T(0.0f);
    const bool capped = std::isfinite(cap);
    parallel_blocks(n, [=](int64_t i0, int64_t m) {  // by value, as relu_forward
        const F32In<T> yb(y + i0, m);
        const float* v = yb.data();
#pragma omp simd
        for (int64_t i = 0; i < m; i++) {
            // & and |, not && and ||: no branch in the loop, so g++ vectorizes it
            const bool inside = (v[i] > 0.0f) & (!capped | (v[i] < cap));
            dx[i0 + i] = pick(inside, dy[i0 + i], zero);
        }
    });
}

// f16/bf16 <-> f32 go through convert_simd.h's kernel for the CPU's level (F16C, AVX2 shifts:
// the same bits as cast<To>), in blocks of kParallelMin elements over the threads; the other
// pairs (and integers) one cast<To> at a time.
template <typename From, typename To> void convert(const From* x, To* y, int64_t n) {
    if constexpr (has_convert_kernel<From, To>) {
        const auto kernel = convert_kernel<From, To>(cpu_level()).run;
        const int64_t blocks = (n + kParallelMin - 1) / kParallelMin;
        parallel_chunks(blocks, [&](int64_t b) {
            kernel(x + b * kParallelMin, y + b * kParallelMin, std::min(kParallelMin, n - b * kParallelMin));
        });
    } else {
        parallel_for(n, kParallelMin, [&](int64_t i0, int64_t i1) {
            for (int64_t i = i0; i < i1; i++) y[i] = cast<To>(x[i]);
        });
    }
}

// ---- GELU --------------------------------------------------------------------------------------
// y = x·Φ(x) and dx = dy · (Φ(x) + x·φ(x)), the loops of ops/cpu/gelu.h over f32 blocks.
template <typename T>
void gelu_forward(const T* x, T* y, int64_t n) {
    parallel_f32_blocks(n, x, y, [](const float* x, float* y, int64_t m, int64_t) { gelu_block(x, y, m); });
}

template <typename T>
void gelu_backward(const T* x, const T* dy, T* dx, int64_t n) {
    parallel_f32_blocks(n, x, dy, dx, [](const float* x, const float* dy, float* dx, int64_t m, int64_t) {
        gelu_backward_block(x, dy, dx, m);
    });
}

// ---- dropout -------------------------------------------------------------------------------------
// keep_i = u_i ≥ drop_p with u_i = Rng::to_unit(Rng::at(first + i)): a pure function of i.
template <typename T>
void dropout_forward(const T* x, T* y, uint8_t* mask, int64_t n, float drop_p, uint64_t seed_hash,
                     uint64_t first) {
    KILN_CHECK(drop_p >= 0.0f && drop_p <= 1.0f, "dropout_forward: drop probability ", drop_p,
               " is outside [0, 1]");
    const float scale = drop_p < 1.0f ? 1.0f / (1.0f - drop_p) : 0.0f;
    parallel_f32_blocks(n, x, y, [&](const float* x, float* y, int64_t m, int64_t i0) {
        for (int64_t i = 0; i < m; i++) {
            const float u = Rng::to_unit(splitmix64(seed_hash ^ splitmix64(first + uint64_t(i0 + i))));
            const uint8_t keep = u >= drop_p ? 1 : 0;
            mask[i0 + i] = keep;
            y[i] = keep ? x[i] * scale : 0.0f;
        }
    });
}

template <typename T>
void dropout_backward(const T* dy, const uint8_t* mask, T* dx, int64_t n, float drop_p) {
    const float scale = drop_p < 1.0f ? 1.0f / (1.0f - drop_p) : 0.0f;
    parallel_f32_blocks(n, dy, dx, [=](const float* dy, float* dx, int64_t m, int64_t i0) {
#pragma omp simd
        for (int64_t i = 0; i < m; i++) {
            const float kept = dy[i] * scale;  // read whatever the mask says: no masked load, so g++ vectorizes
            dx[i] = mask[i0 + i] ? kept : 0.0f;
        }
    });
}

KILN_ELEMENTWISE_KERNELS(KILN_INSTANTIATE_FLOAT);
KILN_FOR_EACH_TYPE_PAIR(KILN_CONVERT)

}  // namespace kiln::cpu
