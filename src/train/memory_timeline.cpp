// memory_timeline.cpp — a recorded trace's files (memory_trace.h): every event as JSON, and the
// timeline of one device as an SVG, memory in use over time stacked by category, the phases
// shaded, the peak marked.
#include <algorithm>
#include <cstdio>
#include <fstream>

#include "core/error.h"
#include "io/svg.h"
#include "train/memory_trace.h"

namespace kiln {

static constexpr double kMiB = 1024.0 * 1024.0;

// ---- the trace as JSON -------------------------------------------------------------------------
std::string timeline_path(const std::string& trace_json) {
    const std::string ext = ".json";
    KILN_CHECK(trace_json.size() > ext.size() && trace_json.compare(trace_json.size() - ext.size(), ext.size(), ext) == 0,
               "--mem-trace ", trace_json, ": the trace's name must end in .json (its timeline goes next to it, "
               "as the same name ending in .svg)");
    return trace_json.substr(0, trace_json.size() - ext.size()) + ".svg";
}

void check_trace_path(const std::string& trace_json) {
    for (const std::string& path : {trace_json, timeline_path(trace_json)}) {
        std::ofstream out(path, std::ios::app);
        KILN_CHECK(out, "--mem-trace ", trace_json, ": cannot write ", path,
                   "; give a path in an existing folder you can write to (e.g. /tmp/trace.json)");
    }
}

namespace {

std::string json_string(const std::string& s) {
    std::string out = "\"";
    for (char c : s) {
        if (c == '"' || c == '\\') out += std::string("\\") + c;
        else if (static_cast<unsigned char>(c) < 0x20) out += "\\u00" + std::string(1, "0123456789abcdef"[c >> 4]) +
                                                             "0123456789abcdef"[c & 15];
        else out += c;
    }
    return out + "\"";
}

template <typename Name> std::string json_names(int n, Name name) {
    std::string s = "[";
    for (int i = 0; i < n; i++) s += (i ? ", " : "") + json_string(name(i));
    return s + "]";
}

void write_json(const MemoryTrace& trace, Device device, const std::string& path) {
    std::ofstream out(path, std::ios::binary);
    KILN_CHECK(out, "--mem-trace: cannot write ", path, "; check that its folder exists and is writable");
    out << "{\n\"device\": " << json_string(device_name(device)) << ",\n"
        << "\"units\": {\"bytes\": \"what each tensor asked for, before the allocator's rounding\", "
           "\"t_us\": \"microseconds since the recording started\"},\n"
        << "\"categories\": " << json_names(kNumCategories, [](int i) { return category_name(Category(i)); }) << ",\n"
        << "\"phases\": " << json_names(int(Phase::Data) + 1, [](int i) { return phase_name(Phase(i)); }) << ",\n"
        << "\"steps\": " << trace.steps() << ",\n\"in_use_at_start\": {";
    for (Device d : {Device::CPU, Device::CUDA}) {
        out << (d == Device::CPU ? "" : ", ") << json_string(device_name(d)) << ": {";
        for (int c = 0; c < kNumCategories; c++)
            out << (c ? ", " : "") << json_string(category_name(Category(c))) << ": "
                << trace.in_use_at_start[int(d)][size_t(c)];
        out << "}";
    }
    out << "},\n\"events\": [\n";
    char t[32];
    for (size_t i = 0; i < trace.events.size(); i++) {
        const MemoryEvent& e = trace.events[i];
        std::snprintf(t, sizeof t, "%.1f", e.time_us);
        out << "{\"t_us\": " << t << ", \"op\": " << (e.freed() ? "\"free\"" : "\"alloc\"") << ", \"bytes\": " << e.bytes
            << ", \"category\": " << json_string(category_name(e.category))
            << ", \"phase\": " << json_string(phase_name(e.phase)) << ", \"device\": " << json_string(device_name(e.device))
            << ", \"module\": " << json_string(e.module) << ", \"step\": " << e.step << ", \"id\": " << e.id << "}"
            << (i + 1 < trace.events.size() ? ",\n" : "\n");
    }
    out << "]\n}\n";
    out.close();
    KILN_CHECK(out, "--mem-trace: writing ", path, " failed (is the disk full?)");
}

// ---- the timeline ------------------------------------------------------------------------------
// Matplotlib's tab10 colours, one per category in enum order; light ones for the phase bands.
const char* const kCategoryColour[kNumCategories] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                                     "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};
// Bottom to top: what lives across steps first, then what a step makes and frees.
constexpr Category kStackOrder[kNumCategories] = {Category::Parameter, Category::Gradient, Category::OptimizerState,
                                                  Category::WeightCopy, Category::Data, Category::Activation,
                                                  Category::Workspace, Category::Other};
const char* const kPhaseColour[] = {"#ffffff", "#e3effa", "#fdebd3", "#e2f3e2", "#efe6f5"};

// A run of events in one phase (Other, the time between the phases, is left unshaded).
struct Band {
    Phase phase;
    double from_ms, to_ms;
};

std::vector<Band> phase_bands(const MemoryTrace& trace) {
    std::vector<Band> bands;
    for (const MemoryEvent& e : trace.events) {
        if (e.phase == Phase::Other) continue;
        const double t = e.time_us / 1000.0;
        if (bands.empty() || bands.back().phase != e.phase) bands.push_back({e.phase, t, t});
        bands.back().to_ms = t;
    }
    return bands;
}

// Memory over time on `device`: times (ms) and the levels from each time on (a step function).
struct Series {
    std::vector<double> t_ms;
    std::vector<std::array<int64_t, kNumCategories>> in_use;
};

Series series_of(const MemoryTrace& trace, Device device) {
    Levels levels(trace, device, 0);
    Series s{{0.0}, {levels.in_use}};
    for (const MemoryEvent& e : trace.events)
        if (levels.apply(e)) {
            s.t_ms.push_back(e.time_us / 1000.0);
            s.in_use.push_back(levels.in_use);
        }
    return s;
}

// The top of the stack up to its k-th category (kStackOrder; inclusive; k = −1: the axis) as a
// staircase from the first time to t_end, in pixels.
std::vector<Point> stack_edge(const Plot& plot, const Series& s, int k, double t_end) {
    std::vector<Point> edge;
    for (size_t i = 0; i < s.t_ms.size(); i++) {
        int64_t top = 0;
        for (int j = 0; j <= k; j++) top += s.in_use[i][size_t(kStackOrder[j])];
        const double next = i + 1 < s.t_ms.size() ? s.t_ms[i + 1] : t_end;
        edge.push_back(plot.at(s.t_ms[i], double(top) / kMiB));
        edge.push_back(plot.at(next, double(top) / kMiB));
    }
    return edge;
}

using Legend = std::vector<std::pair<std::string, std::string>>;  // label, colour

// The phases as background bands; returns their legend entries.
Legend draw_phase_bands(Svg& svg, const Plot& plot, const MemoryTrace& trace) {
    const Box a = plot.area();
    Legend legend;
    for (const Band& b : phase_bands(trace)) {
        const double x0 = plot.at(b.from_ms, 0).x, x1 = std::max(plot.at(b.to_ms, 0).x, x0 + 2);
        svg.rect({x0, a.y, x1 - x0, a.h}, kPhaseColour[int(b.phase)]);
        std::pair<std::string, std::string> entry{std::string(phase_name(b.phase)) + " phase", kPhaseColour[int(b.phase)]};
        if (std::find(legend.begin(), legend.end(), entry) == legend.end()) legend.push_back(entry);
    }
    return legend;
}

// One area per category that holds anything, stacked in kStackOrder; returns the legend
// entries, the top of the stack first.
Legend draw_stack(Svg& svg, const Plot& plot, const Series& s, double t_end) {
    Legend legend;
    for (int k = 0; k < kNumCategories; k++) {
        const int c = int(kStackOrder[k]);
        bool present = false;
        for (const auto& level : s.in_use) present = present || level[size_t(c)] != 0;
        if (!present) continue;
        std::vector<Point> area = stack_edge(plot, s, k, t_end), below = stack_edge(plot, s, k - 1, t_end);
        area.insert(area.end(), below.rbegin(), below.rend());
        svg.polygon(area, kCategoryColour[c], 0.85);
        legend.emplace(legend.begin(), category_name(Category(c)), kCategoryColour[c]);
    }
    return legend;
}

// A dashed line where each step after the first begins.
void draw_step_starts(Svg& svg, const Plot& plot, const MemoryTrace& trace) {
    const Box a = plot.area();
    for (int st = 1; st < trace.steps() && trace.step_ends[size_t(st - 1)] < trace.events.size(); st++) {
        const double x = plot.at(trace.events[trace.step_ends[size_t(st - 1)]].time_us / 1000.0, 0).x;
        svg.line({x, a.y}, {x, a.y + a.h}, "#555555", 1, true);
        svg.text({x + 4, a.y - 4}, "step " + std::to_string(st + 1), 11, Anchor::Start, "#555555");
    }
}

// A dashed line up to the peak, labelled with its size, module and phase.
void draw_peak(Svg& svg, const Plot& plot, const MemoryPeak& peak) {
    const Box a = plot.area();
    const Point top = plot.at(peak.time_us / 1000.0, double(peak.bytes) / kMiB);
    svg.line({top.x, a.y + a.h}, {top.x, top.y - 6}, "#000000", 1.2, true);
    char label[200];
    std::snprintf(label, sizeof label, "peak %.2f MiB: %s, %s", double(peak.bytes) / kMiB,
                  shown_name(peak.module).c_str(), phase_name(peak.phase));
    const bool right_half = top.x > a.x + a.w / 2;  // the label goes towards the middle
    svg.text({top.x + (right_half ? -4 : 4), top.y - 10}, label, 12, right_half ? Anchor::End : Anchor::Start);
}

void draw_timeline(const MemoryTrace& trace, Device device, const std::string& path, const std::string& model_name) {
    const Series s = series_of(trace, device);
    const MemoryPeak peak = find_peak(trace, device, 0, trace.events.size());
    const double t_end = std::max(s.t_ms.back() * 1.01, 0.001);
    Svg svg(980, 440);
    Plot plot(svg, {80, 50, 660, 320}, {0, t_end}, {0, std::max(double(peak.bytes) / kMiB * 1.08, 1e-3)});
    const Legend phases = draw_phase_bands(svg, plot, trace);
    plot.axes("time since the recording started (ms)", "memory in use (MiB)");
    Legend legend = draw_stack(svg, plot, s, t_end);
    draw_step_starts(svg, plot, trace);
    draw_peak(svg, plot, peak);
    const int steps = trace.steps();
    svg.text({plot.area().x + plot.area().w / 2, 28},
             "memory in use on " + std::string(device_name(device)) + " over " + std::to_string(steps) +
                 " training step" + (steps == 1 ? "" : "s") + " of " + model_name + " (tensor bytes by category)",
             15, Anchor::Middle);
    legend.insert(legend.end(), phases.begin(), phases.end());
    svg.legend({plot.area().x + plot.area().w + 20, plot.area().y}, legend);
    svg.save(path);
}

}  // namespace

void write_memory_trace(const MemoryTrace& trace, Device device, const std::string& trace_json,
                        const std::string& model_name) {
    const std::string svg_path = timeline_path(trace_json);
    write_json(trace, device, trace_json);
    draw_timeline(trace, device, svg_path, model_name);
}

}  // namespace kiln
