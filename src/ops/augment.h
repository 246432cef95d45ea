// augment.h — the augment family: a batch of training images built on the GPU (chapter 13: the
// data on the device, as airbench does): the images' bytes uploaded once, and per batch one
// kernel that picks each image, normalizes it and cuts, shifts and mirrors it — what the
// DataLoader does on the CPU (data/loader.h), with the same bits. The kernel's contract only:
// cuda/augment.cu; the CPU's version is the loader itself (data/loader.cpp, data/transforms.cpp),
// and the loader calls the kernel directly, so the family has no op on tensors, no autocast class
// and nothing under KILN_DEFINE_OPS.
#pragma once
#include <cstdint>

#include "core/backend.h"

namespace kiln {

// One crop, shift or flip as a window onto the image before it (data/transforms.h):
//   out[c, y, x] = in[c, top + y, left + x'],   x' = flip ? w_out − 1 − x : x
// A row or column outside the image reads 0 (reflect = 0: Padding::Zeros, after Normalize: the
// mean) or the image mirrored at its edge (reflect = 1: row −1 reads row 1, row H reads H − 2).
struct ImageWindow {
    int32_t top = 0, left = 0;
    int32_t flip = 0, reflect = 0;
};

// The windows an image goes through, in order, and the image's size before each and after the
// last; Normalize's x = pixel · scale[c] + shift[c] (one fmaf) comes first.
constexpr int kMaxWindows = 6;
constexpr int kMaxAugmentChannels = 4;
struct AugmentGeometry {
    int32_t channels = 0, windows = 0;
    int32_t h[kMaxWindows + 1] = {}, w[kMaxWindows + 1] = {};  // [0]: the stored image; [k + 1]: after window k
    float scale[kMaxAugmentChannels] = {}, shift[kMaxAugmentChannels] = {};
};

// x [B, C, h[S], w[S]] (f32) from pixels [N, C, h[0], w[0]] (bytes): image b is stored image
// source[b] through its windows window[b·S .. b·S + S), S = g.windows.
KILN_CUDA_KERNEL(void augment_images(const uint8_t* pixels, const int32_t* source, const ImageWindow* window,
                                     const AugmentGeometry& g, int64_t B, float* x));

}  // namespace kiln
