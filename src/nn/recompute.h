// recompute.h — activation recomputation (PyTorch's torch.utils.checkpoint): trade compute for
// memory by keeping only a block's input in forward and running the block again in backward.
//
//   plain block:     forward keeps every activation inside the block until its backward
//   Checkpoint(f):   forward runs f under a NoGradScope (nothing inside is kept, each
//                    intermediate is freed as soon as the next layer has read it) and keeps x;
//                    backward runs f's forward again from x, this time keeping its caches, then
//                    f's backward.
//
// Memory: of the block's activations only its input stays alive between forward and backward;
// during the block's backward its own activations come back for a moment (one block at a time).
// Time: one more forward of the block per step (about a third more compute for a conv block).
//
// The recomputation must compute exactly what the first forward computed, and must not count
// twice what a forward changes:
//   - batch norm's running statistics: updated by the first forward only. Checkpoint saves
//     every buffer of f (named_buffers: BN's running_mean and running_var) before the
//     recomputation and copies them back after it — [C] floats per BN layer, and no layer needs
//     to know it is being recomputed. (PyTorch's checkpoint updates them twice.)
//   - dropout: each random stream inside (Module::random_stream: a Dropout's, attention's) is set
//     back to where the first forward started, so the recomputation draws the same masks.
// So a step with Checkpoints gives the same gradients, bit for bit, as one without.
//
// The wrapped module is the Checkpoint's child "inner": its parameters are named
// "block1a.inner.conv.weight", so named_parameters(), pack() and checkpoint files work as for
// any container — and a checkpoint file saved with recomputation loads into a model built with
// it (its keys say "inner"), not into one built without.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "nn/module.h"

namespace kiln {

class Rng;

// What makes a second forward of a subtree compute what the first computed, whoever runs it: a
// Checkpoint (below), or a layer that recomputes its own insides (a GPT block with --recompute,
// nn/gpt.h).
//   first_forward(subtree)              before the first forward: where each random stream stands
//   recompute(subtree, forward_again)   the streams set back there, every buffer saved, the forward
//                                       run again, the buffers put back as the first one left them
class Recomputation {
public:
    void first_forward(Module& subtree);
    template <typename F> void recompute(Module& subtree, F&& forward_again) {
        const auto saved = before_again(subtree);
        forward_again();
        after_again(saved);
    }

private:
    std::vector<std::pair<Rng*, uint64_t>> streams_;  // each stream and its counter at the first forward
    std::vector<std::pair<Tensor*, Tensor>> before_again(Module& subtree);  // each buffer and a copy
    static void after_again(const std::vector<std::pair<Tensor*, Tensor>>& saved);
};

class Checkpoint : public Module {
public:
    explicit Checkpoint(std::unique_ptr<Module> inner, std::string name = "checkpoint");
    Tensor forward(const Tensor& x) override;
    Tensor backward(const Tensor& dy) override;

    Module& inner() { return child(0); }

private:
    Tensor x_;  // the input: all this module keeps between forward and backward
    Recomputation recomputation_;
};

}  // namespace kiln
