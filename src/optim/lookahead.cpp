// lookahead.cpp — Lookahead (lookahead.h).
#include "optim/lookahead.h"

#include "core/error.h"
#include "ops/ops.h"

namespace kiln {

std::vector<std::pair<std::string, Tensor*>> Lookahead::tensors_of(Module& model) const {
    std::vector<std::pair<std::string, Tensor*>> out;
    for (auto& [name, p] : model.named_parameters()) out.emplace_back(name, &p->value);
    for (auto& [name, b] : model.named_buffers())
        if (b->dtype() == DType::F32) out.emplace_back(name, b);
    return out;
}

Lookahead::Lookahead(Module& model) {
    for (auto& [name, t] : tensors_of(model)) {
        names_.push_back(name);
        slow_.push_back(t->clone());
    }
}

void Lookahead::update(Module& model, float decay) {
    KILN_CHECK(decay >= 0.0f && decay <= 1.0f, "Lookahead: decay must be in [0, 1], got ", decay);
    const auto fast = tensors_of(model);
    KILN_CHECK(fast.size() == slow_.size(), "Lookahead: the model has ", fast.size(),
               " parameters and buffers, the slow copy ", slow_.size(), " (was the model changed after?)");
    for (size_t i = 0; i < fast.size(); ++i) {
        KILN_CHECK(fast[i].first == names_[i] && fast[i].second->shape() == slow_[i].shape(),
                   "Lookahead: ", fast[i].first, " is not the ", names_[i], " the slow copy was made from");
        scale_(slow_[i], decay);
        axpy_(slow_[i], 1.0f - decay, *fast[i].second);
        fast[i].second->copy_from(slow_[i]);
    }
}

void Lookahead::save_state(StateDict& state, const std::string& prefix) const {
    for (size_t i = 0; i < slow_.size(); ++i) state.put(prefix + "." + names_[i], slow_[i]);
}

void Lookahead::load_state(const StateDict& state, const std::string& prefix) {
    for (size_t i = 0; i < slow_.size(); ++i) state.get_into(prefix + "." + names_[i], slow_[i]);
}

}  // namespace kiln
