// gemm_amx_body.h — the one body of the AMX kernel (gemm_tile.h, AmxKernel), included by
// gemm_tile_amx.cpp, on the instructions, and by amx_tiles.cpp, on their model. Each defines
// before including it KILN_AMX_KERNEL (the AmxKernel to define), KILN_AMX_NAME, and the tile
// operations as macros:
//   KILN_TILE_CONFIG(cfg)  KILN_TILE_RELEASE()  KILN_TILE_ZERO(t)
//   KILN_TILE_LOAD(t, base, stride)  KILN_TILE_STORE(t, base, stride)  KILN_TILE_DP(c, a, b)
// Macros and not functions because an AMX instruction names its tile registers in the
// instruction itself: the numbers must be literal constants (immintrin.h's _tile_loadd(4, ...)
// pastes its 4 into the assembly text "tileloadd ..., %tmm4").
#include <atomic>  // std::atomic_signal_fence: a compiler barrier

#include "ops/cpu/amx_tiles.h"
#include "ops/cpu/gemm_tile.h"

namespace kiln::cpu {
namespace {

// The tile registers of a block:
//   tmm0 C[0:16, 0:16]   tmm1 C[0:16, 16:32]   tmm4 A_top (16 rows × 32 bf16 of k)
//   tmm2 C[16:32, 0:16]  tmm3 C[16:32, 16:32]  tmm5 A_bottom
//   tmm6 B_left (16 rows of 16 bf16 pairs: k = 2r, 2r+1)   tmm7 B_right
// Every one is 16 rows of 64 bytes: 16 f32, 32 bf16 or 16 pairs of bf16.
amx::TileConfig block_config() {
    amx::TileConfig config;
    config.palette = 1;
    for (int t = 0; t < 8; ++t) config.rows[t] = 16, config.colsb[t] = 64;
    return config;
}

void begin() {
    static const amx::TileConfig config = block_config();  // in memory, whole, before ldtilecfg reads it
    KILN_TILE_CONFIG(&config);
}

void end() { KILN_TILE_RELEASE(); }

// C block (+)= Σ_t A_t · B_t. The tile instructions are assembly the compiler cannot see into, so
// the fences tell it that memory is read before the loads and written by the stores.
void block(const AmxBlock& b) {
    constexpr int64_t kTileRowBytes = 64;
    const int64_t c_stride = b.ldc * int64_t(sizeof(float));  // bytes from one C row to the next
    float* const c_top = b.c;
    float* const c_bottom = b.c + 16 * b.ldc;
    std::atomic_signal_fence(std::memory_order_seq_cst);
    if (b.accumulate) {
        KILN_TILE_LOAD(0, c_top, c_stride);
        KILN_TILE_LOAD(1, c_top + 16, c_stride);
        KILN_TILE_LOAD(2, c_bottom, c_stride);
        KILN_TILE_LOAD(3, c_bottom + 16, c_stride);
    } else {
        KILN_TILE_ZERO(0);
        KILN_TILE_ZERO(1);
        KILN_TILE_ZERO(2);
        KILN_TILE_ZERO(3);
    }
    for (int64_t t = 0; t < b.steps; ++t) {
        KILN_TILE_LOAD(4, b.a[0] + t * kAmxTileElems, kTileRowBytes);
        KILN_TILE_LOAD(5, b.a[1] + t * kAmxTileElems, kTileRowBytes);
        KILN_TILE_LOAD(6, b.b[0] + t * kAmxTileElems, kTileRowBytes);
        KILN_TILE_LOAD(7, b.b[1] + t * kAmxTileElems, kTileRowBytes);
        KILN_TILE_DP(0, 4, 6);
        KILN_TILE_DP(1, 4, 7);
        KILN_TILE_DP(2, 5, 6);
        KILN_TILE_DP(3, 5, 7);
    }
    KILN_TILE_STORE(0, c_top, c_stride);
    KILN_TILE_STORE(1, c_top + 16, c_stride);
    KILN_TILE_STORE(2, c_bottom, c_stride);
    KILN_TILE_STORE(3, c_bottom + 16, c_stride);
    std::atomic_signal_fence(std::memory_order_seq_cst);
}

}  // namespace

extern const AmxKernel KILN_AMX_KERNEL;
const AmxKernel KILN_AMX_KERNEL{KILN_AMX_NAME, begin, end, block};

}  // namespace kiln::cpu
