// models.cpp — the chapters' networks.
#include "nn/models.h"

#include <string>

#include "nn/conv.h"
#include "nn/misc.h"
#include "nn/norm.h"
#include "nn/pool.h"

namespace kiln {

std::unique_ptr<Sequential> softmax_regression(Rng& rng) {
    auto m = std::make_unique<Sequential>("softmax-regression");
    m->emplace<Flatten>();
    m->emplace<Linear>(784, 10, rng, true, "fc");
    return m;
}

std::unique_ptr<Sequential> mlp(Rng& rng, int64_t hidden1, int64_t hidden2) {
    auto m = std::make_unique<Sequential>("mlp");
    m->emplace<Flatten>();
    m->emplace<Linear>(784, hidden1, rng, true, "fc1");
    m->emplace<ReLU>();
    m->emplace<Linear>(hidden1, hidden2, rng, true, "fc2");
    m->emplace<ReLU>();
    m->emplace<Linear>(hidden2, 10, rng, true, "fc3");
    return m;
}

std::unique_ptr<Sequential> lenet(Rng& rng) {
    auto m = std::make_unique<Sequential>("lenet");
    m->emplace<Conv2d>(1, 10, 5, rng, ConvOptions{}, "conv1");
    m->emplace<MaxPool2d>(2);
    m->emplace<ReLU>();
    m->emplace<Conv2d>(10, 20, 5, rng, ConvOptions{}, "conv2");
    m->emplace<MaxPool2d>(2);
    m->emplace<ReLU>();
    m->emplace<Flatten>();
    m->emplace<Linear>(320, 50, rng, true, "fc1");
    m->emplace<ReLU>();
    m->emplace<Linear>(50, 10, rng, true, "fc2");
    return m;
}

// conv 3×3 (padding 1) -> [BN] -> GELU; the BN or the conv's bias, not both.
static void conv_bn_gelu(Sequential& m, int64_t in, int64_t out, Rng& rng, bool batch_norm, const std::string& name,
                         bool pool_first) {
    ConvOptions same{1, 1, 1, 1, !batch_norm};
    m.emplace<Conv2d>(in, out, 3, rng, same, name + ".conv");
    if (pool_first) m.emplace<MaxPool2d>(2);
    if (batch_norm) m.emplace<BatchNorm2d>(out, name + ".bn");
    m.emplace<GELU>();
}

std::unique_ptr<Sequential> cifar_net(Rng& rng, CifarNetWidths w, bool batch_norm) {
    auto m = std::make_unique<Sequential>(batch_norm ? "cifar-net" : "cifar-net-no-bn");
    m->emplace<Conv2d>(3, 24, 2, rng, ConvOptions{}, "stem");
    m->emplace<GELU>();
    int64_t in = 24, block = 1;
    for (int64_t width : {w.w1, w.w2, w.w3}) {
        std::string name = "block" + std::to_string(block++);
        conv_bn_gelu(*m, in, width, rng, batch_norm, name + "a", true);
        conv_bn_gelu(*m, width, width, rng, batch_norm, name + "b", false);
        in = width;
    }
    m->emplace<MaxPool2d>(3);
    m->emplace<Flatten>();
    m->emplace<Linear>(in, 10, rng, false, "head");
    return m;
}

}  // namespace kiln
