// gemm.cu — the kernel lab's matrix multiply: six versions of C = A·B side by side, each
// validated against the CPU at several block sizes, then timed against cuBLAS on a GPU.
// Versions 1 to 3 are chapter 04's, with its numbers (cuda/lab/versions/gemm_versions.cu); the lab adds version 0
// before them and version 4 after them; version 5 is chapter 09's, on the tensor cores.
//
//   C[M,N] = A[M,K] · B[K,N]          all row-major (the engine's cuda::gemm also does
//                                     transposes, alpha and beta; the lab times the plain case)
//
//   version 0  uncoalesced   one thread per C element, consecutive threads on consecutive rows
//              m: a warp's 32 reads of A are K floats apart, 32 memory transactions per load
//   version 1  gemm_naive    (lab/versions/gemm_versions.cu) one thread per element, consecutive threads on
//              consecutive columns n: a warp reads B[k, n..n+15] as one transaction and
//              A[m, k] as a broadcast. Only the mapping changed from version 0.
//   version 2  gemm_smem     (lab/versions/gemm_versions.cu) 16×16 tiles of A and B staged in shared memory:
//              each global value is loaded once per block instead of once per thread
//   version 3  gemm_register_tiled   (lab/versions/gemm_versions.cu, the engine's before version 6) 2-D
//              register tiling: each thread computes a TM×TN patch of C from registers, TM·TN FMAs
//              per TM + TN shared loads
//   version 4  float4        version 3's tiling, but every global load and store and every
//              shared-memory read is a 16-byte float4: a quarter of the load instructions.
//              Needs K and N to be multiples of 4 (rows stay 16-byte aligned). Block 128:
//              64×64 tiles, 8×4 per thread; block 256: 128×128 tiles, 8×8 per thread.
//   cuBLAS     cublasSgemm in true FP32 (no TF32 tensor cores), the reference on a GPU
//   version 5  wmma_f16      (lab/versions/gemm_versions.cu, chapter 09) A, B and C in f16, products and sums in
//              f32 on the tensor cores: each warp multiplies 16×16×16 fragments (nvcuda::wmma).
//              Validated against the CPU's f32 GEMM of the same (f16-rounded) inputs, timed
//              beside the f32 versions and against its own reference, cublasGemmEx with f16
//              inputs and output and f32 compute ("cublas_f16")
//   version 6  warp_tiled    (cuda/gemm.cu and gemm_tiles.cuh, the engine's f32 GEMM) version 3's
//              register blocking with each warp's lanes packed into one 64×32 patch (one
//              shared-memory wavefront per load, the rest broadcasts), float4 loads where the
//              rows allow, and the next step's tiles loaded into registers while this step's are
//              multiplied (two stages, one barrier per step); 128×128 or 64×64 tiles by size
//   version 7  mma_f16, mma_bf16   (cuda/gemm.cu and tensor_tiles.cuh, the engine's 16-bit GEMM)
//              version 6's loop on the tensor cores: mma.sync.m16n8k16 fed by ldmatrix from
//              padded (conflict-free) shared memory, 16-byte global loads, f32 sums; against
//              cublas_f16 and cublas_bf16 (cublasGemmEx, f32 compute)
//   version 7  mma_tf32      the same tile for f32 with TF32 on (cuda::set_tf32): each value rounded
//              to tf32 (cvt.rna) on its way into shared memory, mma.sync.m16n8k8.tf32, plain 32-bit
//              fragment loads; against cublas_tf32 (cublasSgemm with CUBLAS_TF32_TENSOR_OP_MATH)
//   version 8  mma_async     (cuda/gemm.cu) version 7 with the tiles copied global → shared by
//              cp.async, 3 or 4 stages ahead, no registers in between ("_b3", "_b4": the number
//              of stages, not a block size); f16 and bf16
//
// Build and run (from the repository root; `make lab` builds and runs every lab file):
//   make lab                   the emulator: validates every version at M, N, K = 67, 68, 44
//   make CUDA=1 lab            a GPU: validates at 4096³ (and at the chapter models' shapes), then
//                              prints one line per version and block size: "bench
//                              gemm_4096_v4_float4_b256: ... GFLOP/s (..% of cublas)"
//   build-cuda/lab/gemm 6      version 6 only, the engine's (any version number, 0 to 7;
//                              build/lab/gemm 6 on the emulator)
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common.h"
#include "common.cuh"
#include "core/cuda_memory.h"
#include "gemm_launch.cuh"
#include "gemm_versions.h"
#include "ops/cpu/gemm.h"
#include "ops/all.h"

namespace kiln::lab {

// ---- version 0: one thread per element, threads down the columns of C ------------------------
//   thread i:  m = i mod M,  n = i / M,   C[m, n] = Σ_k A[m, k]·B[k, n]
__global__ void gemm_uncoalesced_kernel(int64_t M, int64_t N, int64_t K, const float* A, const float* B, float* C) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= M * N) return;
    const int64_t m = i % M, n = i / M;
    float acc = 0.0f;
    for (int64_t k = 0; k < K; k++) acc += A[m * K + k] * B[k * N + n];
    C[m * N + n] = acc;
}

void gemm0(int64_t M, int64_t N, int64_t K, const float* A, const float* B, float* C, int block_size) {
    const dim3 grid(unsigned((M * N + block_size - 1) / block_size)), block(block_size);
    KILN_LAUNCH(gemm_uncoalesced_kernel, grid, block, 0)(M, N, K, A, B, C);
    KILN_CHECK_LAUNCH(gemm_uncoalesced_kernel, grid, block);
}

// ---- version 4: version 3 with float4 loads and stores ----------------------------------------
// Thread (tx, ty) owns rows ty·TM .. ty·TM + TM−1 and columns tx·TN .. tx·TN + TN−1 of the
// block's BM×BN tile of C (both contiguous, so its values in As and Bs are float4s).
//
//   for each k0 = 0, BK, 2·BK, ...:
//       float4 of A[row0 + m, k0 + k .. k0 + k + 3]  →  As[k .. k + 3][m]   (transposed: m-major)
//       float4 of B[k0 + k, col0 + n .. n + 3]        →  Bs[k][n .. n + 3]                 barrier
//       for k in 0..BK-1:   a = As[k][ty·TM ..] (TM/4 float4s),  b = Bs[k][tx·TN ..] (TN/4)
//                           acc[i][j] += a[i]·b[j]                                         barrier
//   C[row0 + ty·TM + i, col0 + tx·TN .. + 3] = float4 of acc[i][j .. j + 3]
// K % 4 == 0 and N % 4 == 0, so a float4 is either wholly inside the matrix or wholly out.
template <int BM, int BN, int BK, int TM, int TN>
__global__ void __launch_bounds__((BM / TM) * (BN / TN))
    gemm_float4_kernel(int64_t M, int64_t N, int64_t K, const float* A, const float* B, float* C) {
    constexpr int kThreadsX = BN / TN, kThreads = kThreadsX * (BM / TM);
    constexpr int kLoadsA = BM * BK / 4 / kThreads, kLoadsB = BK * BN / 4 / kThreads;
    static_assert(TM % 4 == 0 && TN % 4 == 0 && BK % 4 == 0, "float4s along every tile edge");
    static_assert(kLoadsA * kThreads * 4 == BM * BK && kLoadsB * kThreads * 4 == BK * BN,
                  "tile loads must divide evenly");
    __shared__ __align__(16) float As[BK][BM + 4];  // As[k][m]
    __shared__ __align__(16) float Bs[BK][BN + 4];  // Bs[k][n]
    const int tid = threadIdx.x, tx = tid % kThreadsX, ty = tid / kThreadsX;
    const int64_t row0 = int64_t(blockIdx.y) * BM, col0 = int64_t(blockIdx.x) * BN;
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float acc[TM][TN] = {};
    for (int64_t k0 = 0; k0 < K; k0 += BK) {
        for (int r = 0; r < kLoadsA; r++) {
            const int e = tid + r * kThreads;  // the e-th float4 of the BM×BK tile, row by row
            const int m = e / (BK / 4), k = e % (BK / 4) * 4;
            const bool inside = row0 + m < M && k0 + k < K;
            const float4 a = inside ? *reinterpret_cast<const float4*>(&A[(row0 + m) * K + k0 + k]) : zero;
            As[k][m] = a.x, As[k + 1][m] = a.y, As[k + 2][m] = a.z, As[k + 3][m] = a.w;
        }
        for (int r = 0; r < kLoadsB; r++) {
            const int e = tid + r * kThreads;  // the e-th float4 of the BK×BN tile
            const int k = e / (BN / 4), n = e % (BN / 4) * 4;
            const bool inside = k0 + k < K && col0 + n < N;
            *reinterpret_cast<float4*>(&Bs[k][n]) =
                inside ? *reinterpret_cast<const float4*>(&B[(k0 + k) * N + col0 + n]) : zero;
        }
        __syncthreads();
        KILN_UNROLL
        for (int k = 0; k < BK; k++) {
            float a[TM], b[TN];
            KILN_UNROLL
            for (int i = 0; i < TM; i += 4) {
                const float4 v = *reinterpret_cast<const float4*>(&As[k][ty * TM + i]);
                a[i] = v.x, a[i + 1] = v.y, a[i + 2] = v.z, a[i + 3] = v.w;
            }
            KILN_UNROLL
            for (int j = 0; j < TN; j += 4) {
                const float4 v = *reinterpret_cast<const float4*>(&Bs[k][tx * TN + j]);
                b[j] = v.x, b[j + 1] = v.y, b[j + 2] = v.z, b[j + 3] = v.w;
            }
            cuda::detail::outer_product_add(acc, a, b);
        }
        __syncthreads();
    }
    KILN_UNROLL
    for (int i = 0; i < TM; i++) {
        const int64_t m = row0 + ty * TM + i;
        KILN_UNROLL
        for (int j = 0; j < TN; j += 4) {
            const int64_t n = col0 + tx * TN + j;
            if (m < M && n < N)
                *reinterpret_cast<float4*>(&C[m * N + n]) =
                    make_float4(acc[i][j], acc[i][j + 1], acc[i][j + 2], acc[i][j + 3]);
        }
    }
}

constexpr auto gemm_float4_64x64 = gemm_float4_kernel<64, 64, 16, 8, 4>;     // 128 threads
constexpr auto gemm_float4_128x128 = gemm_float4_kernel<128, 128, 8, 8, 8>;  // 256 threads

void gemm4(int64_t M, int64_t N, int64_t K, const float* A, const float* B, float* C, int block_size) {
    KILN_CHECK(K % 4 == 0 && N % 4 == 0, "gemm version 4 loads float4s along K and N: K = ", K, " and N = ", N,
               " must be multiples of 4; use version 3 otherwise");
    KILN_CHECK(block_size == 128 || block_size == 256, "gemm version 4 has blocks of 128 or 256 threads, not ",
               block_size);
    const int tile = block_size == 128 ? 64 : 128;
    const dim3 grid(unsigned((N + tile - 1) / tile), unsigned((M + tile - 1) / tile)), block(block_size);
    if (block_size == 128) {
        KILN_LAUNCH(gemm_float4_64x64, grid, block, 0)(M, N, K, A, B, C);
        KILN_CHECK_LAUNCH(gemm_float4_64x64, grid, block);
    } else {
        KILN_LAUNCH(gemm_float4_128x128, grid, block, 0)(M, N, K, A, B, C);
        KILN_CHECK_LAUNCH(gemm_float4_128x128, grid, block);
    }
}

// ---- every version by number (versions 1 to 3 are the engine's, with their own blocks) -------
void gemm(int version, int64_t M, int64_t N, int64_t K, const float* A, const float* B, float* C, int block_size) {
    switch (version) {
    case 0: return gemm0(M, N, K, A, B, C, block_size);
    case 1: return cuda::lab::gemm_naive(false, false, M, N, K, 1.0f, A, K, B, N, 0.0f, C, N);
    case 2: return cuda::lab::gemm_smem(false, false, M, N, K, 1.0f, A, K, B, N, 0.0f, C, N);
    case 3: return cuda::lab::gemm_register_tiled(false, false, M, N, K, 1.0f, A, K, B, N, 0.0f, C, N);
    case 4: return gemm4(M, N, K, A, B, C, block_size);
    default: return cuda::gemm(false, false, M, N, K, 1.0f, A, K, B, N, 0.0f, C, N);
    }
}

const std::vector<Version> kVersions = {{0, "uncoalesced", {64, 256, 1024}},
                                        {1, "gemm_naive", {0}},
                                        {2, "gemm_smem", {0}},
                                        {3, "gemm_register_tiled", {0}},
                                        {4, "float4", {128, 256}},
                                        {6, "warp_tiled", {0}}};
const std::vector<Version> kTensorCoreVersions = {{5, "wmma_f16", {0}}, {7, "mma_f16", {0}},
                                                  {8, "mma_async_f16", {3, 4}}};  // f16 in and out
const std::vector<Version> kBf16Versions = {{7, "mma_bf16", {0}}, {8, "mma_async_bf16", {3, 4}}};  // bf16
const std::vector<Version> kTf32Versions = {{7, "mma_tf32", {0}}};  // f32 in and out, TF32 products

// ---- version 7 on f32 with TF32: against the CPU's f32 GEMM of the operands rounded to tf32 --------
// The rounded products are exact in f32, so the f32 versions' tolerance for another summation
// order holds (2e-6·(K + 1)); the un-rounded product would miss it by up to 2^-10·Σ|a·b|.
struct Tf32Problem {
    DeviceArray<float> A, B, C;
    std::vector<float> want;
    Tf32Problem(const std::vector<float>& a, const std::vector<float>& b, int64_t M, int64_t N, int64_t K)
        : A(a), B(b), C(size_t(M * N)), want(size_t(M * N)) {
        std::vector<float> ar(a), br(b);
        for (float& v : ar) v = f32_to_tf32(v);
        for (float& v : br) v = f32_to_tf32(v);
        cpu::gemm(false, false, M, N, K, 1.0f, ar.data(), K, br.data(), N, 0.0f, want.data(), N);
    }
    void run(int64_t M, int64_t N, int64_t K) {
        cuda::set_tf32(true);
        cuda::gemm(false, false, M, N, K, 1.0f, A.get(), K, B.get(), N, 0.0f, C.get(), N);
        cuda::set_tf32(false);
    }
};

// ---- versions 5 and 7: f16 and bf16 on the tensor cores, against the CPU's f32 GEMM -----------------
// The inputs are a and b rounded to T (exact in f32, so the CPU computes on what the GPU sees).
// Tolerance: the f32 versions' allowance for summing the K products in another order (a few ulps
// of Σ|a·b| ≤ K: 2e-6·(K + 1)), plus the one rounding of C to T: u = 2^-11 (f16) or 2^-8 (bf16).
template <typename T>
std::vector<T> to_half(const std::vector<float>& v) {
    std::vector<T> h(v.size());
    for (size_t i = 0; i < v.size(); i++) h[i] = T(v[i]);
    return h;
}
template <typename T>
std::vector<float> to_f32(const std::vector<T>& h) {
    std::vector<float> v(h.size());
    for (size_t i = 0; i < h.size(); i++) v[i] = float(h[i]);
    return v;
}

// a and b rounded to T, on the device, C for the result, and the CPU's f32 product of the rounded values.
template <typename T>
struct HalfProblem {
    std::vector<T> a, b;
    DeviceArray<T> A, B, C;
    std::vector<float> want;
    HalfProblem(const std::vector<float>& a32, const std::vector<float>& b32, int64_t M, int64_t N, int64_t K)
        : a(to_half<T>(a32)), b(to_half<T>(b32)), A(a), B(b), C(size_t(M * N)), want(size_t(M * N)) {
        cpu::gemm(false, false, M, N, K, 1.0f, to_f32(a).data(), K, to_f32(b).data(), N, 0.0f, want.data(), N);
    }
};

template <typename T>
bool validate_half(const HalfProblem<T>& p, int64_t K, const std::string& label) {
    std::vector<T> got(p.want.size());
    KILN_CUDA_CHECK(cudaMemcpy(got.data(), p.C.get(), got.size() * sizeof(T), cudaMemcpyDeviceToHost));
    const double u = std::is_same_v<T, bf16> ? 1.0 / (1 << 8) : 1.0 / (1 << 11);
    return validate_values(to_f32(got), p.want, label, 2e-6 * double(K + 1), u);
}

// Version 5 (wmma, f16), 7 (the engine's cuda::gemm: mma.sync) or 8 (cp.async, `stages`) in T.
template <typename T>
void gemm_half(int version, int stages, const HalfProblem<T>& p, int64_t M, int64_t N, int64_t K) {
    if constexpr (std::is_same_v<T, f16>) {
        if (version == 5)
            return cuda::lab::gemm_wmma(false, false, M, N, K, 1.0f, p.A.get(), K, p.B.get(), N, 0.0f, p.C.get(), N);
    }
    if (version == 8)
        return cuda::lab::gemm_tensor_cores_async(stages, false, false, M, N, K, 1.0f, p.A.get(), K, p.B.get(), N,
                                                  0.0f, p.C.get(), N);
    cuda::gemm(false, false, M, N, K, 1.0f, p.A.get(), K, p.B.get(), N, 0.0f, p.C.get(), N);
}

template <typename T>
bool validate_half_versions(const std::vector<Version>& versions, int chosen, HalfProblem<T>& p, int64_t M, int64_t N,
                            int64_t K) {
    return validate_versions(
        versions, chosen,
        [&](int version, int stages) {
            p.C.poison();
            gemm_half(version, stages, p, M, N, K);
        },
        [&](const std::string& label) { return validate_half(p, K, label); });
}

// One product C = A·B of M×K by K×N: every chosen version (of `versions`, and the tensor cores'
// of the 16-bit lists) validated, then on a GPU timed against cuBLAS in the same types.
bool run_problem(int chosen, int64_t M, int64_t N, int64_t K, const std::vector<Version>& versions,
                 const std::vector<Version>& f16_versions, const std::vector<Version>& bf16_versions) {
    std::printf("gemm M = %lld, N = %lld, K = %lld\n", (long long)M, (long long)N, (long long)K);
    const std::vector<float> a = random_floats(size_t(M * K), 1), b = random_floats(size_t(K * N), 2);
    std::vector<float> want(size_t(M * N));
    cpu::gemm(false, false, M, N, K, 1.0f, a.data(), K, b.data(), N, 0.0f, want.data(), N);
    HalfProblem<f16> half(a, b, M, N, K);
    HalfProblem<bf16> brain(a, b, M, N, K);

    DeviceArray<float> A(a), B(b), C(want.size());
    const auto launch = [&](int version, int block) { gemm(version, M, N, K, A.get(), B.get(), C.get(), block); };
    // The GPU adds the K products in another order than the CPU (tiles, FMA): a few ulps of
    // Σ|a·b| ≤ K for values in [-1, 1], as in tests/test_gemm.cpp.
    const bool ok = validate_versions(
        versions, chosen, [&](int version, int block) {
            C.poison();
            launch(version, block);
        },
        [&](const std::string& label) { return validate_result(C.get(), want, label, 2e-6 * double(K + 1), 1e-5); });
    const bool half_ok = validate_half_versions(f16_versions, chosen, half, M, N, K);
    const bool brain_ok = validate_half_versions(bf16_versions, chosen, brain, M, N, K);
    Tf32Problem tf32(a, b, M, N, K);
    const bool tf32_ok = validate_versions(
        kTf32Versions, chosen, [&](int, int) {
            tf32.C.poison();
            tf32.run(M, N, K);
        },
        [&](const std::string& label) { return validate_result(tf32.C.get(), tf32.want, label, 2e-6 * double(K + 1), 1e-5); });
    if (!ok || !half_ok || !brain_ok || !tf32_ok || !kTiming) return ok && half_ok && brain_ok && tf32_ok;
#ifdef KILN_CUDA
    // Row-major C = A·B is column-major Cᵀ = Bᵀ·Aᵀ: cuBLAS gets B first, with M and N swapped.
    cublasHandle_t handle;
    CUBLAS_CHECK(cublasCreate(&handle));
    CUBLAS_CHECK(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH));  // true FP32, no TF32 tensor cores
    const float one = 1.0f, zero = 0.0f;
    const double cublas_ms = time_ms([&] {
        CUBLAS_CHECK(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, int(N), int(M), int(K), &one, B.get(), int(N),
                                 A.get(), int(K), &zero, C.get(), int(N)));
    });
    // 16-bit A, B and C, f32 compute: the tensor cores, as versions 5 and 7
    const auto cublas_16 = [&](const void* Bh, const void* Ah, void* Ch, cudaDataType type) {
        return time_ms([&] {
            CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, int(N), int(M), int(K), &one, Bh, type, int(N),
                                      Ah, type, int(K), &zero, Ch, type, int(N), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        });
    };
    const double cublas_f16_ms = cublas_16(half.B.get(), half.A.get(), half.C.get(), CUDA_R_16F);
    const double cublas_bf16_ms = cublas_16(brain.B.get(), brain.A.get(), brain.C.get(), CUDA_R_16BF);
    CUBLAS_CHECK(cublasSetMathMode(handle, CUBLAS_TF32_TENSOR_OP_MATH));  // f32 on the tensor cores as TF32
    const double cublas_tf32_ms = time_ms([&] {
        CUBLAS_CHECK(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, int(N), int(M), int(K), &one, B.get(), int(N),
                                 A.get(), int(K), &zero, C.get(), int(N)));
    });
    CUBLAS_CHECK(cublasDestroy(handle));
    const std::string problem = M == N && N == K ? "gemm_" + std::to_string(M)
                                                 : "gemm_" + std::to_string(M) + "x" + std::to_string(N) + "x" +
                                                       std::to_string(K);
    const double gflop = 2.0 * double(M * N * K) / 1e9;
    time_versions(versions, chosen, launch, problem, gflop, "GFLOP/s", cublas_ms, "cublas");
    time_versions(f16_versions, chosen, [&](int v, int stages) { gemm_half(v, stages, half, M, N, K); }, problem,
                  gflop, "GFLOP/s", cublas_f16_ms, "cublas_f16");
    time_versions(bf16_versions, chosen, [&](int v, int stages) { gemm_half(v, stages, brain, M, N, K); }, problem,
                  gflop, "GFLOP/s", cublas_bf16_ms, "cublas_bf16");
    time_versions(kTf32Versions, chosen, [&](int, int) { tf32.run(M, N, K); }, problem, gflop, "GFLOP/s",
                  cublas_tf32_ms, "cublas_tf32");
#endif
    return true;
}

// The chapter models' products, for the engine's versions only: a 3×3 layer of the capstone's
// 64/256/256 net at batch 256 on 7×7 maps as its forward GEMM (O × N·P·Q × C·9) and as its weight
// gradient's (O × C·9 × N·P·Q), and a 1024³ product.
bool run_lab(int chosen) {
    const std::vector<Version> engine = {kVersions.back()};
    const std::vector<Version> engine_f16 = {kTensorCoreVersions[1], kTensorCoreVersions[2]}, engine_bf16 = kBf16Versions;
    if (!kTiming) return run_problem(chosen, 67, 68, 44, kVersions, kTensorCoreVersions, kBf16Versions);
    bool ok = run_problem(chosen, 4096, 4096, 4096, kVersions, kTensorCoreVersions, kBf16Versions);
    ok = run_problem(chosen, 1024, 1024, 1024, engine, engine_f16, engine_bf16) && ok;
    ok = run_problem(chosen, 256, 12544, 2304, engine, engine_f16, engine_bf16) && ok;
    ok = run_problem(chosen, 256, 2304, 12544, engine, engine_f16, engine_bf16) && ok;
    return ok;
}

}  // namespace kiln::lab

int main(int argc, char** argv) {
    using namespace kiln::lab;
    std::vector<Version> all = kVersions;
    all.insert(all.end(), kTensorCoreVersions.begin(), kTensorCoreVersions.end());
    all.insert(all.end(), kBf16Versions.begin(), kBf16Versions.end());
    std::sort(all.begin(), all.end(), [](const Version& a, const Version& b) { return a.number < b.number; });
    return lab_main("gemm", [&] { return run_lab(chosen_version(argc, argv, all)); });
}
