// svg.cpp — the SVG writer and the plot axes (see svg.h).
#include "io/svg.h"

#include <cmath>
#include <cstdio>
#include <cstring>

#include "core/error.h"
#include "io/archive.h"

namespace kiln {

namespace {

// A number as an SVG attribute: two decimals are finer than a pixel needs.
std::string num(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f", v);
    return buf;
}

// Text inside an element: the five characters XML gives a meaning are escaped.
std::string escape(const std::string& s) {
    std::string out;
    for (char c : s) {
        switch (c) {
            case '&': out += "&amp;"; break;
            case '<': out += "&lt;"; break;
            case '>': out += "&gt;"; break;
            case '"': out += "&quot;"; break;
            case '\'': out += "&apos;"; break;
            default: out += c;
        }
    }
    return out;
}

std::string points_attr(const std::vector<Point>& points) {
    std::string s;
    for (const Point& p : points) s += num(p.x) + "," + num(p.y) + " ";
    return s;
}

const char* anchor_name(Anchor a) {
    switch (a) {
        case Anchor::Start: return "start";
        case Anchor::Middle: return "middle";
        case Anchor::End: return "end";
    }
    return "start";
}

// A tick value as a label: %g drops trailing zeros (0.6, 250, 1e+06).
std::string tick_label(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return buf;
}

}  // namespace

Svg::Svg(double width, double height) : width_(width), height_(height) {
    rect({0, 0, width, height}, "#ffffff");
}

void Svg::rect(Box b, const std::string& fill, double opacity) {
    body_ += "<rect x=\"" + num(b.x) + "\" y=\"" + num(b.y) + "\" width=\"" + num(b.w) + "\" height=\"" +
             num(b.h) + "\" fill=\"" + fill + "\" fill-opacity=\"" + num(opacity) + "\"/>\n";
}

void Svg::line(Point a, Point b, const std::string& stroke, double width, bool dashed) {
    body_ += "<line x1=\"" + num(a.x) + "\" y1=\"" + num(a.y) + "\" x2=\"" + num(b.x) + "\" y2=\"" + num(b.y) +
             "\" stroke=\"" + stroke + "\" stroke-width=\"" + num(width) + "\"" +
             (dashed ? " stroke-dasharray=\"4 3\"" : "") + "/>\n";
}

void Svg::polyline(const std::vector<Point>& points, const std::string& stroke, double width) {
    body_ += "<polyline points=\"" + points_attr(points) + "\" fill=\"none\" stroke=\"" + stroke +
             "\" stroke-width=\"" + num(width) + "\" stroke-linejoin=\"round\"/>\n";
}

void Svg::polygon(const std::vector<Point>& points, const std::string& fill, double opacity) {
    body_ += "<polygon points=\"" + points_attr(points) + "\" fill=\"" + fill + "\" fill-opacity=\"" +
             num(opacity) + "\"/>\n";
}

void Svg::text(Point p, const std::string& s, double size, Anchor anchor, const std::string& fill, double rotate) {
    body_ += "<text x=\"" + num(p.x) + "\" y=\"" + num(p.y) + "\" font-size=\"" + num(size) +
             "\" font-family=\"sans-serif\" text-anchor=\"" + anchor_name(anchor) + "\" fill=\"" + fill + "\"";
    if (rotate != 0) body_ += " transform=\"rotate(" + num(rotate) + " " + num(p.x) + " " + num(p.y) + ")\"";
    body_ += ">" + escape(s) + "</text>\n";
}

void Svg::legend(Point top_left, const std::vector<std::pair<std::string, std::string>>& label_colour) {
    double y = top_left.y;
    for (const auto& [label, colour] : label_colour) {
        rect({top_left.x, y, 14, 10}, colour);
        text({top_left.x + 20, y + 9}, label, 11);
        y += 16;
    }
}

std::string Svg::str() const {
    return "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(width_) + "\" height=\"" + num(height_) +
           "\" viewBox=\"0 0 " + num(width_) + " " + num(height_) + "\">\n" + body_ + "</svg>\n";
}

void Svg::save(const std::string& path) const {
    const int err = write_file(path, str());
    KILN_CHECK(err == 0, "cannot write the figure ", path, " (", std::strerror(err),
               "): check that its folder exists and is writable");
}

// step = m × 10^e with m = 1, 2 or 5: the smallest such step for which the multiples of it
// inside [lo, hi] number at most max_ticks. A tick k·m·10^e is computed as (k·m) / 10^-e when
// e < 0, so that 3 × 0.2 comes out as 0.6, not 0.6000000000000001.
std::vector<double> nice_ticks(double lo, double hi, int max_ticks) {
    KILN_CHECK(std::isfinite(lo) && std::isfinite(hi) && lo <= hi && max_ticks >= 2, "nice_ticks: bad range [", lo,
               ", ", hi, "] or tick count ", max_ticks);
    if (lo == hi) return {lo};
    const int e0 = int(std::floor(std::log10((hi - lo) / max_ticks)));
    for (int i = 0;; i++) {
        const int e = e0 + i / 3;
        const double m = i % 3 == 0 ? 1 : i % 3 == 1 ? 2 : 5;
        auto value = [&](double k) { return e >= 0 ? k * m * std::pow(10.0, e) : k * m / std::pow(10.0, -e); };
        const double step = value(1);
        const double first = std::ceil(lo / step - 1e-9), last = std::floor(hi / step + 1e-9);
        if (last - first + 1 > max_ticks) continue;
        std::vector<double> ticks;
        for (double k = first; k <= last; k++) ticks.push_back(k == 0 ? 0.0 : value(k));
        return ticks;
    }
}

Plot::Plot(Svg& svg, Box area, Range x, Range y) : svg_(svg), area_(area), x_(x), y_(y) {
    if (x_.hi == x_.lo) x_ = {x_.lo - 1, x_.hi + 1};
    if (y_.hi == y_.lo) y_ = {y_.lo - 1, y_.hi + 1};
}

Point Plot::at(double x, double y) const {
    return {area_.x + (x - x_.lo) / (x_.hi - x_.lo) * area_.w,
            area_.y + area_.h - (y - y_.lo) / (y_.hi - y_.lo) * area_.h};
}

std::vector<Point> Plot::points(const std::vector<double>& xs, const std::vector<double>& ys) const {
    KILN_CHECK(xs.size() == ys.size(), "Plot::points: ", xs.size(), " x values but ", ys.size(), " y values");
    std::vector<Point> p;
    for (size_t i = 0; i < xs.size(); i++) p.push_back(at(xs[i], ys[i]));
    return p;
}

void Plot::axes(const std::string& x_title, const std::string& y_title) {
    const Box a = area_;
    const std::string grey = "#dddddd", ink = "#444444";
    for (double t : nice_ticks(x_.lo, x_.hi)) {
        const double px = at(t, y_.lo).x;
        svg_.line({px, a.y}, {px, a.y + a.h}, grey);
        svg_.text({px, a.y + a.h + 15}, tick_label(t), 11, Anchor::Middle, ink);
    }
    for (double t : nice_ticks(y_.lo, y_.hi)) {
        const double py = at(x_.lo, t).y;
        svg_.line({a.x, py}, {a.x + a.w, py}, grey);
        svg_.text({a.x - 6, py + 4}, tick_label(t), 11, Anchor::End, ink);
    }
    svg_.polyline({{a.x, a.y}, {a.x, a.y + a.h}, {a.x + a.w, a.y + a.h}}, ink, 1);
    svg_.text({a.x + a.w / 2, a.y + a.h + 34}, x_title, 13, Anchor::Middle, ink);
    svg_.text({a.x - 42, a.y + a.h / 2}, y_title, 13, Anchor::Middle, ink, -90);
}

void Plot::legend(const std::vector<std::pair<std::string, std::string>>& label_colour) {
    svg_.legend({area_.x + area_.w - 150, area_.y + 8}, label_colour);
}

}  // namespace kiln
