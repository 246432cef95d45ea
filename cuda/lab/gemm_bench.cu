// gemm_bench.cu — the kernel lab's GEMM bench: kiln's three GEMM versions (cuda/gemm.cu) against
// cuBLAS on one square problem, validated first, then timed. GPU only; cuBLAS is a reference
// here and never part of the engine (DESIGN.md), so this file is built by scripts/gpu-check.sh
// alone, never by the Makefile (cuda/lab/ is outside the engine build):
//
//   nvcc -std=c++17 -O3 -arch=native -Isrc -Icuda -DKILN_CUDA=1 cuda/lab/gemm_bench.cu
//        -o build-cuda/lab/gemm_bench -lcublas          (one line)
//   build-cuda/lab/gemm_bench [size=4096]
//
// It prints, one line each ("bench <name>: <value> <unit>", as make bench does):
//   bench cuda_gemm_naive_4096: ... GFLOP/s      version 1
//   bench cuda_gemm_smem_4096: ... GFLOP/s       version 2
//   bench cuda_gemm_4096: ... GFLOP/s            version 3, the engine's
//   bench cublas_sgemm_4096: ... GFLOP/s
//   bench cuda_gemm_vs_cublas_4096: ... %        version 3 as a share of cuBLAS
//
// Validation (STYLE.md item 2): each version's C is compared with cuBLAS's before any timing;
// a relative error above 1e-4 (of the largest |C|) stops the bench with exit status 1.
#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "gemm.cu"  // the kernels themselves: one program, no libkiln.a needed

#define CUBLAS_CHECK(call)                                                                  \
    do {                                                                                    \
        const cublasStatus_t s_ = (call);                                                   \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                  \
            std::fprintf(stderr, "%s:%d: %s failed with status %d\n", __FILE__, __LINE__, #call, int(s_)); \
            std::exit(1);                                                                   \
        }                                                                                   \
    } while (0)

namespace {

using GemmFn = void (*)(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*, int64_t,
                        float, float*, int64_t);

int n = 4096;
float *dA, *dB, *dC;
cublasHandle_t handle;

// Row-major C = A·B is column-major Cᵀ = Bᵀ·Aᵀ: cuBLAS gets B first, with the sizes swapped.
void cublas_gemm(bool, bool, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                 const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
    CUBLAS_CHECK(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, int(N), int(M), int(K), &alpha, B, int(ldb), A,
                             int(lda), &beta, C, int(ldc)));
}

void run(GemmFn f) { f(false, false, n, n, n, 1.0f, dA, n, dB, n, 0.0f, dC, n); }

std::vector<float> result() {
    std::vector<float> c(size_t(n) * n);
    KILN_CUDA_CHECK(cudaMemcpy(c.data(), dC, c.size() * sizeof(float), cudaMemcpyDeviceToHost));
    return c;
}

// Milliseconds per call, averaged over `reps` calls after one warm-up call.
double time_ms(GemmFn f, int reps) {
    run(f);
    cudaEvent_t start, stop;
    KILN_CUDA_CHECK(cudaEventCreate(&start));
    KILN_CUDA_CHECK(cudaEventCreate(&stop));
    KILN_CUDA_CHECK(cudaEventRecord(start));
    for (int i = 0; i < reps; i++) run(f);
    KILN_CUDA_CHECK(cudaEventRecord(stop));
    KILN_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    KILN_CUDA_CHECK(cudaEventDestroy(start));
    KILN_CUDA_CHECK(cudaEventDestroy(stop));
    return double(ms) / reps;
}

}  // namespace

int main(int argc, char** argv) try {
    if (argc > 1) n = std::atoi(argv[1]);
    if (n <= 0) {
        std::fprintf(stderr, "usage: gemm_bench [size > 0]\n");
        return 2;
    }
    const size_t count = size_t(n) * n;
    std::vector<float> a(count), b(count);
    std::mt19937 gen(1);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (float& v : a) v = dist(gen);
    for (float& v : b) v = dist(gen);
    KILN_CUDA_CHECK(cudaMalloc(&dA, count * sizeof(float)));
    KILN_CUDA_CHECK(cudaMalloc(&dB, count * sizeof(float)));
    KILN_CUDA_CHECK(cudaMalloc(&dC, count * sizeof(float)));
    KILN_CUDA_CHECK(cudaMemcpy(dA, a.data(), count * sizeof(float), cudaMemcpyHostToDevice));
    KILN_CUDA_CHECK(cudaMemcpy(dB, b.data(), count * sizeof(float), cudaMemcpyHostToDevice));
    CUBLAS_CHECK(cublasCreate(&handle));
    CUBLAS_CHECK(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH));  // true FP32, no TF32 tensor cores

    struct Version { const char* name; GemmFn f; int reps; };
    const Version versions[] = {{"cuda_gemm_naive", kiln::cuda::lab::gemm_naive, 2},
                                {"cuda_gemm_smem", kiln::cuda::lab::gemm_smem, 3},
                                {"cuda_gemm", kiln::cuda::gemm, 10},
                                {"cublas_sgemm", cublas_gemm, 10}};

    // 1. Validate every version against cuBLAS.
    run(cublas_gemm);
    const std::vector<float> want = result();
    float scale = 0;
    for (float v : want) scale = std::max(scale, std::fabs(v));
    for (const Version& v : versions) {
        KILN_CUDA_CHECK(cudaMemset(dC, 0xff, count * sizeof(float)));  // NaN: a C left unwritten shows
        run(v.f);
        const std::vector<float> got = result();
        double worst = 0;
        for (size_t i = 0; i < count; i++) worst = std::max(worst, double(std::fabs(got[i] - want[i])));
        const double rel = worst / double(scale);
        std::printf("check %s_%d: max |error| / max |C| = %.2e\n", v.name, n, rel);
        if (!(rel <= 1e-4)) {
            std::fprintf(stderr, "gemm_bench: %s disagrees with cuBLAS (%.2e > 1e-4)\n", v.name, rel);
            return 1;
        }
    }

    // 2. Time them.
    const double flops = 2.0 * double(n) * double(n) * double(n);
    double kiln_gflops = 0, cublas_gflops = 0;
    for (const Version& v : versions) {
        const double gflops = flops / (time_ms(v.f, v.reps) * 1e-3) / 1e9;
        std::printf("bench %s_%d: %.0f GFLOP/s\n", v.name, n, gflops);
        if (v.f == kiln::cuda::gemm) kiln_gflops = gflops;
        if (v.f == cublas_gemm) cublas_gflops = gflops;
    }
    std::printf("bench cuda_gemm_vs_cublas_%d: %.1f %%\n", n, 100.0 * kiln_gflops / cublas_gflops);

    CUBLAS_CHECK(cublasDestroy(handle));
    KILN_CUDA_CHECK(cudaFree(dA));
    KILN_CUDA_CHECK(cudaFree(dB));
    KILN_CUDA_CHECK(cudaFree(dC));
    return 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "gemm_bench: %s\n", e.what());
    return 1;
}
