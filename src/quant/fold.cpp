// fold.cpp — batch norm folded into the convolution before it; the formulas are in fold.h.
#include "quant/fold.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "core/rng.h"
#include "nn/conv.h"
#include "nn/layers.h"
#include "nn/misc.h"
#include "nn/norm.h"
#include "nn/pool.h"

namespace kiln {

namespace {

// a_c = γ_c / √(σ²_c + ε), computed in double and rounded once.
std::vector<float> bn_scale(const BatchNorm& bn) {
    const Tensor gamma = bn.weight.value.to(Device::CPU), var = bn.running_var.to(Device::CPU);
    std::vector<float> a(size_t(bn.num_features));
    for (int64_t c = 0; c < bn.num_features; c++)
        a[c] = float(double(gamma.data<float>()[c]) / std::sqrt(double(var.data<float>()[c]) + bn.eps));
    return a;
}

// A Conv2d computing BN(conv(x)):  w'_c = a_c · w_c,  b'_c = a_c · (b_c − μ_c) + β_c.
std::unique_ptr<Conv2d> folded_conv(const Conv2d& conv, const BatchNorm& bn, const std::vector<float>& a) {
    ConvOptions options = conv.options;
    options.bias = true;
    Rng unused(0);  // the new layer's initial values are all overwritten below
    auto out = std::make_unique<Conv2d>(conv.in_channels, conv.out_channels, conv.kernel_h, conv.kernel_w, unused,
                                        options, conv.name());
    out->workspace_limit = conv.workspace_limit;
    const Tensor w = conv.weight.value.to(Device::CPU);
    const Tensor mean = bn.running_mean.to(Device::CPU), beta = bn.bias.value.to(Device::CPU);
    const Tensor b = conv.bias.value.defined() ? conv.bias.value.to(Device::CPU) : Tensor::zeros({conv.out_channels});
    const int64_t per_channel = w.numel() / conv.out_channels;
    float* w2 = out->weight.value.data<float>();
    float* b2 = out->bias.value.data<float>();
    for (int64_t c = 0; c < conv.out_channels; c++) {
        for (int64_t i = 0; i < per_channel; i++) w2[c * per_channel + i] = a[c] * w.data<float>()[c * per_channel + i];
        b2[c] = a[c] * (b.data<float>()[c] - mean.data<float>()[c]) + beta.data<float>()[c];
    }
    out->to(conv.weight.value.device());
    out->train(conv.training());
    return out;
}

// Folds what it can among one Sequential's children; `prefix` is the Sequential's path.
void fold_children(Module& model, Sequential& seq, const std::string& prefix, std::vector<std::string>& folded) {
    const auto path = [&](size_t i) { return prefix.empty() ? seq.children()[i].name : prefix + "." + seq.children()[i].name; };
    for (size_t i = 1; i < seq.size(); i++) {
        auto* bn = dynamic_cast<BatchNorm2d*>(&seq[i]);
        if (!bn) continue;
        size_t j = i - 1;
        const bool through_pool = dynamic_cast<MaxPool2d*>(&seq[j]) != nullptr;
        if (through_pool) {
            if (j == 0) continue;
            j--;
        }
        auto* conv = dynamic_cast<Conv2d*>(&seq[j]);
        if (!conv || conv->out_channels != bn->num_features) continue;
        const std::vector<float> a = bn_scale(*bn);
        if (through_pool && *std::min_element(a.begin(), a.end()) <= 0) continue;  // max would become min
        const std::string bn_path = path(i);
        model.replace_child(path(j), folded_conv(*conv, *bn, a));
        model.replace_child(bn_path, std::make_unique<Identity>());
        folded.push_back(bn_path);
    }
}

}  // namespace

std::vector<std::string> fold_batchnorm(Module& model) {
    // The Sequentials first: replacing their children frees the old layers, never a Sequential.
    std::vector<std::pair<std::string, Sequential*>> seqs;
    for (auto& [name, m] : model.named_modules())
        if (auto* s = dynamic_cast<Sequential*>(m)) seqs.emplace_back(name, s);
    std::vector<std::string> folded;
    for (auto& [name, s] : seqs) fold_children(model, *s, name, folded);
    return folded;
}

}  // namespace kiln
