// gemm_tile_body.h — the one body of the GEMM micro-kernel (gemm_tile.h), included by
// gemm_tile_avx512.cpp, gemm_tile_avx2.cpp and gemm_tile_portable.cpp. Each defines, before
// including it, KILN_TILE_ISA (512, 256 or 0: the vector type) and KILN_TILE_KERNEL (the name
// of the MicroKernel to define), after a `#pragma GCC target` for its instruction set.
#include "ops/cpu/gemm_tile.h"

#include <cstring>

#if KILN_TILE_ISA != 0
#include <immintrin.h>
#endif

namespace kiln::cpu {
namespace {

// ---- SIMD: the four vector operations the micro-kernel needs ---------------------------------
// VL floats per vector, NV vectors per tile row: NR = NV·VL columns.
#if KILN_TILE_ISA == 512
using vec = __m512;
constexpr const char* kName = "avx512";
constexpr int VL = 16;
constexpr int NV = 4;  // 6×4 = 24 accumulators + 4 B vectors + 1 broadcast of the 32 zmm
inline vec vzero() { return _mm512_setzero_ps(); }
inline vec vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, vec v) { _mm512_storeu_ps(p, v); }
inline vec vbroadcast(float x) { return _mm512_set1_ps(x); }
inline vec vfma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }  // a*b + c
#elif KILN_TILE_ISA == 256
using vec = __m256;
constexpr const char* kName = "avx2-fma";
constexpr int VL = 8;
constexpr int NV = 2;  // 6×2 = 12 accumulators + 2 B vectors + 1 broadcast of the 16 ymm
inline vec vzero() { return _mm256_setzero_ps(); }
inline vec vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, vec v) { _mm256_storeu_ps(p, v); }
inline vec vbroadcast(float x) { return _mm256_set1_ps(x); }
inline vec vfma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
#else
typedef float vec __attribute__((vector_size(16)));  // SSE, NEON, ...: 4 floats
constexpr const char* kName = "vectors";
constexpr int VL = 4;
constexpr int NV = 2;  // 6×2 = 12 accumulators: fits 16 registers
inline vec vzero() { return vec{}; }
inline vec vload(const float* p) {
    vec v;
    std::memcpy(&v, p, sizeof v);  // unaligned-safe; compiles to one vector load
    return v;
}
inline void vstore(float* p, vec v) { std::memcpy(p, &v, sizeof v); }
inline vec vbroadcast(float x) { return vec{} + x; }
inline vec vfma(vec a, vec b, vec c) { return a * b + c; }  // fused where the target has FMA (kFused)
#endif

#if KILN_TILE_ISA != 0 || defined(__FMA__)
constexpr bool kFused = true;
#else
constexpr bool kFused = false;  // a * b + c rounds twice
#endif

constexpr int MR = kTileRows;
constexpr int NR = NV * VL;
static_assert(NR <= kTileColsMax, "kTileColsMax sizes the callers' tile buffers");

// acc[MR×NR] = Σ_k Ap[k][0..MR) ⊗ Bp[k][0..NR), k = 0, 1, ..., kc-1 in order.
// The loops over i and j are unrolled completely, so acc lives in registers; k is unrolled
// by 4, which saves the loop's own instructions (they compete with the FMAs for issue slots).
void multiply(int64_t kc, const float* __restrict Ap, const float* __restrict Bp, float* __restrict tile) {
    vec acc[MR][NV];
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
        for (int j = 0; j < NV; ++j) acc[i][j] = vzero();
#pragma GCC unroll 4
    for (int64_t k = 0; k < kc; ++k) {
        vec b[NV];
#pragma GCC unroll 4
        for (int j = 0; j < NV; ++j) b[j] = vload(Bp + k * NR + j * VL);
#pragma GCC unroll 16
        for (int i = 0; i < MR; ++i) {
            const vec a = vbroadcast(Ap[k * MR + i]);
#pragma GCC unroll 4
            for (int j = 0; j < NV; ++j) acc[i][j] = vfma(a, b[j], acc[i][j]);
        }
    }
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
        for (int j = 0; j < NV; ++j) vstore(tile + i * NR + j * VL, acc[i][j]);
}

}  // namespace

extern const MicroKernel KILN_TILE_KERNEL{kName, NR, kFused, multiply};

}  // namespace kiln::cpu
