// bench_conv.cpp — the CPU's ways to compute a 3×3 convolution, im2col + GEMM and Winograd's
// F(4×4, 3×3) and F(2×2, 3×3) (chapter 03, ops/cpu/winograd.cpp), on the 3×3 layers of the CIFAR
// nets at batch 256: one forward and one backward of a Conv2d by each, in turn, 5 times.
//
//   make build/bench/bench_conv && OMP_NUM_THREADS=2 build/bench/bench_conv
//
//   bench conv3x3_64to256_15x15_im2col: 298.0 ms (forward + backward, batch 256)
//   bench conv3x3_64to256_15x15_winograd: 190.2 ms (chosen: winograd)
//   bench conv3x3_64to256_15x15_winograd_speedup: 1.57 ratio (median of 5 paired rounds)
//   bench conv3x3_64to256_15x15_winograd2x2_speedup: 1.28 ratio (median of 5 paired rounds)
//
// Winograd runs on every layer here (as KILN_CONV=winograd, and winograd2x2 for the smaller
// tiles), also where conv2d_algo would not choose it: "chosen" says what it picks by default
// (winograd_applies), and the layers where it picks im2col show why. Each round times im2col,
// then F(4×4), then F(2×2); the ratio of each round is taken, and the medians printed, so that a
// change in the machine's load falls on all three.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "nn/conv.h"
#include "ops/all.h"
#include "ops/cpu/winograd.h"

using namespace kiln;

namespace {

constexpr int kRounds = 5;
constexpr int64_t kBatch = 256;

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// Seconds of one forward and one backward of `conv` on x, the way `how` says (then the default
// choice again).
double pass_seconds(Conv2d& conv, const Tensor& x, const Tensor& dy, cpu::WinogradChoice how) {
    cpu::set_winograd_choice(how);
    const auto t0 = std::chrono::steady_clock::now();
    conv.forward(x);
    conv.backward(dy);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    cpu::set_winograd_choice(cpu::WinogradChoice::Auto);
    return s;
}

void bench_layer(int64_t C, int64_t O, int64_t H) {
    Rng rng(1);
    Conv2d conv(C, O, 3, rng, {1, 1, 1, 1, false});
    const Tensor x = Tensor::normal({kBatch, C, H, H}, 0, 1, rng), dy = Tensor::normal({kBatch, O, H, H}, 0, 1, rng);
    using How = cpu::WinogradChoice;
    const How ways[] = {How::Never, How::Always, How::Always2x2};  // im2col, F(4×4), F(2×2)
    for (How how : ways) pass_seconds(conv, x, dy, how);  // warm-up: pool blocks, page faults
    std::vector<double> seconds[3], ratios[3];  // ratios[i]: im2col's time over way i's (i = 1, 2)
    for (int r = 0; r < kRounds; r++)
        for (int i = 0; i < 3; i++) {
            seconds[i].push_back(pass_seconds(conv, x, dy, ways[i]));
            if (i > 0) ratios[i].push_back(seconds[0].back() / seconds[i].back());
        }
    Conv2dParams p;
    p.N = kBatch, p.C = C, p.H = p.W = H, p.O = O, p.KH = p.KW = 3, p.padding = 1;
    char name[64];
    std::snprintf(name, sizeof name, "conv3x3_%lldto%lld_%lldx%lld", (long long)C, (long long)O, (long long)H,
                  (long long)H);
    std::printf("bench %s_im2col: %.1f ms (forward + backward, batch %lld)\n", name, median(seconds[0]) * 1e3,
                (long long)kBatch);
    std::printf("bench %s_winograd: %.1f ms (chosen: %s)\n", name, median(seconds[1]) * 1e3,
                conv_algo_name(cpu::conv2d_algo(p, DType::F32)));
    std::printf("bench %s_winograd_speedup: %.2f ratio (median of %d paired rounds)\n", name, median(ratios[1]),
                kRounds);
    std::printf("bench %s_winograd2x2_speedup: %.2f ratio (median of %d paired rounds)\n", name, median(ratios[2]),
                kRounds);
    std::fflush(stdout);
}

}  // namespace

int main() {
    // make bench's CIFAR net (widths 64/256/256, bench/torch_train.py cifar_net), then lesson 06's (32/64/128)
    const int64_t layers[][3] = {{24, 64, 31}, {64, 64, 15}, {64, 256, 15}, {256, 256, 7}, {24, 32, 31},
                                 {32, 32, 15}, {32, 64, 15}, {64, 64, 7},   {64, 128, 7}};
    for (const auto& l : layers) bench_layer(l[0], l[1], l[2]);
    return 0;
}
