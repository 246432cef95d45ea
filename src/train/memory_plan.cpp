// memory_plan.cpp — the planner's arithmetic (memory_plan.h has the formulas and their sources).
#include "train/memory_plan.h"

#include <algorithm>
#include <cmath>

#include "core/allocator.h"
#include "core/error.h"
#include "io/svg.h"
#include "optim/offload.h"
#include "train/gpt_recipe.h"

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
    KILN_CHECK(o.fragmentation >= 0.0 && o.fragmentation < 1.0,
               "plan_memory: the fragmentation allowance is a fraction in [0, 1), not ", o.fragmentation);
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
    KILN_CHECK(t.ffn >= 0 && t.kv_heads >= 0 && (t.kv_heads == 0 || t.heads % t.kv_heads == 0),
               "plan_memory: the MLP width ", t.ffn, " must not be negative, and the ", t.kv_heads,
               " K/V heads must divide the ", t.heads, " query heads");
    KILN_CHECK(o.batch >= 1, "plan_memory: the micro-batch must be at least 1, not ", o.batch);
}

}  // namespace

const char* recompute_name(Recompute r) {
    switch (r) {
        case Recompute::None: return "none";
        case Recompute::Selective: return "selective";
        case Recompute::Full: return "full";
    }
    return "?";
}

// GPT2: 4h² + 4h + 2hf + f + 5h; LLaMA: 2h² + 2hg + 3hf + 2h (memory_plan.h)
int64_t layer_parameters(const TransformerShape& t) {
    const int64_t h = t.width, f = t.mlp_width(), g = t.kv_width();
    if (t.arch == Architecture::LLaMA) return 2 * h * h + 2 * h * g + 3 * h * f + 2 * h;
    return 4 * h * h + 4 * h + 2 * h * f + f + 5 * h;
}

// GPT2: L·layer + V·h + s·h + 2h; LLaMA: L·layer + 2·V·h + h
int64_t transformer_parameters(const TransformerShape& t) {
    const int64_t h = t.width, layers = t.layers * layer_parameters(t);
    if (t.arch == Architecture::LLaMA) return layers + 2 * t.vocab * h + h;
    return layers + t.vocab * h + t.context * h + 2 * h;
}

const std::vector<NamedTransformer>& named_transformers() {
    // {layers, width, heads, vocab, context, arch, ffn, kv_heads}, from each paper's table (the
    // LLaMA widths f from the released configurations)
    static const std::vector<NamedTransformer> models = {
        {"baby-gpt", {4, 128, 4, 83, 64}},  // chapter 14: nanoGPT's baby GPT on Moby-Dick's 83 characters
        {"gpt2", {12, 768, 12, 50257, 1024}},
        {"gpt2-medium", {24, 1024, 16, 50257, 1024}},
        {"gpt2-large", {36, 1280, 20, 50257, 1024}},
        {"gpt2-xl", {48, 1600, 25, 50257, 1024}},
        {"llama-7b", {32, 4096, 32, 32000, 2048, Architecture::LLaMA, 11008}},
        {"llama-13b", {40, 5120, 40, 32000, 2048, Architecture::LLaMA, 13824}},
        {"llama-2-70b", {80, 8192, 64, 32000, 4096, Architecture::LLaMA, 28672, 8}},
        {"gpt3-175b", {96, 12288, 96, 50257, 2048}},
    };
    return models;
}

const TransformerShape& named_transformer(const std::string& name) {
    std::string names;
    for (const NamedTransformer& m : named_transformers()) {
        if (m.name == name) return m.shape;
        names += (names.empty() ? "" : ", ") + m.name;
    }
    KILN_FAIL("no model named '", name, "': the planner knows ", names);
}

// kept e·s·b·(6h + 2g + 2f) (LLaMA 3f); scores e·a·s²·b (Flash 4·a·s·b);
// dropout 2·s·b·h + a·s²·b·(e + 1) (Flash 2·s·b·h); full recomputation e·s·b·h
int64_t layer_activation_bytes(const TransformerShape& t, int64_t batch, DType precision, Recompute recompute,
                               AttentionKind attention, bool dropout) {
    const int64_t e = element_bytes(precision), sb = t.context * batch, h = t.width;
    if (recompute == Recompute::Full) return e * sb * h;
    const int64_t mlp_tensors = t.arch == Architecture::LLaMA ? 3 : 2;
    int64_t bytes = e * sb * (6 * h + 2 * t.kv_width() + mlp_tensors * t.mlp_width());
    if (dropout) bytes += 2 * sb * h;
    if (recompute == Recompute::Selective) return bytes;
    const bool flash = attention == AttentionKind::Flash;
    const int64_t scores = t.heads * sb * (flash ? 1 : t.context);  // a·s·b, or a·s²·b
    if (flash) return bytes + 4 * scores;
    return bytes + e * scores + (dropout ? (e + 1) * scores : 0);
}

// e·s·b·h (the embedding's output) + e·s·b·h (the final norm's) + 4·s·b·V (the f32 logits)
int64_t head_activation_bytes(const TransformerShape& t, int64_t batch, DType precision) {
    const int64_t sb = t.context * batch;
    return 2 * element_bytes(precision) * sb * t.width + 4 * sb * t.vocab;
}

namespace {

// dL/dlogits and one MLP-wide gradient; with full recomputation one layer's activations (but its
// output); with stage 3 two layers' gathered parameters and one layer's full gradients
// (memory_plan.h)
int64_t temporary_bytes(const MemoryPlanOptions& o) {
    const TransformerShape& t = o.shape;
    if (t.layers == 0) return 0;
    const int64_t e = element_bytes(o.precision), sb = t.context * o.batch;
    int64_t bytes = 4 * sb * t.vocab + e * sb * t.mlp_width();
    if (o.recompute == Recompute::Full)  // less its output: the next layer keeps that as its input
        bytes += layer_activation_bytes(t, o.batch, o.precision, Recompute::None, o.attention, o.dropout) - e * sb * t.width;
    if (o.zero_stage == 3 && o.gpus > 1) bytes += 3 * e * layer_parameters(t);
    return bytes;
}

// What a caching allocator's rounding adds to a slab of `bytes` (none to no slab).
int64_t rounding(int64_t bytes) { return bytes > 0 ? int64_t(PoolAllocator::round_size(size_t(bytes))) - bytes : 0; }

}  // namespace

// Stage 1 shards the optimizer state, stage 2 the gradients too, stage 3 the parameters too.
// Fragmentation: each slab (parameters, gradients, each state slab, the masters) rounded up as
// PoolAllocator::round_size does, plus options.fragmentation of the rest.
MemoryPlan plan_memory(const MemoryPlanOptions& o) {
    check_options(o);
    const int64_t psi = o.parameters > 0 ? o.parameters : transformer_parameters(o.shape);
    const int64_t e = element_bytes(o.precision);
    const int64_t params = held(psi, o.gpus, o.zero_stage >= 3), grads = held(psi, o.gpus, o.zero_stage >= 2);
    const int64_t state = held(psi, o.gpus, o.zero_stage >= 1);
    const int64_t state_slabs = optimizer_bytes(o.precision, o.optimizer) / 4;  // f32 slabs
    MemoryPlan plan;
    plan.parameters = params * e;
    plan.gradients = grads * e;
    // Offloaded, the host holds the optimizer's slabs, the f32 master weights (in f32 training too:
    // the host's update writes them) and the gradients copied down, e bytes each.
    if (o.offload) plan.host = state * (4 * state_slabs + (mixed(o.precision) ? 0 : 4) + e);
    else plan.optimizer_state = state * 4 * state_slabs;
    if (o.shape.layers > 0) {
        const TransformerShape& t = o.shape;
        plan.activations = t.layers * layer_activation_bytes(t, o.batch, o.precision, o.recompute, o.attention, o.dropout) +
                           head_activation_bytes(t, o.batch, o.precision);
        plan.temporary = temporary_bytes(o);
    }
    int64_t slack = rounding(plan.parameters) + rounding(plan.gradients);
    if (!o.offload && state_slabs > 0) slack += state_slabs * rounding(state * 4);
    const int64_t rest = plan.total();
    plan.fragmentation = slack + int64_t(std::ceil(o.fragmentation * double(rest)));
    return plan;
}

// k·(N−1)·e·⌈Ψ/N⌉, k = 2 (stages 0–2) or 3 (stage 3)
int64_t communication_bytes(const MemoryPlanOptions& o) {
    check_options(o);
    const int64_t psi = o.parameters > 0 ? o.parameters : transformer_parameters(o.shape);
    const int64_t collectives = o.zero_stage == 3 ? 3 : 2;
    return collectives * (o.gpus - 1) * element_bytes(o.precision) * held(psi, o.gpus, true);
}

// e·Ψ, or e·⌈Ψ/N⌉ from stage 1 on
int64_t offload_bytes_each_way(const MemoryPlanOptions& o) {
    check_options(o);
    if (!o.offload) return 0;
    const int64_t psi = o.parameters > 0 ? o.parameters : transformer_parameters(o.shape);
    return element_bytes(o.precision) * held(psi, o.gpus, o.zero_stage >= 1);
}

MemoryPlanOptions gpt_plan_options(const GPTConfig& c, int64_t batch) {
    KILN_CHECK(c.dropout == 0.0f, "gpt_plan_options: the plan counts kiln's GPT without dropout, not dropout ", c.dropout);
    MemoryPlanOptions o;
    o.shape = {c.n_layer, c.n_embd, c.n_head, c.vocab_size, c.block_size};
    o.batch = batch;
    o.precision = DType::F32;
    o.optimizer = OptimizerKind::Adam;
    o.attention = c.attention;
    o.dropout = false;
    o.recompute = c.recompute ? Recompute::Full : Recompute::None;
    return o;
}

std::string stages_svg(MemoryPlanOptions o, int64_t max_gpus, const std::vector<MeasuredStage>& measured,
                       const std::string& title) {
    KILN_CHECK(max_gpus >= 2 && (max_gpus & (max_gpus - 1)) == 0, "stages_svg: max_gpus ", max_gpus,
               " should be a power of two, at least 2");
    const char* colours[4] = {"#7f7f7f", "#1f77b4", "#2ca02c", "#d62728"};
    std::vector<double> xs, lines[4];
    int64_t top = 0;
    for (int64_t n = 1; n <= max_gpus; n *= 2) {
        xs.push_back(std::log2(double(n)));
        for (int stage = 0; stage <= 3; stage++) {
            o.gpus = n, o.zero_stage = stage;
            lines[stage].push_back(double(plan_memory(o).total()));
            top = std::max(top, plan_memory(o).total());
        }
    }
    for (const MeasuredStage& m : measured) top = std::max(top, m.bytes);
    const bool gib = top >= (int64_t(1) << 30);
    const double unit = gib ? 1e9 : double(1 << 20);
    for (auto& line : lines)
        for (double& y : line) y /= unit;
    Svg svg(640, 400);
    Plot plot(svg, {80, 40, 520, 300}, {0, std::log2(double(max_gpus))}, {0, double(top) / unit * 1.05});
    plot.axes("log2 of the number of GPUs", gib ? "one GPU's memory (GB)" : "one GPU's memory (MiB)");
    for (int stage = 0; stage <= 3; stage++) svg.polyline(plot.points(xs, lines[stage]), colours[stage], 2);
    for (const MeasuredStage& m : measured) {
        KILN_CHECK(m.stage >= 0 && m.stage <= 3 && m.gpus >= 1, "stages_svg: a measured step of stage ", m.stage,
                   " on ", m.gpus, " GPUs");
        const Point c = plot.at(std::log2(double(m.gpus)), double(m.bytes) / unit);
        svg.rect({c.x - 5, c.y - 5, 10, 10}, colours[m.stage]);
    }
    plot.legend({{"stage 0", colours[0]}, {"stage 1", colours[1]}, {"stage 2", colours[2]}, {"stage 3", colours[3]}});
    svg.text({320, 24}, title, 14, Anchor::Middle);
    return svg.str();
}

// Doubling to the first batch that does not fit, then bisection: the total grows with b.
int64_t largest_batch(MemoryPlanOptions o, int64_t gpu_bytes) {
    const auto fits = [&](int64_t b) {
        o.batch = b;
        return plan_memory(o).total() <= gpu_bytes;
    };
    if (!fits(1)) return 0;
    int64_t lo = 1, hi = 2;
    while (fits(hi)) {
        lo = hi, hi *= 2;
        KILN_CHECK(hi <= (int64_t(1) << 40), "largest_batch: every batch up to 2^40 fits in ", gpu_bytes,
                   " bytes: give the model's shape, or the activations are not counted");
    }
    while (hi - lo > 1) {  // fits(lo), !fits(hi)
        const int64_t mid = lo + (hi - lo) / 2;
        (fits(mid) ? lo : hi) = mid;
    }
    return lo;
}

OffloadMeasured measure_gpt_offload(const GPTConfig& c, int64_t batch, bool overlapped_too) {
    OffloadMeasured m;
    MemoryPlanOptions o = gpt_plan_options(c, batch);
    m.resident = plan_memory(o);
    o.offload = true;
    m.offloaded = plan_memory(o);
    m.offloaded_bytes = measure_gpt_step(
        c, batch, c.block_size, Device::CUDA,
        [](GPT& model, const GPTRecipe& recipe) { return offload_optimizer(gpt_optimizer(model, recipe)); },
        [&](const Optimizer& opt) { m.host_bytes = static_cast<const OffloadedOptimizer&>(opt).host_stats().allocated; });
    if (overlapped_too)
        m.overlapped_bytes = measure_gpt_step(c, batch, c.block_size, Device::CUDA, [](GPT& model, const GPTRecipe& recipe) {
            return offload_optimizer(gpt_optimizer(model, recipe), model);
        });
    m.resident_bytes = measure_gpt_step(c, batch, c.block_size, Device::CUDA);
    return m;
}

}  // namespace kiln
