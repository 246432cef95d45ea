// histogram_svg.cpp — the histogram observer's figure (see histogram_svg.h).
#include "quant/histogram_svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

namespace kiln {

namespace {

const char* const kHistColour = "#1f77b4";
const char* const kClipColour = "#d62728";
const char* const kRangeColour = "#7f7f7f";

// "[-1.5, 4.25]: scale 0.02255, zero point 67"
std::string describe(float lo, float hi, const QParams& q) {
    char text[128];
    std::snprintf(text, sizeof text, "[%.4g, %.4g]: scale %.4g, zero point %d", double(lo), double(hi),
                  double(q.scale), int(q.zero_point));
    return text;
}

// The histogram's outline as one polygon: a step up or down at each bin edge where the height
// changes (2048 bins would be 2048 rectangles; most neighbours have the same height).
std::vector<Point> outline(const Plot& plot, const std::vector<double>& hist, double lo, double width) {
    std::vector<Point> p{plot.at(lo, 0)};
    double previous = 0;
    for (size_t i = 0; i < hist.size(); i++) {
        const double height = std::log10(1.0 + hist[i]), edge = lo + width * double(i);
        if (height == previous) continue;
        p.push_back(plot.at(edge, previous));
        p.push_back(plot.at(edge, height));
        previous = height;
    }
    const double hi = lo + width * double(hist.size());
    p.push_back(plot.at(hi, previous));
    p.push_back(plot.at(hi, 0));
    return p;
}

}  // namespace

Svg histogram_svg(const HistogramObserver& obs, const std::string& title) {
    const ClipRange clip = obs.clip_range();  // refuses an observer that saw nothing
    const std::vector<double>& hist = obs.histogram();
    const double most = *std::max_element(hist.begin(), hist.end());
    const double lo = obs.min(), hi = obs.max(), width = (hi - lo) / double(hist.size());

    Svg svg(760, 400);
    svg.text({380, 24}, title, 16, Anchor::Middle);
    Plot plot(svg, {70, 60, 660, 260}, {lo, hi}, {0, 1.15 * std::log10(1.0 + most)});
    const Box a = plot.area();
    const double x0 = plot.at(clip.lo, 0).x, x1 = plot.at(clip.hi, 0).x;
    svg.rect({x0, a.y, x1 - x0, a.h}, kClipColour, 0.08);
    plot.axes("value", "log10(1 + count)");
    // filled, and edged with a line: a bin a pixel wide (an outlier's) still shows as a spike
    const std::vector<Point> shape = outline(plot, hist, lo, width);
    svg.polygon(shape, kHistColour, 0.7);
    svg.polyline(shape, kHistColour, 1);
    for (double x : {lo, hi}) svg.line(plot.at(x, 0), {plot.at(x, 0).x, a.y}, kRangeColour, 1.5, true);
    for (double x : {x0, x1}) svg.line({x, a.y + a.h}, {x, a.y}, kClipColour, 2);

    const QParams full = choose_qparams_affine(obs.min(), obs.max(), obs.qmin(), obs.qmax());
    svg.text({a.x, 44}, "min/max " + describe(obs.min(), obs.max(), full), 12, Anchor::Start, kRangeColour);
    svg.text({a.x + a.w, 44}, "clip " + describe(clip.lo, clip.hi, obs.qparams()), 12, Anchor::End, kClipColour);
    plot.legend({{"histogram", kHistColour}, {"clip range", kClipColour}, {"observed range", kRangeColour}});
    return svg;
}

}  // namespace kiln
