// calibrate.cpp — the observers a Calibrator hangs on a model, and the names of QuantConfig's
// observers (quant/qmodel.h).
#include "quant/qmodel.h"

#include "nn/misc.h"

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

}  // namespace kiln
