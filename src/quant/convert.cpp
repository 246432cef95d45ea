// convert.cpp — an f32 model made into the int8 network's steps (quant/qmodel.h): its layers in
// forward order, what fuses with what, the weights quantized, the tables computed.
#include <cmath>
#include <optional>
#include <sstream>

#include "nn/conv.h"
#include "nn/layers.h"
#include "nn/misc.h"
#include "nn/norm.h"
#include "nn/pool.h"
#include "ops/ops.h"
#include "quant/qsteps.h"

namespace kiln {

namespace {

// The layers of a tree of Sequentials in the order forward runs them, with their full names.
std::vector<std::pair<std::string, Module*>> leaves(Module& model) {
    std::vector<std::pair<std::string, Module*>> out;
    for (auto& [name, m] : model.named_modules())
        if (m->children().empty()) out.emplace_back(name, m);
    return out;
}

// A Residual's layers in the walk: its body's [begin, mid), its shortcut's [mid, end) (mid = end:
// the identity).
struct ResidualSpan {
    std::string name;
    size_t begin, mid, end;
};

// The model's layers in forward order, the Residuals among them (outermost first), and the
// ranges of their outputs.
struct Walk {
    std::vector<std::pair<std::string, Module*>> layers;
    std::vector<ResidualSpan> residuals;
    const RangeOf& range_of;

    // The u8 range of layer i's output, from its observer (affine, per tensor).
    QParams range(size_t i) const { return range_of(layers[i].first); }
};

// [first, last + 1) of the layers at or under `path`; begin ≥ end when there are none.
std::pair<size_t, size_t> layers_under(const Walk& walk, const std::string& path) {
    size_t begin = walk.layers.size(), end = 0;
    for (size_t i = 0; i < walk.layers.size(); i++) {
        const std::string& name = walk.layers[i].first;
        if (name == path || name.rfind(path + ".", 0) == 0) begin = std::min(begin, i), end = i + 1;
    }
    return {begin, end};
}

Walk make_walk(Module& model, const RangeOf& range_of) {
    Walk walk{leaves(model), {}, range_of};
    for (auto& [name, m] : model.named_modules()) {
        auto* residual = dynamic_cast<Residual*>(m);
        if (!residual) continue;
        const std::string prefix = name.empty() ? "" : name + ".";
        const auto [begin, mid] = layers_under(walk, prefix + "body");
        KILN_CHECK(begin < mid, name, ": a Residual whose body has no layers has no int8 version");
        const size_t end = residual->shortcut() ? layers_under(walk, prefix + "shortcut").second : mid;
        walk.residuals.push_back({name, begin, mid, std::max(end, mid)});
    }
    return walk;
}

// The layers [.., end) one list of steps is made from: fusing never looks past end, so the last
// layer of a Residual's body is not fused with a ReLU after the Residual.
struct Span {
    const Walk& walk;
    size_t end;

    // The next layer after i that computes something in eval mode (Dropout and Identity do
    // not), or end.
    size_t next(size_t i) const {
        size_t j = i + 1;
        while (j < end && (at<Dropout>(j) || at<Identity>(j))) j++;
        return j;
    }
    template <typename T> T* at(size_t i) const {
        return i < end ? dynamic_cast<T*>(walk.layers[i].second) : nullptr;
    }
};

// round(b[o] / (s_x · s_w[o])) as int32 (0 without a bias).
Tensor quantize_bias(const Tensor& b, const std::vector<QParams>& w_qp, const QParams& in) {
    const int64_t O = int64_t(w_qp.size());
    Tensor out = Tensor::zeros({O}, DType::I32);
    if (!b.defined()) return out;
    const Tensor h = b.to(Device::CPU);
    for (int64_t o = 0; o < O; o++) {
        const double q = std::nearbyint(double(h.data<float>()[o]) / (double(in.scale) * double(w_qp[o].scale)));
        KILN_CHECK(std::abs(q) < 2147483647.0, "quantize_bias: bias ", o, " is ", h.data<float>()[o],
                   ", past int32 in units of s_x·s_w; the weights or the input range are degenerate");
        out.data<int32_t>()[o] = int32_t(q);
    }
    return out;
}

// A weighted layer's step: per-channel symmetric i8 weight, int32 bias, the output range `out`
// (the layer's own, or that of the ReLU fused into it, capped at relu_cap).
std::unique_ptr<QStep> weighted_step(const std::string& name, const char* kind, const Parameter& weight,
                                     const Parameter& bias, const QParams& in, const QParams& out, bool relu,
                                     float relu_cap) {
    PerChannelMinMaxObserver wobs(0, kWeightQmin, kWeightQmax, true);
    wobs.set_name(name + ".weight");
    wobs.observe(weight.used());
    const std::vector<QParams> w_qp = wobs.qparams_per_channel();
    const int64_t O = int64_t(w_qp.size());
    Tensor scale = Tensor::empty({O}), zero = Tensor::zeros({O}, DType::I32);
    for (int64_t o = 0; o < O; o++) scale.data<float>()[o] = w_qp[o].scale;
    const Tensor w = weight.used().to(Device::CPU);
    Tensor wq = quantize_per_channel(w, scale, zero, 0, kWeightQmin, kWeightQmax, DType::I8);
    Tensor bq = quantize_bias(bias.value, w_qp, in);
    return std::make_unique<WeightedStep>(name, kind, wq, scale, bq, in, out, relu, relu_cap);
}

// The table of one or two of the model's own layers (a GELU, ReLU or ReLU6; a batch norm and the
// activation after it): entry [c][q] = quantize_out(layers(dequantize_in(q))) for each of the
// 256 u8 values q of each of `channels` channels, computed by running the layers in eval mode
// on a [1, channels, 16, 16] tensor of those values — so the table is exactly what the f32
// layers compute.
Tensor make_table(const std::vector<Module*>& layers, int64_t channels, const QParams& in, const QParams& out) {
    Tensor q = Tensor::empty({1, channels, 16, 16}, DType::U8);
    for (int64_t i = 0; i < q.numel(); i++) q.data<uint8_t>()[i] = uint8_t(i % 256);
    const auto params = layers.front()->parameters();
    Tensor h = dequantize(q, in).to(params.empty() ? Device::CPU : params[0]->value.device());
    NoGradScope no_grad;
    for (Module* m : layers) {
        m->eval();
        h = m->call(h);
    }
    return quantize(h.to(Device::CPU), out, DType::U8).reshape({channels, 256});
}

// The activation after layer i, if a table can take it with the layer (GELU, ReLU, ReLU6): its index.
std::optional<size_t> activation_after(const Span& span, size_t i) {
    const size_t j = span.next(i);
    if (span.at<GELU>(j) || span.at<CappedReLU>(j)) return j;
    return std::nullopt;
}

// A table's name for an activation: "gelu", "relu", "relu6".
std::string activation_name(Module* m) {
    const auto* relu = dynamic_cast<CappedReLU*>(m);
    if (!relu) return "gelu";
    std::ostringstream o;
    o << "relu";
    if (std::isfinite(relu->cap())) o << relu->cap();
    return o.str();
}

// Records where step's output range came from (QStep::range_layer) and returns the step.
std::unique_ptr<QStep> with_range(std::unique_ptr<QStep> step, const std::string& layer) {
    step->new_range = true;
    step->range_layer = layer;
    return step;
}

}  // namespace

QuantizedNet convert(Module& model, const Calibrator& cal) {
    KILN_CHECK(cal.batches() > 0, "convert: the Calibrator has seen no batch; run it on a few training batches first");
    return convert(model, [&cal](const std::string& layer) { return cal.observer(layer).qparams(); });
}

namespace {

// Makes the steps of a walk's layers, each Residual once, as a step holding its body's and its
// shortcut's steps.
class Converter {
public:
    explicit Converter(Walk walk)
        : walk_(std::move(walk)), fused_(walk_.layers.size(), false), residual_done_(walk_.residuals.size(), false) {}

    // The steps of every layer, reading the model's input (range cur).
    QSteps all(QParams& cur) { return steps(0, walk_.layers.size(), cur); }

    // The steps of layers [begin, end), reading a tensor of range `cur`; cur becomes the range of
    // what they write.
    QSteps steps(size_t begin, size_t end, QParams& cur) {
        QSteps out;
        const Span span{walk_, end};
        for (size_t i = begin; i < end; i++) {
            if (fused_[i]) continue;
            if (const std::optional<size_t> r = residual_at(i)) {
                out.push_back(residual_step(*r, cur));
                i = walk_.residuals[*r].end - 1;
            } else if (std::unique_ptr<QStep> step = layer_step(span, i, cur)) {
                out.push_back(std::move(step));
            }
        }
        return out;
    }

private:
    // The outermost Residual not yet converted whose first layer is i.
    std::optional<size_t> residual_at(size_t i) const {
        for (size_t r = 0; r < walk_.residuals.size(); r++)
            if (!residual_done_[r] && walk_.residuals[r].begin == i) return r;
        return std::nullopt;
    }

    std::unique_ptr<QStep> residual_step(size_t r, QParams& cur) {
        residual_done_[r] = true;
        const ResidualSpan span = walk_.residuals[r];
        QParams body_out = cur, shortcut_out = cur;
        QSteps body = steps(span.begin, span.mid, body_out);
        QSteps shortcut = steps(span.mid, span.end, shortcut_out);
        cur = walk_.range_of(span.name);
        return with_range(std::make_unique<ResidualStep>(span.name, std::move(body), std::move(shortcut), body_out,
                                                         shortcut_out, cur),
                          span.name);
    }

    // Layer i's step (null for Dropout and Identity, nothing in eval mode), with what it fuses.
    std::unique_ptr<QStep> layer_step(const Span& span, size_t i, QParams& cur) {
        const auto& [name, m] = walk_.layers[i];
        if (dynamic_cast<Dropout*>(m) || dynamic_cast<Identity*>(m)) return nullptr;
        if (dynamic_cast<Flatten*>(m)) return std::make_unique<FlattenStep>(name);
        if (auto* pool = dynamic_cast<MaxPool2d*>(m))
            return std::make_unique<MaxPoolStep>(name, pool->kernel, pool->stride, pool->padding);
        if (dynamic_cast<GlobalAvgPool*>(m)) return std::make_unique<GlobalAvgPoolStep>(name);
        if (dynamic_cast<Conv2d*>(m) || dynamic_cast<Linear*>(m)) return weighted(span, i, cur);
        if (auto* bn = dynamic_cast<BatchNorm2d*>(m)) {
            // A batch norm that did not fold, with the activation after it: one table per channel.
            const std::optional<size_t> act = activation_after(span, i);
            const size_t last = act ? *act : i;
            std::vector<Module*> layers{m};
            if (act) fused_[*act] = true, layers.push_back(walk_.layers[*act].second);
            const QParams out = walk_.range(last);
            Tensor table = make_table(layers, bn->num_features, cur, out);
            const std::string what = act ? "bn+" + activation_name(walk_.layers[*act].second) : "bn";
            cur = out;
            return with_range(std::make_unique<TableStep>(name, what, table, out), walk_.layers[last].first);
        }
        if (dynamic_cast<GELU*>(m) || dynamic_cast<CappedReLU*>(m)) {
            const QParams out = walk_.range(i);
            Tensor table = make_table({m}, 1, cur, out);
            cur = out;
            return with_range(std::make_unique<TableStep>(name, activation_name(m), table, out), name);
        }
        throw Error(name + ": no int8 version of this layer; convert() handles Conv2d (groups 1 or depthwise), "
                    "Linear, MaxPool2d, GlobalAvgPool, BatchNorm2d, ReLU, ReLU6, GELU, Flatten, Dropout and Identity "
                    "inside Sequentials and Residuals");
    }

    // A Conv2d or Linear. A ReLU or ReLU6 right after it, or after a max-pool after it, is fused:
    // its output range is the step's.
    std::unique_ptr<QStep> weighted(const Span& span, size_t i, QParams& cur) {
        const auto& [name, m] = walk_.layers[i];
        size_t relu_at = span.next(i);
        if (span.at<MaxPool2d>(relu_at)) relu_at = span.next(relu_at);
        const CappedReLU* relu = span.at<CappedReLU>(relu_at);
        const size_t range_at = relu ? relu_at : i;
        if (relu) fused_[relu_at] = true;
        const QParams in = cur, out = walk_.range(range_at);
        const float cap = relu ? relu->cap() : kNoCap;
        cur = out;
        if (auto* lin = dynamic_cast<Linear*>(m))
            return with_range(weighted_step(name, "linear", lin->weight, lin->bias, in, out, relu, cap),
                              walk_.layers[range_at].first);
        auto* conv = static_cast<Conv2d*>(m);
        const int64_t g = conv->options.groups;
        KILN_CHECK(g == 1 || (g == conv->in_channels && g == conv->out_channels), name,
                   ": an int8 convolution with groups ", g, " is not written; kiln quantizes groups = 1 and "
                   "depthwise (groups = input channels = output channels)");
        auto step = with_range(weighted_step(name, "conv", conv->weight, conv->bias, in, out, relu, cap),
                               walk_.layers[range_at].first);
        auto& ws = static_cast<WeightedStep&>(*step);
        ws.stride = conv->options.stride, ws.padding = conv->options.padding;
        ws.dilation = conv->options.dilation, ws.groups = g;
        return step;
    }

    Walk walk_;
    std::vector<bool> fused_;          // layers fused into an earlier step
    std::vector<bool> residual_done_;  // Residuals converted
};

}  // namespace

QuantizedNet convert(Module& model, const RangeOf& range_of) {
    QuantizedNet net;
    QParams cur = range_of("");
    net.steps.push_back(with_range(std::make_unique<InputStep>(cur), ""));
    for (auto& step : Converter(make_walk(model, range_of)).all(cur)) net.steps.push_back(std::move(step));
    net.steps.push_back(std::make_unique<OutputStep>(cur));
    const auto params = model.parameters();
    net.to(params.empty() ? Device::CPU : params[0]->value.device());
    return net;
}

}  // namespace kiln
