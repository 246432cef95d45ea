// fuse.h — layer fusion (chapter 04's "fewer, fuller launches"): batch norm and the GELU after
// it become one layer, run by one kernel forward and one backward; and a 2×2 max pooling before
// a batch norm joins it too (below).
//
// Separately, a BN → GELU pair costs per step, for an activation of E elements of b bytes:
//   forward   BN reads x, writes y; GELU reads y, writes z          4 passes, 2 launches (+ stats)
//   backward  GELU reads y and dz, writes dy; BN reads dy and x,     5 passes, 2 launches
//             writes dx
//   kept      BN keeps x, GELU keeps y                                2·E·b bytes until backward
// Fused, the BN kernel applies GELU before it stores (z = GELU(y)), and its backward recomputes
// y = γ·x̂ + β from x and the statistics it keeps anyway, so dy = dz · GELU'(y) never goes to memory:
//   forward   reads x, writes z                                       2 passes, 1 launch (+ stats)
//   backward  reads dz and x, writes dx                               3 passes, 1 launch
//   kept      x only                                                  E·b bytes
// The arithmetic is the same, in the same order, each value rounded where the two layers round
// it: the fused pair gives the unfused pair's bits (tests/test_fuse.cpp).
#pragma once
#include <string>
#include <vector>

#include "nn/module.h"

namespace kiln {

// Every BatchNorm (2d or 1d) directly followed by a GELU in the same Sequential (at any depth,
// inside Checkpoint containers too) takes the GELU over (BatchNorm::gelu) and the GELU becomes an
// Identity of the same name: parameter names, checkpoints and the optimizer's parameters are
// unchanged. Returns the fused batch norms' paths ("block1a.bn"), in forward order; a model
// without such a pair is left as it was. Fuse before the first forward (a layer's cache from a
// step before would belong to the other layout).
std::vector<std::string> fuse_batchnorm_gelu(Module& model);

// Max pooling 2×2 (stride 2) then batch norm — the CIFAR nets' conv → pool → BN (→ GELU) — for
// an activation of E pooled values of b bytes (the pool's input has 4·E):
//   forward   pool reads 4·E, writes E and an i32 argmax per value;   reads 4·E; writes the pool (E),
//             BN reads the pool, writes y: 2 launches                 a byte per window, y: 1 launch
//   backward  BN writes dy of the pool (E·b), pool reads it and the   BN's dx goes straight to the
//             argmax, writes dx (4·E·b): 2 launches                   4·E places of dx: 1 launch
//   kept      the pool's argmax (4·E bytes) and BN's input (E·b)      a byte per window and the pool
// (the CPU's max pooling backward also zero-fills dx before it scatters: the fused one writes
// each place once). Same arithmetic, same rounding: the bits of the two layers.
// Every MaxPool2d with a 2×2 window, stride 2 and no padding directly followed by a BatchNorm2d
// in the same Sequential (at any depth) is folded into the batch norm (BatchNorm::pool2x2), and
// becomes an Identity of the same name; other windows, strides or paddings, and a pool followed
// by anything else, stay. Returns the batch norms' paths, in forward order. Independent of
// fuse_batchnorm_gelu: either, both (in any order) or neither. Fuse before the first forward.
std::vector<std::string> fuse_maxpool_batchnorm(Module& model);

}  // namespace kiln
