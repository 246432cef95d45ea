// attention.cpp — argument checks and the dispatch of the ops in attention.h.
#include "ops/attention.h"

#include <cmath>

#include "ops/autocast.h"
#include "ops/check.h"
#include "ops/kernels/attention.h"

namespace kiln {

// ---- embedding -----------------------------------------------------------------------------
namespace {

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

}  // namespace

Tensor embedding(const Tensor& ids, const Tensor& weight) {
    check_embedding("embedding", ids, weight);
    const int64_t V = weight.size(0), C = weight.size(1);
    Tensor y = Tensor::empty(with_channels(ids.shape(), C), weight.dtype(), weight.device(), Category::Activation);
    dispatch(weight.device(), weight.dtype(), [&](auto be, auto tag) {
        using T = decltype(tag);
        kernel::embedding_forward(be, ids.data<int32_t>(), weight.data<T>(), y.data<T>(), ids.numel(), V, C);
    });
    return y;
}

void embedding_backward(const Tensor& ids, const Tensor& dy, Tensor& dweight) {
    check_embedding("embedding_backward", ids, dweight);
    const int64_t V = dweight.size(0), C = dweight.size(1);
    check_args("embedding_backward", {{dweight, "dweight"}, {dy, "dy"}});
    check_shape(dy, with_channels(ids.shape(), C), "embedding_backward", "dy");
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

namespace {

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

}  // namespace

Tensor causal_self_attention(const Tensor& qkv_in, int64_t heads, AttentionKind kind, const AttentionDropout& drop,
                             Tensor* saved) {
    const Tensor qkv = AmpCast(CastPolicy::LowPrecision, qkv_in.dtype()).input(qkv_in);
    check_args("causal_self_attention", {{qkv, "qkv"}});
    KILN_CHECK(saved != nullptr, "causal_self_attention: `saved` must be given (backward needs it)");
    const AttentionParams p = packed_params("causal_self_attention", qkv, heads, drop);
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
    const AttentionParams p = packed_params("causal_self_attention_backward", qkv, heads, drop);
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
