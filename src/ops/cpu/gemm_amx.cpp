// gemm_amx.cpp — the bf16 GEMM on AMX tiles (gemm_amx.h), around the AMX kernel (gemm_tile.h).
//
// ---- Tiles -------------------------------------------------------------------------------------
// tdpbf16ps multiplies a tile of A by a tile of B, each 16 rows of 64 bytes (amx_tiles.h):
//   an A tile: 16 rows of op(A) × 32 values of k, a row of A per tile row:
//       tile[i·32 + kk] = op(A)[i0 + i, k0 + kk]
//   a B tile: 32 values of k × 16 columns of op(B), k in pairs: tile row r holds, for each of
//   its 16 columns, the values of k = 2r and 2r+1 side by side ("VNNI" order):
//       tile[(kk/2)·32 + 2j + kk%2] = op(B)[k0 + kk, j0 + j]
// A tile is 1 KiB and contiguous in the packed blocks, loaded with a stride of 64 bytes. The
// packed A block is its groups of 16 rows one after another, each its tiles along k; the packed B
// block is its groups of 16 columns, each its tiles along k. A 32×32 block of C then reads two
// runs of A tiles and two of B tiles (AmxBlock). Rows and columns past the matrices, and k past
// K, are packed as zeros: the kernel always computes whole 32×32 blocks.
//
// ---- Loops ------------------------------------------------------------------------------------
// gemm.cpp's five loops, with the 32×32 block as the micro-tile:
//   for jc over N, NC at a time            pack op(B)[pc.., jc..]: KC×NC bf16, 512 KiB, in L2
//     for pc over K, KC at a time
//       for ic over M, MC at a time          pack op(A)[ic.., pc..]: MC×KC bf16, 128 KiB
//         for j over NC, 32 at a time          two B runs, 2·KC/32 KiB: in L1 for the sweep
//           for i over MC, 32 at a time          block(): C[ic+i.., jc+j..] (+)= A · B
// A block's C is loaded into the tiles at each KC-block after the first: the sums run over k in
// order whatever the threads, so 1, 2 or 3 threads give the same bits (tested, as gemm.cpp's).
// The sizes follow gemm.cpp's reasoning for Intel's 2 MiB L2; they are not tuned (no machine
// with AMX has run this yet).
#include "ops/cpu/gemm_amx.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/parallel.h"
#include "ops/cpu/gemm_blocks.h"

namespace kiln::cpu {
namespace {

constexpr int64_t KC_MAX = 512, MC_MAX = 128, NC_MAX = 512;
constexpr int64_t kGroup = 16;  // rows of an A tile, columns of a B tile

int64_t steps_of(int64_t kc) { return (kc + kAmxDepth - 1) / kAmxDepth; }

// Where op(A)[i, k] of a packed A block goes (i, k from the block's corner; `steps` tiles per group):
int64_t a_slot(int64_t steps, int64_t i, int64_t k) {
    return (i / kGroup * steps + k / kAmxDepth) * kAmxTileElems + i % kGroup * kAmxDepth + k % kAmxDepth;
}
// ... and op(B)[k, j] of a packed B block.
int64_t b_slot(int64_t steps, int64_t k, int64_t j) {
    return (j / kGroup * steps + k / kAmxDepth) * kAmxTileElems + k % kAmxDepth / 2 * 32 + j % kGroup * 2 + k % 2;
}

// The A tiles of op(A)[i0 .. i0+rows, k0 .. k0+kc): `groups` groups of 16 rows, zero past rows.
// Reads A a row at a time: op(A)'s rows, or with trans_a A's rows (op(A)'s columns).
void pack_a_tiles(bool trans_a, const bf16* A, int64_t lda, int64_t i0, int64_t rows, int64_t groups, int64_t k0,
                  int64_t kc, bf16* out) {
    const int64_t steps = steps_of(kc);
    std::memset(out, 0, size_t(groups * steps * kAmxTileElems) * sizeof(bf16));
    if (trans_a) {  // op(A)[i, k] = A[k·lda + i]
        for (int64_t k = 0; k < kc; ++k)
            for (int64_t i = 0; i < rows; ++i) out[a_slot(steps, i, k)] = A[(k0 + k) * lda + i0 + i];
    } else {  // a tile row is 32 consecutive values of a row of A
        for (int64_t i = 0; i < rows; ++i)
            for (int64_t k = 0; k < kc; k += kAmxDepth)
                std::memcpy(out + a_slot(steps, i, k), A + (i0 + i) * lda + k0 + k,
                            size_t(std::min(kAmxDepth, kc - k)) * sizeof(bf16));
    }
}

// The B tiles of op(B)[k0 .. k0+kc, j0 .. j0+cols): `groups` groups of 16 columns, zero past cols.
void pack_b_tiles(bool trans_b, const bf16* B, int64_t ldb, int64_t k0, int64_t kc, int64_t j0, int64_t cols,
                  int64_t groups, bf16* out) {
    const int64_t steps = steps_of(kc);
    std::memset(out, 0, size_t(groups * steps * kAmxTileElems) * sizeof(bf16));
    if (trans_b) {  // op(B)[k, j] = B[j·ldb + k]
        for (int64_t j = 0; j < cols; ++j)
            for (int64_t k = 0; k < kc; ++k) out[b_slot(steps, k, j)] = B[(j0 + j) * ldb + k0 + k];
    } else {
        for (int64_t k = 0; k < kc; ++k)
            for (int64_t j = 0; j < cols; ++j) out[b_slot(steps, k, j)] = B[(k0 + k) * ldb + j0 + j];
    }
}

// A thread's packing buffers, in whole cache lines (so that no tile row straddles two), kept
// between calls as gemm.cpp's are.
struct alignas(64) Line {
    bf16 x[32];
};
bf16* reserve(std::vector<Line>& buffer, int64_t elems) {
    const size_t lines = size_t((elems + 31) / 32);
    if (buffer.size() < lines) buffer.resize(lines);
    return buffer.front().x;
}
thread_local std::vector<Line> tls_a_block, tls_b_block;

// The tiles are configured for the kernel while a rectangle is computed, and released after it,
// even when the (emulated) kernel throws: a thread holding tiles makes the OS save 8 KiB more at
// each switch.
class TileSession {
public:
    explicit TileSession(const AmxKernel& kernel) : kernel_(kernel) { kernel_.begin(); }
    ~TileSession() { kernel_.end(); }
    TileSession(const TileSession&) = delete;
    TileSession& operator=(const TileSession&) = delete;

private:
    const AmxKernel& kernel_;
};

// C[i0:i1, j0:j1] of the problem (i0, j0 multiples of 32), on the calling thread.
void rectangle(const AmxKernel& kernel, const AmxProblem& p, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
    const TileSession session(kernel);
    const int64_t kc_block = amx_kc_block(p.K);
    bf16* const b_block = reserve(tls_b_block, kc_block * NC_MAX);
    bf16* const a_block = p.packed_a ? nullptr : reserve(tls_a_block, MC_MAX * kc_block);
    for (int64_t jc = j0; jc < j1; jc += NC_MAX) {
        const int64_t nc = std::min(NC_MAX, j1 - jc);
        for (int64_t pc = 0; pc < p.K; pc += kc_block) {
            const int64_t kc = std::min(kc_block, p.K - pc), steps = steps_of(kc), run = steps * kAmxTileElems;
            pack_b_tiles(p.trans_b, p.B, p.ldb, pc, kc, jc, nc, amx_padded(nc) / kGroup, b_block);
            for (int64_t ic = i0; ic < i1; ic += MC_MAX) {
                const int64_t mc = std::min(MC_MAX, i1 - ic);
                const bf16* a = a_block;
                if (p.packed_a)
                    a = p.packed_a + amx_padded(p.M) * pc + ic / kGroup * run;
                else
                    pack_a_tiles(p.trans_a, p.A, p.lda, ic, mc, amx_padded(mc) / kGroup, pc, kc, a_block);
                for (int64_t j = 0; j < nc; j += kAmxBlock)
                    for (int64_t i = 0; i < mc; i += kAmxBlock) {
                        const bf16* at = a + i / kGroup * run;
                        const bf16* bt = b_block + j / kGroup * run;
                        float* c = p.C + (ic + i) * p.ldc + jc + j;
                        kernel.block(AmxBlock{steps, {at, at + run}, {bt, bt + run}, c, p.ldc, pc > 0});
                        if (pc + kc == p.K && p.alpha != 1.0f)  // the last KC-block: C = alpha · Σ
                            for (int64_t r = 0; r < kAmxBlock; ++r)
                                for (int64_t s = 0; s < kAmxBlock; ++s) c[r * p.ldc + s] *= p.alpha;
                    }
            }
        }
    }
}

}  // namespace

int64_t amx_kc_block(int64_t K) { return split_evenly(K, KC_MAX, kAmxDepth); }

// The KC-blocks are laid out one after another, each amx_padded(M) rows deep and a whole number of
// tiles along k, so the block from pc starts at amx_padded(M)·pc and all of them take
// amx_padded(M) · (K rounded up to 32) values.
int64_t amx_packed_a_elems(int64_t M, int64_t K) { return amx_padded(M) * steps_of(K) * kAmxDepth; }

void amx_pack_a_rows(bool trans_a, const bf16* A, int64_t lda, int64_t M, int64_t K, int64_t pc, int64_t r0,
                     int64_t r1, bf16* packed) {
    const int64_t kc = std::min(amx_kc_block(K), K - pc), run = steps_of(kc) * kAmxTileElems;
    pack_a_tiles(trans_a, A, lda, r0, r1 - r0, (amx_padded(r1) - r0) / kGroup, pc, kc,
                 packed + amx_padded(M) * pc + r0 / kGroup * run);
}

void amx_product(const AmxKernel& kernel, const AmxProblem& p, int threads) {
    if (threads <= 1) return rectangle(kernel, p, 0, p.M, 0, p.N);
    const Grid g = choose_grid(p.M, p.N, kAmxBlock, kAmxBlock, 4 * int64_t(threads));
    parallel_chunks(g.tm * g.tn, [&](int64_t r) {
        int64_t i0, i1, j0, j1;
        split_range(p.M, kAmxBlock, g.tm, r / g.tn, i0, i1);
        split_range(p.N, kAmxBlock, g.tn, r % g.tn, j0, j1);
        if (i0 < i1 && j0 < j1) rectangle(kernel, p, i0, i1, j0, j1);
    });
}

}  // namespace kiln::cpu
