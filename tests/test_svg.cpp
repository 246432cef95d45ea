// test_svg.cpp — the SVG writer: round tick values, the data-to-pixel mapping, escaping, errors.
#include <catch2/catch.hpp>

#include "io/svg.h"

using namespace kiln;

TEST_CASE("nice_ticks picks multiples of 1, 2 or 5 times a power of ten", "[svg][cpu][lesson08]") {
    using V = std::vector<double>;
    REQUIRE(nice_ticks(0, 0.93, 6) == V{0, 0.2, 0.4, 0.6, 0.8});
    REQUIRE(nice_ticks(0, 10, 6) == V{0, 2, 4, 6, 8, 10});
    REQUIRE(nice_ticks(0, 10, 11) == V{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
    REQUIRE(nice_ticks(-3, 7, 3) == V{0, 5});
    REQUIRE(nice_ticks(1, 12, 6) == V{2, 4, 6, 8, 10, 12});
    REQUIRE(nice_ticks(120, 180, 4) == V{120, 140, 160, 180});
    REQUIRE(nice_ticks(2.5, 2.5) == V{2.5});
    REQUIRE_THROWS_WITH(nice_ticks(1, 0), Catch::Contains("bad range"));
}

TEST_CASE("Plot maps data to pixels with y upwards", "[svg][cpu][lesson08]") {
    Svg svg(200, 100);
    Plot plot(svg, {10, 0, 100, 50}, {0, 10}, {0, 1});
    Point lo = plot.at(0, 0), hi = plot.at(10, 1), mid = plot.at(5, 0.5);
    REQUIRE(lo.x == 10); REQUIRE(lo.y == 50);
    REQUIRE(hi.x == 110); REQUIRE(hi.y == 0);
    REQUIRE(mid.x == 60); REQUIRE(mid.y == 25);
    // a flat range is widened by one unit each way: y = 3 lands in the middle
    Plot flat(svg, {0, 0, 100, 40}, {0, 1}, {3, 3});
    REQUIRE(flat.at(0, 3).y == 20);
    REQUIRE_THROWS_WITH(plot.points({1, 2}, {1}), Catch::Contains("2 x values but 1 y values"));
}

TEST_CASE("Svg writes a document with escaped text", "[svg][cpu][lesson08]") {
    Svg svg(64, 32);
    svg.polyline({{0, 1}, {2.5, 3}}, "#ff0000", 2);
    svg.text({1, 2}, "a<b & \"c\"", 10, Anchor::Middle);
    const std::string s = svg.str();
    REQUIRE(s.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"64.00\" height=\"32.00\"", 0) == 0);
    REQUIRE(s.find("points=\"0.00,1.00 2.50,3.00 \"") != std::string::npos);
    REQUIRE(s.find(">a&lt;b &amp; &quot;c&quot;</text>") != std::string::npos);
    REQUIRE(s.find("text-anchor=\"middle\"") != std::string::npos);
    REQUIRE(s.substr(s.size() - 7) == "</svg>\n");
    REQUIRE_THROWS_WITH(svg.save("/nonexistent-folder/x.svg"),
                        Catch::Contains("cannot write the figure /nonexistent-folder/x.svg"));
}
