// test_prune.cpp — chapter 10's masks against PyTorch's torch.nn.utils.prune rules: hand-computed
// masks, amounts as counts and fractions (halves to even), pruning again, ties, structured
// slices, global ranking, the gradient of pruned entries, remove, checkpoints, and CUDA.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "fixtures.h"
#include "nn/conv.h"
#include "nn/layers.h"
#include "nn/models.h"
#include "nn/prune.h"
#include "ops/ops.h"
#include "optim/optimizer.h"
#include "train/checkpoint.h"
#include "train/loop.h"
#include "train/prune_rounds.h"

using namespace kiln;
using Catch::Contains;
using kiln::test::require_identical;
using kiln::test::tensor_of;

namespace {
std::vector<float> values(const Tensor& t) {
    const Tensor c = t.to(Device::CPU);
    return std::vector<float>(c.data<float>(), c.data<float>() + c.numel());
}

// A 3 → 2 Linear without bias whose weight is w (2×3, row-major).
std::unique_ptr<Linear> linear_with(const std::vector<float>& w) {
    Rng rng(1);
    auto fc = std::make_unique<Linear>(3, 2, rng, false, "fc");
    fc->weight.value.copy_from(tensor_of({2, 3}, w));
    return fc;
}

std::vector<std::string> param_names(Module& m) {
    std::vector<std::string> names;
    for (auto& [name, p] : m.named_parameters()) names.push_back(name);
    return names;
}
std::vector<std::string> buffer_names(Module& m) {
    std::vector<std::string> names;
    for (auto& [name, t] : m.named_buffers()) names.push_back(name);
    return names;
}
}  // namespace

TEST_CASE("an amount is a count or a fraction rounded like Python's round", "[lesson10][prune][cpu]") {
    using prune::Amount;
    REQUIRE(Amount(3).of(10, "w") == 3);
    REQUIRE(Amount(0.5).of(3, "w") == 2);    // 1.5 -> 2 (even)
    REQUIRE(Amount(0.5).of(5, "w") == 2);    // 2.5 -> 2 (even)
    REQUIRE(Amount(0.5).of(7, "w") == 4);    // 3.5 -> 4 (even)
    REQUIRE(Amount(0.3).of(10, "w") == 3);
    REQUIRE(Amount(0.0).of(10, "w") == 0);
    REQUIRE(Amount(1.0).of(10, "w") == 10);
    REQUIRE(Amount(0).of(10, "w") == 0);
    REQUIRE_THROWS_WITH(Amount(11).of(10, "fc.weight"), Contains("fc.weight") && Contains("only 10 are left"));
    REQUIRE_THROWS_WITH(Amount(1.5), Contains("fraction in [0, 1]"));
    REQUIRE_THROWS_WITH(Amount(-0.1), Contains("fraction in [0, 1]"));
    REQUIRE_THROWS_WITH(Amount(-1), Contains("count ≥ 0"));
}

TEST_CASE("l1_unstructured: weight_orig, weight_mask, and the smallest |w| zeroed", "[lesson10][prune][cpu]") {
    auto fc_owner = linear_with({3, -1, 2, -5, 0.5f, 4});
    Linear& fc = *fc_owner;
    prune::l1_unstructured(fc, "weight", 2);  // |w| = 3 1 2 5 0.5 4: the two smallest are −1 and 0.5
    REQUIRE(param_names(fc) == std::vector<std::string>{"weight_orig"});
    REQUIRE(buffer_names(fc) == std::vector<std::string>{"weight_mask"});
    REQUIRE(values(fc.weight.mask) == std::vector<float>{1, 0, 1, 1, 0, 1});
    REQUIRE(values(fc.weight.value) == std::vector<float>{3, -1, 2, -5, 0.5f, 4});  // the original, kept
    REQUIRE(prune::is_pruned(fc));

    // The forward uses W = orig ⊙ mask:  x = [1, 2, 3]  ->  y = [3·1 + 2·3, −5·1 + 4·3] = [9, 7]
    const Tensor y = fc.call(tensor_of({1, 3}, {1, 2, 3}));
    REQUIRE(values(y) == std::vector<float>{9, 7});
}

TEST_CASE("ties go to the lower index; amount 0 prunes nothing, 1.0 everything", "[lesson10][prune][cpu]") {
    auto ties_owner = linear_with({1, 1, 1, 1, 1, 1});
    Linear& ties = *ties_owner;
    prune::l1_unstructured(ties, "weight", 2);
    REQUIRE(values(ties.weight.mask) == std::vector<float>{0, 0, 1, 1, 1, 1});

    auto none_owner = linear_with({1, 2, 3, 4, 5, 6});
    Linear& none = *none_owner;
    prune::l1_unstructured(none, "weight", 0.0);
    REQUIRE(values(none.weight.mask) == std::vector<float>(6, 1.0f));

    auto all_owner = linear_with({1, 2, 3, 4, 5, 6});
    Linear& all = *all_owner;
    prune::l1_unstructured(all, "weight", 1.0);
    REQUIRE(values(all.weight.mask) == std::vector<float>(6, 0.0f));
    REQUIRE(values(all.call(tensor_of({1, 3}, {1, 2, 3}))) == std::vector<float>{0, 0});
}

TEST_CASE("pruning again prunes the amount of what is left", "[lesson10][prune][cpu]") {
    auto fc_owner = linear_with({6, 5, 4, 3, 2, 1});
    Linear& fc = *fc_owner;
    prune::l1_unstructured(fc, "weight", 0.5);  // 3 of 6: 3, 2, 1
    REQUIRE(values(fc.weight.mask) == std::vector<float>{1, 1, 1, 0, 0, 0});
    prune::l1_unstructured(fc, "weight", 0.5);  // round(0.5 · 3) = 2 of the 3 left: 5 and 4
    REQUIRE(values(fc.weight.mask) == std::vector<float>{1, 0, 0, 0, 0, 0});
    REQUIRE_THROWS_WITH(prune::l1_unstructured(fc, "weight", 2), Contains("fc.weight") && Contains("only 1 are left"));
    REQUIRE(values(fc.weight.mask) == std::vector<float>{1, 0, 0, 0, 0, 0});  // unchanged by the error
    REQUIRE(param_names(fc) == std::vector<std::string>{"weight_orig"});       // renamed once
}

TEST_CASE("pruned entries get no gradient and stay pruned while training", "[lesson10][prune][cpu]") {
    auto fc_owner = linear_with({3, -1, 2, -5, 0.5f, 4});
    Linear& fc = *fc_owner;
    SGD sgd(fc.parameters(), 0.1f,
            SGD::Options{}.with_momentum(0.9f).with_weight_decay(0.01f));  // built before pruning
    prune::l1_unstructured(fc, "weight", 2);
    const Tensor x = tensor_of({2, 3}, {1, 2, 3, -1, 0, 2});
    for (int step = 0; step < 3; step++) {
        fc.zero_grad();
        const Tensor y = fc.call(x);
        fc.call_backward(Tensor::ones(y.shape()));
        // dW = dyᵀ · x = Σ_n x[n, :] on each row = [0, 2, 5]; the mask zeroes entries 1 and 4
        REQUIRE(values(fc.weight.grad) == std::vector<float>{0, 0, 5, 0, 0, 5});
        sgd.step();
    }
    // The kept entries moved, the pruned ones are still computed as 0.
    const std::vector<float> orig = values(fc.weight.value), mask = values(fc.weight.mask);
    REQUIRE(orig[0] != 3.0f);
    fc.call(x);
    const std::vector<float> used = values(fc.weight.used());
    for (size_t i = 0; i < used.size(); i++) REQUIRE(used[i] == orig[i] * mask[i]);
    REQUIRE(used[1] == 0.0f);
    REQUIRE(used[4] == 0.0f);
}

TEST_CASE("remove bakes the mask in and makes weight a plain parameter", "[lesson10][prune][cpu]") {
    auto fc_owner = linear_with({3, -1, 2, -5, 0.5f, 4});
    Linear& fc = *fc_owner;
    REQUIRE_THROWS_WITH(prune::remove(fc, "weight"), Contains("fc") && Contains("is not pruned"));
    prune::l1_unstructured(fc, "weight", 2);
    prune::remove(fc, "weight");
    REQUIRE(param_names(fc) == std::vector<std::string>{"weight"});
    REQUIRE(buffer_names(fc).empty());
    REQUIRE_FALSE(prune::is_pruned(fc));
    REQUIRE(values(fc.weight.value) == std::vector<float>{3, 0, 2, -5, 0, 4});
    REQUIRE(fc.weight.transforms.empty());
    REQUIRE(values(fc.call(tensor_of({1, 3}, {1, 2, 3}))) == std::vector<float>{9, 7});
    REQUIRE_THROWS_WITH(prune::l1_unstructured(fc, "scale", 1), Contains("no parameter \"scale\""));
}

TEST_CASE("ln_structured zeroes whole slices of smallest norm", "[lesson10][prune][cpu]") {
    Rng rng(1);
    Conv2d conv(2, 3, 1, rng, ConvOptions{}, "conv");  // weight [3, 2, 1, 1]: three output channels
    // channel 0: (3, 0)  L1 3, L2 3     channel 1: (2, 2)  L1 4, L2 2.83     channel 2: (1, 4)  L1 5, L2 4.12
    conv.weight.value.copy_from(tensor_of({3, 2, 1, 1}, {3, 0, 2, 2, 1, 4}));
    prune::ln_structured(conv, "weight", 1, 1.0, 0);
    REQUIRE(values(conv.weight.mask) == std::vector<float>{0, 0, 1, 1, 1, 1});

    Conv2d by_l2(2, 3, 1, rng, ConvOptions{}, "conv");
    by_l2.weight.value.copy_from(tensor_of({3, 2, 1, 1}, {3, 0, 2, 2, 1, 4}));
    prune::ln_structured(by_l2, "weight", 1, 2.0, 0);  // the L2 norm picks channel 1
    REQUIRE(values(by_l2.weight.mask) == std::vector<float>{1, 1, 0, 0, 1, 1});
    prune::ln_structured(by_l2, "weight", 0.5, 2.0, 0);  // round(0.5 · 2 channels left) = 1: channel 0
    REQUIRE(values(by_l2.weight.mask) == std::vector<float>{0, 0, 0, 0, 1, 1});

    Conv2d by_max(2, 3, 1, rng, ConvOptions{}, "conv");
    by_max.weight.value.copy_from(tensor_of({3, 2, 1, 1}, {3, 0, 2, 2, 1, 4}));
    prune::ln_structured(by_max, "weight", 1, INFINITY, -4);  // dim −4 = 0; max |w|: channel 1 (2)
    REQUIRE(values(by_max.weight.mask) == std::vector<float>{1, 1, 0, 0, 1, 1});

    Conv2d inputs(2, 3, 1, rng, ConvOptions{}, "conv");
    inputs.weight.value.copy_from(tensor_of({3, 2, 1, 1}, {3, 0, 2, 2, 1, 4}));
    prune::ln_structured(inputs, "weight", 1, 1.0, 1);  // input channels: (3, 2, 1) L1 6, (0, 2, 4) L1 6: a tie
    REQUIRE(values(inputs.weight.mask) == std::vector<float>{0, 1, 0, 1, 0, 1});

    REQUIRE_THROWS_WITH(prune::ln_structured(conv, "weight", 1, 1.0, 4), Contains("dim 4 is out of range"));
    REQUIRE_THROWS_WITH(prune::ln_structured(conv, "weight", 1, 0.0, 0), Contains("norm n > 0"));
    REQUIRE_THROWS_WITH(prune::ln_structured(conv, "weight", 3, 1.0, 0), Contains("only 2 are left"));
    REQUIRE_THROWS_WITH(prune::ln_structured(conv, "bias", 1, 1.0, 0), Contains("two dims or more"));
}

// After an earlier prune, PyTorch ranks the weight as computed (weight_orig ⊙ weight_mask, what
// getattr(module, "weight") returns), so entries pruned before count as zeros in a slice's norm.
// The masks PyTorch gives (torch.nn.utils.prune, the same in 1.13 and 2.x):
//   fc = nn.Linear(2, 3, bias=False); fc.weight.data = torch.tensor([[5, .1], [.1, 4], [0, 3]])
//   prune.ln_structured(fc, "weight", amount=1, n=1, dim=0)  # rows' L1 5.1, 4.1, 3: row 2
//   prune.ln_structured(fc, "weight", amount=1, n=1, dim=1)  # columns of W: 5.1, 4.1: column 1
//   fc.weight_mask  ->  [[1, 0], [1, 0], [0, 0]]   (ranking weight_orig's columns, 5.1 and 7.1,
//                                                    would drop column 0)
//   fc = nn.Linear(5, 2, bias=False); fc.weight.data = torch.tensor([[.1, .1, .1, .1, 5], [1.05] * 5])
//   prune.l1_unstructured(fc, "weight", amount=4)            # the four 0.1s
//   prune.ln_structured(fc, "weight", amount=1, n=1, dim=0)  # rows of W: 5 and 5.25: row 0
//   fc.weight_mask  ->  [[0, 0, 0, 0, 0], [1, 1, 1, 1, 1]]  (weight_orig's rows, 5.4 and 5.25,
//                                                            would drop row 1)
TEST_CASE("pruning again ranks the weight as computed, weight_orig ⊙ mask, as PyTorch", "[lesson10][prune][cpu]") {
    Rng rng(1);
    Linear rows_then_columns(2, 3, rng, false, "fc");
    rows_then_columns.weight.value.copy_from(tensor_of({3, 2}, {5, 0.1f, 0.1f, 4, 0, 3}));
    prune::ln_structured(rows_then_columns, "weight", 1, 1.0, 0);
    REQUIRE(values(rows_then_columns.weight.mask) == std::vector<float>{1, 1, 1, 1, 0, 0});
    prune::ln_structured(rows_then_columns, "weight", 1, 1.0, 1);
    REQUIRE(values(rows_then_columns.weight.mask) == std::vector<float>{1, 0, 1, 0, 0, 0});

    Linear entries_then_rows(5, 2, rng, false, "fc");
    entries_then_rows.weight.value.copy_from(tensor_of({2, 5}, {0.1f, 0.1f, 0.1f, 0.1f, 5, 1.05f, 1.05f, 1.05f, 1.05f, 1.05f}));
    prune::l1_unstructured(entries_then_rows, "weight", 4);
    REQUIRE(values(entries_then_rows.weight.mask) == std::vector<float>{0, 0, 0, 0, 1, 1, 1, 1, 1, 1});
    prune::ln_structured(entries_then_rows, "weight", 1, 1.0, 0);
    REQUIRE(values(entries_then_rows.weight.mask) == std::vector<float>{0, 0, 0, 0, 0, 1, 1, 1, 1, 1});
}

TEST_CASE("random_unstructured prunes exactly the amount, among what is left", "[lesson10][prune][cpu]") {
    Rng init(3);
    Linear fc(40, 25, init, false, "fc");
    Rng rng(7);
    prune::random_unstructured(fc, "weight", 0.4, rng);  // 400 of 1000
    std::vector<float> first = values(fc.weight.mask);
    REQUIRE(std::count(first.begin(), first.end(), 0.0f) == 400);
    prune::random_unstructured(fc, "weight", 100, rng);
    const std::vector<float> second = values(fc.weight.mask);
    REQUIRE(std::count(second.begin(), second.end(), 0.0f) == 500);
    for (size_t i = 0; i < first.size(); i++)
        if (first[i] == 0.0f) REQUIRE(second[i] == 0.0f);  // a pruned entry stays pruned

    Linear again(40, 25, init, false, "fc");  // the same seed draws the same mask
    Rng same(7);
    prune::random_unstructured(again, "weight", 0.4, same);
    REQUIRE(values(again.weight.mask) == first);
}

TEST_CASE("global_unstructured ranks all the weights together", "[lesson10][prune][cpu]") {
    auto a_owner = linear_with({10, 20, 30, 40, 50, 60});
    Linear& a = *a_owner;
    auto b_owner = linear_with({1, 2, 3, 4, 5, 60});
    Linear& b = *b_owner;
    prune::global_unstructured({{&a, "weight"}, {&b, "weight"}}, prune::Method::L1Unstructured, 0.5);
    // 6 of 12: all of b's five small ones, then a's 10
    REQUIRE(values(a.weight.mask) == std::vector<float>{0, 1, 1, 1, 1, 1});
    REQUIRE(values(b.weight.mask) == std::vector<float>{0, 0, 0, 0, 0, 1});
    // Again: 2 more of the 6 left, ranked by the weights as computed (pruned ones are 0 and gone).
    prune::global_unstructured({{&a, "weight"}, {&b, "weight"}}, prune::Method::L1Unstructured, 2);
    REQUIRE(values(a.weight.mask) == std::vector<float>{0, 0, 0, 1, 1, 1});
    REQUIRE_THROWS_WITH(prune::global_unstructured({{&a, "weight"}}, prune::Method::L1Unstructured, 4),
                        Contains("global_unstructured") && Contains("only 3 are left"));
    REQUIRE_THROWS_WITH(prune::global_unstructured({{&a, "weight"}}, prune::Method::RandomUnstructured, 1),
                        Contains("needs an rng"));
}

TEST_CASE("custom_from_mask multiplies masks; bad masks are refused", "[lesson10][prune][cpu]") {
    auto fc_owner = linear_with({1, 2, 3, 4, 5, 6});
    Linear& fc = *fc_owner;
    prune::custom_from_mask(fc, "weight", tensor_of({2, 3}, {1, 1, 0, 1, 1, 1}));
    prune::custom_from_mask(fc, "weight", tensor_of({2, 3}, {0, 1, 1, 1, 1, 1}));
    REQUIRE(values(fc.weight.mask) == std::vector<float>{0, 1, 0, 1, 1, 1});
    REQUIRE_THROWS_WITH(prune::custom_from_mask(fc, "weight", tensor_of({3, 2}, {1, 1, 1, 1, 1, 1})),
                        Contains("fc.weight") && Contains("the parameter's shape"));
    REQUIRE_THROWS_WITH(prune::custom_from_mask(fc, "weight", tensor_of({2, 3}, {1, 0.5f, 1, 1, 1, 1})),
                        Contains("0s and 1s") && Contains("entry 1"));
}

TEST_CASE("sparsity counts the weights' zeros; schedules reach their target", "[lesson10][prune][cpu]") {
    Rng rng(1);
    auto net = mlp(rng, 8, 4);  // fc1 784×8, fc2 8×4, fc3 4×10
    prune::l1_unstructured(net->module_at("fc1"), "weight", 0.75);
    const std::vector<prune::SparsityRow> rows = prune::sparsity(*net);
    REQUIRE(rows.size() == 3);
    REQUIRE(rows[0].name == "fc1.weight");
    REQUIRE(rows[0].zeros == 4704);  // round(0.75 · 6272)
    REQUIRE(rows[1].zeros == 0);
    const prune::SparsityRow total = prune::total_sparsity(rows);
    REQUIRE(total.numel == 6272 + 32 + 40);
    REQUIRE(total.zeros == 4704);
    REQUIRE(prune::prunable_weights(*net).size() == 3);

    REQUIRE(prune::sparsity_after_round(0, 5, 0.9) == 0.0);
    REQUIRE(prune::sparsity_after_round(5, 5, 0.9) == Approx(0.9));
    REQUIRE(prune::sparsity_after_round(1, 5, 0.9) == Approx(0.9 * (1 - 0.8 * 0.8 * 0.8)));
    REQUIRE(prune::amount_to_reach(0.5, 0.75) == Approx(0.5));
    REQUIRE_THROWS_WITH(prune::amount_to_reach(0.8, 0.5), Contains("0 ≤ now ≤ target"));
}

TEST_CASE("masks survive a checkpoint exactly, and training resumes exactly", "[lesson10][prune][checkpoint][cpu]") {
    kiln::test::TempDir dir;
    Rng data(9);
    const Tensor x = Tensor::normal({4, 1, 28, 28}, 0.0f, 1.0f, data);
    const Tensor labels = Tensor::arange(4, DType::I32);
    const SGD::Options momentum = SGD::Options{}.with_momentum(0.9f).with_weight_decay(5e-4f).with_nesterov();
    auto pruned_lenet = [](uint64_t seed) {
        Rng rng(seed);
        return lenet(rng);
    };

    auto net = pruned_lenet(5);
    SGD sgd(net->parameters(), 0.1f, momentum);
    prune::global_unstructured(prune::prunable_weights(*net), prune::Method::L1Unstructured, 0.8);
    prune::ln_structured(net->module_at("conv2"), "weight", 0.25, 1.0, 0);
    train_step(*net, sgd, x, labels, {});  // momentum buffers in the checkpoint too
    TrainingRun run{*net, sgd};
    save_checkpoint(dir.file("pruned.safetensors"), run, {});

    auto fresh = pruned_lenet(6);
    SGD fresh_sgd(fresh->parameters(), 0.1f, momentum);
    TrainingRun fresh_run{*fresh, fresh_sgd};
    REQUIRE_THROWS_WITH(load_checkpoint(dir.file("pruned.safetensors"), fresh_run),
                        Contains("pruned model") && Contains("weight_mask") && Contains("prune_like"));

    auto resumed = pruned_lenet(6);
    SGD resumed_sgd(resumed->parameters(), 0.1f, momentum);
    TrainingRun resumed_run{*resumed, resumed_sgd};
    prune::prune_like(read_safetensors(dir.file("pruned.safetensors")), *resumed);
    load_checkpoint(dir.file("pruned.safetensors"), resumed_run);
    auto a = net->named_buffers(), b = resumed->named_buffers();
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); i++) {
        REQUIRE(a[i].first == b[i].first);
        require_identical(*b[i].second, *a[i].second);
    }
    for (int step = 0; step < 2; step++) {  // both go on the same way
        train_step(*net, sgd, x, labels, {});
        train_step(*resumed, resumed_sgd, x, labels, {});
    }
    auto pa = net->named_parameters(), pb = resumed->named_parameters();
    for (size_t i = 0; i < pa.size(); i++) require_identical(pb[i].second->value, pa[i].second->value);
    require_identical(resumed->call(x), net->call(x));
}

// Chapter 10's rounds saved after round 1 (train/prune_rounds.h) and resumed by a fresh run:
// round 2 then ends, bit for bit, where the run that never stopped ends — the masks, the
// weights, the momentum and the rounds' record all came back. Other settings are refused.
TEST_CASE("pruning rounds are saved after each round and resumed exactly", "[lesson10][prune][checkpoint][cpu]") {
    kiln::test::TempDir dir;
    ImageSet set;
    set.n = 32, set.c = 1, set.h = 28, set.w = 28;
    Rng data(4);
    for (int64_t i = 0; i < set.n * 28 * 28; i++) set.pixels.push_back(uint8_t(data.next_below(256)));
    for (int64_t i = 0; i < set.n; i++) set.labels.push_back(int32_t(data.next_below(10)));
    struct Run {
        static LoaderOptions sixteen() {
            LoaderOptions o;
            o.batch_size = 16;
            return o;
        }
        explicit Run(const ImageSet& set) : loader(set, sixteen()) {}
        Rng rng{2};
        std::unique_ptr<Sequential> model = mlp(rng, 16, 8);
        SGD sgd{model->parameters(), 0.05f, SGD::Options{}.with_momentum(0.9f)};
        DataLoader loader;
        PruneRounds rounds{2, 0.75, 1, false};
        // Round k: prune the whole net to its sparsity, then an epoch of fine-tuning.
        void round(int k) {
            const double now = prune::total_sparsity(prune::sparsity(*model)).sparsity();
            const double target = prune::sparsity_after_round(k, rounds.total, rounds.final_sparsity);
            prune::global_unstructured(prune::prunable_weights(*model), prune::Method::L1Unstructured,
                                       prune::amount_to_reach(now, target));
            loader.start_epoch(k);
            for (Batch b; loader.next(b);) train_step(*model, sgd, b.x, b.y, {});
            rounds.done.push_back({target, 0.1 * k, 0.2 * k});
        }
    };
    Run straight(set);
    straight.rounds.dense_acc = 0.5;
    straight.round(1);
    save_prune_rounds(dir.file("pruned.safetensors"), dir.file("pruned-prev.safetensors"), *straight.model,
                      straight.sgd, straight.loader, straight.rounds);
    straight.round(2);

    Run resumed(set);
    const StateDict state = read_safetensors(dir.file("pruned.safetensors"));
    REQUIRE(holds_prune_rounds(state));
    REQUIRE(state.tensors.count("fc1.weight_orig"));
    REQUIRE(state.tensors.count("fc1.weight_mask"));
    resume_prune_rounds(dir.file("pruned.safetensors"), state, *resumed.model, resumed.sgd, resumed.loader,
                        resumed.rounds);
    REQUIRE(resumed.rounds.dense_acc == 0.5);
    REQUIRE(resumed.rounds.done.size() == 1);
    REQUIRE(resumed.rounds.done[0].acc_tuned == 0.2);
    resumed.round(2);
    auto a = straight.model->named_parameters(), b = resumed.model->named_parameters();
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); i++) {
        INFO(a[i].first);
        REQUIRE(a[i].first == b[i].first);
        require_identical(b[i].second->value, a[i].second->value);
        if (a[i].second->mask.defined()) require_identical(b[i].second->mask, a[i].second->mask);
    }

    Run other(set);
    other.rounds.total = 3;
    REQUIRE_THROWS_WITH(resume_prune_rounds(dir.file("pruned.safetensors"), state, *other.model, other.sgd,
                                            other.loader, other.rounds),
                        Contains("--rounds") && Contains("pruned.safetensors"));
    StateDict not_rounds;
    REQUIRE_FALSE(holds_prune_rounds(not_rounds));
}

TEST_CASE("a pruned layer on CUDA computes what it does on the CPU", "[lesson10][prune][cuda]") {
    auto cpu_owner = linear_with({3, -1, 2, -5, 0.5f, 4});
    Linear& cpu = *cpu_owner;
    auto gpu_owner = linear_with({3, -1, 2, -5, 0.5f, 4});
    Linear& gpu = *gpu_owner;
    prune::l1_unstructured(cpu, "weight", 2);
    gpu.to(Device::CUDA);  // pruned on the device ...
    prune::l1_unstructured(gpu, "weight", 2);
    const Tensor x = tensor_of({2, 3}, {1, 2, 3, -1, 0, 2});
    require_identical(gpu.call(x.to(Device::CUDA)), cpu.call(x));
    gpu.call_backward(Tensor::ones({2, 2}, DType::F32, Device::CUDA));
    cpu.call_backward(Tensor::ones({2, 2}));
    require_identical(gpu.weight.grad, cpu.weight.grad);

    auto moved_owner = linear_with({3, -1, 2, -5, 0.5f, 4});
    Linear& moved = *moved_owner;
    prune::l1_unstructured(moved, "weight", 2);
    moved.to(Device::CUDA);  // ... or before the move: mask and masked weight go along
    REQUIRE(moved.weight.mask.device() == Device::CUDA);
    REQUIRE(moved.weight.used().device() == Device::CUDA);
    require_identical(moved.call(x.to(Device::CUDA)), cpu.call(x));
}

TEST_CASE("mul_into: a ⊙ b on the CPU and CUDA, in place too", "[ops][cpu][cuda][lesson10]") {
    const Tensor a = tensor_of({2, 2}, {1, -2, 3, 0.5f}), b = tensor_of({2, 2}, {2, 0, -1, 4});
    Tensor y = Tensor::empty({2, 2});
    mul_into(a, b, y);
    REQUIRE(values(y) == std::vector<float>{2, 0, -3, 2});
    Tensor g = a.to(Device::CUDA);
    mul_into(g, b.to(Device::CUDA), g);
    require_identical(g, y);
    REQUIRE_THROWS_WITH(mul_into(a, tensor_of({4}, {1, 2, 3, 4}), y), Contains("mul_into"));
}
