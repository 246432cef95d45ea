// attention.h — the attention family (chapter 14's transformer): the embedding lookup, the softmax
// of rows, and causal self-attention in two versions (textbook and FlashAttention-2). The kernels'
// contract, declared once for both backends (core/backend.h; src/ops/cpu/attention.cpp ↔
// cuda/attention.cu), then the ops on tensors. Like ops.h, each op checks its arguments once (the
// error names the op and the tensor), takes its outputs from the current allocator and runs the
// kernel of the tensors' device. The layers of nn/gpt.h call these.
//
// Under autocast (ops/autocast.h): attention runs in the low type (its class is LowPrecision, as
// PyTorch's scaled_dot_product_attention is), softmax in f32; the embedding names no class and runs in
// its weight's type, as PyTorch's does.
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
#include "core/tensor.h"

namespace kiln {

// ==== the kernels =============================================================================
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

// ==== the ops on tensors ======================================================================
// ---- embedding -----------------------------------------------------------------------------
// ids i32 [...] (each in [0, V)), weight [V, C] → y [..., C] in the weight's type: y[n] = weight[ids[n]].
Tensor embedding(const Tensor& ids, const Tensor& weight);
// dweight [V, C] += the rows of dy [..., C] scattered to their ids (a token seen twice adds twice).
void embedding_backward(const Tensor& ids, const Tensor& dy, Tensor& dweight);

// ---- softmax over the last dimension ---------------------------------------------------------
Tensor softmax(const Tensor& x);                            // y = exp(x − max) / Σ exp(x − max)
Tensor softmax_backward(const Tensor& y, const Tensor& dy);  // dx = y ⊙ (dy − Σ dy·y), from y

// ---- causal self-attention -------------------------------------------------------------------
// The two versions of the same function (the kernels above):
//   Textbook  the T×T probabilities P [B, H, T, T] are computed, stored in qkv's type and kept
//   Flash     FlashAttention-2: tiles, an online softmax; only each row's log-sum-exp is kept,
//             f32 [B, H, T]
enum class AttentionKind { Textbook, Flash };
const char* attention_kind_name(AttentionKind kind);  // "textbook", "flash"

// Dropout of the attention probabilities (PyTorch's attn_dropout): probability p; element
// (b, h, i, j)'s coin is the counter-based stream's value first + ((b·H + h)·T + i)·T + j.
struct AttentionDropout {
    float p = 0.0f;
    uint64_t seed_hash = 0, first = 0;
};

// qkv [B, T, 3C] (a c_attn's output: q, k, v side by side, each C = heads·D wide) → y [B, T, C],
// each head attending to the positions up to its own. *saved receives what backward needs besides
// qkv and y: P (Textbook) or the log-sum-exp (Flash).
Tensor causal_self_attention(const Tensor& qkv, int64_t heads, AttentionKind kind, const AttentionDropout& dropout,
                             Tensor* saved);
// dqkv [B, T, 3C] from dy [B, T, C]; qkv, y and saved as the forward left them.
Tensor causal_self_attention_backward(const Tensor& qkv, const Tensor& y, const Tensor& saved, const Tensor& dy,
                                      int64_t heads, AttentionKind kind, const AttentionDropout& dropout);

// Generation with a KV cache, k_cache and v_cache [B, T_max, C] holding the keys and values of
// positions 0 .. start − 1: qkv [B, Tq, 3C] (the new positions' c_attn output) has its keys and
// values written into the caches at rows start .. start + Tq − 1, then its queries attend to all
// start + Tq positions (query t stands at position start + t). Returns y [B, Tq, C]: what
// causal_self_attention gives those positions, by FlashAttention's forward (no dropout:
// generation is evaluation).
Tensor cached_attention(const Tensor& qkv, Tensor& k_cache, Tensor& v_cache, int64_t start, int64_t heads);
// The type cached_attention computes in, and so the type of its caches, for qkv of type
// `qkv_type`: under autocast its class's (chapter 09), else qkv's own.
DType cached_attention_type(DType qkv_type);

}  // namespace kiln

// ==== the definitions =========================================================================
// Argument checks and the dispatch of the ops above.
#ifdef KILN_DEFINE_OPS  // compiled once, in src/ops/ops.cpp (see there)
#include "ops/autocast.h"
#include "ops/check.h"

namespace kiln {

// ---- embedding -----------------------------------------------------------------------------
namespace detail {

void check_embedding(const char* op, const Tensor& ids, const Tensor& weight) {
    check_dtype(ids, DType::I32, op, "ids");
    check_args(op, {{weight, "weight"}});
    check_same_device(ids, weight, op);
    KILN_CHECK(weight.ndim() == 2 && ids.ndim() >= 1 && ids.ndim() < Shape::kMaxDims, op,
               ": ids should be i32 [...] and weight [V, C], got ", ids.desc(), " and ", weight.desc());
}

// [..., C] for ids [...]
Shape with_channels(const Shape& ids, int64_t C) {
    Shape s = ids;
    s.dims[s.ndim++] = C;
    return s;
}

}  // namespace detail

Tensor embedding(const Tensor& ids, const Tensor& weight) {
    detail::check_embedding("embedding", ids, weight);
    const int64_t V = weight.size(0), C = weight.size(1);
    Tensor y =
        Tensor::empty(detail::with_channels(ids.shape(), C), weight.dtype(), weight.device(), Category::Activation);
    dispatch(weight.device(), weight.dtype(), [&](auto be, auto tag) {
        using T = decltype(tag);
        kernel::embedding_forward(be, ids.data<int32_t>(), weight.data<T>(), y.data<T>(), ids.numel(), V, C);
    });
    return y;
}

void embedding_backward(const Tensor& ids, const Tensor& dy, Tensor& dweight) {
    detail::check_embedding("embedding_backward", ids, dweight);
    const int64_t V = dweight.size(0), C = dweight.size(1);
    check_args("embedding_backward", {{dweight, "dweight"}, {dy, "dy"}});
    check_shape(dy, detail::with_channels(ids.shape(), C), "embedding_backward", "dy");
    dispatch(dweight.device(), dweight.dtype(), [&](auto be, auto tag) {
        using T = decltype(tag);
        kernel::embedding_backward(be, ids.data<int32_t>(), dy.data<T>(), dweight.data<T>(), ids.numel(), V, C);
    });
}

// ---- softmax -----------------------------------------------------------------------------------
Tensor softmax(const Tensor& x_in) {
    const Tensor x = AmpCast(CastPolicy::F32, x_in.dtype()).input(x_in);
    check_args("softmax", {{x, "x"}});
    KILN_CHECK(x.ndim() >= 1 && x.size(-1) > 0, "softmax: needs [..., C] with C > 0, got ", x.desc());
    Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device(), Category::Activation);
    const int64_t C = x.size(-1);
    dispatch(x.device(), x.dtype(), [&](auto be, auto tag) {
        using T = decltype(tag);
        kernel::softmax_forward(be, x.data<T>(), y.data<T>(), x.numel() / C, C);
    });
    return y;
}

Tensor softmax_backward(const Tensor& y_in, const Tensor& dy_in) {
    const AmpCast amp(CastPolicy::F32, y_in.dtype());
    const Tensor y = amp.input(y_in), dy = amp.input(dy_in);
    check_args("softmax_backward", {{y, "y"}, {dy, "dy"}});
    check_shape(dy, y.shape(), "softmax_backward", "dy");
    Tensor dx = Tensor::empty(y.shape(), y.dtype(), y.device(), Category::Activation);
    const int64_t C = y.size(-1);
    dispatch(y.device(), y.dtype(), [&](auto be, auto tag) {
        using T = decltype(tag);
        kernel::softmax_backward(be, y.data<T>(), dy.data<T>(), dx.data<T>(), y.numel() / C, C);
    });
    return dx;
}

// ---- causal self-attention -------------------------------------------------------------------
const char* attention_kind_name(AttentionKind kind) { return kind == AttentionKind::Flash ? "flash" : "textbook"; }

namespace detail {

// The sizes of qkv [B, T, 3C] with `heads` heads, checked.
AttentionParams packed_params(const char* op, const Tensor& qkv, int64_t heads, const AttentionDropout& drop) {
    KILN_CHECK(qkv.ndim() == 3 && qkv.size(2) % 3 == 0 && qkv.size(0) > 0 && qkv.size(1) > 0, op,
               ": qkv should be [B, T, 3C] (q, k and v side by side), got ", qkv.desc());
    const int64_t C = qkv.size(2) / 3;
    KILN_CHECK(heads > 0 && C % heads == 0, op, ": ", C, " channels do not split into ", heads,
               " heads (n_embd must be a multiple of n_head)");
    KILN_CHECK(drop.p >= 0.0f && drop.p < 1.0f, op, ": dropout probability ", drop.p, " is not in [0, 1)");
    AttentionParams p;
    p.B = qkv.size(0), p.H = heads, p.Tq = p.Tk = qkv.size(1), p.D = C / heads;
    p.ldq = p.ldk = p.ldv = 3 * C, p.ldo = C;
    p.q_batch = p.k_batch = p.v_batch = p.Tq * 3 * C, p.o_batch = p.Tq * C;
    p.scale = float(1.0 / std::sqrt(double(p.D)));
    p.dropout_p = drop.p, p.seed_hash = drop.seed_hash, p.first = drop.first;
    return p;
}

}  // namespace detail

Tensor causal_self_attention(const Tensor& qkv_in, int64_t heads, AttentionKind kind, const AttentionDropout& drop,
                             Tensor* saved) {
    const Tensor qkv = AmpCast(CastPolicy::LowPrecision, qkv_in.dtype()).input(qkv_in);
    check_args("causal_self_attention", {{qkv, "qkv"}});
    KILN_CHECK(saved != nullptr, "causal_self_attention: `saved` must be given (backward needs it)");
    const AttentionParams p = detail::packed_params("causal_self_attention", qkv, heads, drop);
    const int64_t C = p.H * p.D;
    Tensor y = Tensor::empty({p.B, p.Tq, C}, qkv.dtype(), qkv.device(), Category::Activation);
    if (kind == AttentionKind::Textbook)
        *saved = Tensor::empty({p.B, p.H, p.Tq, p.Tk}, qkv.dtype(), qkv.device(), Category::Activation);
    else
        *saved = Tensor::empty({p.B, p.H, p.Tq}, DType::F32, qkv.device(), Category::Activation);
    dispatch(qkv.device(), qkv.dtype(), [&](auto be, auto tag) {
        using T = decltype(tag);
        const T* q = qkv.data<T>();
        if (kind == AttentionKind::Textbook)
            kernel::attention_forward(be, q, q + C, q + 2 * C, y.data<T>(), saved->data<T>(), p);
        else
            kernel::flash_attention_forward(be, q, q + C, q + 2 * C, y.data<T>(), saved->data<float>(), p);
    });
    return y;
}

Tensor causal_self_attention_backward(const Tensor& qkv_in, const Tensor& y_in, const Tensor& saved,
                                      const Tensor& dy_in, int64_t heads, AttentionKind kind,
                                      const AttentionDropout& drop) {
    const AmpCast amp(CastPolicy::LowPrecision, qkv_in.dtype());
    const Tensor qkv = amp.input(qkv_in), y = amp.input(y_in), dy = amp.input(dy_in);
    check_args("causal_self_attention_backward", {{qkv, "qkv"}, {y, "y"}, {dy, "dy"}});
    const AttentionParams p = detail::packed_params("causal_self_attention_backward", qkv, heads, drop);
    const int64_t C = p.H * p.D;
    check_shape(y, Shape{p.B, p.Tq, C}, "causal_self_attention_backward", "y");
    check_shape(dy, Shape{p.B, p.Tq, C}, "causal_self_attention_backward", "dy");
    if (kind == AttentionKind::Textbook) {
        check_dtype(saved, qkv.dtype(), "causal_self_attention_backward", "saved (P)");
        check_shape(saved, Shape{p.B, p.H, p.Tq, p.Tk}, "causal_self_attention_backward", "saved (P)");
    } else {
        check_dtype(saved, DType::F32, "causal_self_attention_backward", "saved (lse)");
        check_shape(saved, Shape{p.B, p.H, p.Tq}, "causal_self_attention_backward", "saved (lse)");
    }
    check_same_device(qkv, saved, "causal_self_attention_backward");
    Tensor dqkv = Tensor::empty(qkv.shape(), qkv.dtype(), qkv.device(), Category::Activation);
    dispatch(qkv.device(), qkv.dtype(), [&](auto be, auto tag) {
        using T = decltype(tag);
        const T* q = qkv.data<T>();
        T* dq = dqkv.data<T>();
        if (kind == AttentionKind::Textbook)
            kernel::attention_backward(be, q, q + C, q + 2 * C, saved.data<T>(), dy.data<T>(), dq, dq + C, dq + 2 * C, p);
        else
            kernel::flash_attention_backward(be, q, q + C, q + 2 * C, y.data<T>(), saved.data<float>(), dy.data<T>(), dq,
                                             dq + C, dq + 2 * C, p);
    });
    return dqkv;
}

DType cached_attention_type(DType qkv_type) { return autocast_target(CastPolicy::LowPrecision, qkv_type); }

Tensor cached_attention(const Tensor& qkv_in, Tensor& k_cache, Tensor& v_cache, int64_t start, int64_t heads) {
    const Tensor qkv = AmpCast(CastPolicy::LowPrecision, qkv_in.dtype()).input(qkv_in);
    check_args("cached_attention", {{qkv, "qkv"}, {k_cache, "k_cache"}, {v_cache, "v_cache"}});
    KILN_CHECK(qkv.ndim() == 3 && qkv.size(2) % 3 == 0 && k_cache.ndim() == 3 && k_cache.shape() == v_cache.shape() &&
                   k_cache.size(0) == qkv.size(0) && 3 * k_cache.size(2) == qkv.size(2),
               "cached_attention: qkv should be [B, Tq, 3C] and both caches [B, T_max, C], got ", qkv.desc(), ", ",
               k_cache.desc(), ", ", v_cache.desc(), " (caches made in the type c_attn computes in)");
    const int64_t B = qkv.size(0), Tq = qkv.size(1), C = k_cache.size(2), Tmax = k_cache.size(1);
    KILN_CHECK(start >= 0 && start + Tq <= Tmax, "cached_attention: positions ", start, " .. ", start + Tq - 1,
               " do not fit in the cache's ", Tmax, " (the model's block_size)");
    KILN_CHECK(heads > 0 && C % heads == 0, "cached_attention: ", C, " channels do not split into ", heads, " heads");
    AttentionParams p;
    p.B = B, p.H = heads, p.Tq = Tq, p.Tk = start + Tq, p.D = C / heads;
    p.ldq = 3 * C, p.ldk = p.ldv = p.ldo = C;
    p.q_batch = Tq * 3 * C, p.o_batch = Tq * C, p.k_batch = p.v_batch = Tmax * C;
    p.scale = float(1.0 / std::sqrt(double(p.D)));
    Tensor y = Tensor::empty({B, Tq, C}, qkv.dtype(), qkv.device(), Category::Activation);
    Tensor lse = Tensor::empty({B, heads, Tq}, DType::F32, qkv.device(), Category::Workspace);
    dispatch(qkv.device(), qkv.dtype(), [&](auto be, auto tag) {
        using T = decltype(tag);
        T *k = k_cache.data<T>(), *v = v_cache.data<T>();
        kernel::kv_cache_write(be, qkv.data<T>(), k, v, B, Tq, C, Tmax, start);
        kernel::flash_attention_forward(be, qkv.data<T>(), k, v, y.data<T>(), lse.data<float>(), p);
    });
    return y;
}

}  // namespace kiln
#endif  // KILN_DEFINE_OPS
