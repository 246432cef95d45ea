// qfile.cpp — the int8 network's file: QuantizedNet::save and QuantizedNet::load (quant/qmodel.h).
#include <sstream>

#include "io/safetensors.h"
#include "quant/qsteps.h"

namespace kiln {

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
