// qat.cpp — fake quantization in and out of a model for quantization-aware training; qat.h has
// the idea and the rules.
#include "quant/qat.h"

#include "nn/conv.h"
#include "nn/layers.h"
#include "nn/misc.h"
#include "ops/quant.h"

namespace kiln {

// ==== FakeQuantize ========================================================================================
FakeQuantize::FakeQuantize(int32_t qmax, std::string name)
    : Module(std::move(name)), observer_(0.01f, kActQmin, qmax) {}

Tensor FakeQuantize::forward(const Tensor& x) {
    if (training()) observer_.observe(x);
    KILN_CHECK(observer_.observed(), name(), ": no range yet; run it in training mode on a batch first");
    const QParams qp = observer_.qparams();
    Tensor scale = Tensor::full({1}, qp.scale), zero = Tensor::full({1}, qp.zero_point, DType::I32);
    scale = scale.to(x.device()), zero = zero.to(x.device());
    Tensor y = fake_quantize(x, scale, zero, -1, qp.qmin, qp.qmax);
    if (keeps_cache()) x_ = x, scale_ = scale, zero_point_ = zero;
    return y;
}

Tensor FakeQuantize::backward(const Tensor& dy) {
    KILN_CHECK(x_.defined(), name(), ": backward without a forward in training mode");
    const QParams qp = observer_.qparams();
    // No dy when no one needs it: the network's input, whose first layer skips its dx.
    Tensor dx = dy.defined() ? fake_quantize_backward(x_, dy, scale_, zero_point_, -1, qp.qmin, qp.qmax) : Tensor();
    x_ = scale_ = zero_point_ = Tensor();
    return dx;
}

// ==== putting it in and taking it out ======================================================================
namespace {

// The "fake_quant" weight transform of p: w (p's value, or a transform's result before this one,
// e.g. pruning's value ⊙ mask) rounded to i8 per output channel and back, scale_c = max |w_c| /
// 127.5, into `out` (the transform's own tensor, outside any step's arena: it lives from step to
// step).
void fake_quantize_weight(const Parameter& p, const Tensor& w, Tensor& out) {
    PerChannelMinMaxObserver obs(0, kWeightQmin, kWeightQmax, true);
    obs.set_name(p.name);
    obs.observe(w);
    const std::vector<QParams> qp = obs.qparams_per_channel();
    const int64_t C = int64_t(qp.size());
    Tensor scale = Tensor::empty({C}), zero = Tensor::zeros({C}, DType::I32);
    for (int64_t c = 0; c < C; c++) scale.data<float>()[c] = qp[c].scale;
    const Device d = w.device();
    out.copy_from(fake_quantize(w, scale.to(d), zero.to(d), 0, kWeightQmin, kWeightQmax));
}

// The weight of a Conv2d or Linear, pruned ("weight_orig" then) or not.
Parameter* weight_of(Module& m) {
    Parameter* w = m.own_parameter("weight");
    return w ? w : m.own_parameter("weight_orig");
}

// The module at `path` replaced by a Sequential of it and a FakeQuantize (after it, or before it
// for the model's input); returns the FakeQuantize (owned by the model).
FakeQuantize* wrap(Module& model, const std::string& path, int32_t qmax, bool before) {
    std::unique_ptr<Module> layer = model.replace_child(path, std::make_unique<Identity>());
    auto seq = std::make_unique<Sequential>(path);
    auto fq = std::make_unique<FakeQuantize>(qmax);
    FakeQuantize* out = fq.get();
    if (before) seq->add("fake_quant", std::move(fq));
    seq->add("layer", std::move(layer));
    if (!before) seq->add("fake_quant", std::move(fq));
    model.replace_child(path, std::move(seq));
    return out;
}

}  // namespace

QuantAwareTraining::QuantAwareTraining(Module& model, const QuantizedNet& plan, QuantConfig config) : model_(model) {
    std::string first_layer;
    for (auto& [name, m] : model.named_modules())
        if (m->children().empty() && first_layer.empty()) first_layer = name;
    for (const auto& step : plan.steps) {
        KILN_CHECK(step->kind != "residual", "QuantAwareTraining: ", step->name, " is a Residual, and quantization-aware "
                   "training of residual nets is not written; calibrate and convert the trained model instead");
        if (!step->new_range) continue;
        const std::string& path = step->range_layer.empty() ? first_layer : step->range_layer;
        KILN_CHECK(!path.empty(), "QuantAwareTraining: step ", step->name, " has no layer in the model");
        quantizers_.push_back(wrap(model, path, config.act_qmax(), step->range_layer.empty()));
        wrapped_.push_back(path);
        range_layers_.push_back(step->range_layer);
    }
    for (auto& [name, m] : model.named_modules()) {
        if (!dynamic_cast<Conv2d*>(m) && !dynamic_cast<Linear*>(m)) continue;
        Parameter* w = weight_of(*m);
        KILN_CHECK(w != nullptr, name, ": it has no parameter \"weight\" (nor a pruned \"weight_orig\")");
        // After pruning's transform, if any: the layer computes with fake_quantize(value ⊙ mask).
        w->add_transform(*m, "fake_quant", [w](const Tensor& in, Tensor& out) { fake_quantize_weight(*w, in, out); });
        weights_.push_back(w);
    }
    model.pack();
}

void QuantAwareTraining::finish() {
    if (finished_) return;
    finished_ = true;
    for (Parameter* p : weights_) p->remove_transform("fake_quant");
    for (size_t i = 0; i < quantizers_.size(); i++)
        if (quantizers_[i]->observed()) ranges_[range_layers_[i]] = quantizers_[i]->qparams();
    for (auto it = wrapped_.rbegin(); it != wrapped_.rend(); ++it) {
        Module& seq = model_.module_at(*it);
        model_.replace_child(*it, seq.replace_child("layer", std::make_unique<Identity>()));
    }
}

RangeOf QuantAwareTraining::range_of() const {
    KILN_CHECK(finished_, "QuantAwareTraining::range_of: call finish() first (the ranges are recorded as the "
               "fake quantizers come out)");
    return [ranges = ranges_](const std::string& layer) {
        const auto it = ranges.find(layer);
        KILN_CHECK(it != ranges.end(), "QuantAwareTraining: no fake quantizer stood for layer '", layer,
                   "'; convert the model quantization-aware training was set up for");
        return it->second;
    };
}

QuantAwareTraining::~QuantAwareTraining() { finish(); }

}  // namespace kiln
