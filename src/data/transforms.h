// transforms.h — per-image transforms applied by the loader after Normalize, for data
// augmentation (RandomCrop, RandomHorizontalFlip) and resizing (Resize, CenterCrop).
//
// Each works on one float image [C, H, W] and may change H and W. Random ones draw from
// `bits`, a random 64-bit number the loader derives from (seed, epoch, position in the
// epoch): the same run gives the same augmented images, on any number of threads.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "ops/augment.h"  // ImageWindow

namespace kiln {

struct ImageShape { int64_t c, h, w; };

class Transform {
public:
    virtual ~Transform() = default;
    virtual ImageShape output_shape(ImageShape in) const = 0;
    // in: [C, H, W] of shape `in`; out: output_shape(in). They never overlap.
    virtual void apply(const float* in, ImageShape s, float* out, uint64_t bits) const = 0;
    // The transform as one window onto its input (ops/augment.h), for the same `bits`:
    // crops, shifts and flips are; Resize is not (false). What lets the loader build a batch on
    // the GPU (LoaderOptions::on_device).
    virtual bool window(ImageShape, uint64_t, ImageWindow*) const { return false; }
};

// out (shape `to`) = the window w onto in (shape `from`): what every crop, shift and flip runs.
void apply_window(const float* in, ImageShape from, const ImageWindow& w, ImageShape to, float* out);

// What a window reads outside the image: zeros (the mean after Normalize), or the image mirrored
// at its edge without repeating the edge (PyTorch's "reflect": row −1 reads row 1, row H reads H−2).
enum class Padding { Zeros, Reflect };

// Pads each side with `padding` pixels, then cuts a size×size window at a random position: the
// net sees the object shifted by up to `padding` pixels.
class RandomCrop : public Transform {
public:
    RandomCrop(int64_t size, int64_t padding, Padding mode = Padding::Zeros);
    ImageShape output_shape(ImageShape in) const override;
    void apply(const float* in, ImageShape s, float* out, uint64_t bits) const override;
    bool window(ImageShape in, uint64_t bits, ImageWindow* w) const override;

private:
    int64_t size_, padding_;
    Padding mode_;
};

// The image moved by a fixed (dy, dx): out[y, x] = in[y + dy, x + dx], what lies outside read
// as `mode` says. A test-time view (chapter 13: airbench scores shifts by one pixel too).
class Translate : public Transform {
public:
    Translate(int64_t dy, int64_t dx, Padding mode = Padding::Reflect);
    ImageShape output_shape(ImageShape in) const override;
    void apply(const float* in, ImageShape s, float* out, uint64_t bits) const override;
    bool window(ImageShape in, uint64_t bits, ImageWindow* w) const override;

private:
    int64_t dy_, dx_;
    Padding mode_;
};

// Mirrors the image left-right with probability p.
class RandomHorizontalFlip : public Transform {
public:
    explicit RandomHorizontalFlip(float p = 0.5f);
    ImageShape output_shape(ImageShape in) const override { return in; }
    void apply(const float* in, ImageShape s, float* out, uint64_t bits) const override;
    bool window(ImageShape in, uint64_t bits, ImageWindow* w) const override;

private:
    float p_;
};

// Bilinear resize to h×w, sampling at pixel centres (PyTorch's align_corners=False):
//   source x = (x_out + 0.5) · W_in / W_out − 0.5, clamped to the image.
class Resize : public Transform {
public:
    Resize(int64_t h, int64_t w);
    ImageShape output_shape(ImageShape in) const override { return {in.c, h_, w_}; }
    void apply(const float* in, ImageShape s, float* out, uint64_t bits) const override;

private:
    int64_t h_, w_;
};

// Cuts the central size×size window (the image must be at least that large).
class CenterCrop : public Transform {
public:
    explicit CenterCrop(int64_t size);
    ImageShape output_shape(ImageShape in) const override;
    void apply(const float* in, ImageShape s, float* out, uint64_t bits) const override;
    bool window(ImageShape in, uint64_t bits, ImageWindow* w) const override;

private:
    int64_t size_;
};

using Transforms = std::vector<std::shared_ptr<const Transform>>;

}  // namespace kiln
