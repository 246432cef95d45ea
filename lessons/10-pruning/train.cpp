// lesson-10 — pruning: masks with PyTorch's semantics (nn/prune.h), then the savings they do
// not give by themselves: fewer channels (nn/surgery.h) and sparse weights (ops/sparse.h).
//
//   make lesson-10                                   # LeNet-300-100 on MNIST, pruned to 92%
//   make lesson-10 ARGS='--model lenet'              # chapter 03's LeNet, pruned to 92%
//   make lesson-10 ARGS='--model cifar'              # chapter 06's CIFAR net, half of every conv's channels removed
//   make lesson-10 ARGS='--limit 5000 --epochs 1 --rounds 2 --finetune-epochs 1'   # a quick look
//
// MNIST (Han et al. 2015): train the dense net, then `--rounds` times: prune the weights of
// smallest |w| over the whole net (global_unstructured) up to the round's sparsity (Zhu & Gupta's
// schedule towards --sparsity), and fine-tune --finetune-epochs at a tenth of the lr. Then bake
// the masks in and store the linear layers as CSR (SparseLinear): the bytes and the speed of the
// sparse model against the dense one.
//
// Next to run.json and curves.svg (the dense training) in --save DIR or runs/lesson-10/:
//   pruning.svg   test accuracy against sparsity, after each pruning and after its fine-tuning
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "core/allocator.h"       // defines: BumpAllocator
#include "nn/models.h"            // defines: mlp, lenet, cifar_net
#include "nn/prune.h"             // defines: prune::global_unstructured, sparsity, remove, ...
#include "optim/optimizer.h"      // defines: SGD
#include "train/cli.h"            // defines: Cli, CommonFlags
#include "train/evaluate.h"       // defines: evaluate
#include "train/fit.h"            // defines: MnistData, fit, report
#include "train/run_log.h"        // defines: run_info (the run's folder)
#include "train/svg.h"            // defines: Svg, Plot

using namespace kiln;

namespace {

// What the pruning rounds record: sparsity of the weights and test accuracy.
struct Round {
    double sparsity, acc_pruned, acc_tuned;
};

// pruning.svg: accuracy against sparsity — right after each pruning (how much the cut costs)
// and after fine-tuning (how much of it training wins back) — with the dense net's accuracy
// as a dashed line.
void save_pruning_plot(const std::vector<Round>& rounds, double dense_acc, const std::string& path) {
    std::vector<double> s{0.0}, pruned{100 * dense_acc}, tuned{100 * dense_acc};
    double lo = 100 * dense_acc, hi = lo;
    for (const Round& r : rounds) {
        s.push_back(100 * r.sparsity);
        pruned.push_back(100 * r.acc_pruned);
        tuned.push_back(100 * r.acc_tuned);
        lo = std::min({lo, 100 * r.acc_pruned, 100 * r.acc_tuned});
        hi = std::max({hi, 100 * r.acc_pruned, 100 * r.acc_tuned});
    }
    Svg svg(640, 380);
    Plot plot(svg, {70, 40, 540, 280}, {0, 100}, {lo - 0.2, hi + 0.2});
    plot.axes("sparsity of the weights (%)", "test accuracy (%)");
    svg.line(plot.at(0, 100 * dense_acc), plot.at(100, 100 * dense_acc), "#888888", 1, true);
    svg.polyline(plot.points(s, pruned), "#d62728", 2);
    svg.polyline(plot.points(s, tuned), "#1f77b4", 2);
    plot.legend({{"after pruning", "#d62728"}, {"after fine-tuning", "#1f77b4"}, {"dense", "#888888"}});
    svg.text({320, 22}, "accuracy against sparsity: prune, fine-tune, repeat", 14, Anchor::Middle);
    svg.save(path);
    std::printf("wrote %s\n", path.c_str());
}

double weight_sparsity(Module& model) { return prune::total_sparsity(prune::sparsity(model)).sparsity(); }

// The rounds: prune to the schedule's sparsity, score, fine-tune, score.
std::vector<Round> prune_and_finetune(Module& model, SGD& sgd, MnistData& mnist, BumpAllocator& arena,
                                      const CommonFlags& flags, int rounds, double final_sparsity,
                                      int finetune_epochs) {
    std::vector<Round> done;
    sgd.set_lr(flags.lr / 10);
    TrainOptions opt;
    opt.epochs = finetune_epochs;
    opt.arena = &arena;
    for (int k = 1; k <= rounds; k++) {
        const double target = prune::sparsity_after_round(k, rounds, final_sparsity);
        const double amount = prune::amount_to_reach(weight_sparsity(model), target);
        prune::global_unstructured(prune::prunable_weights(model), prune::Method::L1Unstructured, amount);
        Round r{weight_sparsity(model), evaluate(model, mnist.test, &arena), 0.0};
        std::printf("round %d/%d: pruned to %.2f%% sparsity, test accuracy %.2f%%; fine-tuning %d epochs\n", k, rounds,
                    100 * r.sparsity, 100 * r.acc_pruned, finetune_epochs);
        r.acc_tuned = fit(model, sgd, mnist.train, mnist.test, opt);
        done.push_back(r);
    }
    return done;
}

int run_mnist(const std::string& which, CommonFlags& flags, int rounds, double final_sparsity, int finetune_epochs) {
    const Device device = flags.apply();
    const auto start = std::chrono::steady_clock::now();
    MnistData mnist(flags, device);
    BumpAllocator arena("step arena", device);
    Rng rng(flags.seed);
    std::unique_ptr<Sequential> net = which == "lenet" ? lenet(rng) : mlp(rng, 300, 100);
    Sequential& model = *net;
    model.to(device);
    SGD sgd(model.parameters(), flags.lr, {0.9f, 0.0f, 0.0f, false});
    std::printf("lesson-10: %s, %lld parameters; dense training, %d epochs\n",
                which == "lenet" ? "LeNet" : "LeNet-300-100 (784-300-100-10)", (long long)model.num_parameters(),
                flags.epochs);

    const double dense_acc = fit(model, sgd, mnist.train, mnist.test, flags, &arena);
    const std::vector<Round> rounds_done =
        prune_and_finetune(model, sgd, mnist, arena, flags, rounds, final_sparsity, finetune_epochs);
    prune::print_sparsity(model);
    save_pruning_plot(rounds_done, dense_acc, run_info(flags).dir + "/pruning.svg");

    const double pruned_acc = rounds_done.empty() ? dense_acc : rounds_done.back().acc_tuned;
    std::printf("dense %.2f%% -> pruned %.2f%% at %.2f%% sparsity (%+.2f points)\n", 100 * dense_acc,
                100 * pruned_acc, 100 * weight_sparsity(model), 100 * (pruned_acc - dense_acc));
    report(device, pruned_acc, start);
    return 0;
}

}  // namespace

int main(int argc, char** argv) try {
    CommonFlags flags;
    flags.epochs = 10;
    flags.lr = 0.05f;
    std::string model = "mlp";
    int rounds = 6, finetune_epochs = 2;
    float final_sparsity = 0.92f;
    Cli cli("lesson-10", "Prunes a network with masks, fine-tunes it, and measures what pruning saves.");
    flags.add_to(cli);
    cli.add("--model", &model, "mlp (LeNet-300-100), lenet (chapter 03's) or cifar (chapter 06's net)");
    cli.add("--rounds", &rounds, "MNIST: prune-and-fine-tune rounds");
    cli.add("--sparsity", &final_sparsity, "MNIST: the weights' sparsity after the last round");
    cli.add("--finetune-epochs", &finetune_epochs, "MNIST: epochs of fine-tuning after each pruning");
    cli.parse(argc, argv);
    KILN_CHECK(model == "mlp" || model == "lenet", "--model ", model, ": mlp, lenet or cifar");
    return run_mnist(model, flags, rounds, final_sparsity, finetune_epochs);
} catch (const std::exception& e) {
    std::fprintf(stderr, "lesson-10: %s\n", e.what());
    return 1;
}
