// fuse.cpp — layers that become one (see fuse.h).
#include "nn/fuse.h"

#include <functional>
#include <memory>

#include "nn/layers.h"
#include "nn/misc.h"
#include "nn/norm.h"
#include "nn/pool.h"

namespace kiln {
namespace {

// For each two neighbours a, b of every Sequential in model (at any depth, in forward order),
// fold(a, b) says which of them the other takes over: 0 for a, 1 for b, −1 neither. The one taken
// over becomes an Identity of its name; returns the paths of those that took over.
std::vector<std::string> fuse_pairs(Module& model, const std::function<int(Module&, Module&)>& fold) {
    // The Sequentials first: replacing their children frees the old layers, never a Sequential.
    std::vector<std::pair<std::string, Sequential*>> seqs;
    for (auto& [name, m] : model.named_modules())
        if (auto* s = dynamic_cast<Sequential*>(m)) seqs.emplace_back(name, s);
    std::vector<std::string> fused;
    for (const auto& entry : seqs) {
        const std::string& prefix = entry.first;
        Sequential& seq = *entry.second;
        const auto path = [&](size_t k) {
            const std::string& name = seq.children()[k].name;
            return prefix.empty() ? name : prefix + "." + name;
        };
        for (size_t i = 0; i + 1 < seq.size(); i++) {
            const int gone = fold(seq[i], seq[i + 1]);
            if (gone < 0) continue;
            const size_t kept = gone == 0 ? i + 1 : i;
            fused.push_back(path(kept));
            model.replace_child(path(i + size_t(gone)), std::make_unique<Identity>(seq.children()[i + size_t(gone)].name));
        }
    }
    return fused;
}

}  // namespace

std::vector<std::string> fuse_batchnorm_gelu(Module& model) {
    return fuse_pairs(model, [](Module& a, Module& b) {
        auto* bn = dynamic_cast<BatchNorm*>(&a);
        if (!bn || bn->gelu || !dynamic_cast<GELU*>(&b)) return -1;
        bn->gelu = true;
        return 1;
    });
}

std::vector<std::string> fuse_maxpool_batchnorm(Module& model) {
    return fuse_pairs(model, [](Module& a, Module& b) {
        auto* pool = dynamic_cast<MaxPool2d*>(&a);
        auto* bn = dynamic_cast<BatchNorm2d*>(&b);
        if (!pool || !bn || bn->pool2x2 || pool->kernel != 2 || pool->stride != 2 || pool->padding != 0) return -1;
        bn->pool2x2 = true;
        return 0;
    });
}

}  // namespace kiln
