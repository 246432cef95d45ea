// qmodel.cpp — calibration, the int8 steps, conversion from an f32 model, and the int8 file.
// qmodel.h has the list of steps and what each one computes.
#include "quant/qmodel.h"

#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <sstream>

#include "io/safetensors.h"
#include "nn/conv.h"
#include "nn/layers.h"
#include "nn/misc.h"
#include "nn/norm.h"
#include "nn/pool.h"
#include "ops/ops.h"
#include "ops/quant.h"

namespace kiln {

// ==== configuration ==================================================================================
const char* observer_name(QuantConfig::Observer o) {
    switch (o) {
        case QuantConfig::Observer::MinMax: return "minmax";
        case QuantConfig::Observer::MovingAverage: return "moving";
        case QuantConfig::Observer::Histogram: return "histogram";
    }
    return "?";
}

QuantConfig::Observer parse_observer(const std::string& name) {
    for (auto o : {QuantConfig::Observer::MinMax, QuantConfig::Observer::MovingAverage,
                   QuantConfig::Observer::Histogram})
        if (name == observer_name(o)) return o;
    throw Error("unknown observer '" + name + "'; choose minmax, moving or histogram");
}

namespace {

// The layers of a tree of Sequentials in the order forward runs them, with their full names.
std::vector<std::pair<std::string, Module*>> leaves(Module& model) {
    std::vector<std::pair<std::string, Module*>> out;
    for (auto& [name, m] : model.named_modules())
        if (m->children().empty()) out.emplace_back(name, m);
    return out;
}

// The layers whose outputs get observers: every layer, and every Residual (its sum is no layer's
// output).
std::vector<std::pair<std::string, Module*>> observed_layers(Module& model) {
    std::vector<std::pair<std::string, Module*>> out;
    for (auto& [name, m] : model.named_modules())
        if (m->children().empty() || dynamic_cast<Residual*>(m)) out.emplace_back(name, m);
    return out;
}

std::unique_ptr<Observer> make_observer(const QuantConfig& config) {
    const int32_t qmax = config.act_qmax();
    switch (config.activations) {
        case QuantConfig::Observer::MinMax: return std::make_unique<MinMaxObserver>(kActQmin, qmax);
        case QuantConfig::Observer::MovingAverage:
            return std::make_unique<MovingAverageMinMaxObserver>(0.01f, kActQmin, qmax);
        case QuantConfig::Observer::Histogram: return std::make_unique<HistogramObserver>(2048, 128, kActQmin, qmax);
    }
    throw Error("make_observer: unknown observer kind");
}

}  // namespace

// ==== calibration ======================================================================================
Calibrator::Calibrator(Module& model, QuantConfig config) : model_(model), config_(config) {
    observers_.emplace_back("", make_observer(config_));
    observers_.back().second->set_name("the model's input");
    for (auto& [name, m] : observed_layers(model)) {
        observers_.emplace_back(name, make_observer(config_));
        Observer* obs = observers_.back().second.get();
        obs->set_name(name + " output");
        hooks_.push_back(m->register_forward_hook([obs](Module&, const Tensor&, Tensor& y) { obs->observe(y); }));
    }
}

Calibrator::~Calibrator() {
    for (HookHandle& h : hooks_) h.remove();
}

void Calibrator::run(const Tensor& x) {
    model_.eval();
    NoGradScope no_grad;
    observers_.front().second->observe(x);
    model_.call(x);
    batches_++;
}

const Observer& Calibrator::observer(const std::string& layer) const {
    for (auto& [name, obs] : observers_)
        if (name == layer) return *obs;
    throw Error("Calibrator: no observer for layer '" + layer + "'; the names are the model's (\"conv1\", "
                "\"block1a.conv\"), \"\" for its input");
}

// ==== the steps ==========================================================================================
namespace {

// A step's output range in the file: its scale and zero point ("<key>.scale", "<key>.zero_point").
// The integer range is the network's (quant.qmin, quant.qmax), and a step's input range is the
// output range of the step before it, so neither is stored twice.
void put_range(StateDict& s, const std::string& key, const QParams& qp) {
    s.set(key + ".scale", double(qp.scale));
    s.set(key + ".zero_point", int64_t(qp.zero_point));
}

QParams get_range(const StateDict& s, const std::string& key, int32_t qmin, int32_t qmax) {
    return QParams{float(s.get_double(key + ".scale")), int32_t(s.get_int(key + ".zero_point")), qmin, qmax};
}

std::string qparams_text(const QParams& qp) {
    std::ostringstream o;
    o << "scale " << qp.scale << " zero point " << qp.zero_point << " [" << qp.qmin << ", " << qp.qmax << "]";
    return o.str();
}

// f32 images → u8.
class InputStep : public QStep {
public:
    explicit InputStep(QParams qp) : QStep("input", "input"), qp(qp) {}
    Tensor forward(const Tensor& x) const override { return quantize(x, qp, DType::U8); }
    void save(StateDict& s) const override { put_range(s, name, qp); }
    void to(Device) override {}
    std::string describe() const override { return "input    f32 → u8, " + qparams_text(qp); }
    QParams qp;
};

// u8 logits → f32.
class OutputStep : public QStep {
public:
    explicit OutputStep(QParams qp) : QStep("output", "output"), qp(qp) {}
    Tensor forward(const Tensor& x) const override { return dequantize(x, qp); }
    void save(StateDict&) const override {}  // its range is the last step's
    void to(Device) override {}
    std::string describe() const override { return "output   u8 → f32, " + qparams_text(qp); }
    QParams qp;
};

// A convolution or a Linear: i8 weight [O, ...] with one scale per output channel, the bias as
// int32 in units of s_x·s_w[o], and what requantizes the sums (ops/kernels/quant.h's QOutput). A fused
// ReLU clamps at the output's zero point, and at its cap (ReLU6: 6) when it has one.
class WeightedStep : public QStep {
public:
    WeightedStep(std::string name, std::string kind, Tensor weight, Tensor weight_scale, Tensor bias, QParams in,
                 QParams out, bool relu, float relu_cap = kNoCap)
        : QStep(std::move(name), std::move(kind)), weight(std::move(weight)), weight_scale(std::move(weight_scale)),
          bias(std::move(bias)), in(in), out(out), relu(relu), relu_cap(relu_cap) {
        const char* op = "WeightedStep";
        check_dtype(this->weight, DType::I8, op, "weight");
        const int64_t O = this->weight.ndim() > 0 ? this->weight.size(0) : 0;
        check_shape(this->weight_scale, Shape{O}, op, "weight_scale");
        check_shape(this->bias, Shape{O}, op, "bias");
        check_dtype(this->weight_scale, DType::F32, op, "weight_scale");
        check_dtype(this->bias, DType::I32, op, "bias");
        make_output();
    }

    Tensor forward(const Tensor& x) const override {
        if (kind == "linear") return qlinear(x, weight, output, in.qmax);
        return qconv2d(x, weight, output, stride, padding, dilation, groups, in.zero_point, in.qmax);
    }

    void save(StateDict& s) const override {
        s.put(name + ".weight", weight);
        s.put(name + ".weight_scale", weight_scale);
        s.put(name + ".bias", bias);
        put_range(s, name, out);
        s.set(name + ".relu", int64_t(relu));
        if (relu && std::isfinite(relu_cap)) s.set(name + ".relu_cap", double(relu_cap));
        if (kind != "conv") return;
        s.set(name + ".stride", stride);
        s.set(name + ".padding", padding);
        s.set(name + ".dilation", dilation);
        s.set(name + ".groups", groups);
    }

    void to(Device device) override {
        weight = weight.to(device), weight_scale = weight_scale.to(device), bias = bias.to(device);
        output.bias = output.bias.to(device), output.requant = output.requant.to(device);
    }

    int64_t bytes() const override { return int64_t(weight.nbytes() + weight_scale.nbytes() + bias.nbytes()); }

    std::string describe() const override {
        std::ostringstream o;
        o << kind << (kind == "conv" ? "     " : "   ") << weight.shape().str() << " i8";
        if (groups > 1) o << " depthwise";
        if (relu) o << " + ReLU";
        if (relu && std::isfinite(relu_cap)) o << " ≤ " << relu_cap;
        o << ", out " << qparams_text(out);
        return o.str();
    }

    Tensor weight, weight_scale, bias;  // i8 [O, ...], f32 [O], i32 [O]
    QParams in, out;
    bool relu;
    float relu_cap;
    int64_t stride = 1, padding = 0, dilation = 1, groups = 1;

private:
    // The kernel's per-channel numbers, from the stored ones (ops/qparams.h):
    //   bias'[o] = bias[o] − z_x · Σ_k w[o, k]        M_o = s_x · s_w[o] / s_y  (as m0 · 2^(−31−shift))
    // and a fused ReLU's clamp: max(0, y) is max(z_y, q), min(y, cap) is min(q, q(cap)).
    void make_output() {
        const Tensor w = weight.to(Device::CPU), ws = weight_scale.to(Device::CPU), b = bias.to(Device::CPU);
        const int64_t O = w.size(0), K = w.numel() / O;
        Tensor b2 = Tensor::empty({O}, DType::I32), rq = Tensor::empty({O, 2}, DType::I32);
        for (int64_t o = 0; o < O; o++) {
            int64_t wsum = 0;
            for (int64_t k = 0; k < K; k++) wsum += w.data<int8_t>()[o * K + k];
            const int64_t folded = int64_t(b.data<int32_t>()[o]) - int64_t(in.zero_point) * wsum;
            KILN_CHECK(std::abs(folded) < (int64_t(1) << 31), name, ": the bias in units of s_x·s_w (", folded,
                       ") does not fit int32; the layer's input or weight scale is far too small");
            b2.data<int32_t>()[o] = int32_t(folded);
            const Requant r = make_requant(double(in.scale) * double(ws.data<float>()[o]) / double(out.scale));
            rq.data<int32_t>()[2 * o] = r.m0;
            rq.data<int32_t>()[2 * o + 1] = r.shift;
        }
        const int32_t hi = relu && std::isfinite(relu_cap)
                               ? quantize_value(relu_cap, 1.0f / out.scale, out.zero_point, out.qmin, out.qmax)
                               : out.qmax;
        const Device d = weight.device();
        output = QLayerOutput{b2.to(d), rq.to(d), out.zero_point, relu ? out.zero_point : out.qmin, hi};
    }

    QLayerOutput output;
};

class MaxPoolStep : public QStep {
public:
    MaxPoolStep(std::string name, int64_t kernel, int64_t stride, int64_t padding)
        : QStep(std::move(name), "maxpool"), kernel(kernel), stride(stride), padding(padding) {}
    Tensor forward(const Tensor& x) const override { return qmaxpool2d(x, kernel, stride, padding); }
    void save(StateDict& s) const override {
        s.set(name + ".kernel", kernel);
        s.set(name + ".stride", stride);
        s.set(name + ".padding", padding);
    }
    void to(Device) override {}
    std::string describe() const override {
        return "maxpool  " + std::to_string(kernel) + "×" + std::to_string(kernel) + " on u8 (scale unchanged)";
    }
    int64_t kernel, stride, padding;
};

class GlobalAvgPoolStep : public QStep {
public:
    explicit GlobalAvgPoolStep(std::string name) : QStep(std::move(name), "avgpool") {}
    Tensor forward(const Tensor& x) const override { return qglobal_avgpool(x); }
    void save(StateDict&) const override {}
    void to(Device) override {}
    std::string describe() const override { return "avgpool  global, [N, C, H, W] → [N, C] on u8 (scale unchanged)"; }
};

// Any function of one value: 256 entries per channel (or one table for all).
class TableStep : public QStep {
public:
    TableStep(std::string name, std::string what, Tensor table, QParams out)
        : QStep(std::move(name), "table"), what(std::move(what)), table(std::move(table)), out(out) {}
    Tensor forward(const Tensor& x) const override { return lookup_u8(x, table); }
    void save(StateDict& s) const override {
        s.put(name + ".table", table);
        s.set(name + ".what", what);
        put_range(s, name, out);
    }
    void to(Device device) override { table = table.to(device); }
    int64_t bytes() const override { return int64_t(table.nbytes()); }
    std::string describe() const override {
        return "table    " + what + ", " + std::to_string(table.size(0)) + "×256 u8, out " + qparams_text(out);
    }
    std::string what;  // "gelu", "relu", "bn", "bn+gelu", ...
    Tensor table;      // u8 [C or 1, 256]
    QParams out;
};

class FlattenStep : public QStep {
public:
    explicit FlattenStep(std::string name) : QStep(std::move(name), "flatten") {}
    Tensor forward(const Tensor& x) const override { return x.reshape({x.size(0), -1}); }
    void save(StateDict&) const override {}
    void to(Device) override {}
    std::string describe() const override { return "flatten  [N, C, H, W] → [N, C·H·W]"; }
};

// The steps in order, each reading what the one before wrote.
Tensor run_steps(const QSteps& steps, Tensor h) {
    for (const auto& step : steps) h = step->forward(h);
    return h;
}

// A Residual, y = body(x) + x or body(x) + shortcut(x). Both branches read the same u8 x and end
// in ranges of their own (the body's last step's; the shortcut's, or x's); qadd sums them into
// the range observed on the Residual's output:
//   y = z_y + round((s_f·(f − z_f) + s_s·(s − z_s)) / s_y)
class ResidualStep : public QStep {
public:
    ResidualStep(std::string name, QSteps body, QSteps shortcut, QParams body_out, QParams shortcut_out, QParams out)
        : QStep(std::move(name), "residual"), body(std::move(body)), shortcut(std::move(shortcut)),
          body_out(body_out), shortcut_out(shortcut_out), out(out) {}

    Tensor forward(const Tensor& x) const override {
        const Tensor f = run_steps(body, x);
        return qadd(f, body_out, shortcut.empty() ? x : run_steps(shortcut, x), shortcut_out, out);
    }
    void save(StateDict& s) const override {
        for_each_step([&](QStep& step) { step.save(s); });
        put_range(s, name, out);
    }
    void to(Device device) override {
        for_each_step([&](QStep& step) { step.to(device); });
    }
    int64_t bytes() const override {
        int64_t total = 0;
        for_each_step([&](QStep& step) { total += step.bytes(); });
        return total;
    }
    std::string describe() const override {
        return "residual the body's " + std::to_string(body.size()) + " steps + " +
               (shortcut.empty() ? std::string("the input") : "the shortcut's " + std::to_string(shortcut.size()) + " steps") +
               ", sum " + qparams_text(out);
    }

    QSteps body, shortcut;
    QParams body_out, shortcut_out, out;

private:
    // f(step) for every step of both branches, the body's first.
    template <typename F>
    void for_each_step(F f) const {
        for (const QSteps* branch : {&body, &shortcut})
            for (const auto& step : *branch) f(*step);
    }
};

// One line per step, a residual's own steps below it, indented.
void summary_lines(const QSteps& steps, const std::string& indent, std::string& out) {
    for (const auto& step : steps) {
        out += indent + step->name + ": " + step->describe() + "\n";
        if (const auto* r = dynamic_cast<const ResidualStep*>(step.get()))
            for (const QSteps* branch : {&r->body, &r->shortcut}) summary_lines(*branch, indent + "  ", out);
    }
}

}  // namespace

// ==== the network ========================================================================================
Tensor QuantizedNet::forward(const Tensor& x) const {
    KILN_CHECK(!steps.empty(), "QuantizedNet: no steps; make one with convert() or QuantizedNet::load()");
    KILN_CHECK(x.device() == device_, "QuantizedNet: the input is on ", device_name(x.device()),
               " but the network on ", device_name(device_), "; move one of them with to()");
    return run_steps(steps, x);
}

void QuantizedNet::to(Device device) {
    for (auto& step : steps) step->to(device);
    device_ = device;
}

int64_t QuantizedNet::bytes() const {
    int64_t total = 0;
    for (const auto& step : steps) total += step->bytes();
    return total;
}

std::string QuantizedNet::summary() const {
    std::string out;
    summary_lines(steps, "  ", out);
    return out;
}

Tensor QuantizedModule::backward(const Tensor&) {
    throw Error("int8: a quantized network has no backward; train or fine-tune the f32 model (quantization-aware "
                "training: quant/qat.h), then convert it again");
}

// ==== conversion ==========================================================================================
namespace {

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

// ==== the file ============================================================================================
// Tensors under "<step>.weight", "<step>.bias", ...; the numbers in the metadata (put_range);
// the steps' order and kinds in "quant.steps" as "input:input,conv1:conv,...", where a residual's
// steps follow it ("b3:residual,b3.body.0:conv,...") and, after "b3:shortcut", its shortcut's,
// closed by "b3:end".
namespace {

void list_steps(const QSteps& steps, std::string& order) {
    for (const auto& step : steps) {
        order += (order.empty() ? "" : ",") + step->name + ":" + step->kind;
        const auto* r = dynamic_cast<const ResidualStep*>(step.get());
        if (!r) continue;
        list_steps(r->body, order);
        if (!r->shortcut.empty()) order += "," + r->name + ":shortcut";
        list_steps(r->shortcut, order);
        order += "," + r->name + ":end";
    }
}

// "quant.steps" read back, one entry at a time.
struct StepList {
    const StateDict& s;
    const std::string& path;
    int32_t qmin, qmax;
    std::vector<std::pair<std::string, std::string>> entries;  // (name, kind)
    size_t next = 0;

    StepList(const StateDict& s, const std::string& path)
        : s(s), path(path), qmin(int32_t(s.get_int("quant.qmin"))), qmax(int32_t(s.get_int("quant.qmax"))) {
        std::stringstream list(s.get_string("quant.steps"));
        std::string item;
        while (std::getline(list, item, ',')) {
            const size_t colon = item.rfind(':');
            KILN_CHECK(colon != std::string::npos, path, ": malformed step \"", item, "\" in quant.steps");
            entries.emplace_back(item.substr(0, colon), item.substr(colon + 1));
        }
    }
    QParams range(const std::string& name) const { return get_range(s, name, qmin, qmax); }
    Tensor tensor(const std::string& key) const {
        KILN_CHECK(s.tensors.count(key), path, ": the int8 file has no tensor \"", key, "\"");
        return s.tensors.at(key);
    }
};

// One step that is not a residual, reading a tensor of range cur (which becomes its output's).
std::unique_ptr<QStep> read_step(const StepList& list, const std::string& name, const std::string& kind, QParams& cur) {
    const StateDict& s = list.s;
    if (kind == "input") {
        cur = list.range(name);
        return std::make_unique<InputStep>(cur);
    }
    if (kind == "output") return std::make_unique<OutputStep>(cur);
    if (kind == "conv" || kind == "linear") {
        const QParams in = cur;
        cur = list.range(name);
        const float cap = s.has(name + ".relu_cap") ? float(s.get_double(name + ".relu_cap")) : kNoCap;
        auto step = std::make_unique<WeightedStep>(name, kind, list.tensor(name + ".weight"),
                                                   list.tensor(name + ".weight_scale"), list.tensor(name + ".bias"), in,
                                                   cur, s.get_int(name + ".relu") != 0, cap);
        if (kind == "conv") {
            step->stride = s.get_int(name + ".stride"), step->padding = s.get_int(name + ".padding");
            step->dilation = s.get_int(name + ".dilation");
            step->groups = s.has(name + ".groups") ? s.get_int(name + ".groups") : 1;
        }
        return step;
    }
    if (kind == "maxpool")
        return std::make_unique<MaxPoolStep>(name, s.get_int(name + ".kernel"), s.get_int(name + ".stride"),
                                             s.get_int(name + ".padding"));
    if (kind == "avgpool") return std::make_unique<GlobalAvgPoolStep>(name);
    if (kind == "table") {
        cur = list.range(name);
        return std::make_unique<TableStep>(name, s.get_string(name + ".what"), list.tensor(name + ".table"), cur);
    }
    if (kind == "flatten") return std::make_unique<FlattenStep>(name);
    throw Error(list.path + ": unknown step kind \"" + kind + "\" for " + name +
                " (kiln knows input, conv, linear, maxpool, avgpool, table, residual, flatten, output)");
}

// Steps up to the list's end (open = "") or up to the "shortcut" or "end" entry of the residual
// named open, whose kind is returned in `closed_by`.
QSteps read_steps(StepList& list, QParams& cur, const std::string& open, std::string& closed_by) {
    QSteps steps;
    while (list.next < list.entries.size()) {
        const auto [name, kind] = list.entries[list.next++];
        if (kind == "shortcut" || kind == "end") {
            KILN_CHECK(name == open, list.path, ": \"", name, ":", kind, "\" in quant.steps closes no open residual");
            closed_by = kind;
            return steps;
        }
        if (kind != "residual") {
            steps.push_back(read_step(list, name, kind, cur));
            continue;
        }
        QParams body_out = cur, shortcut_out = cur;
        std::string closed;
        QSteps body = read_steps(list, body_out, name, closed);
        QSteps shortcut;
        if (closed == "shortcut") shortcut = read_steps(list, shortcut_out, name, closed);
        KILN_CHECK(closed == "end", list.path, ": residual ", name, " has no \"", name, ":end\" in quant.steps");
        cur = list.range(name);
        steps.push_back(std::make_unique<ResidualStep>(name, std::move(body), std::move(shortcut), body_out,
                                                       shortcut_out, cur));
    }
    KILN_CHECK(open.empty(), list.path, ": residual ", open, " has no \"", open, ":end\" in quant.steps");
    return steps;
}

}  // namespace

void QuantizedNet::save(const std::string& path) const {
    StateDict s;
    std::string order;
    for (const auto& step : steps) step->save(s);
    list_steps(steps, order);
    s.set("quant.steps", order);
    const auto* input = steps.empty() ? nullptr : dynamic_cast<const InputStep*>(steps.front().get());
    KILN_CHECK(input != nullptr, "QuantizedNet::save: the first step should be the input's quantize");
    s.set("quant.qmin", int64_t(input->qp.qmin));
    s.set("quant.qmax", int64_t(input->qp.qmax));
    write_safetensors(path, s);
}

QuantizedNet QuantizedNet::load(const std::string& path) {
    const StateDict s = read_safetensors(path);
    KILN_CHECK(s.has("quant.steps"), path, " has no \"quant.steps\" entry: it is not an int8 network saved by "
               "QuantizedNet::save (an f32 checkpoint loads with load_model)");
    StepList list(s, path);
    QuantizedNet net;
    QParams cur;  // the range of the tensor the next step reads
    std::string closed_by;
    net.steps = read_steps(list, cur, "", closed_by);
    return net;
}

}  // namespace kiln
