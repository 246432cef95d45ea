// amx_tiles.cpp — the model of AMX's tiles (amx_tiles.h), and the AMX kernel compiled on it:
// "amx-bf16-emulated" (gemm_tile.h).
#include "ops/cpu/amx_tiles.h"

#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"

namespace kiln::cpu::amx {
namespace {

struct Tiles {
    bool configured = false;  // ldtilecfg ran with palette 1, and no tilerelease since
    TileConfig config;
    uint8_t data[kTiles][kMaxRows][kMaxRowBytes];
};
thread_local Tiles tiles;  // the registers are the thread's, as on the CPU

int rows_of(int t) { return tiles.config.rows[t]; }
int bytes_of(int t) { return tiles.config.colsb[t]; }

// The CPU's #UD for an instruction on tile t before ldtilecfg, on a tile that does not exist, or
// on one the configuration left empty.
void check_tile(const char* op, int t) {
    KILN_CHECK(tiles.configured, "AMX emulator: ", op, " tmm", t, " before ldtilecfg (or after tilerelease): ",
               "the CPU would fault (#UD); configure the tiles first (the kernel's begin())");
    KILN_CHECK(t >= 0 && t < kTiles, "AMX emulator: ", op, ": there is no tmm", t, " (palette 1 has tmm0-7)");
    KILN_CHECK(rows_of(t) > 0, "AMX emulator: ", op, " tmm", t, ": the configuration gives it no rows; ",
               "the CPU would fault (#UD)");
}

// bf16 -> f32 with denormals as zero (DAZ): tdpbf16ps reads subnormal inputs as ±0.
float daz(uint16_t bits) { return bf16_to_f32((bits & 0x7f80) == 0 ? uint16_t(bits & 0x8000) : bits); }
// Subnormal results flushed to ±0 (FTZ).
float ftz(float x) { return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x; }

template <typename T>
T element(int t, int row, int i) {  // the i-th T of a tile row
    T x;
    std::memcpy(&x, &tiles.data[t][row][i * int(sizeof(T))], sizeof x);
    return x;
}

}  // namespace

// The manual's checks, each a #GP on the CPU: palette 0 or 1, start_row and the reserved bytes 0,
// at most 16 rows of 64 bytes, nothing for tmm8-15, rows and bytes both zero or both not.
void load_config(const TileConfig* config) {
    const TileConfig& c = *config;
    KILN_CHECK(c.palette <= 1, "AMX emulator: ldtilecfg palette ", int(c.palette), ": only palette 1 (8 tiles of ",
               "16 rows × 64 bytes) exists, 0 releases; the CPU would fault (#GP)");
    if (c.palette == 0) return release();
    KILN_CHECK(c.start_row == 0, "AMX emulator: ldtilecfg start_row ", int(c.start_row), ": kiln starts at row 0");
    for (uint8_t r : c.reserved) KILN_CHECK(r == 0, "AMX emulator: ldtilecfg: reserved bytes must be 0 (#GP)");
    for (int t = 0; t < 16; ++t) {
        const bool exists = t < kTiles;
        KILN_CHECK(c.rows[t] <= (exists ? kMaxRows : 0) && c.colsb[t] <= (exists ? kMaxRowBytes : 0),
                   "AMX emulator: ldtilecfg tmm", t, ": ", int(c.rows[t]), " rows of ", c.colsb[t], " bytes; palette 1 ",
                   "allows up to 16 rows of 64 bytes on tmm0-7 and nothing on tmm8-15 (#GP)");
        KILN_CHECK((c.rows[t] == 0) == (c.colsb[t] == 0), "AMX emulator: ldtilecfg tmm", t, ": ", int(c.rows[t]),
                   " rows of ", c.colsb[t], " bytes; a tile has both or neither (#GP)");
    }
    tiles.config = c;
    tiles.configured = true;
    std::memset(tiles.data, 0, sizeof tiles.data);  // ldtilecfg zeroes every tile
}

void release() {
    tiles.configured = false;
    tiles.config = TileConfig{};
}

void zero(int t) {
    check_tile("tilezero", t);
    std::memset(tiles.data[t], 0, sizeof tiles.data[t]);
}

// Row r from base + r·stride, its configured bytes; the rest of the tile zeroed.
void load(int t, const void* base, int64_t stride) {
    check_tile("tileloadd", t);
    std::memset(tiles.data[t], 0, sizeof tiles.data[t]);
    for (int r = 0; r < rows_of(t); ++r)
        std::memcpy(tiles.data[t][r], static_cast<const uint8_t*>(base) + r * stride, size_t(bytes_of(t)));
}

void store(int t, void* base, int64_t stride) {
    check_tile("tilestored", t);
    for (int r = 0; r < rows_of(t); ++r)
        std::memcpy(static_cast<uint8_t*>(base) + r * stride, tiles.data[t][r], size_t(bytes_of(t)));
}

//   c[m][n] += a[m][2k]·b[k][2n], then += a[m][2k+1]·b[k][2n+1],   k = 0 .. K-1 in order
// (the manual's loop: m, then k, then n), each product exact, each sum rounded and flushed.
void dpbf16ps(int c, int a, int b) {
    for (int t : {c, a, b}) check_tile("tdpbf16ps", t);
    KILN_CHECK(c != a && c != b && a != b, "AMX emulator: tdpbf16ps tmm", c, ", tmm", a, ", tmm", b,
               ": the three tiles must differ (#UD)");
    const int M = rows_of(c), N = bytes_of(c) / 4, K = bytes_of(a) / 4;
    KILN_CHECK(bytes_of(c) % 4 == 0 && bytes_of(a) % 4 == 0 && rows_of(a) == M && rows_of(b) == K &&
                   bytes_of(b) == bytes_of(c),
               "AMX emulator: tdpbf16ps tmm", c, " (", M, " rows × ", bytes_of(c), " bytes), tmm", a, " (", rows_of(a),
               " × ", bytes_of(a), "), tmm", b, " (", rows_of(b), " × ", bytes_of(b), "): C and A need the same rows, ",
               "B one row per 4 bytes of A's rows and C's bytes per row; the CPU would fault (#UD)");
    for (int m = 0; m < M; ++m)
        for (int k = 0; k < K; ++k)
            for (int n = 0; n < N; ++n) {
                float sum = element<float>(c, m, n);
                for (int half = 0; half < 2; ++half) {
                    const float x = daz(element<uint16_t>(a, m, 2 * k + half));
                    const float y = daz(element<uint16_t>(b, k, 2 * n + half));
                    sum = ftz(sum + x * y);
                }
                std::memcpy(&tiles.data[c][m][n * 4], &sum, sizeof sum);
            }
}

}  // namespace kiln::cpu::amx

#define KILN_TILE_CONFIG(cfg) amx::load_config(cfg)
#define KILN_TILE_RELEASE() amx::release()
#define KILN_TILE_ZERO(t) amx::zero(t)
#define KILN_TILE_LOAD(t, base, stride) amx::load(t, base, stride)
#define KILN_TILE_STORE(t, base, stride) amx::store(t, base, stride)
#define KILN_TILE_DP(c, a, b) amx::dpbf16ps(c, a, b)
#define KILN_AMX_KERNEL kAmxEmulated
#define KILN_AMX_NAME "amx-bf16-emulated"
#include "ops/cpu/gemm_amx_body.h"
