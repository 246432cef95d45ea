// qgemm.cpp — the int8 matrix product C = A · Bᵀ (u8 × i8 → int32) on the CPU (chapter 11).
// The formula and its contract are in quant_ops.h.
#include "ops/cpu/quant_ops.h"

namespace kiln::cpu {

// The portable path: one dot product per C element, rows of C split over the threads.
void qgemm_u8s8(int64_t M, int64_t N, int64_t K, const uint8_t* A, int64_t lda, const int8_t* B, int64_t ldb,
                int32_t* C, int64_t ldc, int32_t /*a_max*/) {
#pragma omp parallel for schedule(static)
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            int32_t acc = 0;
            for (int64_t k = 0; k < K; k++) acc += int32_t(A[m * lda + k]) * int32_t(B[n * ldb + k]);
            C[m * ldc + n] = acc;
        }
}

}  // namespace kiln::cpu
