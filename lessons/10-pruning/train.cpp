// lesson-10 — pruning: masks with PyTorch's semantics (nn/prune.h), then the savings they do
// not give by themselves: fewer channels (nn/surgery.h) and sparse weights (ops/sparse.h).
//
//   make lesson-10                                   # LeNet-300-100 on MNIST, pruned to 92%
//   make lesson-10 ARGS='--model lenet --sparsity 0.9 --rounds 8'   # chapter 03's LeNet, to 90%
//   make lesson-10 ARGS='--model cifar'              # chapter 06's CIFAR net, half of every conv's channels removed
//   make lesson-10 ARGS='--limit 5000 --epochs 1 --rounds 2 --finetune-epochs 1'   # a quick look
//   make lesson-10 ARGS='--model mobilenet --from runs/lesson-13-mobilenet/last.safetensors'   # chapter 13's MobileNetV2
//
// MNIST (Han et al. 2015): train the dense net, then `--rounds` times: prune the weights of
// smallest |w| over the whole net (global_unstructured) up to the round's sparsity (Zhu & Gupta's
// schedule towards --sparsity), and fine-tune --finetune-epochs (at a tenth of the lr, the last
// at a hundredth). Then bake the masks in and store the linear layers as CSR (SparseLinear):
// the bytes and the speed of the sparse model against the dense one.
//
// CIFAR-10 (Li et al. 2017): start from chapter 06's trained net (--from a checkpoint of
// lesson-06 or lesson-09, or train it here), prune --channels of every conv's output channels
// by the L1 norm of their filters (ln_structured), cut them out (remove_channels), and
// fine-tune the smaller net --finetune-epochs (16) with chapter 07's one-cycle schedule.
//
// MobileNetV2 (chapter 13; --from a checkpoint of lesson-13-mobilenet --save, --width as it was
// trained): the MNIST rounds on CIFAR-10 — global_unstructured over every conv and the head —
// with --finetune-epochs 0 by default (an epoch of it takes 20 minutes on two cores): how far
// one-shot magnitude pruning goes before the accuracy falls.
//
// Next to run.json and curves.svg (of the training fit logs: MNIST's dense training, CIFAR's
// fine-tuning) in --save DIR or runs/lesson-10/:
//   pruning.svg   MNIST, MobileNetV2: test accuracy against sparsity, after each pruning and after
//                 its fine-tuning
// and with --save DIR (MNIST, MobileNetV2), besides the dense training's last.safetensors:
//   pruned.safetensors   after each round: the pruned model, each pruned weight as weight_orig and
//                        weight_mask (PyTorch's names: a PyTorch model pruned the same way loads
//                        it), the optimizer's momentum and the rounds so far (the round before
//                        kept as pruned-prev.safetensors). --resume DIR/pruned.safetensors, with
//                        the same flags, goes on with the next round.
//   sparse.safetensors   MNIST, at the end: the model with its Linear weights in CSR
//                        (SparseLinear's weight_values, weight_col_index, weight_row_start)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "core/allocator.h"       // defines: BumpAllocator
#include "io/svg.h"               // defines: Svg, Plot
#include "nn/conv.h"              // defines: Conv2d
#include "nn/models.h"            // defines: mlp, lenet, cifar_net, mobilenet_v2
#include "nn/norm.h"              // defines: BatchNorm2d
#include "nn/prune.h"             // defines: prune::global_unstructured, ln_structured, remove, ...
#include "nn/sparse_linear.h"     // defines: SparseLinear, sparsify_linears
#include "nn/surgery.h"           // defines: remove_channels
#include "optim/optimizer.h"      // defines: SGD, decay_groups
#include "optim/scheduler.h"      // defines: OneCycleLR
#include "train/checkpoint.h"     // defines: read_safetensors, load_model, load_checkpoint, checkpoint_state
#include "train/cli.h"            // defines: Cli, CommonFlags
#include "train/evaluate.h"       // defines: evaluate
#include "train/fit.h"            // defines: MnistData, only_measure, fit, report
#include "train/prune_rounds.h"   // defines: PruneRounds, save_prune_rounds, resume_prune_rounds
#include "train/run_log.h"        // defines: run_info (the run's folder)

using namespace kiln;

namespace {

// pruning.svg: accuracy against sparsity as a saw — each pruning drops it (red), each
// fine-tuning wins it back (blue) — with the dense net's accuracy as a dashed line. Without
// fine-tuning (tuned = false) only the red points: one-shot pruning at each sparsity.
void save_pruning_plot(const std::vector<PruneRound>& rounds, double dense_acc, bool tuned, const std::string& path) {
    std::vector<double> s{0.0}, acc{100 * dense_acc};
    for (const PruneRound& r : rounds) {
        s.insert(s.end(), {100 * r.sparsity, 100 * r.sparsity});
        acc.insert(acc.end(), {100 * r.acc_pruned, 100 * r.acc_tuned});
    }
    const auto [lo, hi] = std::minmax_element(acc.begin(), acc.end());
    Svg svg(640, 380);
    Plot plot(svg, {70, 40, 540, 280}, {0, 100}, {*lo - 0.2, *hi + 0.2});
    plot.axes("sparsity of the weights (%)", "test accuracy (%)");
    svg.line(plot.at(0, 100 * dense_acc), plot.at(100, 100 * dense_acc), "#888888", 1, true);
    svg.polyline(plot.points(s, acc), "#555555", 1.5);
    for (size_t i = 1; i < s.size(); i++) {  // odd points: after pruning; even: after fine-tuning
        if (i % 2 == 0 && !tuned) continue;
        const Point p = plot.at(s[i], acc[i]);
        svg.rect({p.x - 3, p.y - 3, 6, 6}, i % 2 ? "#d62728" : "#1f77b4");
    }
    if (tuned)
        svg.legend({85, 250}, {{"after pruning", "#d62728"}, {"after fine-tuning", "#1f77b4"}, {"dense", "#888888"}});
    else
        svg.legend({85, 250}, {{"after pruning", "#d62728"}, {"dense", "#888888"}});
    svg.text({320, 22}, tuned ? "accuracy against sparsity: prune, fine-tune, repeat" : "accuracy against sparsity: "
             "pruning without fine-tuning", 14, Anchor::Middle);
    svg.save(path);
    std::printf("wrote %s\n", path.c_str());
}

// What pruning was for, at last: the masks baked in (prune::remove), then every Linear's
// weight stored as CSR (SparseLinear): the weights' bytes and the forward pass's speed, before
// and after. The predictions do not change; only how the zeros are (not) stored. With --save
// DIR the CSR model goes to DIR/sparse.safetensors.
void sparse_savings(Module& model, DataLoader& test, BumpAllocator& arena, const CommonFlags& flags) {
    int64_t dense_bytes = 0, csr_bytes = 0;
    for (auto& [m, name] : prune::prunable_weights(model)) {
        prune::remove(*m, name);
        if (auto* fc = dynamic_cast<Linear*>(m)) dense_bytes += int64_t(fc->weight.value.nbytes());
    }
    const TimedAccuracy dense = evaluate_timed(model, test, &arena);
    sparsify_linears(model);
    for (auto& [path, m] : model.named_modules())
        if (auto* fc = dynamic_cast<SparseLinear*>(m)) csr_bytes += fc->weight.bytes();
    const TimedAccuracy sparse = evaluate_timed(model, test, &arena);
    std::printf("linear weights: dense %.1f KiB -> CSR %.1f KiB (%.1fx smaller); inference %.0f -> %.0f img/s "
                "(%.2fx); test accuracy %.2f%% -> %.2f%%\n",
                dense_bytes / 1024.0, csr_bytes / 1024.0, double(dense_bytes) / double(csr_bytes),
                dense.images_per_second, sparse.images_per_second,
                sparse.images_per_second / dense.images_per_second, 100 * dense.acc, 100 * sparse.acc);
    if (flags.save.empty()) return;
    StateDict state;
    save_model(state, model);
    write_safetensors(flags.save + "/sparse.safetensors", state);
    std::printf("saved %s/sparse.safetensors (the Linear weights in CSR)\n", flags.save.c_str());
}

double weight_sparsity(Module& model) { return prune::total_sparsity(prune::sparsity(model)).sparsity(); }

// Fine-tuning after a pruning: epochs − 1 epochs at a tenth of the training lr, the last at a
// hundredth (as the dense training ended), so that each round ends settled.
double finetune(Module& model, SGD& sgd, DataLoader& train, DataLoader& test, BumpAllocator& arena, float lr,
                int epochs) {
    TrainOptions opt;
    opt.arena = &arena;
    double acc = 0.0;
    for (auto [n, rate] : {std::pair{epochs - 1, lr / 10}, std::pair{1, lr / 100}}) {
        if (n < 1) continue;
        opt.epochs = n;
        sgd.set_lr(rate);
        acc = fit(model, sgd, train, test, opt);
    }
    return acc;
}

// Prunes the model's weights from sparsity `now` to `target`: the smallest |w| of the whole net
// (global_unstructured), or of each layer, every layer to the same sparsity (per_layer).
void prune_to(Module& model, double now, double target, bool per_layer) {
    const double amount = prune::amount_to_reach(now, target);
    if (!per_layer) return prune::global_unstructured(prune::prunable_weights(model), prune::Method::L1Unstructured, amount);
    for (auto& [m, name] : prune::prunable_weights(model)) prune::l1_unstructured(*m, name, amount);
}

// The rounds after those done: prune to the schedule's sparsity, score, fine-tune (when
// finetune_epochs > 0), score; with --save, pruned.safetensors after each.
void prune_and_finetune(Module& model, SGD& sgd, DataLoader& train, DataLoader& test, BumpAllocator& arena,
                        const CommonFlags& flags, PruneRounds& rounds) {
    for (int k = int(rounds.done.size()) + 1; k <= rounds.total; k++) {
        const double target = prune::sparsity_after_round(k, rounds.total, rounds.final_sparsity);
        prune_to(model, rounds.per_layer ? rounds.reached : weight_sparsity(model), target, rounds.per_layer);
        rounds.reached = target;
        PruneRound r{weight_sparsity(model), evaluate(model, test, &arena), 0.0};
        std::printf("round %d/%d: pruned to %.2f%% sparsity, test accuracy %.2f%%; fine-tuning %d epochs\n", k,
                    rounds.total, 100 * r.sparsity, 100 * r.acc_pruned, rounds.finetune_epochs);
        r.acc_tuned = rounds.finetune_epochs > 0
                          ? finetune(model, sgd, train, test, arena, flags.lr, rounds.finetune_epochs)
                          : r.acc_pruned;
        rounds.done.push_back(r);
        if (flags.save.empty()) continue;
        flags.use("--save");
        save_prune_rounds(flags.save + "/pruned.safetensors", flags.save + "/pruned-prev.safetensors", model, sgd,
                          train, rounds);
        std::printf("saved %s/pruned.safetensors (round %d of %d)\n", flags.save.c_str(), k, rounds.total);
    }
}

// --resume of a pruned.safetensors: the rounds go on from it (resume_prune_rounds), and true is
// returned; false for no --resume, or that of a dense training (which fit continues).
bool resume_rounds(const CommonFlags& flags, Module& model, SGD& sgd, DataLoader& train, PruneRounds& rounds) {
    if (flags.resume.empty()) return false;
    const StateDict state = read_safetensors(flags.resume);
    if (!holds_prune_rounds(state)) return false;
    // The command line of the run that wrote it, given again: its dense training took --epochs,
    // and --lr sets the fine-tuning's rates; --overwrite has nothing to replace.
    for (const char* flag : {"--resume", "--epochs", "--lr", "--overwrite"}) flags.use(flag);
    resume_prune_rounds(flags.resume, state, model, sgd, train, rounds);
    std::printf("resumed from %s: %zu of %d rounds done, %.2f%% sparsity\n", flags.resume.c_str(), rounds.done.size(),
                rounds.total, 100 * weight_sparsity(model));
    return true;
}

// After the rounds: each layer's sparsity, pruning.svg, and the accuracy before and after; returns
// the pruned net's accuracy.
double summarize_rounds(Module& model, const std::vector<PruneRound>& rounds_done, double dense_acc, bool tuned,
                        const CommonFlags& flags) {
    prune::print_sparsity(model);
    const std::string dir = run_info(flags).dir;
    std::error_code error;
    std::filesystem::create_directories(dir, error);  // fit makes it for MNIST; MobileNetV2 runs no fit
    KILN_CHECK(!error, "cannot create the folder ", dir, ": ", error.message());
    save_pruning_plot(rounds_done, dense_acc, tuned, dir + "/pruning.svg");
    const double pruned_acc = rounds_done.empty() ? dense_acc : rounds_done.back().acc_tuned;
    std::printf("dense %.2f%% -> pruned %.2f%% at %.2f%% sparsity (%+.2f points)\n", 100 * dense_acc,
                100 * pruned_acc, 100 * weight_sparsity(model), 100 * (pruned_acc - dense_acc));
    return pruned_acc;
}

int run_mnist(const std::string& which, CommonFlags& flags, PruneRounds rounds) {
    const Device device = flags.apply();
    const auto start = std::chrono::steady_clock::now();
    MnistData mnist(flags, device);
    BumpAllocator arena("step arena", device);
    Rng rng(flags.seed);
    std::unique_ptr<Sequential> net = which == "lenet" ? lenet(rng) : mlp(rng, 300, 100);
    Sequential& model = *net;
    model.to(device);
    SGD sgd(model.parameters(), flags.lr, SGD::Options{}.with_momentum(0.9f));
    flags.apply_memory_limit(device);  // --mem-limit, now that the model and its optimizer exist
    if (only_measure(model, sgd, mnist.train, flags, &arena)) return 0;  // --find-batch-size, --time-report
    if (!resume_rounds(flags, model, sgd, mnist.train, rounds)) {
        std::printf("lesson-10: %s, %lld parameters; dense training, %d epochs\n",
                    which == "lenet" ? "LeNet" : "LeNet-300-100 (784-300-100-10)", (long long)model.num_parameters(),
                    flags.epochs);
        rounds.dense_acc = fit(model, sgd, mnist.train, mnist.test, flags, &arena);
    }
    prune_and_finetune(model, sgd, mnist.train, mnist.test, arena, flags, rounds);
    const double pruned_acc = summarize_rounds(model, rounds.done, rounds.dense_acc, rounds.finetune_epochs > 0, flags);
    sparse_savings(model, mnist.test, arena, flags);
    report(flags, device, pruned_acc, start);
    return 0;
}

// ---- CIFAR-10: whole channels ------------------------------------------------------------
// The Conv2d layers of the model, by path, in order.
std::vector<std::string> conv_paths(Module& model) {
    std::vector<std::string> paths;
    for (auto& [path, m] : model.named_modules())
        if (dynamic_cast<Conv2d*>(m)) paths.push_back(path);
    return paths;
}

// The batch norm that normalizes a conv's output in cifar_net: "block1a.conv" -> "block1a.bn";
// null for the stem, which has none.
BatchNorm2d* bn_after(Module& model, const std::string& conv) {
    const size_t dot = conv.rfind('.');
    if (dot == std::string::npos) return nullptr;
    const std::string bn = conv.substr(0, dot) + ".bn";
    for (auto& [path, m] : model.named_modules())
        if (path == bn) return dynamic_cast<BatchNorm2d*>(m);
    return nullptr;
}

// The output channels a conv's weight mask still keeps (a row with any 1), and the [O] mask.
std::vector<int64_t> kept_channels(const Conv2d& conv, Tensor* channel_mask = nullptr) {
    const Tensor mask = conv.weight.mask.to(Device::CPU);
    const int64_t O = conv.out_channels, per = mask.numel() / O;
    std::vector<int64_t> keep;
    if (channel_mask) *channel_mask = Tensor::zeros({O});
    for (int64_t o = 0; o < O; o++) {
        const float* row = mask.data<float>() + o * per;
        if (std::any_of(row, row + per, [](float v) { return v != 0.0f; })) {
            keep.push_back(o);
            if (channel_mask) channel_mask->data<float>()[o] = 1.0f;
        }
    }
    return keep;
}

// Structured pruning of every conv: the `fraction` of its output channels whose filters have
// the smallest L1 norm. The same channels of the conv's bias and of its batch norm's γ and β
// are masked too, so a pruned channel is exactly 0 after BN (x̂·0 + 0) and GELU: the masked
// net computes what the smaller net will.
void prune_channels(Module& model, double fraction) {
    for (const std::string& path : conv_paths(model)) {
        Conv2d& conv = static_cast<Conv2d&>(model.module_at(path));
        prune::ln_structured(conv, "weight", fraction, 1.0, 0);
        Tensor channels;
        kept_channels(conv, &channels);
        if (conv.bias.value.defined()) prune::custom_from_mask(conv, "bias", channels);
        if (BatchNorm2d* bn = bn_after(model, path)) {
            prune::custom_from_mask(*bn, "weight", channels);
            prune::custom_from_mask(*bn, "bias", channels);
        }
    }
}

// Bakes every mask in (prune::remove) and cuts the pruned channels out: a smaller dense net.
void cut_channels(Module& model) {
    std::vector<std::pair<std::string, std::vector<int64_t>>> cuts;
    for (const std::string& path : conv_paths(model))
        cuts.emplace_back(path, kept_channels(static_cast<Conv2d&>(model.module_at(path))));
    for (auto& [path, m] : model.named_modules())
        for (const char* name : {"weight", "bias"})
            if (m->own_parameter(std::string(name) + "_orig")) prune::remove(*m, name);
    for (auto& [path, keep] : cuts) remove_channels(model, path, keep);
}

int run_cifar(CommonFlags& flags, const std::string& from, float fraction, int finetune_epochs) {
    const Device device = flags.apply();
    const auto start = std::chrono::steady_clock::now();
    CifarData cifar(flags, device);
    BumpAllocator arena("step arena", device);
    Rng rng(flags.seed);
    std::unique_ptr<Sequential> net = cifar_net(rng, {32, 64, 128});  // chapter 06's widths
    Sequential& model = *net;
    model.to(device);
    flags.apply_memory_limit(device);  // --mem-limit, now that the model exists (its optimizer's state comes under it)
    // chapter 06's optimizer
    const SGD::Options nesterov = SGD::Options{}.with_momentum(0.9f).with_weight_decay(5e-4f).with_nesterov();
    if (from.empty()) {
        std::printf("lesson-10: chapter 06's CIFAR net, trained here first (%d epochs; --from a lesson-06 "
                    "checkpoint skips this)\n", flags.epochs);
        SGD sgd(model.parameters(), flags.lr, nesterov);
        if (only_measure(model, sgd, cifar.train, flags, &arena)) return 0;  // --find-batch-size, --time-report
        fit(model, sgd, cifar.train, cifar.test, flags, &arena);
    } else {
        load_model(read_safetensors(from), model);
    }
    const int64_t dense_params = model.num_parameters();
    const TimedAccuracy dense = evaluate_timed(model, cifar.test, &arena);
    std::printf("dense:  %lld parameters, test accuracy %.2f%%, inference %.0f img/s\n", (long long)dense_params,
                100 * dense.acc, dense.images_per_second);

    prune_channels(model, fraction);
    const TimedAccuracy masked = evaluate_timed(model, cifar.test, &arena);
    std::printf("masked: %.0f%% of every conv's channels zeroed, test accuracy %.2f%%, inference %.0f img/s "
                "(masks save nothing)\n", 100.0 * fraction, 100 * masked.acc, masked.images_per_second);
    cut_channels(model);
    const TimedAccuracy cut = evaluate_timed(model, cifar.test, &arena);
    std::printf("cut:    %lld parameters (%.2fx fewer), test accuracy %.2f%%, inference %.0f img/s (%.2fx)\n",
                (long long)model.num_parameters(), double(dense_params) / double(model.num_parameters()),
                100 * cut.acc, cut.images_per_second, cut.images_per_second / dense.images_per_second);

    // Fine-tuning with chapter 07's one-cycle schedule (up to lr 0.1 and down again, stepped
    // after every batch), with a new optimizer: the layers are new.
    SGD sgd(model.parameters(), flags.lr, nesterov);
    OneCycleLR one_cycle(sgd, 0.1, finetune_epochs * cifar.train.num_batches());
    TrainOptions opt;
    opt.epochs = finetune_epochs;
    opt.scheduler = &one_cycle;
    opt.per_batch = true;
    opt.arena = &arena;
    opt.run = run_info(flags);  // run.json and curves.svg of the fine-tuning
    const double tuned = fit(model, sgd, cifar.train, cifar.test, opt);
    std::printf("dense %.2f%% -> %.0f%% of the channels removed and fine-tuned %.2f%% (%+.2f points)\n",
                100 * dense.acc, 100.0 * fraction, 100 * tuned, 100 * (tuned - dense.acc));
    report(flags, device, tuned, start);
    return 0;
}

// ---- MobileNetV2 (chapter 13): the MNIST rounds on CIFAR-10 -------------------------------
int run_mobilenet(CommonFlags& flags, const std::string& from, float width, PruneRounds rounds) {
    KILN_USAGE_CHECK(!from.empty(), "--model mobilenet needs --from: the checkpoint of a lesson-13-mobilenet run with "
               "--save DIR (DIR/last.safetensors); training it takes hours, so lesson-10 does not");
    const Device device = flags.apply();
    const auto start = std::chrono::steady_clock::now();
    CifarData cifar(flags, device);
    BumpAllocator arena("step arena", device);
    Rng rng(flags.seed);
    std::unique_ptr<Sequential> net = mobilenet_v2(rng, 10, width);
    Sequential& model = *net;
    model.to(device);
    flags.apply_memory_limit(device);  // --mem-limit, now that the model exists (its optimizer's state comes under it)
    load_model(read_safetensors(from), model);
    flags.use("--lr");
    SGD sgd(decay_groups(model, flags.lr, 5e-4f),
            SGD::Options{}.with_momentum(0.9f).with_nesterov());  // lesson-13-mobilenet's
    if (!resume_rounds(flags, model, sgd, cifar.train, rounds)) {
        KILN_USAGE_CHECK(flags.resume.empty(), "--resume ", flags.resume, " is not a pruned.safetensors of lesson-10's "
                         "rounds: with --model mobilenet, --resume continues the rounds, and --from gives the dense net");
        if (!flags.save.empty()) {  // a new run: its folder must not hold another run's checkpoints
            TrainOptions saving;
            saving.save_dir = flags.save, saving.overwrite = flags.overwrite;
            check_save_dir(saving);
            flags.use("--overwrite");
        }
        rounds.dense_acc = evaluate(model, cifar.test, &arena);
    }
    std::printf("lesson-10: MobileNetV2 width %.2f from %s, %lld parameters, test accuracy %.2f%%; %d rounds to "
                "%.0f%% sparsity (%s), %d fine-tuning epochs each\n", double(width), from.c_str(),
                (long long)model.num_parameters(), 100 * rounds.dense_acc, rounds.total, 100 * rounds.final_sparsity,
                rounds.per_layer ? "every layer alike" : "global", rounds.finetune_epochs);
    prune_and_finetune(model, sgd, cifar.train, cifar.test, arena, flags, rounds);
    const double pruned_acc = summarize_rounds(model, rounds.done, rounds.dense_acc, rounds.finetune_epochs > 0, flags);
    report(flags, device, pruned_acc, start);
    return 0;
}

}  // namespace

int main(int argc, char** argv) try {
    CommonFlags flags;
    flags.epochs = 10;
    flags.lr = 0.05f;
    std::string model = "mlp", from;
    float width = 1.0f;
    bool per_layer = false;
    int rounds = 6, finetune_epochs = 4;
    float final_sparsity = 0.92f, channels = 0.5f;
    Cli cli("lesson-10", "Prunes a network with masks, fine-tunes it, and measures what pruning saves.");
    flags.add_to(cli);
    cli.add("--model", &model, "mlp (LeNet-300-100), lenet (chapter 03's), cifar (chapter 06's net) or mobilenet "
            "(chapter 13's MobileNetV2)", {"mlp", "lenet", "cifar", "mobilenet"});
    cli.add("--rounds", &rounds, "MNIST, MobileNetV2: prune-and-fine-tune rounds", Cli::at_least(1));
    cli.add("--sparsity", &final_sparsity, "MNIST, MobileNetV2: the weights' sparsity after the last round", Cli::Range{0.0, 1.0, true});
    cli.add("--finetune-epochs", &finetune_epochs, "epochs of fine-tuning: after each pruning round (MNIST), after the cut (CIFAR, 16)", Cli::at_least(0));
    cli.add("--channels", &channels, "CIFAR: the fraction of every conv's output channels to remove", Cli::Range{0.0, 1.0, true});
    cli.add("--from", &from, "CIFAR: the trained dense net, a lesson-06 checkpoint (else it is trained here); "
            "MobileNetV2: a lesson-13-mobilenet checkpoint (needed)");
    cli.add("--width", &width, "MobileNetV2: the width multiplier it was trained with", Cli::positive());
    cli.add("--per-layer", &per_layer, "MNIST, MobileNetV2: prune every layer to the round's sparsity (l1_unstructured) "
            "instead of the smallest weights of the whole net (global_unstructured)");
    if (command_line_has(argc, argv, "--model", "cifar")) {  // chapter 06's settings, before the command line may change them
        flags.batch_size = 128;
        flags.data = "data/cifar10";
        finetune_epochs = 16;
    }
    if (command_line_has(argc, argv, "--model", "mobilenet")) {  // lesson-13-mobilenet's settings
        flags.batch_size = 128;
        flags.data = "data/cifar10-png";
        flags.lr = 0.1f;
        finetune_epochs = 0;
        final_sparsity = 0.9f;
    }
    cli.parse(argc, argv);
    KILN_USAGE_CHECK(from.empty() || model == "cifar" || model == "mobilenet", "--from is the trained dense net of "
                     "--model cifar or mobilenet; --model ", model, " trains its own");
    // --from skips the dense training: the flags that shape it do not apply (but --lr: MobileNetV2's
    // fine-tuning rounds start from it; and --resume: of its rounds)
    if (!from.empty())
        flags.refuse_training_flags("--from loads the dense net instead of training it" +
                                        std::string(model == "mobilenet" ? " (lesson-13-mobilenet trains and measures MobileNetV2)" : ""),
                                    model == "mobilenet" ? std::vector<std::string>{"--lr", "--resume"} : std::vector<std::string>{});
    if (model == "cifar") return run_cifar(flags, from, channels, finetune_epochs);
    const PruneRounds pruning{rounds, final_sparsity, finetune_epochs, per_layer};
    if (model == "mobilenet") return run_mobilenet(flags, from, width, pruning);
    return run_mnist(model, flags, pruning);
} catch (const std::exception& e) {
    std::fprintf(stderr, "lesson-10: %s\n", e.what());
    return 1;
}
