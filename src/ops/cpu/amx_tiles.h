// amx_tiles.h — AMX's tile registers and the six instructions kiln's AMX kernel uses, modelled in
// plain C++ with the semantics of Intel's manual (SDM vol. 2, "TDPBF16PS", "TILELOADD", ...), so
// that the kernel runs, and is tested, on any CPU (chapter 09). The CUDA emulator does the same
// for the GPU's kernels (cuda/emu).
//
// What a program sees of AMX:
//   - eight tile registers tmm0-7 per thread, each up to 16 rows of 64 bytes;
//   - ldtilecfg loads a 64-byte TileConfig giving each tile its rows and bytes per row; until
//     then (and after tilerelease) every tile instruction faults;
//   - tileloadd tmm, [base + stride]: row r of the tile from base + r·stride (bytes), the bytes
//     past the configured ones zeroed; tilestored writes them back; tilezero zeroes a tile;
//   - tdpbf16ps c, a, b: for each row m of c and column n (an f32):
//         c[m][n] += a[m][2k]·b[k][2n] + a[m][2k+1]·b[k][2n+1]   for k = 0 .. a's bytes per row / 4
//     a holds rows of bf16 values of k; b holds, in row k, the pairs (b[2k][n], b[2k+1][n]) side by
//     side: "VNNI" order. Shapes must agree (c.rows == a.rows, a's bytes per row == 4·b.rows,
//     c's bytes per row == b's) and the three tiles differ, or the instruction faults (#UD).
//     Each product is exact in f32 (8-bit significands); each addition rounds to nearest even;
//     bf16 subnormal inputs count as zero and subnormal results are flushed to zero (the manual's
//     DAZ and FTZ, whatever MXCSR says).
// The model keeps one set of tiles per thread, as the CPU does, and turns each fault the CPU would
// raise into a kiln::Error that says which rule was broken: a bad configuration or a shape
// mismatch, found here, would otherwise kill the program on an AMX machine with SIGILL.
#pragma once
#include <cstdint>

namespace kiln::cpu::amx {

// ldtilecfg's operand, palette 1 (8 tiles of up to 16 rows × 64 bytes).
struct TileConfig {
    uint8_t palette = 0;      // 1; 0 releases the tiles
    uint8_t start_row = 0;    // where an interrupted tileloadd resumes; 0
    uint8_t reserved[14] = {};
    uint16_t colsb[16] = {};  // bytes per row of tmm0..tmm15 (only 0..7 exist)
    uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64, "ldtilecfg reads 64 bytes");

constexpr int kTiles = 8, kMaxRows = 16, kMaxRowBytes = 64;

void load_config(const TileConfig* config);         // ldtilecfg
void release();                                     // tilerelease
void zero(int t);                                   // tilezero tmm<t>
void load(int t, const void* base, int64_t stride);  // tileloadd tmm<t>, [base + stride]
void store(int t, void* base, int64_t stride);       // tilestored [base + stride], tmm<t>
void dpbf16ps(int c, int a, int b);                  // tdpbf16ps tmm<c>, tmm<a>, tmm<b>

}  // namespace kiln::cpu::amx
