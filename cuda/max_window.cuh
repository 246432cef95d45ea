// max_window.cuh — which value wins a max-pooling window on the device, for max pooling
// (pool.cu) and for max pooling fused in front of batch norm (norm.cu): one rule, so the two pick
// the same place, as the CPU's (ops/cpu/max2x2.h) does.
#pragma once
#include <cmath>
#include <cstdint>

#include "common.cuh"

namespace kiln::cuda {

// v takes the running maximum m's place: it is larger, or a NaN where m is none (v > NaN is
// false, so a NaN stays). Ties keep m: the first in row-major order wins, as in PyTorch.
__device__ inline bool takes_max(float v, float m) { return v > m || (isnan(v) && !isnan(m)); }

// The 2×2 window whose top-left value is at x (a plane of width W): its maximum, and in k the
// winner's place 2·dh + dw (0 to 3).
template <typename T> __device__ float max2x2(const T* x, int64_t W, int& k) {
    const float v[4] = {float(x[0]), float(x[1]), float(x[W]), float(x[W + 1])};
    float m = v[0];
    k = 0;
    KILN_UNROLL
    for (int j = 1; j < 4; j++)
        if (takes_max(v[j], m)) m = v[j], k = j;
    return m;
}

}  // namespace kiln::cuda
