// bench_qgemm.cpp — chapter 11's int8 matrix product (ops/cpu/qgemm.h) on every path this CPU
// can run, against chapter 03's f32 GEMM (cpu::gemm<float>) on the same shapes.
//
//   make build/bench/bench_qgemm && OMP_NUM_THREADS=2 build/bench/bench_qgemm
//
// Shapes C [M, N] = A [M, K] · B [N, K]ᵀ: a large square product, and the chapter models' layers
// as the products qconv2d and qlinear run (M = P·Q output pixels of one image, N = output
// channels, K = C·KH·KW; for a Linear M = batch, N = out, K = in). A figure is the median of
// 9 samples of at least 2 ms each, after a warm-up call, f32 and the paths timed in turns; a
// ratio is the median of the sample-by-sample ratios. GOP/s counts 2·M·N·K operations (a
// multiply and an add), as for f32. Prints the CPU line as a comment, then per shape:
//   bench qgemm_<shape>_<path>: <GOP/s> GOP/s            each path this CPU has
//   bench qgemm_<shape>_f32: <GOP/s> GOP/s               cpu::gemm<float>, the same shape
//   bench qgemm_<shape>_vs_f32: <ratio> x                the path qgemm_u8s8 takes for u8 / f32
//   bench qgemm_<shape>_reduced_vs_f32: <ratio> x        the same with a_max = 127 (reduce_range),
//                                                        when that changes the path
// Threads: OMP_NUM_THREADS (make bench sets 2). About 10 s on 2 cores.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/cpu_features.h"
#include "ops/cpu/gemm.h"
#include "ops/cpu/qgemm.h"
#include "ops/cpu/quant_ops.h"

using namespace kiln;
using namespace kiln::cpu;

namespace {

struct Shape {
    const char* name;
    int64_t M, N, K;
};
const Shape kShapes[] = {
    {"1024x1024x1024", 1024, 1024, 1024},
    {"64x4096x576", 64, 4096, 576},
    {"lenet_conv1", 576, 10, 25},     // 1→10, 5×5 on 28×28: 24×24 pixels
    {"lenet_conv2", 64, 20, 250},     // 10→20, 5×5 on 12×12: 8×8 pixels
    {"lenet_fc1_b64", 64, 50, 320},   // 320→50 at batch 64
    {"cifar_conv2", 961, 32, 216},    // 24→32, 3×3 pad 1 on 31×31
    {"cifar_conv_15x15", 225, 64, 288},  // 32→64, 3×3 pad 1 on 15×15
    {"cifar_conv_7x7", 49, 128, 576},    // 64→128, 3×3 pad 1 on 7×7
};

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

using Clock = std::chrono::steady_clock;

// Seconds per call of f over `reps` back-to-back calls.
template <typename F>
double seconds_per_call(F& f, int reps) {
    const auto t0 = Clock::now();
    for (int r = 0; r < reps; ++r) f();
    return std::chrono::duration<double>(Clock::now() - t0).count() / reps;
}

// How many calls of f take at least 2 ms (after one warm-up call).
template <typename F>
int reps_for_2ms(F& f) {
    f();
    int reps = 1;
    while (seconds_per_call(f, reps) * reps < 2e-3) reps *= 2;
    return reps;
}

constexpr int kSamples = 9;

void bench_shape(const Shape& s, std::mt19937& rng) {
    std::uniform_int_distribution<int> u8(0, 127), i8(-128, 127);  // A ≤ 127: every path can run
    std::vector<uint8_t> A(size_t(s.M * s.K));
    std::vector<int8_t> B(size_t(s.N * s.K));
    for (auto& a : A) a = uint8_t(u8(rng));
    for (auto& b : B) b = int8_t(i8(rng));
    const std::vector<float> Af(A.begin(), A.end()), Bf(B.begin(), B.end());
    std::vector<int32_t> C(size_t(s.M * s.N));
    std::vector<float> Cf(C.size());
    auto f32 = [&] { gemm<float>(false, true, s.M, s.N, s.K, 1.0f, Af.data(), s.K, Bf.data(), s.K, 0.0f, Cf.data(), s.N); };
    const std::vector<QgemmPath> paths = qgemm_available_paths();
    std::vector<std::function<void()>> runs;
    for (QgemmPath path : paths) {
        const int32_t a_max = path == QgemmPath::Avx2Maddubs ? kActQmaxReduced : kActQmax;
        runs.push_back([&, path, a_max] {
            qgemm_u8s8_on(path, s.M, s.N, s.K, A.data(), s.K, B.data(), s.K, C.data(), s.N, a_max);
        });
    }
    // The samples of f32 and of each path in turns, so that a change in the machine's load
    // touches all of them alike; a speedup is the median of the sample-by-sample ratios.
    const int f32_reps = reps_for_2ms(f32);
    std::vector<int> reps;
    for (auto& run : runs) reps.push_back(reps_for_2ms(run));
    std::vector<double> f32_s;
    std::vector<std::vector<double>> path_s(paths.size()), ratios(paths.size());
    for (int sample = 0; sample < kSamples; ++sample) {
        f32_s.push_back(seconds_per_call(f32, f32_reps));
        for (size_t i = 0; i < paths.size(); ++i) {
            path_s[i].push_back(seconds_per_call(runs[i], reps[i]));
            ratios[i].push_back(f32_s.back() / path_s[i].back());
        }
    }
    const double ops = 2.0 * s.M * s.N * s.K;
    for (size_t i = 0; i < paths.size(); ++i)
        std::printf("bench qgemm_%s_%s: %.1f GOP/s\n", s.name, qgemm_path_name(paths[i]), ops / median(path_s[i]) / 1e9);
    std::printf("bench qgemm_%s_f32: %.1f GOP/s\n", s.name, ops / median(f32_s) / 1e9);
    auto ratio_of = [&](QgemmPath p) { return median(ratios[size_t(std::find(paths.begin(), paths.end(), p) - paths.begin())]); };
    const QgemmPath full = qgemm_path(kActQmax), reduced = qgemm_path(kActQmaxReduced);
    std::printf("bench qgemm_%s_vs_f32: %.2f x\n", s.name, ratio_of(full));
    if (reduced != full) std::printf("bench qgemm_%s_reduced_vs_f32: %.2f x\n", s.name, ratio_of(reduced));
}

}  // namespace

int main() {
    std::printf("# cpu: %s\n", cpu_features_line().c_str());
    std::printf("# qgemm_u8s8 takes %s for u8 and %s for reduce_range (a_max = 127); f32: cpu::gemm<float> (%s)\n",
                qgemm_path_name(qgemm_path(kActQmax)), qgemm_path_name(qgemm_path(kActQmaxReduced)),
                gemm_path<float>(cpu_level()));
    std::mt19937 rng(1);
    for (const Shape& s : kShapes) bench_shape(s, rng);
}
