// transforms.cpp — crop, shift, flip (each a window: apply_window), resize.
#include "data/transforms.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/rng.h"

namespace kiln {

// ---- windows: crops, shifts and flips -----------------------------------------------------------
//   out[c, y, x] = in[c, top + y, left + x'],   x' = flip ? w_out − 1 − x : x
// outside the image 0 or the reflection (cuda/augment.cu runs the same on the GPU).
void apply_window(const float* in, ImageShape from, const ImageWindow& w, ImageShape to, float* out) {
    const auto reflect = [](int64_t i, int64_t n) { return i < 0 ? -i : i >= n ? 2 * n - 2 - i : i; };
    for (int64_t c = 0; c < to.c; c++)
        for (int64_t y = 0; y < to.h; y++) {
            const int64_t sy = w.top + y;
            float* row = out + (c * to.h + y) * to.w;
            for (int64_t x = 0; x < to.w; x++) {
                const int64_t sx = w.left + (w.flip ? to.w - 1 - x : x);
                if (w.reflect) {
                    row[x] = in[(c * from.h + reflect(sy, from.h)) * from.w + reflect(sx, from.w)];
                } else {
                    const bool inside = sy >= 0 && sy < from.h && sx >= 0 && sx < from.w;
                    row[x] = inside ? in[(c * from.h + sy) * from.w + sx] : 0.0f;
                }
            }
        }
}

// ---- RandomCrop ----------------------------------------------------------------------------
RandomCrop::RandomCrop(int64_t size, int64_t padding, Padding mode) : size_(size), padding_(padding), mode_(mode) {
    KILN_CHECK(size > 0 && padding >= 0, "RandomCrop(", size, ", ", padding, "): size > 0 and padding ≥ 0");
}

ImageShape RandomCrop::output_shape(ImageShape in) const {
    KILN_CHECK(in.h + 2 * padding_ >= size_ && in.w + 2 * padding_ >= size_, "RandomCrop(", size_, ") of a ", in.h,
               "×", in.w, " image padded by ", padding_, ": the window does not fit");
    KILN_CHECK(mode_ == Padding::Zeros || (padding_ < in.h && padding_ < in.w), "RandomCrop: reflecting ", padding_,
               " pixels needs an image larger than that, got ", in.h, "×", in.w);
    return {in.c, size_, size_};
}

bool RandomCrop::window(ImageShape s, uint64_t bits, ImageWindow* w) const {
    // the window's top-left corner in padded coordinates: [0, H + 2p − size]
    w->top = int32_t(int64_t(splitmix64(bits) % uint64_t(s.h + 2 * padding_ - size_ + 1)) - padding_);
    w->left = int32_t(int64_t(splitmix64(bits + 1) % uint64_t(s.w + 2 * padding_ - size_ + 1)) - padding_);
    w->flip = 0;
    w->reflect = mode_ == Padding::Reflect;
    return true;
}

void RandomCrop::apply(const float* in, ImageShape s, float* out, uint64_t bits) const {
    ImageWindow w;
    window(s, bits, &w);
    apply_window(in, s, w, output_shape(s), out);
}

// ---- Translate -------------------------------------------------------------------------------
Translate::Translate(int64_t dy, int64_t dx, Padding mode) : dy_(dy), dx_(dx), mode_(mode) {}

ImageShape Translate::output_shape(ImageShape in) const {
    KILN_CHECK(std::abs(dy_) < in.h && std::abs(dx_) < in.w, "Translate(", dy_, ", ", dx_, ") of a ", in.h, "×", in.w,
               " image: the shift must be smaller than the image");
    return in;
}

bool Translate::window(ImageShape, uint64_t, ImageWindow* w) const {
    *w = ImageWindow{int32_t(dy_), int32_t(dx_), 0, mode_ == Padding::Reflect};
    return true;
}

void Translate::apply(const float* in, ImageShape s, float* out, uint64_t bits) const {
    ImageWindow w;
    window(s, bits, &w);
    apply_window(in, s, w, output_shape(s), out);
}

// ---- RandomHorizontalFlip --------------------------------------------------------------------
RandomHorizontalFlip::RandomHorizontalFlip(float p) : p_(p) {
    KILN_CHECK(p >= 0 && p <= 1, "RandomHorizontalFlip(", p, "): p must be in [0, 1]");
}

bool RandomHorizontalFlip::window(ImageShape, uint64_t bits, ImageWindow* w) const {
    *w = ImageWindow{0, 0, Rng::to_unit(splitmix64(bits + 2)) < p_, 0};
    return true;
}

void RandomHorizontalFlip::apply(const float* in, ImageShape s, float* out, uint64_t bits) const {
    ImageWindow w;
    window(s, bits, &w);
    apply_window(in, s, w, s, out);
}

// ---- Resize ----------------------------------------------------------------------------------
Resize::Resize(int64_t h, int64_t w) : h_(h), w_(w) {
    KILN_CHECK(h > 0 && w > 0, "Resize(", h, ", ", w, "): sizes must be positive");
}

// One axis of bilinear sampling: output index o -> two source indices and the weight of the second.
struct Tap { int64_t i0, i1; float t; };
static Tap tap(int64_t o, int64_t in_size, int64_t out_size) {
    float src = (float(o) + 0.5f) * float(in_size) / float(out_size) - 0.5f;
    src = std::max(src, 0.0f);
    int64_t i0 = std::min(int64_t(src), in_size - 1);
    int64_t i1 = std::min(i0 + 1, in_size - 1);
    return {i0, i1, src - float(i0)};
}

//   out = (1−ty)·[(1−tx)·p00 + tx·p01] + ty·[(1−tx)·p10 + tx·p11]
void Resize::apply(const float* in, ImageShape s, float* out, uint64_t) const {
    for (int64_t y = 0; y < h_; y++) {
        Tap ty = tap(y, s.h, h_);
        for (int64_t x = 0; x < w_; x++) {
            Tap tx = tap(x, s.w, w_);
            for (int64_t c = 0; c < s.c; c++) {
                const float* plane = in + c * s.h * s.w;
                float top = (1 - tx.t) * plane[ty.i0 * s.w + tx.i0] + tx.t * plane[ty.i0 * s.w + tx.i1];
                float bottom = (1 - tx.t) * plane[ty.i1 * s.w + tx.i0] + tx.t * plane[ty.i1 * s.w + tx.i1];
                out[(c * h_ + y) * w_ + x] = (1 - ty.t) * top + ty.t * bottom;
            }
        }
    }
}

// ---- CenterCrop ------------------------------------------------------------------------------
CenterCrop::CenterCrop(int64_t size) : size_(size) { KILN_CHECK(size > 0, "CenterCrop(", size, "): size must be positive"); }

ImageShape CenterCrop::output_shape(ImageShape in) const {
    KILN_CHECK(in.h >= size_ && in.w >= size_, "CenterCrop(", size_, ") of a ", in.h, "×", in.w, " image: too small");
    return {in.c, size_, size_};
}

bool CenterCrop::window(ImageShape s, uint64_t, ImageWindow* w) const {
    *w = ImageWindow{int32_t((s.h - size_) / 2), int32_t((s.w - size_) / 2), 0, 0};
    return true;
}

void CenterCrop::apply(const float* in, ImageShape s, float* out, uint64_t bits) const {
    ImageWindow w;
    window(s, bits, &w);
    apply_window(in, s, w, output_shape(s), out);
}

}  // namespace kiln
