// gemm.cu — the kernel lab's matrix multiply: six versions of C = A·B side by side, each
// validated against the CPU at several block sizes, then timed against cuBLAS on a GPU.
// Versions 1 to 3 are chapter 04's, with its numbers (cuda/gemm.cu); the lab adds version 0
// before them and version 4 after them; version 5 is chapter 09's, on the tensor cores.
//
//   C[M,N] = A[M,K] · B[K,N]          all row-major (the engine's cuda::gemm also does
//                                     transposes, alpha and beta; the lab times the plain case)
//
//   version 0  uncoalesced   one thread per C element, consecutive threads on consecutive rows
//              m: a warp's 32 reads of A are K floats apart, 32 memory transactions per load
//   version 1  gemm_naive    (cuda/gemm.cu) one thread per element, consecutive threads on
//              consecutive columns n: a warp reads B[k, n..n+15] as one transaction and
//              A[m, k] as a broadcast. Only the mapping changed from version 0.
//   version 2  gemm_smem     (cuda/gemm.cu) 16×16 tiles of A and B staged in shared memory:
//              each global value is loaded once per block instead of once per thread
//   version 3  gemm          (cuda/gemm.cu, the engine's) 2-D register tiling: each thread
//              computes a TM×TN patch of C from registers, TM·TN FMAs per TM + TN shared loads
//   version 4  float4        version 3's tiling, but every global load and store and every
//              shared-memory read is a 16-byte float4: a quarter of the load instructions.
//              Needs K and N to be multiples of 4 (rows stay 16-byte aligned). Block 128:
//              64×64 tiles, 8×4 per thread; block 256: 128×128 tiles, 8×8 per thread.
//   cuBLAS     cublasSgemm in true FP32 (no TF32 tensor cores), the reference on a GPU
//   version 5  wmma_f16      (cuda/gemm.cu, chapter 09) A, B and C in f16, products and sums in
//              f32 on the tensor cores: each warp multiplies 16×16×16 fragments (nvcuda::wmma).
//              Validated against the CPU's f32 GEMM of the same (f16-rounded) inputs, timed
//              beside the f32 versions and against its own reference, cublasGemmEx with f16
//              inputs and output and f32 compute ("cublas_f16")
//
// Build and run (from the repository root; `make lab` builds and runs every lab file):
//   make lab                   the emulator: validates every version at M, N, K = 67, 68, 44
//   make CUDA=1 lab            a GPU: validates at 4096³, then prints one line per version
//                              and block size: "bench gemm_4096_v4_float4_b256: ... GFLOP/s
//                              (..% of cublas)"
//   build-cuda/lab/gemm 3      version 3 only, the engine's (any version number, 0 to 5;
//                              build/lab/gemm 3 on the emulator)
#include <cstdint>

#include "common.h"
#include "common.cuh"
#include "gemm_versions.h"
#include "ops/cpu/gemm.h"
#include "ops/cuda_ops.h"

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
            KILN_UNROLL
            for (int i = 0; i < TM; i++) {
                KILN_UNROLL
                for (int j = 0; j < TN; j++) acc[i][j] += a[i] * b[j];
            }
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
    case 3: return cuda::gemm(false, false, M, N, K, 1.0f, A, K, B, N, 0.0f, C, N);
    default: return gemm4(M, N, K, A, B, C, block_size);
    }
}

const std::vector<Version> kVersions = {{0, "uncoalesced", {64, 256, 1024}},
                                        {1, "gemm_naive", {0}},
                                        {2, "gemm_smem", {0}},
                                        {3, "gemm", {0}},
                                        {4, "float4", {128, 256}}};
const std::vector<Version> kTensorCoreVersions = {{5, "wmma_f16", {0}}};  // f16 in and out

// ---- version 5: f16 on the tensor cores, against the CPU's f32 GEMM of the same values -------
// The inputs are a and b rounded to f16 (exact in f32, so the CPU computes on what the GPU
// sees). Tolerance: the f32 versions' allowance for summing the K products in another order (a
// few ulps of Σ|a·b| ≤ K: 2e-6·(K + 1)), plus the one rounding of C to f16: u = 2^-11 relative.
struct HalfProblem {
    DeviceArray<f16> A, B, C;
    std::vector<float> want;
};

std::vector<f16> to_f16(const std::vector<float>& v) {
    std::vector<f16> h(v.size());
    for (size_t i = 0; i < v.size(); i++) h[i] = f16(v[i]);
    return h;
}
std::vector<float> to_f32(const std::vector<f16>& h) {
    std::vector<float> v(h.size());
    for (size_t i = 0; i < h.size(); i++) v[i] = float(h[i]);
    return v;
}

bool validate_half(const HalfProblem& p, int64_t K, const std::string& label) {
    std::vector<f16> got(p.want.size());
    KILN_CUDA_CHECK(cudaMemcpy(got.data(), p.C.get(), got.size() * sizeof(f16), cudaMemcpyDeviceToHost));
    return validate_values(to_f32(got), p.want, label, 2e-6 * double(K + 1), 1.0 / (1 << 11));
}

bool run_lab(int chosen) {
    const int64_t M = kTiming ? 4096 : 67, N = kTiming ? 4096 : 68, K = kTiming ? 4096 : 44;
    std::printf("gemm M = %lld, N = %lld, K = %lld\n", (long long)M, (long long)N, (long long)K);
    const std::vector<float> a = random_floats(size_t(M * K), 1), b = random_floats(size_t(K * N), 2);
    std::vector<float> want(size_t(M * N));
    cpu::gemm(false, false, M, N, K, 1.0f, a.data(), K, b.data(), N, 0.0f, want.data(), N);
    const std::vector<f16> a16 = to_f16(a), b16 = to_f16(b);
    HalfProblem half{DeviceArray<f16>(a16), DeviceArray<f16>(b16), DeviceArray<f16>(want.size()),
                     std::vector<float>(want.size())};
    cpu::gemm(false, false, M, N, K, 1.0f, to_f32(a16).data(), K, to_f32(b16).data(), N, 0.0f, half.want.data(), N);
    const auto launch_half = [&](int, int) {
        cuda::lab::gemm_wmma(false, false, M, N, K, 1.0f, half.A.get(), K, half.B.get(), N, 0.0f, half.C.get(), N);
    };

    DeviceArray<float> A(a), B(b), C(want.size());
    const auto launch = [&](int version, int block) { gemm(version, M, N, K, A.get(), B.get(), C.get(), block); };
    // The GPU adds the K products in another order than the CPU (tiles, FMA): a few ulps of
    // Σ|a·b| ≤ K for values in [-1, 1], as in tests/test_cuda_ops.cpp.
    const bool ok = validate_versions(
        kVersions, chosen, [&](int version, int block) {
            C.poison();
            launch(version, block);
        },
        [&](const std::string& label) { return validate_result(C.get(), want, label, 2e-6 * double(K + 1), 1e-5); });
    const bool half_ok = validate_versions(
        kTensorCoreVersions, chosen,
        [&](int version, int block) {
            half.C.poison();
            launch_half(version, block);
        },
        [&](const std::string& label) { return validate_half(half, K, label); });
    if (!ok || !half_ok || !kTiming) return ok && half_ok;
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
    // f16 A, B and C, f32 compute: the tensor cores, as version 5
    const double cublas_f16_ms = time_ms([&] {
        CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, int(N), int(M), int(K), &one, half.B.get(),
                                  CUDA_R_16F, int(N), half.A.get(), CUDA_R_16F, int(K), &zero, half.C.get(),
                                  CUDA_R_16F, int(N), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    });
    CUBLAS_CHECK(cublasDestroy(handle));
    const std::string problem = "gemm_" + std::to_string(M);
    const double gflop = 2.0 * double(M * N * K) / 1e9;
    time_versions(kVersions, chosen, launch, problem, gflop, "GFLOP/s", cublas_ms, "cublas");
    time_versions(kTensorCoreVersions, chosen, launch_half, problem, gflop, "GFLOP/s", cublas_f16_ms, "cublas_f16");
#endif
    return true;
}

}  // namespace kiln::lab

int main(int argc, char** argv) {
    using namespace kiln::lab;
    std::vector<Version> all = kVersions;
    all.insert(all.end(), kTensorCoreVersions.begin(), kTensorCoreVersions.end());
    return lab_main("gemm", [&] { return run_lab(chosen_version(argc, argv, all)); });
}
