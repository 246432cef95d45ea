// prune_rounds.cpp — the rounds of chapter 10 saved and resumed (see prune_rounds.h).
#include "train/prune_rounds.h"

#include <cstdio>

#include "io/archive.h"  // with_hint
#include "nn/prune.h"
#include "train/checkpoint.h"

namespace kiln {

namespace {

const char* const kDone = "prune.rounds_done";

std::string round_key(size_t i) { return "prune.round" + std::to_string(i + 1); }

}  // namespace

void save_prune_rounds(const std::string& path, const std::string& previous, Module& model, Optimizer& optimizer,
                       DataLoader& train, const PruneRounds& rounds) {
    TrainingRun run{model, optimizer, nullptr, &train};
    StateDict s = checkpoint_state(run, ResumePoint{0, 0, optimizer.steps()});
    s.set("prune.rounds", int64_t(rounds.total));
    s.set("prune.final_sparsity", rounds.final_sparsity);
    s.set("prune.finetune_epochs", int64_t(rounds.finetune_epochs));
    s.set("prune.per_layer", int64_t(rounds.per_layer));
    s.set("prune.dense_acc", rounds.dense_acc);
    s.set("prune.reached", rounds.reached);
    s.set(kDone, int64_t(rounds.done.size()));
    for (size_t i = 0; i < rounds.done.size(); i++) {
        s.set(round_key(i) + ".sparsity", rounds.done[i].sparsity);
        s.set(round_key(i) + ".acc_pruned", rounds.done[i].acc_pruned);
        s.set(round_key(i) + ".acc_tuned", rounds.done[i].acc_tuned);
    }
    write_safetensors(path, s, previous);
}

bool holds_prune_rounds(const StateDict& state) { return state.values.count(kDone) != 0; }

void resume_prune_rounds(const std::string& path, const StateDict& s, Module& model, Optimizer& optimizer,
                         DataLoader& train, PruneRounds& rounds) {
    with_hint((" (in checkpoint '" + path + "')").c_str(), [&] {
        const auto same = [&](const char* key, double now, const char* flag) {
            KILN_CHECK(s.get_double(key) == now, "its rounds were run with ", flag, " ", s.get_string(key),
                       ", this run has ", now, ". Resume with the same ", flag);
        };
        same("prune.rounds", rounds.total, "--rounds");
        same("prune.final_sparsity", rounds.final_sparsity, "--sparsity");
        same("prune.finetune_epochs", rounds.finetune_epochs, "--finetune-epochs");
        same("prune.per_layer", rounds.per_layer, "--per-layer");
    });
    prune::prune_like(s, model);
    TrainingRun run{model, optimizer, nullptr, &train};
    load_checkpoint(path, run);
    with_hint((" (in checkpoint '" + path + "')").c_str(), [&] {
        rounds.dense_acc = s.get_double("prune.dense_acc", 0.0, 1.0);
        rounds.reached = s.get_double("prune.reached", 0.0, 1.0);
        const int64_t done = s.get_int(kDone, 1, rounds.total);
        rounds.done.clear();
        for (size_t i = 0; i < size_t(done); i++)
            rounds.done.push_back({s.get_double(round_key(i) + ".sparsity", 0.0, 1.0),
                                   s.get_double(round_key(i) + ".acc_pruned", 0.0, 1.0),
                                   s.get_double(round_key(i) + ".acc_tuned", 0.0, 1.0)});
    });
}

}  // namespace kiln
