// attention.h — the kernels of chapter 14's transformer: the embedding lookup, the softmax of
// rows, and causal self-attention in two versions, declared once for both backends
// (core/backend.h): src/ops/cpu/attention.cpp ↔ cuda/attention.cu.
//
// T is float, f16 or bf16: every kernel reads T, computes in float and rounds each result to T
// once — except the textbook attention's probabilities P, which it stores in T (they are an
// activation, kept for backward: the memory chapter 14 measures) and reads back.
//
// Letters: N tokens, V vocabulary, C channels (C = H·D); B sequences, H heads, D head size, Tq
// query positions, Tk key positions (Tq = Tk = T in training; a KV cache decodes Tq = 1 against
// Tk = all positions so far). Every kernel gives the same bits on every run and, on the CPU, on
// any thread count: each sum belongs to one thread (or one block) and is taken in a fixed order.
#pragma once
#include <cmath>
#include <cstdint>

#include "core/backend.h"
#include "core/rng.h"

namespace kiln {

// ==== embedding (PyTorch's nn.Embedding) ======================================================
// y[n, :] = W[ids[n], :]          ids [N], each in [0, V); W [V, C]; y [N, C]
// An id outside [0, V) is a kiln::Error naming the first such position.
KILN_KERNEL(embedding_forward, template <typename T> void embedding_forward(const int32_t* ids, const T* W, T* y,
                                                                            int64_t N, int64_t V, int64_t C));
// dW[ids[n], :] += dy[n, :]       a scatter-add: tokens that repeat add into the same row of dW.
// Without races: the C columns are split between the threads (or CUDA threads), and each adds
// its columns of all N rows, n = 0, 1, ..., N−1 in order — so also the same bits on every run.
KILN_KERNEL(embedding_backward, template <typename T> void embedding_backward(const int32_t* ids, const T* dy, T* dW,
                                                                              int64_t N, int64_t V, int64_t C));

// ==== softmax over the last dimension =========================================================
// x, y [R, C]: each row r separately,
//   y[r, c] = exp(x[r, c] − m) / Σ_c' exp(x[r, c'] − m)        m = max_c x[r, c]
// (subtracting m changes nothing in exact arithmetic and keeps every exp ≤ 1).
KILN_KERNEL(softmax_forward, template <typename T> void softmax_forward(const T* x, T* y, int64_t R, int64_t C));
// Its derivative, from the output y: dy/dx = diag(y) − y·yᵀ for a row, so
//   dx[r, c] = y[r, c] · (dy[r, c] − Σ_c' dy[r, c'] · y[r, c'])
KILN_KERNEL(softmax_backward,
            template <typename T> void softmax_backward(const T* y, const T* dy, T* dx, int64_t R, int64_t C));

// ==== causal self-attention ===================================================================
// Where q, k, v and o are, and what the product is. Head h of sequence b at position t is the D
// values at
//   q + b·q_batch + t·ldq + h·D          (likewise k, v and the output o)
// so a layer's packed qkv [B, T, 3C] (PyTorch's c_attn output) is read in place: q at column 0,
// k at C, v at 2C, ldq = ldk = ldv = 3C, batch strides T·3C; o is [B, T, C] (ldo = C); a KV cache
// is [B, T_max, C] with batch stride T_max·C.
// Query i (0 ≤ i < Tq) stands at position Tk − Tq + i, and sees the keys at positions up to its
// own: attention_visible_keys below is the causal mask, the one place it is written.
// Dropout of the probabilities (PyTorch's attn_dropout): with dropout_p > 0, P[b,h,i,j] is kept
// when Rng::to_unit(splitmix64(seed_hash ^ splitmix64(first + ((b·H + h)·Tq + i)·Tk + j))) ≥ p and
// scaled by 1/(1 − p): a pure function of the position, which backward (and the recomputation
// of FlashAttention's backward) draws again instead of storing.
struct AttentionParams {
    int64_t B = 0, H = 0, Tq = 0, Tk = 0, D = 0;
    int64_t ldq = 0, ldk = 0, ldv = 0, ldo = 0;              // row strides, in elements
    int64_t q_batch = 0, k_batch = 0, v_batch = 0, o_batch = 0;  // sequence strides, in elements
    float scale = 1.0f;                                      // 1/√D
    float dropout_p = 0.0f;
    uint64_t seed_hash = 0, first = 0;
};

// The causal mask, the one place it is written: query i sees the keys 0 .. visible_keys − 1, those
// at positions up to its own (Tk − Tq + i) — no position sees one after it. Every kernel asks
// these two functions.
KILN_HOST_DEVICE inline int64_t attention_visible_keys(const AttentionParams& p, int64_t i) {
    return p.Tk - p.Tq + i + 1;
}
KILN_HOST_DEVICE inline bool attention_visible(const AttentionParams& p, int64_t i, int64_t j) {
    return j < attention_visible_keys(p, i);
}

// Whether probability (b, h, i, j) survives dropout (always, with dropout_p = 0).
KILN_HOST_DEVICE inline bool attention_kept(const AttentionParams& p, int64_t bh, int64_t i, int64_t j) {
    if (p.dropout_p <= 0.0f) return true;
    const uint64_t n = p.first + uint64_t((bh * p.Tq + i) * p.Tk + j);
    return Rng::to_unit(splitmix64(p.seed_hash ^ splitmix64(n))) >= p.dropout_p;
}

// ---- (a) textbook: the Tq×Tk scores materialized ---------------------------------------------
// For each sequence b and head h, with Q [Tq, D], K, V [Tk, D] its slices:
//   S = scale · Q Kᵀ,  S[i, j] = −∞ where j is not visible to i      [Tq, Tk]
//   P = softmax(S) over each row                                      [Tq, Tk]   kept in P (T)
//   O = (P ⊙ Z / (1 − p)) V                                           [Tq, D]    Z the dropout mask
// P [B, H, Tq, Tk] is written whole (zeros where masked): 4·B·H·Tq·Tk bytes in f32 — the
// activation that grows with the square of the context.
KILN_KERNEL(attention_forward, template <typename T> void attention_forward(const T* q, const T* k, const T* v, T* o,
                                                                            T* P, const AttentionParams& p));
// With dO the gradient of O (laid out as o) and Pd = P ⊙ Z / (1 − p):
//   dV = Pdᵀ dO          dPd = dO Vᵀ          dP = dPd ⊙ Z / (1 − p)
//   dS = P ⊙ (dP − rowsum(dP ⊙ P))                    (softmax_backward, row by row)
//   dQ = scale · dS K    dK = scale · dSᵀ Q
// dq, dk, dv are laid out as q, k, v (the packed dqkv [B, T, 3C]) and overwritten.
KILN_KERNEL(attention_backward,
            template <typename T> void attention_backward(const T* q, const T* k, const T* v, const T* P, const T* dout,
                                                          T* dq, T* dk, T* dv, const AttentionParams& p));

// ---- (b) FlashAttention-2 (Dao, 2023): tiled, the scores never stored -------------------------
// The online softmax's step (Milakov & Gimelshein, 2018), for one row: the keys seen so far had
// scores s with running maximum m, running sum l = Σ exp(s − m) and output O = Σ exp(s − m)·v.
// A block of scores with maximum block_max arrives: the new maximum is m' = max(m, block_max),
// and every term summed against m must be moved to m': exp(s − m) · exp(m − m') = exp(s − m').
// online_softmax_rescale sets m = m' and returns α = exp(m − m'), by which the caller multiplies
// l and O before adding the block's exp(s − m') terms. Before the first block m = −∞ and l, O
// are 0: α = 0 (not exp(−∞ + ∞), which is NaN).
KILN_HOST_DEVICE inline float online_softmax_rescale(float& m, float block_max) {
    const float m_new = fmaxf(m, block_max);
    const float alpha = m == -INFINITY ? 0.0f : expf(m - m_new);
    m = m_new;
    return alpha;
}

// Queries in blocks of Br rows, keys in blocks of Bc; for one query block, m (running max), l
// (running sum) and O start at −∞, 0, 0, and each visible key block j folds in as
//   S  = scale · Q_i K_jᵀ (masked)         m' = max(m, rowmax S)
//   P~ = exp(S − m')                        l' = e^(m − m') · l + rowsum P~
//   O' = e^(m − m') · O + (P~ ⊙ Z / (1 − p)) V_j
// (the online softmax: what was summed against the old max is rescaled to the new one), and at
// the end O = O / l, and lse = m + log l (the row's log-sum-exp) is kept: [B, H, Tq] floats,
// 4·B·H·Tq bytes — linear in the context.
KILN_KERNEL(flash_attention_forward, template <typename T> void flash_attention_forward(const T* q, const T* k,
                                                                                        const T* v, T* o, float* lse,
                                                                                        const AttentionParams& p));
// Backward recomputes each tile's probabilities from Q, K and lse instead of reading P:
//   P = exp(scale · Q_i K_jᵀ − lse_i)       Δ_i = rowsum(dO_i ⊙ O_i)   (= Σ_j P_ij dP_ij)
//   dV_j += Pdᵀ dO_i     dP = (dO_i V_jᵀ) ⊙ Z / (1 − p)     dS = P ⊙ (dP − Δ_i)
//   dQ_i += scale · dS K_j                  dK_j += scale · dSᵀ Q_i
// dq, dk, dv laid out as q, k, v and overwritten.
KILN_KERNEL(flash_attention_backward,
            template <typename T> void flash_attention_backward(const T* q, const T* k, const T* v, const T* o,
                                                                const float* lse, const T* dout, T* dq, T* dk, T* dv,
                                                                const AttentionParams& p));

// ---- generation: the KV cache ----------------------------------------------------------------
// The keys and values of Tq new positions, from a packed qkv [B, Tq, 3C], written into the caches
// k, v [B, T_max, C] at rows start .. start + Tq − 1:
//   k[b, start + t, :] = qkv[b, t, C .. 2C)        v[b, start + t, :] = qkv[b, t, 2C .. 3C)
KILN_KERNEL(kv_cache_write, template <typename T> void kv_cache_write(const T* qkv, T* k, T* v, int64_t B, int64_t Tq,
                                                                      int64_t C, int64_t T_max, int64_t start));

// The tile sizes of the FlashAttention kernels (Br query rows × Bc keys) on each backend.
KILN_CPU_KERNEL(constexpr int64_t kFlashBlockRows = 64);
KILN_CUDA_KERNEL(constexpr int64_t kFlashBlockRows = 32);
// The largest head size D the CUDA kernels take (a thread keeps a row of D floats in registers).
KILN_CUDA_KERNEL(constexpr int64_t kMaxHeadDim = 128);

// The templates above that both backends define, for the kernel files' explicit instantiations
// (the float types): KILN_ATTENTION_KERNELS(KILN_INSTANTIATE_FLOAT);
#define KILN_ATTENTION_KERNELS(X)                                                                  \
    X(embedding_forward); X(embedding_backward); X(softmax_forward); X(softmax_backward);          \
    X(attention_forward); X(attention_backward); X(flash_attention_forward); X(flash_attention_backward); \
    X(kv_cache_write)

}  // namespace kiln
