// attention.h — the operations of chapter 14's transformer on tensors: the embedding lookup, the
// softmax of rows and causal self-attention (textbook and FlashAttention-2). Like ops.h, each
// checks its arguments once (the error names the op and the tensor), takes its outputs from the
// current allocator and runs the kernel (ops/kernels/attention.h has the formulas) of the
// tensors' device. The layers of nn/gpt.h call these.
//
// Under autocast (ops/autocast.h): attention runs in the low type (its class is LowPrecision, as
// PyTorch's scaled_dot_product_attention is), softmax in f32; the embedding names no class and runs in
// its weight's type, as PyTorch's does.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace kiln {

// ---- embedding -----------------------------------------------------------------------------
// ids i32 [...] (each in [0, V)), weight [V, C] → y [..., C] in the weight's type: y[n] = weight[ids[n]].
Tensor embedding(const Tensor& ids, const Tensor& weight);
// dweight [V, C] += the rows of dy [..., C] scattered to their ids (a token seen twice adds twice).
void embedding_backward(const Tensor& ids, const Tensor& dy, Tensor& dweight);

// ---- softmax over the last dimension ---------------------------------------------------------
Tensor softmax(const Tensor& x);                            // y = exp(x − max) / Σ exp(x − max)
Tensor softmax_backward(const Tensor& y, const Tensor& dy);  // dx = y ⊙ (dy − Σ dy·y), from y

// ---- causal self-attention -------------------------------------------------------------------
// The two versions of the same function (ops/kernels/attention.h):
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
