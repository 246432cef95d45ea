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

// Chapter 06, a convolutional net for CIFAR-10 in the layout of bench/torch_train.py cifar_net
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

// Chapter 13, MobileNetV2 (Sandler et al. 2018; torchvision's layout) for 32×32 inputs, the usual
// CIFAR adaptation: the stem and the second stage keep stride 1 (ImageNet's have 2), so the
// feature maps go 32 → 32 → 16 → 8 → 4 instead of 224 → 7. Convolutions have no bias.
//   stem     conv 3×3 3→32 -> BN -> ReLU6                         x [N,3,32,32] -> [N,32,32,32]
//   blocks   inverted residuals, stage by stage (t, c, n, s): expand ratio t, c channels out,
//            n blocks of which the first has stride s
//              1 (1,  16, 1, 1) block1a         [N, 16,32,32]
//              2 (6,  24, 2, 1) block2a-b       [N, 24,32,32]   (ImageNet: s = 2)
//              3 (6,  32, 3, 2) block3a-c       [N, 32,16,16]
//              4 (6,  64, 4, 2) block4a-d       [N, 64, 8, 8]
//              5 (6,  96, 3, 1) block5a-c       [N, 96, 8, 8]
//              6 (6, 160, 3, 2) block6a-c       [N,160, 4, 4]
//              7 (6, 320, 1, 1) block7a         [N,320, 4, 4]
//            block(in→out, stride s), hidden = in·t:
//              expand     conv 1×1 in→hidden -> BN -> ReLU6            (left out when t = 1)
//              depthwise  conv 3×3 hidden→hidden, groups = hidden, stride s, padding 1 -> BN -> ReLU6
//              project    conv 1×1 hidden→out -> BN                    (linear: no activation)
//            a Residual (identity shortcut) around the three when s = 1 and in = out: 10 of the 17
//   last     conv 1×1 320→1280 -> BN -> ReLU6                      [N,1280,4,4]
//   pool     global average                                        [N,1280]
//   head     Linear 1280→classes                                   [N,classes]
// Each conv -> BN -> ReLU6 is a Sequential "conv", "bn", "relu6" (the ReLU6 in place); so the
// parameters read "stem.conv.weight", "block2a.expand.conv.weight", "block2b.body.expand.conv.weight"
// (a Residual's body), "last.bn.bias", "head.weight". width_mult scales every channel count,
// rounded to a multiple of 8 as torchvision's _make_divisible does (the last conv's 1280 only
// grows); the hidden widths are in·t of the rounded counts. torchvision's dropout before the
// head is left out. At width 1.0 with 10 classes: 2,236,682 parameters (torchvision's 3,504,872
// for 1000 classes less 1281·990 of the head).
std::unique_ptr<Sequential> mobilenet_v2(Rng& rng, int64_t classes = 10, float width_mult = 1.0f);

// Chapter 13, ResNet-50 (He et al. 2016) in torchvision's v1.5 layout — the stride of a block
// is on its 3×3 conv — for 32×32 inputs: a 3×3 stride-1 stem and no max-pool (ImageNet's is
// 7×7 stride 2 then a max-pool). Convolutions have no bias.
//   stem     conv 3×3 3→64 -> BN -> ReLU                          x [N,3,32,32] -> [N,64,32,32]
//   blocks   bottlenecks, stage by stage: width w, n blocks, the first with stride s, out = 4·w
//              1 (w  64, n 3, s 1) block1a-c    [N, 256,32,32]
//              2 (w 128, n 4, s 2) block2a-d    [N, 512,16,16]
//              3 (w 256, n 6, s 2) block3a-f    [N,1024, 8, 8]
//              4 (w 512, n 3, s 2) block4a-c    [N,2048, 4, 4]
//            block(in→4w, stride s) = relu(body(x) + shortcut(x)):
//              body       conv1 1×1 in→w -> bn1 -> relu1 -> conv2 3×3 w→w stride s (padding 1)
//                         -> bn2 -> relu2 -> conv3 1×1 w→4w -> bn3
//              shortcut   the identity, or where the shape changes (the first block of each
//                         stage: 4 of the 16) a projection, conv 1×1 in→4w stride s -> BN
//            a Sequential "residual" (a Residual: "body", "shortcut"), "relu" (in place)
//   pool     global average                                        [N,2048]
//   head     Linear 2048→classes                                   [N,classes]
// Parameters read "block2a.residual.body.conv1.weight", "block2a.residual.shortcut.conv.weight".
// With classes = 100: 23,705,252 parameters (torchvision's resnet50 has 25,557,032: its 7×7 stem
// has 7,680 more and its 1000-class head 1,844,100 more). With recompute = true each block is
// wrapped in a Checkpoint (nn/recompute.h; "block2a.inner.residual...."): only the blocks'
// inputs are kept for backward.
std::unique_ptr<Sequential> resnet50(Rng& rng, int64_t classes = 100, bool recompute = false);

}  // namespace kiln
