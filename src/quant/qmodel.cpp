// qmodel.cpp — calibration, the int8 steps, conversion from an f32 model, and the int8 file.
// qmodel.h has the list of steps and what each one computes.
#include "quant/qmodel.h"

#include <cmath>
#include <functional>
#include <optional>
#include <sstream>

#include "nn/conv.h"
#include "nn/layers.h"
#include "nn/misc.h"
#include "nn/norm.h"
#include "nn/pool.h"
#include "ops/quant.h"
#include "train/checkpoint.h"

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
    for (auto& [name, m] : leaves(model)) {
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
// int32 in units of s_x·s_w[o], and what requantizes the sums (quant_ops.h's QOutput).
class WeightedStep : public QStep {
public:
    WeightedStep(std::string name, std::string kind, Tensor weight, Tensor weight_scale, Tensor bias, QParams in,
                 QParams out, bool relu)
        : QStep(std::move(name), std::move(kind)), weight(std::move(weight)), weight_scale(std::move(weight_scale)),
          bias(std::move(bias)), in(in), out(out), relu(relu) {
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
        return qconv2d(x, weight, output, stride, padding, dilation, 1, in.zero_point, in.qmax);
    }

    void save(StateDict& s) const override {
        s.put(name + ".weight", weight);
        s.put(name + ".weight_scale", weight_scale);
        s.put(name + ".bias", bias);
        put_range(s, name, out);
        s.set(name + ".relu", int64_t(relu));
        if (kind != "conv") return;
        s.set(name + ".stride", stride);
        s.set(name + ".padding", padding);
        s.set(name + ".dilation", dilation);
    }

    void to(Device device) override {
        weight = weight.to(device), weight_scale = weight_scale.to(device), bias = bias.to(device);
        output.bias = output.bias.to(device), output.requant = output.requant.to(device);
    }

    int64_t bytes() const override { return int64_t(weight.nbytes() + weight_scale.nbytes() + bias.nbytes()); }

    std::string describe() const override {
        std::ostringstream o;
        o << kind << (kind == "conv" ? "     " : "   ") << weight.shape().str() << " i8" << (relu ? " + ReLU" : "")
          << ", out " << qparams_text(out);
        return o.str();
    }

    Tensor weight, weight_scale, bias;  // i8 [O, ...], f32 [O], i32 [O]
    QParams in, out;
    bool relu;
    int64_t stride = 1, padding = 0, dilation = 1;

private:
    // The kernel's per-channel numbers, from the stored ones (quant/qparams.h):
    //   bias'[o] = bias[o] − z_x · Σ_k w[o, k]        M_o = s_x · s_w[o] / s_y  (as m0 · 2^(−31−shift))
    // and a fused ReLU's clamp: max(0, y) is max(z_y, q).
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
        const Device d = weight.device();
        output = QLayerOutput{b2.to(d), rq.to(d), out.zero_point, relu ? out.zero_point : out.qmin, out.qmax};
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

}  // namespace

// ==== the network ========================================================================================
Tensor QuantizedNet::forward(const Tensor& x) const {
    KILN_CHECK(!steps.empty(), "QuantizedNet: no steps; make one with convert() or QuantizedNet::load()");
    KILN_CHECK(x.device() == device_, "QuantizedNet: the input is on ", device_name(x.device()),
               " but the network on ", device_name(device_), "; move one of them with to()");
    Tensor h = x;
    for (const auto& step : steps) h = step->forward(h);
    return h;
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
    for (const auto& step : steps) out += "  " + step->name + ": " + step->describe() + "\n";
    return out;
}

Tensor QuantizedModule::backward(const Tensor&) {
    throw Error("int8: a quantized network has no backward; train or fine-tune the f32 model (quantization-aware "
                "training: quant/qat.h), then convert it again");
}

// ==== conversion ==========================================================================================
namespace {

// One step of the conversion: the model's layers in forward order and where the walk is.
struct Walk {
    std::vector<std::pair<std::string, Module*>> layers;
    const RangeOf& range_of;

    // The next layer after i that computes something in eval mode (Dropout and Identity do
    // not), or layers.size().
    size_t next(size_t i) const {
        size_t j = i + 1;
        while (j < layers.size() && (dynamic_cast<Dropout*>(layers[j].second) || dynamic_cast<Identity*>(layers[j].second)))
            j++;
        return j;
    }
    template <typename T> T* at(size_t i) const { return i < layers.size() ? dynamic_cast<T*>(layers[i].second) : nullptr; }
    // The u8 range of layer i's output, from its observer (affine, per tensor).
    QParams range(size_t i) const { return range_of(layers[i].first); }
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

// A weighted layer's step: per-channel symmetric i8 weight, int32 bias, the output range of
// `out_layer` (the layer itself, or the ReLU fused into it).
std::unique_ptr<QStep> weighted_step(const std::string& name, const char* kind, const Parameter& weight,
                                     const Parameter& bias, const QParams& in, const QParams& out, bool relu) {
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
    return std::make_unique<WeightedStep>(name, kind, wq, scale, bq, in, out, relu);
}

// The table of one or two of the model's own layers (a GELU or ReLU; a batch norm and the
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

// The activation after layer i, if a table can take it with the layer (GELU or ReLU): its index.
std::optional<size_t> activation_after(const Walk& walk, size_t i) {
    const size_t j = walk.next(i);
    if (walk.at<GELU>(j) || walk.at<ReLU>(j)) return j;
    return std::nullopt;
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

QuantizedNet convert(Module& model, const RangeOf& range_of) {
    Walk walk{leaves(model), range_of};
    QuantizedNet net;
    QParams cur = range_of("");
    net.steps.push_back(with_range(std::make_unique<InputStep>(cur), ""));
    std::vector<bool> done(walk.layers.size(), false);  // fused into an earlier step
    for (size_t i = 0; i < walk.layers.size(); i++) {
        if (done[i]) continue;
        const auto& [name, m] = walk.layers[i];
        if (dynamic_cast<Dropout*>(m) || dynamic_cast<Identity*>(m)) continue;
        if (dynamic_cast<Flatten*>(m)) {
            net.steps.push_back(std::make_unique<FlattenStep>(name));
        } else if (auto* pool = dynamic_cast<MaxPool2d*>(m)) {
            net.steps.push_back(std::make_unique<MaxPoolStep>(name, pool->kernel, pool->stride, pool->padding));
        } else if (dynamic_cast<Conv2d*>(m) || dynamic_cast<Linear*>(m)) {
            // A ReLU right after, or after a max-pool, is fused: its output range is the step's.
            size_t relu_at = walk.next(i);
            if (walk.at<MaxPool2d>(relu_at)) relu_at = walk.next(relu_at);
            const bool relu = walk.at<ReLU>(relu_at) != nullptr;
            const QParams out = walk.range(relu ? relu_at : i);
            if (relu) done[relu_at] = true;
            if (auto* conv = dynamic_cast<Conv2d*>(m)) {
                KILN_CHECK(conv->options.groups == 1, name, ": an int8 convolution with groups ", conv->options.groups,
                           " is not written; kiln quantizes groups = 1");
                auto step = with_range(weighted_step(name, "conv", conv->weight, conv->bias, cur, out, relu),
                                       walk.layers[relu ? relu_at : i].first);
                auto& ws = static_cast<WeightedStep&>(*step);
                ws.stride = conv->options.stride, ws.padding = conv->options.padding;
                ws.dilation = conv->options.dilation;
                net.steps.push_back(std::move(step));
            } else {
                auto* lin = dynamic_cast<Linear*>(m);
                net.steps.push_back(with_range(weighted_step(name, "linear", lin->weight, lin->bias, cur, out, relu),
                                               walk.layers[relu ? relu_at : i].first));
            }
            cur = out;
        } else if (auto* bn = dynamic_cast<BatchNorm2d*>(m)) {
            // A batch norm that did not fold, with the activation after it: one table per channel.
            const std::optional<size_t> act = activation_after(walk, i);
            const size_t last = act ? *act : i;
            std::vector<Module*> layers{m};
            if (act) done[*act] = true, layers.push_back(walk.layers[*act].second);
            const QParams out = walk.range(last);
            Tensor table = make_table(layers, bn->num_features, cur, out);
            const std::string what = act ? std::string("bn+") + (walk.at<GELU>(*act) ? "gelu" : "relu") : "bn";
            net.steps.push_back(with_range(std::make_unique<TableStep>(name, what, table, out), walk.layers[last].first));
            cur = out;
        } else if (dynamic_cast<GELU*>(m) || dynamic_cast<ReLU*>(m)) {
            const QParams out = walk.range(i);
            Tensor table = make_table({m}, 1, cur, out);
            const char* what = dynamic_cast<GELU*>(m) ? "gelu" : "relu";
            net.steps.push_back(with_range(std::make_unique<TableStep>(name, what, table, out), name));
            cur = out;
        } else {
            throw Error(name + ": no int8 version of this layer; convert() handles Conv2d (groups 1), Linear, "
                        "MaxPool2d, BatchNorm2d, ReLU, GELU, Flatten, Dropout and Identity inside Sequentials");
        }
    }
    net.steps.push_back(std::make_unique<OutputStep>(cur));
    const auto params = model.parameters();
    net.to(params.empty() ? Device::CPU : params[0]->value.device());
    return net;
}

// ==== the file ============================================================================================
// Tensors under "<step>.weight", "<step>.bias", ...; the numbers in the metadata (put_range);
// the steps' order and kinds in "quant.steps" as "input:input,conv1:conv,...".
void QuantizedNet::save(const std::string& path) const {
    StateDict s;
    std::string order;
    for (const auto& step : steps) {
        step->save(s);
        order += (order.empty() ? "" : ",") + step->name + ":" + step->kind;
    }
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
    QuantizedNet net;
    const int32_t qmin = int32_t(s.get_int("quant.qmin")), qmax = int32_t(s.get_int("quant.qmax"));
    QParams cur;  // the range of the tensor the next step reads
    std::stringstream list(s.get_string("quant.steps"));
    std::string item;
    while (std::getline(list, item, ',')) {
        const size_t colon = item.rfind(':');
        KILN_CHECK(colon != std::string::npos, path, ": malformed step \"", item, "\" in quant.steps");
        const std::string name = item.substr(0, colon), kind = item.substr(colon + 1);
        const auto tensor = [&](const char* what) {
            KILN_CHECK(s.tensors.count(name + what), path, ": step ", name, " has no tensor \"", name, what, "\"");
            return s.tensors.at(name + what);
        };
        if (kind == "input") {
            cur = get_range(s, name, qmin, qmax);
            net.steps.push_back(std::make_unique<InputStep>(cur));
        } else if (kind == "output") {
            net.steps.push_back(std::make_unique<OutputStep>(cur));
        } else if (kind == "conv" || kind == "linear") {
            const QParams out = get_range(s, name, qmin, qmax);
            auto step = std::make_unique<WeightedStep>(name, kind, tensor(".weight"), tensor(".weight_scale"),
                                                       tensor(".bias"), cur, out, s.get_int(name + ".relu") != 0);
            if (kind == "conv") {
                step->stride = s.get_int(name + ".stride"), step->padding = s.get_int(name + ".padding");
                step->dilation = s.get_int(name + ".dilation");
            }
            net.steps.push_back(std::move(step));
            cur = out;
        } else if (kind == "maxpool") {
            net.steps.push_back(std::make_unique<MaxPoolStep>(name, s.get_int(name + ".kernel"),
                                                              s.get_int(name + ".stride"), s.get_int(name + ".padding")));
        } else if (kind == "table") {
            cur = get_range(s, name, qmin, qmax);
            net.steps.push_back(std::make_unique<TableStep>(name, s.get_string(name + ".what"), tensor(".table"), cur));
        } else if (kind == "flatten") {
            net.steps.push_back(std::make_unique<FlattenStep>(name));
        } else {
            throw Error(path + ": unknown step kind \"" + kind + "\" for " + name +
                        " (kiln knows input, conv, linear, maxpool, table, flatten, output)");
        }
    }
    return net;
}

}  // namespace kiln
