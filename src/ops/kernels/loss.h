// loss.h — the softmax cross-entropy kernel, declared once for both backends (core/backend.h):
// src/ops/cpu/loss.cpp ↔ cuda/loss.cu.
#pragma once
#include <cstdint>

#include "core/backend.h"

namespace kiln {

// What the loss kernel leaves in the device's memory (host memory on the CPU) for the host to
// read when it wants to: one 32-byte copy brings back a step's loss, its correct count and any bad label.
// The op (ops.h) reads it at once; a training loop may keep many and read them together, one
// wait for many steps (train/loss_log.h).
struct LossTotals {
    double total;                // Σ_n loss_n: the mean loss is total / N
    unsigned long long correct;  // rows whose first maximum is their label (argmax_rows's answer)
    unsigned long long bad;      // a label outside [0, C): N − (the first such row); 0: none
    unsigned long long classes;  // C, for the message that names a bad label
};

// Softmax cross-entropy of N rows of C logits z against integer labels y:
//   loss_n = log Σ_c exp(z[n,c]) − z[n,y_n]
// computed as m + log Σ exp(z − m) with m = max_c z[n,c], so exp never overflows (in double on
// the CPU, in float on CUDA: cuda/loss.cu says how it keeps the digits). dz (if not null) =
// (softmax(z) − onehot(y)) / N, rounded once to T. With label smoothing ε > 0 the target is
// q = (1 − ε)·onehot(y) + ε/C instead of onehot(y) (ops.h): loss_n = log Σ exp(z) − Σ_c q_c z_c,
// dz = (softmax(z) − q) / N. The rows' losses are added in a fixed order (the same bits on every
// run) into out->total, the correct rows counted into out->correct; a label outside [0, C) is
// recorded in out->bad (nothing else of the result is meaningful then) and not thrown: the
// kernel does not wait for the host, nor the host for it. T = float, f16 or bf16 (the logits'
// type); y and out are on z's device.
KILN_KERNEL(softmax_cross_entropy,
            template <typename T> void softmax_cross_entropy(const T* z, const int32_t* y, T* dz, int64_t N,
                                                             int64_t C, float smoothing, LossTotals* out));

}  // namespace kiln
