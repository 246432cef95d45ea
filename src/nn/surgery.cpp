// surgery.cpp — remove_channels (see surgery.h): find the layers a conv's channels reach and
// check everything, then build the smaller layers from the kept entries and put them in the tree.
#include "nn/surgery.h"

#include <cstring>
#include <memory>

#include "nn/conv.h"
#include "nn/layers.h"
#include "nn/misc.h"
#include "nn/norm.h"
#include "nn/pool.h"
#include "nn/recompute.h"

namespace kiln {
namespace {

template <typename M> bool is(const Module& m) { return dynamic_cast<const M*>(&m) != nullptr; }

// A layer that computes and its path in the model ("block1a.inner.conv").
struct Leaf {
    std::string path;
    Module* module;
};

// The model's layers in the order forward runs them. Sequential and Checkpoint run their
// children one after the other, so their children stand in for them; any other module with
// children (a Residual, which adds two paths) is one step whose inside is not followed.
void forward_order(Module& m, const std::string& path, std::vector<Leaf>& out) {
    if (!is<Sequential>(m) && !is<Checkpoint>(m)) {
        out.push_back({path, &m});
        return;
    }
    for (const Module::Child& c : m.children())
        forward_order(*c.module, path.empty() ? c.name : path + "." + c.name, out);
}

// What one surgery changes, found and checked before anything is touched.
struct Plan {
    Conv2d* conv;
    std::vector<Leaf> norms;  // the BatchNorm2d layers its channels pass through
    Leaf reader;              // the next Conv2d, or the Linear after a Flatten
    int64_t per_channel;      // the reader's weight entries per input channel in a row: KH·KW, or B
};

void check_keep(const std::vector<int64_t>& keep, int64_t channels, const std::string& what) {
    KILN_CHECK(!keep.empty(), what, ": keep is empty, but a conv needs at least one output channel (to drop the "
               "whole layer, build the model without it)");
    for (size_t i = 0; i < keep.size(); i++) {
        KILN_CHECK(keep[i] >= 0 && keep[i] < channels, what, ": keep[", i, "] = ", keep[i],
                   " is not one of the conv's ", channels, " output channels (0 to ", channels - 1, ")");
        KILN_CHECK(i == 0 || keep[i] > keep[i - 1], what, ": keep must be sorted and without repeats, but keep[",
                   i - 1, "] = ", keep[i - 1], " and keep[", i, "] = ", keep[i], " (std::sort, then std::unique)");
    }
}

// Walks forward from the conv: per-channel layers are passed, BatchNorm2d layers collected,
// and the first Conv2d (or, once Flatten or GlobalAvgPool has made the channels blocks of
// features, the first Linear) is the reader. Anything else stops the walk with an error.
Plan plan_surgery(Module& model, const std::string& conv_path, const std::vector<int64_t>& keep) {
    const std::string what = "remove_channels(\"" + conv_path + "\")";
    auto* conv = dynamic_cast<Conv2d*>(&model.module_at(conv_path));
    KILN_CHECK(conv != nullptr, what, ": ", conv_path, " is not a Conv2d (surgery removes a convolution's output "
               "channels; name a conv, e.g. \"block1a.conv\")");
    const int64_t O = conv->out_channels;
    KILN_CHECK(conv->options.groups == 1, what, ": the conv has groups=", conv->options.groups,
               "; surgery handles groups=1 only (removing a channel of a grouped conv changes its groups)");
    check_keep(keep, O, what);

    std::vector<Leaf> leaves;
    forward_order(model, "", leaves);
    size_t i = 0;
    while (i < leaves.size() && leaves[i].module != conv) i++;
    KILN_CHECK(i < leaves.size(), what, ": the conv is inside a container other than Sequential and Checkpoint "
               "(a Residual?), so the layers that read its channels cannot be followed");
    Plan plan{conv, {}, {}, 0};
    bool flat = false;  // the channels are now blocks of features [N, O·B]
    for (i++; i < leaves.size(); i++) {
        Module& m = *leaves[i].module;
        if (is<GELU>(m) || is<ReLU>(m) || is<Dropout>(m)) continue;
        if (!flat && (is<MaxPool2d>(m) || is<AvgPool2d>(m))) continue;
        if (!flat && (is<Flatten>(m) || is<GlobalAvgPool>(m))) {
            flat = true;
            continue;
        }
        if (!flat && is<BatchNorm2d>(m)) {
            plan.norms.push_back(leaves[i]);
            continue;
        }
        if (auto* next = dynamic_cast<Conv2d*>(&m); next && !flat) {
            KILN_CHECK(next->options.groups == 1 && next->in_channels == O, what, ": the next conv, ", leaves[i].path,
                       ", has groups=", next->options.groups, " and ", next->in_channels, " input channels; surgery "
                       "needs groups=1 and the conv's ", O, " channels");
            plan.reader = leaves[i];
            plan.per_channel = next->kernel_h * next->kernel_w;
            return plan;
        }
        if (auto* fc = dynamic_cast<Linear*>(&m); fc && flat) {
            KILN_CHECK(fc->in_features % O == 0, what, ": ", leaves[i].path, " reads ", fc->in_features,
                       " features, not a whole number of blocks for the conv's ", O, " channels");
            plan.reader = leaves[i];
            plan.per_channel = fc->in_features / O;
            return plan;
        }
        KILN_FAIL(what, ": remove_channels cannot follow the conv's channels through ", leaves[i].path,
                  ": it mixes channels or is not known to act on each channel alone (surgery passes BatchNorm2d, "
                  "GELU, ReLU, Dropout, MaxPool2d, AvgPool2d, Flatten and GlobalAvgPool on the way to the next "
                  "Conv2d or Linear)");
    }
    KILN_FAIL(what, ": no Conv2d or Linear after the conv reads its channels: they reach the model's output, and "
              "removing them would change what the model returns");
}

// t seen as [outer, n, inner] (outer = t.numel() / (n·inner)) -> [outer, keep.size(), inner],
//   out[a, j, b] = t[a, keep[j], b]
// as a CPU tensor of `shape`; bytes are copied, so every kept value is exact.
Tensor take(const Tensor& t, const Shape& shape, int64_t n, int64_t inner, const std::vector<int64_t>& keep) {
    const Tensor src = t.to(Device::CPU);
    Tensor out = Tensor::empty(shape, t.dtype());
    const int64_t outer = t.numel() / (n * inner), kept = int64_t(keep.size());
    const size_t row = size_t(inner) * dtype_size(t.dtype());
    const char* from = static_cast<const char*>(src.raw());
    char* to = static_cast<char*>(out.raw());
    for (int64_t a = 0; a < outer; a++)
        for (int64_t j = 0; j < kept; j++) std::memcpy(to + (a * kept + j) * row, from + (a * n + keep[j]) * row, row);
    return out;
}

// The last step of a path, the name a new layer is built with ("conv" of "block1a.conv").
std::string local_name(const std::string& path) { return path.substr(path.rfind('.') + 1); }

// A conv like `c` (options, workspace limit, input_needs_grad, device) with weight w [O, C, KH, KW]
// and bias b [O] (undefined when c has none).
std::unique_ptr<Module> conv_like(const Conv2d& c, const std::string& path, const Tensor& w, const Tensor& b) {
    Rng unused(0);  // the initial values are overwritten
    auto m = std::make_unique<Conv2d>(w.size(1), w.size(0), c.kernel_h, c.kernel_w, unused, c.options, local_name(path));
    m->weight.value.copy_from(w);
    if (b.defined()) m->bias.value.copy_from(b);
    m->workspace_limit = c.workspace_limit;
    m->input_needs_grad = c.input_needs_grad;
    m->to(c.weight.value.device());
    return m;
}

// A BatchNorm2d like `bn` (eps, momentum, device) with the entries `keep` of its four vectors.
std::unique_ptr<Module> batchnorm_kept(const BatchNorm2d& bn, const std::string& path, const std::vector<int64_t>& keep) {
    const int64_t C = bn.num_features, K = int64_t(keep.size());
    auto m = std::make_unique<BatchNorm2d>(K, local_name(path));
    m->eps = bn.eps;
    m->momentum = bn.momentum;
    m->weight.value.copy_from(take(bn.weight.value, {K}, C, 1, keep));
    m->bias.value.copy_from(take(bn.bias.value, {K}, C, 1, keep));
    m->running_mean.copy_from(take(bn.running_mean, {K}, C, 1, keep));
    m->running_var.copy_from(take(bn.running_var, {K}, C, 1, keep));
    m->input_needs_grad = bn.input_needs_grad;
    m->to(bn.weight.value.device());
    return m;
}

// The reader with only the inputs of the kept channels: weight [R, O·per_channel] seen per row as
// O blocks of per_channel entries (a conv's [O', O, KH, KW], a Linear's [F, O·B]).
std::unique_ptr<Module> reader_kept(const Plan& plan, const std::vector<int64_t>& keep) {
    const int64_t O = plan.conv->out_channels, K = int64_t(keep.size()), B = plan.per_channel;
    if (auto* next = dynamic_cast<Conv2d*>(plan.reader.module)) {
        const Tensor w = take(next->weight.value, {next->out_channels, K, next->kernel_h, next->kernel_w}, O, B, keep);
        return conv_like(*next, plan.reader.path, w, next->bias.value);
    }
    auto& fc = static_cast<Linear&>(*plan.reader.module);
    Rng unused(0);
    auto m = std::make_unique<Linear>(K * B, fc.out_features, unused, fc.bias.value.defined(), local_name(plan.reader.path));
    m->weight.value.copy_from(take(fc.weight.value, {fc.out_features, K * B}, O, B, keep));
    if (fc.bias.value.defined()) m->bias.value.copy_from(fc.bias.value);
    m->input_needs_grad = fc.input_needs_grad;
    m->to(fc.weight.value.device());
    return m;
}

}  // namespace

void remove_channels(Module& model, const std::string& conv_path, const std::vector<int64_t>& keep) {
    const Plan plan = plan_surgery(model, conv_path, keep);  // throws before anything changes
    const Conv2d& conv = *plan.conv;
    const int64_t O = conv.out_channels, K = int64_t(keep.size()), CK = conv.in_channels * conv.kernel_h * conv.kernel_w;
    // Every new layer is built from the old ones before the first is replaced (which frees it).
    std::vector<std::pair<std::string, std::unique_ptr<Module>>> replacements;
    const Tensor b = conv.bias.value.defined() ? take(conv.bias.value, {K}, O, 1, keep) : Tensor();
    replacements.emplace_back(
        conv_path, conv_like(conv, conv_path, take(conv.weight.value, {K, conv.in_channels, conv.kernel_h, conv.kernel_w}, O, CK, keep), b));
    for (const Leaf& bn : plan.norms)
        replacements.emplace_back(bn.path, batchnorm_kept(static_cast<const BatchNorm2d&>(*bn.module), bn.path, keep));
    replacements.emplace_back(plan.reader.path, reader_kept(plan, keep));
    for (auto& [path, layer] : replacements) model.replace_child(path, std::move(layer));
    model.pack();
}

}  // namespace kiln
