// loss.cu — the CUDA twin of cpu::softmax_cross_entropy (src/ops/cpu/loss.cpp): the mean
// softmax cross-entropy of N rows of C logits, and its gradient. The logits are T (float, f16
// or bf16); everything below is computed in float, and dz is rounded once to T.
//
// Letters: N = rows (batch), C = classes, B = 128 threads per block, T = the logits' type.
//
// How it works: one block per row (grid-stride over rows when N > 65535 blocks). The row's
// C logits are shared by B threads (thread t takes c = t, t + B, ...), and every quantity
// the formula needs from the whole row comes from a block reduction (common.cuh: a tree in
// shared memory, then warp shuffles):
//   1. m   = max_c z[n,c]                  block_reduce with max
//   2. s   = Σ_c exp(z[n,c] − m)           block_reduce with +   (every exp ≤ 1: no overflow)
//   3. loss_n  = (m − z[n, y_n]) + log s             thread 0 writes it to row_loss[n]
//   4. dz[n,c] = exp(z[n,c] − m) / s / N − [c = y_n] / N         (if dz is wanted)
//   5. first   = min { c : z[n,c] = m }       block_reduce with min: argmax_rows's answer;
//                correct += [first = y_n]     (an integer atomic: the same count in any order)
// Steps 3 and 4 never form lse = m + log s: in float, at |m| = 1e4, adding log s ≈ 1e-5 to m
// would round it away (floats there are 0.001 apart). The CPU works in double and may form it.
// With label smoothing ε (target q_c = (1 − ε)·[c = y] + ε/C), a sixth reduction sums
// d = Σ_c (m − z_c), and, as (1 − ε) + ε = 1,
//   3'. loss_n = (1 − ε)·(m − z_y) + (ε/C)·d + log s          (every term ≥ 0)
//   4'. dz_c   = exp(z_c − m) / s / N − ε/(C·N) − [c = y]·(1 − ε)/N
// Then cuda::sum_on_device (reduce.cu: two passes, no atomics) adds the N row losses in a
// fixed order, so the loss is the same on every run; the launcher divides by N.
//
// No wait: the labels are checked by the kernel (a row whose label is outside [0, C) is skipped
// and recorded: bad = max over such rows of N − n, so N − bad is the first), and the sum, the
// correct count and bad stay in the caller's LossTotals on the device until the host reads them —
// the op at once (ops/loss.h: one 32-byte copy), a training loop after many steps (train/loss_log.h).
// The host never copies the labels to check them, and count_correct's argmax needs no copy of its
// own. (A NaN logit makes the loss NaN, which stops training; the count then may differ from
// argmax_rows', whose loop never lets a NaN win after column 0.)
//
// Launch shape: a 32-byte memset, softmax_cross_entropy_kernel<<<min(N, 65535), 128>>>, then
// sum's two launches.
//
//   make test T='[cuda][loss]'
#include <cmath>

#include "common.cuh"
#include "ops/loss.h"
#include "ops/reduce.h"  // sum_on_device

namespace kiln::cuda {

constexpr int kLossBlock = 128;  // a power of two ≥ 64, as block_reduce needs

// loss_n = log Σ_c exp(z_c) − z_y = (m + log Σ_c exp(z_c − m)) − z_y,   m = max_c z_c
// dz_c   = (exp(z_c − m) / Σ exp(z − m) − [c = y]) / N
template <typename T>
__global__ void softmax_cross_entropy_kernel(const T* z, const int32_t* y, T* dz, float* row_loss,
                                             LossTotals* out, int64_t N, int64_t C, float smoothing) {
    __shared__ float sh[kLossBlock];
    __shared__ long long shi[kLossBlock];
    const int64_t t = threadIdx.x, B = blockDim.x;
    if (blockIdx.x == 0 && t == 0) out->classes = static_cast<unsigned long long>(C);
    for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
        const int32_t label = y[n];
        if (label < 0 || label >= C) {  // the same for the whole block: no thread reaches a barrier alone
            if (t == 0) {
                row_loss[n] = NAN;
                atomicMax(&out->bad, (unsigned long long)(N - n));
            }
            continue;
        }
        const T* zn = z + n * C;
        float m = -INFINITY;
        for (int64_t c = t; c < C; c += B) m = fmaxf(m, float(zn[c]));
        m = detail::block_reduce(m, sh, detail::MaxOp{});
        long long first = C;  // each thread's first c with z_c = m, then the block's
        for (int64_t c = t; c < C && first == C; c += B)
            if (float(zn[c]) == m) first = c;
        first = detail::block_reduce(first, shi, detail::MinOp{});
        float s = 0.0f;
        for (int64_t c = t; c < C; c += B) s += expf(float(zn[c]) - m);
        s = detail::block_reduce(s, sh, detail::SumOp{});
        float d = 0.0f;  // Σ_c (m − z_c), for label smoothing only
        if (smoothing != 0.0f) {
            for (int64_t c = t; c < C; c += B) d += m - float(zn[c]);
            d = detail::block_reduce(d, sh, detail::SumOp{});
        }
        if (t == 0) {
            if (smoothing != 0.0f)
                row_loss[n] = (1.0f - smoothing) * (m - float(zn[label])) + smoothing / float(C) * d + logf(s);
            else
                row_loss[n] = (m - float(zn[label])) + logf(s);
            if (first == label) atomicAdd(&out->correct, 1ull);
        }
        if (dz) {
            const float inv_n = 1.0f / float(N), inv_sn = 1.0f / (s * float(N));
            const float spread = smoothing / float(C) / float(N), hit = (1.0f - smoothing) / float(N);
            for (int64_t c = t; c < C; c += B) {
                float g = expf(float(zn[c]) - m) * inv_sn;
                if (smoothing != 0.0f) g -= spread;
                if (c == label) g -= smoothing != 0.0f ? hit : inv_n;
                dz[n * C + c] = T(g);
            }
        }
    }
}

template <typename T>
void softmax_cross_entropy(const T* z, const int32_t* y, T* dz, int64_t N, int64_t C, float smoothing,
                           LossTotals* out) {
    KILN_CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof *out, cuda_detail::launch_stream()));
    if (N == 0) return;
    detail::Workspace ws(size_t(N) * sizeof(float));
    float* row_loss = ws.as<float>();
    constexpr auto softmax_cross_entropy_kernel_t = softmax_cross_entropy_kernel<T>;
    const dim3 grid(unsigned(std::min<int64_t>(N, 65535))), block(kLossBlock);
    KILN_LAUNCH(softmax_cross_entropy_kernel_t, grid, block, 0)(z, y, dz, row_loss, out, N, C, smoothing);
    KILN_CHECK_LAUNCH(softmax_cross_entropy_kernel_t, grid, block);
    sum_on_device(row_loss, N, &out->total);
}

KILN_INSTANTIATE_FLOAT(softmax_cross_entropy);

}  // namespace kiln::cuda
