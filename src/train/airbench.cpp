// airbench.cpp — airbench_net and airbench_groups (airbench.h).
#include "train/airbench.h"

#include <string>

#include "nn/conv.h"
#include "nn/init.h"
#include "nn/misc.h"
#include "nn/models.h"
#include "nn/norm.h"
#include "ops/ops.h"

namespace kiln {

std::unique_ptr<Sequential> airbench_net(Rng& rng, const Tensor* whitening_images, bool dirac) {
    std::unique_ptr<Sequential> net = cifar_net(rng, {64, 256, 256, 24});
    net->add("scale", std::make_unique<Scale>(1.0f / 9));
    for (auto& [path, m] : net->named_modules()) {
        if (auto* conv = dynamic_cast<Conv2d*>(m)) {
            if (path == "stem" && whitening_images) {
                whitening_init(*conv, *whitening_images);
                fill_(conv->bias.value, 0.0f);  // as airbench's convs start: the bias at 0
            }
            if (path != "stem" && dirac) dirac_init(*conv);
        }
        // airbench's "momentum 0.6" is the weight of the old statistics: PyTorch's (and kiln's) 0.4.
        if (auto* bn = dynamic_cast<BatchNorm*>(m)) bn->momentum = 0.4f, bn->eps = 1e-12f;
    }
    return net;
}

std::vector<ParamGroup> airbench_groups(Sequential& net, float lr, float weight_decay, float bias_scale, bool whitened) {
    const float lr_bias = lr * bias_scale;
    ParamGroup norm_bias{{}, lr_bias, weight_decay / lr_bias}, stem_bias{{}, lr, weight_decay / lr},
        rest{{}, lr, weight_decay / lr};
    const auto ends_with = [](const std::string& s, const std::string& tail) {
        return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
    };
    for (auto& [name, p] : net.named_parameters()) {
        const bool bn = name.find(".bn.") != std::string::npos;
        if (bn && ends_with(name, ".bias"))
            norm_bias.params.push_back(p);
        else if (name == "stem.bias")
            stem_bias.params.push_back(p);
        else if (!bn && !(name == "stem.weight" && whitened))
            rest.params.push_back(p);
    }
    return {norm_bias, stem_bias, rest};
}

}  // namespace kiln
