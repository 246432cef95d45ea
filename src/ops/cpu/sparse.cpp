// sparse.cpp — y = x · Wᵀ + b with W in compressed sparse rows (ops/sparse.h), on the CPU
// (chapter 10).
//
//   y[n, o] = Σ_{k in row o} values[k] · x[n, col_index[k]]  (+ b[o])
//
// A nonzero (o, c, v) of W touches one column of x — x[:, c], a strided gather in x's
// row-major layout — and one column of y. So the batch is cut into panels of L = 16 rows and
// each panel is transposed once ("packed"), the way a GEMM packs its operands:
//
//   panel[c][j] = x[n0 + j, c]        [in, L]: column c of the panel's x is L contiguous floats
//
// Then an output row o of the panel is, for each nonzero of W's row o, one L-wide
// multiply-add of a broadcast value with one contiguous load, into L accumulators that stay
// in registers (two 8-float vectors) until the row is done:
//
//   acc[0..L) = Σ_k values[k] · panel[col_index[k]][0..L)      y[n0 + j, o] = acc[j] + b[o]
//
// Why this shape, against the alternatives (each one slower on an AVX2 CPU):
//   - L = 16, not 8: each nonzero's index and value are read once per 16 batch rows;
//   - nor 24 or 32: three or four vectors of accumulators crowd the registers;
//   - not yᵀ = W · xᵀ as AXPYs over the whole batch (yᵀ[o, :] += v · xᵀ[c, :]): y's row would
//     be read and written once per nonzero instead of held in registers;
//   - not one dot product per (n, o) gathering x[n, col_index[k]] unpacked: a gather per term;
//   - one sum per row, not two partial sums (even and odd k): the terms stay in the CUDA twin's
//     order, so both give the same bits.
// Rows past N in the last panel are packed as zeros and their results never stored; so a batch
// of one uses 1 lane of 16, and would be served better by the dot-product loop above (one
// kernel is kept: the chapter's layers run batches).
//
// Vectors are GCC's vector extensions (as in gemm.cpp's portable micro-kernel): 8 floats, which
// the compiler maps to whatever the -march it was given offers (one AVX register, two SSE or
// NEON registers); no run-time dispatch is needed. (One 16-float vector type instead of two
// 8-float ones compiles far worse for AVX2: 5–8× slower.)
// g++ may fuse a term's product and sum into one FMA where the target has one (it does for
// this loop with -march=native on an AVX2 CPU) or round them apart: the compiler's choice, so
// the CUDA twin, which adds the same terms in the same order, may differ in the last bits.
//
// Threads: panels are packed in parallel, then the (panel, block of 32 output rows) tasks
// are shared among threads — so a batch of one still spreads its rows over the cores. Each
// output is computed by one thread, its terms in k's order: the same bits on any thread count.
#include <algorithm>
#include <cstring>
#include <memory>

#include "core/parallel.h"
#include "ops/sparse.h"

namespace kiln::cpu {
namespace {

constexpr int64_t L = 16;                 // batch rows per panel
constexpr int64_t kRowBlock = 32;         // output rows per task
constexpr int64_t kParallelMin = 1 << 16; // multiply-adds below which one thread is faster

typedef float V8 __attribute__((vector_size(8 * sizeof(float))));  // half a panel row

// panel[c·L + j] = x[j, c] for j < rows, 0 for rows ≤ j < L.   x: [rows, in] (row stride in)
void pack_panel(const float* x, float* panel, int64_t rows, int64_t in) {
    for (int64_t c = 0; c < in; c++)
        for (int64_t j = 0; j < L; j++) panel[c * L + j] = j < rows ? x[j * in + c] : 0.0f;
}

// Output rows [o0, o1) of one panel: y[j, o] for j < rows (y: the panel's first row of y).
void panel_rows(const float* panel, const float* values, const int32_t* col_index, const int32_t* row_start,
                const float* bias, float* y, int64_t rows, int64_t o0, int64_t o1, int64_t out) {
    for (int64_t o = o0; o < o1; o++) {
        V8 lo = {}, hi = {};  // acc[0..8) and acc[8..16)
        for (int32_t k = row_start[o]; k < row_start[o + 1]; k++) {
            const float* xc = panel + int64_t(col_index[k]) * L;
            V8 x_lo, x_hi;
            std::memcpy(&x_lo, xc, sizeof x_lo);  // unaligned-safe: compiles to one vector load
            std::memcpy(&x_hi, xc + 8, sizeof x_hi);
            lo += values[k] * x_lo;
            hi += values[k] * x_hi;
        }
        float acc[L];
        std::memcpy(acc, &lo, sizeof lo);
        std::memcpy(acc + 8, &hi, sizeof hi);
        const float b = bias ? bias[o] : 0.0f;
        for (int64_t j = 0; j < rows; j++) y[j * out + o] = acc[j] + b;
    }
}

}  // namespace

void csr_linear(const float* x, const float* values, const int32_t* col_index, const int32_t* row_start,
                const float* bias, float* y, int64_t N, int64_t in, int64_t out) {
    const int64_t panels = (N + L - 1) / L, row_blocks = (out + kRowBlock - 1) / kRowBlock;
    const std::unique_ptr<float[]> packed(new float[size_t(panels * in * L)]);  // [panels][in][L], all written by pack_panel
    const bool parallel = N * (row_start[out] + in) >= kParallelMin;
    const auto pack = [&](int64_t p) { pack_panel(x + p * L * in, packed.get() + p * in * L, std::min(L, N - p * L), in); };
    const auto multiply = [&](int64_t task) {  // task = one panel of x times one block of rows
        const int64_t p = task / row_blocks, r = task % row_blocks;
        panel_rows(packed.get() + p * in * L, values, col_index, row_start, bias, y + p * L * out,
                   std::min(L, N - p * L), r * kRowBlock, std::min(out, (r + 1) * kRowBlock), out);
    };
    parallel_chunks(panels, pack, parallel);
    parallel_chunks(panels * row_blocks, multiply, parallel);
}

}  // namespace kiln::cpu
