// bench_qgemm.cpp — chapter 11's int8 matrix product (ops/cpu/qgemm.h) on every path this CPU
// can run, against chapter 03's f32 GEMM (cpu::gemm<float>) on the same shapes.
//
//   make build/bench/bench_qgemm && OMP_NUM_THREADS=2 build/bench/bench_qgemm [shape name]
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
// and per layer of the chapter's models, batch 64, the whole of qconv2d (im2col, product,
// requantization) against conv2d_forward<float> (im2col, GEMM, bias) as the trainers run it:
//   bench qconv_<layer>_f32: <img/s> img/s      bench qconv_<layer>_int8: <img/s> img/s
//   bench qconv_<layer>_vs_f32: <ratio> x       (and _reduced_vs_f32 as above)
// and the chapter's two networks whole, as lesson-11 scores them (random weights and images: the
// time does not depend on the values), the int8 network (quant/qmodel.h, min/max observers on one
// batch, --reduce-range auto) against the f32 forward in eval mode with no caches, in its step
// arena, timed in CPU seconds (on a machine others share, run it with OMP_NUM_THREADS=1: the
// ratio of the work's own times, whatever share of a core the process gets):
//   bench qnet_lenet_b64_f32: <img/s> img/s     bench qnet_lenet_b64_int8: <img/s> img/s
//   bench qnet_lenet_b64_vs_f32: <ratio> x      (and qnet_cifar_b128_*: chapter 06's net at batch 128)
// A shape, layer or network name as the argument runs that one alone.
// Threads: OMP_NUM_THREADS (make bench sets 2). About 15 s on 2 cores.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/cpu_features.h"
#include "nn/models.h"
#include "ops/all.h"
#include "ops/quant.h"
#include "quant/fold.h"
#include "quant/qmodel.h"
#include "ops/cpu/gemm.h"
#include "ops/cpu/qgemm.h"

using namespace kiln;
using namespace kiln::cpu;

namespace {

struct ProductShape {
    const char* name;
    int64_t M, N, K;
};
const ProductShape kShapes[] = {
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

// The process's CPU seconds (every thread's): on one thread, the work's own time, however many
// other programs share the machine.
double cpu_seconds() {
    timespec t{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}
bool g_cpu_time = false;  // time in CPU seconds instead of wall seconds (the networks, below)

// Seconds per call of f over `reps` back-to-back calls.
template <typename F>
double seconds_per_call(F& f, int reps) {
    const auto t0 = Clock::now();
    const double c0 = cpu_seconds();
    for (int r = 0; r < reps; ++r) f();
    if (g_cpu_time) return (cpu_seconds() - c0) / reps;
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

// f32 and each of `runs` timed in turns, kSamples samples each, so that a change in the
// machine's load touches all of them alike. Returns the median seconds per call of each run
// and, in `speedups`, the medians of the sample-by-sample ratios f32 / run.
template <typename F32>
std::vector<double> time_against_f32(F32& f32, std::vector<std::function<void()>>& runs, double* f32_seconds,
                                     std::vector<double>* speedups) {
    const int f32_reps = reps_for_2ms(f32);
    std::vector<int> reps;
    for (auto& run : runs) reps.push_back(reps_for_2ms(run));
    std::vector<double> f32_s;
    std::vector<std::vector<double>> run_s(runs.size()), ratios(runs.size());
    for (int sample = 0; sample < kSamples; ++sample) {
        f32_s.push_back(seconds_per_call(f32, f32_reps));
        for (size_t i = 0; i < runs.size(); ++i) {
            run_s[i].push_back(seconds_per_call(runs[i], reps[i]));
            ratios[i].push_back(f32_s.back() / run_s[i].back());
        }
    }
    *f32_seconds = median(f32_s);
    std::vector<double> medians;
    speedups->clear();
    for (size_t i = 0; i < runs.size(); ++i) {
        medians.push_back(median(run_s[i]));
        speedups->push_back(median(ratios[i]));
    }
    return medians;
}

void bench_shape(const ProductShape& s, std::mt19937& rng) {
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
    double f32_s = 0;
    std::vector<double> speedups;
    const std::vector<double> path_s = time_against_f32(f32, runs, &f32_s, &speedups);
    const double ops = 2.0 * s.M * s.N * s.K;
    for (size_t i = 0; i < paths.size(); ++i)
        std::printf("bench qgemm_%s_%s: %.1f GOP/s\n", s.name, qgemm_path_name(paths[i]), ops / path_s[i] / 1e9);
    std::printf("bench qgemm_%s_f32: %.1f GOP/s\n", s.name, ops / f32_s / 1e9);
    auto speedup_of = [&](QgemmPath p) { return speedups[size_t(std::find(paths.begin(), paths.end(), p) - paths.begin())]; };
    const QgemmPath full = qgemm_path(kActQmax), reduced = qgemm_path(kActQmaxReduced);
    std::printf("bench qgemm_%s_vs_f32: %.2f x\n", s.name, speedup_of(full));
    if (reduced != full) std::printf("bench qgemm_%s_reduced_vs_f32: %.2f x\n", s.name, speedup_of(reduced));
}

// ---- whole layers: qconv2d (im2col, product, requantization) against conv2d_forward<float> -------
struct Layer {
    const char* name;
    Conv2dParams p;
};

Conv2dParams conv(int64_t N, int64_t C, int64_t H, int64_t O, int64_t K, int64_t padding) {
    Conv2dParams p;
    p.N = N, p.C = C, p.H = p.W = H, p.O = O, p.KH = p.KW = K, p.padding = padding;
    return p;
}

const Layer kLayers[] = {
    {"lenet_conv1_b64", conv(64, 1, 28, 10, 5, 0)},  {"lenet_conv2_b64", conv(64, 10, 12, 20, 5, 0)},
    {"cifar_conv1_b64", conv(64, 3, 32, 24, 2, 0)},  {"cifar_conv2_b64", conv(64, 24, 31, 32, 3, 1)},
    {"cifar_conv_15x15_b64", conv(64, 32, 15, 64, 3, 1)}, {"cifar_conv_7x7_b64", conv(64, 64, 7, 128, 3, 1)},
    // MobileNetV2's 1×1 convolutions (chapter 13), its second stage at 32×32: expand 24 -> 144, project back
    {"mobilenet_expand_b64", conv(64, 24, 32, 144, 1, 0)}, {"mobilenet_project_b64", conv(64, 144, 32, 24, 1, 0)},
};

void bench_layer(const Layer& l, std::mt19937& rng) {
    const Conv2dParams& p = l.p;
    const int64_t K = p.C * p.KH * p.KW;
    std::uniform_int_distribution<int> u8(0, 255), i8(-128, 127);
    std::vector<uint8_t> x(size_t(p.N * p.C * p.H * p.W)), y(size_t(p.N * p.O * p.P() * p.Q()));
    std::vector<int8_t> w(size_t(p.O * K));
    for (auto& v : x) v = uint8_t(u8(rng));
    for (auto& v : w) v = int8_t(i8(rng));
    const std::vector<int32_t> bias(size_t(p.O), 100);
    const std::vector<Requant> requant(size_t(p.O), make_requant(1.0 / 4096));
    const QOutput out{bias.data(), requant.data(), 10, 10, 255};
    std::vector<uint8_t> work(size_t(qconv2d_work_bytes(p)));
    // f32: the same layer as the trainers run it, im2col workspace for up to 32 MiB of images.
    const std::vector<float> xf(x.begin(), x.end()), wf(w.begin(), w.end()), bf(size_t(p.O), 0.5f);
    std::vector<float> yf(y.size());
    const int64_t per_image = conv2d_col_elems_per_image(p, DType::F32);
    const int64_t col_images = per_image ? std::clamp<int64_t>((32 << 20) / (per_image * 4), 1, p.N) : 0;
    std::vector<float> col(size_t(per_image * col_images));
    auto f32 = [&] { conv2d_forward<float>(xf.data(), wf.data(), bf.data(), yf.data(), p, col.data(), col_images); };
    std::vector<std::function<void()>> runs;
    for (int32_t x_max : {kActQmax, kActQmaxReduced})
        runs.push_back([&, x_max] { qconv2d(x.data(), w.data(), y.data(), p, 10, x_max, out, work.data()); });
    double f32_s = 0;
    std::vector<double> speedups;
    const std::vector<double> int8_s = time_against_f32(f32, runs, &f32_s, &speedups);
    std::printf("bench qconv_%s_f32: %.0f img/s\n", l.name, double(p.N) / f32_s);
    std::printf("bench qconv_%s_int8: %.0f img/s\n", l.name, double(p.N) / int8_s[0]);
    std::printf("bench qconv_%s_vs_f32: %.2f x\n", l.name, speedups[0]);
    if (qgemm_path(kActQmaxReduced) != qgemm_path(kActQmax))
        std::printf("bench qconv_%s_reduced_vs_f32: %.2f x\n", l.name, speedups[1]);
}

// ---- whole networks: the int8 network against the f32 model, as lesson-11 scores them --------------
void bench_net(const char* name, std::unique_ptr<Sequential> model, const kiln::Shape& input) {
    Rng rng(3);
    const Tensor x = Tensor::normal(input, 0.0f, 1.0f, rng, Device::CPU, Category::Data);
    model->eval();
    fold_batchnorm(*model);
    QuantConfig config;
    config.activations = QuantConfig::Observer::MinMax;
    config.reduce_range = reduced_range_is_faster(Device::CPU);  // as lesson-11's --reduce-range auto
    const QuantizedNet q = [&] {
        Calibrator cal(*model, config);  // its observers leave the model with it, before the timing
        cal.run(x);
        return convert(*model, cal);
    }();
    BumpAllocator arena("bench arena", Device::CPU);
    auto f32 = [&] {
        NoGradScope no_grad;
        AllocatorScope scope(arena);
        { Tensor y = model->call(x); }
        arena.reset();
    };
    std::vector<std::function<void()>> runs{[&] { Tensor y = q.forward(x); }};
    double f32_s = 0;
    std::vector<double> speedups;
    g_cpu_time = true;
    const std::vector<double> int8_s = time_against_f32(f32, runs, &f32_s, &speedups);
    g_cpu_time = false;
    std::printf("bench qnet_%s_f32: %.0f img/s\n", name, double(input[0]) / f32_s);
    std::printf("bench qnet_%s_int8: %.0f img/s\n", name, double(input[0]) / int8_s[0]);
    std::printf("bench qnet_%s_vs_f32: %.2f x\n", name, speedups[0]);
}

}  // namespace

int main(int argc, char** argv) {
    const std::string only = argc > 1 ? argv[1] : "";  // a shape's name: that shape alone
    std::printf("# cpu: %s\n", cpu_features_line().c_str());
    std::printf("# qgemm_u8s8 takes %s for u8 and %s for reduce_range (a_max = 127); f32: cpu::gemm<float> (%s)\n",
                qgemm_path_name(qgemm_path(kActQmax)), qgemm_path_name(qgemm_path(kActQmaxReduced)),
                gemm_path<float>(cpu_level()));
    std::mt19937 rng(1);
    for (const ProductShape& s : kShapes)
        if (only.empty() || only == s.name) bench_shape(s, rng);
    for (const Layer& l : kLayers)
        if (only.empty() || only == l.name) bench_layer(l, rng);
    Rng init(1);
    if (only.empty() || only == "lenet_b64") bench_net("lenet_b64", lenet(init), kiln::Shape{64, 1, 28, 28});
    if (only.empty() || only == "cifar_b128")
        bench_net("cifar_b128", cifar_net(init, {32, 64, 128}), kiln::Shape{128, 3, 32, 32});
}
