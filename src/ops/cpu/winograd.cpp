// winograd.cpp — 3×3 convolution with fewer multiplications: Winograd's F(2×2, 3×3), as Lavin
// and Gray use it for CNNs ("Fast Algorithms for Convolutional Neural Networks", 2015).
//
// ---- The idea, in one dimension --------------------------------------------------------------
// Two outputs of a 3-tap filter g over four inputs d0..d3,
//   y0 = d0·g0 + d1·g1 + d2·g2        y1 = d1·g0 + d2·g1 + d3·g2
// cost 6 multiplications. Winograd's F(2, 3) does it with 4:
//   m0 = (d0 − d2)·g0                 m1 = (d1 + d2)·(g0 + g1 + g2)/2
//   m3 = (d1 − d3)·g2                 m2 = (d2 − d1)·(g0 − g1 + g2)/2
//   y0 = m0 + m1 + m2                 y1 = m1 − m2 − m3
// In matrices: y = Aᵀ [(G g) ⊙ (Bᵀ d)], with
//   Bᵀ = | 1  0 −1  0 |     G = | 1    0    0  |     Aᵀ = | 1  1  1  0 |
//        | 0  1  1  0 |         | ½    ½    ½  |          | 0  1 −1 −1 |
//        | 0 −1  1  0 |         | ½   −½    ½  |
//        | 0  1  0 −1 |         | 0    0    1  |
// Nested, for a 2×2 tile of outputs from a 4×4 tile d of the input: Y = Aᵀ [U ⊙ V] A with
//   U = G g Gᵀ (the filter, 4×4)      V = Bᵀ d B (the input tile, 4×4)
// 16 multiplications where the direct formula takes 36: 2.25× fewer.
//
// ---- Many channels: 16 matrix products -------------------------------------------------------
// A layer sums over its C input channels, and the sum can move inside the transform:
//   Y[o, tile] = Aᵀ [ Σ_c U[o, c] ⊙ V[c, tile] ] A
// For each of the 16 positions ξ = 4i + j of the 4×4 tiles, Σ_c U[ξ][o, c] · V[ξ][c, tile] is a
// matrix product, so the layer becomes
//   V[ξ] [C, tiles] = input transform of every tile      (Bᵀ d B: additions only)
//   M[ξ] [O, tiles] = U[ξ] [O, C] · V[ξ] [C, tiles]      16 GEMMs (gemm.h), K = C
//   y tile          = Aᵀ M[·][o, tile] A                  (output transform: additions)
// The GEMMs do 16·O·C multiply-adds per tile of 4 outputs, im2col's one does 9·O·C per output:
// 36/16 = 2.25× fewer. The tiles cover ⌈H/2⌉·⌈W/2⌉·4 positions, more than H·W when H or W is
// odd (a 7×7 plane takes 16 tiles, 64 positions for 49: the gain falls to 1.7×), and the
// transforms read and write every tile, so tiny planes and few channels gain nothing
// (winograd.h's bounds).
//
// ---- The backward pass -------------------------------------------------------------------------
//   dx  a 3×3 convolution of dy with padding 1 and the filter flipped and transposed
//       (w'[c, o] = w[o, c] turned 180°): the same pass. Its transform needs no new work:
//       G·J = S·G (J reverses a filter row, S swaps G's rows 0 and 3), so
//         U'[ξ = 4i + j][c, o] = U[4·s(i) + s(j)][o, c]      s swaps 0 and 3
//   dw  the gradient of the computation above: with dM = A dY Aᵀ (4×4 per tile, dY the 2×2
//       tile of dy, zero past the plane's edge),
//         dU[ξ] [O, C] = Σ_tiles dM[ξ] [O, tiles] · V[ξ] [C, tiles]ᵀ    16 GEMMs, K = tiles
//       (computed as its transpose when C is narrow: winograd_backward_weight)
//         dw[o, c] += Gᵀ dU[o, c] G
// In exact arithmetic both equal the direct formulas; in f32 the transforms add a few roundings
// (tests/test_conv.cpp bounds the difference from the direct convolution).
//
// ---- Memory ------------------------------------------------------------------------------------
// One image's V and M: 16·⌈H/2⌉⌈W/2⌉·(C + O) floats (plus a cache line a plane, "Operands"
// below), ≈ 4·H·W·(C + O): less than im2col's 9·H·W·C + H·W·O when C ≥ 3·O/5, more when the
// layer widens faster (64→256 on 15×15: 1.75× im2col's). U is 16·O·C floats, 1.8× the weights,
// on the heap for the call.
//
// ---- Threads and bits --------------------------------------------------------------------------
// forward and dx: groups of images (k·tiles ≥ 256 GEMM columns, conv_tasks.h), each thread
// taking one group after another into its own slot of the workspace; each output is one GEMM
// dot product over K = C plus a fixed transform, so its bits do not depend on the group, the
// workspace or the threads. dw: the groups' transforms in parallel, each in a slot of its own,
// then one task per ξ adds the groups' products into dU[ξ], group after group in image order.
// The groups are fixed by the batch (winograd_chunk_images keeps workspace chunks whole numbers
// of groups), so dw's bits depend on neither the threads nor the workspace.
#include "ops/cpu/winograd.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "core/error.h"
#include "ops/cpu/conv_tasks.h"
#include "ops/cpu/gemm.h"
#include "ops/cpu/short_rows.h"

namespace kiln::cpu {

namespace {

constexpr int64_t kXi = 16;  // transformed values per tile, ξ = 4i + j (row i, column j)
constexpr int64_t kWideTile = 64;  // columns of the GEMM's widest register tile (AVX-512's 6×64)

// The tiles of one plane: TH rows of TW, 2×2 outputs each.
struct TileGrid {
    int64_t H, W, TH, TW;
    int64_t tiles() const { return TH * TW; }
};
TileGrid tile_grid(const Conv2dParams& p) { return {p.H, p.W, (p.H + 1) / 2, (p.W + 1) / 2}; }

// U[ξ·OC + o·C + c] = (G g Gᵀ)[ξ] for each filter g = w[o, c] (3×3).
std::vector<float> weight_transform(const float* w, int64_t O, int64_t C) {
    const int64_t OC = O * C;
    std::vector<float> U(size_t(kXi * OC));
    for (int64_t oc = 0; oc < OC; oc++) {
        const float* g = w + oc * 9;
        float t[4][3];  // G g
        for (int b = 0; b < 3; b++) {
            t[0][b] = g[b];
            t[1][b] = 0.5f * (g[b] + g[3 + b] + g[6 + b]);
            t[2][b] = 0.5f * (g[b] - g[3 + b] + g[6 + b]);
            t[3][b] = g[6 + b];
        }
        for (int i = 0; i < 4; i++) {  // (G g) Gᵀ
            U[size_t((4 * i + 0) * OC + oc)] = t[i][0];
            U[size_t((4 * i + 1) * OC + oc)] = 0.5f * (t[i][0] + t[i][1] + t[i][2]);
            U[size_t((4 * i + 2) * OC + oc)] = 0.5f * (t[i][0] - t[i][1] + t[i][2]);
            U[size_t((4 * i + 3) * OC + oc)] = t[i][2];
        }
    }
    return U;
}

// dw[o, c] += Gᵀ dU[·][o, c] G for every filter, dU[ξ][o, c] at dU[ξ·OC + o·so + c·sc] (laid out
// as U, so = C and sc = 1, or transposed, so = 1 and sc = O).
void weight_grad_transform(const float* dU, int64_t O, int64_t C, int64_t so, int64_t sc, float* dw) {
    const int64_t OC = O * C;
    for (int64_t oc = 0; oc < OC; oc++) {
        const int64_t at = oc / C * so + oc % C * sc;  // (o, c) in dU
        float r[3][4];  // Gᵀ dU
        for (int j = 0; j < 4; j++) {
            const float d0 = dU[(0 + j) * OC + at], d1 = dU[(4 + j) * OC + at];
            const float d2 = dU[(8 + j) * OC + at], d3 = dU[(12 + j) * OC + at];
            r[0][j] = d0 + 0.5f * (d1 + d2);
            r[1][j] = 0.5f * (d1 - d2);
            r[2][j] = 0.5f * (d1 + d2) + d3;
        }
        float* g = dw + oc * 9;
        for (int a = 0; a < 3; a++) {  // (Gᵀ dU) G
            g[a * 3 + 0] += r[a][0] + 0.5f * (r[a][1] + r[a][2]);
            g[a * 3 + 1] += 0.5f * (r[a][1] - r[a][2]);
            g[a * 3 + 2] += 0.5f * (r[a][1] + r[a][2]) + r[a][3];
        }
    }
}

// The 1-D transforms, on four (or two) values: each 2-D one applies them down the columns, then
// along the rows. Scalars in and out (no arrays, no structs), so that g++ vectorizes the loops
// over tiles around them.
inline void bt(float d0, float d1, float d2, float d3, float& v0, float& v1, float& v2, float& v3) {  // Bᵀ d
    v0 = d0 - d2;
    v1 = d1 + d2;
    v2 = d2 - d1;
    v3 = d1 - d3;
}
inline void at(float m0, float m1, float m2, float m3, float& y0, float& y1) {  // Aᵀ m
    y0 = m0 + m1 + m2;
    y1 = m1 - m2 - m3;
}
inline void a(float g0, float g1, float& v0, float& v1, float& v2, float& v3) {  // A g
    v0 = g0;
    v1 = g0 + g1;
    v2 = g0 - g1;
    v3 = -g1;
}

// ---- The transforms: one loop over all the tiles of a plane ------------------------------------
// A tile's 16 values are independent of its neighbours', so each transform is one loop over the
// plane's T = TH·TW tiles, t = ty·TW + tx, which g++ vectorizes (#pragma omp simd): what tile t
// reads or writes is first laid out in arrays of rows TW wide, where it is element t (or, one
// tile row down, t + TW). A loop along one row of tiles at a time ran TW iterations: 4 on a 7×7
// plane, half a vector, and the rest in scalar code.

// even[j] = row[2j], odd[j] = row[2j + 1] for j < n, zero past the row's W values.
void deinterleave(const float* row, int64_t W, int64_t n, float* even, float* odd) {
    const int64_t pairs = W / 2;
#pragma omp simd
    for (int64_t j = 0; j < pairs; j++) {
        even[j] = row[2 * j];
        odd[j] = row[2 * j + 1];
    }
    for (int64_t j = pairs; j < n; j++) {
        even[j] = 2 * j < W ? row[2 * j] : 0.0f;
        odd[j] = 0.0f;
    }
}

// row[2j] = even[j], row[2j + 1] = odd[j]: the W values of a row.
void interleave(const float* even, const float* odd, int64_t W, float* row) {
    const int64_t pairs = W / 2;
#pragma omp simd
    for (int64_t j = 0; j < pairs; j++) {
        row[2 * j] = even[j];
        row[2 * j + 1] = odd[j];
    }
    if (W % 2) row[W - 1] = even[pairs];
}

// cols [2][4][TH + 1][TW]: cols[r % 2][k][r / 2][tx] = the padded plane's row r, column 2·tx + k,
// that is x[r − 1][2·tx + k − 1] (zero past x's edges: padding 1), for padded rows r = 0 .. 2·TH + 1.
// Tile t's 4×4 window (padded rows 2·ty .. 2·ty + 3, columns 2·tx .. 2·tx + 3) is then
//   d[i][k] = cols[i % 2][k][t + (i / 2)·TW]
int64_t tile_columns_elems(const TileGrid& g) { return 8 * (g.TH + 1) * g.TW; }
void tile_columns(const float* x, const TileGrid& g, float* cols) {
    const int64_t S = (g.TH + 1) * g.TW;       // one [TH + 1][TW] array
    const int64_t inside = (g.W - 1) / 2;      // tiles 1 .. inside − 1 have all four columns in x
    for (int64_t r = 0; r < 2 * g.TH + 2; r++) {
        float* c0 = cols + (r % 2) * 4 * S + (r / 2) * g.TW;
        float *c1 = c0 + S, *c2 = c1 + S, *c3 = c2 + S;
        const int64_t h = r - 1;  // x's row
        if (h < 0 || h >= g.H) {
            for (float* c : {c0, c1, c2, c3}) std::fill(c, c + g.TW, 0.0f);
            continue;
        }
        const float* row = x + h * g.W;
        for_blocks(1, inside, [&](int64_t t0, int64_t n) {
#pragma omp simd
            for (int64_t tx = t0; tx < t0 + n; tx++) {
                c0[tx] = row[2 * tx - 1];
                c1[tx] = row[2 * tx];
                c2[tx] = row[2 * tx + 1];
                c3[tx] = row[2 * tx + 2];
            }
        });
        auto at = [&](int64_t w) { return w < g.W ? row[w] : 0.0f; };  // w ≥ 0 below
        c0[0] = 0.0f, c1[0] = row[0], c2[0] = at(1), c3[0] = at(2);
        for (int64_t tx = std::max<int64_t>(inside, 1); tx < g.TW; tx++)
            c0[tx] = row[2 * tx - 1], c1[tx] = at(2 * tx), c2[tx] = at(2 * tx + 1), c3[tx] = at(2 * tx + 2);
    }
}

// v[ξ·vs + t] = (Bᵀ d_t B)[ξ] for every tile t of one plane, from its tile_columns.
void input_transform(const float* cols, const TileGrid& g, float* v, int64_t vs) {
    const int64_t S = (g.TH + 1) * g.TW, TW = g.TW;
    const float *e0 = cols, *e1 = e0 + S, *e2 = e1 + S, *e3 = e2 + S;  // rows 2·ty (+ TW: 2·ty + 2), k = 0..3
    const float *o0 = e3 + S, *o1 = o0 + S, *o2 = o1 + S, *o3 = o2 + S;  // rows 2·ty + 1 (+ TW: 2·ty + 3)
#pragma omp simd
    for (int64_t t = 0; t < g.tiles(); t++) {
        // Bᵀ d: the four rows combined, in each column j (c_ij: row i, column j)
        float c00, c10, c20, c30, c01, c11, c21, c31, c02, c12, c22, c32, c03, c13, c23, c33;
        bt(e0[t], o0[t], e0[t + TW], o0[t + TW], c00, c10, c20, c30);
        bt(e1[t], o1[t], e1[t + TW], o1[t + TW], c01, c11, c21, c31);
        bt(e2[t], o2[t], e2[t + TW], o2[t + TW], c02, c12, c22, c32);
        bt(e3[t], o3[t], e3[t + TW], o3[t + TW], c03, c13, c23, c33);
        // (Bᵀ d) B: the four columns combined, in each row i: v[4i .. 4i + 3]
        float* out = v + t;
        bt(c00, c01, c02, c03, out[0 * vs], out[1 * vs], out[2 * vs], out[3 * vs]);
        bt(c10, c11, c12, c13, out[4 * vs], out[5 * vs], out[6 * vs], out[7 * vs]);
        bt(c20, c21, c22, c23, out[8 * vs], out[9 * vs], out[10 * vs], out[11 * vs]);
        bt(c30, c31, c32, c33, out[12 * vs], out[13 * vs], out[14 * vs], out[15 * vs]);
    }
}

// A tile's 2×2 block of a plane, position by position: q[2a + b][t] (4·T floats) holds (a, b)
// of tile t. Row h of the plane is the tile row h / 2 at a = h % 2; its even columns (b = 0)
// and its odd ones (b = 1) are TW values each, here:
float* block_row(float* q, const TileGrid& g, int64_t h, int64_t b) {
    return q + (2 * (h % 2) + b) * g.tiles() + h / 2 * g.TW;
}

// y[2·ty + a][2·tx + b] = bias + (Aᵀ m_t A)[a][b]: each tile's 2×2 outputs (those inside the H×W
// plane y) from its 16 values m_t[ξ] = m[ξ·ms + t]; q: scratch for the blocks (block_row).
void output_transform(const float* m, int64_t ms, const TileGrid& g, float bias, float* q, float* y) {
    const int64_t T = g.tiles();
    float *q00 = q, *q01 = q00 + T, *q10 = q01 + T, *q11 = q10 + T;
#pragma omp simd
    for (int64_t t = 0; t < T; t++) {
        float a00, a01, a02, a03, a10, a11, a12, a13;  // Aᵀ m: the four rows combined, in each column
        at(m[0 * ms + t], m[4 * ms + t], m[8 * ms + t], m[12 * ms + t], a00, a10);
        at(m[1 * ms + t], m[5 * ms + t], m[9 * ms + t], m[13 * ms + t], a01, a11);
        at(m[2 * ms + t], m[6 * ms + t], m[10 * ms + t], m[14 * ms + t], a02, a12);
        at(m[3 * ms + t], m[7 * ms + t], m[11 * ms + t], m[15 * ms + t], a03, a13);
        float y00, y01, y10, y11;  // (Aᵀ m) A
        at(a00, a01, a02, a03, y00, y01);
        at(a10, a11, a12, a13, y10, y11);
        q00[t] = bias + y00;
        q01[t] = bias + y01;
        q10[t] = bias + y10;
        q11[t] = bias + y11;
    }
    for (int64_t h = 0; h < g.H; h++) interleave(block_row(q, g, h, 0), block_row(q, g, h, 1), g.W, y + h * g.W);
}

// dm[ξ·ms + t] = (A dY_t Aᵀ)[ξ] for every tile, dY_t the 2×2 block of dy (one H×W plane) at
// (2·ty, 2·tx), zero past its edges: the gradient of output_transform. q: scratch for the blocks
// (block_row), q[2a + b][t] = dY_t[a][b].
void grad_output_transform(const float* dy, const TileGrid& g, float* q, float* dm, int64_t ms) {
    const int64_t T = g.tiles();
    float *q00 = q, *q01 = q00 + T, *q10 = q01 + T, *q11 = q10 + T;
    for (int64_t h = 0; h < 2 * g.TH; h++) {
        float *even = block_row(q, g, h, 0), *odd = block_row(q, g, h, 1);
        if (h < g.H) {
            deinterleave(dy + h * g.W, g.W, g.TW, even, odd);
        } else {  // the row past an odd plane's edge
            std::fill(even, even + g.TW, 0.0f);
            std::fill(odd, odd + g.TW, 0.0f);
        }
    }
#pragma omp simd
    for (int64_t t = 0; t < T; t++) {
        float c00, c10, c20, c30, c01, c11, c21, c31;  // A dY (c_ij: row i, column j)
        a(q00[t], q10[t], c00, c10, c20, c30);
        a(q01[t], q11[t], c01, c11, c21, c31);
        float* out = dm + t;  // (A dY) Aᵀ, row by row: dm[4i .. 4i + 3]
        a(c00, c01, out[0 * ms], out[1 * ms], out[2 * ms], out[3 * ms]);
        a(c10, c11, out[4 * ms], out[5 * ms], out[6 * ms], out[7 * ms]);
        a(c20, c21, out[8 * ms], out[9 * ms], out[10 * ms], out[11 * ms]);
        a(c30, c31, out[12 * ms], out[13 * ms], out[14 * ms], out[15 * ms]);
    }
}

// A group's GEMM operands in the workspace, for k images of T tiles (L = k·T columns):
//   in   [16][Cin][L]    the input tiles V (of x, or of dy for dx)
//   out  [16][Cout][L]   the output tiles M (or, for dw, dy's tiles dM)
// Each ξ-plane is kSkew floats longer than its rows: planes a multiple of 4 KiB apart share one
// set of the L1 cache, and the transforms read or write all 16 of them at once (with planes of
// C·L floats that took 3 times the GEMMs' time; one cache line of skew puts each in its own set).
constexpr int64_t kSkew = 16;
struct Operands {
    float *in, *out;
    int64_t L, in_plane, out_plane;  // columns, and the floats from one ξ-plane to the next
};
Operands operands(float* ws, int64_t Cin, int64_t Cout, int64_t L) {
    const int64_t in_plane = Cin * L + kSkew, out_plane = Cout * L + kSkew;
    return {ws, ws + kXi * in_plane, L, in_plane, out_plane};
}

// The GEMM groups: ⌈256 / tiles⌉ images (conv_tasks.h), at most the batch.
int64_t group_images(const Conv2dParams& p) {
    return images_per_group(tile_grid(p).tiles(), std::max<int64_t>(p.N, 1));
}

// The chunk a pass works in, from the caller's workspace: winograd_chunk_images, never more
// than the workspace holds.
int64_t chunk_images(const Conv2dParams& p, const float* ws, int64_t ws_images, const char* op) {
    KILN_CHECK(ws && ws_images >= 1, op, ": needs a workspace of ", winograd_elems_per_image(p),
               " floats per image");
    return std::min(ws_images, winograd_chunk_images(p, ws_images));
}

// The transformed input tiles of the k images at `in` (Cin channels each), side by side:
//   V[ξ][c][i·T + t]    (T tiles an image; rows of L = k·T columns, ξ-planes `plane` floats apart)
void transform_inputs(const float* in, int64_t Cin, int64_t k, const TileGrid& g, float* V, int64_t L, int64_t plane) {
    std::vector<float> cols(size_t(tile_columns_elems(g)));
    for (int64_t i = 0; i < k; i++)
        for (int64_t c = 0; c < Cin; c++) {
            tile_columns(in + (i * Cin + c) * g.H * g.W, g, cols.data());
            input_transform(cols.data(), g, V + c * L + i * g.tiles(), plane);
        }
}

// One conv pass of all images: out_n = (Cin → Cout) convolution of in_n by the transformed
// filters `U` (one packed A [Cout, Cin] per ξ), plus b (or nothing when b is null).
void winograd_pass(const float* in, int64_t Cin, const std::vector<std::unique_ptr<PackedA>>& U, const float* b,
                   float* out, int64_t Cout, const Conv2dParams& p, float* ws, int64_t chunk) {
    const TileGrid g = tile_grid(p);
    const int64_t HW = p.H * p.W, per_image = winograd_elems_per_image(p);
    auto group = [&](int64_t n, int64_t k, int64_t at) {
        const Operands op = operands(ws + at * per_image, Cin, Cout, k * g.tiles());
        transform_inputs(in + n * Cin * HW, Cin, k, g, op.in, op.L, op.in_plane);
        for (int64_t xi = 0; xi < kXi; xi++)  // M[ξ] = U[ξ] · V[ξ]
            gemm(*U[size_t(xi)], false, op.L, 1.0f, op.in + xi * op.in_plane, op.L, 0.0f, op.out + xi * op.out_plane,
                 op.L);
        std::vector<float> q(size_t(4 * g.tiles()));
        for (int64_t i = 0; i < k; i++)
            for (int64_t o = 0; o < Cout; o++)
                output_transform(op.out + o * op.L + i * g.tiles(), op.out_plane, g, b ? b[o] : 0.0f, q.data(),
                                 out + ((n + i) * Cout + o) * HW);
    };
    const int64_t k_max = std::min(group_images(p), chunk);
    for (int64_t n0 = 0; n0 < p.N; n0 += chunk)
        for_images(n0, std::min(chunk, p.N - n0), k_max, chunk / k_max, flops_per_image(p), group);
}

}  // namespace

bool winograd_computes(const Conv2dParams& p) {
    return p.KH == 3 && p.KW == 3 && p.stride == 1 && p.padding == 1 && p.dilation == 1 && p.groups == 1;
}

bool winograd_applies(const Conv2dParams& p) {
    return winograd_computes(p) && p.C >= kWinogradMinChannels && p.O >= kWinogradMinChannels &&
           p.H >= kWinogradMinPlane && p.W >= kWinogradMinPlane && p.C * p.O * p.H * p.W >= kWinogradMinWork;
}

WinogradChoice parse_winograd_choice(const char* value, const char* what) {
    if (!*value || std::strcmp(value, "auto") == 0) return WinogradChoice::Auto;
    if (std::strcmp(value, "im2col") == 0) return WinogradChoice::Never;
    KILN_CHECK(std::strcmp(value, "winograd") == 0, what, "=", value,
               ": expected auto (Winograd where it is faster), im2col or winograd (wherever it can)");
    return WinogradChoice::Always;
}

namespace {
std::atomic<WinogradChoice>& choice() {
    static std::atomic<WinogradChoice> value{[] {
        const char* env = std::getenv("KILN_CONV");
        return env ? parse_winograd_choice(env, "KILN_CONV") : WinogradChoice::Auto;
    }()};
    return value;
}
}  // namespace

void set_winograd_choice(WinogradChoice c) { choice() = c; }

bool winograd_chosen(const Conv2dParams& p) {
    switch (choice().load()) {
        case WinogradChoice::Never: return false;
        case WinogradChoice::Always: return winograd_computes(p);
        default: return winograd_applies(p);
    }
}

int64_t winograd_elems_per_image(const Conv2dParams& p) {
    return kXi * (tile_grid(p).tiles() * (p.C + p.O) + 2 * kSkew);  // a group's skew fits in its first image's share
}

int64_t winograd_chunk_images(const Conv2dParams& p, int64_t fit) {
    if (fit >= p.N) return p.N;
    const int64_t g = group_images(p);
    return std::max(g, fit / g * g);
}

void winograd_forward(const float* x, const float* w, const float* b, float* y, const Conv2dParams& p, float* ws,
                      int64_t ws_images) {
    const int64_t chunk = chunk_images(p, ws, ws_images, "winograd_forward");
    const std::vector<float> U = weight_transform(w, p.O, p.C);
    std::vector<std::unique_ptr<PackedA>> packed;  // A = U[ξ] [O, C]
    for (int64_t xi = 0; xi < kXi; xi++)
        packed.push_back(std::make_unique<PackedA>(false, p.O, p.C, U.data() + xi * p.O * p.C, p.C));
    winograd_pass(x, p.C, packed, b, y, p.O, p, ws, chunk);
}

void winograd_backward_data(const float* dy, const float* w, float* dx, const Conv2dParams& p, float* ws,
                            int64_t ws_images) {
    const int64_t chunk = chunk_images(p, ws, ws_images, "winograd_backward_data");
    const std::vector<float> U = weight_transform(w, p.O, p.C);
    // The flipped, transposed filter's U'[4i + j] = U[4·s(i) + s(j)]ᵀ (the header): A = U'[ξ] [C, O]
    const int s[4] = {3, 1, 2, 0};
    std::vector<std::unique_ptr<PackedA>> packed;
    for (int64_t xi = 0; xi < kXi; xi++) {
        const int64_t from = 4 * s[xi / 4] + s[xi % 4];
        packed.push_back(std::make_unique<PackedA>(true, p.C, p.O, U.data() + from * p.O * p.C, p.C));
    }
    winograd_pass(dy, p.O, packed, nullptr, dx, p.C, p, ws, chunk);
}

void winograd_backward_weight(const float* x, const float* dy, float* dw, const Conv2dParams& p, float* ws,
                              int64_t ws_images) {
    const int64_t chunk = chunk_images(p, ws, ws_images, "winograd_backward_weight");
    const TileGrid g = tile_grid(p);
    const int64_t HW = p.H * p.W, per_image = winograd_elems_per_image(p), OC = p.O * p.C;
    const int64_t k_max = std::min(group_images(p), chunk);
    // Σ over the batch, in f32: dU [16][O][C] = dM · Vᵀ, or transposed, dUᵀ [16][C][O] = V · dMᵀ, so
    // that the GEMM's N, the width of its register tile (64 floats with AVX-512), is a full 64
    // whenever one of C and O is: with N = C = 24 or 32 the tiles ran half empty.
    const bool transposed = p.C < kWideTile && p.O > p.C;
    std::vector<float> dU(size_t(kXi * OC), 0.0f);
    // A group's operands: x's tiles V [16][C][L] and dy's dM [16][O][L]
    auto group_operands = [&](int64_t slot, int64_t k) {
        return operands(ws + slot * per_image, p.C, p.O, k * g.tiles());
    };
    for (int64_t n0 = 0; n0 < p.N; n0 += chunk) {
        const int64_t count = std::min(chunk, p.N - n0), groups = (count + k_max - 1) / k_max;
        // Group j's tiles at image j·k_max of the workspace: all of them are kept for the GEMMs below
        parallel_chunks(groups, [&](int64_t j) {
            const int64_t slot = j * k_max, n = n0 + slot, k = std::min(k_max, count - slot);
            const Operands op = group_operands(slot, k);
            transform_inputs(x + n * p.C * HW, p.C, k, g, op.in, op.L, op.in_plane);
            std::vector<float> q(size_t(4 * g.tiles()));
            for (int64_t i = 0; i < k; i++)
                for (int64_t o = 0; o < p.O; o++)
                    grad_output_transform(dy + ((n + i) * p.O + o) * HW, g, q.data(), op.out + o * op.L + i * g.tiles(),
                                          op.out_plane);
        }, double(count) * flops_per_image(p) >= kParallelMinFlops);
        // dU[ξ] += dM[ξ] · V[ξ]ᵀ (or its transpose), group after group (one task per ξ)
        parallel_chunks(kXi, [&](int64_t xi) {
            for (int64_t slot = 0; slot < count; slot += k_max) {
                const Operands op = group_operands(slot, std::min(k_max, count - slot));
                const float* V = op.in + xi * op.in_plane;
                const float* dM = op.out + xi * op.out_plane;
                float* target = dU.data() + xi * OC;
                if (transposed) gemm(false, true, p.C, p.O, op.L, 1.0f, V, op.L, dM, op.L, 1.0f, target, p.O);
                else gemm(false, true, p.O, p.C, op.L, 1.0f, dM, op.L, V, op.L, 1.0f, target, p.C);
            }
        }, double(count) * flops_per_image(p) >= kParallelMinFlops);
    }
    weight_grad_transform(dU.data(), p.O, p.C, transposed ? 1 : p.C, transposed ? p.O : 1, dw);
}

}  // namespace kiln::cpu
