// gemm_versions.h — the teaching versions of cuda/gemm.cu, side by side.
// All take cuda::gemm's arguments (src/ops/cuda_ops.h; device pointers, row-major, any
// transposes) and compute the same C; the engine uses version 3, cuda::gemm.
//
//   version 1  gemm_naive   one thread per C element, each reading a row of op(A) and a column
//                           of op(B) straight from global memory
//   version 2  gemm_smem    16×16 tiles of op(A) and op(B) staged in shared memory, each
//                           loaded once per block instead of once per thread
//   version 3  cuda::gemm   bigger tiles, and each thread computes a TM×TN patch of C from
//                           registers (register blocking)
//
// Tested against the CPU by `make test T='[cuda][gemm]'`; the kernel lab, cuda/lab/gemm.cu,
// shows them under the same numbers (between a version 0 and a version 4 of its own) and times
// them against cuBLAS on a GPU (`make CUDA=1 lab`). Like cuda::gemm, they take T = float, f16
// or bf16 and sum in float.
#pragma once
#include <cstdint>

#include "core/dtype.h"

namespace kiln::cuda::lab {

template <typename T>
void gemm_naive(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const T* A,
                int64_t lda, const T* B, int64_t ldb, float beta, T* C, int64_t ldc);
template <typename T>
void gemm_smem(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const T* A,
               int64_t lda, const T* B, int64_t ldb, float beta, T* C, int64_t ldc);

}  // namespace kiln::cuda::lab
