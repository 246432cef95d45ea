// max2x2.h — the 2×2, stride-2 max-pool of one plane on the CPU, for max pooling (pool.cpp) and
// for max pooling fused in front of batch norm (norm.cpp): one definition of the window's order
// and of which value wins, so the two give the same values and pick the same place.
//
// Why a special case of max pooling: the general loop (pool.cpp) clips every window and tests
// for "no value yet" per element, which made pooling a fifth of LeNet's training step; here every
// window is four loads at known offsets and three branch-free steps of take_max, 16 windows per
// instruction. (Odd H or W: the last row or column is in no window, as in PyTorch.)
#pragma once
#include <cstdint>
#include <type_traits>
#include <vector>

#include "ops/cpu/convert_simd.h"
#include "ops/cpu/short_rows.h"

namespace kiln::cpu {

// One step of the running maximum: take v if it is larger, or a NaN (which then stays, since
// v > NaN is false). Ties keep the earlier value: the first in row-major order wins, as in
// PyTorch's max_pool2d (2.x, CPU and CUDA: `val > maxval || isnan(val)`; PyTorch takes the last
// of several NaNs, kiln the first — only which place gets the gradient differs).
inline void take_max(float v, int32_t k_v, float& m, int32_t& k) {
    const bool take = v > m || (v != v && m == m);
    m = take ? v : m;
    k = take ? k_v : k;
}

// y[p][q] = max(x[2p][2q], x[2p][2q+1], x[2p+1][2q], x[2p+1][2q+1])   first one on ties, a NaN wins
// and where[p][q] = place(2p·W + 2q, k), k = 2·dh + dw the winner's place in its window (0 to 3):
// max pooling stores the index in the plane, the fused batch norm k itself.
template <typename T, typename I, typename Place>
void maxpool2x2_rows(const T* xp, T* yp, I* where, int64_t W, int64_t P, int64_t Q, Place place) {
    for (int64_t op = 0; op < P; op++) {
        const T* r0 = xp + 2 * op * W;
        const T* r1 = r0 + W;
        const int32_t base = int32_t(2 * op * W);
        for_blocks(0, Q, [&](int64_t q0, int64_t n) {
#pragma omp simd  // branch-free: the compiler turns take_max into vector compares and blends
            for (int64_t oq = q0; oq < q0 + n; oq++) {
                float m = float(r0[2 * oq]);
                int32_t k = 0;
                take_max(float(r0[2 * oq + 1]), 1, m, k);
                take_max(float(r1[2 * oq]), 2, m, k);
                take_max(float(r1[2 * oq + 1]), 3, m, k);
                yp[op * Q + oq] = T(m);
                where[op * Q + oq] = place(base + int32_t(2 * oq), k);
            }
        });
    }
}

// One plane [H, W] → [H/2, W/2] of any float type: f16/bf16 planes are pooled in f32
// (convert_simd.h; 3 times faster in bf16 on a Zen 3), exact both ways: each max is one of the
// inputs. xf, yf: the caller's (per thread) buffers for the widened planes.
template <typename T, typename I, typename Place>
void maxpool2x2_plane(const T* xp, T* yp, I* where, int64_t H, int64_t W, Place place, std::vector<float>& xf,
                      std::vector<float>& yf) {
    const int64_t P = H / 2, Q = W / 2;
    if constexpr (std::is_same_v<T, float>) {
        maxpool2x2_rows(xp, yp, where, W, P, Q, place);
    } else {
        xf.resize(size_t(H * W)), yf.resize(size_t(P * Q));
        maxpool2x2_rows(widened(xp, H * W, xf.data()), yf.data(), where, W, P, Q, place);
        narrow_into(yf.data(), P * Q, yp);
    }
}

}  // namespace kiln::cpu
