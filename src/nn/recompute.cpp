// recompute.cpp — Checkpoint: forward without caches, backward = forward again + backward
// (see recompute.h).
#include "nn/recompute.h"

#include "nn/misc.h"

namespace kiln {

Checkpoint::Checkpoint(std::unique_ptr<Module> inner, std::string name) : Module(std::move(name)) {
    KILN_CHECK(inner != nullptr, this->name(), ": the module to checkpoint must not be null");
    add_child("inner", std::move(inner));
}

Tensor Checkpoint::forward(const Tensor& x) {
    if (!keeps_cache()) return inner().call(x);  // eval or no-grad: nothing to recompute later
    check_defined(x, name().c_str(), "the input");
    dropout_counters_.clear();
    for (auto& [path, m] : inner().named_modules())
        if (auto* d = dynamic_cast<Dropout*>(m)) dropout_counters_.emplace_back(d, d->rng.counter());
    x_ = x;
    NoGradScope no_grad;  // the inside keeps nothing
    return inner().call(x);
}

// The inside's forward again, from the kept input, with its caches. Its output is not needed
// (backward starts from dy); the buffers it updates (running statistics) are put back as the
// first forward left them.
void Checkpoint::recompute() {
    std::vector<std::pair<Tensor*, Tensor>> saved;  // each buffer and a copy of it
    for (auto& [path, t] : inner().named_buffers()) saved.emplace_back(t, t->clone());
    for (auto& [d, counter] : dropout_counters_) d->rng.set_counter(counter);  // the same masks again
    inner().call(x_);
    for (auto& [t, copy] : saved) t->copy_from(copy);
}

Tensor Checkpoint::backward(const Tensor& dy) {
    KILN_CHECK(x_.defined(), name(), ": backward without a training-mode forward");
    recompute();
    x_ = Tensor();  // the inside now holds what it needs
    inner().input_needs_grad = input_needs_grad;
    return inner().call_backward(dy);
}

}  // namespace kiln
