// gemm_tile_avx512_narrow48.cpp — the AVX-512 micro-kernel for products at most 48 columns wide:
// a 6×48 tile, 3 zmm per row (gemm_tile.h, micro_kernel(level, N)).
#if defined(__x86_64__)
#pragma GCC target("avx512f,avx2,fma")
#define KILN_TILE_ISA 512
#define KILN_TILE_NV 3
#define KILN_TILE_NAME "avx512-48"
#define KILN_TILE_KERNEL kTileAvx512x48
#include "ops/cpu/gemm_tile_body.h"
#endif
