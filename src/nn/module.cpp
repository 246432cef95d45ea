// module.cpp — what every module shares: the tree and its names, call() with hooks, and the
// walks over the tree (train, zero_grad, to, counting).
#include "nn/module.h"

#include <algorithm>

#include "ops/ops.h"

namespace kiln {

// The hooks of one module, each with the id its handle removes it by.
struct Module::Hooks {
    uint64_t next_id = 1;
    std::vector<std::pair<uint64_t, ForwardPreHook>> forward_pre;
    std::vector<std::pair<uint64_t, ForwardHook>> forward;
    std::vector<std::pair<uint64_t, BackwardPreHook>> backward_pre;
    std::vector<std::pair<uint64_t, BackwardHook>> backward;
    bool empty() const { return forward_pre.empty() && forward.empty() && backward_pre.empty() && backward.empty(); }
};

Module::Module(std::string name) : label_(std::move(name)) {}
Module::~Module() = default;

// "a" + "b" -> "a.b";  "" + "b" -> "b"
static std::string join(const std::string& prefix, const std::string& name) {
    return prefix.empty() ? name : prefix + "." + name;
}

// ---- no-grad mode --------------------------------------------------------------------------
static thread_local bool t_grad_enabled = true;

bool grad_enabled() { return t_grad_enabled; }
NoGradScope::NoGradScope() : previous_(t_grad_enabled) { t_grad_enabled = false; }
NoGradScope::~NoGradScope() { t_grad_enabled = previous_; }

// ---- the context ----------------------------------------------------------------------------
const char* phase_name(Phase p) {
    static const char* names[] = {"other", "forward", "backward", "optimizer", "data"};
    return names[int(p)];
}

static thread_local AllocationContext t_context;

AllocationContext current_context() { return t_context; }

ContextScope::ContextScope(const Module* module, Phase phase) : previous_(t_context) { t_context = {module, phase}; }

ContextScope::ContextScope(Phase phase) : previous_(t_context) { t_context.phase = phase; }

ContextScope::~ContextScope() { t_context = previous_; }

// ---- computing -----------------------------------------------------------------------------
// An elementwise layer without parameters that keeps x (module.h): y [in], x cached, dx [in].
LayerMemory Module::memory(const Shape& in, Device) const {
    KILN_CHECK(children_.empty(), name(), ": a container has no memory() of its own; the memory model runs its "
               "children (train/memory_model.h knows Sequential and Residual)");
    LayerMemory m;
    m.output = in;
    m.keeps_input = true;
    return m;
}

Tensor Module::call(const Tensor& x) {
    ContextScope scope(this, Phase::Forward);
    Tensor y = hooks_ ? call_with_hooks(x) : forward(x);
    if (x.defined()) x_dtype_ = x.dtype();
    if (y.defined()) y_dtype_ = y.dtype();
    return y;
}

Tensor Module::call_backward(const Tensor& dy) {
    ContextScope scope(this, Phase::Backward);
    if (!hooks_) return backward_in_types(dy);
    return call_backward_with_hooks(dy);
}

// dy in the type forward returned, dx in the type forward was given: an op may compute in
// another type (autocast, ops/autocast.h), and this is its cast's backward. Without a change of
// type both conversions return their argument.
Tensor Module::backward_in_types(const Tensor& dy) {
    Tensor dx = backward(dy.defined() ? dy.to(y_dtype_) : dy);
    return dx.defined() ? dx.to(x_dtype_) : dx;
}

Tensor Module::call_with_hooks(const Tensor& x) {
    for (auto& [id, hook] : hooks_->forward_pre) hook(*this, x);
    Tensor y = forward(x);
    for (auto& [id, hook] : hooks_->forward) hook(*this, x, y);
    return y;
}

Tensor Module::call_backward_with_hooks(const Tensor& dy) {
    for (auto& [id, hook] : hooks_->backward_pre) hook(*this, dy);
    Tensor dx = backward_in_types(dy);
    for (auto& [id, hook] : hooks_->backward) hook(*this, dy, dx);
    return dx;
}

// ---- hooks ---------------------------------------------------------------------------------
template <typename Hook> static uint64_t append(std::vector<std::pair<uint64_t, Hook>>& list, uint64_t id, Hook h) {
    KILN_CHECK(h != nullptr, "register_*_hook: the hook is an empty function");
    list.emplace_back(id, std::move(h));
    return id;
}

HookHandle Module::register_forward_pre_hook(ForwardPreHook hook) {
    if (!hooks_) hooks_ = std::make_unique<Hooks>();
    return HookHandle(this, append(hooks_->forward_pre, hooks_->next_id++, std::move(hook)));
}

HookHandle Module::register_forward_hook(ForwardHook hook) {
    if (!hooks_) hooks_ = std::make_unique<Hooks>();
    return HookHandle(this, append(hooks_->forward, hooks_->next_id++, std::move(hook)));
}

HookHandle Module::register_backward_pre_hook(BackwardPreHook hook) {
    if (!hooks_) hooks_ = std::make_unique<Hooks>();
    return HookHandle(this, append(hooks_->backward_pre, hooks_->next_id++, std::move(hook)));
}

HookHandle Module::register_backward_hook(BackwardHook hook) {
    if (!hooks_) hooks_ = std::make_unique<Hooks>();
    return HookHandle(this, append(hooks_->backward, hooks_->next_id++, std::move(hook)));
}

void HookHandle::remove() {
    auto& hooks = module_->hooks_;
    if (!hooks) return;
    auto drop = [this](auto& list) {
        for (auto it = list.begin(); it != list.end(); ++it)
            if (it->first == id_) return (void)list.erase(it);
    };
    drop(hooks->forward_pre);
    drop(hooks->forward);
    drop(hooks->backward_pre);
    drop(hooks->backward);
    if (hooks->empty()) hooks.reset();  // back to the hook-free path
}

// ---- weight transforms ---------------------------------------------------------------------
void Parameter::add_transform(Module& layer, std::string kind, TransformFn apply) {
    KILN_CHECK(!has_transform(kind), name, ": it already has a \"", kind, "\" transform");
    Tensor out = Tensor::empty(value.shape(), DType::F32, value.device(), Category::Parameter);
    transforms.push_back({std::move(kind), std::move(apply), std::move(out)});
    if (!transform_hook.empty()) return;
    Parameter* self = this;  // a layer's member: lives as long as the layer and its hooks
    transform_hook.push_back(layer.register_forward_pre_hook([self](Module&, const Tensor&) {
        self->refresh_transforms();
    }));
}

void Parameter::remove_transform(const std::string& kind) {
    auto it = std::find_if(transforms.begin(), transforms.end(), [&](const WeightTransform& t) { return t.kind == kind; });
    KILN_CHECK(it != transforms.end(), name, ": no \"", kind, "\" transform to remove");
    transforms.erase(it);
    if (!transforms.empty()) return refresh_transforms();
    for (HookHandle& h : transform_hook) h.remove();
    transform_hook.clear();
}

bool Parameter::has_transform(const std::string& kind) const {
    for (const WeightTransform& t : transforms)
        if (t.kind == kind) return true;
    return false;
}

void Parameter::refresh_transforms() {
    const Tensor* in = &value;
    for (WeightTransform& t : transforms) {
        t.apply(*in, t.out);
        in = &t.out;
    }
}

// ---- the tree ------------------------------------------------------------------------------
void Module::add_parameter(const std::string& local_name, Parameter& p, Tensor value) {
    p.name = join(path_, local_name);
    p.value = value;
    p.grad = Tensor::zeros(value.shape(), DType::F32, value.device(), Category::Gradient);
    params_.emplace_back(local_name, &p);
}

void Module::add_buffer(const std::string& local_name, Tensor& t) {
    for (auto& [local, b] : buffers_)
        KILN_CHECK(local != local_name, name(), ": there is already a buffer named \"", local_name, "\"");
    buffers_.emplace_back(local_name, &t);
}

void Module::remove_buffer(const std::string& local_name) {
    for (auto it = buffers_.begin(); it != buffers_.end(); ++it)
        if (it->first == local_name) return (void)buffers_.erase(it);
    KILN_FAIL(name(), ": no buffer named \"", local_name, "\" to remove");
}

Parameter* Module::own_parameter(const std::string& local_name) {
    for (auto& [local, p] : params_)
        if (local == local_name) return p;
    return nullptr;
}

void Module::rename_parameter(const std::string& local_name, const std::string& new_name) {
    Parameter* p = own_parameter(local_name);
    KILN_CHECK(p != nullptr, name(), ": no parameter named \"", local_name, "\"");
    KILN_CHECK(own_parameter(new_name) == nullptr, name(), ": there is already a parameter named \"", new_name, "\"");
    for (auto& [local, q] : params_)
        if (q == p) local = new_name;
    p->name = join(path_, new_name);
}

Module& Module::add_child(std::string local_name, std::unique_ptr<Module> m) {
    KILN_CHECK(m != nullptr, name(), ": a child must not be null");
    for (const Child& c : children_)
        KILN_CHECK(c.name != local_name, name(), ": there is already a child named \"", local_name, "\"");
    m->set_path(join(path_, local_name));
    children_.push_back(Child{std::move(local_name), std::move(m)});
    return *children_.back().module;
}

void Module::set_path(const std::string& path) {
    path_ = path;
    for (auto& [local, p] : params_) p->name = join(path_, local);
    for (Child& c : children_) c.module->set_path(join(path_, c.name));
}

// Calls visit(full name, module) on this module and every one below it, depth first.
template <typename F> void Module::walk(const std::string& prefix, F&& visit) {
    visit(prefix, *this);
    for (Child& c : children_) c.module->walk(join(prefix, c.name), visit);
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() {
    std::vector<std::pair<std::string, Module*>> all;
    walk("", [&](const std::string& name, Module& m) { all.emplace_back(name, &m); });
    return all;
}

std::vector<std::pair<std::string, Parameter*>> Module::named_parameters() {
    std::vector<std::pair<std::string, Parameter*>> all;
    walk("", [&](const std::string& name, Module& m) {
        for (auto& [local, p] : m.params_) all.emplace_back(join(name, local), p);
    });
    return all;
}

std::vector<std::pair<std::string, Tensor*>> Module::named_buffers() {
    std::vector<std::pair<std::string, Tensor*>> all;
    walk("", [&](const std::string& name, Module& m) {
        for (auto& [local, t] : m.buffers_) all.emplace_back(join(name, local), t);
    });
    return all;
}

std::vector<Parameter*> Module::parameters() {
    std::vector<Parameter*> all;
    walk("", [&](const std::string&, Module& m) {
        for (auto& [local, p] : m.params_) all.push_back(p);
    });
    return all;
}

bool Module::has_parameters() const {
    if (!params_.empty()) return true;
    for (const Child& c : children_)
        if (c.module->has_parameters()) return true;
    return false;
}

Module& Module::module_at(const std::string& path) {
    Module* m = this;
    size_t start = 0;
    while (start <= path.size()) {
        size_t dot = path.find('.', start);
        const std::string step = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
        Module* next = nullptr;
        for (Child& c : m->children_)
            if (c.name == step) next = c.module.get();
        KILN_CHECK(next != nullptr, name(), ": no module \"", path, "\" (", m->name(), " has no child \"", step, "\")");
        m = next;
        if (dot == std::string::npos) break;
        start = dot + 1;
    }
    return *m;
}

std::unique_ptr<Module> Module::replace_child(const std::string& path, std::unique_ptr<Module> replacement) {
    KILN_CHECK(replacement != nullptr, name(), ": replace_child(\"", path, "\") with a null module");
    const size_t dot = path.rfind('.');
    Module& parent = dot == std::string::npos ? *this : module_at(path.substr(0, dot));
    const std::string local = dot == std::string::npos ? path : path.substr(dot + 1);
    for (Child& c : parent.children_) {
        if (c.name != local) continue;
        replacement->set_path(join(parent.path_, local));
        replacement->train(c.module->training());
        std::swap(c.module, replacement);
        return replacement;  // the module that was there
    }
    KILN_FAIL(name(), ": no module \"", path, "\" to replace");
}

// ---- over the whole tree -------------------------------------------------------------------
void Module::train(bool on) {
    walk("", [on](const std::string&, Module& m) { m.training_ = on; });
}

void Module::zero_grad() {
    if (packed()) return fill_(grad_slab_, 0.0f);
    for (Parameter* p : parameters())
        if (p->grad.defined()) fill_(p->grad, 0.0f);  // undefined: after drop_grad_slab()
}

void Module::to(Device device) {
    if (packed()) {  // move the two slabs; each tensor is again a view at its offset
        const Tensor values = value_slab_.to(device), grads = grad_slab_.to(device);
        for (Parameter* p : parameters()) {
            p->value = values.view(p->value.offset(), p->value.shape());
            p->grad = grads.view(p->grad.offset(), p->grad.shape());
        }
        value_slab_ = values;
        grad_slab_ = grads;
    } else {
        for (Parameter* p : parameters()) {
            p->value = p->value.to(device);
            if (p->grad.defined()) p->grad = p->grad.to(device);
        }
    }
    for (auto& [name, t] : named_buffers()) *t = t->to(device);
    for (Parameter* p : parameters())  // the weight transforms' results (pruning's, QAT's)
        for (WeightTransform& t : p->transforms) t.out = t.out.to(device);
}

// ---- slabs ---------------------------------------------------------------------------------
void Module::pack() {
    std::vector<Parameter*> params = parameters();
    KILN_CHECK(!params.empty(), name(), ": pack() of a module without parameters");
    std::vector<Shape> shapes;
    for (Parameter* p : params) {
        KILN_CHECK(p->value.device() == params[0]->value.device() && p->value.dtype() == DType::F32, name(),
                   ": pack() needs every parameter f32 on one device; ", p->name, " is ", p->value.desc());
        shapes.push_back(p->value.shape());
    }
    const Device device = params[0]->value.device();
    Slab values = make_slab(shapes, DType::F32, device, Category::Parameter);
    Slab grads = make_slab(shapes, DType::F32, device, Category::Gradient);
    for (size_t i = 0; i < params.size(); i++) {
        values.views[i].copy_from(params[i]->value);
        if (params[i]->grad.defined()) grads.views[i].copy_from(params[i]->grad);  // else 0: after drop_grad_slab()
        params[i]->value = values.views[i];
        params[i]->grad = grads.views[i];
    }
    value_slab_ = values.whole;
    grad_slab_ = grads.whole;
}

// Packed, and still: a replaced child, or a parameter set by hand (p.value = ...), is not in it.
bool Module::packed() {
    if (!grad_slab_.defined()) return false;
    for (Parameter* p : parameters())
        if (!p->value.shares_storage(value_slab_) || !p->grad.shares_storage(grad_slab_)) return false;
    return true;
}

Tensor Module::grads_view() {
    KILN_CHECK(packed(), name(), ": grads_view() needs the gradients in one slab: call pack() first");
    return grad_slab_;
}

Tensor Module::values_view() {
    bool in_slab = value_slab_.defined();
    for (Parameter* p : parameters()) in_slab = in_slab && p->value.shares_storage(value_slab_);
    KILN_CHECK(in_slab, name(), ": values_view() needs the parameters in one slab: call pack() first");
    return value_slab_;
}

void Module::drop_grad_slab() {
    KILN_CHECK(packed(), name(), ": drop_grad_slab() of a model that is not packed");
    for (Parameter* p : parameters()) p->grad = Tensor();
    grad_slab_ = Tensor();
}

void Module::drop_value_slab() {
    KILN_CHECK(!grad_slab_.defined() && value_slab_.defined(), name(), ": drop_value_slab() needs the value slab, ",
               "and the gradient slab dropped first (drop_grad_slab)");
    for (Parameter* p : parameters()) p->value = Tensor();
    value_slab_ = Tensor();
}

void check_on_device(const Tensor& t, Device device, const std::string& layer, const char* what) {
    const char* to = device == Device::CUDA ? "Device::CUDA" : "Device::CPU";
    KILN_CHECK(t.device() == device, layer, ": ", what, " is on ", device_name(t.device()), " but the input is on ",
               device_name(device), ": a layer reads all its tensors on one device; move the model with model.to(",
               to, ") and the data with .to(", to, ")");
}

int64_t Module::num_parameters() {
    int64_t n = 0;
    for (Parameter* p : parameters()) n += p->value.numel();
    return n;
}

}  // namespace kiln
