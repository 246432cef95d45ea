// gemm_tile.h — the GEMM's micro-kernels, one per instruction set, picked at run time
// (chapter 03; gemm.cpp's header comment says what a micro-kernel is).
//
// A binary built on one machine runs on others: a learner's laptop with AVX2 only, a server
// with AVX-512. So the micro-kernel — where nearly all of a GEMM's time goes — is compiled
// three times, each in a file of its own that tells the compiler its instruction set
// (`#pragma GCC target`) and includes the one body, gemm_tile_body.h:
//   gemm_tile_avx512.cpp   AVX-512 F      6×64 tile: 24 zmm accumulators   "avx512"
//   gemm_tile_avx2.cpp     AVX2 + FMA     6×16 tile: 12 ymm accumulators   "avx2-fma"
//   gemm_tile_portable.cpp the compiler's 4-float vectors for the -march it was given   "vectors"
//   gemm_tile_avx512bf16.cpp  AVX512-BF16, bf16 operands only: 6×64, vdpbf16ps        "avx512-bf16"
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
    // One micro-panel of a transposed B: Bp[k*cols + j] = B[j*ldb + k] for j < n <= cols, k < kc
    // (columns n .. cols-1 untouched). With the kernel because it is written in the same vectors.
    void (*pack_b_transposed)(int64_t kc, const float* B, int64_t ldb, int64_t n, float* Bp);
    // One full micro-panel of a row-major A: Ap[k*MR + i] = A[i*lda + k] for i < MR, k < kc.
    void (*pack_a_rows)(int64_t kc, const float* A, int64_t lda, float* Ap);
};

// The kernel for `level` (a level this CPU supports): the best one compiled in at or below it.
const MicroKernel& micro_kernel(CpuLevel level);

// For bf16 operands: the kernel "avx512-bf16" (gemm_tile_avx512bf16.cpp: vdpbf16ps on panels of
// bf16 pairs, not the bits of the f32 kernels) when `level` is avx512 or above, the CPU has
// AVX512-BF16, and it is the faster one here; null otherwise. Faster is measured, once per process:
// vdpbf16ps does twice the multiply-adds of an FMA per instruction, but CPUs run it at different
// rates (a Zen 4 core: 2× its f32 FMA rate; an Intel Emerald Rapids: slower than f32 FMA). The
// first call times both kernels on one L1-resident tile and takes the pairs when they do a
// multiply-add in at most 0.8 of the time (a margin, so that noise cannot flip a near tie).
const MicroKernel* bf16_pair_kernel(CpuLevel level);

}  // namespace kiln::cpu
