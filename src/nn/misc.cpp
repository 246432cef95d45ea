// misc.cpp — Dropout, Identity, GELU, Residual: the layers' checks (which name the layer), the caches, and
// the calls to the ops dropout, gelu and add (ops/elementwise.h; kernels in ops/cpu/elementwise.cpp
// and cuda/elementwise.cu).
#include "nn/misc.h"

#include "ops/elementwise.h"

namespace kiln {
// ---- Dropout ---------------------------------------------------------------------------------
Dropout::Dropout(float p_, uint64_t seed, std::string name) : Module(std::move(name)), p(p_), rng(seed) {
    KILN_CHECK(p >= 0.0f && p <= 1.0f, this->name(), ": drop probability ", p, " is outside [0, 1]");
}

Tensor Dropout::forward(const Tensor& x) {
    check_defined(x, name().c_str(), "the input");
    identity_ = !training() || p == 0.0f;
    if (identity_) return x;
    if (fixed_mask) rng.set_counter(0);
    const uint64_t first = rng.take(uint64_t(x.numel()));
    Tensor mask;
    Tensor y = dropout(x, p, rng.seed_hash(), first, &mask);
    if (keeps_cache()) mask_ = mask;
    return y;
}

Tensor Dropout::backward(const Tensor& dy) {
    check_defined(dy, name().c_str(), "dy");
    if (identity_) return dy;  // eval or p = 0: the identity, whose gradient is dy
    KILN_CHECK(mask_.defined(), name(), ": backward without a training-mode forward");
    KILN_CHECK(dy.shape() == mask_.shape(), name(), ": dy should be ", mask_.shape().str(), " but is ", dy.desc());
    check_on_device(dy, mask_.device(), name(), "dy");
    Tensor dx = dropout_backward(dy, mask_, p);
    mask_ = Tensor();
    return dx;
}

// y and a u8 mask kept; the identity when p = 0.
LayerMemory Dropout::memory(const Shape& in, Device) const {
    LayerMemory m;
    m.output = in;
    if (p == 0.0f) m.output_is_view = true;
    else m.saved.push_back(TensorSpec{in, DType::U8});
    return m;
}

// ---- GELU ----------------------------------------------------------------------------------------
// Nothing allocated: y is x, dx is dy.
LayerMemory Identity::memory(const Shape& in, Device) const {
    LayerMemory m;
    m.output = in;
    m.output_is_view = true;
    return m;
}

Tensor GELU::forward(const Tensor& x) {
    check_defined(x, name().c_str(), "the input");
    return gelu(x, keeps_cache() ? &x_ : nullptr);
}

Tensor GELU::backward(const Tensor& dy) {
    KILN_CHECK(x_.defined(), name(), ": backward without a training-mode forward");
    check_defined(dy, name().c_str(), "dy");
    KILN_CHECK(dy.shape() == x_.shape(), name(), ": dy should be ", x_.shape().str(), " but is ", dy.desc());
    check_on_device(dy, x_.device(), name(), "dy");
    Tensor dx = gelu_backward(x_, dy);
    x_ = Tensor();
    return dx;
}

// ---- Scale -----------------------------------------------------------------------------------------
Tensor Scale::forward(const Tensor& x) {
    check_defined(x, name().c_str(), "the input");
    Tensor y = x.clone();
    scale_(y, s_);
    return y;
}

Tensor Scale::backward(const Tensor& dy) {
    check_defined(dy, name().c_str(), "dy");
    Tensor dx = dy.clone();
    scale_(dx, s_);
    return dx;
}

// ---- Residual ------------------------------------------------------------------------------------
Residual::Residual(std::unique_ptr<Module> f, std::unique_ptr<Module> shortcut, std::string name)
    : Module(std::move(name)) {
    KILN_CHECK(f != nullptr, this->name(), ": the residual body f must not be null");
    add_child("body", std::move(f));
    if (shortcut) add_child("shortcut", std::move(shortcut));
}

Tensor Residual::forward(const Tensor& x) {
    Module* s = shortcut();
    Tensor fx = body().call(x);
    Tensor sx = s ? s->call(x) : x;
    KILN_CHECK(fx.shape() == sx.shape(), name(), ": f(x) is ", fx.desc(), " but the shortcut gives ", sx.desc(),
               s ? "" : " (the identity): give a shortcut (e.g. a 1×1 Conv2d) that changes the shape too");
    return add(fx, sx);  // y = f(x) + shortcut(x) (of two types under autocast: in the wider)
}

Tensor Residual::backward(const Tensor& dy) {
    // Both paths read dy; a new tensor holds the sum, so neither path's result is modified. Each
    // path's call_backward gives it dy in its output's type and returns its dx in x's type; the
    // identity's dx is dy itself, in x's type too.
    Module* s = shortcut();
    Tensor dfx = body().call_backward(dy);
    Tensor dsx = s ? s->call_backward(dy) : dy.to(dfx.dtype());
    return add(dfx, dsx);  // dx = df/dx·dy + dshortcut/dx·dy
}

}  // namespace kiln
