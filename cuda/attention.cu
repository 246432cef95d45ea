// attention.cu — the CUDA twins of src/ops/cpu/attention.cpp: the embedding lookup and its
// scatter-add, the softmax of rows, and causal self-attention, textbook and FlashAttention-2,
// declared once for both in ops/attention.h (the formulas are there); pointers are device
// memory. Templates on the element type T (float, f16, bf16); everything is computed in float.
//
// Letters as in the header: B sequences, H heads, D head size, Tq query and Tk key positions,
// bh = b·H + h one (sequence, head) pair; t = threadIdx.x. Head h of row (b, t) of q is the D
// values at q + b·q_batch + t·ldq + h·D (AttentionParams), so the packed qkv is read in place.
//
// Thread/block mapping:
//   embedding_forward    one thread per element of y (1-D grid-stride): y[n, c] = W[ids[n], c]
//   embedding_backward   one thread per column c, adding the N rows of dy into dW[ids[n], c] in
//                        order: a token that repeats adds into the same row, but each column
//                        belongs to one thread — no race, no atomic, the same bits every run
//   softmax_*            one block of 128 per row (detail::block_reduce for the max, the sum and
//                        backward's Σ dy·y), as the loss (loss.cu)
//   attention (textbook), the naive way — each output from a dot product, everything in global
//   memory (llm.c's attention kernel 1):
//     forward   attention_scores_kernel   one block of 128 per query row (bh, i): the row's Tk
//                                          scores in shared memory (dynamic, Tk floats), its max
//                                          and sum by block reductions, P's row written
//               attention_contract_kernel one thread per (bh, i, d): o = Σ_j Pd_ij v_jd
//     backward  attention_contract_kernel one thread per (bh, j, d): dv = Σ_i Pd_ij dO_id
//               attention_ds_kernel       one block per row (bh, i): dP_ij = (dO_i · v_j)·z, then
//                                          dS_ij = P_ij (dP_ij − Σ_j dP_ij P_ij) into a float
//                                          workspace [B, H, Tq, Tk]: backward needs a second
//                                          T×T matrix for a moment
//               attention_contract_kernel one thread per (bh, i, d): dq = scale Σ_j dS_ij k_jd,
//                                          then per (bh, j, d): dk = scale Σ_i dS_ij q_id
//   FlashAttention-2, one thread per row of a tile (the "minimal" form: tspeterkim's
//   flash-attention-minimal, FA2's loop order), tiles of Br = Bc = kFlashBlockRows = 32:
//     forward   flash_forward_kernel      grid (⌈Tq/Br⌉, B·H), Br threads; thread r owns query row
//                                          i0 + r: its q and its output accumulator in registers
//                                          (kMaxHeadDim floats each), m and l. For each key block
//                                          it can see, the block's threads load K_j, V_j into
//                                          shared memory (coalesced: consecutive threads read
//                                          consecutive d), then each thread scores its row against
//                                          the Bc keys, rescales (online_softmax_rescale) and
//                                          adds P~ V_j. Then o = acc / l, lse = m + log l.
//     backward  flash_delta_kernel        one thread per query row: Δ_i = dO_i · O_i (a float
//                                          workspace [B, H, Tq])
//               flash_dkdv_kernel         grid (⌈Tk/Bc⌉, B·H), Bc threads; thread c owns key row
//                                          j0 + c (k, v, dk, dv in registers); over the query
//                                          blocks that see it, Q_i, dO_i, lse_i, Δ_i are loaded
//                                          into shared memory and P, dP, dS recomputed row by row
//               flash_dq_kernel           grid (⌈Tq/Br⌉, B·H), Br threads; thread r owns query
//                                          row i (q, dO, dq in registers); over the key blocks it
//                                          sees, K_j and V_j in shared memory
//     FlashAttention-2 itself adds dQ with atomicAdd from the dK/dV loop; here a second kernel
//     recomputes P for dQ instead: one more pass of arithmetic, and the sums in a fixed order.
//   kv_cache_write       one thread per element of the new positions' k and v
// The masked scores are never exponentiated (their probability is 0). A block's threads all
// reach every barrier: a thread past the last row still loads and waits.
//
// Build and run: part of the engine (make, or make CUDA=1); tested against the CPU by
//   make test T='[attention][cuda]'    make test T='[embedding][cuda]'
#include <cmath>

#include "common.cuh"
#include "core/cuda_memory.h"  // copy_to_host
#include "ops/attention.h"

namespace kiln::cuda {

using detail::blocks_for;
using detail::kBlock;

namespace {

constexpr int kRowBlock = 128;  // threads per row for the softmax and the textbook scores

// The pair bh's head in a tensor with row stride ld and batch stride bs.
template <typename T>
__device__ T* head_at(T* base, int64_t bh, int64_t H, int64_t D, int64_t batch_stride) {
    return base + (bh / H) * batch_stride + (bh % H) * D;
}

__device__ float dropout_factor(const AttentionParams& p, int64_t bh, int64_t i, int64_t j) {
    if (p.dropout_p <= 0.0f) return 1.0f;
    return attention_kept(p, bh, i, j) ? 1.0f / (1.0f - p.dropout_p) : 0.0f;
}

// The first position whose id is outside [0, V), as N − n (0: none), for one copy to the host.
__global__ void check_ids_kernel(const int32_t* ids, int64_t N, int64_t V, unsigned long long* bad) {
    for (int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; n < N; n += int64_t(gridDim.x) * blockDim.x)
        if (ids[n] < 0 || ids[n] >= V) atomicMax(bad, (unsigned long long)(N - n));
}

void check_ids(const int32_t* ids, int64_t N, int64_t V, const char* op) {
    detail::Workspace ws(sizeof(unsigned long long));
    unsigned long long* bad = ws.as<unsigned long long>();
    KILN_CUDA_CHECK(cudaMemsetAsync(bad, 0, sizeof *bad, cuda_detail::launch_stream()));
    const dim3 grid(blocks_for(N)), block(kBlock);
    KILN_LAUNCH(check_ids_kernel, grid, block, 0)(ids, N, V, bad);
    KILN_CHECK_LAUNCH(check_ids_kernel, grid, block);
    unsigned long long host = 0;
    copy_to_host(&host, bad, sizeof host);
    if (host != 0) {
        const int64_t n = N - int64_t(host);
        int32_t id = 0;
        copy_to_host(&id, ids + n, sizeof id);
        KILN_FAIL(op, ": token id ", id, " at position ", n, " is outside the vocabulary [0, ", V,
                  ") (ids from another tokenizer?)");
    }
}

}  // namespace

// ==== embedding ================================================================================
template <typename T>
__global__ void embedding_forward_kernel(const int32_t* ids, const T* W, T* y, int64_t N, int64_t C) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < N * C; i += int64_t(gridDim.x) * blockDim.x)
        y[i] = W[int64_t(ids[i / C]) * C + i % C];
}

template <typename T>
__global__ void embedding_backward_kernel(const int32_t* ids, const T* dy, T* dW, int64_t N, int64_t C) {
    for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < C; c += int64_t(gridDim.x) * blockDim.x)
        for (int64_t n = 0; n < N; n++) {
            T* w = dW + int64_t(ids[n]) * C + c;
            *w = T(float(*w) + float(dy[n * C + c]));
        }
}

template <typename T>
void embedding_forward(const int32_t* ids, const T* W, T* y, int64_t N, int64_t V, int64_t C) {
    if (N == 0 || C == 0) return;
    check_ids(ids, N, V, "embedding");
    constexpr auto kernel = embedding_forward_kernel<T>;
    const dim3 grid(blocks_for(N * C)), block(kBlock);
    KILN_LAUNCH(kernel, grid, block, 0)(ids, W, y, N, C);
    KILN_CHECK_LAUNCH(kernel, grid, block);
}

template <typename T>
void embedding_backward(const int32_t* ids, const T* dy, T* dW, int64_t N, int64_t V, int64_t C) {
    if (N == 0 || C == 0) return;
    check_ids(ids, N, V, "embedding_backward");
    constexpr auto kernel = embedding_backward_kernel<T>;
    const dim3 grid(blocks_for(C)), block(kBlock);
    KILN_LAUNCH(kernel, grid, block, 0)(ids, dy, dW, N, C);
    KILN_CHECK_LAUNCH(kernel, grid, block);
}

// ==== softmax ==================================================================================
template <typename T>
__global__ void softmax_forward_kernel(const T* x, T* y, int64_t R, int64_t C) {
    __shared__ float sh[kRowBlock];
    for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
        const T* xr = x + r * C;
        float m = -INFINITY;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) m = fmaxf(m, float(xr[c]));
        m = detail::block_reduce(m, sh, detail::MaxOp{});
        float s = 0.0f;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += expf(float(xr[c]) - m);
        s = detail::block_reduce(s, sh, detail::SumOp{});
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) y[r * C + c] = T(expf(float(xr[c]) - m) / s);
    }
}

template <typename T>
__global__ void softmax_backward_kernel(const T* y, const T* dy, T* dx, int64_t R, int64_t C) {
    __shared__ float sh[kRowBlock];
    for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
        float s = 0.0f;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += float(dy[r * C + c]) * float(y[r * C + c]);
        s = detail::block_reduce(s, sh, detail::SumOp{});
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
            dx[r * C + c] = T(float(y[r * C + c]) * (float(dy[r * C + c]) - s));
    }
}

template <typename T>
void softmax_forward(const T* x, T* y, int64_t R, int64_t C) {
    if (R == 0 || C == 0) return;
    constexpr auto kernel = softmax_forward_kernel<T>;
    const dim3 grid(unsigned(std::min<int64_t>(R, 65535))), block(kRowBlock);
    KILN_LAUNCH(kernel, grid, block, 0)(x, y, R, C);
    KILN_CHECK_LAUNCH(kernel, grid, block);
}

template <typename T>
void softmax_backward(const T* y, const T* dy, T* dx, int64_t R, int64_t C) {
    if (R == 0 || C == 0) return;
    constexpr auto kernel = softmax_backward_kernel<T>;
    const dim3 grid(unsigned(std::min<int64_t>(R, 65535))), block(kRowBlock);
    KILN_LAUNCH(kernel, grid, block, 0)(y, dy, dx, R, C);
    KILN_CHECK_LAUNCH(kernel, grid, block);
}

// ==== (a) textbook attention ===================================================================
// Block (bh, i) = blockIdx.x: the row's scores in shared memory, then its softmax into P.
template <typename T>
__global__ void attention_scores_kernel(const T* q, const T* k, T* P, AttentionParams p) {
    KILN_DYNAMIC_SHARED(float, s);  // Tk scores
    __shared__ float sh[kRowBlock];
    const int64_t row = blockIdx.x, bh = row / p.Tq, i = row % p.Tq;
    const T* qi = head_at(q, bh, p.H, p.D, p.q_batch) + i * p.ldq;
    const T* kh = head_at(k, bh, p.H, p.D, p.k_batch);
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < p.Tk; j += blockDim.x) {
        float dot = 0.0f;
        for (int64_t d = 0; d < p.D; d++) dot += float(qi[d]) * float(kh[j * p.ldk + d]);
        s[j] = p.scale * dot;
        if (attention_visible(p, i, j)) m = fmaxf(m, s[j]);
    }
    m = detail::block_reduce(m, sh, detail::MaxOp{});
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < p.Tk; j += blockDim.x) {
        s[j] = attention_visible(p, i, j) ? expf(s[j] - m) : 0.0f;
        sum += s[j];
    }
    sum = detail::block_reduce(sum, sh, detail::SumOp{});
    for (int64_t j = threadIdx.x; j < p.Tk; j += blockDim.x) P[row * p.Tk + j] = T(s[j] / sum);
}

// The four products of the textbook version have one shape,
//   out[bh, r, d] = factor · Σ_s w(bh, r, s) · x[bh, s, d]          one thread per output
//   o  = Σ_j Pd_ij v_jd     dv = Σ_i Pd_ij dO_id     dq = scale Σ_j dS_ij k_jd     dk = scale Σ_i dS_ij q_id
// with r over `rows` positions and s over `terms`; the weight w reads P (with its dropout factor)
// or dS, at (i, j) = (r, s), or (s, r) when transposed (dv, dk). x and out are heads laid out as
// q (row stride ld, sequence stride batch).
template <typename T>
struct Heads {
    T* base;
    int64_t ld, batch;
};

template <typename T>
struct DroppedP {  // Pd_ij = P_ij · z_ij
    const T* P;
    bool transposed;
    __device__ float operator()(const AttentionParams& p, int64_t bh, int64_t r, int64_t s) const {
        const int64_t i = transposed ? s : r, j = transposed ? r : s;
        return float(P[(bh * p.Tq + i) * p.Tk + j]) * dropout_factor(p, bh, i, j);
    }
};

struct ScoreGrad {  // dS_ij
    const float* dS;
    bool transposed;
    __device__ float operator()(const AttentionParams& p, int64_t bh, int64_t r, int64_t s) const {
        return transposed ? dS[(bh * p.Tq + s) * p.Tk + r] : dS[(bh * p.Tq + r) * p.Tk + s];
    }
};

template <typename T, typename W>
__global__ void attention_contract_kernel(W w, Heads<const T> x, Heads<T> out, int64_t rows, int64_t terms,
                                          float factor, AttentionParams p) {
    const int64_t total = p.B * p.H * rows * p.D;
    for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
        const int64_t d = e % p.D, r = e / p.D % rows, bh = e / p.D / rows;
        const T* xh = head_at(x.base, bh, p.H, p.D, x.batch);
        float acc = 0.0f;
        for (int64_t s = 0; s < terms; s++) acc += w(p, bh, r, s) * float(xh[s * x.ld + d]);
        head_at(out.base, bh, p.H, p.D, out.batch)[r * out.ld + d] = T(factor * acc);
    }
}

// Runs attention_contract_kernel over B·H·rows·D outputs.
template <typename T, typename W>
void contract(W w, Heads<const T> x, Heads<T> out, int64_t rows, int64_t terms, float factor, const AttentionParams& p) {
    constexpr auto kernel = attention_contract_kernel<T, W>;
    const dim3 grid(blocks_for(p.B * p.H * rows * p.D)), block(kBlock);
    KILN_LAUNCH(kernel, grid, block, 0)(w, x, out, rows, terms, factor, p);
    KILN_CHECK_LAUNCH(kernel, grid, block);
}

// Block (bh, i): dP_ij = (dO_i · v_j) · z_ij, then dS_ij = P_ij (dP_ij − Σ_j dP_ij P_ij) into dS (float).
template <typename T>
__global__ void attention_ds_kernel(const T* v, const T* P, const T* dout, float* dS, AttentionParams p) {
    __shared__ float sh[kRowBlock];
    const int64_t row = blockIdx.x, bh = row / p.Tq, i = row % p.Tq;
    const T* dOi = head_at(dout, bh, p.H, p.D, p.o_batch) + i * p.ldo;
    const T* vh = head_at(v, bh, p.H, p.D, p.v_batch);
    float* g = dS + row * p.Tk;
    float dot = 0.0f;
    for (int64_t j = threadIdx.x; j < p.Tk; j += blockDim.x) {
        float dp = 0.0f;
        for (int64_t d = 0; d < p.D; d++) dp += float(dOi[d]) * float(vh[j * p.ldv + d]);
        g[j] = dp * dropout_factor(p, bh, i, j);
        dot += g[j] * float(P[row * p.Tk + j]);
    }
    dot = detail::block_reduce(dot, sh, detail::SumOp{});
    for (int64_t j = threadIdx.x; j < p.Tk; j += blockDim.x) g[j] = float(P[row * p.Tk + j]) * (g[j] - dot);
}

template <typename T>
void attention_forward(const T* q, const T* k, const T* v, T* o, T* P, const AttentionParams& p) {
    const int64_t rows = p.B * p.H * p.Tq;
    if (rows == 0) return;
    KILN_CHECK(rows <= 2147483647 && p.Tk * 4 <= 48 * 1024, "attention_forward (CUDA): ", rows, " rows of ", p.Tk,
               " keys: a row's scores must fit in 48 KiB of shared memory (Tk ≤ 12288); use flash attention");
    constexpr auto scores = attention_scores_kernel<T>;
    const dim3 grid{unsigned(rows)}, block{kRowBlock};
    KILN_LAUNCH(scores, grid, block, size_t(p.Tk) * sizeof(float))(q, k, P, p);
    KILN_CHECK_LAUNCH(scores, grid, block);
    contract(DroppedP<T>{P, false}, Heads<const T>{v, p.ldv, p.v_batch}, Heads<T>{o, p.ldo, p.o_batch}, p.Tq, p.Tk,
             1.0f, p);  // o = Pd V
}

template <typename T>
void attention_backward(const T* q, const T* k, const T* v, const T* P, const T* dout, T* dq, T* dk, T* dv,
                        const AttentionParams& p) {
    const int64_t rows = p.B * p.H * p.Tq;
    if (rows == 0) return;
    detail::Workspace ws(size_t(rows * p.Tk) * sizeof(float));  // dS, [B, H, Tq, Tk]
    float* dS = ws.as<float>();
    contract(DroppedP<T>{P, true}, Heads<const T>{dout, p.ldo, p.o_batch}, Heads<T>{dv, p.ldv, p.v_batch}, p.Tk, p.Tq,
             1.0f, p);  // dV = Pdᵀ dO
    constexpr auto ds_kernel = attention_ds_kernel<T>;
    const dim3 grid_rows{unsigned(rows)}, block_row{kRowBlock};
    KILN_LAUNCH(ds_kernel, grid_rows, block_row, 0)(v, P, dout, dS, p);
    KILN_CHECK_LAUNCH(ds_kernel, grid_rows, block_row);
    contract(ScoreGrad{dS, false}, Heads<const T>{k, p.ldk, p.k_batch}, Heads<T>{dq, p.ldq, p.q_batch}, p.Tq, p.Tk,
             p.scale, p);  // dQ = scale · dS K
    contract(ScoreGrad{dS, true}, Heads<const T>{q, p.ldq, p.q_batch}, Heads<T>{dk, p.ldk, p.k_batch}, p.Tk, p.Tq,
             p.scale, p);  // dK = scale · dSᵀ Q
}

// ==== (b) FlashAttention-2 =====================================================================
namespace {

constexpr int kBr = int(kFlashBlockRows), kBc = int(kFlashBlockRows);

__device__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// The block's threads copy rows [r0, r0 + rows) of a head (row stride ld) into tile [rows][D]
// (floats): consecutive threads take consecutive elements, so a row is read coalesced.
template <typename T>
__device__ void load_tile(const T* src, int64_t ld, int64_t r0, int64_t rows, int64_t D, float* tile) {
    for (int64_t x = threadIdx.x; x < rows * D; x += blockDim.x) tile[x] = float(src[(r0 + x / D) * ld + x % D]);
}

}  // namespace

template <typename T>
__global__ void flash_forward_kernel(const T* q, const T* k, const T* v, T* o, float* lse, AttentionParams p) {
    KILN_DYNAMIC_SHARED(float, smem);
    float* Kj = smem;             // [Bc][D]
    float* Vj = smem + kBc * p.D;  // [Bc][D]
    const int64_t bh = blockIdx.y, i0 = int64_t(blockIdx.x) * kBr, i = i0 + threadIdx.x, D = p.D;
    const bool mine = i < p.Tq;  // a thread past the last row loads and waits, nothing else
    const T* kh = head_at(k, bh, p.H, D, p.k_batch);
    const T* vh = head_at(v, bh, p.H, D, p.v_batch);
    float qi[kMaxHeadDim], acc[kMaxHeadDim];
    float m = -INFINITY, l = 0.0f;
    if (mine) {
        const T* qrow = head_at(q, bh, p.H, D, p.q_batch) + i * p.ldq;
        for (int64_t d = 0; d < D; d++) qi[d] = float(qrow[d]), acc[d] = 0.0f;
    }
    const int64_t last_key = attention_visible_keys(p, min64(i0 + kBr, p.Tq) - 1) - 1;  // the last row's last key
    for (int64_t j0 = 0; j0 <= last_key; j0 += kBc) {
        const int64_t cols = min64(kBc, p.Tk - j0);
        __syncthreads();  // the previous tile is read by every thread
        load_tile(kh, p.ldk, j0, cols, D, Kj);
        load_tile(vh, p.ldv, j0, cols, D, Vj);
        __syncthreads();
        if (!mine) continue;
        float s[kBc];
        const int64_t seen = min64(cols, attention_visible_keys(p, i) - j0);  // the tile's visible keys
        float block_max = -INFINITY;
        for (int64_t c = 0; c < seen; c++) {
            float dot = 0.0f;
            for (int64_t d = 0; d < D; d++) dot += qi[d] * Kj[c * D + d];
            s[c] = p.scale * dot;
            block_max = fmaxf(block_max, s[c]);
        }
        const float alpha = online_softmax_rescale(m, block_max);
        l *= alpha;
        for (int64_t d = 0; d < D; d++) acc[d] *= alpha;
        for (int64_t c = 0; c < seen; c++) {
            const float e = expf(s[c] - m);  // P~
            l += e;
            const float w = e * dropout_factor(p, bh, i, j0 + c);
            for (int64_t d = 0; d < D; d++) acc[d] += w * Vj[c * D + d];
        }
    }
    if (!mine) return;
    T* orow = head_at(o, bh, p.H, D, p.o_batch) + i * p.ldo;
    for (int64_t d = 0; d < D; d++) orow[d] = T(acc[d] / l);
    lse[bh * p.Tq + i] = m + logf(l);
}

// Δ_i = dO_i · O_i, one thread per (bh, i).
template <typename T>
__global__ void flash_delta_kernel(const T* o, const T* dout, float* delta, AttentionParams p) {
    const int64_t total = p.B * p.H * p.Tq;
    for (int64_t x = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; x < total; x += int64_t(gridDim.x) * blockDim.x) {
        const int64_t bh = x / p.Tq, i = x % p.Tq;
        const T* orow = head_at(o, bh, p.H, p.D, p.o_batch) + i * p.ldo;
        const T* grow = head_at(dout, bh, p.H, p.D, p.o_batch) + i * p.ldo;
        float s = 0.0f;
        for (int64_t d = 0; d < p.D; d++) s += float(grow[d]) * float(orow[d]);
        delta[x] = s;
    }
}

// Thread c owns key row j = j0 + c: dV_j and dK_j over the query rows that see it.
template <typename T>
__global__ void flash_dkdv_kernel(const T* q, const T* k, const T* v, const float* lse, const float* delta,
                                  const T* dout, T* dk, T* dv, AttentionParams p) {
    KILN_DYNAMIC_SHARED(float, smem);
    float* Qi = smem;               // [Br][D]
    float* dOi = smem + kBr * p.D;   // [Br][D]
    __shared__ float lse_i[kBr], delta_i[kBr];
    const int64_t bh = blockIdx.y, j0 = int64_t(blockIdx.x) * kBc, j = j0 + threadIdx.x, D = p.D;
    const bool mine = j < p.Tk;
    const T* qh = head_at(q, bh, p.H, D, p.q_batch);
    const T* gh = head_at(dout, bh, p.H, D, p.o_batch);
    float kj[kMaxHeadDim], vj[kMaxHeadDim], dkj[kMaxHeadDim], dvj[kMaxHeadDim];
    if (mine) {
        const T* krow = head_at(k, bh, p.H, D, p.k_batch) + j * p.ldk;
        const T* vrow = head_at(v, bh, p.H, D, p.v_batch) + j * p.ldv;
        for (int64_t d = 0; d < D; d++) kj[d] = float(krow[d]), vj[d] = float(vrow[d]), dkj[d] = dvj[d] = 0.0f;
    }
    int64_t first_row = 0;  // the first query that sees key j0
    while (first_row < p.Tq && !attention_visible(p, first_row, j0)) first_row++;
    for (int64_t i0 = first_row / kBr * kBr; i0 < p.Tq; i0 += kBr) {
        const int64_t rows = min64(kBr, p.Tq - i0);
        __syncthreads();
        load_tile(qh, p.ldq, i0, rows, D, Qi);
        load_tile(gh, p.ldo, i0, rows, D, dOi);
        for (int64_t r = threadIdx.x; r < rows; r += blockDim.x)
            lse_i[r] = lse[bh * p.Tq + i0 + r], delta_i[r] = delta[bh * p.Tq + i0 + r];
        __syncthreads();
        if (!mine) continue;
        for (int64_t r = 0; r < rows; r++) {
            const int64_t i = i0 + r;
            if (!attention_visible(p, i, j)) continue;
            float s = 0.0f, dp = 0.0f;
            for (int64_t d = 0; d < D; d++) s += Qi[r * D + d] * kj[d], dp += dOi[r * D + d] * vj[d];
            const float pij = expf(p.scale * s - lse_i[r]), z = dropout_factor(p, bh, i, j);
            const float ds = pij * (dp * z - delta_i[r]);
            for (int64_t d = 0; d < D; d++) dvj[d] += pij * z * dOi[r * D + d], dkj[d] += p.scale * ds * Qi[r * D + d];
        }
    }
    if (!mine) return;
    T* dkrow = head_at(dk, bh, p.H, D, p.k_batch) + j * p.ldk;
    T* dvrow = head_at(dv, bh, p.H, D, p.v_batch) + j * p.ldv;
    for (int64_t d = 0; d < D; d++) dkrow[d] = T(dkj[d]), dvrow[d] = T(dvj[d]);
}

// Thread r owns query row i = i0 + r: dQ_i over the key blocks it sees.
template <typename T>
__global__ void flash_dq_kernel(const T* q, const T* k, const T* v, const float* lse, const float* delta,
                                const T* dout, T* dq, AttentionParams p) {
    KILN_DYNAMIC_SHARED(float, smem);
    float* Kj = smem;             // [Bc][D]
    float* Vj = smem + kBc * p.D;  // [Bc][D]
    const int64_t bh = blockIdx.y, i0 = int64_t(blockIdx.x) * kBr, i = i0 + threadIdx.x, D = p.D;
    const bool mine = i < p.Tq;
    const T* kh = head_at(k, bh, p.H, D, p.k_batch);
    const T* vh = head_at(v, bh, p.H, D, p.v_batch);
    float qi[kMaxHeadDim], gi[kMaxHeadDim], dqi[kMaxHeadDim];
    float lse_row = 0.0f, delta_row = 0.0f;
    if (mine) {
        const T* qrow = head_at(q, bh, p.H, D, p.q_batch) + i * p.ldq;
        const T* grow = head_at(dout, bh, p.H, D, p.o_batch) + i * p.ldo;
        for (int64_t d = 0; d < D; d++) qi[d] = float(qrow[d]), gi[d] = float(grow[d]), dqi[d] = 0.0f;
        lse_row = lse[bh * p.Tq + i], delta_row = delta[bh * p.Tq + i];
    }
    const int64_t last_key = attention_visible_keys(p, min64(i0 + kBr, p.Tq) - 1) - 1;  // the last row's last key
    for (int64_t j0 = 0; j0 <= last_key; j0 += kBc) {
        const int64_t cols = min64(kBc, p.Tk - j0);
        __syncthreads();
        load_tile(kh, p.ldk, j0, cols, D, Kj);
        load_tile(vh, p.ldv, j0, cols, D, Vj);
        __syncthreads();
        if (!mine) continue;
        const int64_t seen = min64(cols, attention_visible_keys(p, i) - j0);
        for (int64_t c = 0; c < seen; c++) {
            float s = 0.0f, dp = 0.0f;
            for (int64_t d = 0; d < D; d++) s += qi[d] * Kj[c * D + d], dp += gi[d] * Vj[c * D + d];
            const float pij = expf(p.scale * s - lse_row);
            const float ds = pij * (dp * dropout_factor(p, bh, i, j0 + c) - delta_row);
            for (int64_t d = 0; d < D; d++) dqi[d] += p.scale * ds * Kj[c * D + d];
        }
    }
    if (!mine) return;
    T* dqrow = head_at(dq, bh, p.H, D, p.q_batch) + i * p.ldq;
    for (int64_t d = 0; d < D; d++) dqrow[d] = T(dqi[d]);
}

namespace {

void check_flash(const AttentionParams& p, const char* op) {
    KILN_CHECK(p.D <= kMaxHeadDim, op, " (CUDA): head size ", p.D, " is above the ", kMaxHeadDim,
               " a thread keeps in registers; use more heads (n_embd / n_head ≤ ", kMaxHeadDim, ")");
    KILN_CHECK(p.B * p.H <= 65535, op, " (CUDA): ", p.B * p.H, " (sequence, head) pairs, more than a grid's 65535");
}

}  // namespace

template <typename T>
void flash_attention_forward(const T* q, const T* k, const T* v, T* o, float* lse, const AttentionParams& p) {
    if (p.B * p.H * p.Tq == 0) return;
    check_flash(p, "flash_attention_forward");
    constexpr auto kernel = flash_forward_kernel<T>;
    const dim3 grid(unsigned((p.Tq + kBr - 1) / kBr), unsigned(p.B * p.H)), block(kBr);
    KILN_LAUNCH(kernel, grid, block, size_t(2 * kBc * p.D) * sizeof(float))(q, k, v, o, lse, p);
    KILN_CHECK_LAUNCH(kernel, grid, block);
}

template <typename T>
void flash_attention_backward(const T* q, const T* k, const T* v, const T* o, const float* lse, const T* dout, T* dq,
                              T* dk, T* dv, const AttentionParams& p) {
    const int64_t rows = p.B * p.H * p.Tq;
    if (rows == 0) return;
    check_flash(p, "flash_attention_backward");
    detail::Workspace ws(size_t(rows) * sizeof(float));  // Δ, [B, H, Tq]
    float* delta = ws.as<float>();
    constexpr auto delta_kernel = flash_delta_kernel<T>;
    const dim3 grid1(blocks_for(rows)), block1(kBlock);
    KILN_LAUNCH(delta_kernel, grid1, block1, 0)(o, dout, delta, p);
    KILN_CHECK_LAUNCH(delta_kernel, grid1, block1);
    const size_t tiles = size_t(2 * kBr * p.D) * sizeof(float);
    constexpr auto dkdv = flash_dkdv_kernel<T>;
    const dim3 grid_k(unsigned((p.Tk + kBc - 1) / kBc), unsigned(p.B * p.H)), block_k(kBc);
    KILN_LAUNCH(dkdv, grid_k, block_k, tiles)(q, k, v, lse, delta, dout, dk, dv, p);
    KILN_CHECK_LAUNCH(dkdv, grid_k, block_k);
    constexpr auto dq_kernel = flash_dq_kernel<T>;
    const dim3 grid_q(unsigned((p.Tq + kBr - 1) / kBr), unsigned(p.B * p.H)), block_q(kBr);
    KILN_LAUNCH(dq_kernel, grid_q, block_q, tiles)(q, k, v, lse, delta, dout, dq, p);
    KILN_CHECK_LAUNCH(dq_kernel, grid_q, block_q);
}

// ==== the KV cache ===============================================================================
// One thread per element of the new keys and values.
template <typename T>
__global__ void kv_cache_write_kernel(const T* qkv, T* k, T* v, int64_t B, int64_t Tq, int64_t C, int64_t T_max,
                                      int64_t start) {
    for (int64_t x = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; x < B * Tq * C;
         x += int64_t(gridDim.x) * blockDim.x) {
        const int64_t c = x % C, t = x / C % Tq, b = x / C / Tq;
        const T* row = qkv + (b * Tq + t) * 3 * C;
        k[(b * T_max + start + t) * C + c] = row[C + c];
        v[(b * T_max + start + t) * C + c] = row[2 * C + c];
    }
}

template <typename T>
void kv_cache_write(const T* qkv, T* k, T* v, int64_t B, int64_t Tq, int64_t C, int64_t T_max, int64_t start) {
    if (B * Tq * C == 0) return;
    constexpr auto kernel = kv_cache_write_kernel<T>;
    const dim3 grid(blocks_for(B * Tq * C)), block(kBlock);
    KILN_LAUNCH(kernel, grid, block, 0)(qkv, k, v, B, Tq, C, T_max, start);
    KILN_CHECK_LAUNCH(kernel, grid, block);
}

KILN_ATTENTION_KERNELS(KILN_INSTANTIATE_FLOAT);

}  // namespace kiln::cuda
