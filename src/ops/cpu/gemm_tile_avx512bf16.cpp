// gemm_tile_avx512bf16.cpp — the GEMM micro-kernel for bf16 operands on AVX512-BF16: a 6×64 tile
// of f32 sums, each step a vdpbf16ps on panels of bf16 pairs (gemm_tile.h, gemm.cpp "bf16 pairs").
#if defined(__x86_64__)
#pragma GCC target("avx512f,avx512bw,avx512bf16,avx2,fma")
#define KILN_TILE_ISA 512
#define KILN_TILE_BF16_PAIRS 1
#define KILN_TILE_KERNEL kTileAvx512Bf16
#include "ops/cpu/gemm_tile_body.h"
#endif
