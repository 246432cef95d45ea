// bench_sparse.cpp — chapter 10's speed-versus-sparsity curve: a pruned Linear's forward as
// the dense GEMM the trainers run (matmul + add_bias_, the Linear layer's path) against
// csr_linear on its weight in compressed sparse rows (ops/sparse.h), and the sparsity from
// which CSR is faster.
//
//   make build/bench/bench_sparse && OMP_NUM_THREADS=2 build/bench/bench_sparse [--svg FILE]
//
// Layers: the MNIST MLP's 784→300 and 300→100 and a larger 1024→1024, each at batch 64 and
// 256; W magnitude-pruned (the smallest |w| set to 0) to 0, 50, 70, 80, 90, 95, 98 and 99%.
// At each point the dense layer and csr_linear are timed in turns, 15 samples of ≥ 2 ms each
// after a warm-up call; a time is the median of its samples, a speedup the median of the 15
// sample-by-sample ratios (the dense GEMM does not look at the values: its time is the same at
// every sparsity, but timing it beside each CSR run keeps a change in the machine's load out of
// the ratio). Prints the CPU, the paths, a table of every point as comment lines, then per
// layer and batch:
//   bench sparse_784x300_b64_dense: 812.3 us             the median over the sparsities
//   bench sparse_784x300_b64_csr_s90: 230.1 us
//   bench sparse_784x300_b64_speedup_s90: 3.53 ratio      dense time / CSR time
//   bench sparse_784x300_b64_crossover: 70 % sparsity     from here on CSR is faster
// (no crossover line, but a comment, if CSR is slower at the highest sparsity measured).
// --svg FILE draws the speedup against sparsity, one line per layer, a panel per batch size,
// the crossovers marked (lessons/10-pruning/figures/csr-speed.svg is this file's output).
// Threads: OMP_NUM_THREADS (make bench sets 2). About 10 s on 2 cores.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/cpu_features.h"
#include "core/rng.h"
#include "io/svg.h"
#include "ops/cpu/gemm.h"
#include "ops/ops.h"
#include "ops/sparse.h"

using namespace kiln;

namespace {

struct Layer {
    const char* name;
    int64_t in, out;
};
const Layer kLayers[] = {{"784x300", 784, 300}, {"300x100", 300, 100}, {"1024x1024", 1024, 1024}};
const int64_t kBatches[] = {64, 256};
const int kSparsity[] = {0, 50, 70, 80, 90, 95, 98, 99};  // percent
constexpr size_t kPoints = std::size(kSparsity);

// One layer at one batch size: per sparsity, the dense and CSR times and CSR's size.
struct Curve {
    Layer layer;
    int64_t batch;
    std::vector<double> dense_us, csr_us, speedups, csr_bytes;
    double speedup(size_t i) const { return speedups[i]; }
    // The crossover: the sparsity (percent) from which on CSR is faster, at it and at every
    // higher sparsity measured (so that one lucky sample below it cannot set it); −1 if none.
    int crossover() const {
        int from = -1;
        for (size_t i = kPoints; i-- > 0 && speedup(i) > 1.0;) from = kSparsity[i];
        return from;
    }
};

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// Seconds per call of f over `reps` back-to-back calls.
template <typename F>
double seconds_per_call(F&& f, int reps) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; r++) f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
}

// Calls that make a sample of f last ≥ 2 ms; the first call is also the warm-up (pool blocks,
// packing buffers, threads).
template <typename F>
int reps_for(F&& f) {
    return std::max(1, int(0.002 / std::max(seconds_per_call(f, 1), 1e-9)));
}

struct Paired {
    double a_us, b_us, ratio;  // the medians of a's and b's samples, and of a/b sample by sample
};

// 15 samples of a, each followed by one of b: on a machine shared with other work, a change of
// load between two samples hits both sides of a ratio alike, and the median drops the samples
// that another process cut into.
template <typename A, typename B>
Paired paired_median_us(A&& a, B&& b) {
    const int ra = reps_for(a), rb = reps_for(b);
    std::vector<double> ta, tb, ratio;
    for (int s = 0; s < 15; s++) {
        ta.push_back(seconds_per_call(a, ra) * 1e6);
        tb.push_back(seconds_per_call(b, rb) * 1e6);
        ratio.push_back(ta.back() / tb.back());
    }
    return {median(ta), median(tb), median(ratio)};
}

// W with its `percent`% smallest-magnitude entries set to 0 (chapter 10's l1_unstructured).
Tensor magnitude_pruned(const Tensor& w, int percent) {
    Tensor p = w.clone();
    float* a = p.data<float>();
    const int64_t n = p.numel(), k = n * percent / 100;
    if (k == 0) return p;
    std::vector<float> mag(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; i++) mag[size_t(i)] = std::fabs(a[i]);
    std::nth_element(mag.begin(), mag.begin() + (k - 1), mag.end());
    const float threshold = mag[size_t(k - 1)];  // the k-th smallest: it and everything below go
    for (int64_t i = 0; i < n; i++)
        if (std::fabs(a[i]) <= threshold) a[i] = 0.0f;
    return p;
}

Curve measure(const Layer& layer, int64_t batch, Rng& rng) {
    const float bound = 1.0f / std::sqrt(float(layer.in));  // Linear's initialization
    const Tensor w = Tensor::uniform({layer.out, layer.in}, -bound, bound, rng);
    const Tensor b = Tensor::uniform({layer.out}, -bound, bound, rng);
    const Tensor x = Tensor::uniform({batch, layer.in}, -1.0f, 1.0f, rng);
    Curve c{layer, batch, {}, {}, {}, {}};
    auto dense = [&] {
        Tensor y = matmul(x, w, false, true);
        add_bias_(y, b);
    };
    for (int percent : kSparsity) {
        const CsrMatrix m = to_csr(magnitude_pruned(w, percent));
        const Paired t = paired_median_us(dense, [&] { csr_linear(x, m, b); });
        c.dense_us.push_back(t.a_us);
        c.csr_us.push_back(t.b_us);
        c.speedups.push_back(t.ratio);
        c.csr_bytes.push_back(double(m.bytes()));
    }
    return c;
}

// 0.2 s of a dense layer before the first timing, so that the first point does not pay for
// starting the OpenMP threads, faulting in the pool's and the GEMM's buffers, and the CPU's
// clock ramping up (it did: 4× the dense time of the next point without it).
void warm_up(Rng& rng) {
    const Tensor w = Tensor::uniform({1024, 1024}, -1.0f, 1.0f, rng), x = Tensor::uniform({256, 1024}, -1.0f, 1.0f, rng);
    for (const auto start = std::chrono::steady_clock::now();
         std::chrono::steady_clock::now() - start < std::chrono::milliseconds(200);)
        matmul(x, w, false, true);
}

// Four comment lines: the dense and CSR times, the speedups and CSR's size at every sparsity.
void print(const Curve& c) {
    std::printf("# %-9s %5ld %10.0f | dense us ", c.layer.name, long(c.batch),
                4.0 * double(c.layer.in * c.layer.out) / 1024);
    for (size_t i = 0; i < kPoints; i++) std::printf(" %8.1f", c.dense_us[i]);
    std::printf("\n# %-9s %5s %10s | CSR us   ", "", "", "");
    for (size_t i = 0; i < kPoints; i++) std::printf(" %8.1f", c.csr_us[i]);
    std::printf("\n# %-9s %5s %10s | speedup  ", "", "", "");
    for (size_t i = 0; i < kPoints; i++) std::printf(" %8.2f", c.speedup(i));
    std::printf("\n# %-9s %5s %10s | CSR KiB  ", "", "", "");
    for (size_t i = 0; i < kPoints; i++) std::printf(" %8.0f", c.csr_bytes[i] / 1024);
    std::printf("\n");
}

void report(const Curve& c) {
    const std::string name = std::string("sparse_") + c.layer.name + "_b" + std::to_string(c.batch);
    const size_t s90 = size_t(std::find(std::begin(kSparsity), std::end(kSparsity), 90) - std::begin(kSparsity));
    std::printf("bench %s_dense: %.1f us\n", name.c_str(), median(c.dense_us));
    std::printf("bench %s_csr_s90: %.1f us\n", name.c_str(), c.csr_us[s90]);
    std::printf("bench %s_speedup_s90: %.2f ratio\n", name.c_str(), c.speedup(s90));
    if (c.crossover() >= 0) std::printf("bench %s_crossover: %d %% sparsity\n", name.c_str(), c.crossover());
    else std::printf("# %s: CSR is slower even at %d%% sparsity\n", name.c_str(), kSparsity[kPoints - 1]);
}

// The figure: speedup against sparsity, a panel per batch size, a line per layer; the
// break-even line at 1× dashed; each crossover marked by a dashed vertical in its layer's colour.
void save_svg(const std::string& path, const std::vector<Curve>& curves, const std::string& cpu) {
    const char* const colours[] = {"#1f77b4", "#d62728", "#2ca02c"};  // one per layer
    double top = 1;
    for (const Curve& c : curves)
        for (size_t i = 0; i < kPoints; i++) top = std::max(top, c.speedup(i));
    Svg svg(900, 420);
    svg.text({450, 24}, "csr_linear against the dense GEMM: y = x·Wᵀ + b with W pruned to each sparsity", 15,
             Anchor::Middle);
    svg.text({450, 44}, cpu, 11, Anchor::Middle, "#555555");
    std::vector<double> xs;
    for (int s : kSparsity) xs.push_back(s);
    for (size_t panel = 0; panel < std::size(kBatches); panel++) {
        Plot plot(svg, {70 + 450.0 * double(panel), 70, 340, 280}, {0, 100}, {0, top * 1.05});
        plot.axes("sparsity (%)", "speedup (dense time / CSR time)");
        svg.text({plot.area().x + plot.area().w / 2, 64}, "batch " + std::to_string(kBatches[panel]), 13,
                 Anchor::Middle);
        svg.line(plot.at(0, 1), plot.at(100, 1), "#888888", 1, true);
        svg.text({plot.at(2, 1).x, plot.at(2, 1).y - 4}, "1× (break-even)", 10, Anchor::Start, "#666666");
        std::vector<std::pair<std::string, std::string>> legend;
        size_t l = 0;
        for (const Curve& c : curves) {
            if (c.batch != kBatches[panel]) continue;
            const std::string colour = colours[l++ % std::size(colours)];
            std::vector<double> ys;
            for (size_t i = 0; i < kPoints; i++) ys.push_back(c.speedup(i));
            const std::vector<Point> points = plot.points(xs, ys);
            svg.polyline(points, colour, 2);
            for (const Point& p : points) svg.rect({p.x - 2.5, p.y - 2.5, 5, 5}, colour);
            std::string label = std::string(c.layer.name) + ": no crossover";
            if (c.crossover() >= 0) {
                svg.line(plot.at(c.crossover(), 0), plot.at(c.crossover(), top * 1.05), colour, 1, true);
                label = std::string(c.layer.name) + ": faster from " + std::to_string(c.crossover()) + "%";
            }
            legend.push_back({label, colour});
        }
        // the legend top left, where the curves are still near the bottom
        svg.legend({plot.area().x + 10, plot.area().y + 10}, legend);
    }
    svg.save(path);
}

}  // namespace

int main(int argc, char** argv) {
    std::string svg_path;
    for (int i = 1; i < argc; i++) {
        if (std::strcmp(argv[i], "--svg") == 0 && i + 1 < argc) svg_path = argv[++i];
        else {
            std::fprintf(stderr, "usage: %s [--svg FILE]\n", argv[0]);
            return 2;
        }
    }
    const std::string cpu = cpu_features_line() + ", " + std::to_string(omp_get_max_threads()) + " threads";
    std::printf("# cpu: %s\n", cpu.c_str());
    std::printf("# dense: matmul + add_bias_ (kiln::cpu::gemm, path %s); csr_linear: ops/cpu/sparse.cpp, panels of\n"
                "# 16 batch rows, two 8-float vectors of accumulators\n",
                cpu::gemm_path<float>(cpu_level()));
    std::printf("# %-9s %5s %10s | sparsity%%", "layer", "batch", "dense KiB");
    for (int s : kSparsity) std::printf(" %8d", s);
    std::printf("\n");
    Rng rng(0);
    warm_up(rng);
    std::vector<Curve> curves;
    for (int64_t batch : kBatches)
        for (const Layer& layer : kLayers) {
            curves.push_back(measure(layer, batch, rng));
            print(curves.back());
        }
    for (const Curve& c : curves) report(c);
    if (!svg_path.empty()) save_svg(svg_path, curves, cpu);
    return 0;
}
