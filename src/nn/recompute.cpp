// recompute.cpp — Checkpoint: forward without caches, backward = forward again + backward
// (see recompute.h).
#include "nn/recompute.h"

#include "core/rng.h"

namespace kiln {

Checkpoint::Checkpoint(std::unique_ptr<Module> inner, std::string name) : Module(std::move(name)) {
    KILN_CHECK(inner != nullptr, this->name(), ": the module to checkpoint must not be null");
    add_child("inner", std::move(inner));
}

// ---- Recomputation ---------------------------------------------------------------------------
void Recomputation::first_forward(Module& subtree) {
    streams_.clear();
    for (auto& [path, m] : subtree.named_modules())
        if (Rng* r = m->random_stream()) streams_.emplace_back(r, r->counter());
}

std::vector<std::pair<Tensor*, Tensor>> Recomputation::before_again(Module& subtree) {
    std::vector<std::pair<Tensor*, Tensor>> saved;  // each buffer and a copy of it
    for (auto& [path, t] : subtree.named_buffers()) saved.emplace_back(t, t->clone());
    for (auto& [r, counter] : streams_) r->set_counter(counter);  // the same masks again
    return saved;
}

void Recomputation::after_again(const std::vector<std::pair<Tensor*, Tensor>>& saved) {
    for (auto& [t, copy] : saved) t->copy_from(copy);
}

// ---- Checkpoint ------------------------------------------------------------------------------
Tensor Checkpoint::forward(const Tensor& x) {
    if (!keeps_cache()) return inner().call(x);  // eval or no-grad: nothing to recompute later
    check_defined(x, name().c_str(), "the input");
    recomputation_.first_forward(inner());
    x_ = x;
    NoGradScope no_grad;  // the inside keeps nothing
    return inner().call(x);
}

// The inside's forward again, from the kept input, with its caches (Recomputation: the same
// masks, the buffers as the first forward left them); its output is not needed (backward starts
// from dy). Then the inside's backward.
Tensor Checkpoint::backward(const Tensor& dy) {
    KILN_CHECK(x_.defined(), name(), ": backward without a training-mode forward");
    recomputation_.recompute(inner(), [&] { inner().call(x_); });
    x_ = Tensor();  // the inside now holds what it needs
    inner().input_needs_grad = input_needs_grad;
    return inner().call_backward(dy);
}

}  // namespace kiln
