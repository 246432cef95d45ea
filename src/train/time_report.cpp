// time_report.cpp — a training step's time by layer (see time_report.h).
#include "train/time_report.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "core/cuda_memory.h"
#include "core/error.h"
#include "io/svg.h"

namespace kiln {

double TimeReport::in_layers() const {
    double sum = 0;
    for (const LayerTime& l : layers) sum += l.forward + l.backward;
    return sum;
}

StepTimer::StepTimer(Module& model, Device device, int skip) : device_(device), skip_(skip) {
    const char* profile = std::getenv("KILN_PROFILE_TIMED_STEPS");
    profile_ = device == Device::CUDA && profile && std::string(profile) == "1";
    KILN_CHECK(skip >= 0, "StepTimer: skip is ", skip, "; it counts the untimed first steps, 0 or more");
    for (auto& [name, m] : model.named_modules())
        if (m->children().empty()) {
            report_.layers.push_back({m->name(), Shape{}, 0, 0});
            add_hooks(*m, report_.layers.size() - 1);
        }
}

StepTimer::~StepTimer() {
    for (HookHandle& h : hooks_) h.remove();
    if (device_ == Device::CUDA) cuda::set_kernel_timing(false);
}

double StepTimer::since(Clock::time_point t0) const {
    if (device_ == Device::CUDA) cuda::synchronize();  // the kernels queued so far have run
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

// A layer's forward: pre-hook → forward hook; its backward: pre-hook → hook. A layer's hooks never
// nest inside another layer's (layers have no children), so one start time serves them all.
void StepTimer::add_hooks(Module& layer, size_t index) {
    auto start = [this] {
        if (!timing_) return;
        if (device_ == Device::CUDA) cuda::synchronize();  // the earlier layers' kernels are not ours
        layer_start_ = Clock::now();
    };
    hooks_.push_back(layer.register_forward_pre_hook([start](Module&, const Tensor&) { start(); }));
    hooks_.push_back(layer.register_forward_hook([this, index](Module&, const Tensor&, Tensor& y) {
        if (!timing_) return;
        report_.layers[index].forward += since(layer_start_);
        report_.layers[index].output = y.shape();
    }));
    hooks_.push_back(layer.register_backward_pre_hook([start](Module&, const Tensor&) { start(); }));
    hooks_.push_back(layer.register_backward_hook([this, index](Module&, const Tensor&, Tensor&) {
        if (timing_) report_.layers[index].backward += since(layer_start_);
    }));
}

void StepTimer::step_begins() {
    timing_ = steps_begun_++ >= skip_;
    if (timing_ && device_ == Device::CUDA) {
        cuda::take_kernel_times();  // waits for the untimed work, and drops what it timed
        cuda::set_kernel_timing(true);
        if (profile_) cuda::set_profiler_capture(true);
    }
    if (timing_) step_start_ = Clock::now();
}

void StepTimer::batch_loaded() {
    if (timing_) report_.data += since(step_start_);
}

void StepTimer::step_ends() {
    if (!timing_) return;
    report_.step += since(step_start_);
    report_.steps++;
    timing_ = false;
    if (device_ != Device::CUDA) return;
    if (profile_) cuda::set_profiler_capture(false);
    cuda::set_kernel_timing(false);
    for (const cuda::KernelTime& k : cuda::take_kernel_times()) {
        auto same = [&](const cuda::KernelTime& t) { return t.kernel == k.kernel; };
        auto it = std::find_if(report_.kernels.begin(), report_.kernels.end(), same);
        if (it == report_.kernels.end()) it = report_.kernels.insert(it, {k.kernel, 0, 0.0});
        it->launches += k.launches;
        it->ms += k.ms;
    }
}

namespace {

// One row: name, output shape, forward, backward and total ms per step, share of the step, and
// seconds per epoch ("" leaves a column empty).
std::string row(const std::string& name, const std::string& output, const std::string& fwd, const std::string& bwd,
                double total_ms, double share, double epoch_s) {
    char line[256];
    std::snprintf(line, sizeof line, "%-28s %-20s %10s %10s %10.2f %7.1f%% %9.1f\n", name.c_str(), output.c_str(),
                  fwd.c_str(), bwd.c_str(), total_ms, 100 * share, epoch_s);
    return line;
}

std::string ms(double seconds) {
    char s[32];
    std::snprintf(s, sizeof s, "%.2f", 1e3 * seconds);
    return s;
}

}  // namespace

std::string format_time_report(const TimeReport& r, int64_t steps_per_epoch) {
    KILN_CHECK(r.steps > 0, "format_time_report: no step was timed (the first steps are skipped); run more steps");
    const double n = r.steps, step = r.step / n;  // the mean step, in seconds
    const auto per_step = [&](double total) { return total / n; };
    std::ostringstream os;
    char head[256];
    std::snprintf(head, sizeof head, "time of one training step by layer: the mean of %d timed steps, %lld steps per epoch\n",
                  r.steps, (long long)steps_per_epoch);
    os << head;
    std::snprintf(head, sizeof head, "%-28s %-20s %10s %10s %10s %8s %9s\n", "layer", "output", "forward ms",
                  "backward ms", "total ms", "share", "epoch s");
    os << head;
    for (const LayerTime& l : r.layers) {
        const double t = per_step(l.forward + l.backward);
        os << row(l.name, l.output.str(), ms(per_step(l.forward)), ms(per_step(l.backward)), 1e3 * t, t / step,
                  t * double(steps_per_epoch));
    }
    const auto total = [&](const char* what, double seconds) {
        const double t = per_step(seconds);
        os << row(what, "", "", "", 1e3 * t, t / step, t * double(steps_per_epoch));
    };
    total("(loading the batch)", r.data);
    total("(outside the layers)", r.outside());  // the loss, the optimizer, ...
    total("step", r.step);
    if (!r.kernels.empty()) os << format_kernel_times(r);
    return os.str();
}

std::string format_kernel_times(const TimeReport& r) {
    KILN_CHECK(r.steps > 0, "format_kernel_times: no step was timed; run more steps");
    std::vector<cuda::KernelTime> kernels = r.kernels;
    std::stable_sort(kernels.begin(), kernels.end(), [](const auto& a, const auto& b) { return a.ms > b.ms; });
    double all_ms = 0;
    int64_t all_launches = 0;
    for (const cuda::KernelTime& k : kernels) all_ms += k.ms, all_launches += k.launches;
    const double n = r.steps;
    std::ostringstream os;
    char line[320];
    std::snprintf(line, sizeof line, "time of one training step by kernel (CUDA events around each launch; the mean of %d steps)\n",
                  r.steps);
    os << line;
    std::snprintf(line, sizeof line, "%-48s %9s %10s %8s\n", "kernel", "launches", "ms", "share");
    os << line;
    const auto row = [&](const std::string& name, double launches, double ms) {
        std::snprintf(line, sizeof line, "%-48s %9.1f %10.3f %7.1f%%\n", name.c_str(), launches / n, ms / n,
                      all_ms > 0 ? 100 * ms / all_ms : 0.0);
        os << line;
    };
    for (const cuda::KernelTime& k : kernels) row(k.kernel, double(k.launches), k.ms);
    row("(all kernels)", double(all_launches), all_ms);
    std::snprintf(line, sizeof line, "the kernels ran %.3f ms of the step's %.3f ms (%.1f%%); the rest is the host's launches, "
                  "copies and waits\n", all_ms / n, 1e3 * r.step / n, r.step > 0 ? 100 * all_ms / (1e3 * r.step) : 0.0);
    os << line;
    return os.str();
}

void write_time_report_svg(const TimeReport& r, const std::string& path, const std::string& title) {
    KILN_CHECK(r.steps > 0, "write_time_report_svg: no step was timed; run more steps");
    struct Bar {
        std::string label;
        double forward_ms, backward_ms;  // the "outside" bars put their whole time in forward_ms
    };
    const double n = r.steps;
    std::vector<Bar> bars;
    for (const LayerTime& l : r.layers) bars.push_back({l.name, 1e3 * l.forward / n, 1e3 * l.backward / n});
    bars.push_back({"(loading the batch)", 1e3 * r.data / n, 0});
    bars.push_back({"(outside the layers)", 1e3 * r.outside() / n, 0});
    double most = 0;
    for (const Bar& b : bars) most = std::max(most, b.forward_ms + b.backward_ms);
    most = std::max(most, 1e-3);  // an axis even when nothing took time
    std::vector<double> ticks = nice_ticks(0, most, 6);
    if (ticks.back() < most) ticks.push_back(ticks.back() + (ticks.size() > 1 ? ticks[1] - ticks[0] : most));
    const double top = ticks.back();  // the longest bar ends before the last tick

    // Names on the left, bars from x0 to x0 + width, one 16-pixel row each.
    const double x0 = 190, width = 520, y0 = 50, row = 16;
    Svg svg(x0 + width + 30, y0 + row * double(bars.size()) + 70);
    svg.text({(x0 + width) / 2, 22}, title, 14, Anchor::Middle);
    const auto x_at = [&](double ms) { return x0 + width * ms / top; };
    for (double t : ticks) {
        svg.line({x_at(t), y0 - 4}, {x_at(t), y0 + row * double(bars.size())}, "#dddddd");
        char v[32];
        std::snprintf(v, sizeof v, "%g", t);
        svg.text({x_at(t), y0 - 8}, v, 10, Anchor::Middle);
    }
    for (size_t i = 0; i < bars.size(); ++i) {
        const Bar& b = bars[i];
        const double y = y0 + row * double(i);
        svg.text({x0 - 6, y + row - 4}, b.label, 11, Anchor::End);
        const bool layer = i < r.layers.size();
        svg.rect({x0, y + 2, x_at(b.forward_ms) - x0, row - 4}, layer ? "#1f77b4" : "#7f7f7f");
        svg.rect({x_at(b.forward_ms), y + 2, x_at(b.forward_ms + b.backward_ms) - x_at(b.forward_ms), row - 4}, "#ff7f0e");
    }
    const double bottom = y0 + row * double(bars.size());
    svg.text({x0 + width / 2, bottom + 20}, "milliseconds per training step (the mean of the timed steps)", 12,
             Anchor::Middle);
    svg.legend({x0 + width - 120, bottom + 28}, {{"forward", "#1f77b4"}, {"backward", "#ff7f0e"}});
    svg.save(path);
}

}  // namespace kiln
