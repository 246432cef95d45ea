// gemm_versions.h — the teaching versions of the engine's GEMM (cuda::gemm, cuda/gemm.cu), side by
// side. All take cuda::gemm's arguments (src/ops/gemm.h; device pointers, row-major, any
// transposes) and compute the same C; the engine runs version 6 (f32) and version 7 (f16, bf16).
//
//   version 1  gemm_naive            one thread per C element, each reading a row of op(A) and a
//                                    column of op(B) straight from global memory
//   version 2  gemm_smem             16×16 tiles of op(A) and op(B) staged in shared memory, each
//                                    loaded once per block instead of once per thread
//   version 3  gemm_register_tiled   bigger tiles, and each thread computes a TM×TN patch of C
//                                    from registers (register blocking)
//   version 5  gemm_wmma             T = f16 or bf16 only: each warp multiplies 16×16×16 fragments
//                                    on the tensor cores (nvcuda::wmma), sums in float (chapter 09)
//   version 8  gemm_tensor_cores_async   version 7 with cp.async stages (sm_80+)
// Versions 1, 2, 3 and 5 are in cuda/lab/versions/gemm_versions.cu; version 8 in cuda/gemm.cu, beside the
// version 7 it falls back to.
//
// Tested against the CPU by `make test T='[cuda][gemm]'` (versions 5 and 8: T='[wmma]'); the kernel
// lab, cuda/lab/gemm.cu, shows them under the same numbers (with a version 0 and a version 4 of
// its own) and times them against cuBLAS on a GPU (`make CUDA=1 lab`). Like cuda::gemm,
// versions 1, 2 and 3 take T = float, f16 or bf16; all sum in float.
#pragma once
#include <cstdint>

#include "core/dtype.h"
#include "ops/params.h"  // Conv2dParams

namespace kiln::cuda::lab {

template <typename T>
void gemm_naive(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const T* A,
                int64_t lda, const T* B, int64_t ldb, float beta, T* C, int64_t ldc);
template <typename T>
void gemm_smem(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const T* A,
               int64_t lda, const T* B, int64_t ldb, float beta, T* C, int64_t ldc);
template <typename T>  // version 3: register tiling, the engine's before version 6
void gemm_register_tiled(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const T* A,
                         int64_t lda, const T* B, int64_t ldb, float beta, T* C, int64_t ldc);
template <typename T>  // version 8: T = f16 or bf16, 3 or 4 stages of cp.async (rows not 16-byte aligned: version 7)
void gemm_tensor_cores_async(int stages, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                             const T* A, int64_t lda, const T* B, int64_t ldb, float beta, T* C, int64_t ldc);
template <typename T>  // T = f16 or bf16; any M, N, K
void gemm_wmma(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const T* A,
               int64_t lda, const T* B, int64_t ldb, float beta, T* C, int64_t ldc);

}  // namespace kiln::cuda::lab

namespace kiln::cuda {

// The tensor-core variant of cuda::conv2d_forward_implicit_gemm (cuda/conv.cu), T = f16 or bf16:
// the same product done as version 5. conv2d_forward_implicit_gemm takes it for f16 and bf16
// when a group has at least 16 output channels and C/G·KH·KW ≥ 16; the tests call it directly.
template <typename T>
void conv2d_forward_implicit_gemm_wmma(const T* x, const T* w, const T* b, T* y, const Conv2dParams& p);

}  // namespace kiln::cuda
