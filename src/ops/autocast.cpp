// autocast.cpp — the policy overrides, the autocast scope and the casts ops make (see autocast.h).
#include "ops/autocast.h"

#include <unordered_map>

#include "core/allocator.h"
#include "ops/ops.h"

namespace kiln {

namespace {
// An overridden class's policy + 1, or 0: the class's own.
constexpr int kNumClasses = int(CastPolicy::Input) + 1;
int overrides[kNumClasses] = {};
thread_local AutocastScope* current = nullptr;
}  // namespace

CastPolicy cast_policy(CastPolicy op_class) {
    const int o = overrides[int(op_class)];
    return o == 0 ? op_class : CastPolicy(o - 1);
}

CastPolicyOverride::CastPolicyOverride(CastPolicy op_class, CastPolicy policy)
    : class_(op_class), previous_(overrides[int(op_class)]) {
    overrides[int(op_class)] = int(policy) + 1;
}

CastPolicyOverride::~CastPolicyOverride() { overrides[int(class_)] = previous_; }

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

DType autocast_target(CastPolicy op_class, DType in, DType other) {
    const CastPolicy policy = cast_policy(op_class);
    if (policy == CastPolicy::Widest) return in == other ? in : DType::F32;  // f16 + bf16 too: f32 holds both
    if (!current) return in;
    switch (policy) {
        case CastPolicy::LowPrecision: return autocast_dtype();
        case CastPolicy::F32: return DType::F32;
        default: return in;
    }
}

AmpCast::AmpCast(CastPolicy op_class, DType in, DType other)
    : dtype_(autocast_target(op_class, in, other)), casts_(current || cast_policy(op_class) == CastPolicy::Widest) {}

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
    // The same bytes seen as another shape, or a class overridden mid-scope: a copy not kept.
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
