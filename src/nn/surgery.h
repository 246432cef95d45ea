// surgery.h — channel surgery (chapter 10): structured pruning that makes the model smaller.
//
// A mask (nn/prune.h's ln_structured over a conv's output channels) zeroes whole channels but
// keeps their bytes and their arithmetic: the pruned model is exactly as large and as slow as
// before. remove_channels cuts them out. For a conv whose output channels are read by the
// layers after it,
//
//   conv  w [O, C, KH, KW]  b [O]          ->  w [K, C, KH, KW]  b [K]        (K = keep.size())
//   BN    weight, bias, running_mean, running_var [O]   ->   [K]   (eps, momentum unchanged)
//   per-channel layers: GELU, ReLU, Dropout, MaxPool2d, AvgPool2d, Flatten, GlobalAvgPool
//                  unchanged
//   next conv      w [O', O, KH', KW']         ->  w [O', K, KH', KW']
//   or next Linear w [F, O·B]  (after Flatten or GlobalAvgPool: B = in_features / O values per
//                              channel, channel c's inputs c·B ... c·B + B − 1)  ->  w [F, K·B]
//
// each kept entry copied exactly. When the removed channels are dead (their conv rows and bias,
// and the BN's weight and bias entries, all zero — what structured pruning leaves), the smaller
// model computes the same function: a dead channel is 0 after the conv, stays 0 through BN
// (x̂ · 0 + 0), GELU and pooling, and adds 0 to the next layer's sums.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "nn/module.h"

namespace kiln {

// Keeps only the output channels `keep` (sorted, unique, in [0, O), at least one) of the Conv2d
// at `conv_path` ("block1a.conv", "block1a.inner.conv" under a Checkpoint), with the entries of
// the BatchNorm2d layers after it and the matching inputs of the next Conv2d or Linear, found by
// walking the model's layers in forward order through Sequential and Checkpoint containers.
// Everything is checked before anything changes; a kiln::Error naming the conv says what was
// wrong: a bad keep list, a path that is not a Conv2d, groups > 1, a layer in between that mixes
// channels or is not known to act per channel (LayerNorm, a Residual: "cannot follow ...
// through X"), or no layer after it reading its channels.
//
// The new layers replace the old ones in the tree (Module::replace_child): same names, options,
// device, dtype and training mode; their gradients start at zero, and hooks registered on the
// old layers are gone. The model is packed again (Module::pack). Every Parameter pointer into
// the replaced layers is stale: build the optimizer (and its state) again after surgery.
void remove_channels(Module& model, const std::string& conv_path, const std::vector<int64_t>& keep);

}  // namespace kiln
