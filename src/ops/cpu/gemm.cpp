// gemm.cpp — a fast, deterministic GEMM for the CPU (chapter 03), in f32, f16 and bf16.
//
//   C[M,N] = alpha * op(A)[M,K] · op(B)[K,N] + beta * C[M,N]          (row-major, see gemm.h)
//
// Build and test just this file:
//   make build/src/ops/cpu/gemm.o build/tests/test_gemm.o build/tests/main.o
//   g++ -fopenmp build/tests/main.o build/tests/test_gemm.o build/src/ops/cpu/gemm.o -o gemm_tests
//   ./gemm_tests '[gemm]'
// Time it against OpenBLAS:
//   make build/bench/bench_gemm && OMP_NUM_THREADS=2 build/bench/bench_gemm
//
// Versions, from the textbook to this file (the reader can write each one in turn):
//   v1  gemm_reference: for i, for j, for k — one dot product per C element. Each B column
//       is read with a stride of a whole row, so nearly every load misses the cache: ~1 GFLOP/s.
//   v2  loop order i, k, j: the inner loop walks a row of B and a row of C, contiguous, and
//       the compiler vectorizes it. Better, but every C row is loaded and stored K times.
//   v3  this file: the GotoBLAS / BLIS scheme, ~150x v1 on one core. The rest of this comment
//       is why.
//
// ---- Where the time goes ------------------------------------------------------------------
// A core can do two vector FMAs per cycle (8 or 16 floats each), but can load only ~2
// vectors per cycle from L1, fewer from L2, far fewer from memory. Multiplying matrices
// does M·N·K multiply-adds on only M·K + K·N + M·N numbers, so each number can be reused
// many times — if it is still close to the core when it is needed again. Everything
// below arranges the computation so that it is.
//
// ---- The micro-kernel: registers -----------------------------------------------------------
// The innermost piece computes a small MR×NR tile of C (6×64 with AVX-512, 6×16 with
// AVX2) entirely in vector registers:
//       for k in 0..kc:   acc[MR][NR] += a[k][0..MR] (outer product) b[k][0..NR]
// Per k it loads NR/VL vectors of B and broadcasts MR numbers of A, then does MR·NR/VL
// FMAs: 24 FMAs for 4 + 6 loads with AVX-512 (12 FMAs for 2 + 6 loads with AVX2). The
// accumulators never leave the registers until the tile is done; that is what keeps the FMA
// units busy. Then the kernel itself adds them into C, a vector at a time (a scalar loop over
// the tile after the kernel took a fifth of a CIFAR net's training step). (24 independent accumulators also hide the FMA latency: 2 FMAs/cycle × 4
// cycles needs at least 8 in flight.) The micro-kernel lives in gemm_tile_body.h, compiled
// once per instruction set and picked at run time from what the CPU reports (gemm_tile.h);
// everything in this file works for any tile width NR.
//
// ---- Packing: contiguous streams ----------------------------------------------------------
// The micro-kernel wants, for each k, MR consecutive numbers of A and NR consecutive numbers
// of B. In the user's matrices these are strided (and transposition changes which way), so
// before computing we copy ("pack") a block of A and a block of B into buffers laid out in
// exactly the order the micro-kernel reads them:
//     Ap: micro-panels of MR rows:    Ap[panel][k][0..MR)     (rows past M padded with 0)
//     Bp: micro-panels of NR columns: Bp[panel][k][0..NR)     (columns past N padded with 0)
// Packing costs O(MK + KN) copies, paid back by O(MNK) fast reads; it also removes every
// transpose/stride/alignment case from the micro-kernel, which sees one layout only. (In a small
// product the reads are too few to pay for the copies: "Small products" below.)
// When many products share one A (a conv layer's weights, multiplied by one group of images'
// columns after another), A is packed once for all of them: PackedA in gemm.h.
//
// ---- Blocking: the cache levels -----------------------------------------------------------
//   for jc over N, NC at a time          the packed B block (KC×NC) lives in L3
//     for pc over K, KC at a time
//       for ic over M, MC at a time          pack A[ic.., pc..]: the A block (MC×KC) lives in L2
//         for jr over NC, NR at a time         one B micro-panel (KC×NR) lives in L1 ...
//                                              (packed here on the first ic, kept for the next)
//           for ir over MC, MR at a time         ... reused by every A micro-panel of the block
//             micro-kernel: C[ir.., jr..] (+)= Ap[ir] · Bp[jr]
// Block sizes are split evenly (K = 784 with KC ≤ 256 gives 4 blocks of 196) so that no
// block is a sliver.
//
// ---- Threads, and why the result never depends on their number ------------------------------
// C is cut into rectangles, a few per thread, and a thread runs the loops above on one
// rectangle at a time, with its own packing buffers: no barriers, no shared writes (a barrier
// costs microseconds; the 5 loops would need 2 or 3 per block). The rectangles are chunks of
// one parallel_chunks (core/parallel.h): a thread that loses its core does fewer. Every C element is
// then computed by exactly one thread, summing over k in an order set by KC alone: KC-blocks
// in order, k in order within one. No thread ever adds a partial sum of another, so 1, 2 or
// 3 threads give bitwise the same C (tested in tests/test_gemm.cpp).
// Small products run on the calling thread only: waking the pool's workers costs microseconds.
//
// ---- f16 and bf16 -----------------------------------------------------------------------------
// The micro-kernel computes in f32 only. For T = f16 or bf16, packing is where the types meet:
// pack_a_panel and pack_b_panel widen each element to f32 as they copy it (they copy every
// element anyway), so the micro-kernel and its speed are the f32 ones. The sums are kept in
// f32 too: the product goes to an f32 M×N buffer (a KC-block's partial sums are never rounded
// to 16 bits), and one last pass rounds C = T(alpha·Σ + beta·C) once per element.
// bf16 on a CPU with AVX512-BF16 skips the widening where vdpbf16ps is the faster: "bf16 pairs"
// below; on a CPU with AMX, where its tiles are the faster, bf16 leaves these loops for
// gemm_amx.cpp's (run_amx).
// Both conversions run a row at a time through the vector kernels of convert_simd.h (F16C for
// f16, AVX2 shifts for bf16, or the portable loop: gemm.h says how the path is picked); they
// give dtype.h's bits on every path, so the path never changes C.
#include "ops/cpu/gemm.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <type_traits>

#include "core/error.h"
#include "core/parallel.h"
#include "ops/cpu/convert_simd.h"
#include "ops/cpu/gemm_amx.h"
#include "ops/cpu/gemm_blocks.h"
#include "ops/cpu/gemm_tile.h"


namespace kiln::cpu {
namespace {

// The micro-tile: MR rows × NR columns of C, NR = 64 floats (AVX-512), 16 (AVX2) or 8 (neither):
// the micro-kernel's own (gemm_tile.h), picked at run time. Rows of C past a multiple of MR
// still cost a whole tile, so a small MR wastes little on the channel counts of real layers:
// 64 rows take 11 tiles of 6.
constexpr int MR = kTileRows;

// ---- Block sizes (upper bounds; see split_evenly) ---------------------------------------------
// KC: the depth of one pass. A B micro-panel is KC×NR floats: 16 KiB with AVX2, in L1; 64 KiB
//     with AVX-512, which spills to L2, but L2 delivers the 4 B vectors per 24 FMAs in time.
//     Longer passes mean fewer loads and stores of the C tile; shorter ones, smaller panels.
// MC: the packed A block (MC×KC floats, 240 KiB) stays in the 1 MiB L2 while the B
//     micro-panels stream past it.
// NC: the packed B block (KC×NC floats, up to 4 MiB) stays in L3.
// The blocks are not sharp optima: the shape of the micro-tile matters more than KC and MC.
constexpr int64_t KC_MAX = 256;
constexpr int64_t MC_MAX = 240;
constexpr int64_t NC_MAX = 4096;
// Below this many flops (2·M·N·K) the product runs on one thread: a 128³ product takes ~30 µs
// on one core; waking the pool's workers costs ~5 µs, more on a busy machine.
constexpr double PARALLEL_MIN_FLOPS = 2.0 * 128 * 128 * 128;
// The least work of one rectangle of C on the pool (rectangles_for, gemm_blocks.h): a small
// product cut into many rectangles pays more in packing and waking threads than it gains, while a
// large one cut finely balances better when a core is busy with something else.
constexpr double RECTANGLE_MIN_FLOPS = 2.0 * 256 * 256 * 256;

// The most floats op(A) and op(B) of a product may hold together to be read in place ("Small
// products"): 2 MiB. Below it the operands stay in cache and packing them is pure overhead (most
// for the small conv products of LeNet); above it packing wins, as B's rows lie pages apart.
constexpr int64_t IN_PLACE_MAX_FLOATS = int64_t(1) << 19;

// ---- Workspace: the packing buffers ---------------------------------------------------------
// One pair of buffers per thread (≤ 240 KiB for A, ≤ 4 MiB for B), kept between calls
// (and, for an f16 or bf16 GEMM, the calling thread's M×N f32 product and each thread's
// widened Aᵀ block, ≤ 240 KiB):
// allocating them each time would cost more than a small product. The pool keeps its worker
// threads alive between loops, so their buffers live on too.
struct AlignedFree {
    void operator()(float* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<float[], AlignedFree>;

float* reserve(Buffer& buf, int64_t& capacity, int64_t floats) {
    if (floats > capacity) {
        const size_t bytes = (static_cast<size_t>(floats) * sizeof(float) + 63) / 64 * 64;
        buf.reset(static_cast<float*>(std::aligned_alloc(64, bytes)));
        KILN_CHECK(buf != nullptr, "gemm: cannot allocate a ", bytes, "-byte packing buffer");
        capacity = floats;
    }
    return buf.get();
}

struct Workspace {
    Buffer a, b, c;  // c: the f32 product of an f16 or bf16 GEMM (the calling thread's)
    Buffer a32;      // an f16 or bf16 Aᵀ block widened to f32 (see pack_a_block)
    Buffer packed;   // the buffer of the last PackedA this thread made, for the next one
    int64_t a_cap = 0, b_cap = 0, c_cap = 0, a32_cap = 0, packed_cap = 0;
};
thread_local Workspace tls_workspace;

// ---- Packing -----------------------------------------------------------------------------------
// The packers read the operands one contiguous run at a time (a row of at most KC_MAX
// elements, or the MR or NR consecutive ones of one k) through as_f32: a float run is read where
// it is; an f16 or bf16 run is first widened into the packer's scratch by `widen`, the
// conversion kernel of the CPU's level (null for float). (An f16 or bf16 Aᵀ, whose runs would
// be MR long, is widened a whole block at a time instead: see pack_a_block.)
template <typename T>
using Widen = void (*)(const T* x, float* y, int64_t n);

template <typename T>
const float* as_f32(const T* src, int64_t n, [[maybe_unused]] Widen<T> widen, float* scratch) {
    if constexpr (std::is_same_v<T, float>) {
        return src;
    } else {
        widen(src, scratch, n);
        return scratch;
    }
}

// Pack rows [i0, i0+mr) × columns [k0, k0+kc) of op(A) as one micro-panel:
//   Ap[k*MR + i] = op(A)[i0+i, k0+k],  rows i >= mr filled with 0.
template <typename T>
void pack_a_panel(bool trans_a, const T* A, int64_t lda, int64_t i0, int64_t mr,
                  int64_t k0, int64_t kc, Widen<T> widen, float* Ap) {
    alignas(64) float scratch[KC_MAX];  // kc, mr <= KC_MAX
    if (trans_a) {  // op(A)[i,k] = A[k*lda + i]: MR consecutive floats per k
        for (int64_t k = 0; k < kc; ++k) {
            const float* src = as_f32(A + (k0 + k) * lda + i0, mr, widen, scratch);
            float* dst = Ap + k * MR;
            for (int64_t i = 0; i < mr; ++i) dst[i] = src[i];
            for (int64_t i = mr; i < MR; ++i) dst[i] = 0.0f;
        }
    } else {  // op(A)[i,k] = A[i*lda + k]: read rows, write with stride MR
        for (int64_t i = 0; i < mr; ++i) {
            const float* src = as_f32(A + (i0 + i) * lda + k0, kc, widen, scratch);
            for (int64_t k = 0; k < kc; ++k) Ap[k * MR + i] = src[k];
        }
        for (int64_t i = mr; i < MR; ++i)
            for (int64_t k = 0; k < kc; ++k) Ap[k * MR + i] = 0.0f;
    }
}

// dst[0 .. n) = src[0 .. n). n is nearly always a micro-kernel's NR (8, 16 or 64 floats): as a
// constant, the copy is a few vector moves inline; std::copy_n of a run-time n was a call to
// memmove per 16 floats (3% of a CIFAR net's step).
inline void copy_floats(const float* src, int64_t n, float* dst) {
    switch (n) {
        case 8: std::memcpy(dst, src, 8 * sizeof(float)); return;
        case 16: std::memcpy(dst, src, 16 * sizeof(float)); return;
        case 64: std::memcpy(dst, src, 64 * sizeof(float)); return;
        default: std::copy_n(src, n, dst);
    }
}

// The cache lines of x[0 .. n), asked for ahead of use. A B that is not transposed is read in runs
// of n ≤ KC_MAX elements, one per row, each row in another page: the hardware prefetcher learns
// a run only as it ends, so without help every run starts with a wait for L3 or memory. Asking for
// the run kPrefetchRows rows ahead hides it (on a Zen 3, packing was a quarter of the 64×4096×576
// product's time; prefetch_tile below gives the figures).
constexpr int64_t kPrefetchRows = 8;

template <typename T>
[[gnu::always_inline]] inline void prefetch_run(const T* x, int64_t n) {
    constexpr int64_t kLine = 64 / sizeof(T);  // elements per 64-byte line
    for (int64_t j = 0; j < n; j += kLine) __builtin_prefetch(x + j);
    __builtin_prefetch(x + n - 1);  // the last line, when x does not start one
}

// Pack rows [k0, k0+kc) × columns [j0, j0+n) of op(B), n <= KC_MAX, as micro-panels of NR
// columns, the micro-kernel's width:
//   Bp[q*kc*NR + k*NR + j] = op(B)[k0+k, j0 + q*NR + j],  columns past n filled with 0.
// A B that is not transposed is read a row at a time, n floats left to right. Read one panel
// at a time instead, its NR floats of each row lie ldb floats apart, each row in another
// page: no prefetcher follows such a stride, and the copy would wait for memory once per row
// (on the 64×4096×576 product of a conv layer, that wait took twice the multiply's time).
template <typename T>
void pack_b_panels(bool trans_b, const T* B, int64_t ldb, int64_t k0, int64_t kc, int64_t j0,
                   int64_t n, const MicroKernel& mk, Widen<T> widen, float* Bp) {
    alignas(64) float scratch[KC_MAX];  // kc, n <= KC_MAX
    const int64_t NR = mk.cols;
    for (int64_t q = 0; q * NR < n; ++q) {  // zero the columns past n in the last panel
        const int64_t cols = std::min(NR, n - q * NR);
        for (int64_t k = 0; cols < NR && k < kc; ++k)
            std::fill(Bp + q * kc * NR + k * NR + cols, Bp + q * kc * NR + (k + 1) * NR, 0.0f);
    }
    if constexpr (std::is_same_v<T, float>) {
        if (trans_b) {  // the kernel's own transposing copy, a panel at a time (gemm_tile.h)
            for (int64_t q = 0; q * NR < n; ++q)
                mk.pack_b_transposed(kc, B + (j0 + q * NR) * ldb + k0, ldb, std::min(NR, n - q * NR),
                                     Bp + q * kc * NR);
            return;
        }
    }
    if (trans_b) {  // f16, bf16: op(B)[k,j] = B[j*ldb + k]: 8 rows of B widened, then the same copy
        // (Each widened row written down its panel column, NR floats apart, was 14% of LeNet's
        // f16 training step.) NR is a multiple of 8: 8 rows never straddle two panels.
        alignas(64) float rows[8][KC_MAX];
        for (int64_t j = 0; j < n; j += 8) {
            const int64_t count = std::min<int64_t>(8, n - j);
            for (int64_t i = 0; i < count; ++i) widen(B + (j0 + j + i) * ldb + k0, rows[i], kc);
            mk.pack_b_transposed(kc, rows[0], KC_MAX, count, Bp + (j / NR) * kc * NR + j % NR);
        }
    } else {  // op(B)[k,j] = B[k*ldb + j]: n consecutive floats per k, NR to each panel
        for (int64_t k = 0; k < kc; ++k) {
            if (k + kPrefetchRows < kc) prefetch_run(B + (k0 + k + kPrefetchRows) * ldb + j0, n);
            const float* src = as_f32(B + (k0 + k) * ldb + j0, n, widen, scratch);
            for (int64_t q = 0; q * NR < n; ++q)
                copy_floats(src + q * NR, std::min(NR, n - q * NR), Bp + q * kc * NR + k * NR);
        }
    }
}

// ---- Prefetching C -------------------------------------------------------------------------------
// The rows of a C tile are ldc floats apart, each in another page: nothing brings them into the
// cache before the micro-kernel's store reads them, and each would be a wait for memory. Asking
// for them before the micro-kernel runs hides that wait behind its ~kc·12 FMAs.
// Both prefetchers in this file are forced inline: GCC sees a function that does nothing but
// prefetch as one without effects ("looping const") and deletes every call to it at -O2.
[[gnu::always_inline]] inline void prefetch_tile(const float* C, int64_t ldc, int64_t mr, int64_t nr) {
    for (int64_t i = 0; i < mr; ++i) {
        __builtin_prefetch(C + i * ldc, 1);           // 1: for writing
        __builtin_prefetch(C + i * ldc + nr - 1, 1);  // the row's last line
    }
}

// ---- Argument checks and the trivial cases ----------------------------------------------------
void check_args(const char* fn, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                const void* A, int64_t lda, const void* B, int64_t ldb, const void* C,
                int64_t ldc) {
    KILN_CHECK(M >= 0 && N >= 0 && K >= 0, fn, ": negative size M=", M, " N=", N, " K=", K);
    const int64_t a_cols = trans_a ? M : K, b_cols = trans_b ? K : N;
    KILN_CHECK(lda >= a_cols, fn, ": lda=", lda, " < ", a_cols, ", the row length of A (",
               trans_a ? "K×M, trans_a" : "M×K", "); lda is the distance between rows");
    KILN_CHECK(ldb >= b_cols, fn, ": ldb=", ldb, " < ", b_cols, ", the row length of B (",
               trans_b ? "N×K, trans_b" : "K×N", "); ldb is the distance between rows");
    KILN_CHECK(ldc >= N, fn, ": ldc=", ldc, " < N=", N, ", the row length of C");
    KILN_CHECK(M * N == 0 || C != nullptr, fn, ": C is null for a ", M, "×", N, " result");
    KILN_CHECK(M * N * K == 0 || (A != nullptr && B != nullptr), fn, ": A or B is null (M=", M,
               " N=", N, " K=", K, ")");
}

// C = beta * C (C = 0 when beta == 0, whatever C held).
template <typename T>
void scale_c(int64_t M, int64_t N, float beta, T* C, int64_t ldc) {
    for (int64_t i = 0; i < M; ++i) {
        T* c = C + i * ldc;
        if (beta == 0.0f)
            std::fill(c, c + N, T(0.0f));
        else if (beta != 1.0f)
            for (int64_t j = 0; j < N; ++j) c[j] = T(float(c[j]) * beta);
    }
}

// ---- The blocked product, on one thread ------------------------------------------------------
// A and B hold T (float, f16 or bf16); C is f32 (see "f16 and bf16" above).
template <typename T>
struct Problem {
    bool trans_a, trans_b;
    int64_t M, N, K;
    float alpha;
    const T* A;
    int64_t lda;
    const T* B;
    int64_t ldb;
    float beta;
    float* C;
    int64_t ldc;
    Widen<T> widen = nullptr;  // f16/bf16 -> f32 for the packers (unused for float)
    const MicroKernel* kernel = nullptr;  // the CPU level's
    const PackedA* packed_a = nullptr;    // A already packed (then A is not read) ...
    int64_t row0 = 0;                     // ... and the row of it where this problem's rows start
    Interleave pairs = nullptr;           // bf16 packed as pairs for the vdpbf16ps kernel: the
                                          // interleave of two rows (convert_simd.h), else null
    bool in_place = false;                // a small f32 product: operands read where they lie
};

// ---- bf16 pairs ---------------------------------------------------------------------------------
// The AVX512-BF16 kernel (gemm_tile_avx512bf16.cpp) multiplies bf16 as they are, two k at a time:
// each 32-bit slot of its panels holds the bf16 of k (low half) and of k+1 (high half), so a
// panel of kc values of k takes (kc+1)/2 slots, a zero in the high half of the last when kc is
// odd. A row of MR (or NR) slots is as wide in bytes as one f32 row, so the buffers, the five
// loops and the kernel's interface are those of f32, with (kc+1)/2 for kc. Nothing is widened:
// the packers copy bits, two rows into one (B's rows, a transposed A's) by convert_simd.h's
// interleave_kernel, 16 slots a vector with AVX-512.
//   Ap[kp·MR + i] = op(A)[i0+i, k0+2kp] | op(A)[i0+i, k0+2kp+1] << 16
//   Bp[q·kps·NR + kp·NR + j] = the same for op(B)[k0+2kp .., j0 + q·NR + j]
int64_t pair_depth(int64_t kc) { return (kc + 1) / 2; }

// The slot of the pair (x[0], x[1] if `both`, else 0).
inline uint32_t pair_at(const bf16* x, bool both) { return x[0].bits | (both ? uint32_t(x[1].bits) << 16 : 0u); }

// One MR-row panel of op(A)[i0.., k0..k0+kc), rows past mr zero. op(A)[i, k] = A[i·lda + k], a
// row's pairs side by side in memory, unless trans_a (A[k·lda + i]: two rows of A interleaved).
// Side by side, with an even lda and an even kc, a full panel is the f32 transposing copy of
// 32-bit words, lda/2 apart from one row to the next (as pack_b_pairs' transposed B).
void pack_a_pairs(bool trans_a, const bf16* A, int64_t lda, int64_t i0, int64_t mr, int64_t k0, int64_t kc,
                  const MicroKernel& mk, Interleave interleave_rows, float* Ap) {
    if (!trans_a && mr == MR && lda % 2 == 0 && kc % 2 == 0)
        return mk.pack_a_rows(pair_depth(kc), reinterpret_cast<const float*>(A + i0 * lda + k0), lda / 2, Ap);
    std::fill(Ap, Ap + pair_depth(kc) * MR, 0.0f);  // all-zero bits: the rows past mr, as bf16 zeros
    for (int64_t kp = 0; kp < pair_depth(kc); ++kp) {
        const int64_t k = k0 + 2 * kp;
        const bool both = 2 * kp + 1 < kc;
        if (trans_a) {
            interleave_rows(A + k * lda + i0, both ? A + (k + 1) * lda + i0 : nullptr, mr, Ap + kp * MR);
        } else {
            for (int64_t i = 0; i < mr; ++i) {
                const uint32_t v = pair_at(A + (i0 + i) * lda + k, both);
                std::memcpy(Ap + kp * MR + i, &v, sizeof v);
            }
        }
    }
}

// The NR-column panels of op(B)[k0..k0+kc, j0..j0+n), columns past n zero. op(B)[k, j] = B[k·ldb + j]
// (two rows of B interleaved) unless trans_b (B[j·ldb + k]: a column's pairs side by side).
// With trans_b, an even ldb and an even kc (gemm picks even KC-blocks for pairs), the pairs are
// 32-bit words, ldb/2 apart from one column to the next: the f32 transposing copy packs them.
void pack_b_pairs(bool trans_b, const bf16* B, int64_t ldb, int64_t k0, int64_t kc, int64_t j0, int64_t n,
                  const MicroKernel& mk, Interleave interleave_rows, float* Bp) {
    const int64_t NR = mk.cols, kps = pair_depth(kc);
    for (int64_t q = 0; q * NR < n; ++q) {
        const int64_t cols = std::min(NR, n - q * NR), jq = j0 + q * NR;
        float* panel = Bp + q * kps * NR;
        if (cols < NR) std::fill(panel, panel + kps * NR, 0.0f);
        if (trans_b && ldb % 2 == 0 && kc % 2 == 0) {
            mk.pack_b_transposed(kps, reinterpret_cast<const float*>(B + jq * ldb + k0), ldb / 2, cols, panel);
        } else if (trans_b) {
            // An odd ldb (or kc): from one column to the next the pairs shift by half a word. So
            // each column's kc elements are copied first, 8 columns at a time, into rows KC_MAX
            // elements apart (a zero after an odd kc), and packed from there as words. (Element by
            // element, this packing took 6% of a bf16 training step of the CIFAR net on a Zen 5:
            // the weight gradients of its 31×31, 15×15 and 7×7 planes have odd ldb.)
            uint16_t rows[8 * KC_MAX];
            for (int64_t j = 0; j < cols; j += 8) {
                const int64_t m = std::min<int64_t>(8, cols - j);
                for (int64_t r = 0; r < m; ++r) {
                    std::memcpy(rows + r * KC_MAX, B + (jq + j + r) * ldb + k0, size_t(kc) * sizeof(bf16));
                    if (kc % 2) rows[r * KC_MAX + kc] = 0;
                }
                mk.pack_b_transposed(kps, reinterpret_cast<const float*>(rows), KC_MAX / 2, m, panel + j);
            }
        } else {
            for (int64_t kp = 0; kp < kps; ++kp) {
                const bf16* x0 = B + (k0 + 2 * kp) * ldb + jq;
                interleave_rows(x0, 2 * kp + 1 < kc ? x0 + ldb : nullptr, cols, panel + kp * NR);
            }
        }
    }
}

// Pack op(A)[ic:ic+mc, pc:pc+kc] into Ap, one MR-row micro-panel after another.
// An f16 or bf16 Aᵀ would be widened MR elements at a time, too few for the vector kernels:
// its block (kc rows of mc elements in A) is widened to f32 first, then packed as an f32 Aᵀ.
template <typename T>
void pack_a_block(const Problem<T>& p, int64_t ic, int64_t mc, int64_t pc, int64_t kc, float* Ap) {
    if constexpr (std::is_same_v<T, bf16>) {
        if (p.pairs) {
            for (int64_t i0 = 0; i0 < mc; i0 += MR, Ap += pair_depth(kc) * MR)
                pack_a_pairs(p.trans_a, p.A, p.lda, ic + i0, std::min<int64_t>(MR, mc - i0), pc, kc, *p.kernel, p.pairs, Ap);
            return;
        }
    }
    if constexpr (!std::is_same_v<T, float>) {
        if (p.trans_a) {
            Workspace& ws = tls_workspace;
            float* a32 = reserve(ws.a32, ws.a32_cap, kc * mc);
            for (int64_t k = 0; k < kc; ++k) p.widen(p.A + (pc + k) * p.lda + ic, a32 + k * mc, mc);
            const Problem<float> block{true, false, mc, 0, kc, p.alpha, a32, mc, nullptr, 0, 0.0f, nullptr, 0};
            return pack_a_block(block, 0, mc, 0, kc, Ap);
        }
    }
    for (int64_t i0 = 0; i0 < mc; i0 += MR, Ap += kc * MR) {
        const int64_t mr = std::min<int64_t>(MR, mc - i0);
        if constexpr (std::is_same_v<T, float>) {
            if (!p.trans_a && mr == MR) {  // the kernel's own transposing copy (gemm_tile.h)
                p.kernel->pack_a_rows(kc, p.A + (ic + i0) * p.lda + pc, p.lda, Ap);
                continue;
            }
        }
        pack_a_panel(p.trans_a, p.A, p.lda, ic + i0, mr, pc, kc, p.widen, Ap);
    }
}

// ---- Small products --------------------------------------------------------------------------
// Packing pays when each packed number is read many times: an A panel once per B panel, a B panel
// once per A panel. In a small product it is not: the 64×64×64 product packs 8,192 floats for
// 262,144 multiply-adds, and its A panels are each read by one B panel only; on a Zen 4 core,
// packing took a fifth of its time. And a small product's operands stay in L1 and L2 where they
// lie. So a small f32 product (gemm_in_place) leaves them there: the kernel reads A's rows (or,
// transposed, its columns) and B's rows in place (MicroKernel::multiply_in_place), with the same
// sums in the same order, so the same bits as packed. Only what the kernel cannot read in place
// is packed: a transposed B (its columns are strided) and the last B panel when N is not a
// multiple of NR (its rows would run past B's).

// The tile of C at rows i0.., columns j0.. of the KC-block pc: A read in place unless `Ap` (a
// packed panel: the A of a PackedA), B in place unless it is transposed or the panel is partial,
// when `Bp` holds the panel.
void multiply_in_place(const Problem<float>& p, int64_t i0, int64_t j0, int64_t pc, int64_t kc, const float* Ap,
                       const float* Bp, const TileOut& out) {
    const MicroKernel& mk = *p.kernel;
    const bool b_in_place = !p.trans_b && out.cols == mk.cols;
    const float* B = b_in_place ? p.B + pc * p.ldb + j0 : Bp;
    const int64_t b_k = b_in_place ? p.ldb : mk.cols;
    if (Ap) return mk.multiply_in_place(kc, Ap, 1, MR, B, b_k, out);
    if (p.trans_a) return mk.multiply_in_place(kc, p.A + pc * p.lda + i0, 1, p.lda, B, b_k, out);  // A[k·lda + i]
    mk.multiply_in_place(kc, p.A + i0 * p.lda + pc, p.lda, 1, B, b_k, out);                          // A[i·lda + k]
}

// C[ic:ic+mc, jc:jc+nc] (+)= alpha * Ap · Bp, one MR×NR tile at a time: for each B
// micro-panel (held in L1), sweep all the A micro-panels of the block (held in L2).
// beta is the caller's beta for the first KC-block and 1 for the later ones.
// With pack_b, the B micro-panels op(B)[pc:pc+kc, jc+j0 : jc+j0+KC_MAX] are packed just before
// the first of them is swept (the first A block does this), so they are used while they are
// still in L2; the later A blocks find them packed. When M fits in one A block, B is read from
// memory exactly once, and no later block needs the panels: then every KC_MAX columns are
// packed into the same kc×KC_MAX floats at the start of Bp (one_a_block), which stay in L2. (Packed
// side by side instead, the 64×4096×576 product of a conv layer wrote 3 MB of panels per
// KC-block, each store a miss: a quarter of its time.)
template <typename T>
void multiply_block(const Problem<T>& p, int64_t ic, int64_t mc, int64_t jc, int64_t nc,
                    int64_t pc, int64_t kc, float beta, const float* Ap, float* Bp,
                    bool pack_b, bool one_a_block) {
    const MicroKernel& mk = *p.kernel;
    const int64_t NR = mk.cols;
    const int64_t depth = p.pairs ? pair_depth(kc) : kc;  // rows of a panel
    for (int64_t j0 = 0; j0 < nc; j0 += NR) {
        const int64_t nr = std::min<int64_t>(NR, nc - j0);
        float* bp = Bp + (one_a_block ? j0 % KC_MAX : j0) * depth;  // panel j0/NR, depth×NR floats each
        if (p.in_place && !p.trans_b) {  // full panels in place, the last partial one packed alone
            bp = Bp;
            if (pack_b && nr < NR) pack_b_panels(false, p.B, p.ldb, pc, kc, jc + j0, nr, mk, p.widen, bp);
        } else if (pack_b && j0 % KC_MAX == 0) {  // KC_MAX is a multiple of every NR
            const int64_t n = std::min(KC_MAX, nc - j0);
            if constexpr (std::is_same_v<T, bf16>)
                if (p.pairs) pack_b_pairs(p.trans_b, p.B, p.ldb, pc, kc, jc + j0, n, mk, p.pairs, bp);
            if (!p.pairs) pack_b_panels(p.trans_b, p.B, p.ldb, pc, kc, jc + j0, n, mk, p.widen, bp);
        }
        for (int64_t i0 = 0; i0 < mc; i0 += MR) {
            float* c = p.C + (ic + i0) * p.ldc + jc + j0;
            const int64_t mr = std::min<int64_t>(MR, mc - i0);
            prefetch_tile(c, p.ldc, mr, nr);
            const TileOut out{c, p.ldc, int(mr), int(nr), p.alpha, beta};
            if constexpr (std::is_same_v<T, float>) {
                if (p.in_place) {
                    multiply_in_place(p, ic + i0, jc + j0, pc, kc, Ap ? Ap + i0 * depth : nullptr, bp, out);
                    continue;
                }
            }
            mk.multiply(depth, Ap + i0 * depth, bp, out);
        }
    }
}

// The five loops of the header comment. kc is the KC-block size, the same for every thread
// (it alone fixes the order of the sums); the buffers are the calling thread's own.
template <typename T>
void blocked_gemm(const Problem<T>& p, int64_t kc_block) {
    const int64_t mc_block = split_evenly(p.M, MC_MAX, MR);
    const int64_t nc_block = split_evenly(p.N, NC_MAX, p.kernel->cols);
    Workspace& ws = tls_workspace;
    const bool pack_a = !p.packed_a && !p.in_place;
    float* Ap = pack_a ? reserve(ws.a, ws.a_cap, mc_block * kc_block) : nullptr;
    const bool one_a_block = p.M <= mc_block;  // see multiply_block
    float* Bp = reserve(ws.b, ws.b_cap, kc_block * (one_a_block ? std::min(KC_MAX, nc_block) : nc_block));
    for (int64_t jc = 0; jc < p.N; jc += nc_block) {
        const int64_t nc = std::min(nc_block, p.N - jc);
        for (int64_t pc = 0; pc < p.K; pc += kc_block) {
            const int64_t kc = std::min(kc_block, p.K - pc);
            const float beta = (pc == 0) ? p.beta : 1.0f;
            for (int64_t ic = 0; ic < p.M; ic += mc_block) {
                const int64_t mc = std::min(mc_block, p.M - ic);
                const float* ap = Ap;
                if (p.packed_a)
                    ap = p.packed_a->panel(pc, p.row0 + ic, kc);
                else if (pack_a)
                    pack_a_block(p, ic, mc, pc, kc, Ap);
                multiply_block(p, ic, mc, jc, nc, pc, kc, beta, ap, Bp, /*pack_b=*/ic == 0, one_a_block);
            }
        }
    }
}

// ---- Threads: each rectangle of C is one task (gemm_blocks.h) ---------------------------------
// The sub-problem C[i0:i1, j0:j1] = alpha op(A)[i0:i1, :] op(B)[:, j0:j1] + beta C[i0:i1, j0:j1].
template <typename T>
Problem<T> sub_problem(const Problem<T>& p, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
    Problem<T> s = p;
    s.M = i1 - i0;
    s.N = j1 - j0;
    s.row0 = p.row0 + i0;
    if (!p.packed_a) s.A = p.trans_a ? p.A + i0 : p.A + i0 * p.lda;
    s.B = p.trans_b ? p.B + j0 * p.ldb : p.B + j0;
    s.C = p.C + i0 * p.ldc + j0;
    return s;
}

template <typename T>
void parallel_gemm(const Problem<T>& p, int64_t kc_block, int threads) {
    const int64_t wanted = rectangles_for(2.0 * p.M * p.N * p.K, threads, RECTANGLE_MIN_FLOPS);
    const int64_t NR = p.kernel->cols;
    const Grid g = choose_grid(p.M, p.N, MR, NR, wanted);
    const int64_t parts = g.tm * g.tn;
    parallel_chunks(parts, [&](int64_t r) {
        int64_t i0, i1, j0, j1;
        split_range(p.M, MR, g.tm, r / g.tn, i0, i1);
        split_range(p.N, NR, g.tn, r % g.tn, j0, j1);
        if (i0 < i1 && j0 < j1) blocked_gemm(sub_problem(p, i0, i1, j0, j1), kc_block);
    });
}

// The threads a product of M×N×K may use: 1 when it is small (waking the pool would cost more
// than it saves) or runs inside a parallel loop.
int threads_for(int64_t M, int64_t N, int64_t K) {
    return in_parallel() || 2.0 * M * N * K < PARALLEL_MIN_FLOPS ? 1 : max_threads();
}

// The blocked product, on one thread or on the pool. The columns past the last multiple of the
// kernel's NR go to the kernel micro_kernel(level, N) picks for as few columns, when that is a
// narrower one (the same bits, gemm_tile.h): the last 16 of 784 columns are then 6×16 tiles of
// "avx512-16", not 6×64 ones of "avx512" with a quarter of their columns used.
template <typename T>
void product(const Problem<T>& p, CpuLevel level) {
    const int64_t tail = p.N % p.kernel->cols;
    const MicroKernel& tail_kernel = micro_kernel(level, tail);
    if (!p.pairs && tail > 0 && p.N > tail && &tail_kernel != p.kernel) {
        product(sub_problem(p, 0, p.M, 0, p.N - tail), level);
        Problem<T> rest = sub_problem(p, 0, p.M, p.N - tail, p.N);
        rest.kernel = &tail_kernel;
        return product(rest, level);
    }
    // KC depends on K only, never on the thread count: this is what makes C deterministic.
    const int64_t kc_block = split_evenly(p.K, KC_MAX, p.pairs ? 2 : 1);
    const int threads = threads_for(p.M, p.N, p.K);
    if (threads == 1)
        blocked_gemm(p, kc_block);
    else
        parallel_gemm(p, kc_block, threads);
}

// C = T(acc + beta·C), one rounding per element (C is not read when beta == 0), a row at a
// time: acc += beta·C in f32 (C widened KC_MAX elements at a time), then the row narrowed.
// acc's rows are ld_acc floats apart.
template <typename T>
void round_into(int64_t M, int64_t N, float* acc, int64_t ld_acc, float beta, T* C, int64_t ldc, Widen<T> widen,
                void (*narrow)(const float*, T*, int64_t)) {
    alignas(64) float c32[KC_MAX];
    for (int64_t i = 0; i < M; ++i) {
        float* a = acc + i * ld_acc;
        T* c = C + i * ldc;
        for (int64_t j0 = 0; beta != 0.0f && j0 < N; j0 += KC_MAX) {
            const int64_t n = std::min(KC_MAX, N - j0);
            widen(c + j0, c32, n);
            for (int64_t j = 0; j < n; ++j) a[j0 + j] = std::fma(beta, c32[j], a[j0 + j]);
        }
        narrow(a, c, N);
    }
}

// bf16 on AMX tiles (gemm_amx.h): the f32 product alpha·op(A)·op(B) in a buffer of whole 32×32
// blocks, then C = bf16(product + beta·C) as on the other paths.
void run_amx(const AmxKernel& amx, const Problem<bf16>& p, bf16* C, int64_t ldc, CpuLevel level) {
    Workspace& ws = tls_workspace;
    const int64_t ld = amx_padded(p.N);
    float* acc = reserve(ws.c, ws.c_cap, amx_padded(p.M) * ld);
    const bf16* tiles = p.packed_a ? p.packed_a->amx_tiles() : nullptr;
    amx_product(amx, AmxProblem{p.trans_a, p.trans_b, p.M, p.N, p.K, p.alpha, p.A, p.lda, tiles, p.B, p.ldb, acc, ld},
                threads_for(p.M, p.N, p.K));
    round_into(p.M, p.N, acc, ld, p.beta, C, ldc, convert_kernel<bf16, float>(level).run,
               convert_kernel<float, bf16>(level).run);
}

// Runs p (C not yet set) into C on the CPU's level: for float, straight into C; for f16 and
// bf16, the f32 product alpha·op(A)·op(B), then C = T(product + beta·C).
template <typename T>
void run(Problem<T> p, T* C, int64_t ldc) {
    const CpuLevel level = cpu_level();  // read once: one path for the whole product
    p.kernel = &micro_kernel(level, p.N);  // a narrower kernel for a narrow product
    if constexpr (std::is_same_v<T, bf16>) {  // a PackedA was packed for its own kernel
        const AmxKernel* amx = p.packed_a ? p.packed_a->amx_tile_kernel() : amx_kernel(level);
        if (amx) return run_amx(*amx, p, C, ldc, level);
        const MicroKernel* pairs = p.packed_a ? p.packed_a->pair_kernel() : bf16_pair_kernel(level);
        if (pairs) p.kernel = pairs, p.pairs = interleave_kernel(level).run;
    }
    if constexpr (std::is_same_v<T, float>) {
        p.C = C, p.ldc = ldc;
        p.in_place = gemm_in_place(p.M, p.N, p.K);
        product(p, level);
    } else {
        p.widen = convert_kernel<T, float>(level).run;
        Workspace& ws = tls_workspace;
        const float beta = p.beta;
        p.C = reserve(ws.c, ws.c_cap, p.M * p.N), p.ldc = p.N, p.beta = 0.0f;
        product(p, level);
        round_into(p.M, p.N, p.C, p.N, beta, C, ldc, p.widen, convert_kernel<float, T>(level).run);
    }
}

}  // namespace

bool gemm_in_place(int64_t M, int64_t N, int64_t K) { return M * K + K * N <= IN_PLACE_MAX_FLOATS; }

// ---- PackedA (gemm.h) -----------------------------------------------------------------------------
// The KC-blocks of K one after another; in each, the MR-row micro-panels of all M rows, as
// pack_a_block lays out one MC block:
//   data[pc·Mp + r·kc + k·MR + i] = op(A)[r + i, pc + k],   Mp = M rounded up to MR
// so the panel of rows r.. of a KC-block is at pc·Mp + r·kc, whatever MC block it falls in, and
// a rectangle of C (its rows start at a multiple of MR: parallel_gemm) finds its panels there.
// A bf16 A on a CPU whose bf16 GEMM takes AMX tiles is packed as AMX tiles instead (gemm_amx.h).
template <typename T>
PackedA::PackedA(bool trans_a, int64_t M, int64_t K, const T* A, int64_t lda)
    : M_(M), K_(K), padded_rows_((M + MR - 1) / MR * MR), data_(nullptr), capacity_(0) {
    check_args("PackedA", trans_a, false, M, 0, K, A, lda, A, 0, nullptr, 0);
    KILN_CHECK(M * K == 0 || A != nullptr, "PackedA: A is null for a ", M, "×", K, " matrix");
    const CpuLevel level = cpu_level();  // read once: one path for the whole packing
    if constexpr (std::is_same_v<T, bf16>) amx_ = amx_kernel(level);
    Workspace& ws = tls_workspace;
    const int64_t floats = std::max<int64_t>(1, amx_ ? (amx_packed_a_elems(M, K) + 1) / 2 : padded_rows_ * K);
    reserve(ws.packed, ws.packed_cap, floats);
    data_ = ws.packed.release(), capacity_ = ws.packed_cap, ws.packed_cap = 0;  // ours until ~PackedA
    if constexpr (std::is_same_v<T, bf16>) {
        if (amx_) {  // 32 rows (two tiles' worth) per task, KC-block after KC-block
            bf16* tiles = reinterpret_cast<bf16*>(data_);
            for (int64_t pc = 0; pc < K; pc += amx_kc_block(K))
                parallel_for(amx_padded(M) / kAmxBlock, 4, [&](int64_t q0, int64_t q1) {
                    amx_pack_a_rows(trans_a, A, lda, M, K, pc, q0 * kAmxBlock, std::min(M, q1 * kAmxBlock), tiles);
                });
            return;
        }
    }
    Problem<T> p{trans_a, false, M, 0, K, 1.0f, A, lda, nullptr, 0, 0.0f, nullptr, 0};
    p.kernel = &micro_kernel(level);  // its packers
    if constexpr (!std::is_same_v<T, float>) p.widen = convert_kernel<T, float>(level).run;
    if constexpr (std::is_same_v<T, bf16>) {
        pairs_ = bf16_pair_kernel(level);
        if (pairs_) p.pairs = interleave_kernel(level).run;
    }
    const int64_t kc_block = split_evenly(K, KC_MAX, p.pairs ? 2 : 1), panels = padded_rows_ / MR;
    for (int64_t pc = 0; pc < K; pc += kc_block) {
        const int64_t kc = std::min(kc_block, K - pc);
        parallel_for(panels, 16, [&](int64_t q0, int64_t q1) {
            const int64_t r0 = q0 * MR, r1 = std::min(M, q1 * MR);
            pack_a_block(p, r0, r1 - r0, pc, kc, const_cast<float*>(panel(pc, r0, kc)));
        });
    }
}

// Gives the buffer back to this thread's workspace for the next PackedA (unless it keeps a bigger one).
PackedA::~PackedA() {
    Workspace& ws = tls_workspace;
    if (capacity_ > ws.packed_cap) {
        ws.packed.reset(data_);
        ws.packed_cap = capacity_;
    } else {
        std::free(data_);
    }
}

template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const T* A, int64_t lda, const T* B, int64_t ldb, float beta, T* C,
          int64_t ldc) {
    check_args("gemm", trans_a, trans_b, M, N, K, A, lda, B, ldb, C, ldc);
    if (M == 0 || N == 0) return;
    if (K == 0 || alpha == 0.0f) return scale_c(M, N, beta, C, ldc);
    run(Problem<T>{trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, nullptr, 0}, C, ldc);
}

template <typename T>
void gemm_packed(const PackedA& A, bool trans_b, int64_t N, float alpha, const T* B, int64_t ldb, float beta, T* C,
                 int64_t ldc) {
    const int64_t M = A.rows(), K = A.depth();
    check_args("gemm (packed A)", false, trans_b, M, N, K, &A, K, B, ldb, C, ldc);
    if (M == 0 || N == 0) return;
    if (K == 0 || alpha == 0.0f) return scale_c(M, N, beta, C, ldc);
    KILN_CHECK(!(A.pair_kernel() || A.amx_tile_kernel()) || (std::is_same_v<T, bf16>),
               "gemm (packed A): this PackedA holds ", A.amx_tile_kernel() ? "AMX tiles" : "bf16 pairs",
               " (made from a bf16 A on a CPU with ", A.amx_tile_kernel() ? "AMX" : "AVX512-BF16",
               "); multiply it by a bf16 B, or pack A from f32");
    Problem<T> p{false, trans_b, M, N, K, alpha, nullptr, K, B, ldb, beta, nullptr, 0};
    p.packed_a = &A;
    run(p, C, ldc);
}

// v1 of the header comment: one dot product per C element, k in order.
template <typename T>
void gemm_reference(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                    const T* A, int64_t lda, const T* B, int64_t ldb, float beta,
                    T* C, int64_t ldc) {
    check_args("gemm_reference", trans_a, trans_b, M, N, K, A, lda, B, ldb, C, ldc);
    for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
            float sum = 0.0f;
            for (int64_t k = 0; k < K; ++k) {
                const float a = float(trans_a ? A[k * lda + i] : A[i * lda + k]);
                const float b = float(trans_b ? B[j * ldb + k] : B[k * ldb + j]);
                sum += a * b;
            }
            T& c = C[i * ldc + j];
            c = T((beta == 0.0f) ? alpha * sum : alpha * sum + beta * float(c));
        }
}

template <typename T>
const char* gemm_path(CpuLevel level) {
    if constexpr (std::is_same_v<T, float>) {
        return micro_kernel(level).name;
    } else if (const AmxKernel* amx = std::is_same_v<T, bf16> ? amx_kernel(level) : nullptr) {
        return amx->name;
    } else if (const MicroKernel* pairs = std::is_same_v<T, bf16> ? bf16_pair_kernel(level) : nullptr) {
        return pairs->name;
    } else {
        return convert_kernel<T, float>(level).name;
    }
}

KILN_INSTANTIATE_FLOAT(gemm);
KILN_INSTANTIATE_FLOAT(gemm_packed);
KILN_INSTANTIATE_FLOAT(gemm_path);
KILN_INSTANTIATE_FLOAT(gemm_reference);
#define KILN_PACKED_A(T) template PackedA::PackedA(bool, int64_t, int64_t, const T*, int64_t);
KILN_FOR_EACH_FLOAT_TYPE(KILN_PACKED_A)

}  // namespace kiln::cpu
