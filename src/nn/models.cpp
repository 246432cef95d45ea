// models.cpp — the chapters' networks.
#include "nn/models.h"

#include <string>

#include "nn/conv.h"
#include "nn/misc.h"
#include "nn/norm.h"
#include "nn/pool.h"

namespace kiln {

// Each builder packs the model (Module::pack): parameters and gradients in two slabs.
// Children are named like the layers of the PyTorch scripts they mirror, so the checkpoint keys
// read "fc1.weight", "block1a.conv.weight"; layers without parameters keep their position
// ("0", "2", ...).
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
    m->emplace<ReLU>();
    m->add("fc2", std::make_unique<Linear>(hidden1, hidden2, rng));
    m->emplace<ReLU>();
    m->add("fc3", std::make_unique<Linear>(hidden2, 10, rng));
    m->pack();
    return m;
}

std::unique_ptr<Sequential> lenet(Rng& rng) {
    auto m = std::make_unique<Sequential>("lenet");
    m->add("conv1", std::make_unique<Conv2d>(1, 10, 5, rng));
    m->emplace<MaxPool2d>(2);
    m->emplace<ReLU>();
    m->add("conv2", std::make_unique<Conv2d>(10, 20, 5, rng));
    m->emplace<MaxPool2d>(2);
    m->emplace<ReLU>();
    m->emplace<Flatten>();
    m->add("fc1", std::make_unique<Linear>(320, 50, rng));
    m->emplace<ReLU>();
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

std::unique_ptr<Sequential> cifar_net(Rng& rng, CifarNetWidths w, bool batch_norm) {
    auto m = std::make_unique<Sequential>(batch_norm ? "cifar-net" : "cifar-net-no-bn");
    m->add("stem", std::make_unique<Conv2d>(3, 24, 2, rng));
    m->add("stem_gelu", std::make_unique<GELU>());
    int64_t in = 24, block = 1;
    for (int64_t width : {w.w1, w.w2, w.w3}) {
        std::string name = "block" + std::to_string(block++);
        m->add(name + "a", conv_bn_gelu(in, width, rng, batch_norm, true));
        m->add(name + "b", conv_bn_gelu(width, width, rng, batch_norm, false));
        in = width;
    }
    m->add("pool", std::make_unique<MaxPool2d>(3));
    m->add("flatten", std::make_unique<Flatten>());
    m->add("head", std::make_unique<Linear>(in, 10, rng, false));
    m->pack();
    return m;
}

}  // namespace kiln
