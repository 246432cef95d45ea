// models.cpp — the chapters' networks.
#include "nn/models.h"

#include <algorithm>
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
// ("0", "2", ...). Every ReLU (and ReLU6) follows a layer that does not keep its output for
// backward (a Linear, a max-pool, a BN, a Residual's sum), so it runs in place (layers.h has the rule).
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

// ---- MobileNetV2 (chapter 13) -----------------------------------------------------------------
// torchvision's _make_divisible: v to the nearest multiple of `divisor` (at least divisor), one
// multiple more if that rounded it down by more than 10%.
static int64_t make_divisible(double v, int64_t divisor = 8) {
    int64_t r = std::max(divisor, int64_t(v + double(divisor) / 2) / divisor * divisor);
    if (double(r) < 0.9 * v) r += divisor;
    return r;
}

// conv k×k (padding k/2, no bias; groups = 1, or depthwise) -> BN [-> ReLU6 in place], children
// "conv", "bn", "relu6": torchvision's Conv2dNormActivation, or the linear projection without it.
static std::unique_ptr<Sequential> conv_bn_relu6(int64_t in, int64_t out, int64_t kernel, int64_t stride,
                                                 int64_t groups, Rng& rng, bool activation = true) {
    auto m = std::make_unique<Sequential>(activation ? "conv-bn-relu6" : "conv-bn");
    m->add("conv", std::make_unique<Conv2d>(in, out, kernel, rng, ConvOptions{stride, kernel / 2, 1, groups, false}));
    m->add("bn", std::make_unique<BatchNorm2d>(out));
    if (activation) m->add("relu6", std::make_unique<ReLU6>(ReLU6::InPlace));
    return m;
}

// The inverted residual: expand (unless t = 1), depthwise, project; inside a Residual when the
// shape stays (stride 1, in = out). The expand's input is the block's (kept by its conv, and by
// the shortcut): no activation ever writes over it.
static std::unique_ptr<Module> inverted_residual(int64_t in, int64_t out, int64_t stride, int64_t t, Rng& rng) {
    const int64_t hidden = in * t;
    auto body = std::make_unique<Sequential>("inverted-residual");
    if (t != 1) body->add("expand", conv_bn_relu6(in, hidden, 1, 1, 1, rng));
    body->add("depthwise", conv_bn_relu6(hidden, hidden, 3, stride, hidden, rng));
    body->add("project", conv_bn_relu6(hidden, out, 1, 1, 1, rng, false));
    if (stride == 1 && in == out) return std::make_unique<Residual>(std::move(body));
    return body;
}

std::unique_ptr<Sequential> mobilenet_v2(Rng& rng, int64_t classes, float width_mult) {
    KILN_CHECK(classes > 0 && width_mult > 0.0f, "mobilenet_v2: classes ", classes, " and width_mult ", width_mult,
               " must be positive");
    struct Stage { int64_t t, c, n, s; };
    // torchvision's table, with stage 2's stride 2 made 1 for 32×32 inputs.
    const Stage stages[] = {{1, 16, 1, 1}, {6, 24, 2, 1}, {6, 32, 3, 2}, {6, 64, 4, 2},
                            {6, 96, 3, 1}, {6, 160, 3, 2}, {6, 320, 1, 1}};
    const double w = width_mult;
    auto m = std::make_unique<Sequential>("mobilenet-v2");
    int64_t in = make_divisible(32 * w);
    m->add("stem", conv_bn_relu6(3, in, 3, 1, 1, rng));
    int64_t stage = 1;
    for (const Stage& st : stages) {
        const int64_t out = make_divisible(double(st.c) * w);
        for (int64_t i = 0; i < st.n; i++) {
            const std::string name = "block" + std::to_string(stage) + char('a' + i);
            m->add(name, inverted_residual(in, out, i == 0 ? st.s : 1, st.t, rng));
            in = out;
        }
        stage++;
    }
    const int64_t last = make_divisible(1280 * std::max(1.0, w));
    m->add("last", conv_bn_relu6(in, last, 1, 1, 1, rng));
    m->add("pool", std::make_unique<GlobalAvgPool>());
    m->add("head", std::make_unique<Linear>(last, classes, rng));
    m->pack();
    return m;
}

// ---- ResNet-50 (chapter 13) -------------------------------------------------------------------
// relu(body(x) + shortcut(x)) as a Sequential: "residual" (a Residual, "body" and, where the
// shape changes, the projection "shortcut") and "relu". The ReLU writes over the sum, which
// nothing keeps; the block's input stays untouched for conv1 and the shortcut (and a Checkpoint).
static std::unique_ptr<Sequential> bottleneck(int64_t in, int64_t width, int64_t stride, Rng& rng) {
    const int64_t out = 4 * width;
    const ConvOptions one{1, 0, 1, 1, false}, three{stride, 1, 1, 1, false};
    auto body = std::make_unique<Sequential>("bottleneck-body");
    body->add("conv1", std::make_unique<Conv2d>(in, width, 1, rng, one));
    body->add("bn1", std::make_unique<BatchNorm2d>(width));
    body->add("relu1", std::make_unique<ReLU>(ReLU::InPlace));
    body->add("conv2", std::make_unique<Conv2d>(width, width, 3, rng, three));
    body->add("bn2", std::make_unique<BatchNorm2d>(width));
    body->add("relu2", std::make_unique<ReLU>(ReLU::InPlace));
    body->add("conv3", std::make_unique<Conv2d>(width, out, 1, rng, one));
    body->add("bn3", std::make_unique<BatchNorm2d>(out));
    std::unique_ptr<Sequential> shortcut;
    if (stride != 1 || in != out) {
        shortcut = std::make_unique<Sequential>("projection");
        shortcut->add("conv", std::make_unique<Conv2d>(in, out, 1, rng, ConvOptions{stride, 0, 1, 1, false}));
        shortcut->add("bn", std::make_unique<BatchNorm2d>(out));
    }
    auto block = std::make_unique<Sequential>("bottleneck");
    block->add("residual", std::make_unique<Residual>(std::move(body), std::move(shortcut)));
    block->add("relu", std::make_unique<ReLU>(ReLU::InPlace));
    return block;
}

std::unique_ptr<Sequential> resnet50(Rng& rng, int64_t classes, bool recompute) {
    KILN_CHECK(classes > 0, "resnet50: classes ", classes, " must be positive");
    struct Stage { int64_t width, n, s; };
    const Stage stages[] = {{64, 3, 1}, {128, 4, 2}, {256, 6, 2}, {512, 3, 2}};
    auto m = std::make_unique<Sequential>("resnet50");
    m->add("stem", conv_bn_relu(3, 64, rng));
    int64_t in = 64, stage = 1;
    for (const Stage& st : stages) {
        for (int64_t i = 0; i < st.n; i++) {
            const std::string name = "block" + std::to_string(stage) + char('a' + i);
            m->add(name, maybe_checkpoint(bottleneck(in, st.width, i == 0 ? st.s : 1, rng), recompute));
            in = 4 * st.width;
        }
        stage++;
    }
    m->add("pool", std::make_unique<GlobalAvgPool>());
    m->add("head", std::make_unique<Linear>(in, classes, rng));
    m->pack();
    return m;
}

}  // namespace kiln
