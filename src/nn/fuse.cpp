// fuse.cpp — batch norm and the GELU after it become one layer (see fuse.h).
#include "nn/fuse.h"

#include <memory>

#include "nn/layers.h"
#include "nn/misc.h"
#include "nn/norm.h"

namespace kiln {

std::vector<std::string> fuse_batchnorm_gelu(Module& model) {
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
            auto* bn = dynamic_cast<BatchNorm*>(&seq[i]);
            if (!bn || bn->gelu || !dynamic_cast<GELU*>(&seq[i + 1])) continue;
            bn->gelu = true;
            model.replace_child(path(i + 1), std::make_unique<Identity>(seq.children()[i + 1].name));
            fused.push_back(path(i));
        }
    }
    return fused;
}

}  // namespace kiln
