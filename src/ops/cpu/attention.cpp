// attention.cpp — chapter 14's kernels on the CPU (contracts and formulas: ops/attention.h):
// the embedding lookup and its scatter-add, the softmax of rows, and causal self-attention, the
// textbook version and FlashAttention-2's.
//
// ---- Attention: one (sequence, head) pair at a time -------------------------------------------
// The B·H pairs are independent: parallel_chunks hands them to the threads, one pair per claim,
// and everything of a pair — its sums, its gradients — is done by one thread in a fixed order:
// the same bits on any thread count, without atomics. A pair's Q, K, V (and dO, O) are first
// copied into contiguous f32 panels [T, D] of the thread's own scratch (a gather from the packed
// qkv [B, T, 3C], and the one conversion from f16/bf16), and its products are cpu::gemm<float>
// calls on those panels (ops/cpu/gemm.h; inside a parallel chunk a gemm runs on its thread).
//
//   textbook   S = scale·Q Kᵀ (one [Tq, Tk] gemm), the masked row softmax, P stored, O = Pd V.
//              Backward reads P back and runs the five products of the formula.
//   flash      for each block of Br query rows, over the key blocks of Bc that it can see: the
//              [Br, Bc] tile S = scale·Q_i K_jᵀ, online_softmax_rescale per row, O_i += P~ V_j.
//              Only the tile's S is ever in memory. Backward, per key block j, the query blocks
//              that see it: P recomputed from lse, then the four tile products.
//              Br = Bc = kFlashBlockRows (64): a tile of S is 16 KiB, in L1 with its panels.
//
// A masked score is never exponentiated: its probability is written as 0 (exp(−∞ − (−∞)) is NaN).
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "ops/attention.h"
#include "ops/gemm.h"

namespace kiln::cpu {
namespace {

constexpr int64_t kParallelMin = 1 << 14;

// ---- embedding helpers ------------------------------------------------------------------------
void check_ids(const int32_t* ids, int64_t N, int64_t V, const char* op) {
    for (int64_t n = 0; n < N; n++)
        KILN_CHECK(ids[n] >= 0 && ids[n] < V, op, ": token id ", ids[n], " at position ", n,
                   " is outside the vocabulary [0, ", V, ") (ids from another tokenizer?)");
}

// ---- one (sequence, head) pair's panels -------------------------------------------------------
// Scratch of the thread: grown once, reused by every pair it does.
std::vector<float>& scratch(int which) {
    thread_local std::vector<float> buffers[12];
    return buffers[which];
}
float* panel(int which, int64_t n) {
    std::vector<float>& b = scratch(which);
    if (int64_t(b.size()) < n) b.resize(size_t(n));
    return b.data();
}

// dst [rows, D] (f32, contiguous) = the head's slice of src: row t at src + t·ld.
template <typename T>
void gather(const T* src, int64_t ld, int64_t rows, int64_t D, float* dst) {
    for (int64_t t = 0; t < rows; t++)
        for (int64_t d = 0; d < D; d++) dst[t * D + d] = float(src[t * ld + d]);
}

// The head's slice of dst = src [rows, D], each value rounded to T once.
template <typename T>
void scatter(const float* src, int64_t rows, int64_t D, T* dst, int64_t ld) {
    for (int64_t t = 0; t < rows; t++)
        for (int64_t d = 0; d < D; d++) dst[t * ld + d] = T(src[t * D + d]);
}

// Where pair bh = b·H + h's head starts in a tensor laid out with row stride ld, batch stride bs.
template <typename T>
T* head(T* base, int64_t bh, const AttentionParams& p, int64_t batch_stride) {
    return base + (bh / p.H) * batch_stride + (bh % p.H) * p.D;
}

// C = alpha · op(A) op(B) + beta · C on f32 panels (row strides lda, ldb, ldc).
void mm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
        const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
    gemm<float>(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// The dropout factor of probability (bh, i, j): 0 when dropped, 1/(1 − p) when kept, 1 without dropout.
inline float dropout_factor(const AttentionParams& p, int64_t bh, int64_t i, int64_t j) {
    if (p.dropout_p <= 0.0f) return 1.0f;
    return attention_kept(p, bh, i, j) ? 1.0f / (1.0f - p.dropout_p) : 0.0f;
}

// The pair bh's Q [Tq, D], K and V [Tk, D] gathered into the thread's panels 0, 1 and 2.
struct Panels {
    float *Q, *K, *V;
};
template <typename T>
Panels gather_qkv(const T* q, const T* k, const T* v, int64_t bh, const AttentionParams& p) {
    const Panels x{panel(0, p.Tq * p.D), panel(1, p.Tk * p.D), panel(2, p.Tk * p.D)};
    gather(head(q, bh, p, p.q_batch), p.ldq, p.Tq, p.D, x.Q);
    gather(head(k, bh, p, p.k_batch), p.ldk, p.Tk, p.D, x.K);
    gather(head(v, bh, p, p.v_batch), p.ldv, p.Tk, p.D, x.V);
    return x;
}

// Runs f(bh) for every (sequence, head) pair, one pair per claim.
template <typename F>
void for_each_pair(const AttentionParams& p, F f) {
    const int64_t pairs = p.B * p.H;
    parallel_chunks(pairs, [&](int64_t bh) { f(bh); }, pairs > 1 && pairs * p.Tq * p.Tk >= kParallelMin / 4);
}

void check_params(const AttentionParams& p, const char* op) {
    KILN_CHECK(p.B > 0 && p.H > 0 && p.Tq > 0 && p.Tk >= p.Tq && p.D > 0, op, ": bad sizes B=", p.B, " H=", p.H,
               " Tq=", p.Tq, " Tk=", p.Tk, " D=", p.D);
}

}  // namespace

// ==== embedding ================================================================================
template <typename T>
void embedding_forward(const int32_t* ids, const T* W, T* y, int64_t N, int64_t V, int64_t C) {
    check_ids(ids, N, V, "embedding");
    parallel_for(N, grain_of(kParallelMin, C), [&](int64_t n0, int64_t n1) {
        for (int64_t n = n0; n < n1; n++) std::copy(W + int64_t(ids[n]) * C, W + (int64_t(ids[n]) + 1) * C, y + n * C);
    });
}

// Each chunk of columns belongs to one thread, which adds the N rows of dy into them in order.
template <typename T>
void embedding_backward(const int32_t* ids, const T* dy, T* dW, int64_t N, int64_t V, int64_t C) {
    check_ids(ids, N, V, "embedding_backward");
    parallel_for(C, grain_of(kParallelMin, N), [&](int64_t c0, int64_t c1) {
        for (int64_t n = 0; n < N; n++) {
            T* row = dW + int64_t(ids[n]) * C;
            const T* g = dy + n * C;
            for (int64_t c = c0; c < c1; c++) row[c] = T(float(row[c]) + float(g[c]));
        }
    });
}

// ==== softmax ==================================================================================
template <typename T>
void softmax_forward(const T* x, T* y, int64_t R, int64_t C) {
    parallel_for(R, grain_of(kParallelMin, C), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; r++) {
            const T* xr = x + r * C;
            float m = -INFINITY;
            for (int64_t c = 0; c < C; c++) m = std::max(m, float(xr[c]));
            double s = 0.0;
            for (int64_t c = 0; c < C; c++) s += std::exp(double(float(xr[c]) - m));
            for (int64_t c = 0; c < C; c++) y[r * C + c] = T(float(std::exp(double(float(xr[c]) - m)) / s));
        }
    });
}

template <typename T>
void softmax_backward(const T* y, const T* dy, T* dx, int64_t R, int64_t C) {
    parallel_for(R, grain_of(kParallelMin, C), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; r++) {
            const T *yr = y + r * C, *gr = dy + r * C;
            double s = 0.0;
            for (int64_t c = 0; c < C; c++) s += double(float(gr[c])) * double(float(yr[c]));
            for (int64_t c = 0; c < C; c++) dx[r * C + c] = T(float(yr[c]) * (float(gr[c]) - float(s)));
        }
    });
}

// ==== (a) textbook attention ===================================================================
template <typename T>
void attention_forward(const T* q, const T* k, const T* v, T* o, T* P, const AttentionParams& p) {
    check_params(p, "attention_forward");
    const int64_t Tq = p.Tq, Tk = p.Tk, D = p.D;
    for_each_pair(p, [&](int64_t bh) {
        const auto [Q, K, Vp] = gather_qkv(q, k, v, bh, p);
        float *O = panel(3, Tq * D), *S = panel(4, Tq * Tk);
        mm(false, true, Tq, Tk, D, p.scale, Q, D, K, D, 0.0f, S, Tk);  // S = scale · Q Kᵀ
        T* Pbh = P + bh * Tq * Tk;
        for (int64_t i = 0; i < Tq; i++) {
            float* s = S + i * Tk;
            const int64_t seen = attention_visible_keys(p, i);  // keys 0 .. seen − 1
            float m = -INFINITY;
            for (int64_t j = 0; j < seen; j++) m = std::max(m, s[j]);
            float sum = 0.0f;
            for (int64_t j = 0; j < seen; j++) sum += s[j] = std::exp(s[j] - m);
            for (int64_t j = 0; j < Tk; j++) {
                // P as stored (rounded to T), then Pd = P ⊙ Z / (1 − p), which O is made of
                const T pij = T(attention_visible(p, i, j) ? s[j] / sum : 0.0f);
                Pbh[i * Tk + j] = pij;
                s[j] = float(pij) * dropout_factor(p, bh, i, j);
            }
        }
        mm(false, false, Tq, D, Tk, 1.0f, S, Tk, Vp, D, 0.0f, O, D);  // O = Pd V
        scatter(O, Tq, D, head(o, bh, p, p.o_batch), p.ldo);
    });
}

template <typename T>
void attention_backward(const T* q, const T* k, const T* v, const T* P, const T* dout, T* dq, T* dk, T* dv,
                        const AttentionParams& p) {
    check_params(p, "attention_backward");
    const int64_t Tq = p.Tq, Tk = p.Tk, D = p.D;
    for_each_pair(p, [&](int64_t bh) {
        const auto [Q, K, Vp] = gather_qkv(q, k, v, bh, p);
        float *dO = panel(3, Tq * D), *Pf = panel(4, Tq * Tk), *Pd = panel(5, Tq * Tk), *dS = panel(6, Tq * Tk);
        float *dQ = panel(7, Tq * D), *dK = panel(8, Tk * D), *dV = panel(9, Tk * D);
        gather(head(dout, bh, p, p.o_batch), p.ldo, Tq, D, dO);
        gather(P + bh * Tq * Tk, Tk, Tq, Tk, Pf);
        for (int64_t i = 0; i < Tq; i++)
            for (int64_t j = 0; j < Tk; j++) Pd[i * Tk + j] = Pf[i * Tk + j] * dropout_factor(p, bh, i, j);
        mm(true, false, Tk, D, Tq, 1.0f, Pd, Tk, dO, D, 0.0f, dV, D);    // dV = Pdᵀ dO
        mm(false, true, Tq, Tk, D, 1.0f, dO, D, Vp, D, 0.0f, dS, Tk);    // dPd = dO Vᵀ
        for (int64_t i = 0; i < Tq; i++) {
            float* g = dS + i * Tk;
            const float* pr = Pf + i * Tk;
            float dot = 0.0f;
            for (int64_t j = 0; j < Tk; j++) {
                g[j] *= dropout_factor(p, bh, i, j);  // dP = dPd ⊙ Z / (1 − p)
                dot += g[j] * pr[j];
            }
            for (int64_t j = 0; j < Tk; j++) g[j] = pr[j] * (g[j] - dot);  // dS = P ⊙ (dP − rowsum(dP ⊙ P))
        }
        mm(false, false, Tq, D, Tk, p.scale, dS, Tk, K, D, 0.0f, dQ, D);  // dQ = scale · dS K
        mm(true, false, Tk, D, Tq, p.scale, dS, Tk, Q, D, 0.0f, dK, D);   // dK = scale · dSᵀ Q
        scatter(dQ, Tq, D, head(dq, bh, p, p.q_batch), p.ldq);
        scatter(dK, Tk, D, head(dk, bh, p, p.k_batch), p.ldk);
        scatter(dV, Tk, D, head(dv, bh, p, p.v_batch), p.ldv);
    });
}

// ==== (b) FlashAttention-2 =====================================================================
template <typename T>
void flash_attention_forward(const T* q, const T* k, const T* v, T* o, float* lse, const AttentionParams& p) {
    check_params(p, "flash_attention_forward");
    const int64_t Tq = p.Tq, Tk = p.Tk, D = p.D, Br = kFlashBlockRows, Bc = kFlashBlockRows;
    for_each_pair(p, [&](int64_t bh) {
        const auto [Q, K, Vp] = gather_qkv(q, k, v, bh, p);
        float *O = panel(3, Tq * D), *S = panel(4, Br * Bc);
        float* lse_bh = lse + bh * Tq;
        for (int64_t i0 = 0; i0 < Tq; i0 += Br) {
            const int64_t rows = std::min(Br, Tq - i0);
            float m[kFlashBlockRows], l[kFlashBlockRows];
            std::fill(m, m + rows, -INFINITY);
            std::fill(l, l + rows, 0.0f);
            float* Oi = O + i0 * D;
            std::fill(Oi, Oi + rows * D, 0.0f);
            const int64_t last_key = attention_visible_keys(p, i0 + rows - 1) - 1;  // the last row's last key
            for (int64_t j0 = 0; j0 <= last_key; j0 += Bc) {
                const int64_t cols = std::min(Bc, Tk - j0);
                mm(false, true, rows, cols, D, p.scale, Q + i0 * D, D, K + j0 * D, D, 0.0f, S, Bc);  // S = scale·Q_i K_jᵀ
                for (int64_t r = 0; r < rows; r++) {
                    float* s = S + r * Bc;
                    const int64_t seen = std::min(cols, attention_visible_keys(p, i0 + r) - j0);  // this tile's visible keys
                    float block_max = -INFINITY;
                    for (int64_t c = 0; c < seen; c++) block_max = std::max(block_max, s[c]);
                    const float alpha = online_softmax_rescale(m[r], block_max);
                    float sum = 0.0f;
                    for (int64_t c = 0; c < cols; c++) {
                        const float e = c < seen ? std::exp(s[c] - m[r]) : 0.0f;  // P~
                        sum += e;
                        s[c] = e * dropout_factor(p, bh, i0 + r, j0 + c);
                    }
                    l[r] = alpha * l[r] + sum;
                    for (int64_t d = 0; d < D; d++) Oi[r * D + d] *= alpha;
                }
                mm(false, false, rows, D, cols, 1.0f, S, Bc, Vp + j0 * D, D, 1.0f, Oi, D);  // O_i += P~ V_j
            }
            for (int64_t r = 0; r < rows; r++) {
                for (int64_t d = 0; d < D; d++) Oi[r * D + d] /= l[r];
                lse_bh[i0 + r] = m[r] + std::log(l[r]);
            }
        }
        scatter(O, Tq, D, head(o, bh, p, p.o_batch), p.ldo);
    });
}

template <typename T>
void flash_attention_backward(const T* q, const T* k, const T* v, const T* o, const float* lse, const T* dout, T* dq,
                              T* dk, T* dv, const AttentionParams& p) {
    check_params(p, "flash_attention_backward");
    const int64_t Tq = p.Tq, Tk = p.Tk, D = p.D, Br = kFlashBlockRows, Bc = kFlashBlockRows;
    for_each_pair(p, [&](int64_t bh) {
        const auto [Q, K, Vp] = gather_qkv(q, k, v, bh, p);
        float *dO = panel(3, Tq * D), *S = panel(4, Br * Bc), *dP = panel(5, Br * Bc), *delta = panel(6, Tq);
        float *dQ = panel(7, Tq * D), *dK = panel(8, Tk * D), *dV = panel(9, Tk * D), *O = panel(10, Tq * D);
        gather(head(dout, bh, p, p.o_batch), p.ldo, Tq, D, dO);
        gather(head(o, bh, p, p.o_batch), p.ldo, Tq, D, O);
        const float* lse_bh = lse + bh * Tq;
        for (int64_t i = 0; i < Tq; i++) {  // Δ_i = rowsum(dO_i ⊙ O_i)
            float s = 0.0f;
            for (int64_t d = 0; d < D; d++) s += dO[i * D + d] * O[i * D + d];
            delta[i] = s;
        }
        std::fill(dQ, dQ + Tq * D, 0.0f);
        std::fill(dK, dK + Tk * D, 0.0f);
        std::fill(dV, dV + Tk * D, 0.0f);
        for (int64_t j0 = 0; j0 < Tk; j0 += Bc) {
            const int64_t cols = std::min(Bc, Tk - j0);
            int64_t first_row = 0;  // the first query that sees key j0
            while (first_row < Tq && !attention_visible(p, first_row, j0)) first_row++;
            for (int64_t i0 = first_row / Br * Br; i0 < Tq; i0 += Br) {
                const int64_t rows = std::min(Br, Tq - i0);
                mm(false, true, rows, cols, D, p.scale, Q + i0 * D, D, K + j0 * D, D, 0.0f, S, Bc);  // scale·Q_i K_jᵀ
                mm(false, true, rows, cols, D, 1.0f, dO + i0 * D, D, Vp + j0 * D, D, 0.0f, dP, Bc);  // dO_i V_jᵀ
                for (int64_t r = 0; r < rows; r++) {
                    const int64_t i = i0 + r, seen = std::max<int64_t>(0, std::min(cols, attention_visible_keys(p, i) - j0));
                    float *s = S + r * Bc, *g = dP + r * Bc;
                    for (int64_t c = 0; c < cols; c++) {
                        const float pij = c < seen ? std::exp(s[c] - lse_bh[i]) : 0.0f;  // P, recomputed
                        const float z = dropout_factor(p, bh, i, j0 + c);
                        s[c] = pij * z;                      // Pd, for dV
                        g[c] = pij * (g[c] * z - delta[i]);  // dS = P ⊙ (dP − Δ_i)
                    }
                }
                mm(true, false, cols, D, rows, 1.0f, S, Bc, dO + i0 * D, D, 1.0f, dV + j0 * D, D);     // dV_j += Pdᵀ dO_i
                mm(false, false, rows, D, cols, p.scale, dP, Bc, K + j0 * D, D, 1.0f, dQ + i0 * D, D); // dQ_i += scale·dS K_j
                mm(true, false, cols, D, rows, p.scale, dP, Bc, Q + i0 * D, D, 1.0f, dK + j0 * D, D);  // dK_j += scale·dSᵀ Q_i
            }
        }
        scatter(dQ, Tq, D, head(dq, bh, p, p.q_batch), p.ldq);
        scatter(dK, Tk, D, head(dk, bh, p, p.k_batch), p.ldk);
        scatter(dV, Tk, D, head(dv, bh, p, p.v_batch), p.ldv);
    });
}

// ==== the KV cache ===============================================================================
template <typename T>
void kv_cache_write(const T* qkv, T* k, T* v, int64_t B, int64_t Tq, int64_t C, int64_t T_max, int64_t start) {
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < Tq; t++) {
            const T* row = qkv + (b * Tq + t) * 3 * C;
            std::copy(row + C, row + 2 * C, k + (b * T_max + start + t) * C);
            std::copy(row + 2 * C, row + 3 * C, v + (b * T_max + start + t) * C);
        }
}

KILN_ATTENTION_KERNELS(KILN_INSTANTIATE_FLOAT);

}  // namespace kiln::cpu
