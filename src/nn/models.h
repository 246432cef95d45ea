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

// Chapters 03 and 05, the LeNet of PyTorch's classic MNIST example:
//   x [N,1,28,28] -> conv 1→10 k5 [N,10,24,24] -> max-pool 2 [N,10,12,12] -> ReLU
//   -> conv 10→20 k5 [N,20,8,8] -> max-pool 2 [N,20,4,4] -> ReLU -> Flatten [N,320]
//   -> Linear 320→50 -> ReLU -> Linear 50→10
std::unique_ptr<Sequential> lenet(Rng& rng);

// Chapter 06, a convolutional net for CIFAR-10 in the layout of bench/torch_cifar_net.py
// (airbench's): a 2×2 conv 3→stem (24) with GELU, then three blocks of widths w1, w2, w3,
//   block(c→w): conv 3×3 c→w -> max-pool 2 -> BN -> GELU -> conv 3×3 w→w -> BN -> GELU
// then max-pool 3 -> Flatten -> Linear w3→10 (no bias).
//   x [N,3,32,32] -> [N,stem,31,31] -> [N,w1,15,15] -> [N,w2,7,7] -> [N,w3,3,3] -> [N,w3] -> [N,10]
// With batch_norm = false the BN layers are left out and the convolutions get biases instead.
// With recompute = true each block is wrapped in a Checkpoint (nn/recompute.h): its parameters
// are then "block1a.inner.conv.weight", and only the blocks' inputs are kept for backward.
// stem comes last so that {w1, w2, w3} keeps meaning what it did; a net whose every conv lost
// half its channels (nn/surgery.h) is cifar_net({w1/2, w2/2, w3/2, stem/2}).
struct CifarNetWidths { int64_t w1 = 64, w2 = 256, w3 = 256, stem = 24; };
std::unique_ptr<Sequential> cifar_net(Rng& rng, CifarNetWidths widths = {}, bool batch_norm = true,
                                      bool recompute = false);

// A plain deep net, for measuring what recomputation saves and costs (chapter 08):
//   x [N,3,32,32] -> depth × layer(conv 3×3 c→width (padding 1, no bias) -> BN -> ReLU in place)
//   -> global average pool [N,width] -> Linear width→10
// every activation [N,width,32,32]. Layers are named "layer1", "layer2", ...; with segment > 0
// every `segment` consecutive layers form one Checkpoint, "segment1", "segment2", ... (the last
// may be shorter), so only each segment's input is kept for backward.
std::unique_ptr<Sequential> make_deep_net(Rng& rng, int64_t depth = 20, int64_t width = 32, int64_t segment = 0);

}  // namespace kiln
