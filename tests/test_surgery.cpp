// test_surgery.cpp — channel surgery (nn/surgery.h): remove_channels makes the model smaller and,
// when the removed channels are dead (what structured pruning leaves), computes what it computed.
//
// Run: make build/tests/kiln_tests && build/tests/kiln_tests '[surgery]'
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "core/state.h"
#include "fixtures.h"
#include "nn/conv.h"
#include "nn/layers.h"
#include "nn/misc.h"
#include "nn/models.h"
#include "nn/norm.h"
#include "nn/surgery.h"
#include "train/checkpoint.h"

using namespace kiln;
using Catch::Matchers::Contains;
using test::require_close;
using test::require_identical;

namespace {

// Tolerances. A dead channel adds exact zeros to the next layer's sums (s + 0 = s), so surgery
// changes only the order in which a kernel adds the remaining terms (its blocking depends on the
// reduction length K). A sum of K terms taken in another order differs by at most K·u·Σ|terms|
// (u = 2^-24 for f32), and with weights and inputs of both signs Σ|terms| stays within a small
// factor of the largest |result|: each layer that sums adds about K·u of the largest value. The
// logits come after L = 9 of them (7 convs, the head, the loss), the gradients after as many again
// on the way back, so with K the longest reduction surgery shortens
//   tol = 2·L·K·u   (relative to the largest value compared).
// (On the CPU the CIFAR net agrees bit for bit; LeNet's logits differ in the last bits, fc1's sum
// going from 320 to 160 terms.)
constexpr double kU = 1.0 / (1 << 24);
double tolerance(int64_t longest_reduction) { return 2 * 9 * double(longest_reduction) * kU; }

// x [B, C, H, H] ~ N(0, 1) and labels in [0, 10), seed 5.
struct Data {
    Data(int64_t B, int64_t C, int64_t H) {
        Rng rng(5);
        x = Tensor::normal({B, C, H, H}, 0, 1, rng);
        y = Tensor::empty({B}, DType::I32);
        for (int64_t i = 0; i < B; i++) y.data<int32_t>()[i] = int32_t(rng.next_below(10));
    }
    Tensor x, y;
};

// zero_grad, forward, loss, backward, as train_step runs them; the logits (on the CPU) and the loss.
struct Pass {
    Tensor logits;
    float loss;
};
Pass forward_backward(Module& m, const Tensor& x, const Tensor& y) {
    m.input_needs_grad = false;
    m.zero_grad();
    CrossEntropyLoss criterion;
    Tensor logits = m.call(x.to(m.parameters()[0]->value.device()));
    const float loss = criterion.forward(logits, y.to(logits.device()));
    m.call_backward(criterion.backward());
    return {logits.to(Device::CPU), loss};
}

// Channels first, first + 2, ... of n: the odd ones are kept, the even ones killed.
std::vector<int64_t> every_other(int64_t n, int64_t first) {
    std::vector<int64_t> v;
    for (int64_t c = first; c < n; c += 2) v.push_back(c);
    return v;
}

// The module at `path`, or null (module_at throws instead).
Module* find(Module& model, const std::string& path) {
    for (auto& [name, m] : model.named_modules())
        if (name == path) return m;
    return nullptr;
}

// Zeroes what structured pruning zeroes for the output channels `dead` of the conv at conv_path:
// its weight rows w[o, :, :, :] and bias entries, and the weight and bias entries of the batch
// norm at bn_path (if there is one). The model is on the CPU.
void kill_channels(Module& model, const std::string& conv_path, const std::string& bn_path,
                   const std::vector<int64_t>& dead) {
    auto& conv = static_cast<Conv2d&>(model.module_at(conv_path));
    const int64_t row = conv.weight.value.numel() / conv.out_channels;
    for (int64_t o : dead) {
        std::memset(conv.weight.value.data<float>() + o * row, 0, size_t(row) * sizeof(float));
        if (conv.bias.value.defined()) conv.bias.value.set({o}, 0.0);
    }
    if (auto* bn = dynamic_cast<BatchNorm2d*>(find(model, bn_path)))
        for (int64_t o : dead) bn->weight.value.set({o}, 0.0), bn->bias.value.set({o}, 0.0);
}

// The CIFAR net's convs in forward order and the batch norm after each ("" for the stem).
std::vector<std::pair<std::string, std::string>> cifar_convs(bool recompute) {
    std::vector<std::pair<std::string, std::string>> convs{{"stem", ""}};
    for (std::string block : {"block1a", "block1b", "block2a", "block2b", "block3a", "block3b"}) {
        const std::string at = recompute ? block + ".inner." : block + ".";
        convs.emplace_back(at + "conv", at + "bn");
    }
    return convs;
}

// What structured pruning at 50% would leave: the even channels of every conv (convs as
// cifar_convs lists them) dead.
void kill_even_channels(Module& model, const std::vector<std::pair<std::string, std::string>>& convs) {
    for (auto& [conv, bn] : convs)
        kill_channels(model, conv, bn, every_other(static_cast<Conv2d&>(model.module_at(conv)).out_channels, 0));
}

// The surgery: every conv keeps its odd channels.
void remove_even_channels(Module& model, const std::vector<std::pair<std::string, std::string>>& convs) {
    for (auto& [conv, bn] : convs)
        remove_channels(model, conv, every_other(static_cast<Conv2d&>(model.module_at(conv)).out_channels, 1));
}

// The gradients of `pruned`'s parameters, cut by the same surgeries: a model of the surgered
// layout whose values are pruned's gradients. (The selection itself is checked by the forward
// pass: a wrong entry kept would change the logits.)
std::unique_ptr<Module> grads_as_values(std::unique_ptr<Module> pruned,
                                        const std::vector<std::pair<std::string, std::string>>& convs) {
    for (Parameter* p : pruned->parameters()) p->value.copy_from(p->grad);
    remove_even_channels(*pruned, convs);
    return pruned;
}

// `cut`'s gradients against `reference`'s (grads_as_values), parameter by parameter, within tol
// of each tensor's largest value.
void require_close_grads(Module& cut, Module& reference, double tol) {
    std::vector<Parameter*> a = cut.parameters(), b = reference.parameters();
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); i++) {
        INFO(a[i]->name);
        REQUIRE(a[i]->name == b[i]->name);
        require_close(a[i]->grad, b[i]->value, tol);
    }
}

// One training step of `pruned` (the even channels of `convs` dead) and of `cut` (them removed)
// on d: the same logits, loss and gradients within tol; then, in eval mode with the running
// statistics that step left, the same logits. pruned is spent: its values end as its gradients.
void require_same_function(std::unique_ptr<Module> pruned, Module& cut,
                           const std::vector<std::pair<std::string, std::string>>& convs, const Data& d, double tol) {
    const Pass a = forward_backward(*pruned, d.x, d.y), b = forward_backward(cut, d.x, d.y);
    require_close(b.logits, a.logits, tol);
    REQUIRE(b.loss == Approx(a.loss).epsilon(tol));
    pruned->eval();
    cut.eval();
    const Tensor x = d.x.to(cut.parameters()[0]->value.device());
    require_close(cut.call(x), pruned->call(x), tol);
    require_close_grads(cut, *grads_as_values(std::move(pruned), convs), tol);
}

}  // namespace

// ---- exactness on dead channels --------------------------------------------------------------
// The CIFAR net (widths 8, 16, 16, stem 8) with half the channels of each of its 7 convs dead,
// against the same net with them removed (require_same_function), with batch norm, without it
// (the convs' biases instead) and with each block in a Checkpoint (paths "block1a.inner.conv").
TEST_CASE("remove_channels: the CIFAR net with dead channels removed computes the same", "[lesson10][surgery][cpu]") {
    for (bool batch_norm : {true, false})
        for (bool recompute : {false, true}) {
            INFO("batch_norm " << batch_norm << " recompute " << recompute);
            const CifarNetWidths widths{8, 16, 16, 8};
            Rng r1(3), r2(3);
            auto pruned = cifar_net(r1, widths, batch_norm, recompute);
            auto cut = cifar_net(r2, widths, batch_norm, recompute);
            auto convs = cifar_convs(recompute);
            kill_even_channels(*pruned, convs);
            kill_even_channels(*cut, convs);
            remove_even_channels(*cut, convs);
            REQUIRE(cut->packed());
            REQUIRE(static_cast<Conv2d&>(cut->module_at(convs[3].first)).out_channels == 8);

            // The longest reduction surgery reorders: block2b's conv over 16·3·3 inputs.
            const double tol = tolerance(16 * 9);
            Data d(4, 3, 32);
            require_same_function(std::move(pruned), *cut, convs, d, tol);
        }
}

// LeNet (chapter 03): conv1 -> pool -> ReLU -> conv2 -> pool -> ReLU -> Flatten -> fc1 -> ... .
// conv1's channels are read by conv2; conv2's, after the Flatten, by fc1 in blocks of 4·4 = 16
// features per channel.
TEST_CASE("remove_channels: LeNet with dead channels removed computes the same, fc1 cut by blocks",
          "[lesson10][surgery][cpu]") {
    const std::vector<std::pair<std::string, std::string>> convs{{"conv1", ""}, {"conv2", ""}};
    Rng r1(2), r2(2);
    auto pruned = lenet(r1), cut = lenet(r2);
    kill_even_channels(*pruned, convs);
    kill_even_channels(*cut, convs);
    remove_even_channels(*cut, convs);
    REQUIRE(static_cast<Linear&>(cut->module_at("fc1")).in_features == 10 * 16);
    // The longest reduction surgery reorders: fc1 over 320 inputs.
    const double tol = tolerance(320);
    Data d(8, 1, 28);
    require_same_function(std::move(pruned), *cut, convs, d, tol);
}

// The deep net of chapter 08 (conv -> BN -> ReLU in place, 3 layers, then GlobalAvgPool -> head):
// the last conv's channels reach the head through the global pool, one feature per channel.
TEST_CASE("remove_channels: the deep net with dead channels removed computes the same, through GlobalAvgPool",
          "[lesson10][surgery][cpu]") {
    const std::vector<std::pair<std::string, std::string>> convs{
        {"layer1.conv", "layer1.bn"}, {"layer2.conv", "layer2.bn"}, {"layer3.conv", "layer3.bn"}};
    Rng r1(2), r2(2);
    auto pruned = make_deep_net(r1, 3, 8), cut = make_deep_net(r2, 3, 8);
    kill_even_channels(*pruned, convs);
    kill_even_channels(*cut, convs);
    remove_even_channels(*cut, convs);
    REQUIRE(static_cast<Linear&>(cut->module_at("head")).in_features == 4);
    // The longest reduction surgery reorders: layer2's conv over 8·3·3 inputs.
    const double tol = tolerance(8 * 9);
    Data d(4, 3, 8);
    require_same_function(std::move(pruned), *cut, convs, d, tol);
}

// The kernel emulator's CUDA kernels on the surgered CIFAR net, its layers rebuilt on the device.
TEST_CASE("remove_channels: on cuda the surgered CIFAR net computes the same", "[lesson10][surgery][cuda]") {
    const CifarNetWidths widths{8, 16, 16, 8};
    const auto convs = cifar_convs(false);
    Rng r1(3), r2(3);
    auto pruned = cifar_net(r1, widths), cut = cifar_net(r2, widths);
    kill_even_channels(*pruned, convs);
    kill_even_channels(*cut, convs);
    pruned->to(Device::CUDA);
    cut->to(Device::CUDA);
    remove_even_channels(*cut, convs);
    for (Parameter* p : cut->parameters()) REQUIRE(p->value.device() == Device::CUDA);
    for (auto& [name, t] : cut->named_buffers()) REQUIRE(t->device() == Device::CUDA);
    const double tol = tolerance(16 * 9);
    Data d(4, 3, 32);
    require_same_function(std::move(pruned), *cut, convs, d, tol);
}

// ---- what it removes ---------------------------------------------------------------------------
// LeNet: conv1 1→10 k5 (+ bias), conv2 10→20 k5, fc1 320→50, fc2 50→10. Keeping 6 of conv1's 10
// channels and 12 of conv2's 20:
//   before  (1·10·25 + 10) + (10·20·25 + 20) + (320·50 + 50) + (50·10 + 10) = 260 + 5020 + 16050 + 510 = 21840
//   after   (1·6·25 + 6)   + (6·12·25 + 12)  + (12·16·50 + 50) + (50·10 + 10) = 156 + 1812 + 9650 + 510 = 12128
TEST_CASE("remove_channels: LeNet's parameters, counted by hand", "[lesson10][surgery][cpu]") {
    Rng rng(1);
    auto net = lenet(rng);
    REQUIRE(net->num_parameters() == 260 + 5020 + 16050 + 510);
    remove_channels(*net, "conv1", {0, 2, 3, 5, 7, 9});
    remove_channels(*net, "conv2", {0, 1, 2, 4, 6, 8, 10, 12, 14, 16, 18, 19});
    REQUIRE(net->num_parameters() == 156 + 1812 + 9650 + 510);
    REQUIRE(net->module_at("conv2").parameters()[0]->value.shape() == Shape{12, 6, 5, 5});
    REQUIRE(net->module_at("fc1").parameters()[0]->value.shape() == Shape{50, 192});
    REQUIRE(net->packed());
}

// The kept entries are the old ones, bit for bit: conv rows and bias, BN's four vectors (with
// running statistics moved by a training step), the next conv's input slices; BN's eps and
// momentum and the layers' training mode as they were.
TEST_CASE("remove_channels: kept weights, statistics and settings are copied exactly", "[lesson10][surgery][cpu]") {
    Rng r1(4), r2(4);
    auto before = cifar_net(r1, {8, 8, 8, 8}), net = cifar_net(r2, {8, 8, 8, 8});
    Data d(2, 3, 32);
    forward_backward(*before, d.x, d.y);
    forward_backward(*net, d.x, d.y);
    auto& bn0 = static_cast<BatchNorm2d&>(net->module_at("block1a.bn"));
    bn0.momentum = 0.25f;
    bn0.eps = 1e-3f;
    net->module_at("block1a").eval();
    const std::vector<int64_t> keep{1, 4, 6};
    remove_channels(*net, "block1a.conv", keep);

    auto& conv = static_cast<Conv2d&>(net->module_at("block1a.conv"));
    auto& bn = static_cast<BatchNorm2d&>(net->module_at("block1a.bn"));
    auto& next = static_cast<Conv2d&>(net->module_at("block1b.conv"));
    auto& old_conv = static_cast<Conv2d&>(before->module_at("block1a.conv"));
    auto& old_bn = static_cast<BatchNorm2d&>(before->module_at("block1a.bn"));
    auto& old_next = static_cast<Conv2d&>(before->module_at("block1b.conv"));
    REQUIRE(conv.options.padding == 1);
    REQUIRE_FALSE(conv.bias.value.defined());
    REQUIRE((bn.momentum == 0.25f && bn.eps == 1e-3f));
    REQUIRE_FALSE(conv.training());
    REQUIRE_FALSE(bn.training());
    REQUIRE(next.training());
    for (int64_t j = 0; j < 3; j++) {
        const int64_t o = keep[size_t(j)];
        INFO("kept channel " << o);
        REQUIRE(conv.weight.value.get({j, 2, 1, 0}) == old_conv.weight.value.get({o, 2, 1, 0}));
        REQUIRE(bn.running_mean.get({j}) == old_bn.running_mean.get({o}));
        REQUIRE(bn.running_var.get({j}) == old_bn.running_var.get({o}));
        REQUIRE(bn.weight.value.get({j}) == old_bn.weight.value.get({o}));
        REQUIRE(next.weight.value.get({5, j, 0, 2}) == old_next.weight.value.get({5, o, 0, 2}));
    }
}

// ---- the checkpoint of a surgered net ---------------------------------------------------------
// Halving every conv of cifar_net({8, 16, 16, stem 8}) gives cifar_net({4, 8, 8, stem 4}): the same
// names and shapes, so its checkpoint loads into a net built with those widths, which then
// predicts what the surgered net predicts, bit for bit (the same weights, the same kernels).
TEST_CASE("remove_channels: a surgered CIFAR net's checkpoint loads into cifar_net of half the widths",
          "[lesson10][surgery][cpu]") {
    Rng r1(6), r2(9);
    auto cut = cifar_net(r1, {8, 16, 16, 8});
    remove_even_channels(*cut, cifar_convs(false));
    Data d(4, 3, 32);
    forward_backward(*cut, d.x, d.y);  // running statistics of one step
    test::TempDir dir;
    StateDict saved;
    save_model(saved, *cut);
    write_safetensors(dir.file("cut.safetensors"), saved);

    auto fresh = cifar_net(r2, {4, 8, 8, 4});
    load_model(read_safetensors(dir.file("cut.safetensors")), *fresh);
    auto names = [](Module& m) {
        std::vector<std::pair<std::string, Shape>> v;
        for (auto& [name, p] : m.named_parameters()) v.emplace_back(name, p->value.shape());
        for (auto& [name, t] : m.named_buffers()) v.emplace_back(name, t->shape());
        return v;
    };
    REQUIRE(names(*fresh) == names(*cut));
    cut->eval();
    fresh->eval();
    require_identical(fresh->call(d.x), cut->call(d.x));
}

// ---- bad input -----------------------------------------------------------------------------------
// Each is an error naming the conv, and leaves the model as it was: the same layers (the same
// objects), still packed, computing the same.
TEST_CASE("remove_channels: bad input is an error and changes nothing", "[lesson10][surgery][cpu]") {
    Rng rng(5);
    auto net = cifar_net(rng, {4, 4, 4});
    net->eval();
    Data d(2, 3, 32);
    const Tensor logits = net->call(d.x);
    Module* conv = &net->module_at("block1a.conv");
    auto unchanged = [&] {
        REQUIRE(&net->module_at("block1a.conv") == conv);
        REQUIRE(net->packed());
        require_identical(net->call(d.x), logits);
    };
    REQUIRE_THROWS_WITH(remove_channels(*net, "block1a.conv", {0, 4}),
                        Contains("remove_channels(\"block1a.conv\")") && Contains("keep[1] = 4 is not one of the conv's 4"));
    unchanged();
    REQUIRE_THROWS_WITH(remove_channels(*net, "block1a.conv", {-1}), Contains("keep[0] = -1"));
    unchanged();
    REQUIRE_THROWS_WITH(remove_channels(*net, "block1a.conv", {}), Contains("keep is empty"));
    unchanged();
    REQUIRE_THROWS_WITH(remove_channels(*net, "block1a.conv", {2, 1}), Contains("must be sorted and without repeats"));
    unchanged();
    REQUIRE_THROWS_WITH(remove_channels(*net, "block1a.conv", {1, 1}), Contains("keep[0] = 1 and keep[1] = 1"));
    unchanged();
    REQUIRE_THROWS_WITH(remove_channels(*net, "block1a.bn", {0}), Contains("block1a.bn is not a Conv2d"));
    unchanged();
    REQUIRE_THROWS_WITH(remove_channels(*net, "block1a.nothing", {0}), Contains("nothing"));
    unchanged();
}

// Layers surgery cannot see through, and convs it cannot cut.
TEST_CASE("remove_channels: groups, channel-mixing layers, residuals and the output are errors",
          "[lesson10][surgery][cpu]") {
    Rng rng(7);
    auto chain = [&](std::unique_ptr<Module> middle, ConvOptions first = {}) {
        auto m = std::make_unique<Sequential>("chain");
        m->add("conv1", std::make_unique<Conv2d>(4, 4, 3, rng, first));
        if (middle) m->add("middle", std::move(middle));
        m->add("conv2", std::make_unique<Conv2d>(4, 2, 3, rng));
        m->pack();
        return m;
    };
    auto unchanged_after = [](Module& m, const std::string& path, const char* message) {
        Module* before = &m.module_at(path);
        REQUIRE_THROWS_WITH(remove_channels(m, path, {0, 1}), Contains("remove_channels(\"" + path + "\")") &&
                                                                  Contains(message));
        REQUIRE(&m.module_at(path) == before);
        REQUIRE(m.packed());
    };
    ConvOptions grouped;
    grouped.groups = 2;
    auto g = chain(nullptr, grouped);
    unchanged_after(*g, "conv1", "groups=2");

    auto ln = chain(std::make_unique<LayerNorm>(6));  // normalizes over W: not one channel at a time
    unchanged_after(*ln, "conv1", "cannot follow the conv's channels through middle");

    auto res = chain(std::make_unique<Residual>(std::make_unique<GELU>()));
    unchanged_after(*res, "conv1", "cannot follow the conv's channels through middle");

    auto linear_first = chain(std::make_unique<Linear>(4, 4, rng));  // a Linear before any Flatten
    unchanged_after(*linear_first, "conv1", "cannot follow the conv's channels through middle");

    unchanged_after(*chain(nullptr), "conv2", "they reach the model's output");

    auto inside = std::make_unique<Sequential>("inside");
    Rng r2(8);
    inside->add("res", std::make_unique<Residual>(std::make_unique<Conv2d>(4, 4, 3, r2, ConvOptions{1, 1, 1, 1, true})));
    inside->add("conv2", std::make_unique<Conv2d>(4, 2, 3, r2));
    inside->pack();
    unchanged_after(*inside, "res.body", "inside a container other than Sequential and Checkpoint");
}
