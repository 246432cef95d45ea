// images.h — small 8-bit RGB pictures for the chapters' figures (chapter 03's filters and
// misclassified digits), assembled from tiles and written as PNG through stb_image_write.
//
//   Image tile = grey_tile(weights, 5, 5, 12);     // a 5×5 filter as a 60×60 grey square
//   Image sheet = grid(tiles, /*columns=*/10, /*gap=*/4);
//   draw_text(sheet, 2, 2, "pred 7", kRed);
//   save_png(sheet, "filters.png");                // throws kiln::Error naming the path
//
// Coordinates are pixels, (0, 0) at the top left, x to the right, y downwards.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kiln {

struct Rgb {
    uint8_t r, g, b;
    bool operator==(const Rgb& o) const { return r == o.r && g == o.g && b == o.b; }
};
const Rgb kWhite{255, 255, 255}, kBlack{0, 0, 0}, kRed{200, 30, 30}, kGreen{20, 130, 40};

class Image {
public:
    Image(int width, int height, Rgb fill = kWhite);
    int width() const { return width_; }
    int height() const { return height_; }
    Rgb pixel(int x, int y) const;  // throws outside the picture
    // The part of the rectangle [x, x + w) × [y, y + h) inside the picture gets the colour.
    void fill(int x, int y, int w, int h, Rgb colour);
    // Copies `tile` with its top-left corner at (x, y), clipped to the picture.
    void paste(const Image& tile, int x, int y);
    // The pixels as PNG wants them: rows top to bottom, each pixel r, g, b:
    //   pixel (x, y) channel k at bytes()[(y · width + x) · 3 + k]
    const std::vector<uint8_t>& bytes() const { return bytes_; }

private:
    int width_, height_;
    std::vector<uint8_t> bytes_;
};

// h×w values (row-major) as a grey tile, each value scaled from the values' own range to
// 0..255 (min black, max white; all equal: mid grey) and drawn as a scale×scale square.
Image grey_tile(const float* values, int h, int w, int scale);

// Tiles of one size in rows of `columns`, `gap` pixels of background around and between them.
Image grid(const std::vector<Image>& tiles, int columns, int gap, Rgb background = kWhite);

// A line of text (ASCII) with its top-left corner at (x, y), from stb_easy_font's strokes, each
// of its pixels a scale×scale square; returns the text's width in pixels. Characters are
// about 6·scale pixels wide and 7·scale high.
int draw_text(Image& image, int x, int y, const std::string& text, Rgb colour, int scale = 1);

// The tile above a strip of white holding `text` (scale 1, 12 pixels high).
Image with_caption(const Image& tile, const std::string& text, Rgb colour);

// Writes the picture as a PNG file, or throws kiln::Error naming the path.
void save_png(const Image& image, const std::string& path);

}  // namespace kiln
