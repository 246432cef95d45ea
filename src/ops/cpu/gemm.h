// gemm.h — matrix multiply on the CPU: the workhorse behind Linear layers and im2col
// convolutions (chapter 03).
//
//   C[M,N] = alpha * op(A)[M,K] · op(B)[K,N] + beta * C[M,N]          all row-major
//
// gemm's contract (the arguments, beta = 0, alpha = 0, the element types) is in
// ops/gemm.h, which declares it for both backends; this file is how the CPU computes it.
//
// How the layers use it (X: batch×in, W: out×in, Y: batch×out):
//   forward   Y  = X · Wᵀ    gemm(false, true,  batch, out, in,    1, X, in,  W, in,  0, Y, out)
//   backward  dX = dY · W    gemm(false, false, batch, in,  out,   1, dY, out, W, in, 0, dX, in)
//             dW = dYᵀ · X   gemm(true,  false, out,   in,  batch, 1, dY, out, X, in, 1, dW, in)
//
// ---- How the path is picked (chapter 09) ------------------------------------------------------
// Four things are picked at run time, all for cpu_level() (core/cpu_features.h: the CPU's
// best level, capped by KILN_CPU), which gemm() reads once per call:
//  - the micro-kernel, where the time goes: f32 FMA for every T, in AVX-512, AVX2 + FMA or the
//    compiler's vectors (gemm_tile.h), whatever -march the library was compiled with; a product
//    at most 48 columns wide, and the last N mod 64 ≤ 48 columns of a wider one, take an AVX-512
//    kernel 16, 32 or 48 columns wide (the same bits: micro_kernel(level, N));
//  - how f16/bf16 become f32 and back: the packing of A and B panels and the store of C
//    convert runs of elements with convert_simd.h's kernels:
//   portable    dtype.h's integer conversion, one element at a time     gemm_path: "portable"
//   avx2        F16C for f16, AVX2 shifts for bf16, 8 at a time         "avx2-f16c" / "avx2"
//   avx512      the same in AVX-512's 16 lanes                         "avx512"
//  - for bf16 at the avx512 level on a CPU with AVX512-BF16: vdpbf16ps instead of both, when it
//    measures faster here (bf16_pair_kernel in gemm_tile.h)                       "avx512-bf16"
//    The packers copy bf16 pairs without widening them, and the kernel multiplies them as they
//    are: 32 products per instruction, summed pairwise into 16 f32 lanes. On a Zen 4 core that is
//    2× the f32 FMA rate (bf16 1024³ at ~280-340 GFLOP/s on 2 threads, f32 ~165). Its sums round
//    in another order and flush subnormals, so C may differ from the other paths by an ulp of
//    bf16: tested within that bound, not bit for bit. A PackedA made from bf16 holds pairs too.
//  - for bf16 at the amx level (a CPU with AMX-BF16 whose kernel grants the tiles): AMX tiles,
//    when tdpbf16ps measures faster than the path above (amx_kernel in gemm_tile.h)  "amx-bf16"
//    Its own packing into 16×32 tiles and 32×32 blocks of C (gemm_amx.h), the same five loops;
//    tdpbf16ps ran at about 6.5× one core's f32 FMA rate on an Emerald Rapids. Its sums round in the
//    instruction's order and flush subnormals, as vdpbf16ps's do: tested within the same bound.
//    A PackedA made from bf16 then holds AMX tiles. KILN_AMX=emulate runs it on a model of the
//    tiles on any CPU (amx_tiles.h), slowly                                 "amx-bf16-emulated"
// The conversions give dtype.h's bits for every input and the fused micro-kernels the same
// sums (gemm_tile.h), so apart from vdpbf16ps and AMX, KILN_CPU changes the speed, not a result —
// except the portable micro-kernel of a library compiled without FMA, which rounds twice per
// multiply-add.
// Not used: AVX512-FP16's vfmadd...ph (32 f16 lanes, about 2× f32 FMA) sums in f16, and kiln
// sums in f32 whatever T is; AMX-FP16 (f16 tiles) comes after the CPUs kiln has met.
#pragma once
#include <cstdint>

#include "core/cpu_features.h"
#include "core/dtype.h"
#include "ops/gemm.h"  // gemm: cache-blocked, packed, SIMD micro-kernel, OpenMP over blocks of C

namespace kiln::cpu {

// ---- A packed once, for many products -----------------------------------------------------------
// A convolution multiplies the same weights by the columns of one group of images after another
// (ops/cpu/conv.cpp). gemm() packs its A (gemm.cpp, "Packing") on every call, so the weights
// were packed once per group, for the 7×7 and 3×3 layers of the CIFAR net once per 300 columns
// of B. PackedA packs op(A) once, widened to f32 and cut into KC-blocks exactly as gemm() cuts
// them, and gemm_packed(PackedA, ...) uses it as it is: the same arithmetic, so the same bits as
// gemm() on A itself, with one copy of A per layer instead of one per group.
// The copy is op(A) in f32, M·K floats (M rounded up to 6): it lives in a buffer of the thread
// that packs (kept for the next PackedA, as gemm()'s own packing buffers are), and the products
// may run on any thread while the PackedA lives. A bf16 A on a CPU whose bf16 GEMM takes the
// vdpbf16ps kernel ("How the path is picked") is packed as that kernel's bf16 pairs instead, half
// the bytes, and is multiplied by that kernel; its B must then be bf16 too.
struct MicroKernel;  // gemm_tile.h
struct AmxKernel;    // gemm_tile.h

class PackedA {
public:
    template <typename T>
    PackedA(bool trans_a, int64_t M, int64_t K, const T* A, int64_t lda);
    ~PackedA();
    PackedA(const PackedA&) = delete;
    PackedA& operator=(const PackedA&) = delete;

    int64_t rows() const { return M_; }   // M
    int64_t depth() const { return K_; }  // K
    // The kernel its panels are for when they hold bf16 pairs; null when they hold f32.
    const MicroKernel* pair_kernel() const { return pairs_; }
    // The AMX kernel its tiles are for when it holds AMX tiles (gemm_amx.h's layout, bf16 A on a
    // CPU whose bf16 GEMM takes AMX); null otherwise. The tiles themselves:
    const AmxKernel* amx_tile_kernel() const { return amx_; }
    const bf16* amx_tiles() const { return reinterpret_cast<const bf16*>(data_); }
    // The micro-panel of rows r .. r+5 (r a multiple of 6) in the KC-block starting at k = pc
    // (kc rows of f32, or (kc+1)/2 of pairs: the KC-blocks of a pair product are even, pc too).
    const float* panel(int64_t pc, int64_t r, int64_t kc) const {
        return pairs_ ? data_ + pc / 2 * padded_rows_ + r * ((kc + 1) / 2) : data_ + pc * padded_rows_ + r * kc;
    }

private:
    int64_t M_, K_, padded_rows_;
    float* data_;
    int64_t capacity_;  // floats
    const MicroKernel* pairs_ = nullptr;
    const AmxKernel* amx_ = nullptr;
};

// C[M,N] = alpha · A · op(B)[K,N] + beta · C, with A packed (its M and K); as gemm() otherwise.
template <typename T>
void gemm_packed(const PackedA& A, bool trans_b, int64_t N, float alpha, const T* B, int64_t ldb, float beta, T* C,
          int64_t ldc);

// The name of the path gemm<T> takes at `level` (a level this CPU supports), as above; for
// float, the micro-kernel's instruction set ("avx512", "avx2-fma" or "vectors"; a product at
// most 48 columns wide may take a narrower one, micro_kernel(level, N)); for f16 and bf16, the
// conversions' (the micro-kernel is the float one of the same level).
template <typename T>
const char* gemm_path(CpuLevel level);

// Whether gemm<float> reads the operands of an M×N×K product where they lie instead of packing
// them (gemm.cpp, "Small products"): the same bits either way, so this says only how fast.
bool gemm_in_place(int64_t M, int64_t N, int64_t K);

// The textbook triple loop, one dot product per C element: the reference gemm() is tested
// against. Slow; use it in tests only.
template <typename T>
void gemm_reference(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                    const T* A, int64_t lda, const T* B, int64_t ldb, float beta, T* C,
                    int64_t ldc);

}  // namespace kiln::cpu
