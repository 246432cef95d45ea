// augment.cu — a batch of training images made on the GPU (ops/augment.h), the twin of
// the DataLoader's CPU loop (src/data/loader.cpp: fill_batch, with transforms.cpp's
// apply_window): the same bits, so a run may build its batches on either side.
//
// One thread per output value x[b, c, y, x]. It walks the image's windows backwards, from the
// batch's coordinates to the stored image's:
//   window k (from size h[k] × w[k] to h[k+1] × w[k+1]):  y ← top + y,  x ← left + (flip ? w[k+1] − 1 − x : x)
// and a coordinate outside the image either ends the walk with 0 (zero padding: what the CPU's
// window writes, after Normalize) or is reflected (row −1 reads row 1, row H reads H − 2). Then
//   x[b, c, y, x] = fmaf(pixel, scale[c], shift[c])               (Normalize: one rounding, as the CPU)
// Consecutive threads write consecutive values (coalesced); their reads are the bytes of one
// row of one image, shifted by the crop: a few 32-byte sectors per warp.
//
// Launch shape: block = 256 threads, grid = min(ceil(B·C·H·W / 256), 1024) blocks, grid-stride.
//
//   make test T='[loader][cuda]'
#include "common.cuh"
#include "ops/augment.h"

namespace kiln::cuda {

using detail::blocks_for;
using detail::kBlock;

// a[i] for an i known only at run time, as a chain of selects: indexing a kernel argument's array
// with it would copy the whole argument to local memory (ptxas: a 96-byte stack frame).
template <typename T, int N>
__device__ inline T select_at(const T (&a)[N], int32_t i) {
    T v = a[0];
    KILN_UNROLL
    for (int32_t k = 1; k < N; k++)
        if (i == k) v = a[k];
    return v;
}

// An index outside [0, n) mirrored at the edge without repeating it (PyTorch's "reflect").
__device__ inline int32_t reflect_index(int32_t i, int32_t n) { return i < 0 ? -i : i >= n ? 2 * n - 2 - i : i; }

__global__ void augment_images_kernel(const uint8_t* pixels, const int32_t* source, const ImageWindow* window,
                                      AugmentGeometry g, int64_t B, float* out) {
    const int32_t S = g.windows, C = g.channels, H = select_at(g.h, S), W = select_at(g.w, S);
    const int64_t per_image = int64_t(C) * H * W, n = B * per_image;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t b = i / per_image;
        const int32_t c = int32_t(i % per_image / (int64_t(H) * W));
        int32_t y = int32_t(i % (int64_t(H) * W) / W), x = int32_t(i % W);
        bool zero = false;
        KILN_UNROLL
        for (int32_t k = kMaxWindows - 1; k >= 0; k--) {  // unrolled: g.h[k], g.w[k] with constant k
            if (k >= S || zero) continue;
            const ImageWindow w = window[b * S + k];
            y = w.top + y;
            x = w.left + (w.flip ? g.w[k + 1] - 1 - x : x);
            if (w.reflect) {
                y = reflect_index(y, g.h[k]);
                x = reflect_index(x, g.w[k]);
            } else {
                zero = y < 0 || y >= g.h[k] || x < 0 || x >= g.w[k];
            }
        }
        const int64_t at = ((int64_t(source[b]) * C + c) * g.h[0] + y) * g.w[0] + x;
        out[i] = zero ? 0.0f : fmaf(float(pixels[at]), select_at(g.scale, c), select_at(g.shift, c));
    }
}

void augment_images(const uint8_t* pixels, const int32_t* source, const ImageWindow* window, const AugmentGeometry& g,
                    int64_t B, float* x) {
    const int64_t n = B * g.channels * g.h[g.windows] * g.w[g.windows];
    if (n == 0) return;
    const dim3 grid(blocks_for(n)), block(kBlock);
    KILN_LAUNCH(augment_images_kernel, grid, block, 0)(pixels, source, window, g, B, x);
    KILN_CHECK_LAUNCH(augment_images_kernel, grid, block);
}

}  // namespace kiln::cuda
