// gpt.cpp — nanoGPT's GPT on kiln's layers, and generation (see gpt.h).
#include "nn/gpt.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "ops/ops.h"

namespace kiln {

// ---- Embedding ---------------------------------------------------------------------------------
Embedding::Embedding(int64_t num, int64_t dim_, std::string name)
    : Module(std::move(name)), num_embeddings(num), dim(dim_) {
    KILN_CHECK(num > 0 && dim_ > 0, "Embedding(", num, ", ", dim_, "): sizes must be positive");
    add_parameter("weight", weight, Tensor::zeros({num, dim_}, DType::F32, Device::CPU, Category::Parameter));
}

Tensor Embedding::forward(const Tensor& ids) {
    check_defined(ids, name().c_str(), "the ids");
    check_on_device(weight.value, ids.device(), name(), "its weight");
    if (keeps_cache()) ids_ = ids;
    return embedding(ids, weight.used());
}

Tensor Embedding::backward(const Tensor& dy) {
    KILN_CHECK(ids_.defined(), name(), ": backward without a training-mode forward");
    embedding_backward(ids_, dy, weight.grad);
    ids_ = Tensor();
    return Tensor();  // ids have no gradient
}

LayerMemory Embedding::memory(const Shape& in, Device device) const {
    KILN_CHECK(in.ndim >= 1 && in.ndim < Shape::kMaxDims, name(), ": ids should be [...], got ", in.str());
    LayerMemory m;
    m.output = in;
    m.output.dims[m.output.ndim++] = dim;
    m.parameters.push_back(Shape{num_embeddings, dim});
    m.keeps_input = true;
    if (device == Device::CUDA) m.forward_workspace = m.backward_workspace = 8;  // the ids' check
    return m;
}

// ---- the attention op --------------------------------------------------------------------------
CausalAttention::CausalAttention(int64_t heads, AttentionKind k, float p, uint64_t seed, std::string name)
    : Module(std::move(name)), n_head(heads), kind(k), dropout(p), rng(seed) {
    KILN_CHECK(p >= 0.0f && p < 1.0f, this->name(), ": dropout ", p, " is outside [0, 1)");
}

Tensor CausalAttention::forward(const Tensor& qkv) {
    check_defined(qkv, name().c_str(), "qkv");
    drop_ = AttentionDropout{};
    if (training() && dropout > 0.0f) {  // the coins of every (b, h, i, j), reserved at once
        const uint64_t n = uint64_t(qkv.size(0) * n_head * qkv.size(1) * qkv.size(1));
        drop_ = AttentionDropout{dropout, rng.seed_hash(), rng.take(n)};
    }
    Tensor saved;
    Tensor y = causal_self_attention(qkv, n_head, kind, drop_, &saved);
    if (keeps_cache()) qkv_ = qkv, y_ = y, saved_ = saved;
    return y;
}

Tensor CausalAttention::backward(const Tensor& dy) {
    KILN_CHECK(qkv_.defined(), name(), ": backward without a training-mode forward");
    Tensor dqkv = causal_self_attention_backward(qkv_, y_, saved_, dy, n_head, kind, drop_);
    qkv_ = y_ = saved_ = Tensor();
    return dqkv;
}

LayerMemory CausalAttention::memory(const Shape& in, Device device) const {
    KILN_CHECK(in.ndim == 3 && in[2] % (3 * n_head) == 0, name(), ": expected qkv [B, T, 3C] with C a multiple of ",
               n_head, " heads, got ", in.str());
    const int64_t B = in[0], T = in[1], C = in[2] / 3;
    LayerMemory m;
    m.output = Shape{B, T, C};
    m.keeps_input = m.keeps_output = true;
    const bool textbook = kind == AttentionKind::Textbook;
    m.saved.push_back(textbook ? TensorSpec{Shape{B, n_head, T, T}, DType::F32} : TensorSpec{Shape{B, n_head, T}, DType::F32});
    if (device == Device::CUDA) m.backward_workspace = 4 * B * n_head * T * (textbook ? T : 1);  // dS, or Δ
    return m;
}

// ---- the sub-layers ------------------------------------------------------------------------------
CausalSelfAttention::CausalSelfAttention(const GPTConfig& c, Rng& seeds, std::string name) : Sequential(std::move(name)) {
    KILN_CHECK(c.n_embd % c.n_head == 0, "GPT: n_embd ", c.n_embd, " is not a multiple of n_head ", c.n_head);
    add("c_attn", std::make_unique<Linear>(c.n_embd, 3 * c.n_embd, seeds, true, "c_attn"));
    add("sdpa", std::make_unique<CausalAttention>(c.n_head, c.attention, c.dropout, seeds.next_u64()));
    add("c_proj", std::make_unique<Linear>(c.n_embd, c.n_embd, seeds, true, "c_proj"));
    add("resid_dropout", std::make_unique<Dropout>(c.dropout, seeds.next_u64(), "resid_dropout"));
}

MLP::MLP(const GPTConfig& c, Rng& seeds, std::string name) : Sequential(std::move(name)) {
    add("c_fc", std::make_unique<Linear>(c.n_embd, 4 * c.n_embd, seeds, true, "c_fc"));
    add("gelu", std::make_unique<GELU>());
    add("c_proj", std::make_unique<Linear>(4 * c.n_embd, c.n_embd, seeds, true, "c_proj"));
    add("dropout", std::make_unique<Dropout>(c.dropout, seeds.next_u64(), "dropout"));
}

// ---- Block ---------------------------------------------------------------------------------------
Block::Block(const GPTConfig& c, Rng& seeds, std::string name) : Module(std::move(name)), recompute(c.recompute) {
    add_child("ln_1", std::make_unique<LayerNorm>(c.n_embd, "ln_1"));
    add_child("attn", std::make_unique<CausalSelfAttention>(c, seeds));
    add_child("ln_2", std::make_unique<LayerNorm>(c.n_embd, "ln_2"));
    add_child("mlp", std::make_unique<MLP>(c, seeds));
}

// Written one call a statement, so that each intermediate is let go as soon as the next layer has
// it (a nested call's result would live to the end of its whole expression): what chapter 08's
// memory model replays (train/memory_model.cpp).
Tensor Block::body(const Tensor& x) {
    Tensor x1;
    {
        Tensor h = ln_1().call(x);
        h = attn().call(h);
        x1 = add(x, h);  // x + attn(ln_1(x))
    }
    Tensor h = ln_2().call(x1);
    h = mlp().call(h);
    return add(x1, h);   // x1 + mlp(ln_2(x1))
}

Tensor Block::forward(const Tensor& x) {
    check_defined(x, name().c_str(), "the input");
    if (!recompute || !keeps_cache()) return body(x);
    recomputation_.first_forward(*this);
    x_ = x;
    NoGradScope no_grad;  // the children keep nothing
    return body(x);
}

Tensor Block::backward(const Tensor& dy) {
    if (recompute) {
        KILN_CHECK(x_.defined(), name(), ": backward without a training-mode forward");
        recomputation_.recompute(*this, [&] { body(x_); });  // the children's caches, as the first forward made them
        x_ = Tensor();
    }
    Tensor dx1;
    {
        Tensor g = mlp().call_backward(dy);
        g = ln_2().call_backward(g);
        dx1 = add(dy, g);  // dL/dx1: the residual's dy and the branch's
    }
    Tensor g = attn().call_backward(dx1);
    g = ln_1().call_backward(g);
    return add(dx1, g);    // dL/dx
}

// ---- Transformer -------------------------------------------------------------------------------
Transformer::Transformer(const GPTConfig& c, Rng& seeds, std::string name)
    : Module(std::move(name)), block_size(c.block_size) {
    KILN_CHECK(c.vocab_size > 0 && c.block_size > 0 && c.n_layer > 0 && c.n_head > 0 && c.n_embd > 0,
               "GPT: vocab_size ", c.vocab_size, ", block_size ", c.block_size, ", n_layer ", c.n_layer, ", n_head ",
               c.n_head, " and n_embd ", c.n_embd, " must all be positive");
    add_child("wte", std::make_unique<Embedding>(c.vocab_size, c.n_embd, "wte"));
    add_child("wpe", std::make_unique<Embedding>(c.block_size, c.n_embd, "wpe"));
    add_child("drop", std::make_unique<Dropout>(c.dropout, seeds.next_u64(), "drop"));
    auto h = std::make_unique<Sequential>("h");
    for (int64_t l = 0; l < c.n_layer; l++) h->add(std::make_unique<Block>(c, seeds, std::to_string(l)));
    add_child("h", std::move(h));
    add_child("ln_f", std::make_unique<LayerNorm>(c.n_embd, "ln_f"));
}

Tensor Transformer::forward(const Tensor& idx) {
    check_defined(idx, name().c_str(), "the token ids");
    KILN_CHECK(idx.ndim() == 2 && idx.dtype() == DType::I32, name(), ": expected token ids i32 [B, T], got ",
               idx.desc());
    const int64_t B = idx.size(0), T = idx.size(1);
    KILN_CHECK(T <= block_size, name(), ": a sequence of ", T, " tokens is longer than the block size ", block_size,
               " (the position embedding has ", block_size, " rows)");
    B_ = B, T_ = T;
    const Tensor positions = Tensor::arange(T, DType::I32, idx.device());  // 0 .. T − 1
    Tensor x = wte().call(idx);                                              // [B, T, C]
    {
        Tensor rows = x.reshape({B, -1});
        const Tensor pos = wpe().call(positions);  // [T, C]
        add_bias_(rows, pos.reshape({-1}));         // + wpe[t] on every sequence, in place
    }
    x = drop().call(x);
    x = h().call(x);
    return ln_f().call(x);
}

Tensor Transformer::backward(const Tensor& dy) {
    Tensor g = ln_f().call_backward(dy);
    g = h().call_backward(g);
    g = drop().call_backward(g);
    const int64_t C = g.size(-1);
    {
        Tensor dpos = Tensor::empty({T_ * C}, g.dtype(), g.device(), Category::Activation);
        sum_rows_into(g.reshape({B_, T_ * C}), dpos);  // dL/dwpe[t] = Σ_b dL/dx[b, t]
        wpe().call_backward(dpos.reshape({T_, C}));
    }
    wte().call_backward(g);
    return Tensor();  // the ids have no gradient
}

// ---- LMHead ------------------------------------------------------------------------------------
LMHead::LMHead(Embedding& tied, std::string name) : Module(std::move(name)), tied_(tied) {}

Tensor LMHead::forward(const Tensor& x) {
    check_defined(x, name().c_str(), "the input");
    KILN_CHECK(x.ndim() >= 2 && x.size(-1) == tied_.dim, name(), ": expected [..., ", tied_.dim, "], got ", x.desc());
    if (keeps_cache()) in_shape_ = x.shape();
    return linear(x.reshape({-1, tied_.dim}), tied_.weight.used(), Tensor(), keeps_cache() ? &x_ : nullptr);
}

Tensor LMHead::backward(const Tensor& dy) {
    KILN_CHECK(x_.defined(), name(), ": backward without a training-mode forward");
    Tensor no_bias;
    const Tensor dx = linear_backward(std::move(x_), tied_.weight.used(), dy, tied_.weight.grad, no_bias, input_needs_grad);
    return dx.defined() ? dx.reshape(in_shape_) : dx;
}

LayerMemory LMHead::memory(const Shape& in, Device) const {
    KILN_CHECK(in.ndim >= 2 && in[in.ndim - 1] == tied_.dim, name(), ": expected [..., ", tied_.dim, "], got ",
               in.str());
    LayerMemory m;
    m.output = Shape{in.numel() / tied_.dim, tied_.num_embeddings};
    m.keeps_input = true;
    m.releases_before_dx = true;
    return m;
}

// ---- GPT -------------------------------------------------------------------------------------------
GPT::GPT(const GPTConfig& c, uint64_t seed) : Sequential("gpt"), config(c) {
    Rng seeds(seed ^ 0x5eed5eed5eed5eedull);  // the layers' own streams (dropout); the weights below
    add("transformer", std::make_unique<Transformer>(c, seeds));
    add("lm_head", std::make_unique<LMHead>(transformer().wte()));
}

std::unique_ptr<GPT> make_gpt(const GPTConfig& c, uint64_t seed) {
    auto model = std::make_unique<GPT>(c, seed);
    // nanoGPT's _init_weights and its c_proj rule, in named_parameters order from one stream
    Rng rng(seed);
    const float residual_std = 0.02f / std::sqrt(2.0f * float(c.n_layer));
    const auto ends_with = [](const std::string& s, const std::string& tail) {
        return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
    };
    for (auto& [name, p] : model->named_parameters()) {
        const bool weight = ends_with(name, ".weight");
        if (p->value.ndim() == 2) {
            const bool residual = ends_with(name, "c_proj.weight");
            p->value.copy_from(Tensor::normal(p->value.shape(), 0.0f, residual ? residual_std : 0.02f, rng));
        } else {
            fill_(p->value, weight ? 1.0f : 0.0f);  // layer norms' weights 1; every bias 0
        }
    }
    model->pack();
    return model;
}

int64_t gpt_num_params(GPT& model, bool non_embedding) {
    int64_t n = model.num_parameters();
    if (non_embedding) n -= model.transformer().wpe().weight.value.numel();
    return n;
}

// ---- generation ------------------------------------------------------------------------------------
int64_t KVCache::bytes() const {
    int64_t n = 0;
    for (const std::vector<Tensor>* list : {&k, &v})
        for (const Tensor& t : *list) n += int64_t(t.nbytes());
    return n;
}

int32_t sample_token(const float* logits, int64_t V, const SampleOptions& o, Rng& rng) {
    KILN_CHECK(o.temperature > 0.0f, "sampling: the temperature must be positive, got ", o.temperature);
    std::vector<float> z(logits, logits + V);
    for (float& v : z) v /= o.temperature;
    if (o.top_k > 0 && o.top_k < V) {  // keep the top_k largest (and any equal to the k-th), as torch.topk
        std::vector<float> sorted = z;
        std::nth_element(sorted.begin(), sorted.begin() + (o.top_k - 1), sorted.end(), std::greater<float>());
        const float kth = sorted[size_t(o.top_k - 1)];
        for (float& v : z)
            if (v < kth) v = -std::numeric_limits<float>::infinity();
    }
    // softmax, then the first id whose cumulative probability passes u ~ U[0, 1)
    const float m = *std::max_element(z.begin(), z.end());
    double total = 0.0;
    std::vector<double> p(static_cast<size_t>(V));
    for (int64_t i = 0; i < V; i++) {
        p[size_t(i)] = std::exp(double(z[size_t(i)] - m));
        total += p[size_t(i)];
    }
    const double u = double(Rng::to_unit(rng.next_u64())) * total;
    double acc = 0.0;
    for (int64_t i = 0; i < V; i++) {
        acc += p[size_t(i)];
        if (u < acc) return int32_t(i);
    }
    return int32_t(std::max_element(p.begin(), p.end()) - p.begin());  // u rounded up to the total
}

namespace {

// ids [1, n] on `device`.
Tensor id_tensor(const int32_t* ids, int64_t n, Device device) {
    Tensor t = Tensor::empty({1, n}, DType::I32);
    std::copy(ids, ids + n, t.data<int32_t>());
    return t.to(device);
}

// The positions start .. start + n − 1, i32 [n] on `device`.
Tensor position_ids(int64_t start, int64_t n, Device device) {
    Tensor t = Tensor::empty({n}, DType::I32);
    for (int64_t i = 0; i < n; i++) t.data<int32_t>()[i] = int32_t(start + i);
    return t.to(device);
}

// The last row of logits [rows, V], on the host.
std::vector<float> last_row(const Tensor& logits) {
    const Tensor h = logits.to(Device::CPU).to(DType::F32);
    const int64_t V = h.size(-1);
    const float* last = h.data<float>() + h.numel() - V;
    return std::vector<float>(last, last + V);
}

}  // namespace

// Each block's part of a step with the cache (the residual steps of
// Block::body, with the attention reading and extending the cache).
Tensor forward_cached(GPT& model, const Tensor& ids, KVCache& cache) {
    Transformer& tr = model.transformer();
    const GPTConfig& c = model.config;
    const int64_t B = ids.size(0), Tq = ids.size(1), start = cache.length;
    KILN_CHECK(start + Tq <= c.block_size, "forward_cached: positions up to ", start + Tq - 1,
               " are past the block size ", c.block_size);
    NoGradScope no_grad;
    Tensor x = tr.wte().call(ids);
    Tensor rows = x.reshape({B, -1});
    add_bias_(rows, tr.wpe().call(position_ids(start, Tq, ids.device())).reshape({-1}));  // + wpe[start + t]
    for (size_t l = 0; l < tr.h().size(); l++) {
        Block& block = static_cast<Block&>(tr.h()[l]);
        CausalSelfAttention& attn = block.attn();
        const Tensor qkv = attn.c_attn().call(block.ln_1().call(x));
        const Tensor y = cached_attention(qkv, cache.k[l], cache.v[l], start, c.n_head);
        x = add(x, attn.c_proj().call(y));
        x = add(x, block.mlp().call(block.ln_2().call(x)));
    }
    cache.length = start + Tq;
    return model[1].call(tr.ln_f().call(x)).reshape({B, Tq, -1});
}

std::vector<int32_t> generate(GPT& model, const std::vector<int32_t>& prompt, int64_t n_new, const SampleOptions& o,
                              Rng& rng, int64_t* cache_bytes) {
    KILN_CHECK(!prompt.empty(), "generate: the prompt must hold at least one token");
    const GPTConfig& c = model.config;
    const Device device = model.transformer().wte().weight.value.device();
    const bool was_training = model.training();
    model.eval();
    NoGradScope no_grad;
    std::vector<int32_t> ids = prompt;
    KVCache cache;
    const auto refill = [&] {  // the cache made (again) from the last positions of the context
        const int64_t keep = std::min<int64_t>(int64_t(ids.size()), o.kv_cache && cache.length ? c.block_size / 2 : c.block_size);
        cache.length = 0;
        return forward_cached(model, id_tensor(ids.data() + ids.size() - keep, keep, device), cache);
    };
    Tensor logits;
    if (o.kv_cache) {
        // the caches' type: what cached_attention computes in on the model's f32 activations (f32,
        // or the type autocast gives it)
        const DType t = cached_attention_type(DType::F32);
        for (int64_t l = 0; l < c.n_layer; l++) {
            cache.k.push_back(Tensor::zeros({1, c.block_size, c.n_embd}, t, device, Category::Activation));
            cache.v.push_back(Tensor::zeros({1, c.block_size, c.n_embd}, t, device, Category::Activation));
        }
        if (cache_bytes) *cache_bytes = cache.bytes();
        logits = refill();
    }
    for (int64_t n = 0; n < n_new; n++) {
        if (!o.kv_cache) {  // the whole context again, at most its last block_size tokens
            const int64_t keep = std::min<int64_t>(int64_t(ids.size()), c.block_size);
            logits = model.call(id_tensor(ids.data() + ids.size() - keep, keep, device));
        }
        const std::vector<float> row = last_row(logits);
        ids.push_back(sample_token(row.data(), int64_t(row.size()), o, rng));
        if (o.kv_cache && n + 1 < n_new) {
            if (cache.length == c.block_size) logits = refill();  // full: start again from the last half
            else logits = forward_cached(model, id_tensor(&ids.back(), 1, device), cache);
        }
    }
    model.train(was_training);
    return ids;
}

}  // namespace kiln
