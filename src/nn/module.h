// module.h — the building block of a network: explicit forward and backward, a tree of named
// children, and hooks.
//
//   y  = m.call(x)            runs m.forward(x) with m's hooks, attributing allocations to m
//   dx = m.call_backward(dy)  runs m.backward(dy) likewise: adds dL/dW to each parameter's grad
//                             and returns dL/dx
//
// There is no tape: each module knows its own derivative, and Sequential calls its children's
// backward in reverse order. A module's cache is a set of ordinary tensors from the allocator,
// so the memory report can count them; backward releases them.
//
// The tree (PyTorch's nn.Module): a module declares its own parameters and buffers under local
// names ("weight", "running_mean") and its children under theirs ("fc1", "0"); the full names
// are built from the tree the way PyTorch's state_dict keys are:
//   cifar_net ─┬─ stem                 stem.weight, stem.bias
//              ├─ block1a ─┬─ conv     block1a.conv.weight
//              │           └─ bn       block1a.bn.weight, block1a.bn.running_mean, ...
//              └─ head                 head.weight
// parameters(), train(), zero_grad() and to() walk the tree, so a container writes none of them.
//
// Parameters and gradients live in two slabs once pack() has run (see pack below). The
// chapters' models (models.h) come packed.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace kiln {

class Module;
class Rng;

// ---- no-grad mode (PyTorch's torch.no_grad) ------------------------------------------------
// While a NoGradScope is open on a thread, forward passes on it keep no cache for backward
// (keeps_cache() is false), so every intermediate tensor is freed as soon as the next layer has
// read it. Training mode still means training: batch norm normalizes with the batch's
// statistics and updates its running ones, dropout draws a mask. evaluate() runs under one; a
// Checkpoint (nn/recompute.h) runs its first forward under one. Scopes nest.
bool grad_enabled();  // this thread's switch: true unless a NoGradScope is open
class NoGradScope {
public:
    NoGradScope();
    ~NoGradScope();
    NoGradScope(const NoGradScope&) = delete;
    NoGradScope& operator=(const NoGradScope&) = delete;

private:
    bool previous_;
};

// ---- who is running: the module and the phase of a step ------------------------------------
// Each thread knows what it is doing now: which module is running (Module::call and
// call_backward set it) and in which phase of a step (train_step sets Optimizer and Data). An
// allocation observer (core/allocator.h) runs on the allocating thread and reads it, so a report
// can say "block2's backward held 30 MiB of activations" (train/memory_trace.h). Setting the
// context is two stores.
enum class Phase : uint8_t { Other, Forward, Backward, Optimizer, Data };
const char* phase_name(Phase p);

struct AllocationContext {
    const Module* module = nullptr;  // the innermost module running (nullptr: none)
    Phase phase = Phase::Other;
};
AllocationContext current_context();  // this thread's

// Sets this thread's context until the scope ends, then restores the previous one.
class ContextScope {
public:
    ContextScope(const Module* module, Phase phase);
    explicit ContextScope(Phase phase);  // keeps the current module
    ~ContextScope();
    ContextScope(const ContextScope&) = delete;
    ContextScope& operator=(const ContextScope&) = delete;

private:
    AllocationContext previous_;
};

// What one layer does with memory in a training step, worked out from its input shape alone
// (chapter 08; train/memory_model.h runs a whole step from these). Each layer's formulas are in
// the comment above its memory(). Bytes are what the ops request; the allocators round them.
struct TensorSpec {
    Shape shape;
    DType dtype = DType::F32;
    int64_t bytes() const { return shape.numel() * int64_t(dtype_size(dtype)); }
};
struct LayerMemory {
    Shape output;                    // y's shape (f32)
    std::vector<Shape> parameters;   // its own parameters, in order (f32; each has a gradient)
    std::vector<Shape> buffers;      // its own buffers (batch norm's running statistics)
    bool output_is_view = false;     // y shares x's storage and dx dy's (Flatten): nothing allocated
    bool in_place = false;           // y is written over x (ReLU::InPlace): no y allocated; dx is
                                     // allocated as usual
    bool keeps_input = false;        // forward caches x for backward
    bool keeps_output = false;       // forward caches y for backward (ReLU)
    std::vector<TensorSpec> saved;   // allocated after y and cached (argmax, mean and 1/σ, a mask)
    int64_t forward_workspace = 0;   // bytes from the pool held during forward, after y (im2col)
    int64_t backward_workspace = 0;  // bytes from the pool held during backward, before dx
    int64_t backward_scratch = 0;    // bytes from the pool taken after dx and given back at once
                                     // (a GPU's split-K partial sums: ops/conv.h)
    bool releases_before_dx = false; // backward lets its cache go before it allocates dx (Linear)
};

// Hooks (PyTorch's register_forward_pre_hook, register_forward_hook,
// register_full_backward_pre_hook and register_full_backward_hook): run by call() and
// call_backward() around forward and backward. A forward hook may replace the output y, a
// backward hook the input gradient dx. A backward pre-hook only looks at dy (PyTorch's may
// replace it; no kiln hook needs that).
using ForwardPreHook = std::function<void(Module& m, const Tensor& x)>;
using ForwardHook = std::function<void(Module& m, const Tensor& x, Tensor& y)>;
using BackwardPreHook = std::function<void(Module& m, const Tensor& dy)>;
using BackwardHook = std::function<void(Module& m, const Tensor& dy, Tensor& dx)>;

// What register_*_hook returns: remove() takes the hook off again (once). It must not outlive
// its module.
class HookHandle {
public:
    HookHandle(Module* module, uint64_t id) : module_(module), id_(id) {}
    void remove();

private:
    Module* module_;
    uint64_t id_;
};

// A weight transform: what a layer computes with, made from its parameter before each forward —
// pruning's masked weight, out = in ⊙ mask (nn/prune.h, chapter 10), and quantization-aware
// training's rounded one, out = fake_quantize(in) (quant/qat.h, chapter 11). A parameter's
// transforms compose in the order they were added, each reading the one before's result: a
// pruned, then fake-quantized weight is fake_quantize(value ⊙ mask).
using TransformFn = std::function<void(const Tensor& in, Tensor& out)>;  // out = f(in), in's shape
struct WeightTransform {
    std::string kind;  // who added it: "prune", "fake_quant"
    TransformFn apply;
    Tensor out;        // its result: Category::Parameter, allocated once, lives from step to step
};

// A learnable tensor and the gradient of the loss with respect to it (same shape).
struct Parameter {
    std::string name;  // its full name in the model's tree ("fc1.weight"); "weight" on its own
    Tensor value;      // Category::Parameter
    Tensor grad;       // Category::Gradient, accumulated by backward, cleared by zero_grad

    // Pruning (nn/prune.h, chapter 10) sets the rest; they stay empty otherwise. A pruned
    // parameter is listed as "<name>_orig", its mask (0s and 1s, value's shape) as the buffer
    // "<name>_mask", and it has a "prune" transform (value ⊙ mask); a backward hook multiplies
    // grad by the mask.
    Tensor mask = {};
    std::vector<HookHandle> prune_hooks = {};

    // The transforms, in order, and the forward pre-hook on their layer that remakes them all
    // before each of its forwards (there while there is a transform).
    std::vector<WeightTransform> transforms = {};
    std::vector<HookHandle> transform_hook = {};

    // What a layer computes with: value, or the last transform's result.
    const Tensor& used() const { return transforms.empty() ? value : transforms.back().out; }
    // Appends a transform of kind `kind`, its result allocated like value; the first one also
    // registers the pre-hook on `layer` (the module that owns this parameter). The result is
    // made by the next refresh_transforms() (the pre-hook's).
    void add_transform(Module& layer, std::string kind, TransformFn apply);
    // Removes the transform of kind `kind` (an error if there is none) and remakes the rest; the
    // last one out takes the pre-hook with it.
    void remove_transform(const std::string& kind);
    bool has_transform(const std::string& kind) const;
    // transforms[0].out = f0(value), transforms[1].out = f1(transforms[0].out), ...
    void refresh_transforms();
};

class Module {
public:
    explicit Module(std::string name);
    virtual ~Module();
    Module(const Module&) = delete;
    Module& operator=(const Module&) = delete;

    // ---- computing --------------------------------------------------------------------
    // What a module computes; call them through call() and call_backward().
    virtual Tensor forward(const Tensor& x) = 0;
    virtual Tensor backward(const Tensor& dy) = 0;

    // forward(x) / backward(dy) with this module as the allocator's current module, in the
    // forward / backward phase, and the registered hooks around them. A gradient has its
    // tensor's type: call_backward gives backward dy in the type forward returned and returns
    // dx in the type forward was given (under autocast an op may compute in another type: this
    // is the cast's backward, and no layer writes it). Without hooks or a change of type this is
    // two stores to a thread-local variable, two dtype compares and the virtual call.
    Tensor call(const Tensor& x);
    Tensor call_backward(const Tensor& dy);

    // What forward and backward allocate and keep for an input of shape `in` on `device`, in
    // training mode (see LayerMemory). Throws a kiln::Error naming the layer if `in` does not
    // fit it. The default is an elementwise layer without parameters that keeps its input (GELU):
    //   y [in] allocated in forward, x kept for backward, dx [in] allocated in backward.
    // Containers (Sequential, Residual) are run by the memory model from their children.
    virtual LayerMemory memory(const Shape& in, Device device) const;

    // Does anyone need dL/dx from backward? Not for the network's first layer: its input is
    // the data, not something computed. When false, backward still accumulates the parameter
    // grads but may skip dx (for LeNet's first convolution, the GEMM and col2im of a dx that
    // would be thrown away) and then returns an undefined Tensor. Sequential passes its own
    // flag through its leading children that have no parameters (an MLP's Flatten) to the first
    // one that has; train_step sets it to false on the model it trains.
    bool input_needs_grad = true;

    // The random stream forward draws from (a Dropout's coins), or null for a layer that draws
    // nothing. Recomputation (nn/recompute.h) sets each stream back before a forward runs again,
    // so that it draws the same numbers.
    virtual Rng* random_stream() { return nullptr; }

    // ---- hooks ------------------------------------------------------------------------
    HookHandle register_forward_pre_hook(ForwardPreHook hook);
    HookHandle register_forward_hook(ForwardHook hook);
    HookHandle register_backward_pre_hook(BackwardPreHook hook);
    HookHandle register_backward_hook(BackwardHook hook);

    // ---- the tree ---------------------------------------------------------------------
    // A child and the name its parent gives it.
    struct Child {
        std::string name;
        std::unique_ptr<Module> module;
    };
    const std::vector<Child>& children() const { return children_; }
    // This module ("") and every module below it, depth first in order, with full names.
    std::vector<std::pair<std::string, Module*>> named_modules();
    // Every parameter / buffer of the tree, in order, under its full name ("block1a.conv.weight").
    std::vector<std::pair<std::string, Parameter*>> named_parameters();
    std::vector<std::pair<std::string, Tensor*>> named_buffers();
    std::vector<Parameter*> parameters();
    bool has_parameters() const;  // any parameter in this module or below

    // The module at a path of child names ("features.3", "block1a.conv"); throws naming the
    // first missing step.
    Module& module_at(const std::string& path);
    // Puts `replacement` where the module at `path` was (same name, same place in the order)
    // and returns the one it replaces: what pruning and quantization do to a layer. The model
    // is unpacked (parameters back in their own blocks): pack() it again before training.
    std::unique_ptr<Module> replace_child(const std::string& path, std::unique_ptr<Module> replacement);

    // ---- from outside the layer: pruning (nn/prune.h) ------------------------------------
    // Pruning renames a layer's own parameter ("weight" -> "weight_orig", the same Parameter)
    // and registers its mask as a buffer; remove() undoes both. Each fails naming the module and
    // the name when there is no such entry, or when the new name is taken.
    Parameter* own_parameter(const std::string& local_name);  // null when there is none
    void rename_parameter(const std::string& local_name, const std::string& new_name);
    // Declares non-learned state a checkpoint must keep (batch norm's running mean, a mask).
    void add_buffer(const std::string& local_name, Tensor& t);
    void remove_buffer(const std::string& local_name);

    // The module's name: its full name in the tree ("block1a.conv") once it has a parent, else
    // the name it was built with ("conv", "lenet"). Error messages start with it.
    const std::string& name() const { return path_.empty() ? label_ : path_; }

    // ---- over the whole tree ----------------------------------------------------------
    void train(bool on = true);  // this module and every one below it
    void eval() { train(false); }
    bool training() const { return training_; }
    // Does forward keep what backward needs? In training mode, unless a NoGradScope is open
    // (below). A layer's forward asks this, one test, before it keeps its cache.
    bool keeps_cache() const { return training_ && grad_enabled(); }
    void zero_grad();               // every grad := 0
    void to(Device device);         // moves parameters, grads and buffers (slabs stay slabs)
    int64_t num_parameters();       // total elements of all parameters

    // ---- slabs (llm.c) ----------------------------------------------------------------
    // Moves every parameter of the tree into one allocation and every gradient into another,
    // each tensor a view at a 256-byte aligned offset (make_slab), values and grads copied.
    // Call it once the model is built (the chapter models' builders do) and before an
    // optimizer takes its first step. Then zero_grad() is one fill, an all-reduce or an inf
    // check reads one buffer (grads_view), and the optimizers' state is laid out the same way.
    // to() and loading a checkpoint keep the slabs; replace_child() and adding a child after
    // pack() undo it (pack again).
    void pack();
    bool packed();  // pack() ran and every parameter and grad of the tree is still in the slabs
    // The gradient slab as one flat 1-D tensor (zero padding included); the model must be packed.
    Tensor grads_view();
    // The parameter slab likewise, laid out as the gradient slab (the same offsets): data
    // parallel training broadcasts it, ZeRO-1 all-gathers it (chapter 12). It needs the values
    // packed only: it outlives drop_grad_slab().
    Tensor values_view();
    // Lets the gradient slab go (ZeRO-2, dist/zero2.h, keeps only its rank's piece of it): every
    // parameter's grad becomes undefined, and whoever called this gives each one storage before a
    // backward writes it. From then on packed() is false and zero_grad() passes the undefined
    // grads by; pack() again brings the slab back.
    void drop_grad_slab();
    // ZeRO-3 (dist/zero3.h) likewise lets the parameter slab go: every value becomes undefined
    // until the caller gathers it (grads first: drop_grad_slab()). values_view() fails from then on.
    void drop_value_slab();

protected:
    // Declares a parameter of this module under its local name: p.value = value and p.grad a
    // zero tensor of its shape. `p` is a member of the layer, so the pointer kept stays valid.
    void add_parameter(const std::string& local_name, Parameter& p, Tensor value);
    // Adopts `m` as the child `local_name` (containers do this) and returns it.
    Module& add_child(std::string local_name, std::unique_ptr<Module> m);
    Module& child(size_t i) { return *children_[i].module; }

private:
    struct Hooks;
    std::string label_;  // the name given at construction
    std::string path_;   // the full name in the tree, "" for a root
    bool training_ = true;
    std::vector<std::pair<std::string, Parameter*>> params_;  // own, local names
    std::vector<std::pair<std::string, Tensor*>> buffers_;    // own, local names
    std::vector<Child> children_;
    std::unique_ptr<Hooks> hooks_;  // null while no hook is registered
    DType x_dtype_ = DType::F32, y_dtype_ = DType::F32;  // the last call's input and output types
    Tensor value_slab_, grad_slab_;  // set by pack() on the module it was called on

    friend class HookHandle;
    void set_path(const std::string& path);  // names this module, its parameters and children
    template <typename F> void walk(const std::string& prefix, F&& visit);
    Tensor call_with_hooks(const Tensor& x);
    Tensor call_backward_with_hooks(const Tensor& dy);
    Tensor backward_in_types(const Tensor& dy);
};

// A layer runs its kernels on its input's device: every other tensor it reads (its parameters
// and buffers, dy, its cache) must be there too. Fails naming the layer, the tensor (`what`) and
// both devices, and says to move the model: model.to(device).
void check_on_device(const Tensor& t, Device device, const std::string& layer, const char* what);

}  // namespace kiln
