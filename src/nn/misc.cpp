// misc.cpp — Dropout, GELU, Residual. Kernels: ops/cpu/norm.cpp or cuda/norm.cu (GELU, dropout;
// the twins take the same arguments, so each call picks one by the input's device:
// (x.device() == Device::CUDA ? cuda::f : cpu::f)(arguments)), and ops.h's add (either device).
#include "nn/misc.h"

#include "ops/cpu/cnn_ops.h"
#include "ops/cuda_ops.h"
#include "ops/ops.h"

namespace kiln {
namespace {
void check_f32(const Tensor& t, const std::string& layer, const char* what) {
    check_defined(t, layer.c_str(), what);
    KILN_CHECK(t.dtype() == DType::F32, layer, ": ", what, " must be an f32 tensor, got ", t.desc());
}
}  // namespace

// ---- Dropout ---------------------------------------------------------------------------------
Dropout::Dropout(float p_, uint64_t seed, std::string name) : Module(std::move(name)), p(p_), rng(seed) {
    KILN_CHECK(p >= 0.0f && p <= 1.0f, this->name(), ": drop probability ", p, " is outside [0, 1]");
}

Tensor Dropout::forward(const Tensor& x) {
    check_f32(x, name(), "the input");
    identity_ = !training() || p == 0.0f;
    if (identity_) return x;
    if (fixed_mask) rng.set_counter(0);
    const uint64_t first = rng.take(uint64_t(x.numel()));
    Tensor y = Tensor::empty(x.shape(), DType::F32, x.device(), Category::Activation);
    Tensor mask = Tensor::empty(x.shape(), DType::U8, x.device(), Category::Activation);
    (x.device() == Device::CUDA ? cuda::dropout_forward : cpu::dropout_forward)(
        x.data<float>(), y.data<float>(), mask.data<uint8_t>(), x.numel(), p, rng.seed_hash(), first);
    mask_ = mask;
    return y;
}

Tensor Dropout::backward(const Tensor& dy) {
    check_f32(dy, name(), "dy");
    if (identity_) return dy;  // eval or p = 0: the identity, whose gradient is dy
    KILN_CHECK(mask_.defined(), name(), ": backward without a training-mode forward");
    KILN_CHECK(dy.shape() == mask_.shape(), name(), ": dy should be ", mask_.shape().str(), " but is ", dy.desc());
    check_on_device(dy, mask_.device(), name(), "dy");
    Tensor dx = Tensor::empty(dy.shape(), DType::F32, dy.device(), Category::Activation);
    (dy.device() == Device::CUDA ? cuda::dropout_backward : cpu::dropout_backward)(
        dy.data<float>(), mask_.data<uint8_t>(), dx.data<float>(), dy.numel(), p);
    mask_ = Tensor();
    return dx;
}

// ---- GELU ----------------------------------------------------------------------------------------
Tensor GELU::forward(const Tensor& x) {
    check_f32(x, name(), "the input");
    Tensor y = Tensor::empty(x.shape(), DType::F32, x.device(), Category::Activation);
    (x.device() == Device::CUDA ? cuda::gelu_forward : cpu::gelu_forward)(x.data<float>(), y.data<float>(), x.numel());
    if (training()) x_ = x;
    return y;
}

Tensor GELU::backward(const Tensor& dy) {
    KILN_CHECK(x_.defined(), name(), ": backward without a training-mode forward");
    check_f32(dy, name(), "dy");
    KILN_CHECK(dy.shape() == x_.shape(), name(), ": dy should be ", x_.shape().str(), " but is ", dy.desc());
    check_on_device(dy, x_.device(), name(), "dy");
    Tensor dx = Tensor::empty(dy.shape(), DType::F32, dy.device(), Category::Activation);
    (dy.device() == Device::CUDA ? cuda::gelu_backward : cpu::gelu_backward)(x_.data<float>(), dy.data<float>(),
                                                                             dx.data<float>(), dy.numel());
    x_ = Tensor();
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
    return add(fx, sx);  // y = f(x) + shortcut(x)
}

Tensor Residual::backward(const Tensor& dy) {
    // Both paths read dy; a new tensor holds the sum, so neither path's result is modified.
    Module* s = shortcut();
    Tensor dfx = body().call_backward(dy);
    Tensor dsx = s ? s->call_backward(dy) : dy;
    return add(dfx, dsx);  // dx = df/dx·dy + dshortcut/dx·dy
}

}  // namespace kiln
