// autocast.cpp — the policy table and the autocast scope (see autocast.h).
#include "ops/autocast.h"

#include <unordered_map>

#include "core/allocator.h"

#include "ops/ops.h"

namespace kiln {

// The table (autocast.h explains each row).
CastPolicy cast_policy(AmpOp op) {
    switch (op) {
        case AmpOp::Conv2d:
        case AmpOp::Linear: return CastPolicy::LowPrecision;
        case AmpOp::CrossEntropy:
        case AmpOp::LayerNorm: return CastPolicy::F32;
        case AmpOp::Add: return CastPolicy::Widest;
        case AmpOp::BatchNorm:
        case AmpOp::Pool:
        case AmpOp::Activation:
        case AmpOp::Dropout: return CastPolicy::Input;
    }
    return CastPolicy::Input;
}

// Each weight's copy, by the address of the weight's bytes: a weight's value does not change
// inside a scope (the optimizer steps outside it).
struct AutocastScope::Copies {
    std::unordered_map<const void*, Tensor> by_weight;
};

namespace {
thread_local AutocastScope* current = nullptr;
}

AutocastScope::AutocastScope(DType low) : low_(low), copies_(std::make_unique<Copies>()), previous_(current) {
    KILN_CHECK(low == DType::F16 || low == DType::BF16, "AutocastScope: the low-precision type must be f16 or bf16, got ",
               dtype_name(low));
    current = this;
}

AutocastScope::~AutocastScope() { current = previous_; }

DType autocast_dtype() { return current ? current->low_ : DType::F32; }

DType autocast_target(AmpOp op, DType in, DType other) {
    const CastPolicy policy = cast_policy(op);
    if (policy == CastPolicy::Widest) return in == other ? in : DType::F32;  // f16 + bf16 too: f32 holds both
    if (!current) return in;
    switch (policy) {
        case CastPolicy::LowPrecision: return autocast_dtype();
        case CastPolicy::F32: return DType::F32;
        default: return in;
    }
}

Tensor autocast(const Tensor& x, AmpOp op) {
    if (!current || !x.defined()) return x;
    return x.to(autocast_target(op, x.dtype()));
}

const Tensor& autocast_param(const Tensor& p) {
    if (!current || !p.defined() || p.dtype() == current->low_) return p;
    Tensor& copy = current->copies_->by_weight[p.raw()];
    if (!copy.defined()) {
        // From the pool even inside a step's arena scope: the copy outlives each micro-batch.
        AllocatorScope from_pool(pool_allocator(p.device()));
        copy = Tensor::empty(p.shape(), current->low_, p.device(), Category::AutocastCopy);
        convert_into(p, copy);
    }
    return copy;
}

LowGrad::LowGrad(Tensor& grad, const Tensor& used) : grad_(grad) {
    if (used.defined() && grad.defined() && used.dtype() != grad.dtype())
        low_ = Tensor::zeros(grad.shape(), used.dtype(), grad.device(), Category::Gradient);
}

void LowGrad::add_to_grad() {
    if (low_.defined()) axpy_(grad_, 1.0f, low_.to(grad_.dtype()));
}

}  // namespace kiln
