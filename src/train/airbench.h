// airbench.h — the network and the optimizer's groups of chapter 13's fast CIFAR-10 trainer,
// airbench94's recipe (lessons/13-capstone/README.md says what each choice buys):
//
//   Tensor sample = ...;                                   // 5000 training images, normalized
//   auto net = airbench_net(rng, &sample, true);           // whitened stem, identity-started convs
//   SGD sgd(airbench_groups(*net, 1.5f, 0.0019957f, 64.0f, true), SGD::Options{}.with_momentum(0.85f).with_nesterov());
#pragma once
#include <memory>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "nn/layers.h"
#include "optim/optimizer.h"

namespace kiln {

// Chapter 06's cifar_net at widths 64/256/256 (stem 24), then ×1/9 on the logits (Scale), with
//   - the stem (2×2, 3 → 24) whitened from `whitening_images` (whitening_init, nn/init.h) and its
//     bias set to 0, when whitening_images is given (f32 [N, 3, H, W] on the CPU);
//   - every 3×3 conv's first filters the identity (dirac_init) when `dirac`;
//   - every batch norm with momentum 0.4 (running = 0.6·running + 0.4·batch) and eps 1e-12.
// On the CPU, in f32: move it after.
std::unique_ptr<Sequential> airbench_net(Rng& rng, const Tensor* whitening_images, bool dirac);

// The optimizer's groups, in this order: batch norm's β (lr · bias_scale), the stem's bias, every
// other trained weight (lr). Left out, so never changed: batch norm's γ (fixed at 1) and, when
// `whitened`, the stem's weight. Each group's weight decay is `weight_decay` (an absolute decay
// per step) over its lr, since SGD multiplies the decay by the lr. Freezing the stem's bias later
// is setting group 1's lr and initial_lr to 0.
std::vector<ParamGroup> airbench_groups(Sequential& net, float lr, float weight_decay, float bias_scale, bool whitened);

}  // namespace kiln
