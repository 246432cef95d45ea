// gemm_tile_amx.cpp — the AMX kernel on the instructions themselves (gemm_tile.h, AmxKernel):
// tdpbf16ps on AMX tiles. Runs only where amx_kernel() picked it: a CPU with AMX-BF16 whose
// kernel granted this process the tiles (amx_permission).
#if defined(__x86_64__)
#pragma GCC target("amx-tile,amx-bf16")
#include <immintrin.h>

#define KILN_TILE_CONFIG(cfg) _tile_loadconfig(cfg)
#define KILN_TILE_RELEASE() _tile_release()
#define KILN_TILE_ZERO(t) _tile_zero(t)
#define KILN_TILE_LOAD(t, base, stride) _tile_loadd(t, base, stride)
#define KILN_TILE_STORE(t, base, stride) _tile_stored(t, base, stride)
#define KILN_TILE_DP(c, a, b) _tile_dpbf16ps(c, a, b)
#define KILN_AMX_KERNEL kAmxTiles
#define KILN_AMX_NAME "amx-bf16"
#include "ops/cpu/gemm_amx_body.h"
#endif
