// gemm_tile_avx2.cpp — the GEMM micro-kernel for AVX2 + FMA: a 6×16 tile (gemm_tile.h).
#if defined(__x86_64__)
#pragma GCC target("avx2,fma")
#define KILN_TILE_ISA 256
#define KILN_TILE_KERNEL kTileAvx2
#include "ops/cpu/gemm_tile_body.h"
#endif
