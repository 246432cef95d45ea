// images.cpp — pictures from tiles, text from stb_easy_font, PNG through stb_image_write
// (see images.h).
#include "io/images.h"

#include <algorithm>

#include "core/error.h"
#include "core/stb_warnings.h"

// stb_image_write and stb_easy_font, compiled into this file only (STB_IMAGE_WRITE_STATIC: no
// symbols exported; stb_easy_font is all static functions). Their warnings are not ours.
KILN_STB_BEGIN
#define STB_IMAGE_WRITE_IMPLEMENTATION
#define STB_IMAGE_WRITE_STATIC
#include <stb/stb_easy_font.h>
#include <stb/stb_image_write.h>
KILN_STB_END

namespace kiln {

Image::Image(int width, int height, Rgb fill_colour) : width_(width), height_(height) {
    KILN_CHECK(width > 0 && height > 0, "Image: a picture of ", width, "×", height,
               " pixels; both sides must be positive");
    bytes_.resize(size_t(width) * size_t(height) * 3);
    fill(0, 0, width, height, fill_colour);
}

Rgb Image::pixel(int x, int y) const {
    KILN_CHECK(x >= 0 && x < width_ && y >= 0 && y < height_, "Image::pixel: (", x, ", ", y,
               ") is outside the ", width_, "×", height_, " picture");
    const uint8_t* p = &bytes_[(size_t(y) * size_t(width_) + size_t(x)) * 3];
    return {p[0], p[1], p[2]};
}

void Image::fill(int x, int y, int w, int h, Rgb c) {
    const int x0 = std::max(x, 0), x1 = std::min(x + w, width_);
    const int y0 = std::max(y, 0), y1 = std::min(y + h, height_);
    for (int py = y0; py < y1; py++) {
        for (int px = x0; px < x1; px++) {
            uint8_t* p = &bytes_[(size_t(py) * size_t(width_) + size_t(px)) * 3];
            p[0] = c.r, p[1] = c.g, p[2] = c.b;
        }
    }
}

void Image::paste(const Image& tile, int x, int y) {
    for (int ty = 0; ty < tile.height(); ty++)
        for (int tx = 0; tx < tile.width(); tx++) fill(x + tx, y + ty, 1, 1, tile.pixel(tx, ty));
}

// grey = 255 · (v − min) / (max − min)
Image grey_tile(const float* values, int h, int w, int scale) {
    KILN_CHECK(h > 0 && w > 0 && scale > 0, "grey_tile: ", h, "×", w, " values at scale ", scale,
               "; all three must be positive");
    const auto [lo, hi] = std::minmax_element(values, values + size_t(h) * size_t(w));
    Image tile(w * scale, h * scale);
    for (int y = 0; y < h; y++) {
        for (int x = 0; x < w; x++) {
            const float v = values[size_t(y) * size_t(w) + size_t(x)];
            const uint8_t grey = *hi > *lo ? uint8_t(255.0f * (v - *lo) / (*hi - *lo) + 0.5f) : 128;
            tile.fill(x * scale, y * scale, scale, scale, {grey, grey, grey});
        }
    }
    return tile;
}

Image grid(const std::vector<Image>& tiles, int columns, int gap, Rgb background) {
    KILN_CHECK(!tiles.empty() && columns > 0 && gap >= 0, "grid: ", tiles.size(), " tiles in ", columns,
               " columns with a gap of ", gap, "; give at least one tile, one column, a gap ≥ 0");
    const int w = tiles[0].width(), h = tiles[0].height();
    const int cols = std::min(columns, int(tiles.size())), rows = (int(tiles.size()) + columns - 1) / columns;
    Image sheet(gap + cols * (w + gap), gap + rows * (h + gap), background);
    for (size_t i = 0; i < tiles.size(); i++) {
        KILN_CHECK(tiles[i].width() == w && tiles[i].height() == h, "grid: tile ", i, " is ", tiles[i].width(), "×",
                   tiles[i].height(), ", tile 0 ", w, "×", h, "; give tiles of one size");
        sheet.paste(tiles[i], gap + int(i) % columns * (w + gap), gap + int(i) / columns * (h + gap));
    }
    return sheet;
}

// stb_easy_font gives each stroke as a quad: 4 vertices of 16 bytes (x, y, z as floats, then
// an RGBA colour), corners 0 and 2 at the top left and bottom right.
int draw_text(Image& image, int x, int y, const std::string& text, Rgb colour, int scale) {
    std::string printable = text;  // stb_easy_font knows ' ' to '~'
    for (char& c : printable)
        if (c < ' ' || c > '~') c = '?';
    std::vector<char> quads(printable.size() * 300 + 64);
    const int n = stb_easy_font_print(0, 0, printable.data(), nullptr, quads.data(), int(quads.size()));
    for (int q = 0; q < n; q++) {
        const float* top_left = reinterpret_cast<const float*>(&quads[size_t(q) * 64]);
        const float* bottom_right = reinterpret_cast<const float*>(&quads[size_t(q) * 64 + 32]);
        const int x0 = int(top_left[0]), y0 = int(top_left[1]);
        const int x1 = int(bottom_right[0]), y1 = int(bottom_right[1]);
        image.fill(x + x0 * scale, y + y0 * scale, (x1 - x0) * scale, (y1 - y0) * scale, colour);
    }
    return stb_easy_font_width(printable.data()) * scale;
}

Image with_caption(const Image& tile, const std::string& text, Rgb colour) {
    Image captioned(tile.width(), tile.height() + 12);
    captioned.paste(tile, 0, 0);
    draw_text(captioned, 2, tile.height() + 3, text, colour);
    return captioned;
}

void save_png(const Image& image, const std::string& path) {
    const int ok = stbi_write_png(path.c_str(), image.width(), image.height(), 3, image.bytes().data(),
                                  image.width() * 3);
    KILN_CHECK(ok, "cannot write the picture ", path, ": check that its folder exists and is writable");
}

}  // namespace kiln
