// gemm_tile_avx512.cpp — the GEMM micro-kernel for AVX-512 F: a 6×64 tile (gemm_tile.h).
#if defined(__x86_64__)
#pragma GCC target("avx512f,avx2,fma")
#define KILN_TILE_ISA 512
#define KILN_TILE_KERNEL kTileAvx512
#include "ops/cpu/gemm_tile_body.h"
#endif
