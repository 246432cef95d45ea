// winograd.h — 3×3 convolution by Winograd's minimal filtering F(4×4, 3×3) (or F(2×2, 3×3)) on
// the CPU: version v4 of ops/cpu/conv.cpp, which picks it (ConvAlgo::Winograd) for the shapes
// winograd_applies accepts. winograd.cpp explains the method; conv.cpp's three passes call the
// three below.
#pragma once
#include <cstdint>

#include "ops/params.h"

namespace kiln::cpu {

// The shapes it can compute: a 3×3 kernel, stride 1, padding 1, dilation 1, one group (so
// P = H, Q = W). f32 only: conv.cpp asks only for f32 (f16 and bf16 keep im2col).
bool winograd_computes(const Conv2dParams& p);

// And those where conv2d_algo chooses it. Its transforms cost in proportion to C + O per tile,
// the GEMM multiply-adds it saves in proportion to C·O. The bounds were drawn with F(2×2, 3×3),
// where the layers inside them gained 1.25–1.3× (64→64 and 64→256 on 15×15, 256→256 on 7×7;
// Zen 4, 2 threads, batch 256, forward + backward: lesson 03 has the tables) and the narrower
// ones (24 to 64 channels, and 64→128 on 7×7) 0.9–1.1×. With F(4×4, 3×3) those gain 1.1–1.3×
// too, but lesson 06's net is made of them, and chapters 06 to 10 quote its runs to the last
// bits: they keep im2col unless KILN_CONV says winograd. bench/bench_conv.cpp measures each way.
constexpr int64_t kWinogradMinChannels = 64;            // C and O
constexpr int64_t kWinogradMinPlane = 4;                // H and W
constexpr int64_t kWinogradMinWork = int64_t(1) << 19;  // C·O·H·W
bool winograd_applies(const Conv2dParams& p);

// Whether conv2d_algo takes Winograd, and with which tiles: Auto where winograd_applies (the
// default), Never, or Always where winograd_computes, all with F(4×4, 3×3); Always2x2 as Always
// with F(2×2, 3×3). From the environment, KILN_CONV=auto, im2col, winograd or winograd2x2 (to
// compare, or to rule Winograd out while hunting a difference); set_winograd_choice changes it
// while the program runs (the tests, bench/bench_conv.cpp).
enum class WinogradChoice { Auto, Never, Always, Always2x2 };
void set_winograd_choice(WinogradChoice choice);
// "auto", "im2col", "winograd" or "winograd2x2" (an empty value: auto); anything else is a
// kiln::Error that names `what` (the variable) and the four values.
WinogradChoice parse_winograd_choice(const char* value, const char* what);
bool winograd_chosen(const Conv2dParams& p);

// m of F(m×m, 3×3), the outputs a side of one tile: 4, or 2 with Always2x2.
int64_t winograd_tile();

// Workspace elements per image: its n² = (m + 2)² transformed planes of input tiles and of
// output tiles (each one cache line, 16 floats, longer: winograd.cpp's kSkew),
//   n² · (⌈H/m⌉ · ⌈W/m⌉ · (C + O) + 2 · 16)
int64_t winograd_elems_per_image(const Conv2dParams& p);

// Images per workspace chunk when `fit` images fit in the byte limit (fit ≥ 1): the batch if it
// fits, else a whole number of the GEMM groups of images (at least one group, even when that is
// more than fit), so that dw's sum is cut into the same groups whatever the workspace.
int64_t winograd_chunk_images(const Conv2dParams& p, int64_t fit);

// The three passes, with conv2d_forward's contract (ops/conv.h): ws holds ws_images ≥ 1 images
// of winograd_elems_per_image(p) floats.
//   forward          y  = conv(x, w) + b        (b may be null)
//   backward_data    dx = conv_transpose(dy, w)
//   backward_weight  dw += Σ_n dy_n ⋆ x_n       (db: conv.cpp)
void winograd_forward(const float* x, const float* w, const float* b, float* y, const Conv2dParams& p, float* ws,
                      int64_t ws_images);
void winograd_backward_data(const float* dy, const float* w, float* dx, const Conv2dParams& p, float* ws,
                            int64_t ws_images);
void winograd_backward_weight(const float* x, const float* dy, float* dw, const Conv2dParams& p, float* ws,
                              int64_t ws_images);

}  // namespace kiln::cpu
