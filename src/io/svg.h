// svg.h — a small SVG writer for kiln's figures (training curves, memory timelines), so that
// no plotting library is needed. An SVG file is text: shapes with coordinates in pixels, the
// origin at the top left, y growing downwards; any browser opens it.
//
//   Svg svg(640, 360);
//   svg.polyline({{10, 300}, {100, 120}}, "#1f77b4", 2);
//   svg.text({320, 20}, "loss", 14, Anchor::Middle);
//   svg.save("curves.svg");        // throws kiln::Error naming the path if it cannot write
//
// Plot maps data coordinates into a rectangle of the picture and draws the axes, with tick
// values at round numbers (1, 2 or 5 times a power of ten):
//   Plot plot(svg, {60, 30, 560, 280}, {0, 10}, {0, 2.5});  // area in pixels, x range, y range
//   plot.axes("epoch", "loss");
//   svg.polyline(plot.points(xs, ys), "#d62728", 2);
#pragma once
#include <string>
#include <vector>

namespace kiln {

struct Point {
    double x, y;
};
struct Box {
    double x, y, w, h;  // top-left corner, width, height (pixels)
};
struct Range {
    double lo, hi;
};
enum class Anchor { Start, Middle, End };  // where a text's point is: its left, centre, right

class Svg {
public:
    Svg(double width, double height);  // a white background of that size

    // Colours are SVG colours ("#1f77b4", "none"); widths are in pixels.
    void rect(Box b, const std::string& fill, double opacity = 1.0);
    void line(Point a, Point b, const std::string& stroke, double width = 1.0, bool dashed = false);
    void polyline(const std::vector<Point>& points, const std::string& stroke, double width = 1.5);
    void polygon(const std::vector<Point>& points, const std::string& fill, double opacity = 1.0);
    // rotate: degrees clockwise about the point (-90 writes upwards, for a y-axis title).
    void text(Point p, const std::string& s, double size = 12, Anchor anchor = Anchor::Start,
              const std::string& fill = "#222222", double rotate = 0);

    // A legend: a colour swatch and a label per entry, one below the other from top_left.
    void legend(Point top_left, const std::vector<std::pair<std::string, std::string>>& label_colour);

    std::string str() const;               // the whole document
    void save(const std::string& path) const;  // writes str() to path, or throws kiln::Error

private:
    double width_, height_;
    std::string body_;
};

// Round tick values covering [lo, hi]: multiples of a step of 1, 2 or 5 × 10^k, chosen so that
// there are at most max_ticks of them (nice_ticks(0, 0.93, 6) = 0, 0.2, 0.4, 0.6, 0.8).
std::vector<double> nice_ticks(double lo, double hi, int max_ticks = 6);

class Plot {
public:
    // A y range with lo == hi (a flat curve) is widened so that the mapping stays defined.
    Plot(Svg& svg, Box area, Range x, Range y);

    // Data coordinates -> pixels: x grows to the right, y upwards.
    Point at(double x, double y) const;
    std::vector<Point> points(const std::vector<double>& xs, const std::vector<double>& ys) const;

    // The frame, ticks and their values, and the two axis titles.
    void axes(const std::string& x_title, const std::string& y_title);
    // A legend in the top-right corner of the area: a colour swatch and a label per entry.
    void legend(const std::vector<std::pair<std::string, std::string>>& label_colour);

    Box area() const { return area_; }

private:
    Svg& svg_;
    Box area_;
    Range x_, y_;
};

}  // namespace kiln
