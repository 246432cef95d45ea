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

// The weight rounded to i8 per output channel and back, scale_c = max |w_c| / 127.5, into
// p.pruned (allocated once, outside any step's arena: it lives from step to step).
void fake_quantize_weight(Parameter& p) {
    PerChannelMinMaxObserver obs(0, kWeightQmin, kWeightQmax, true);
    obs.set_name(p.name);
    obs.observe(p.value);
    const std::vector<QParams> qp = obs.qparams_per_channel();
    const int64_t C = int64_t(qp.size());
    Tensor scale = Tensor::empty({C}), zero = Tensor::zeros({C}, DType::I32);
    for (int64_t c = 0; c < C; c++) scale.data<float>()[c] = qp[c].scale;
    const Device d = p.value.device();
    p.pruned.copy_from(fake_quantize(p.value, scale.to(d), zero.to(d), 0, kWeightQmin, kWeightQmax));
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
        Parameter* w = m->own_parameter("weight");
        KILN_CHECK(w != nullptr && !w->mask.defined(), name, ": its weight is pruned (or renamed); bake the mask in "
                   "with prune::remove before quantization-aware training");
        w->pruned = Tensor::empty(w->value.shape(), DType::F32, w->value.device(), Category::Parameter);
        weight_hooks_.emplace_back(w, m->register_forward_pre_hook([w](Module&, const Tensor&) { fake_quantize_weight(*w); }));
    }
    model.pack();
}

void QuantAwareTraining::finish() {
    if (finished_) return;
    finished_ = true;
    for (auto& [p, hook] : weight_hooks_) {
        hook.remove();
        p->pruned = Tensor();
    }
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
