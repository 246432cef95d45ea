// loss.h — the softmax cross-entropy kernel, declared once for both backends (core/backend.h):
// src/ops/cpu/loss.cpp ↔ cuda/loss.cu.
#pragma once
#include <cstdint>

#include "core/backend.h"

namespace kiln {

// Mean softmax cross-entropy of N rows of C logits z against integer labels y:
//   loss = 1/N Σ_n [ log Σ_c exp(z[n,c]) − z[n,y_n] ]
// computed as m + log Σ exp(z − m) with m = max_c z[n,c], so exp never overflows (in double on
// the CPU, in float on CUDA: cuda/loss.cu says how it keeps the digits). dz (if not null) =
// (softmax(z) − onehot(y)) / N, rounded once to T. With label smoothing ε > 0 the target is
// q = (1 − ε)·onehot(y) + ε/C instead of onehot(y) (ops.h): loss_n = log Σ exp(z) − Σ_c q_c z_c,
// dz = (softmax(z) − q) / N. *correct (if not null) = the rows whose first maximum is their label
// (argmax_rows's answer). A label outside [0, C) is a kiln::Error naming the first such row.
// Returns the loss. T = float, f16 or bf16 (the logits' type); y is on z's device, correct on the host.
KILN_KERNEL(softmax_cross_entropy,
            template <typename T> float softmax_cross_entropy(const T* z, const int32_t* y, T* dz, int64_t N,
                                                              int64_t C, int64_t* correct = nullptr,
                                                              float smoothing = 0.0f));

}  // namespace kiln
