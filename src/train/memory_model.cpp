// memory_model.cpp — the replay of a training step on the layers' memory descriptions (see
// memory_model.h): simulated tensors with the real code's lifetimes, counted as the allocators
// count them.
#include "train/memory_model.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <set>

#include "nn/gpt.h"
#include "nn/layers.h"
#include "nn/misc.h"
#include "nn/recompute.h"
#include "optim/adam.h"

namespace kiln {

int state_slabs(OptimizerKind kind) {
    switch (kind) {
        case OptimizerKind::SGD: return 0;
        case OptimizerKind::SGDMomentum: return 1;
        case OptimizerKind::Adam: return 2;
        case OptimizerKind::AdamAMSGrad: return 3;
    }
    return 0;
}

OptimizerKind optimizer_kind(const Optimizer& wrapped) {
    const Optimizer& optimizer = wrapped.rule();  // under ZeRO-1, the optimizer it runs
    if (auto* sgd = dynamic_cast<const SGD*>(&optimizer))
        return sgd->options().momentum != 0.0f ? OptimizerKind::SGDMomentum : OptimizerKind::SGD;
    if (auto* adam = dynamic_cast<const Adam*>(&optimizer))
        return adam->options().amsgrad ? OptimizerKind::AdamAMSGrad : OptimizerKind::Adam;
    KILN_FAIL("optimizer_kind: an optimizer other than SGD, Adam and AdamW; give predict_memory the OptimizerKind "
              "with as many state slabs as it keeps per parameter");
}

MemoryModelOptions memory_model_options(Module& model, const Optimizer& optimizer, const Shape& input, Device device,
                                        bool arena, DType amp) {
    MemoryModelOptions o{input, optimizer_kind(optimizer), device, arena, amp};
    o.state_elements = optimizer.state_elements(model);  // ZeRO-1: this rank's share
    return o;
}

namespace {

constexpr int64_t kArenaAlign = 256;  // BumpAllocator: every tensor rounded up to this

// The bytes of a slab of these f32 shapes (make_slab, core/tensor.h): each tensor starts at a
// multiple of Slab::kAlign.
int64_t slab_bytes(const std::vector<Shape>& shapes) {
    const int64_t align = int64_t(Slab::kAlign);
    int64_t end = 0;
    for (const Shape& s : shapes) end = (end + align - 1) / align * align + s.numel() * 4;
    return end;
}

// One allocator as a step sees it: the bytes it counts in use, and their peak.
//   arena: round_up(bytes, 256), nothing cached (BumpAllocator)
//   pool:  PoolAllocator::round_size(bytes), and a freed block is cached and handed to a later
//          request of the same size class (≤ 1 MiB) or, above 1 MiB, to a request of at least
//          half its size (the smallest such block); the pool counts the block's whole size.
class AllocatorReplay {
public:
    explicit AllocatorReplay(bool arena) : arena_(arena) {}

    // The block a request of `bytes` gets; `cached`: it may come from the cache.
    int64_t take(int64_t bytes, bool cached) {
        int64_t block = arena_ ? (std::max<int64_t>(bytes, 1) + kArenaAlign - 1) / kArenaAlign * kArenaAlign
                               : int64_t(PoolAllocator::round_size(size_t(bytes)));
        auto it = free_.lower_bound(block);
        const bool small = block <= int64_t(PoolAllocator::kSmallMax);
        if (cached && !arena_ && it != free_.end() && (small ? *it == block : *it <= 2 * block)) {
            block = *it;
            free_.erase(it);
        }
        in_use += block;
        peak = std::max(peak, in_use);
        return block;
    }
    void give_back(int64_t block) {
        in_use -= block;
        if (!arena_) free_.insert(block);
    }

    int64_t in_use = 0, peak = 0;

private:
    bool arena_;
    std::multiset<int64_t> free_;  // the pool's cached blocks, by size
};

// A simulated tensor's storage: the block it holds and who allocated it. Shared like a Tensor's
// Storage: the block goes back when the last Buf to it goes.
struct HeldBlock {
    int64_t bytes;
    bool in_arena;
    Category category;
    const Module* module;
};
using Buf = std::shared_ptr<HeldBlock>;

struct Value {
    Buf buf;  // null: an undefined tensor (no one needs that dx)
    Shape shape;
};

// What a layer keeps between its forward and its backward.
struct LayerState {
    LayerMemory memory;
    Shape in;
    std::vector<Buf> cache;
};

// The optimizer state's slab: shaped like the parameters, or under ZeRO-1 (state_elements)
// one 1-D piece for each parameter that has any state on this rank.
std::vector<Shape> state_shapes(const std::vector<Shape>& params, const std::vector<int64_t>& pieces) {
    if (pieces.empty()) return params;
    KILN_CHECK(pieces.size() == params.size(), "predict_memory: ZeRO-1 pieces for ", pieces.size(),
               " parameters, but the model has ", params.size());
    std::vector<Shape> shapes;
    for (int64_t e : pieces)
        if (e > 0) shapes.push_back(Shape{e});
    return shapes;
}

class StepReplay {
public:
    explicit StepReplay(const MemoryModelOptions& o) : opt_(o) {}
    StepReplay(const StepReplay&) = delete;  // its blocks give themselves back to it
    StepReplay& operator=(const StepReplay&) = delete;

    // Before the step: the parameter and gradient slabs, the buffers, the data batch (fresh
    // blocks: the pool's cache is empty when the step starts).
    void allocate_resident(const std::vector<Shape>& params, const std::vector<Shape>& buffers) {
        resident_.push_back(alloc(slab_bytes(params), Category::Parameter, false));
        resident_.push_back(alloc(slab_bytes(params), Category::Gradient, false));
        for (const Shape& b : buffers) resident_.push_back(alloc(b.numel() * 4, Category::Parameter, false));
        x_ = Value{alloc(opt_.input.numel() * 4, Category::Data, false), opt_.input};
        const int64_t labels = opt_.labels.ndim ? opt_.labels.numel() : opt_.input[0];
        resident_.push_back(alloc(labels * 4, Category::Data, false));  // labels, i32 [N] (or [B, T])
    }

    // One train_step: forward, loss, backward, optimizer (its state slabs on the first step).
    void step(Module& model, const std::vector<Shape>& params) {
        in_scope_ = true;  // forward_backward's AllocatorScope
        Value logits = forward(model, x_);
        kept_after_forward();
        KILN_CHECK(logits.shape.ndim == 2, model.name(), ": the memory model needs logits [N, classes] for the loss, "
                   "but the model gives ", logits.shape.str());
        set_context(nullptr, Phase::Other);
        Buf dlogits = alloc(logits.shape.numel() * 4, Category::Activation, true);  // softmax_cross_entropy
        alloc(logits.shape[0] * 4, Category::Activation, true);  // count_correct's predictions, i32 [N], freed
        backward(model, Value{dlogits, logits.shape}, false);  // the step's input needs no gradient
        dlogits.reset();
        logits.buf.reset();
        in_scope_ = false;
        set_context(nullptr, Phase::Optimizer);
        // On the first step: from the pool's cache too (a 2 MiB slab may get a freed 4 MiB block)
        for (int i = int(state_.size()); i < state_slabs(opt_.optimizer); i++)
            state_.push_back(alloc(slab_bytes(state_shapes(params, opt_.state_elements)), Category::OptimizerState, true));
    }

    // Peaks from here on: the measured step.
    void reset_peak() {
        pool_.peak = pool_.in_use;
        arena_.peak = arena_.in_use;
        peak_ = pool_.in_use + arena_.in_use;
        resident_bytes_ = peak_;
    }

    const std::map<const Module*, LayerState>& layers() const { return layers_; }
    const std::map<const Module*, Shape>& outputs() const { return outputs_; }
    const std::map<const Module*, int64_t>& kept() const { return kept_; }
    const std::map<const Module*, int64_t>& workspace() const { return workspace_; }
    void fill(MemoryPrediction& p) const {
        p.resident = resident_bytes_;
        p.peak = peak_;
        p.peak_module = peak_module_;
        p.peak_phase = peak_phase_;
        p.pool_peak = pool_.peak;
        p.arena_peak = arena_.peak;
    }

private:
    // A tensor of `bytes`: inside forward_backward's scope from the arena when there is one
    // (all but the workspace, which ops/conv.h's conv2d takes from the pool even there), everything else
    // from the pool; `cached`: the pool may hand it a cached block.
    Buf alloc(int64_t bytes, Category c, bool cached) {
        const bool in_arena = opt_.arena && in_scope_ && c != Category::Workspace;
        AllocatorReplay& a = in_arena ? arena_ : pool_;
        const int64_t block = a.take(bytes, cached);
        if (c == Category::Workspace && module_) workspace_[module_] = std::max(workspace_[module_], block);
        const int64_t total = pool_.in_use + arena_.in_use;
        if (total > peak_) {
            peak_ = total;
            peak_module_ = module_ ? module_->name() : phase_ == Phase::Optimizer ? "optimizer" : "loss";
            peak_phase_ = phase_;
        }
        Buf b(new HeldBlock{block, in_arena, c, module_}, [this](HeldBlock* blk) {
            (blk->in_arena ? arena_ : pool_).give_back(blk->bytes);
            delete blk;
        });
        if (phase_ == Phase::Forward && c == Category::Activation) forward_allocs_.push_back(b);
        return b;
    }

    void set_context(const Module* m, Phase p) { module_ = m, phase_ = p; }

    // Module::call: the module's forward with it as the context (restored after).
    Value forward(Module& m, const Value& x) {
        const Module* outer = module_;
        const Phase outer_phase = phase_;
        set_context(&m, Phase::Forward);
        Value y = run_forward(m, x);
        outputs_[&m] = y.shape;
        set_context(outer, outer_phase);
        return y;
    }

    Value backward(Module& m, const Value& dy, bool need_dx) {
        const Module* outer = module_;
        const Phase outer_phase = phase_;
        set_context(&m, Phase::Backward);
        Value dx = run_backward(m, dy, need_dx);
        set_context(outer, outer_phase);
        return dx;
    }

    // A GPT block (nn/gpt.h, Block::body): x1 = x + attn(ln_1(x)), y = x1 + mlp(ln_2(x1)), one call
    // a statement; with recompute, the children run without caches and x is kept.
    Value block_forward(Block& b, const Value& x) {
        LayerState& s = layers_[&b];
        s.in = x.shape;
        const bool outer = no_grad_;
        if (b.recompute && !no_grad_) {
            s.cache = {x.buf};
            no_grad_ = true;
        }
        Value y = block_body(b, x);
        no_grad_ = outer;
        return y;
    }
    Value block_body(Block& b, const Value& x) {
        Value x1;
        {
            Value h = forward(b.ln_1(), x);
            h = forward(b.attn(), h);
            x1 = Value{alloc(x.shape.numel() * 4, Category::Activation, true), x.shape};  // add
        }
        Value h = forward(b.ln_2(), x1);
        h = forward(b.mlp(), h);
        return Value{alloc(x.shape.numel() * 4, Category::Activation, true), x.shape};  // add
    }

    // Block::backward: the body again first with recompute; then each branch, each residual's add.
    Value block_backward(Block& b, const Value& dy) {
        LayerState& s = layers_.at(&b);
        if (b.recompute) {
            forward_again(b, Value{s.cache.at(0), s.in});
            s.cache.clear();
        }
        Value dx1;
        {
            Value g = backward(b.mlp(), dy, true);
            g = backward(b.ln_2(), g, true);
            dx1 = Value{alloc(s.in.numel() * 4, Category::Activation, true), s.in};  // add
        }
        Value g = backward(b.attn(), dx1, true);
        g = backward(b.ln_1(), g, true);
        return Value{alloc(s.in.numel() * 4, Category::Activation, true), s.in};  // add
    }

    // The GPT's trunk (Transformer::forward): the positions (i32 [T]), wte's rows and wpe's added
    // in place (wpe's output let go at once), then drop, h, ln_f.
    Value transformer_forward(Transformer& t, const Value& idx) {
        LayerState& s = layers_[&t];
        s.in = idx.shape;
        const int64_t T = idx.shape[1];
        const Value positions{alloc(T * 4, Category::Other, true), Shape{T}};
        Value x = forward(t.wte(), idx);
        forward(t.wpe(), positions);
        x = forward(t.drop(), x);
        x = forward(t.h(), x);
        return forward(t.ln_f(), x);
    }

    // Transformer::backward: ln_f, h, drop, then dwpe = Σ_b dx (f32 [T·C]) and the two scatter-adds.
    Value transformer_backward(Transformer& t, const Value& dy) {
        const LayerState& s = layers_.at(&t);
        Value g = backward(t.ln_f(), dy, true);
        g = backward(t.h(), g, true);
        g = backward(t.drop(), g, true);
        {
            const int64_t T = s.in[1], C = g.shape[g.shape.ndim - 1];
            const Value dpos{alloc(T * C * 4, Category::Activation, true), Shape{T, C}};
            backward(t.wpe(), dpos, false);
        }
        backward(t.wte(), g, false);
        return Value{nullptr, s.in};
    }

    // Sequential: h = child(h) in order; Residual: y = body(x) + shortcut(x); Checkpoint: the
    // inside without caches, x kept; GPT blocks and trunk: their own rules above; a layer: its
    // memory(), its cache dropped under no-grad.
    Value run_forward(Module& m, const Value& x) {
        if (auto* b = dynamic_cast<Block*>(&m)) return block_forward(*b, x);
        if (auto* t = dynamic_cast<Transformer*>(&m)) return transformer_forward(*t, x);
        if (dynamic_cast<Sequential*>(&m)) {
            Value h = x;
            for (const Module::Child& c : m.children()) h = forward(*c.module, h);
            return h;
        }
        if (auto* r = dynamic_cast<Residual*>(&m)) {
            Value fx = forward(r->body(), x);
            Value sx = r->shortcut() ? forward(*r->shortcut(), x) : x;
            layers_[&m].in = x.shape;
            return Value{alloc(fx.shape.numel() * 4, Category::Activation, true), fx.shape};  // add(fx, sx)
        }
        if (auto* c = dynamic_cast<Checkpoint*>(&m)) {
            LayerState& s = layers_[&m];
            s.in = x.shape;
            if (!no_grad_) s.cache = {x.buf};
            const bool outer = no_grad_;
            no_grad_ = true;  // Checkpoint::forward's NoGradScope
            Value y = forward(c->inner(), x);
            no_grad_ = outer;
            return y;
        }
        LayerState& s = layers_[&m];
        s.memory = m.memory(x.shape, opt_.device);
        s.in = x.shape;
        const LayerMemory& lm = s.memory;
        const bool shares_x = lm.output_is_view || lm.in_place;
        Value y{shares_x ? x.buf : alloc(lm.output.numel() * 4, Category::Activation, true), lm.output};
        for (const TensorSpec& t : lm.saved) s.cache.push_back(alloc(t.bytes(), Category::Activation, true));
        if (lm.forward_workspace > 0) alloc(lm.forward_workspace, Category::Workspace, true);  // freed at once
        if (lm.keeps_input) s.cache.push_back(x.buf);
        if (lm.keeps_output) s.cache.push_back(y.buf);
        if (no_grad_) s.cache.clear();  // the ops' saved tensors are made all the same, then dropped
        return y;
    }

    // Sequential: children in reverse, each told whether its dx is needed (layers.cpp); Residual:
    // dx = body's + shortcut's (or dy); Checkpoint: the inside's forward again, then its
    // backward; a layer: workspace, dx, then its cache goes.
    Value run_backward(Module& m, const Value& dy, bool need_dx) {
        if (dynamic_cast<Sequential*>(&m)) {
            std::vector<bool> needed;
            bool n = need_dx;
            for (const Module::Child& c : m.children()) {
                needed.push_back(n);
                n = n || c.module->has_parameters();
            }
            Value g = dy;
            for (size_t i = m.children().size(); i-- > 0;) g = backward(*m.children()[i].module, g, needed[i]);
            return g;
        }
        if (auto* b = dynamic_cast<Block*>(&m)) return block_backward(*b, dy);
        if (auto* t = dynamic_cast<Transformer*>(&m)) return transformer_backward(*t, dy);
        LayerState& s = layers_.at(&m);
        if (auto* r = dynamic_cast<Residual*>(&m)) {
            Value dfx = backward(r->body(), dy, r->body().input_needs_grad);
            Value dsx = r->shortcut() ? backward(*r->shortcut(), dy, r->shortcut()->input_needs_grad) : dy;
            return Value{alloc(s.in.numel() * 4, Category::Activation, true), s.in};  // add(dfx, dsx)
        }
        if (auto* c = dynamic_cast<Checkpoint*>(&m)) {
            recompute(c->inner(), Value{s.cache.at(0), s.in});
            s.cache.clear();  // x_ = Tensor()
            return backward(c->inner(), dy, need_dx);
        }
        if (s.memory.output_is_view) return Value{dy.buf, s.in};
        Buf workspace;
        if (s.memory.backward_workspace > 0) workspace = alloc(s.memory.backward_workspace, Category::Workspace, true);
        if (s.memory.releases_before_dx) s.cache.clear();
        Value dx{need_dx ? alloc(s.in.numel() * 4, Category::Activation, true) : nullptr, s.in};
        if (s.memory.backward_scratch > 0) alloc(s.memory.backward_scratch, Category::Workspace, true);  // freed at once
        workspace.reset();
        s.cache.clear();
        return dx;
    }

    // Recomputation::recompute (nn/recompute.h): a copy of each buffer inside, the forward again
    // with caches (its output dropped at once), then the copies go.
    void recompute(Module& inner, const Value& x) {
        std::vector<Buf> copies = buffer_copies(inner);
        forward(inner, x);
    }
    // The same for a module that recomputes itself (a GPT block): its body again, with caches.
    void forward_again(Block& b, const Value& x) {
        std::vector<Buf> copies = buffer_copies(b);
        const bool outer = no_grad_;
        no_grad_ = false;
        block_body(b, x);
        no_grad_ = outer;
    }
    std::vector<Buf> buffer_copies(Module& inner) {
        std::vector<Buf> copies;
        for (auto& [name, m] : inner.named_modules())
            if (auto it = layers_.find(m); it != layers_.end())
                for (const Shape& b : it->second.memory.buffers)
                    copies.push_back(alloc(b.numel() * 4, Category::Parameter, true));
        return copies;
    }

    // The activations each module's forward allocated that are still held: what it keeps.
    void kept_after_forward() {
        kept_.clear();
        for (const std::weak_ptr<HeldBlock>& w : forward_allocs_)
            if (Buf b = w.lock()) kept_[b->module] += b->bytes;
        forward_allocs_.clear();
    }

    MemoryModelOptions opt_;
    AllocatorReplay pool_{false}, arena_{true};
    const Module* module_ = nullptr;
    Phase phase_ = Phase::Other;
    bool in_scope_ = false;  // between forward and the optimizer: the arena's scope is open
    bool no_grad_ = false;   // inside a Checkpoint's first forward: layers keep nothing
    int64_t peak_ = 0, resident_bytes_ = 0;
    std::string peak_module_;
    Phase peak_phase_ = Phase::Other;
    std::vector<Buf> resident_, state_;
    Value x_;
    std::map<const Module*, LayerState> layers_;
    std::map<const Module*, Shape> outputs_;
    std::map<const Module*, int64_t> kept_, workspace_;
    std::vector<std::weak_ptr<HeldBlock>> forward_allocs_;
};

// Every layer's parameter and buffer shapes, in the model's order (the slabs' order), from the
// layers' descriptions of the first step.
void collect_shapes(Module& model, const std::map<const Module*, LayerState>& layers, std::vector<Shape>* params,
                    std::vector<Shape>* buffers) {
    for (auto& [name, m] : model.named_modules()) {
        auto it = layers.find(m);
        if (it == layers.end()) continue;
        for (const Shape& s : it->second.memory.parameters) params->push_back(s);
        for (const Shape& s : it->second.memory.buffers) buffers->push_back(s);
    }
}

int64_t f32_bytes(const std::vector<Shape>& shapes) {
    int64_t n = 0;
    for (const Shape& s : shapes) n += s.numel() * 4;
    return n;
}

}  // namespace

MemoryPrediction predict_memory(Module& model, const MemoryModelOptions& options) {
    KILN_CHECK(options.input.ndim >= 2 && options.input[0] > 0, model.name(),
               ": predict_memory needs the input's shape with the batch first, e.g. [64, 1, 28, 28], got ",
               options.input.str());
    KILN_CHECK(options.amp == DType::F32, "the memory model replays f32 steps, not --amp ", dtype_name(options.amp),
               " (autocast's low-precision copies and casts are not in it)");
    // The layers' shapes first: a scratch forward pass (without parameters) gives each layer's
    // description, hence the slabs' sizes.
    std::vector<Shape> params, buffers;
    {
        MemoryModelOptions shapes_only = options;
        shapes_only.state_elements.clear();
        StepReplay scratch(shapes_only);
        scratch.allocate_resident({}, {});
        scratch.step(model, {});
        collect_shapes(model, scratch.layers(), &params, &buffers);
    }
    // Then two steps from an empty pool cache; the second is the one reported.
    StepReplay replay(options);
    replay.allocate_resident(params, buffers);
    replay.step(model, params);
    replay.reset_peak();
    replay.step(model, params);

    MemoryPrediction p;
    replay.fill(p);
    const int slabs = state_slabs(options.optimizer);
    const std::vector<int64_t>& pieces = options.state_elements;
    size_t next_param = 0;  // the model's parameters in order, as the modules come
    std::map<std::string, size_t> row_of;
    for (auto& [name, m] : model.named_modules()) {
        PredictedModule row;
        row.name = name;
        row.depth = name.empty() ? 0 : int(std::count(name.begin(), name.end(), '.')) + 1;
        if (auto it = replay.outputs().find(m); it != replay.outputs().end()) row.output = it->second;
        if (auto it = replay.layers().find(m); it != replay.layers().end()) {
            row.parameters = row.gradients = f32_bytes(it->second.memory.parameters);
            int64_t state = 0;  // elements whose optimizer state this rank keeps
            for (const Shape& w : it->second.memory.parameters)
                state += pieces.empty() ? w.numel() : pieces[next_param++];
            row.optimizer_state = int64_t(slabs) * state * 4;
            row.buffers = f32_bytes(it->second.memory.buffers);
        }
        if (auto it = replay.kept().find(m); it != replay.kept().end()) row.activations = it->second;
        if (auto it = replay.workspace().find(m); it != replay.workspace().end()) row.workspace = it->second;
        row_of[name] = p.modules.size();
        p.modules.push_back(row);
    }
    // A container's row adds up its subtree: children come after their parent, so going
    // backwards each row is complete before it is added to its parent's.
    for (size_t i = p.modules.size(); i-- > 1;) {
        const PredictedModule& r = p.modules[i];
        const size_t dot = r.name.rfind('.');
        PredictedModule& parent = p.modules[row_of.at(dot == std::string::npos ? "" : r.name.substr(0, dot))];
        parent.parameters += r.parameters;
        parent.gradients += r.gradients;
        parent.optimizer_state += r.optimizer_state;
        parent.buffers += r.buffers;
        parent.activations += r.activations;
        parent.workspace = std::max(parent.workspace, r.workspace);
    }
    return p;
}

std::string memory_prediction_table(const MemoryPrediction& p) {
    std::string out;
    char line[256];
    auto cell = [](int64_t bytes) { return bytes ? format_bytes(bytes) : std::string("-"); };
    std::snprintf(line, sizeof line, "%-28s %-18s %10s %10s %10s %10s %10s\n", "module", "output", "param+buf",
                  "grads", "opt state", "kept act", "workspace");
    out += line;
    for (const PredictedModule& r : p.modules) {
        const std::string name = std::string(size_t(2 * r.depth), ' ') + (r.name.empty() ? "(model)" : r.name);
        std::snprintf(line, sizeof line, "%-28s %-18s %10s %10s %10s %10s %10s\n", name.c_str(),
                      r.output.ndim ? r.output.str().c_str() : "", cell(r.parameters + r.buffers).c_str(),
                      cell(r.gradients).c_str(), cell(r.optimizer_state).c_str(), cell(r.activations).c_str(),
                      cell(r.workspace).c_str());
        out += line;
    }
    std::snprintf(line, sizeof line,
                  "resident before the step: %s (slabs, buffers, optimizer state, data batch)\n"
                  "predicted peak: %s in %s (%s)\n"
                  "allocators' peaks: pool %s + arena %s = %s (what device_memory_stats reports)\n",
                  format_bytes(p.resident).c_str(), format_bytes(p.peak).c_str(), p.peak_module.c_str(),
                  phase_name(p.peak_phase), format_bytes(p.pool_peak).c_str(), format_bytes(p.arena_peak).c_str(),
                  format_bytes(p.allocator_peaks()).c_str());
    return out + line;
}

}  // namespace kiln
