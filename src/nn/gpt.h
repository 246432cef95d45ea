// gpt.h — chapter 14's transformer: nanoGPT's GPT (Karpathy, 2022), a GPT-2 in miniature, built
// from kiln's layers with nanoGPT's module names, so that its state_dict keys are nanoGPT's
// ("transformer.h.0.attn.c_attn.weight").
//
//   idx [B, T] (token ids)
//    ├─ transformer.wte   token embedding [V, C]      ─┐ x = wte[idx] + wpe[0 .. T−1]   [B, T, C]
//    ├─ transformer.wpe   position embedding [T_max, C] ┘
//    ├─ transformer.drop  dropout
//    ├─ transformer.h.0 .. h.{L−1}   blocks, pre-LN:
//    │     x = x + attn(ln_1(x))      attn: c_attn [C → 3C], sdpa (causal, H heads), c_proj [C → C], dropout
//    │     x = x + mlp(ln_2(x))       mlp:  c_fc [C → 4C], GELU, c_proj [4C → C], dropout
//    ├─ transformer.ln_f  the last layer norm
//    └─ lm_head           logits = x · wteᵀ  [B·T, V]: weight tying (Press & Wolf, 2017) — the output
//                         layer is the token embedding read backwards, one matrix for both
//
// Letters: B sequences, T positions (T ≤ block_size), C = n_embd channels, H = n_head heads,
// D = C / H, V vocabulary, L = n_layer.
//
// Initialization (nanoGPT's _init_weights): every Linear and Embedding weight ~ N(0, 0.02), the
// residual projections (attn.c_proj, mlp.c_proj) ~ N(0, 0.02/√(2L)) — each block adds two terms to
// the residual stream, so its variance grows with 2L —, biases 0, layer norms 1 and 0. Drawn in
// named_parameters order from one counter-based Rng(seed) (core/rng.h: Tensor::normal).
//
// The sdpa child is the attention op itself (ops/attention.h), textbook or FlashAttention; it and
// the GELU and dropout children have no parameters, so they add no state_dict key. The one key
// nanoGPT's state_dict has and kiln's has not is lm_head.weight: the same tensor as
// transformer.wte.weight, which a safetensors file (PyTorch's save_model) also stores once.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/rng.h"
#include "nn/layers.h"
#include "nn/misc.h"
#include "nn/norm.h"
#include "nn/recompute.h"
#include "ops/attention.h"

namespace kiln {

struct GPTConfig {
    int64_t block_size = 64;   // T_max: the longest context (wpe's rows)
    int64_t vocab_size = 0;    // V
    int64_t n_layer = 4, n_head = 4, n_embd = 128;
    float dropout = 0.0f;      // embeddings, attention probabilities, residual branches
    AttentionKind attention = AttentionKind::Flash;
    bool recompute = false;    // each block keeps only its input and runs again in backward
};

// PyTorch's nn.Embedding(V, C): y[..., :] = weight[ids[...], :].   ids i32 [...] → y [..., C]
// backward: weight.grad[ids[n]] += dy[n] (a scatter-add); nothing flows to the ids.
class Embedding : public Module {
public:
    Embedding(int64_t num_embeddings, int64_t dim, std::string name = "embedding");
    Tensor forward(const Tensor& ids) override;
    Tensor backward(const Tensor& dy) override;
    // y [ids..., C]; keeps the ids; its parameter [V, C]; no dx. On CUDA the ids' check takes
    // 8 bytes of workspace in each pass (cuda/attention.cu).
    LayerMemory memory(const Shape& in, Device device) const override;

    Parameter weight;  // [V, C]
    int64_t num_embeddings, dim;

private:
    Tensor ids_;
};

// Causal self-attention on a packed qkv [B, T, 3C] → y [B, T, C] (ops/attention.h), with dropout
// p on the attention probabilities (its coins from its own Rng, drawn again in backward).
//   textbook: keeps qkv, y and P [B, H, T, T]           flash: keeps qkv, y and lse f32 [B, H, T]
class CausalAttention : public Module {
public:
    CausalAttention(int64_t n_head, AttentionKind kind, float dropout, uint64_t seed, std::string name = "sdpa");
    Tensor forward(const Tensor& qkv) override;
    Tensor backward(const Tensor& dy) override;
    // y [B, T, C]: 4·B·T·C bytes; keeps qkv (its input), y and P (4·B·H·T² bytes, textbook) or lse
    // (4·B·H·T, flash); dqkv [B, T, 3C] in backward, after a workspace on CUDA: textbook's dS
    // (4·B·H·T²), flash's Δ (4·B·H·T).
    LayerMemory memory(const Shape& in, Device device) const override;
    Rng* random_stream() override { return &rng; }

    int64_t n_head;
    AttentionKind kind;
    float dropout;
    Rng rng;

private:
    Tensor qkv_, y_, saved_;
    AttentionDropout drop_;  // this forward's coins
};

// nanoGPT's CausalSelfAttention: c_attn, the attention, c_proj, resid_dropout, in order.
class CausalSelfAttention : public Sequential {
public:
    CausalSelfAttention(const GPTConfig& c, Rng& seeds, std::string name = "attn");
    Linear& c_attn() { return static_cast<Linear&>((*this)[0]); }
    CausalAttention& sdpa() { return static_cast<CausalAttention&>((*this)[1]); }
    Linear& c_proj() { return static_cast<Linear&>((*this)[2]); }
};

// nanoGPT's MLP: c_fc [C → 4C], GELU, c_proj [4C → C], dropout.
class MLP : public Sequential {
public:
    MLP(const GPTConfig& c, Rng& seeds, std::string name = "mlp");
};

// A pre-LN transformer block (GPT-2's):
//   x1 = x + attn(ln_1(x))          y = x1 + mlp(ln_2(x1))
// backward, the residuals passing dy on unchanged:
//   dx1 = dy + ln_2'(mlp'(dy))      dx = dx1 + ln_1'(attn'(dx1))
// With recompute, forward keeps only x (its children keep nothing: a NoGradScope) and backward
// runs the block's forward again before its backward (nn/recompute.h's Recomputation: the same
// dropout coins), so the state_dict keys stay nanoGPT's.
class Block : public Module {
public:
    Block(const GPTConfig& c, Rng& seeds, std::string name);
    Tensor forward(const Tensor& x) override;
    Tensor backward(const Tensor& dy) override;

    LayerNorm& ln_1() { return static_cast<LayerNorm&>(child(0)); }
    CausalSelfAttention& attn() { return static_cast<CausalSelfAttention&>(child(1)); }
    LayerNorm& ln_2() { return static_cast<LayerNorm&>(child(2)); }
    MLP& mlp() { return static_cast<MLP&>(child(3)); }
    bool recompute;

private:
    Tensor x_;  // with recompute: the input, all the block keeps
    Recomputation recomputation_;
    Tensor body(const Tensor& x);  // the two residual steps, through the children's call()
};

// The GPT's trunk, nanoGPT's "transformer": wte, wpe, drop, h, ln_f.
//   forward: x = wte(idx) + wpe(0 .. T−1)   (the position rows added to every sequence, in place)
//            then drop, the blocks, ln_f
//   backward: dwpe = Σ_b dx[b] (sum_rows over the sequences), then wpe's and wte's scatter-adds
class Transformer : public Module {
public:
    Transformer(const GPTConfig& c, Rng& seeds, std::string name = "transformer");
    Tensor forward(const Tensor& idx) override;
    Tensor backward(const Tensor& dy) override;

    Embedding& wte() { return static_cast<Embedding&>(child(0)); }
    Embedding& wpe() { return static_cast<Embedding&>(child(1)); }
    Dropout& drop() { return static_cast<Dropout&>(child(2)); }
    Sequential& h() { return static_cast<Sequential&>(child(3)); }
    LayerNorm& ln_f() { return static_cast<LayerNorm&>(child(4)); }
    int64_t block_size;

private:
    int64_t B_ = 0, T_ = 0;
};

// logits [B·T, V] = x [B, T, C] · wteᵀ: the token embedding's weight, not a parameter of its own
// (weight tying). backward adds dL/dwte to the embedding's gradient and returns dx [B, T, C].
// Rows of the logits are positions (b, t) in order, as nanoGPT's logits.view(-1, V).
class LMHead : public Module {
public:
    LMHead(Embedding& tied, std::string name = "lm_head");
    Tensor forward(const Tensor& x) override;
    Tensor backward(const Tensor& dy) override;
    // logits [B·T, V]; keeps x; no parameter of its own; dx [B, T, C] after x is let go.
    LayerMemory memory(const Shape& in, Device device) const override;

private:
    Embedding& tied_;
    Tensor x_;
    Shape in_shape_;
};

class GPT : public Sequential {
public:
    GPT(const GPTConfig& c, uint64_t seed);
    Transformer& transformer() { return static_cast<Transformer&>((*this)[0]); }
    const GPTConfig config;
};

// The GPT of `c`, initialized from `seed` as nanoGPT initializes it (above), packed (module.h).
std::unique_ptr<GPT> make_gpt(const GPTConfig& c, uint64_t seed);

// The parameters in nanoGPT's count (its get_num_params: the position embedding not counted).
int64_t gpt_num_params(GPT& model, bool non_embedding = true);

// ---- generation ------------------------------------------------------------------------------
// nanoGPT's generate: for each new token, the logits of the last position divided by the
// temperature, all but the top_k largest (0: all) set to −∞, softmax, one id drawn from it with
// a uniform number of rng. Without a cache each token runs the whole context (at most block_size
// positions, the last ones) through the model again; with one (KVCache below) it runs only the
// new position, attending to the keys and values the cache kept of the earlier ones.
struct SampleOptions {
    float temperature = 1.0f;
    int64_t top_k = 0;
    bool kv_cache = true;
};

// Each block's keys and values of the positions so far: k, v [B, T_max, C] per layer, in the type
// the model computes them in. Memory: 2 · L · B · T_max · C elements.
struct KVCache {
    std::vector<Tensor> k, v;  // one per layer
    int64_t length = 0;        // positions filled
    int64_t bytes() const;
};

// The id drawn for one row of logits (a host f32 [V] row).
int32_t sample_token(const float* logits, int64_t V, const SampleOptions& o, Rng& rng);

// `prompt` (ids, at least one) followed by n_new drawn ids, on the model's device. With
// o.kv_cache and a context that outgrows block_size, the cache starts again from the last
// block_size / 2 positions. *cache_bytes (if not null) receives what the cache took.
std::vector<int32_t> generate(GPT& model, const std::vector<int32_t>& prompt, int64_t n_new, const SampleOptions& o,
                              Rng& rng, int64_t* cache_bytes = nullptr);

// One step of generation with a cache: ids [B, Tq] at positions cache.length .. + Tq − 1 through
// the model in evaluation, their keys and values appended to the cache; returns the logits of
// the last position, [B, V].
Tensor forward_cached(GPT& model, const Tensor& ids, KVCache& cache);

}  // namespace kiln
