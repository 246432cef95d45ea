// autocast.cpp — the policy table, the autocast scope and the casts ops make (see autocast.h).
#include "ops/autocast.h"

#include <unordered_map>

#include "core/allocator.h"
#include "ops/ops.h"

namespace kiln {

namespace {
// An overridden row's policy + 1, or 0: the table's (default_cast_policy, autocast.h).
int overrides[kNumAmpOps] = {};
thread_local AutocastScope* current = nullptr;
}  // namespace

CastPolicy cast_policy(AmpOp op) {
    const int o = overrides[int(op)];
    return o == 0 ? default_cast_policy(op) : CastPolicy(o - 1);
}

CastPolicyOverride::CastPolicyOverride(AmpOp op, CastPolicy policy) : op_(op), previous_(overrides[int(op)]) {
    overrides[int(op)] = int(policy) + 1;
}

CastPolicyOverride::~CastPolicyOverride() { overrides[int(op_)] = previous_; }

// Each weight's copy, by the address of the weight's bytes: a weight's value does not change
// inside a scope (the optimizer steps outside it). The weight itself is kept with its copy, so
// its address is not reused by another tensor while the scope lives.
struct AutocastScope::Copies {
    struct Entry {
        Tensor weight, copy;
    };
    std::unordered_map<const void*, Entry> by_weight;
};

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

AmpCast::AmpCast(AmpOp op, DType in, DType other)
    : dtype_(autocast_target(op, in, other)), casts_(current || cast_policy(op) == CastPolicy::Widest) {}

Tensor AmpCast::input(const Tensor& x) const { return casts_ && x.defined() ? x.to(dtype_) : x; }

Tensor AmpCast::weight(const Tensor& p) const {
    if (!current || !p.defined() || p.dtype() == dtype_) return p;
    auto& entry = current->copies_->by_weight[p.raw()];
    if (!entry.copy.defined()) {
        // From the pool even inside a step's arena scope: the copy outlives each micro-batch.
        AllocatorScope from_pool(pool_allocator(p.device()));
        entry.weight = p;
        entry.copy = Tensor::empty(p.shape(), dtype_, p.device(), Category::WeightCopy);
        convert_into(p, entry.copy);
    }
    // The same bytes seen as another shape, or a row overridden mid-scope: a copy not kept.
    if (entry.copy.shape() != p.shape() || entry.copy.dtype() != dtype_) return p.to(dtype_);
    return entry.copy;
}

GradInto::GradInto(Tensor& grad, const AmpCast& amp) : grad_(grad) {
    if (amp.casts() && grad.defined() && amp.dtype() != grad.dtype())
        low_ = Tensor::zeros(grad.shape(), amp.dtype(), grad.device(), Category::Gradient);
}

void GradInto::add_to_grad() {
    if (low_.defined()) axpy_(grad_, 1.0f, low_.to(grad_.dtype()));
}

}  // namespace kiln
