// test_images.cpp — the picture writer of chapter 03's figures: the pixel layout of tiles and
// grids, text strokes, and the PNG file (its header, and the error on a path it cannot write).
#include <catch2/catch.hpp>

#include <fstream>
#include <iterator>

#include "fixtures.h"
#include "io/images.h"

using namespace kiln;
using Catch::Contains;

namespace {

// The picture as one letter per pixel, rows joined by '|': '#' black, '.' white, 'g' grey 90,
// other colours '?'.
std::string letters(const Image& image) {
    std::string s;
    for (int y = 0; y < image.height(); y++) {
        if (y) s += '|';
        for (int x = 0; x < image.width(); x++) {
            const Rgb p = image.pixel(x, y);
            s += p == kBlack ? '#' : p == kWhite ? '.' : p == Rgb{90, 90, 90} ? 'g' : '?';
        }
    }
    return s;
}

}  // namespace

TEST_CASE("grey_tile scales each tile to its own range, each value a square", "[images][cpu][lesson08]") {
    const float v[4] = {-2, 0, 2, 6};  // min -2 -> 0, max 6 -> 255
    const Image tile = grey_tile(v, 2, 2, 2);
    REQUIRE(tile.width() == 4);
    REQUIRE(tile.height() == 4);
    const uint8_t want[4][4] = {{0, 0, 64, 64}, {0, 0, 64, 64}, {128, 128, 255, 255}, {128, 128, 255, 255}};
    for (int y = 0; y < 4; y++)
        for (int x = 0; x < 4; x++) {
            INFO("(" << x << ", " << y << ")");
            REQUIRE(tile.pixel(x, y) == Rgb{want[y][x], want[y][x], want[y][x]});
        }
    const float flat[2] = {3, 3};
    REQUIRE(grey_tile(flat, 1, 2, 1).pixel(1, 0) == Rgb{128, 128, 128});
    // bytes(): rows top to bottom, r g b per pixel
    REQUIRE(tile.bytes().size() == 4 * 4 * 3);
    REQUIRE(tile.bytes()[(2 * 4 + 2) * 3 + 1] == 255);
    REQUIRE_THROWS_WITH(tile.pixel(4, 0), Contains("(4, 0)") && Contains("4×4"));
}

TEST_CASE("grid lays tiles out in rows with a gap around and between them", "[images][cpu][lesson08]") {
    const float black_white[2] = {0, 1}, white_black[2] = {1, 0};
    const std::vector<Image> tiles = {grey_tile(black_white, 1, 2, 1), grey_tile(white_black, 1, 2, 1),
                                      grey_tile(black_white, 1, 2, 1)};
    const Image sheet = grid(tiles, 2, 1, {90, 90, 90});  // 3 tiles of 2×1, 2 columns, gap 1
    REQUIRE(letters(sheet) ==
            "ggggggg|"
            "g#.g.#g|"
            "ggggggg|"
            "g#.gggg|"
            "ggggggg");
    REQUIRE_THROWS_WITH(grid({tiles[0], grey_tile(black_white, 2, 1, 1)}, 2, 1),
                        Contains("tile 1 is 1×2") && Contains("one size"));
    REQUIRE_THROWS_WITH(grid({}, 2, 1), Contains("at least one tile"));
}

TEST_CASE("draw_text strokes stay inside the text's box", "[images][cpu][lesson08]") {
    Image image(40, 20);
    const int width = draw_text(image, 3, 4, "17", kRed, 2);
    REQUIRE(width > 0);
    int inked = 0;
    for (int y = 0; y < image.height(); y++)
        for (int x = 0; x < image.width(); x++) {
            if (image.pixel(x, y) == kWhite) continue;
            INFO("(" << x << ", " << y << ")");
            REQUIRE(image.pixel(x, y) == kRed);
            REQUIRE(x >= 3);
            REQUIRE(x < 3 + width);
            REQUIRE(y >= 4);
            REQUIRE(y < 4 + 2 * 12);
            inked++;
        }
    REQUIRE(inked >= 2 * 2 * 5);  // at least the 1's stem: 5 pixels high, each 2×2
    Image blank(40, 20);
    draw_text(blank, 3, 4, "  ", kRed, 2);
    REQUIRE(letters(blank) == letters(Image(40, 20)));
}

TEST_CASE("save_png writes a PNG of the picture's size, or names the path it cannot write", "[images][cpu][lesson08]") {
    test::TempDir dir;
    Image image(300, 2, kRed);
    save_png(image, dir.file("red.png"));
    std::ifstream in(dir.file("red.png"), std::ios::binary);
    const std::vector<uint8_t> png((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    REQUIRE(png.size() > 33);
    const std::vector<uint8_t> signature = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    REQUIRE(std::vector<uint8_t>(png.begin(), png.begin() + 8) == signature);
    // the IHDR chunk: width and height as big-endian 32-bit numbers at bytes 16 and 20, then
    // 8 bits per channel and colour type 2 (RGB)
    REQUIRE(std::vector<uint8_t>(png.begin() + 12, png.begin() + 26) ==
            std::vector<uint8_t>{'I', 'H', 'D', 'R', 0, 0, 1, 44, 0, 0, 0, 2, 8, 2});
    REQUIRE_THROWS_WITH(save_png(image, dir.file("no-such-folder/red.png")),
                        Contains("no-such-folder/red.png") && Contains("writable"));
}
