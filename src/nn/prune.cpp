// prune.cpp — masks and the hooks that apply them (see prune.h).
//
// Every method works the same way: read the scores and the current mask to the CPU, decide
// which of the still-kept entries (or channels) to zero, and hand the new mask to apply_mask,
// which installs it — the first time with the renaming and the two hooks. Masks are small
// (one float per weight), so deciding on the CPU costs little and is the same for CUDA models.
#include "nn/prune.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "nn/conv.h"
#include "nn/layers.h"
#include "ops/ops.h"

namespace kiln::prune {

// ---- amounts --------------------------------------------------------------------------------
Amount::Amount(int64_t count) : is_fraction_(false), count_(count) {
    KILN_CHECK(count >= 0, "prune: amount must be a count ≥ 0 or a fraction in [0, 1], got the count ", count);
}

Amount::Amount(double fraction) : is_fraction_(true), fraction_(fraction) {
    KILN_CHECK(fraction >= 0.0 && fraction <= 1.0, "prune: amount must be a count ≥ 0 or a fraction in [0, 1], got ",
               fraction, " (for a count pass an integer)");
}

// round(fraction · left) with halves to even, as Python's round: std::nearbyint rounds in the
// current rounding mode, which is round-to-nearest-even unless a program changes it.
int64_t Amount::of(int64_t left, const std::string& what) const {
    const int64_t k = is_fraction_ ? int64_t(std::nearbyint(fraction_ * double(left))) : count_;
    KILN_CHECK(k <= left, what, ": cannot prune ", k, " entries, only ", left, " are left to prune");
    return k;
}

// ---- finding and installing ---------------------------------------------------------------
// The parameter `name` of m, whether pruned ("weight_orig" then) or not.
static Parameter& find(Module& m, const std::string& name) {
    if (Parameter* p = m.own_parameter(name)) return *p;
    Parameter* p = m.own_parameter(name + "_orig");
    KILN_CHECK(p != nullptr && p->mask.defined(), m.name(), ": no parameter \"", name,
               "\" to prune (a layer's own parameters are \"weight\" and \"bias\")");
    return *p;
}

static std::string label(Module& m, const std::string& name) { return m.name() + "." + name; }

static std::vector<float> to_floats(const Tensor& t) {
    const Tensor c = t.to(Device::CPU);
    return std::vector<float>(c.data<float>(), c.data<float>() + c.numel());
}

// The mask now: the parameter's, or ones when it is not pruned yet.
static std::vector<float> current_mask(const Parameter& p) {
    return p.mask.defined() ? to_floats(p.mask) : std::vector<float>(size_t(p.value.numel()), 1.0f);
}

// The weight as the layer computes with it, weight_orig ⊙ mask (weight_orig when not pruned):
// what every method ranks, as PyTorch ranks getattr(module, name).
static std::vector<float> current_weight(const Parameter& p) {
    std::vector<float> w = to_floats(p.value);
    if (!p.mask.defined()) return w;
    const std::vector<float> mask = to_floats(p.mask);
    for (size_t i = 0; i < w.size(); i++) w[i] *= mask[i];
    return w;
}

// Installs `mask` (value's shape, 0s and 1s) on m's parameter `name`. The first time:
//   "name" -> "name_orig", buffer "name_mask", the "prune" transform W = W_orig ⊙ mask
//   (Parameter::add_transform: remade before every forward), and the backward hook.
static void apply_mask(Module& m, const std::string& name, const std::vector<float>& mask) {
    Parameter& p = find(m, name);
    Tensor host = Tensor::empty(p.value.shape());
    std::copy(mask.begin(), mask.end(), host.data<float>());
    if (p.mask.defined()) {  // pruned before: the same tensors, a new mask
        p.mask.copy_from(host);
        p.refresh_transforms();
        return;
    }
    const Device device = p.value.device();
    p.mask = Tensor::empty(p.value.shape(), DType::F32, device, Category::Parameter);
    p.mask.copy_from(host);
    Parameter* q = &p;  // a layer's member: lives as long as the layer and its hooks
    p.add_transform(m, "prune", [q](const Tensor& w, Tensor& out) { mul_into(w, q->mask, out); });  // W = W_orig ⊙ mask
    p.refresh_transforms();
    m.rename_parameter(name, name + "_orig");
    m.add_buffer(name + "_mask", p.mask);
    p.prune_hooks.push_back(m.register_backward_hook([q](Module&, const Tensor&, Tensor&) {
        mul_into(q->grad, q->mask, q->grad);  // dL/dW_orig = dL/dW ⊙ mask
    }));
}

// ---- choosing what to zero ----------------------------------------------------------------
// Indices of the entries the mask keeps.
static std::vector<int64_t> kept(const std::vector<float>& mask) {
    std::vector<int64_t> live;
    for (size_t i = 0; i < mask.size(); i++)
        if (mask[i] != 0.0f) live.push_back(int64_t(i));
    return live;
}

// Sorts `ids` by key, smallest first, equal keys in index order (the lower index is pruned
// first), and returns the first k.
template <typename Key> static std::vector<int64_t> smallest(std::vector<int64_t> ids, int64_t k, Key key) {
    std::stable_sort(ids.begin(), ids.end(), [&](int64_t a, int64_t b) { return key(a) < key(b); });
    ids.resize(size_t(k));
    return ids;
}

// Zeroes the k kept entries of smallest |score|.
static std::vector<float> l1_mask(const std::vector<float>& scores, std::vector<float> mask, const Amount& amount,
                                  const std::string& what) {
    const std::vector<int64_t> live = kept(mask);
    const int64_t k = amount.of(int64_t(live.size()), what);
    for (int64_t i : smallest(live, k, [&](int64_t j) { return std::fabs(scores[size_t(j)]); })) mask[size_t(i)] = 0;
    return mask;
}

// Zeroes k of the kept entries drawn uniformly without replacement (a partial Fisher–Yates
// shuffle of the kept indices).
static std::vector<float> random_mask(std::vector<float> mask, const Amount& amount, Rng& rng, const std::string& what) {
    std::vector<int64_t> live = kept(mask);
    const int64_t k = amount.of(int64_t(live.size()), what);
    for (int64_t i = 0; i < k; i++) {
        const int64_t j = i + int64_t(rng.next_below(uint64_t(live.size()) - uint64_t(i)));
        std::swap(live[size_t(i)], live[size_t(j)]);
        mask[size_t(live[size_t(i)])] = 0;
    }
    return mask;
}

void identity(Module& m, const std::string& name) { apply_mask(m, name, current_mask(find(m, name))); }

void l1_unstructured(Module& m, const std::string& name, Amount amount) {
    const Parameter& p = find(m, name);
    apply_mask(m, name, l1_mask(current_weight(p), current_mask(p), amount, label(m, name)));
}

void random_unstructured(Module& m, const std::string& name, Amount amount, Rng& rng) {
    apply_mask(m, name, random_mask(current_mask(find(m, name)), amount, rng, label(m, name)));
}

// ---- structured ----------------------------------------------------------------------------
// Entry i of a tensor of `shape` lies in slice (i / inner) % C along `dim`, C = shape[dim] and
// inner = the product of the dims after it.
struct Slices {
    int64_t count, inner;
    int64_t of(int64_t i) const { return (i / inner) % count; }
};

static Slices slices_along(const Shape& shape, int64_t dim) {
    Slices s{shape[int(dim)], 1};
    for (int d = int(dim) + 1; d < shape.ndim; d++) s.inner *= shape[d];
    return s;
}

void ln_structured(Module& m, const std::string& name, Amount amount, double n, int64_t dim) {
    const Parameter& p = find(m, name);
    const std::string what = label(m, name);
    const int64_t ndim = p.value.ndim();
    KILN_CHECK(dim >= -ndim && dim < ndim, what, ": dim ", dim, " is out of range for a tensor of shape ",
               p.value.shape().str());
    KILN_CHECK(ndim >= 2, what, ": ln_structured prunes slices of a tensor of two dims or more; this one is ",
               p.value.shape().str(), " (use l1_unstructured, or custom_from_mask with a channel's mask)");
    KILN_CHECK(n > 0.0, what, ": ln_structured needs a norm n > 0 (1, 2 or INFINITY), got ", n);
    if (dim < 0) dim += ndim;
    const Slices s = slices_along(p.value.shape(), dim);
    const std::vector<float> w = current_weight(p);  // pruned entries count as the zeros they are
    std::vector<float> mask = current_mask(p);

    // A slice is still kept while any of its entries is; ‖w_c‖ over the slice's entries.
    std::vector<double> norm(size_t(s.count), 0.0);
    std::vector<bool> alive(size_t(s.count), false);
    for (int64_t i = 0; i < int64_t(w.size()); i++) {
        const size_t c = size_t(s.of(i));
        const double a = std::fabs(double(w[size_t(i)]));
        norm[c] = std::isinf(n) ? std::max(norm[c], a) : norm[c] + std::pow(a, n);
        if (mask[size_t(i)] != 0.0f) alive[c] = true;
    }
    std::vector<int64_t> live;
    for (int64_t c = 0; c < s.count; c++)
        if (alive[size_t(c)]) live.push_back(c);  // (Σ|w|ⁿ)^(1/n) ranks like Σ|w|ⁿ: no root needed
    const int64_t k = amount.of(int64_t(live.size()), what + " (slices along dim " + std::to_string(dim) + ")");
    std::vector<bool> drop(size_t(s.count), false);
    for (int64_t c : smallest(live, k, [&](int64_t j) { return norm[size_t(j)]; })) drop[size_t(c)] = true;
    for (int64_t i = 0; i < int64_t(mask.size()); i++)
        if (drop[size_t(s.of(i))]) mask[size_t(i)] = 0;
    apply_mask(m, name, mask);
}

void custom_from_mask(Module& m, const std::string& name, const Tensor& mask) {
    const Parameter& p = find(m, name);
    const std::string what = label(m, name);
    KILN_CHECK(mask.shape() == p.value.shape() && mask.dtype() == DType::F32, what, ": the mask is ", mask.desc(),
               ", the parameter ", p.value.desc(), "; a mask is f32 of the parameter's shape");
    std::vector<float> m_new = to_floats(mask), m_old = current_mask(p);
    for (size_t i = 0; i < m_new.size(); i++) {
        KILN_CHECK(m_new[i] == 0.0f || m_new[i] == 1.0f, what, ": a mask holds 0s and 1s, entry ", i, " is ", m_new[i]);
        m_new[i] *= m_old[i];
    }
    apply_mask(m, name, m_new);
}

void remove(Module& m, const std::string& name) {
    Parameter* p = m.own_parameter(name + "_orig");
    KILN_CHECK(p != nullptr && p->mask.defined(), m.name(), ": parameter \"", name,
               "\" is not pruned, so there is no mask to remove (prune it first)");
    mul_into(p->value, p->mask, p->value);  // the pruned entries become zeros for good
    for (HookHandle& h : p->prune_hooks) h.remove();
    p->prune_hooks.clear();
    m.remove_buffer(name + "_mask");
    m.rename_parameter(name + "_orig", name);
    p->remove_transform("prune");
    p->mask = Tensor();
}

// ---- global -------------------------------------------------------------------------------
void global_unstructured(const std::vector<std::pair<Module*, std::string>>& params, Method method, Amount amount,
                         Rng* rng) {
    KILN_CHECK(!params.empty(), "global_unstructured: no parameters to prune");
    KILN_CHECK(method != Method::RandomUnstructured || rng != nullptr,
               "global_unstructured: RandomUnstructured needs an rng");
    // All the weights as computed (weight_orig ⊙ mask) and their masks, end to end.
    std::vector<float> scores, mask;
    for (auto& [m, name] : params) {
        const Parameter& p = find(*m, name);
        const std::vector<float> w = current_weight(p), k = current_mask(p);
        scores.insert(scores.end(), w.begin(), w.end());
        mask.insert(mask.end(), k.begin(), k.end());
    }
    const std::string what = "global_unstructured over " + std::to_string(params.size()) + " parameters";
    mask = method == Method::L1Unstructured ? l1_mask(scores, mask, amount, what) : random_mask(mask, amount, *rng, what);
    size_t at = 0;
    for (auto& [m, name] : params) {
        const size_t n = size_t(find(*m, name).value.numel());
        apply_mask(*m, name, std::vector<float>(mask.begin() + long(at), mask.begin() + long(at + n)));
        at += n;
    }
}

std::vector<std::pair<Module*, std::string>> prunable_weights(Module& model) {
    std::vector<std::pair<Module*, std::string>> list;
    for (auto& [path, m] : model.named_modules())
        if (dynamic_cast<Linear*>(m) || dynamic_cast<Conv2d*>(m)) list.emplace_back(m, "weight");
    return list;
}

bool is_pruned(Module& m) {
    for (Parameter* p : m.parameters())
        if (p->mask.defined()) return true;
    return false;
}

static const std::string kMaskSuffix = "_mask";

bool is_mask_name(const std::string& key) {
    return key.size() > kMaskSuffix.size() &&
           key.compare(key.size() - kMaskSuffix.size(), kMaskSuffix.size(), kMaskSuffix) == 0;
}

// "block1a.conv.weight_mask" -> module "block1a.conv", parameter "weight"
void prune_like(const StateDict& state, Module& model) {
    for (const auto& [key, t] : state.tensors) {
        if (!is_mask_name(key)) continue;
        const size_t dot = key.rfind('.');
        Module& m = dot == std::string::npos ? model : model.module_at(key.substr(0, dot));
        const std::string local = key.substr(dot == std::string::npos ? 0 : dot + 1);
        const std::string name = local.substr(0, local.size() - kMaskSuffix.size());
        if (m.own_parameter(name) != nullptr) identity(m, name);  // not pruned yet
    }
}

// ---- sparsity ----------------------------------------------------------------------------
std::vector<SparsityRow> sparsity(Module& model) {
    std::vector<SparsityRow> rows;
    for (Parameter* p : model.parameters()) {
        if (p->value.ndim() < 2) continue;
        const std::vector<float> w = to_floats(p->value), mask = current_mask(*p);
        SparsityRow row{p->name, p->value.shape(), 0, p->value.numel()};
        if (p->mask.defined()) row.name = p->name.substr(0, p->name.size() - 5);  // "...weight_orig" -> "...weight"
        for (size_t i = 0; i < w.size(); i++) row.zeros += (w[i] * mask[i] == 0.0f);
        rows.push_back(row);
    }
    return rows;
}

SparsityRow total_sparsity(const std::vector<SparsityRow>& rows) {
    SparsityRow total{"total", Shape{}, 0, 0};
    for (const SparsityRow& r : rows) {
        total.zeros += r.zeros;
        total.numel += r.numel;
    }
    return total;
}

void print_sparsity(Module& model) {
    const std::vector<SparsityRow> rows = sparsity(model);
    std::printf("%-28s %-18s %21s  %s\n", "weight", "shape", "nonzero / entries", "sparsity");
    auto line = [](const SparsityRow& r) {
        std::printf("%-28s %-18s %10lld / %-9lld  %6.2f%%\n", r.name.c_str(), r.shape.ndim ? r.shape.str().c_str() : "",
                    (long long)(r.numel - r.zeros), (long long)r.numel, 100.0 * r.sparsity());
    };
    for (const SparsityRow& r : rows) line(r);
    line(total_sparsity(rows));
}

// ---- schedules -----------------------------------------------------------------------------
double sparsity_after_round(int64_t k, int64_t rounds, double final) {
    KILN_CHECK(rounds > 0 && k >= 0 && k <= rounds, "sparsity_after_round: round ", k, " of ", rounds,
               " (rounds > 0, 0 ≤ k ≤ rounds)");
    const double left = 1.0 - double(k) / double(rounds);
    return final * (1.0 - left * left * left);
}

double amount_to_reach(double now, double target) {
    KILN_CHECK(now >= 0.0 && now < 1.0 && target >= now && target <= 1.0, "amount_to_reach: from sparsity ", now,
               " to ", target, " (0 ≤ now ≤ target ≤ 1, now < 1)");
    return (target - now) / (1.0 - now);
}

}  // namespace kiln::prune
