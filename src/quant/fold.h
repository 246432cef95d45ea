// fold.h — folding batch norm into the convolution before it (chapter 11), the first step of
// preparing a trained network for int8: after it, the network has fewer layers to quantize and
// no per-channel affine between a convolution and its output.
//
// In eval mode a batch norm is a fixed affine map per channel c:
//   BN(v)_c = γ_c · (v_c − μ_c) / √(σ²_c + ε) + β_c = a_c · v_c + (β_c − a_c · μ_c),   a_c = γ_c / √(σ²_c + ε)
// and a convolution's output channel c is v_c = w_c ⋆ x + b_c, so BN(conv(x)) is one convolution:
//   w'_c = a_c · w_c          b'_c = a_c · (b_c − μ_c) + β_c        (b_c = 0 for a conv without bias)
//
// chapter 06's blocks put a max-pool between the two (conv → pool → BN). Max pooling commutes
// with an increasing map per channel — max(a·v + b) = a·max(v) + b when a > 0 — so the batch norm
// folds through the pool when every a_c > 0 (γ_c > 0). A channel with γ_c ≤ 0 would turn the max
// into a min; then the batch norm is left in place (the int8 model applies it with a table,
// quant/qmodel.h).
//
// Folding changes numerics only by rounding: the folded network agrees with the original in
// eval mode to a few units of f32 rounding (tests/test_quant_model.cpp), and training it
// further would train a different network (no batch statistics any more).
#pragma once
#include <string>
#include <vector>

#include "nn/module.h"

namespace kiln {

// Folds every BatchNorm2d of the model that follows a Conv2d in the same Sequential — right
// after it, or after one MaxPool2d when every γ_c > 0 — into that conv: the conv is replaced by
// one with the folded weight and a bias, the batch norm by an Identity (same names, so the
// tree's shape is kept). Returns the names of the batch norms folded. The model is unpacked
// (Module::replace_child); it is meant for inference.
std::vector<std::string> fold_batchnorm(Module& model);

}  // namespace kiln
