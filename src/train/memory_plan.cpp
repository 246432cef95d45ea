// memory_plan.cpp — the planner's arithmetic (memory_plan.h has the formulas and their sources).
#include "train/memory_plan.h"

#include "core/error.h"

namespace kiln {

namespace {

bool mixed(DType precision) { return precision == DType::BF16 || precision == DType::F16; }

// Bytes an element of the parameters, the gradients and the activations: 4 in f32, 2 in 16 bits.
int64_t element_bytes(DType precision) { return mixed(precision) ? 2 : 4; }

// K, the optimizer's bytes a parameter: 4 per f32 state slab, plus 4 for the f32 master
// weights when the parameters are 16-bit.
int64_t optimizer_bytes(DType precision, OptimizerKind optimizer) {
    return 4 * int64_t(state_slabs(optimizer)) + (mixed(precision) ? 4 : 0);
}

// Elements a GPU holds of Ψ: all of them, or its shard ceil(Ψ/Nd) when the category is sharded.
int64_t held(int64_t psi, int64_t gpus, bool sharded) { return sharded ? (psi + gpus - 1) / gpus : psi; }

void check_options(const MemoryPlanOptions& o) {
    KILN_CHECK(o.gpus >= 1, "plan_memory: the number of GPUs must be at least 1, not ", o.gpus);
    KILN_CHECK(o.zero_stage >= 0 && o.zero_stage <= 3, "plan_memory: the ZeRO stage must be 0, 1, 2 or 3, not ",
               o.zero_stage);
    KILN_CHECK(o.precision == DType::F32 || mixed(o.precision), "plan_memory: the precision must be f32, bf16 or f16, not ",
               dtype_name(o.precision));
    KILN_CHECK(o.parameters >= 0, "plan_memory: the parameter count must not be negative, not ", o.parameters);
    const TransformerShape& t = o.shape;
    if (t.layers == 0) {
        KILN_CHECK(o.parameters > 0, "plan_memory: give a parameter count or a transformer shape (layers > 0)");
        return;
    }
    KILN_CHECK(t.layers > 0 && t.width > 0 && t.heads > 0 && t.vocab > 0 && t.context > 0,
               "plan_memory: the transformer shape's sizes must be positive: layers ", t.layers, ", width ", t.width,
               ", heads ", t.heads, ", vocab ", t.vocab, ", context ", t.context);
    KILN_CHECK(t.width % t.heads == 0, "plan_memory: ", t.heads, " heads do not divide the width ", t.width,
               "; choose heads that divide it");
    KILN_CHECK(o.batch >= 1, "plan_memory: the micro-batch must be at least 1, not ", o.batch);
}

}  // namespace

// L·(12h² + 13h) + V·h + s·h + 2h
int64_t transformer_parameters(const TransformerShape& t) {
    const int64_t h = t.width;
    return t.layers * (12 * h * h + 13 * h) + t.vocab * h + t.context * h + 2 * h;
}

// none: s·b·h·(16e + 2) + a·s²·b·(2e + 1); selective: s·b·h·(16e + 2); full: s·b·h·e
// (e = 2: 34·sbh + 5·a·s²·b, 34·sbh, 2·sbh)
int64_t layer_activation_bytes(const TransformerShape& t, int64_t batch, DType precision, Recompute recompute) {
    const int64_t e = element_bytes(precision), s = t.context, sbh = s * batch * t.width;
    const int64_t scores = t.heads * s * s * batch;
    switch (recompute) {
        case Recompute::None: return sbh * (16 * e + 2) + scores * (2 * e + 1);
        case Recompute::Selective: return sbh * (16 * e + 2);
        case Recompute::Full: return sbh * e;
    }
    return 0;
}

// Stage 1 shards the optimizer state, stage 2 the gradients too, stage 3 the parameters too.
MemoryPlan plan_memory(const MemoryPlanOptions& o) {
    check_options(o);
    const int64_t psi = o.parameters > 0 ? o.parameters : transformer_parameters(o.shape);
    MemoryPlan plan;
    plan.parameters = held(psi, o.gpus, o.zero_stage >= 3) * element_bytes(o.precision);
    plan.gradients = held(psi, o.gpus, o.zero_stage >= 2) * element_bytes(o.precision);
    plan.optimizer_state = held(psi, o.gpus, o.zero_stage >= 1) * optimizer_bytes(o.precision, o.optimizer);
    if (o.shape.layers > 0)
        plan.activations = o.shape.layers * layer_activation_bytes(o.shape, o.batch, o.precision, o.recompute);
    return plan;
}

}  // namespace kiln
