// gemm_amx.h — the bf16 GEMM on AMX tiles (chapter 09): operands packed into tiles, and the
// blocked loops around the AMX kernel (gemm_tile.h). gemm<bf16> takes this path where
// amx_kernel() gives a kernel; gemm.h says how the path is picked.
#pragma once
#include <cstdint>

#include "core/dtype.h"
#include "ops/cpu/gemm_tile.h"

namespace kiln::cpu {

// n rounded up to a whole AMX block: the product buffer's rows and columns.
inline int64_t amx_padded(int64_t n) { return (n + kAmxBlock - 1) / kAmxBlock * kAmxBlock; }

// The KC-block for a depth of K: at most 512 values of k, a multiple of kAmxDepth.
int64_t amx_kc_block(int64_t K);

// ---- op(A) packed once (PackedA's AMX layout) -----------------------------------------------------
// KC-block after KC-block; in each, the tiles of 16 rows after another; for 16 rows, the tiles of
// 32 values of k in order. Rows past M (to amx_padded(M)) and k past K are zero.
int64_t amx_packed_a_elems(int64_t M, int64_t K);  // bf16 the layout takes
// Packs the KC-block from pc, rows [r0, r1) (r0 a multiple of 32), into `packed`.
void amx_pack_a_rows(bool trans_a, const bf16* A, int64_t lda, int64_t M, int64_t K, int64_t pc, int64_t r0,
                     int64_t r1, bf16* packed);

// C[0:M, 0:N] = alpha · op(A) · op(B) in f32, op(A) from A or, when packed_a is not null, from a
// layout as above of all M rows (then A is not read). C has amx_padded(M) rows of ldc ≥
// amx_padded(N) floats: the blocks past M and N are computed (on zeros) and stored too. On up to
// `threads` threads (1: the calling thread alone).
struct AmxProblem {
    bool trans_a, trans_b;
    int64_t M, N, K;
    float alpha;
    const bf16* A;
    int64_t lda;
    const bf16* packed_a;
    const bf16* B;
    int64_t ldb;
    float* C;
    int64_t ldc;
};
void amx_product(const AmxKernel& kernel, const AmxProblem& p, int threads);

}  // namespace kiln::cpu
