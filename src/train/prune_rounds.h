// prune_rounds.h — chapter 10's rounds of pruning and fine-tuning (Han et al. 2015, to Zhu &
// Gupta's schedule) as a run that is saved after each round and resumed from there.
//
//   PruneRounds rounds{6, 0.92, 4, false};             // --rounds, --sparsity, --finetune-epochs, --per-layer
//   ... train dense, then for each round: prune, score, fine-tune, score, rounds.done.push_back(...)
//   save_prune_rounds(dir + "/pruned.safetensors", dir + "/pruned-prev.safetensors", model, sgd, train, rounds);
//   // later, a fresh run with the same flags:
//   StateDict s = read_safetensors(path);
//   if (holds_prune_rounds(s)) resume_prune_rounds(path, s, model, sgd, train, rounds);   // rounds.done restored
//
// The file is a checkpoint (train/checkpoint.h) of the pruned model — each pruned weight as
// "<layer>.weight_orig" and "<layer>.weight_mask", PyTorch's names, so a PyTorch model pruned the
// same way loads it with load_state_dict — with the optimizer's state and the training loader's
// place, and the rounds under "prune.": the settings, the dense accuracy, and each round done.
#pragma once
#include <string>
#include <vector>

#include "core/state.h"
#include "data/loader.h"
#include "nn/module.h"
#include "optim/optimizer.h"

namespace kiln {

// One round: the weights' sparsity after its pruning, the test accuracy then and after its
// fine-tuning (the same when there is none).
struct PruneRound {
    double sparsity, acc_pruned, acc_tuned;
};

struct PruneRounds {
    int total;                 // rounds in all (--rounds)
    double final_sparsity;     // after the last (--sparsity)
    int finetune_epochs;       // after each (--finetune-epochs)
    bool per_layer;            // every layer to the round's sparsity, not the whole net (--per-layer)
    double dense_acc = 0.0;    // before the first round
    std::vector<PruneRound> done = {};
    double reached = 0.0;      // per_layer: every layer's sparsity after the last round done
};

// Writes the pruned model, the optimizer, the loader's place and `rounds` to `path`, the file
// it replaces kept as `previous` (write_safetensors: `path` is whole at every moment).
void save_prune_rounds(const std::string& path, const std::string& previous, Module& model, Optimizer& optimizer,
                       DataLoader& train, const PruneRounds& rounds);

// Whether a checkpoint holds rounds (save_prune_rounds), not a dense training's state.
bool holds_prune_rounds(const StateDict& state);

// Prunes the fresh `model` as `state` says (prune::prune_like), loads the checkpoint at `path`
// into it, the optimizer and the loader, and fills rounds.dense_acc, .done and .reached. The
// settings in `rounds` must be the checkpoint's (an error names the flag); every value is
// range-checked, and every error names the file.
void resume_prune_rounds(const std::string& path, const StateDict& state, Module& model, Optimizer& optimizer,
                         DataLoader& train, PruneRounds& rounds);

}  // namespace kiln
