// models.h — the networks the chapters train, built in one place so the trainers and the
// tests build exactly the same thing.
#pragma once
#include <memory>

#include "core/rng.h"
#include "nn/layers.h"

namespace kiln {

// Chapter 01: x [N,1,28,28] -> Flatten -> Linear 784→10.
std::unique_ptr<Sequential> softmax_regression(Rng& rng);

// Chapter 02: x [N,1,28,28] -> Flatten -> Linear 784→h1 -> ReLU -> Linear h1→h2 -> ReLU -> Linear h2→10.
std::unique_ptr<Sequential> mlp(Rng& rng, int64_t hidden1 = 512, int64_t hidden2 = 256);

}  // namespace kiln
