// gemm_launch.cuh — what the GEMM versions share: the engine's (cuda/gemm.cu), the teaching ones
// (cuda/lab/versions/gemm_versions.cu) and the kernel lab's own (cuda/lab/gemm.cu). On the host,
// the launchers' choice of a kernel for the transposes and the grid's height; on the device, the
// register tile's multiply-add of versions 3 and 4.
#pragma once
#include <algorithm>
#include <cstdint>

#include "common.cuh"

namespace kiln::cuda {

// A launcher of one (trans_a, trans_b) instantiation: cuda::gemm's arguments after the two flags.
template <typename T>
using GemmFn = void (*)(int64_t, int64_t, int64_t, float, const T*, int64_t, const T*, int64_t, float, T*, int64_t);

// One instantiation per (trans_a, trans_b), picked at run time.
template <typename T>
inline GemmFn<T> pick(GemmFn<T> nn, GemmFn<T> nt, GemmFn<T> tn, GemmFn<T> tt, bool trans_a, bool trans_b) {
    return trans_a ? (trans_b ? tt : tn) : (trans_b ? nt : nn);
}

// gridDim.y for `tiles` row tiles of C: at most 65535, CUDA's limit; the kernels' blocks loop over
// the row tiles beyond it.
inline unsigned grid_rows(int64_t tiles) { return unsigned(std::min<int64_t>(tiles, 65535)); }

namespace detail {

// One k of a thread's TM×TN register tile: acc[i][j] += a[i] · b[j], TM·TN multiply-adds from
// TM + TN values in registers.
template <int TM, int TN>
__device__ __forceinline__ void outer_product_add(float (&acc)[TM][TN], const float (&a)[TM], const float (&b)[TN]) {
    KILN_UNROLL
    for (int i = 0; i < TM; i++) {
        KILN_UNROLL
        for (int j = 0; j < TN; j++) acc[i][j] += a[i] * b[j];
    }
}

}  // namespace detail
}  // namespace kiln::cuda
