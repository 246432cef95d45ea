// gemm_tile_portable.cpp — the GEMM micro-kernel in the compiler's 4-float vectors, for any CPU
// (gemm_tile.h), and the choice of kernel for a CPU level.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.h"

#define KILN_TILE_ISA 0
#define KILN_TILE_KERNEL kTilePortable
#include "ops/cpu/gemm_tile_body.h"

namespace kiln::cpu {

#if defined(__x86_64__)
extern const MicroKernel kTileAvx512, kTileAvx2;  // gemm_tile_avx512.cpp, gemm_tile_avx2.cpp
extern const MicroKernel kTileAvx512x16, kTileAvx512x32, kTileAvx512x48;  // gemm_tile_avx512_narrow16.cpp, ...
extern const MicroKernel kTileAvx512Bf16;         // gemm_tile_avx512bf16.cpp
extern const AmxKernel kAmxTiles;                 // gemm_tile_amx.cpp
#endif
extern const AmxKernel kAmxEmulated;              // amx_tiles.cpp

const MicroKernel& micro_kernel([[maybe_unused]] CpuLevel level) {
#if defined(__x86_64__)
    if (level >= CpuLevel::Avx512) return kTileAvx512;
    if (level >= CpuLevel::Avx2) return kTileAvx2;  // the avx2 level includes FMA
#endif
    return kTilePortable;
}

const MicroKernel& micro_kernel(CpuLevel level, [[maybe_unused]] int64_t N) {
#if defined(__x86_64__)
    if (level >= CpuLevel::Avx512)
        for (const MicroKernel* narrow : {&kTileAvx512x16, &kTileAvx512x32, &kTileAvx512x48})
            if (N <= narrow->cols) return *narrow;
#endif
    return micro_kernel(level);
}

}  // namespace kiln::cpu

namespace kiln::cpu {
namespace {

// The best of 5 rounds of 200 calls of `call`, in seconds per call.
template <typename Call>
double best_seconds_per_call(Call call) {
    double best = 1e9;
    for (int round = 0; round < 5; ++round) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < 200; ++i) call();
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return best / 200.0;
}

// Seconds per multiply-add of kernel k on one 6×NR tile whose panels (zeros) sit in L1, each call
// `steps` steps of its k loop doing `per_step` values of k.
double seconds_per_multiply_add(const MicroKernel& k, int64_t steps, int64_t per_step) {
    std::vector<float> Ap(size_t(kTileRows * steps)), Bp(size_t(k.cols * steps)), C(size_t(kTileRows * k.cols));
    const TileOut out{C.data(), k.cols, kTileRows, k.cols, 1.0f, 0.0f};
    const double call = best_seconds_per_call([&] { k.multiply(steps, Ap.data(), Bp.data(), out); });
    return call / double(kTileRows * k.cols * steps * per_step);
}

// The same for the AMX kernel on one 32×32 block of `steps` steps, its tiles (zeros) in L1.
double amx_seconds_per_multiply_add(const AmxKernel& k, int64_t steps) {
    const int64_t run = steps * kAmxTileElems;
    std::vector<bf16> tiles(size_t(4 * run));
    std::vector<float> C(size_t(kAmxBlock * kAmxBlock));
    const bf16* t = tiles.data();
    const AmxBlock block{steps, {t, t + run}, {t + 2 * run, t + 3 * run}, C.data(), kAmxBlock, false};
    k.begin();
    const double call = best_seconds_per_call([&] { k.block(block); });
    k.end();
    return call / double(kAmxBlock * kAmxBlock * steps * kAmxDepth);
}

// Whether bf16 GEMMs run on the emulated tiles: KILN_AMX at first, then set_amx_emulation.
std::atomic<bool>& amx_emulation() {
    static std::atomic<bool> on{[] {
        const std::string env = std::getenv("KILN_AMX") ? std::getenv("KILN_AMX") : "";
        KILN_CHECK(env.empty() || env == "auto" || env == "emulate", "KILN_AMX='", env, "' is not a choice: use ",
                   "auto (AMX tiles where the CPU has them and they are faster; the default) or emulate (bf16 ",
                   "GEMMs on a model of the tiles, on any CPU, slowly)");
        return env == "emulate";
    }()};
    return on;
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

const AmxKernel* amx_kernel([[maybe_unused]] CpuLevel level) {
    if (amx_emulation().load(std::memory_order_relaxed)) return &kAmxEmulated;
#if defined(__x86_64__)
    if (level < CpuLevel::Amx || !amx_permission()) return nullptr;
    static const bool faster = [] {  // against the bf16 path the avx512 level takes
        const MicroKernel* pairs = bf16_pair_kernel(CpuLevel::Avx512);
        const double other =
            pairs ? seconds_per_multiply_add(*pairs, 64, 2) : seconds_per_multiply_add(kTileAvx512, 128, 1);
        return amx_seconds_per_multiply_add(kAmxTiles, 16) <= 0.8 * other;
    }();
    return faster ? &kAmxTiles : nullptr;
#else
    return nullptr;
#endif
}

bool set_amx_emulation(bool on) { return amx_emulation().exchange(on); }

}  // namespace kiln::cpu
