// gemm_tile_portable.cpp — the GEMM micro-kernel in the compiler's 4-float vectors, for any CPU
// (gemm_tile.h), and the choice of kernel for a CPU level.
#define KILN_TILE_ISA 0
#define KILN_TILE_KERNEL kTilePortable
#include "ops/cpu/gemm_tile_body.h"

namespace kiln::cpu {

#if defined(__x86_64__)
extern const MicroKernel kTileAvx512, kTileAvx2;  // gemm_tile_avx512.cpp, gemm_tile_avx2.cpp
#endif

const MicroKernel& micro_kernel([[maybe_unused]] CpuLevel level) {
#if defined(__x86_64__)
    if (level >= CpuLevel::Avx512) return kTileAvx512;
    if (level >= CpuLevel::Avx2) return kTileAvx2;  // the avx2 level includes FMA
#endif
    return kTilePortable;
}

}  // namespace kiln::cpu
