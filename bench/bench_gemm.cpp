// bench_gemm.cpp — kiln::cpu::gemm against OpenBLAS's cblas_sgemm, on the shapes kiln uses.
//
//   make build/bench/bench_gemm && OMP_NUM_THREADS=2 build/bench/bench_gemm
//
// Prints, per shape, three lines in the `make bench` format:
//   bench gemm_f32_1024: 123.4 GFLOP/s
//   bench openblas_gemm_f32_1024: 150.2 GFLOP/s
//   bench gemm_f32_1024_vs_openblas: 0.82 ratio
// GFLOP/s = 2·M·N·K / seconds / 1e9, the median of 11 timed samples (each ~10 ms) after
// warm-up. kiln and OpenBLAS are timed one after the other, with a pause between: each
// library's idle threads spin for a while after a call (OpenBLAS's for ~0.1 s), and would
// steal the cores from the other one if their calls alternated.
// Both use OMP_NUM_THREADS threads (bench/run.sh sets 2). OpenBLAS is linked into this
// benchmark only, never into kiln.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ops/cpu/gemm.h"

extern "C" void openblas_set_num_threads(int num_threads);  // from OpenBLAS's cblas.h

namespace {

struct Shape {
    std::string name;  // as printed: gemm_f32_<name>
    bool ta, tb;
    int64_t M, N, K;
};

struct Operands {
    std::vector<float> A, B, C;
};

Operands make_operands(const Shape& s) {
    std::mt19937 rng(42);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    Operands o{std::vector<float>(static_cast<size_t>(s.M * s.K)),
               std::vector<float>(static_cast<size_t>(s.K * s.N)),
               std::vector<float>(static_cast<size_t>(s.M * s.N))};
    for (float& x : o.A) x = dist(rng);
    for (float& x : o.B) x = dist(rng);
    return o;
}

void run_kiln(const Shape& s, Operands& o) {
    kiln::cpu::gemm(s.ta, s.tb, s.M, s.N, s.K, 1.0f, o.A.data(), s.ta ? s.M : s.K, o.B.data(),
                    s.tb ? s.K : s.N, 0.0f, o.C.data(), s.N);
}

void run_openblas(const Shape& s, Operands& o) {
    cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans,
                static_cast<int>(s.M), static_cast<int>(s.N), static_cast<int>(s.K), 1.0f,
                o.A.data(), static_cast<int>(s.ta ? s.M : s.K), o.B.data(),
                static_cast<int>(s.tb ? s.K : s.N), 0.0f, o.C.data(), static_cast<int>(s.N));
}

// Seconds per call of f, over `reps` back-to-back calls.
template <typename F>
double time_per_call(F&& f, int reps) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; ++r) f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// Let the other library's spinning threads fall asleep.
void settle() { std::this_thread::sleep_for(std::chrono::milliseconds(300)); }

// Median seconds per call of f over 11 samples of `reps` calls, after a warm-up (page faults,
// packing buffers, waking the thread pool).
template <typename F>
double median_time(F&& f, int reps) {
    settle();
    time_per_call(f, reps);
    std::vector<double> samples;
    for (int sample = 0; sample < 11; ++sample) samples.push_back(time_per_call(f, reps));
    return median(samples);
}

void bench_shape(const Shape& s) {
    Operands o = make_operands(s);
    auto kiln = [&] { run_kiln(s, o); };
    auto blas = [&] { run_openblas(s, o); };
    // Size a sample to ~10 ms.
    settle();
    const double once = time_per_call(kiln, 2);
    const int reps = std::max(1, static_cast<int>(0.010 / std::max(once, 1e-9)));
    const double t_kiln = median_time(kiln, reps), t_blas = median_time(blas, reps);
    const double flop = 2.0 * s.M * s.N * s.K;
    const double g_kiln = flop / t_kiln / 1e9, g_blas = flop / t_blas / 1e9;
    std::printf("bench gemm_f32_%s: %.1f GFLOP/s\n", s.name.c_str(), g_kiln);
    std::printf("bench openblas_gemm_f32_%s: %.1f GFLOP/s\n", s.name.c_str(), g_blas);
    std::printf("bench gemm_f32_%s_vs_openblas: %.2f ratio\n", s.name.c_str(), g_kiln / g_blas);
    std::fflush(stdout);
}

}  // namespace

int main() {
    const int threads = omp_get_max_threads();  // OMP_NUM_THREADS
    openblas_set_num_threads(threads);
    std::printf("# kiln gemm vs OpenBLAS, %d thread(s), median of 11 samples\n", threads);
    const Shape shapes[] = {
        {"1024", false, false, 1024, 1024, 1024},
        // MLP layer, batch 256, 784 -> 256: forward Y = X·Wᵀ, and the weight gradient dYᵀ·X.
        {"mlp_256x256x784", false, true, 256, 256, 784},
        {"mlp_dw_256x784x256", true, false, 256, 784, 256},
        // im2col convolution: 64 output channels, 3×3×64 = 576, a 64×64 output image.
        {"conv_64x4096x576", false, false, 64, 4096, 576},
        // small: where packing and threading overheads show.
        {"64", false, false, 64, 64, 64},
    };
    for (const Shape& s : shapes) bench_shape(s);
    return 0;
}
