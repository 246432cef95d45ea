// gemm_tile_portable.cpp — the GEMM micro-kernel in the compiler's 4-float vectors, for any CPU
// (gemm_tile.h), and the choice of kernel for a CPU level.
#include <algorithm>
#include <chrono>
#include <vector>

#define KILN_TILE_ISA 0
#define KILN_TILE_KERNEL kTilePortable
#include "ops/cpu/gemm_tile_body.h"

namespace kiln::cpu {

#if defined(__x86_64__)
extern const MicroKernel kTileAvx512, kTileAvx2;  // gemm_tile_avx512.cpp, gemm_tile_avx2.cpp
extern const MicroKernel kTileAvx512Bf16;         // gemm_tile_avx512bf16.cpp
#endif

const MicroKernel& micro_kernel([[maybe_unused]] CpuLevel level) {
#if defined(__x86_64__)
    if (level >= CpuLevel::Avx512) return kTileAvx512;
    if (level >= CpuLevel::Avx2) return kTileAvx2;  // the avx2 level includes FMA
#endif
    return kTilePortable;
}

}  // namespace kiln::cpu

namespace kiln::cpu {
namespace {

// Seconds per multiply-add of kernel k on one 6×NR tile whose panels (zeros) sit in L1: the best
// of 5 rounds of 200 calls, each `steps` steps of its k loop doing `per_step` values of k.
double seconds_per_multiply_add(const MicroKernel& k, int64_t steps, int64_t per_step) {
    std::vector<float> Ap(size_t(kTileRows * steps)), Bp(size_t(k.cols * steps)), C(size_t(kTileRows * k.cols));
    const TileOut out{C.data(), k.cols, kTileRows, k.cols, 1.0f, 0.0f};
    double best = 1e9;
    for (int round = 0; round < 5; ++round) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int call = 0; call < 200; ++call) k.multiply(steps, Ap.data(), Bp.data(), out);
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return best / (200.0 * kTileRows * k.cols * steps * per_step);
}

}  // namespace

const MicroKernel* bf16_pair_kernel([[maybe_unused]] CpuLevel level) {
#if defined(__x86_64__)
    if (level < CpuLevel::Avx512 || !cpu_features().avx512_bf16) return nullptr;
    static const bool faster = seconds_per_multiply_add(kTileAvx512Bf16, 64, 2) <=
                               0.8 * seconds_per_multiply_add(kTileAvx512, 128, 1);
    return faster ? &kTileAvx512Bf16 : nullptr;
#else
    return nullptr;
#endif
}

}  // namespace kiln::cpu
