// winograd.cpp — 3×3 convolution with fewer multiplications: Winograd's minimal filtering
// F(m×m, 3×3), m = 4 (and 2, the smaller tiles, for comparison), as Lavin and Gray use it for
// CNNs ("Fast Algorithms for Convolutional Neural Networks", 2015).
//
// ---- The idea, in one dimension: F(2, 3) ---------------------------------------------------------
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
// (G g evaluates the filter's polynomial g0 + g1·t + g2·t² at t = 0, 1, −1 and ∞, Bᵀ d the
// input's; their products are the output polynomial's values, and Aᵀ interpolates it back.)
// Nested, for a 2×2 tile of outputs from a 4×4 tile d of the input: Y = Aᵀ [U ⊙ V] A with
//   U = G g Gᵀ (the filter, 4×4)      V = Bᵀ d B (the input tile, 4×4)
// 16 multiplications where the direct formula takes 36: 2.25× fewer.
//
// ---- Bigger tiles: F(4, 3) -----------------------------------------------------------------------
// Four outputs from six inputs, with the points 0, 1, −1, 2, −2 and ∞: 6 multiplications for 12,
//   Bᵀ = | 4  0 −5  0  1  0 |    G = |  1/4    0     0   |    Aᵀ = | 1  1  1  1  1  0 |
//        | 0 −4 −4  1  1  0 |        | −1/6  −1/6  −1/6  |         | 0  1 −1  2 −2  0 |
//        | 0  4 −4 −1  1  0 |        | −1/6   1/6  −1/6  |         | 0  1  1  4  4  0 |
//        | 0 −2 −1  2  1  0 |        | 1/24  1/12   1/6  |         | 0  1 −1  8 −8  1 |
//        | 0  2 −1 −2  1  0 |        | 1/24 −1/12   1/6  |
//        | 0  4  0 −5  0  1 |        |   0     0     1   |
// and nested, a 4×4 tile of outputs from a 6×6 tile of the input with 36 multiplications for
// 144: 4× fewer. The price: each tile's transforms do more additions (per output about as many),
// and they round more — the matrices multiply by up to 8 and divide by 24, so F(4×4)'s results
// are about 10 times further from the direct convolution's than F(2×2)'s (still 1e-5 of the
// largest output at 256 channels: tests/test_conv.cpp). Bigger tiles still, F(6×6, 3×3) as
// NNPACK uses, need points such as ±½ and ±3 and lose more digits; oneDNN's f32 Winograd, like
// kiln's, takes F(4×4, 3×3). kiln takes it for every layer it runs by Winograd;
// KILN_CONV=winograd2x2 takes F(2×2, 3×3), to compare.
//
// ---- Many channels: n² matrix products -----------------------------------------------------------
// With tiles of n = m + 2 inputs a side, a layer sums over its C input channels, and the sum can
// move inside the transform:
//   Y[o, tile] = Aᵀ [ Σ_c U[o, c] ⊙ V[c, tile] ] A
// For each of the n² positions ξ = n·i + j of the tiles, Σ_c U[ξ][o, c] · V[ξ][c, tile] is a
// matrix product, so the layer becomes
//   V[ξ] [C, tiles] = input transform of every tile      (Bᵀ d B: additions, and ×4, ×5 with m = 4)
//   M[ξ] [O, tiles] = U[ξ] [O, C] · V[ξ] [C, tiles]      n² GEMMs (gemm.h), K = C
//   y tile          = Aᵀ M[·][o, tile] A                  (output transform)
// The GEMMs do n²·O·C multiply-adds per tile of m² outputs, im2col's one does 9·O·C per output:
// 36/16 = 2.25× fewer (m = 2), 144/36 = 4× (m = 4). The tiles cover ⌈H/m⌉·⌈W/m⌉·m² positions,
// more than H·W when m does not divide H or W (a 7×7 plane takes 2×2 tiles of 4×4, 64 positions
// for 49: the gain falls to 3.1×), and the transforms read and write every tile, so tiny planes
// and few channels gain little (winograd.h's bounds).
//
// ---- The backward pass -------------------------------------------------------------------------
//   dx  a 3×3 convolution of dy with padding 1 and the filter flipped and transposed
//       (w'[c, o] = w[o, c] turned 180°): the same pass, with U' the transform of w'.
//   dw  the gradient of the computation above: with dM = A dY Aᵀ (n×n per tile, dY the m×m
//       tile of dy, zero past the plane's edge),
//         dU[ξ] [O, C] = Σ_tiles dM[ξ] [O, tiles] · V[ξ] [C, tiles]ᵀ    n² GEMMs, K = tiles
//       (computed as its transpose when C is narrow: winograd_backward_weight)
//         dw[o, c] += Gᵀ dU[o, c] G
// In exact arithmetic both equal the direct formulas; in f32 the transforms add a few roundings.
//
// ---- Memory ------------------------------------------------------------------------------------
// One image's V and M: n²·⌈H/m⌉⌈W/m⌉·(C + O) floats (plus a cache line a plane, "Operands"
// below), ≈ (n/m)²·H·W·(C + O): 2.25·H·W·(C + O) with m = 4, less than im2col's
// 9·H·W·C + H·W·O unless O > 5.4·C (with m = 2, 4·H·W·(C + O): unless O > 5·C/3). U is n²·O·C
// floats, 4× the weights with m = 4 (16/9 with m = 2), packed for the GEMMs, on the heap for
// the call.
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
#include <array>
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

constexpr int64_t kWideTile = 64;  // columns of the GEMM's widest register tile (AVX-512's 6×64)

// F(m×m, 3×3) on one plane: tiles of n = m + 2 inputs a side, each giving m×m outputs, TH rows
// of TW tiles; n² transformed values a tile, ξ = n·i + j (row i, column j).
struct TileGrid {
    int64_t H, W, m, TH, TW;
    int64_t n() const { return m + 2; }
    int64_t values() const { return n() * n(); }
    int64_t tiles() const { return TH * TW; }
};
TileGrid tile_grid(const Conv2dParams& p) {
    const int64_t m = winograd_tile();
    return {p.H, p.W, m, (p.H + m - 1) / m, (p.W + m - 1) / m};
}

// ---- The 1-D transforms ------------------------------------------------------------------------
// Each 2-D transform applies one of them down the columns, then along the rows. Scalars in and
// out (no arrays, no structs), so that g++ vectorizes the loops over tiles around them.
//   F(2, 3): Bᵀ d (4 → 4), Aᵀ m (4 → 2), A y (2 → 4), G g (3 → 4), Gᵀ u (4 → 3)
inline void bt(float d0, float d1, float d2, float d3, float& v0, float& v1, float& v2, float& v3) {
    v0 = d0 - d2;
    v1 = d1 + d2;
    v2 = d2 - d1;
    v3 = d1 - d3;
}
inline void at(float m0, float m1, float m2, float m3, float& y0, float& y1) {
    y0 = m0 + m1 + m2;
    y1 = m1 - m2 - m3;
}
inline void a(float y0, float y1, float& v0, float& v1, float& v2, float& v3) {
    v0 = y0;
    v1 = y0 + y1;
    v2 = y0 - y1;
    v3 = -y1;
}
inline void g(float g0, float g1, float g2, float& u0, float& u1, float& u2, float& u3) {
    u0 = g0;
    u1 = 0.5f * (g0 + g1 + g2);
    u2 = 0.5f * (g0 - g1 + g2);
    u3 = g2;
}
inline void gt(float u0, float u1, float u2, float u3, float& g0, float& g1, float& g2) {
    g0 = u0 + 0.5f * (u1 + u2);
    g1 = 0.5f * (u1 - u2);
    g2 = 0.5f * (u1 + u2) + u3;
}
//   F(4, 3): the same five on 6 values (the header's matrices), with their shared sums
inline void bt(float d0, float d1, float d2, float d3, float d4, float d5, float& v0, float& v1, float& v2, float& v3,
               float& v4, float& v5) {
    v0 = 4.0f * d0 - 5.0f * d2 + d4;
    v1 = (d3 + d4) - 4.0f * (d1 + d2);
    v2 = (d4 - d3) + 4.0f * (d1 - d2);
    v3 = (d4 - d2) - 2.0f * (d1 - d3);
    v4 = (d4 - d2) + 2.0f * (d1 - d3);
    v5 = 4.0f * d1 - 5.0f * d3 + d5;
}
inline void at(float m0, float m1, float m2, float m3, float m4, float m5, float& y0, float& y1, float& y2, float& y3) {
    const float s12 = m1 + m2, d12 = m1 - m2, s34 = m3 + m4, d34 = m3 - m4;
    y0 = m0 + s12 + s34;
    y1 = d12 + 2.0f * d34;
    y2 = s12 + 4.0f * s34;
    y3 = d12 + 8.0f * d34 + m5;
}
inline void a(float y0, float y1, float y2, float y3, float& v0, float& v1, float& v2, float& v3, float& v4,
              float& v5) {
    const float e = y0 + y2, o = y1 + y3, e4 = y0 + 4.0f * y2, o4 = 2.0f * y1 + 8.0f * y3;
    v0 = y0;
    v1 = e + o;
    v2 = e - o;
    v3 = e4 + o4;
    v4 = e4 - o4;
    v5 = y3;
}
inline void g(float g0, float g1, float g2, float& u0, float& u1, float& u2, float& u3, float& u4, float& u5) {
    const float s = g0 + g2, s4 = g0 + 4.0f * g2;
    u0 = g0 / 4.0f;
    u1 = -(s + g1) / 6.0f;
    u2 = -(s - g1) / 6.0f;
    u3 = (s4 + 2.0f * g1) / 24.0f;
    u4 = (s4 - 2.0f * g1) / 24.0f;
    u5 = g2;
}
inline void gt(float u0, float u1, float u2, float u3, float u4, float u5, float& g0, float& g1, float& g2) {
    const float s12 = u1 + u2, s34 = u3 + u4;
    g0 = u0 / 4.0f - s12 / 6.0f + s34 / 24.0f;
    g1 = (u2 - u1) / 6.0f + (u3 - u4) / 12.0f;
    g2 = (s34 - s12) / 6.0f + u5;
}

// G applied to the n values u of G's column from three (m = 2 or 4), and Gᵀ back: the two
// sizes behind one call, for the weight transforms below (run once per layer call).
void g_column(int64_t m, float g0, float g1, float g2, float* u) {
    if (m == 2) g(g0, g1, g2, u[0], u[1], u[2], u[3]);
    else g(g0, g1, g2, u[0], u[1], u[2], u[3], u[4], u[5]);
}
void gt_column(int64_t m, const float* u, float& g0, float& g1, float& g2) {
    if (m == 2) gt(u[0], u[1], u[2], u[3], g0, g1, g2);
    else gt(u[0], u[1], u[2], u[3], u[4], u[5], g0, g1, g2);
}

// U[ξ·OC + o·C + c] = (G g Gᵀ)[ξ] for each filter g = w[o, c] (3×3), F(m×m, 3×3).
std::vector<float> weight_transform(const float* w, int64_t O, int64_t C, int64_t m) {
    const int64_t OC = O * C, n = m + 2;
    std::vector<float> U(size_t(n * n * OC));
    parallel_for(OC, grain_of(4096, n * n), [&](int64_t begin, int64_t end) {
        for (int64_t oc = begin; oc < end; oc++) {
            const float* f = w + oc * 9;
            float t[3][6], row[6];  // t[b][i] = (G f)[i][b]: column b of f, transformed
            for (int b = 0; b < 3; b++) g_column(m, f[b], f[3 + b], f[6 + b], t[b]);
            for (int64_t i = 0; i < n; i++) {  // (G f) Gᵀ, row i
                g_column(m, t[0][i], t[1][i], t[2][i], row);
                for (int64_t j = 0; j < n; j++) U[size_t((n * i + j) * OC + oc)] = row[j];
            }
        }
    });
    return U;
}

// dw[o, c] += Gᵀ dU[·][o, c] G for every filter, dU[ξ][o, c] at dU[ξ·OC + o·so + c·sc] (laid out
// as U, so = C and sc = 1, or transposed, so = 1 and sc = O).
void weight_grad_transform(const float* dU, int64_t O, int64_t C, int64_t so, int64_t sc, int64_t m, float* dw) {
    const int64_t OC = O * C, n = m + 2;
    parallel_for(OC, grain_of(4096, n * n), [&](int64_t begin, int64_t end) {
        for (int64_t oc = begin; oc < end; oc++) {
            const int64_t at = oc / C * so + oc % C * sc;  // (o, c) in dU
            float r[3][6], u[6];  // r = Gᵀ dU (3 × n), column by column
            for (int64_t j = 0; j < n; j++) {
                for (int64_t i = 0; i < n; i++) u[i] = dU[(n * i + j) * OC + at];
                gt_column(m, u, r[0][j], r[1][j], r[2][j]);
            }
            float* f = dw + oc * 9;
            for (int a = 0; a < 3; a++) {  // (Gᵀ dU) G, row a
                float g0, g1, g2;
                gt_column(m, r[a], g0, g1, g2);
                f[a * 3 + 0] += g0;
                f[a * 3 + 1] += g1;
                f[a * 3 + 2] += g2;
            }
        }
    });
}

// w' [C][O][3][3]: w'[c, o] = w[o, c] turned 180°, the filter of dx = conv_transpose(dy, w)
// written as a convolution of dy.
std::vector<float> flipped_transposed(const float* w, int64_t O, int64_t C) {
    std::vector<float> f(size_t(O * C * 9));
    for (int64_t o = 0; o < O; o++)
        for (int64_t c = 0; c < C; c++)
            for (int k = 0; k < 9; k++) f[size_t((c * O + o) * 9 + 8 - k)] = w[(o * C + c) * 9 + k];
    return f;
}

// ---- The transforms: one loop over the tiles of a few planes ----------------------------------
// A tile's n² values are independent of its neighbours', so each transform is one loop over
// tiles, which g++ vectorizes (#pragma omp simd): what tile u reads or writes is first laid out
// in arrays where it is element u, and moved into the planes from such arrays afterwards. One
// plane has T = TH·TW tiles, 16 on a 7×7 plane with 2×2 tiles and 4 with 4×4 ones: too few to
// fill a 16-lane vector, whose scalar remainder then does the work (a loop along one row of
// tiles, TW iterations, was worse still). So the loops run over the tiles of a run of images,
// tile u = img·T + t, at least kRunTiles of them. Each transform is written once for each m
// (templates on M), its loops over a tile's rows and columns unrolled (#pragma GCC unroll), so
// that every index is a constant.

// blocks[b][j] = row[M·j + b] for j < count, zero past the row's W values. Where all M are
// inside the row, their loads side by side, which g++ vectorizes.
template <int64_t M>
void deinterleave(const float* row, int64_t W, int64_t count, float* const* blocks) {
    const int64_t full = std::min(count, W / M);
#pragma omp simd
    for (int64_t j = 0; j < full; j++)
        for (int64_t b = 0; b < M; b++) blocks[b][j] = row[M * j + b];
    for (int64_t j = full; j < count; j++)
        for (int64_t b = 0; b < M; b++) blocks[b][j] = M * j + b < W ? row[M * j + b] : 0.0f;
}

// row[M·j + b] = blocks[b][j]: the W values of a row.
template <int64_t M>
void interleave(const float* const* blocks, int64_t W, float* row) {
    const int64_t full = W / M;
    for (int64_t j = 0; j < full; j++)
        for (int64_t b = 0; b < M; b++) row[M * j + b] = blocks[b][j];
    for (int64_t b = 0; b < W % M; b++) row[M * full + b] = blocks[b][full];
}

// The input side stacks the run's planes (one channel of each image) into one tall plane, each
// M·TH rows high, its rows past H zero: when M does not divide H at least one such row lies
// between two images, the zero padding of both, so the tall plane's tiles are the images' tiles
// one after the other. (When M divides H, the images go one at a time: runs of one.)
bool stackable(const TileGrid& g) { return g.H % g.m != 0; }

// cols [M][n][R + 1][TW] for the R = run·TH rows of tiles of the tall plane of `run` images
// (image img's plane at x + img·stride): cols[r % M][k][r / M][tx] = the padded tall plane's row
// r, column M·tx + k, that is tall row r − 1 and x's column M·tx + k − 1 (zero past x's edges:
// padding 1), for padded rows r = 0 .. M·R + 1. Tile u's n×n window (padded rows M·uy ..
// M·uy + M + 1, columns M·tx .. M·tx + M + 1, u = uy·TW + tx) is then
//   d[i][k] = cols[i % M][k][u + (i / M)·TW]
int64_t tile_columns_elems(const TileGrid& g, int64_t run) { return g.m * g.n() * (run * g.TH + 1) * g.TW; }
template <int64_t M>
void tile_columns(const float* x, int64_t stride, int64_t run, const TileGrid& g, float* cols) {
    constexpr int64_t n = M + 2;
    const int64_t S = (run * g.TH + 1) * g.TW;  // one [R + 1][TW] array
    const int64_t inside = (g.W - 1) / M;       // tiles 1 .. inside − 1 have all n columns in x
    for (int64_t r = 0; r < M * run * g.TH + 2; r++) {
        float* c = cols + (r % M) * n * S + (r / M) * g.TW;  // column k of the windows: c + k·S
        const int64_t tall = r - 1, img = tall / (M * g.TH), h = tall % (M * g.TH);  // image img's row h
        if (tall < 0 || img >= run || h >= g.H) {
            for (int64_t k = 0; k < n; k++) std::fill(c + k * S, c + k * S + g.TW, 0.0f);
            continue;
        }
        const float* row = x + img * stride + h * g.W;
        for_blocks(1, inside, [&](int64_t t0, int64_t count) {
            for (int64_t k = 0; k < n; k++)
#pragma omp simd
                for (int64_t tx = t0; tx < t0 + count; tx++) c[k * S + tx] = row[M * tx + k - 1];
        });
        auto edge = [&](int64_t tx) {  // a tile with columns past x's edges
            for (int64_t k = 0; k < n; k++) {
                const int64_t w = M * tx + k - 1;
                c[k * S + tx] = w >= 0 && w < g.W ? row[w] : 0.0f;
            }
        };
        edge(0);
        for (int64_t tx = std::max<int64_t>(inside, 1); tx < g.TW; tx++) edge(tx);
    }
}

// v[ξ·vs + u] = (Bᵀ d_u B)[ξ] for every tile u of the tall plane of `run` images, from its
// tile_columns.
template <int64_t M>
void input_transform(const float* cols, const TileGrid& g, int64_t run, float* v, int64_t vs);

template <>
void input_transform<2>(const float* cols, const TileGrid& g, int64_t run, float* v, int64_t vs) {
    const int64_t S = (run * g.TH + 1) * g.TW, TW = g.TW, tiles = run * g.tiles();
    const float *e0 = cols, *e1 = e0 + S, *e2 = e1 + S, *e3 = e2 + S;  // rows 2·ty (+ TW: 2·ty + 2), k = 0..3
    const float *o0 = e3 + S, *o1 = o0 + S, *o2 = o1 + S, *o3 = o2 + S;  // rows 2·ty + 1 (+ TW: 2·ty + 3)
#pragma omp simd
    for (int64_t t = 0; t < tiles; t++) {
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

template <>
void input_transform<4>(const float* cols, const TileGrid& g, int64_t run, float* v, int64_t vs) {
    const int64_t S = (run * g.TH + 1) * g.TW, TW = g.TW, tiles = run * g.tiles();
    // row i of the windows, column k: cols[i % 4][k] + (i / 4)·TW
    const float* d[6][6];
    for (int i = 0; i < 6; i++)
        for (int k = 0; k < 6; k++) d[i][k] = cols + ((i % 4) * 6 + k) * S + (i / 4) * TW;
#pragma omp simd
    for (int64_t t = 0; t < tiles; t++) {
        // Bᵀ d: the six rows combined, in each column j (c[i][j]: row i, column j)
        float c[6][6];
#pragma GCC unroll 6
        for (int j = 0; j < 6; j++)
            bt(d[0][j][t], d[1][j][t], d[2][j][t], d[3][j][t], d[4][j][t], d[5][j][t], c[0][j], c[1][j], c[2][j],
               c[3][j], c[4][j], c[5][j]);
        // (Bᵀ d) B: the six columns combined, in each row i: v[6i .. 6i + 5]
        float* out = v + t;
#pragma GCC unroll 6
        for (int i = 0; i < 6; i++)
            bt(c[i][0], c[i][1], c[i][2], c[i][3], c[i][4], c[i][5], out[(6 * i) * vs], out[(6 * i + 1) * vs],
               out[(6 * i + 2) * vs], out[(6 * i + 3) * vs], out[(6 * i + 4) * vs], out[(6 * i + 5) * vs]);
    }
}

// Tiles' M×M blocks of outputs (or of dy), position by position: q[(M·a + b)·L + u] holds (a, b)
// of tile u. Row h of image img's plane is, at its columns M·j + b, the TW values at[b]:
template <int64_t M>
std::array<float*, M> block_row(float* q, int64_t L, const TileGrid& g, int64_t img, int64_t h) {
    std::array<float*, M> at;
    for (int64_t b = 0; b < M; b++)
        at[size_t(b)] = q + (M * (h % M) + b) * L + img * g.tiles() + h / M * g.TW;
    return at;
}

// The planes y + img·stride of k images from their tiles' blocks q.
template <int64_t M>
void scatter_blocks(float* q, int64_t k, const TileGrid& g, float* y, int64_t stride) {
    for (int64_t img = 0; img < k; img++)
        for (int64_t h = 0; h < g.H; h++)
            interleave<M>(block_row<M>(q, k * g.tiles(), g, img, h).data(), g.W, y + img * stride + h * g.W);
}

// q = the blocks of the planes dy + img·stride of k images, zero past their edges.
template <int64_t M>
void gather_blocks(const float* dy, int64_t stride, int64_t k, const TileGrid& g, float* q) {
    for (int64_t img = 0; img < k; img++)
        for (int64_t h = 0; h < M * g.TH; h++) {
            const std::array<float*, M> at = block_row<M>(q, k * g.tiles(), g, img, h);
            if (h < g.H) {
                deinterleave<M>(dy + img * stride + h * g.W, g.W, g.TW, at.data());
            } else {  // a row past the plane's edge
                for (float* b : at) std::fill(b, b + g.TW, 0.0f);
            }
        }
}

// q[(M·a + b)·L + u] = bias + (Aᵀ m_u A)[a][b] for every tile u < L, from its n² values
// m_u[ξ] = m[ξ·ms + u]: the blocks scatter_blocks writes into the planes.
template <int64_t M>
void output_transform(const float* m, int64_t ms, int64_t L, float bias, float* q);

template <>
void output_transform<2>(const float* m, int64_t ms, int64_t L, float bias, float* q) {
    float *q00 = q, *q01 = q00 + L, *q10 = q01 + L, *q11 = q10 + L;
#pragma omp simd
    for (int64_t u = 0; u < L; u++) {
        float a00, a01, a02, a03, a10, a11, a12, a13;  // Aᵀ m: the four rows combined, in each column
        at(m[0 * ms + u], m[4 * ms + u], m[8 * ms + u], m[12 * ms + u], a00, a10);
        at(m[1 * ms + u], m[5 * ms + u], m[9 * ms + u], m[13 * ms + u], a01, a11);
        at(m[2 * ms + u], m[6 * ms + u], m[10 * ms + u], m[14 * ms + u], a02, a12);
        at(m[3 * ms + u], m[7 * ms + u], m[11 * ms + u], m[15 * ms + u], a03, a13);
        float y00, y01, y10, y11;  // (Aᵀ m) A
        at(a00, a01, a02, a03, y00, y01);
        at(a10, a11, a12, a13, y10, y11);
        q00[u] = bias + y00;
        q01[u] = bias + y01;
        q10[u] = bias + y10;
        q11[u] = bias + y11;
    }
}

// out[i·stride] = bias + y_i, i = 0 .. 3
inline void biased(float bias, float y0, float y1, float y2, float y3, float* out, int64_t stride) {
    out[0 * stride] = bias + y0;
    out[1 * stride] = bias + y1;
    out[2 * stride] = bias + y2;
    out[3 * stride] = bias + y3;
}

template <>
void output_transform<4>(const float* m, int64_t ms, int64_t L, float bias, float* q) {
#pragma omp simd
    for (int64_t u = 0; u < L; u++) {
        // Aᵀ m: the six rows combined, in each column j (a[i][j]: row i, column j)
        float a[4][6];
#pragma GCC unroll 6
        for (int j = 0; j < 6; j++)
            at(m[j * ms + u], m[(6 + j) * ms + u], m[(12 + j) * ms + u], m[(18 + j) * ms + u], m[(24 + j) * ms + u],
               m[(30 + j) * ms + u], a[0][j], a[1][j], a[2][j], a[3][j]);
        // (Aᵀ m) A: the six columns combined, in each row i, plus the bias: q[4i .. 4i + 3]
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            float y0, y1, y2, y3;
            at(a[i][0], a[i][1], a[i][2], a[i][3], a[i][4], a[i][5], y0, y1, y2, y3);
            biased(bias, y0, y1, y2, y3, q + 4 * i * L + u, L);
        }
    }
}

// dm[ξ·ms + u] = (A dY_u Aᵀ)[ξ] for every tile u < L, dY_u tile u's M×M block of dy, gathered
// (gather_blocks) in q: the gradient of output_transform.
template <int64_t M>
void grad_output_transform(const float* q, int64_t L, float* dm, int64_t ms);

template <>
void grad_output_transform<2>(const float* q, int64_t L, float* dm, int64_t ms) {
    const float *q00 = q, *q01 = q00 + L, *q10 = q01 + L, *q11 = q10 + L;
#pragma omp simd
    for (int64_t u = 0; u < L; u++) {
        float c00, c10, c20, c30, c01, c11, c21, c31;  // A dY (c_ij: row i, column j)
        a(q00[u], q10[u], c00, c10, c20, c30);
        a(q01[u], q11[u], c01, c11, c21, c31);
        float* out = dm + u;  // (A dY) Aᵀ, row by row: dm[4i .. 4i + 3]
        a(c00, c01, out[0 * ms], out[1 * ms], out[2 * ms], out[3 * ms]);
        a(c10, c11, out[4 * ms], out[5 * ms], out[6 * ms], out[7 * ms]);
        a(c20, c21, out[8 * ms], out[9 * ms], out[10 * ms], out[11 * ms]);
        a(c30, c31, out[12 * ms], out[13 * ms], out[14 * ms], out[15 * ms]);
    }
}

template <>
void grad_output_transform<4>(const float* q, int64_t L, float* dm, int64_t ms) {
#pragma omp simd
    for (int64_t u = 0; u < L; u++) {
        // A dY: the four rows combined, in each column b (c[i][b]: row i, column b); dY[a][b] = q[(4a + b)·L + u]
        float c[6][4];
#pragma GCC unroll 4
        for (int b = 0; b < 4; b++)
            a(q[b * L + u], q[(4 + b) * L + u], q[(8 + b) * L + u], q[(12 + b) * L + u], c[0][b], c[1][b], c[2][b],
              c[3][b], c[4][b], c[5][b]);
        float* out = dm + u;  // (A dY) Aᵀ, row by row: dm[6i .. 6i + 5]
#pragma GCC unroll 6
        for (int i = 0; i < 6; i++)
            a(c[i][0], c[i][1], c[i][2], c[i][3], out[(6 * i) * ms], out[(6 * i + 1) * ms], out[(6 * i + 2) * ms],
              out[(6 * i + 3) * ms], out[(6 * i + 4) * ms], out[(6 * i + 5) * ms]);
    }
}

// A group's GEMM operands in the workspace, for k images of T tiles (L = k·T columns):
//   in   [n²][Cin][L]    the input tiles V (of x, or of dy for dx)
//   out  [n²][Cout][L]   the output tiles M (or, for dw, dy's tiles dM)
// Each ξ-plane is kSkew floats longer than its rows: planes a multiple of 4 KiB apart share one
// set of the L1 cache, and the transforms read or write all n² of them at once (with planes of
// C·L floats that took 3 times the GEMMs' time; one cache line of skew puts each in its own set).
constexpr int64_t kSkew = 16;
struct Operands {
    float *in, *out;
    int64_t L, in_plane, out_plane;  // columns, and the floats from one ξ-plane to the next
};
Operands operands(float* ws, const TileGrid& g, int64_t Cin, int64_t Cout, int64_t k) {
    const int64_t L = k * g.tiles(), in_plane = Cin * L + kSkew, out_plane = Cout * L + kSkew;
    return {ws, ws + g.values() * in_plane, L, in_plane, out_plane};
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

// A group's three transforms, for the k images at `in` (planes of channel c at in + c·HW, image
// after image Cin·HW apart) and their tiles in op (L = k·T columns, rows of channel c at c·L):
//   transform_inputs        V [n²][Cin][L] = input transforms of in's planes
//   transform_outputs       out's planes = output transforms of M [n²][Cout][L], + b (b may be null)
//   transform_grad_outputs  dM [n²][Cout][L] = A dY Aᵀ of dy's planes (for dw)
// Each takes the images a run at a time (its loops over run·T tiles): runs of at least kRunTiles
// tiles (4 vectors of 16), or, for the inputs of planes that cannot be stacked, of one image.
constexpr int64_t kRunTiles = 64;
int64_t run_images(int64_t k, const TileGrid& g) { return std::min(k, (kRunTiles + g.tiles() - 1) / g.tiles()); }
template <typename Body>
void for_runs(int64_t k, int64_t run, Body body) {  // body(first image, images)
    for (int64_t i = 0; i < k; i += run) body(i, std::min(run, k - i));
}
template <int64_t M>
void transform_inputs(const float* in, int64_t Cin, int64_t k, const TileGrid& g, const Operands& op) {
    const int64_t HW = g.H * g.W, T = g.tiles(), run = stackable(g) ? run_images(k, g) : 1;
    std::vector<float> cols(size_t(tile_columns_elems(g, run)));
    for_runs(k, run, [&](int64_t i, int64_t images) {
        for (int64_t c = 0; c < Cin; c++) {
            tile_columns<M>(in + (i * Cin + c) * HW, Cin * HW, images, g, cols.data());
            input_transform<M>(cols.data(), g, images, op.in + c * op.L + i * T, op.in_plane);
        }
    });
}
template <int64_t M>
void transform_outputs(const Operands& op, int64_t Cout, int64_t k, const TileGrid& g, const float* b, float* out) {
    const int64_t HW = g.H * g.W, T = g.tiles(), run = run_images(k, g);
    std::vector<float> q(size_t(M * M * run * T));
    for_runs(k, run, [&](int64_t i, int64_t images) {
        for (int64_t o = 0; o < Cout; o++) {
            output_transform<M>(op.out + o * op.L + i * T, op.out_plane, images * T, b ? b[o] : 0.0f, q.data());
            scatter_blocks<M>(q.data(), images, g, out + (i * Cout + o) * HW, Cout * HW);
        }
    });
}
template <int64_t M>
void transform_grad_outputs(const float* dy, int64_t Cout, int64_t k, const TileGrid& g, const Operands& op) {
    const int64_t HW = g.H * g.W, T = g.tiles(), run = run_images(k, g);
    std::vector<float> q(size_t(M * M * run * T));
    for_runs(k, run, [&](int64_t i, int64_t images) {
        for (int64_t o = 0; o < Cout; o++) {
            gather_blocks<M>(dy + (i * Cout + o) * HW, Cout * HW, images, g, q.data());
            grad_output_transform<M>(q.data(), images * T, op.out + o * op.L + i * T, op.out_plane);
        }
    });
}

// The three for tiles of m×m outputs, chosen once per pass.
struct GroupTransforms {
    void (*inputs)(const float* in, int64_t Cin, int64_t k, const TileGrid& g, const Operands& op);
    void (*outputs)(const Operands& op, int64_t Cout, int64_t k, const TileGrid& g, const float* b, float* out);
    void (*grad_outputs)(const float* dy, int64_t Cout, int64_t k, const TileGrid& g, const Operands& op);
};
GroupTransforms group_transforms(const TileGrid& g) {
    if (g.m == 4) return {transform_inputs<4>, transform_outputs<4>, transform_grad_outputs<4>};
    return {transform_inputs<2>, transform_outputs<2>, transform_grad_outputs<2>};
}

// One conv pass of all images: out_n = (Cin → Cout) convolution of in_n by the transformed
// filters `U` (one packed A [Cout, Cin] per ξ), plus b (or nothing when b is null).
void winograd_pass(const float* in, int64_t Cin, const std::vector<std::unique_ptr<PackedA>>& U, const float* b,
                   float* out, int64_t Cout, const Conv2dParams& p, float* ws, int64_t chunk) {
    const TileGrid g = tile_grid(p);
    const GroupTransforms transforms = group_transforms(g);
    const int64_t HW = p.H * p.W, per_image = winograd_elems_per_image(p);
    auto group = [&](int64_t n, int64_t k, int64_t at) {
        const Operands op = operands(ws + at * per_image, g, Cin, Cout, k);
        transforms.inputs(in + n * Cin * HW, Cin, k, g, op);
        for (int64_t xi = 0; xi < g.values(); xi++)  // M[ξ] = U[ξ] · V[ξ]
            gemm_packed(*U[size_t(xi)], false, op.L, 1.0f, op.in + xi * op.in_plane, op.L, 0.0f,
                        op.out + xi * op.out_plane, op.L);
        transforms.outputs(op, Cout, k, g, b, out + n * Cout * HW);
    };
    const int64_t k_max = std::min(group_images(p), chunk);
    for (int64_t n0 = 0; n0 < p.N; n0 += chunk)
        for_images(n0, std::min(chunk, p.N - n0), k_max, chunk / k_max, flops_per_image(p), group);
}

// The packed A of each ξ: U[ξ] [rows, cols], from U [n²][rows][cols]; over the threads when
// there is enough to copy (a 64→64 layer's U is 147,456 floats).
std::vector<std::unique_ptr<PackedA>> pack_each(const std::vector<float>& U, int64_t rows, int64_t cols) {
    std::vector<std::unique_ptr<PackedA>> packed(U.size() / size_t(rows * cols));
    parallel_chunks(int64_t(packed.size()), [&](int64_t xi) {
        packed[size_t(xi)] = std::make_unique<PackedA>(false, rows, cols, U.data() + xi * rows * cols, cols);
    }, U.size() >= size_t(1) << 16);
    return packed;
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
    if (std::strcmp(value, "winograd") == 0) return WinogradChoice::Always;
    KILN_CHECK(std::strcmp(value, "winograd2x2") == 0, what, "=", value,
               ": expected auto (Winograd where it is faster), im2col, winograd (wherever it can) or winograd2x2 "
               "(wherever it can, with F(2×2, 3×3)'s smaller tiles)");
    return WinogradChoice::Always2x2;
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
        case WinogradChoice::Auto: return winograd_applies(p);
        default: return winograd_computes(p);
    }
}

int64_t winograd_tile() { return choice().load() == WinogradChoice::Always2x2 ? 2 : 4; }

int64_t winograd_elems_per_image(const Conv2dParams& p) {
    const TileGrid g = tile_grid(p);
    return g.values() * (g.tiles() * (p.C + p.O) + 2 * kSkew);  // a group's skew fits in its first image's share
}

int64_t winograd_chunk_images(const Conv2dParams& p, int64_t fit) {
    if (fit >= p.N) return p.N;
    const int64_t g = group_images(p);
    return std::max(g, fit / g * g);
}

void winograd_forward(const float* x, const float* w, const float* b, float* y, const Conv2dParams& p, float* ws,
                      int64_t ws_images) {
    const int64_t chunk = chunk_images(p, ws, ws_images, "winograd_forward");
    const auto U = pack_each(weight_transform(w, p.O, p.C, winograd_tile()), p.O, p.C);  // A = U[ξ] [O, C]
    winograd_pass(x, p.C, U, b, y, p.O, p, ws, chunk);
}

void winograd_backward_data(const float* dy, const float* w, float* dx, const Conv2dParams& p, float* ws,
                            int64_t ws_images) {
    const int64_t chunk = chunk_images(p, ws, ws_images, "winograd_backward_data");
    // A = U'[ξ] [C, O], the transformed filters of the flipped, transposed w
    const auto U = pack_each(weight_transform(flipped_transposed(w, p.O, p.C).data(), p.C, p.O, winograd_tile()),
                             p.C, p.O);
    winograd_pass(dy, p.O, U, nullptr, dx, p.C, p, ws, chunk);
}

void winograd_backward_weight(const float* x, const float* dy, float* dw, const Conv2dParams& p, float* ws,
                              int64_t ws_images) {
    const int64_t chunk = chunk_images(p, ws, ws_images, "winograd_backward_weight");
    const TileGrid g = tile_grid(p);
    const GroupTransforms transforms = group_transforms(g);
    const int64_t HW = p.H * p.W, per_image = winograd_elems_per_image(p), OC = p.O * p.C, values = g.values();
    const int64_t k_max = std::min(group_images(p), chunk);
    // Σ over the batch, in f32: dU [n²][O][C] = dM · Vᵀ, or transposed, dUᵀ [n²][C][O] = V · dMᵀ, so
    // that the GEMM's N, the width of its register tile (64 floats with AVX-512), is a full 64
    // whenever one of C and O is: with N = C = 24 or 32 the tiles ran half empty.
    const bool transposed = p.C < kWideTile && p.O > p.C;
    std::vector<float> dU(size_t(values * OC), 0.0f);
    // A group's operands: x's tiles V [n²][C][L] and dy's dM [n²][O][L]
    auto group_operands = [&](int64_t slot, int64_t k) { return operands(ws + slot * per_image, g, p.C, p.O, k); };
    for (int64_t n0 = 0; n0 < p.N; n0 += chunk) {
        const int64_t count = std::min(chunk, p.N - n0), groups = (count + k_max - 1) / k_max;
        // Group j's tiles at image j·k_max of the workspace: all of them are kept for the GEMMs below
        parallel_chunks(groups, [&](int64_t j) {
            const int64_t slot = j * k_max, n = n0 + slot, k = std::min(k_max, count - slot);
            const Operands op = group_operands(slot, k);
            transforms.inputs(x + n * p.C * HW, p.C, k, g, op);
            transforms.grad_outputs(dy + n * p.O * HW, p.O, k, g, op);
        }, double(count) * flops_per_image(p) >= kParallelMinFlops);
        // dU[ξ] += dM[ξ] · V[ξ]ᵀ (or its transpose), group after group (one task per ξ)
        parallel_chunks(values, [&](int64_t xi) {
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
    weight_grad_transform(dU.data(), p.O, p.C, transposed ? 1 : p.C, transposed ? p.O : 1, g.m, dw);
}

}  // namespace kiln::cpu
