// gemm.h — the matrix product, declared once for both backends (core/backend.h):
// src/ops/cpu/gemm.cpp ↔ cuda/gemm.cu. How each computes it: ops/cpu/gemm.h (the CPU's
// packing, micro-kernels and the paths picked at run time) and cuda/gemm.cu.
//
//   C[M,N] = alpha · op(A)[M,K] · op(B)[K,N] + beta · C[M,N]          all row-major
//
//   op(A) = A   stored M×K, row stride lda (lda ≥ K)     trans_a = false
//         = Aᵀ  A stored K×M, row stride lda (lda ≥ M)   trans_a = true
//   op(B) = B   stored K×N, row stride ldb (ldb ≥ N)     trans_b = false
//         = Bᵀ  B stored N×K, row stride ldb (ldb ≥ K)   trans_b = true
//   C       stored M×N, row stride ldc (ldc ≥ N)
//
// beta == 0 means "overwrite": C's prior contents are never read (they may be NaN).
// alpha == 0 or K == 0 means C = beta · C (A and B are not read), as in BLAS.
// T is float, f16 or bf16: A, B and C hold T, alpha and beta are float, and the products are
// summed in f32 whatever T is; C is rounded to T once, at the end. The same bits on every run
// and, on the CPU, any thread count.
#pragma once
#include <cstdint>

#include "core/backend.h"

namespace kiln {

KILN_KERNEL(gemm, template <typename T> void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                                                  float alpha, const T* A, int64_t lda, const T* B, int64_t ldb,
                                                  float beta, T* C, int64_t ldc));

// Split-K (cuda/gemm.cu) for a small C and a long K — the convolution's weight gradient, M = Og,
// N = Kc, K = L, whose 64×64 tiles number 1 to 36 where a GPU has 132 SMs: K is cut into S
// slices summed by S times more blocks into float partials, which a second pass adds in order
// (deterministic, no atomics) into C = alpha·Σ + beta·C. S = gemm_split_k_slices: enough blocks
// for two per SM, slices of at least 256; S = 1, and f16/bf16 (their tensor-core path), is gemm.
KILN_CUDA_KERNEL(template <typename T> void gemm_split_k(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                                                         float alpha, const T* A, int64_t lda, const T* B,
                                                         int64_t ldb, float beta, T* C, int64_t ldc));
KILN_CUDA_KERNEL(int64_t gemm_split_k_slices(int64_t M, int64_t N, int64_t K));

}  // namespace kiln
