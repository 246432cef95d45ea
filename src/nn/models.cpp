// models.cpp — the chapters' networks.
#include "nn/models.h"

#include <string>

#include "nn/conv.h"
#include "nn/misc.h"
#include "nn/norm.h"
#include "nn/pool.h"
#include "nn/recompute.h"

namespace kiln {

// Each builder packs the model (Module::pack): parameters and gradients in two slabs.
// Children are named like the layers of the PyTorch scripts they mirror, so the checkpoint keys
// read "fc1.weight", "block1a.conv.weight"; layers without parameters keep their position
// ("0", "2", ...). Every ReLU follows a layer that does not keep its output for backward (a
// Linear, a max-pool, a BN), so it runs in place (layers.h has the rule).
std::unique_ptr<Sequential> softmax_regression(Rng& rng) {
    auto m = std::make_unique<Sequential>("softmax-regression");
    m->emplace<Flatten>();
    m->add("fc", std::make_unique<Linear>(784, 10, rng));
    m->pack();
    return m;
}

std::unique_ptr<Sequential> mlp(Rng& rng, int64_t hidden1, int64_t hidden2) {
    auto m = std::make_unique<Sequential>("mlp");
    m->emplace<Flatten>();
    m->add("fc1", std::make_unique<Linear>(784, hidden1, rng));
    m->emplace<ReLU>(ReLU::InPlace);
    m->add("fc2", std::make_unique<Linear>(hidden1, hidden2, rng));
    m->emplace<ReLU>(ReLU::InPlace);
    m->add("fc3", std::make_unique<Linear>(hidden2, 10, rng));
    m->pack();
    return m;
}

std::unique_ptr<Sequential> lenet(Rng& rng) {
    auto m = std::make_unique<Sequential>("lenet");
    m->add("conv1", std::make_unique<Conv2d>(1, 10, 5, rng));
    m->emplace<MaxPool2d>(2);
    m->emplace<ReLU>(ReLU::InPlace);
    m->add("conv2", std::make_unique<Conv2d>(10, 20, 5, rng));
    m->emplace<MaxPool2d>(2);
    m->emplace<ReLU>(ReLU::InPlace);
    m->emplace<Flatten>();
    m->add("fc1", std::make_unique<Linear>(320, 50, rng));
    m->emplace<ReLU>(ReLU::InPlace);
    m->add("fc2", std::make_unique<Linear>(50, 10, rng));
    m->pack();
    return m;
}

// conv 3×3 (padding 1) -> [max-pool 2] -> [BN] -> GELU, children "conv", "pool", "bn", "gelu";
// the BN or the conv's bias, not both.
static std::unique_ptr<Sequential> conv_bn_gelu(int64_t in, int64_t out, Rng& rng, bool batch_norm, bool pool_first) {
    auto m = std::make_unique<Sequential>("conv-bn-gelu");
    ConvOptions same{1, 1, 1, 1, !batch_norm};
    m->add("conv", std::make_unique<Conv2d>(in, out, 3, rng, same));
    if (pool_first) m->add("pool", std::make_unique<MaxPool2d>(2));
    if (batch_norm) m->add("bn", std::make_unique<BatchNorm2d>(out));
    m->add("gelu", std::make_unique<GELU>());
    return m;
}

// The block itself, or a Checkpoint of it.
static std::unique_ptr<Module> maybe_checkpoint(std::unique_ptr<Module> block, bool recompute) {
    if (!recompute) return block;
    return std::make_unique<Checkpoint>(std::move(block));
}

std::unique_ptr<Sequential> cifar_net(Rng& rng, CifarNetWidths w, bool batch_norm, bool recompute) {
    auto m = std::make_unique<Sequential>(batch_norm ? "cifar-net" : "cifar-net-no-bn");
    m->add("stem", std::make_unique<Conv2d>(3, w.stem, 2, rng));
    m->add("stem_gelu", std::make_unique<GELU>());
    int64_t in = w.stem, block = 1;
    for (int64_t width : {w.w1, w.w2, w.w3}) {
        std::string name = "block" + std::to_string(block++);
        m->add(name + "a", maybe_checkpoint(conv_bn_gelu(in, width, rng, batch_norm, true), recompute));
        m->add(name + "b", maybe_checkpoint(conv_bn_gelu(width, width, rng, batch_norm, false), recompute));
        in = width;
    }
    m->add("pool", std::make_unique<MaxPool2d>(3));
    m->add("flatten", std::make_unique<Flatten>());
    m->add("head", std::make_unique<Linear>(in, 10, rng, false));
    m->pack();
    return m;
}

// conv 3×3 (padding 1, no bias) -> BN -> ReLU in place, children "conv", "bn", "relu".
static std::unique_ptr<Sequential> conv_bn_relu(int64_t in, int64_t out, Rng& rng) {
    auto m = std::make_unique<Sequential>("conv-bn-relu");
    m->add("conv", std::make_unique<Conv2d>(in, out, 3, rng, ConvOptions{1, 1, 1, 1, false}));
    m->add("bn", std::make_unique<BatchNorm2d>(out));
    m->add("relu", std::make_unique<ReLU>(ReLU::InPlace));
    return m;
}

std::unique_ptr<Sequential> make_deep_net(Rng& rng, int64_t depth, int64_t width, int64_t segment) {
    KILN_CHECK(depth > 0 && width > 0 && segment >= 0, "make_deep_net: depth ", depth, " and width ", width,
               " must be positive and segment ", segment, " ≥ 0");
    auto m = std::make_unique<Sequential>("deep-net");
    Sequential* into = m.get();  // where the next layer goes: the net, or the open segment
    for (int64_t i = 0; i < depth; i++) {
        if (segment > 0 && i % segment == 0) {
            auto seg = std::make_unique<Sequential>("segment");
            into = seg.get();
            m->add("segment" + std::to_string(i / segment + 1), std::make_unique<Checkpoint>(std::move(seg)));
        }
        into->add("layer" + std::to_string(i + 1), conv_bn_relu(i == 0 ? 3 : width, width, rng));
    }
    m->add("pool", std::make_unique<GlobalAvgPool>());
    m->add("head", std::make_unique<Linear>(width, 10, rng));
    m->pack();
    return m;
}

}  // namespace kiln
