// gemm_tile.h — the GEMM's micro-kernels, one per instruction set, picked at run time
// (chapter 03; gemm.cpp's header comment says what a micro-kernel is).
//
// A binary built on one machine runs on others: a learner's laptop with AVX2 only, a server
// with AVX-512. So the micro-kernel — where nearly all of a GEMM's time goes — is compiled
// once per instruction set (AVX-512's in four widths), each in a file of its own that tells
// the compiler its instruction set (`#pragma GCC target`) and includes the one body,
// gemm_tile_body.h:
//   gemm_tile_avx512.cpp   AVX-512 F      6×64 tile: 24 zmm accumulators   "avx512"
//     _narrow48.cpp, _narrow32.cpp, _narrow16.cpp   6×48, 6×32 and 6×16 tiles, for narrow
//                                         products   "avx512-48", "avx512-32", "avx512-16"
//   gemm_tile_avx2.cpp     AVX2 + FMA     6×16 tile: 12 ymm accumulators   "avx2-fma"
//   gemm_tile_portable.cpp the compiler's 4-float vectors for the -march it was given   "vectors"
//   gemm_tile_avx512bf16.cpp  AVX512-BF16, bf16 operands only: 6×64, vdpbf16ps        "avx512-bf16"
// and, for bf16 operands on a CPU with AMX, a kernel of another shape (AmxKernel below):
//   gemm_tile_amx.cpp      AMX tiles: 32×32, tdpbf16ps                             "amx-bf16"
// gemm() takes the best one at or below cpu_level() (core/cpu_features.h), so KILN_CPU=avx2
// runs the AVX2 kernel on an AVX-512 machine, and the AVX-512 kernel runs on any CPU that has
// it even when the library was compiled for less (-march=x86-64-v3).
//
// Every kernel sums k in order, lane by lane, with one fused multiply-add (one rounding) per
// step, so the AVX-512 and AVX2 kernels give the same bits. The portable one fuses too where
// the compiler was told of FMA (-march); without it (make SAN=1 builds for plain x86-64), it
// multiplies and adds, rounding twice, and its bits differ in the last place.
#pragma once
#include <cstdint>

#include "core/cpu_features.h"
#include "core/dtype.h"

namespace kiln::cpu {

constexpr int kTileRows = 6;     // MR: the rows of a tile, the same for every kernel

// Where a micro-kernel puts its tile: C[i*ldc + j] = alpha·acc + beta·C for i < rows, j < cols
// (C not read when beta == 0). A struct passed by address: alpha and beta as arguments would sit
// in two of the 16 vector registers through the k loop, and an accumulator would spill (measured).
struct TileOut {
    float* C;
    int64_t ldc;
    int rows, cols;
    float alpha, beta;
};

struct MicroKernel {
    const char* name;  // "avx512", "avx2-fma" or "vectors" (gemm_path<float>)
    int cols;          // NR: the tile's columns; B is packed in panels this wide
    bool fused;        // one rounding per multiply-add: the bits of every other fused kernel
    // acc[i][j] = Σ_k Ap[k*MR + i] · Bp[k*cols + j], k = 0 .. kc-1 in order
    // (Ap: a packed MR-row panel of A, Bp: a packed cols-wide panel of B; gemm.cpp, "Packing"),
    // then stored as `out` says.
    void (*multiply)(int64_t kc, const float* Ap, const float* Bp, const TileOut& out);
    // The same product on f32 operands where they lie, with the same sums: A's element (i, k) at
    // A[i*a_row + k*a_k] for i < out.rows, B's row k at B + k*ldb with all `cols` columns there
    // (gemm.cpp, "Small products"; never with bf16 pairs).
    void (*multiply_in_place)(int64_t kc, const float* A, int64_t a_row, int64_t a_k, const float* B, int64_t ldb,
                              const TileOut& out);
    // One micro-panel of a transposed B: Bp[k*cols + j] = B[j*ldb + k] for j < n <= cols, k < kc
    // (columns n .. cols-1 untouched). With the kernel because it is written in the same vectors.
    // Both packers copy bits, and pack bf16 pairs as 32-bit words too (gemm.cpp, "bf16 pairs").
    void (*pack_b_transposed)(int64_t kc, const float* B, int64_t ldb, int64_t n, float* Bp);
    // One full micro-panel of a row-major A: Ap[k*MR + i] = A[i*lda + k] for i < MR, k < kc.
    void (*pack_a_rows)(int64_t kc, const float* A, int64_t lda, float* Ap);
};

// The kernel for `level` (a level this CPU supports): the best one compiled in at or below it.
const MicroKernel& micro_kernel(CpuLevel level);

// The kernel for a product N columns wide at `level`: micro_kernel(level), unless a narrower
// kernel of the same instruction set covers N. A tile computes all of its NR columns whatever N
// is: a 1×1 convolution on MobileNetV2's 4×4 planes (N = 16) used 16 of the AVX-512 tile's 64
// columns, 24 FMAs on 16 floats each for 6×16 useful multiply-adds a step, where a 6×16 tile does
// them in 6. So at avx512 a product at most 16 columns wide takes "avx512-16", at most 32
// "avx512-32", at most 48 "avx512-48" (48³ on one Zen 5 core: 124 GFLOP/s on the 6×64 tile with
// a quarter of its columns masked, 203 on the 6×48 one). The two narrowest replaced the AVX2
// kernel's 6×16 tile here, which needed 12 FMAs on 8 floats: as fast on a Zen 4, whose 512-bit
// FMA is two 256-bit halves, but not where an FMA is 512 bits wide, as on a Zen 5. gemm() asks the same of a wide product's last N mod NR columns (gemm.cpp,
// product). The fused kernels give the same bits, so the choice changes the speed only.
const MicroKernel& micro_kernel(CpuLevel level, int64_t N);

// For bf16 operands: the kernel "avx512-bf16" (gemm_tile_avx512bf16.cpp: vdpbf16ps on panels of
// bf16 pairs, not the bits of the f32 kernels) when `level` is avx512 or above, the CPU has
// AVX512-BF16, and it is the faster one here; null otherwise. Faster is measured, once per process:
// vdpbf16ps does twice the multiply-adds of an FMA per instruction, but CPUs run it at different
// rates (a Zen 4 core: 2× its f32 FMA rate; an Intel Emerald Rapids: slower than f32 FMA). The
// first call times both kernels on one L1-resident tile and takes the pairs when they do a
// multiply-add in at most 0.8 of the time (a margin, so that noise cannot flip a near tie).
const MicroKernel* bf16_pair_kernel(CpuLevel level);

// ---- AMX tiles (chapter 09) ----------------------------------------------------------------------
// AMX gives a core eight tile registers of 16 rows × 64 bytes and one multiply, tdpbf16ps, that
// adds a 16×32 bf16 tile times a 32×16 one into a 16×16 f32 tile: 16,384 multiply-adds in one
// instruction. Its operands have their own layouts (gemm_amx.cpp, "Tiles"), so the AMX kernel
// is not a MicroKernel: it computes a 32×32 block of C from tiles packed for it, 32 values of k
// per step, four products per step on two A tiles and two B tiles:
//   C[0:16, 0:16]  += A_top · B_left     C[0:16, 16:32]  += A_top · B_right
//   C[16:32, 0:16] += A_bottom · B_left   C[16:32, 16:32] += A_bottom · B_right
// The same kernel (gemm_amx_body.h) is compiled twice: on the instructions (gemm_tile_amx.cpp,
// "amx-bf16") and on amx_tiles.h's model of them ("amx-bf16-emulated"), which runs it, slowly,
// on any CPU, and so tests it on machines without AMX.
constexpr int64_t kAmxBlock = 32;  // rows and columns of C one block() computes
constexpr int64_t kAmxDepth = 32;  // values of k per step
constexpr int64_t kAmxTileElems = 16 * 32;  // bf16 in one A or B tile (1 KiB)

struct AmxBlock {
    int64_t steps;       // steps of kAmxDepth values of k
    const bf16* a[2];    // rows 0-15 and 16-31: `steps` A tiles each, one after another
    const bf16* b[2];    // columns 0-15 and 16-31: `steps` B tiles each, one after another
    float* c;            // the 32×32 block of C, ldc floats from one row to the next
    int64_t ldc;
    bool accumulate;     // C += the product (else C = the product)
};

struct AmxKernel {
    const char* name;  // "amx-bf16" or "amx-bf16-emulated"
    void (*begin)();   // configure the calling thread's tiles for block() (ldtilecfg)
    void (*end)();     // release them (tilerelease)
    void (*block)(const AmxBlock& b);
};

// For bf16 operands: the AMX kernel when `level` is amx, the kernel let this process use the
// tiles (amx_permission), and they do a multiply-add in at most 0.8 of the time of the bf16 path
// they replace (measured once per process, as bf16_pair_kernel does); null otherwise. Under
// amx emulation (below), the emulated kernel on any CPU and at any level.
const AmxKernel* amx_kernel(CpuLevel level);

// Emulation: bf16 GEMMs run the AMX kernel on amx_tiles.h's model of the tiles, to follow or test
// the AMX path on a CPU without it (thousands of times slower than the real tiles). Starts as the
// environment says (KILN_AMX=emulate; KILN_AMX=auto or unset: off); returns the previous setting.
bool set_amx_emulation(bool on);

}  // namespace kiln::cpu
