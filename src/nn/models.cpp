// models.cpp — the chapters' networks.
#include "nn/models.h"

namespace kiln {

std::unique_ptr<Sequential> softmax_regression(Rng& rng) {
    auto m = std::make_unique<Sequential>("softmax-regression");
    m->emplace<Flatten>();
    m->emplace<Linear>(784, 10, rng, true, "fc");
    return m;
}

std::unique_ptr<Sequential> mlp(Rng& rng, int64_t hidden1, int64_t hidden2) {
    auto m = std::make_unique<Sequential>("mlp");
    m->emplace<Flatten>();
    m->emplace<Linear>(784, hidden1, rng, true, "fc1");
    m->emplace<ReLU>();
    m->emplace<Linear>(hidden1, hidden2, rng, true, "fc2");
    m->emplace<ReLU>();
    m->emplace<Linear>(hidden2, 10, rng, true, "fc3");
    return m;
}

}  // namespace kiln
