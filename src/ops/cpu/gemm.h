// gemm.h — matrix multiply on the CPU: the workhorse behind Linear layers and im2col
// convolutions (chapter 03).
//
//   C[M,N] = alpha * op(A)[M,K] · op(B)[K,N] + beta * C[M,N]          all row-major
//
//   op(A) = A   stored M×K, row stride lda (lda >= K)     trans_a = false
//         = Aᵀ  A stored K×M, row stride lda (lda >= M)   trans_a = true
//   op(B) = B   stored K×N, row stride ldb (ldb >= N)     trans_b = false
//         = Bᵀ  B stored N×K, row stride ldb (ldb >= K)   trans_b = true
//   C       stored M×N, row stride ldc (ldc >= N)
//
// How the layers use it (X: batch×in, W: out×in, Y: batch×out):
//   forward   Y  = X · Wᵀ    gemm(false, true,  batch, out, in,    1, X, in,  W, in,  0, Y, out)
//   backward  dX = dY · W    gemm(false, false, batch, in,  out,   1, dY, out, W, in, 0, dX, in)
//             dW = dYᵀ · X   gemm(true,  false, out,   in,  batch, 1, dY, out, X, in, 1, dW, in)
//
// beta == 0 means "overwrite": C's prior contents are never read (they may be NaN).
// alpha == 0 or K == 0 means C = beta * C (A and B are not read), as in BLAS.
// Results are bitwise identical whatever the number of OpenMP threads.
//
// T is float, f16 or bf16 (core/dtype.h): A, B and C hold T, alpha and beta are float, and the
// products are summed in f32 whatever T is; C is rounded to T once, at the end.
#pragma once
#include <cstdint>

#include "core/dtype.h"

namespace kiln::cpu {

// The fast path: cache-blocked, packed, SIMD micro-kernel, OpenMP over blocks of C (gemm.cpp).
template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const T* A, int64_t lda, const T* B, int64_t ldb, float beta, T* C, int64_t ldc);

// The textbook triple loop, one dot product per C element: the reference gemm() is tested
// against. Slow; use it in tests only.
template <typename T>
void gemm_reference(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                    const T* A, int64_t lda, const T* B, int64_t ldb, float beta, T* C,
                    int64_t ldc);

}  // namespace kiln::cpu
