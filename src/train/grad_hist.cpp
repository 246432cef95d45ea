// grad_hist.cpp — the gradient exponent histogram against f16's range (see grad_hist.h).
#include "train/grad_hist.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/error.h"

namespace kiln {

namespace {

// f16's zone boundaries (grad_hist.h), read off its format (core/dtype.h): the smallest
// subnormal 2^-24 and normal 2^-14, and 65520, the midpoint between 65504 (the largest f16) and
// 65536 (the next value at f16's precision: max + ulp(max)/2), from which values round to inf.
struct F16Zones {
    double smallest_subnormal, smallest_normal, overflow;
};
const F16Zones kF16 = [] {
    const FloatFormat f = float_format(DType::F16);
    return F16Zones{f.min_subnormal, f.min_normal, f.max + f.epsilon * std::ldexp(1.0, std::ilogb(f.max)) / 2};
}();

enum class Zone { Underflow, Subnormal, Normal, Overflow };

Zone f16_zone(double magnitude) {
    if (magnitude < kF16.smallest_subnormal) return Zone::Underflow;
    if (magnitude < kF16.smallest_normal) return Zone::Subnormal;
    return magnitude < kF16.overflow ? Zone::Normal : Zone::Overflow;
}

const char* zone_name(Zone z) {
    switch (z) {
        case Zone::Underflow: return "underflow";
        case Zone::Subnormal: return "subnormal";
        case Zone::Normal: return "normal";
        case Zone::Overflow: return "overflow";
    }
    return "";
}

// One finite, non-zero value into the histogram.
void add_value(GradHistogram& h, float g) {
    h.counts[size_t(std::ilogb(g) - GradHistogram::kMinExponent)]++;  // ilogb: floor(log2 |g|), exact
    const double magnitude = std::fabs(double(g));
    const Zone alone = f16_zone(magnitude), scaled = f16_zone(magnitude * double(h.scale));
    h.underflow += alone == Zone::Underflow;
    h.subnormal += alone == Zone::Subnormal;
    h.underflow_scaled += scaled == Zone::Underflow;
    h.subnormal_scaled += scaled == Zone::Subnormal;
    h.overflow_scaled += scaled == Zone::Overflow;
}

// "1234 (1.21%)"
std::string with_share(int64_t n, int64_t of) {
    char text[64];
    std::snprintf(text, sizeof text, "%lld (%.2f%%)", (long long)n, of ? 100.0 * double(n) / double(of) : 0.0);
    return text;
}

}  // namespace

GradHistogram grad_histogram(const std::vector<Tensor>& grads, float scale) {
    KILN_CHECK(std::isfinite(scale) && scale > 0.0f, "grad_histogram: the loss scale ", scale,
               " must be a positive finite number");
    GradHistogram h;
    h.scale = scale;
    for (const Tensor& t : grads) {
        check_defined(t, "grad_histogram", "a gradient");
        check_dtype(t, DType::F32, "grad_histogram", "a gradient");
        const Tensor cpu = t.to(Device::CPU);
        const float* g = cpu.data<float>();
        for (int64_t i = 0; i < cpu.numel(); i++) {
            if (!std::isfinite(g[i])) h.non_finite++;
            else if (g[i] == 0.0f) h.zeros++;
            else add_value(h, g[i]);
        }
        h.values += cpu.numel();
    }
    return h;
}

std::string grad_hist_text(const GradHistogram& h) {
    std::string s;
    char line[160];
    std::snprintf(line, sizeof line,
                  "gradient values by binary exponent e = floor(log2 |g|): %lld values, loss scale S = %.9g\n"
                  "      e       count  f16 zone of g  of S·g\n",
                  (long long)h.values, double(h.scale));
    s += line;
    int lo = GradHistogram::kMaxExponent + 1, hi = GradHistogram::kMinExponent - 1;
    int64_t most = 0;
    for (int e = GradHistogram::kMinExponent; e <= GradHistogram::kMaxExponent; e++) {
        if (h.count(e) == 0) continue;
        lo = std::min(lo, e), hi = std::max(hi, e);
        most = std::max(most, h.count(e));
    }
    for (int e = lo; e <= hi; e++) {
        const double edge = std::ldexp(1.0, e);  // the binade [2^e, 2^(e+1))
        const int bar = h.count(e) ? std::max(1, int(40 * h.count(e) / most)) : 0;
        std::snprintf(line, sizeof line, "  %5d  %10lld  %-13s  %-9s  %s", e, (long long)h.count(e),
                      zone_name(f16_zone(edge)), zone_name(f16_zone(edge * double(h.scale))),
                      std::string(size_t(bar), '#').c_str());
        std::string row = line;
        row.erase(row.find_last_not_of(' ') + 1);  // no trailing spaces where a binade is empty
        s += row + "\n";
    }
    s += "zeros " + with_share(h.zeros, h.values) + ", inf or NaN " + with_share(h.non_finite, h.values) + "\n";
    s += "f16 without scaling: " + with_share(h.underflow, h.values) + " underflow (|g| < 2^-24), " +
         with_share(h.subnormal, h.values) + " subnormal (|g| < 2^-14)\n";
    std::snprintf(line, sizeof line, "f16 at S = %.9g: ", double(h.scale));
    s += line + with_share(h.underflow_scaled, h.values) + " underflow, " + with_share(h.subnormal_scaled, h.values) +
         " subnormal, " + with_share(h.overflow_scaled, h.values) + " overflow (|S·g| >= 65520)\n";
    return s;
}

std::vector<NamedGradHistogram> grad_histograms(const std::vector<std::pair<std::string, Tensor>>& grads, float scale) {
    std::vector<NamedGradHistogram> out;
    for (const auto& [name, g] : grads) out.push_back({name, grad_histogram({g}, scale)});
    return out;
}

std::string grad_zones_text(const std::vector<NamedGradHistogram>& layers) {
    int width = 12;  // "by parameter"
    for (const NamedGradHistogram& l : layers) width = std::max(width, int(l.name.size()));
    // the zones in f16 of g, then of S·g
    std::string s = "f16 zones by parameter: underflow and subnormal as g; underflow, subnormal and overflow as S·g\n";
    char line[256];
    std::snprintf(line, sizeof line, "%-*s %10s %10s %10s %12s %12s %12s\n", width, "by parameter", "values",
                  "underflow", "subnormal", "S·underflow", "S·subnormal", "S·overflow");
    s += line;
    for (const NamedGradHistogram& l : layers) {
        const GradHistogram& h = l.h;
        std::snprintf(line, sizeof line, "%-*s %10lld %10lld %10lld %11lld %11lld %11lld\n", width, l.name.c_str(),
                      (long long)h.values, (long long)h.underflow, (long long)h.subnormal, (long long)h.underflow_scaled,
                      (long long)h.subnormal_scaled, (long long)h.overflow_scaled);
        s += line;
    }
    return s;
}

Svg grad_hist_svg(const GradHistogram& h, const std::string& title) {
    const double shift = std::log2(double(h.scale));  // S·g sits log2 S binades to the right of g
    int lo = 0, hi = 0;
    int64_t most = 1;
    for (int e = GradHistogram::kMinExponent; e <= GradHistogram::kMaxExponent; e++) {
        if (h.count(e) == 0) continue;
        lo = std::min(lo, e);
        hi = std::max(hi, e);
        most = std::max(most, h.count(e));
    }
    // f16's zones by exponent (kF16): underflow below -24, subnormal [-24, -14), normal up to
    // log2 65520 (just under 16), overflow.
    const Range x{std::min(double(lo), -28.0) - 1, std::max(hi + shift, 17.0) + 2};
    Svg svg(900, 380);
    svg.text({450, 24}, title, 16, Anchor::Middle);
    // Counts on a log scale, so that the few values in the tails (those that flush) show.
    const auto height = [](int64_t count) { return std::log10(1.0 + double(count)); };
    Plot plot(svg, {70, 50, 800, 260}, x, {0, 1.15 * height(most)});
    const Box a = plot.area();
    const auto band = [&](double from, double to, const std::string& colour, const std::string& name) {
        const double x0 = plot.at(std::max(from, x.lo), 0).x, x1 = plot.at(std::min(to, x.hi), 0).x;
        svg.rect({x0, a.y, x1 - x0, a.h}, colour);
        svg.text({(x0 + x1) / 2, a.y + 14}, name, 11, Anchor::Middle, "#555555");
    };
    const double subnormal = std::log2(kF16.smallest_subnormal), normal = std::log2(kF16.smallest_normal);
    const double overflow = std::log2(kF16.overflow);  // 15.9996: the binade of 2^15 is normal
    band(x.lo, subnormal, "#f6d5d5", "f16 underflow");
    band(subnormal, normal, "#fbefc8", "subnormal");
    band(normal, overflow, "#e2f1e2", "f16 normal");
    band(overflow, x.hi, "#f6d5d5", "overflow");
    plot.axes("binary exponent e: |value| in [2^e, 2^(e+1))", "log10(1 + values)");
    const auto bar = [&](double from, int64_t count, const std::string& colour) {
        const Point top = plot.at(from + 0.1, height(count)), bottom = plot.at(from + 0.9, 0);
        svg.rect({top.x, top.y, bottom.x - top.x, bottom.y - top.y}, colour, 0.75);
    };
    for (int e = lo; e <= hi; e++) {
        if (h.count(e) == 0) continue;
        bar(e, h.count(e), "#1f77b4");
        if (shift != 0) bar(e + shift, h.count(e), "#ff7f0e");
    }
    char scaled[64];
    std::snprintf(scaled, sizeof scaled, "S·g, scaled by S = %.9g", double(h.scale));
    plot.legend({{"g, the gradient", "#1f77b4"}, {scaled, "#ff7f0e"}});
    return svg;
}

}  // namespace kiln
