// qmodel.cpp — the int8 network: its steps run in order, moved, counted and listed. The steps
// are in qsteps.h; calibration in calibrate.cpp, conversion in convert.cpp, the file in qfile.cpp.
#include "quant/qmodel.h"

#include <sstream>

#include "quant/qsteps.h"

namespace kiln {

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

Tensor run_steps(const QSteps& steps, Tensor h) {
    for (const auto& step : steps) h = step->forward(h);
    return h;
}

namespace {

// One line per step, a residual's own steps below it, indented.
void summary_lines(const QSteps& steps, const std::string& indent, std::string& out) {
    for (const auto& step : steps) {
        out += indent + step->name + ": " + step->describe() + "\n";
        if (const auto* r = dynamic_cast<const ResidualStep*>(step.get()))
            for (const QSteps* branch : {&r->body, &r->shortcut}) summary_lines(*branch, indent + "  ", out);
    }
}

}  // namespace

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
}  // namespace kiln
