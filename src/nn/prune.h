// prune.h — pruning with masks, with the semantics of PyTorch's torch.nn.utils.prune
// (chapter 10).
//
//   prune::l1_unstructured(fc1, "weight", 0.3);   // the 30% of fc1.weight smallest in |w| -> 0
//   prune::l1_unstructured(fc1, "weight", 0.3);   // 30% of what is left: 51% in all
//   prune::remove(fc1, "weight");                 // bake the zeros in: a plain weight again
//
// What pruning does to a layer's parameter "weight" (the Parameter stays the same object, so an
// optimizer built before keeps updating it):
//
//   before:  parameter "weight"  ──────────────────────────────> the layer computes with it
//   after:   parameter "weight_orig" (all values, learned) ─┐
//            buffer    "weight_mask" (0 or 1 per entry)  ───┴─ ⊙ ─> the "prune" weight transform
//                                                                   (nn/module.h), remade before
//                                                                   every forward; the layer reads
//                                                                   it as weight.used()
//   backward: dL/d weight_orig = dL/dW ⊙ mask   (a backward hook): pruned entries get no
//             gradient, so they stay pruned however long training goes on.
//
// So masks save nothing: a pruned layer holds the weight, the mask and the masked copy — three
// times the weight's bytes — and runs the same dense kernels. The savings come from removing
// channels (nn/surgery.h) or storing only the nonzeros (ops/sparse.h).
//
// The rules, as PyTorch's:
//   amount    a count of entries (channels for ln_structured), or a fraction of them: a
//             fraction is rounded like Python's round (halves to even: 2.5 -> 2, 3.5 -> 4).
//   again     pruning a pruned parameter prunes `amount` of what is left: the entries (or whole
//             channels) the mask still keeps. The new mask is the old one with more zeros.
//   scores    every method ranks the weight the layer computes with, weight_orig ⊙ mask, as
//             PyTorch ranks getattr(module, name), the same product. The unstructured methods
//             rank only the entries still kept, whose values are weight_orig's; ln_structured's
//             norm of a slice counts the entries pruned before as the zeros they now are.
//             (PyTorch's attribute is the product its forward pre-hook made last: after an
//             optimizer step with no forward since, it still holds the values from before the
//             step. kiln takes the product when it prunes.)
//   ties      kiln prunes the lower index first (PyTorch's topk leaves ties unspecified).
//             ln_structured sums a slice's |w|ⁿ in double, PyTorch's torch.norm in float: two
//             slices whose norms agree to a float's precision may be ordered differently.
//   errors    a count larger than what is left, a fraction outside [0, 1], a missing
//             parameter, a mask of the wrong shape — each a kiln::Error naming the parameter.
//   random    random_unstructured draws from kiln's Rng, not PyTorch's generator: the same
//             rules, other entries.
//
// Checkpoints keep "<layer>.weight_orig" and "<layer>.weight_mask" (train/checkpoint.h). A fresh
// model has neither; prune_like() prunes it the way a checkpoint says (masks of ones) so that
// load_checkpoint then restores the masks exactly.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "core/rng.h"
#include "core/state.h"
#include "nn/module.h"

namespace kiln::prune {

// How much to prune: a count (an integer) or a fraction (a floating-point number) of what is
// left. prune::l1_unstructured(m, "weight", 3) prunes 3 entries; (m, "weight", 0.3) prunes 30%.
class Amount {
public:
    Amount(int count) : Amount(int64_t(count)) {}
    Amount(int64_t count);
    Amount(double fraction);
    // How many of `left` to prune: the count, or round(fraction · left) halves to even. A count
    // larger than `left` is an error naming `what`.
    int64_t of(int64_t left, const std::string& what) const;

private:
    bool is_fraction_;
    int64_t count_ = 0;
    double fraction_ = 0.0;
};

// ---- one parameter -------------------------------------------------------------------------
// `name` is the parameter's local name in m ("weight", "bias"), pruned already or not.
void identity(Module& m, const std::string& name);  // a mask of ones: pruned, nothing zeroed
void l1_unstructured(Module& m, const std::string& name, Amount amount);  // smallest |w| first
void random_unstructured(Module& m, const std::string& name, Amount amount, Rng& rng);
// Whole slices along `dim` (dim 0 of a conv weight: output channels), those of smallest Ln
// norm first, the norm taken over every other dim:  ‖w_c‖_n = (Σ |w|ⁿ)^(1/n); n = ∞: max |w|.
// n > 0 (1 and 2 are the usual); dim may count from the end (−1).
void ln_structured(Module& m, const std::string& name, Amount amount, double n, int64_t dim);
// Multiplies the mask by `mask` (0s and 1s, the parameter's shape, any device).
void custom_from_mask(Module& m, const std::string& name, const Tensor& mask);
// Bakes the mask in: "weight" = weight_orig ⊙ mask becomes a plain parameter again, the mask
// buffer and the hooks go. An error if the parameter is not pruned.
void remove(Module& m, const std::string& name);

// ---- many parameters at once ------------------------------------------------------------
// One ranking over all the listed parameters together (their entries still kept), so layers
// with many small weights lose more than layers with few large ones. Unstructured methods only.
enum class Method { L1Unstructured, RandomUnstructured };
void global_unstructured(const std::vector<std::pair<Module*, std::string>>& params, Method method, Amount amount,
                         Rng* rng = nullptr);  // rng: for RandomUnstructured
// Every weight of the model: each Linear's and Conv2d's "weight" (not biases, not batch norm's),
// as Han et al. prune them — the list global_unstructured usually gets.
std::vector<std::pair<Module*, std::string>> prunable_weights(Module& model);

// Is any parameter of m or below it pruned?
bool is_pruned(Module& m);

// Is `key` a pruned parameter's mask ("block1a.conv.weight_mask")?
bool is_mask_name(const std::string& key);

// Prunes each parameter `state` has a "<name>_mask" for with a mask of ones, so that
// load_model / load_checkpoint find weight_orig and weight_mask where the checkpoint has them.
void prune_like(const StateDict& state, Module& model);

// ---- how sparse is it --------------------------------------------------------------------
// The weights' zeros (of weight_orig ⊙ mask when pruned), one row per weight of the model with
// two dims or more (biases and batch norm's scales are left out, as Han et al. count).
struct SparsityRow {
    std::string name;  // "fc1.weight" (its name before pruning)
    Shape shape;
    int64_t zeros = 0, numel = 0;
    double sparsity() const { return numel ? double(zeros) / double(numel) : 0.0; }
};
std::vector<SparsityRow> sparsity(Module& model);
SparsityRow total_sparsity(const std::vector<SparsityRow>& rows);  // name "total"
// One line per weight and the total: name, shape, nonzeros / entries, sparsity.
void print_sparsity(Module& model);

// ---- iterative pruning (Han et al. 2015: prune, fine-tune, repeat) -----------------------
// The sparsity after round k of `rounds` on the way to `final` (Zhu & Gupta 2017): fast at
// first, when there is much that is small, then gently:  s_k = final · (1 − (1 − k/rounds)³).
double sparsity_after_round(int64_t k, int64_t rounds, double final);
// The fraction of what is left to prune to go from sparsity `now` to `target`: pruning again
// prunes a fraction of the remaining entries, so (target − now) / (1 − now).
double amount_to_reach(double now, double target);

}  // namespace kiln::prune
