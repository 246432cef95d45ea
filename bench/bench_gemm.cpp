// bench_gemm.cpp — kiln::cpu::gemm against OpenBLAS's cblas_sgemm at its best, on the shapes
// kiln uses.
//
//   make build/bench/bench_gemm && OMP_NUM_THREADS=2 build/bench/bench_gemm
//
// OpenBLAS picks its kernels for the CPU it detects when it loads, and may guess wrong: Debian's
// OpenBLAS 0.3.21 takes an Intel Emerald Rapids for a "Prescott" of 2004 and runs SGEMM 1024³ at
// 36 GFLOP/s instead of 232 with its SkylakeX kernels. So the benchmark measures kiln once, then
// runs itself again (`bench_gemm openblas`) once per OpenBLAS core type, with OPENBLAS_CORETYPE
// set to it; a type this OpenBLAS build does not have (it falls back to the detected one, which
// openblas_get_corename() shows) or this CPU cannot run (the run dies of an illegal
// instruction) is reported and left out. kiln is compared with the fastest core type: the one
// whose GFLOP/s have the highest geometric mean over the shapes (one type for all shapes, so
// that one lucky sample cannot pick the winner of a shape).
// The comparison itself is paired: kiln and that core type take turns, kPairedRounds times, each
// round's ratio is kiln's figure over OpenBLAS's from seconds later, and the medians over the
// rounds are printed. A shared machine's speed drifts over minutes (on a 2-core Zen 4 VM, three
// `make bench` runs of the same code measured 1024³ at 0.66, 0.80 and 0.93× OpenBLAS when kiln
// was timed once and OpenBLAS a minute later). Prints one comment line per core type, then per
// shape three lines in the `make bench` format:
//   # OpenBLAS Haswell: 1024 150.2 mlp_256x256x784 80.3 ... GFLOP/s
//   bench gemm_f32_1024: 123.4 GFLOP/s (path avx2-fma)
//   bench openblas_gemm_f32_1024: 150.2 GFLOP/s (core type Haswell, the fastest of 9)
//   bench gemm_f32_1024_vs_openblas: 0.82 ratio (median of 5 paired rounds)
// On a CPU with AVX-512, the same three lines again with kiln capped at avx2 (KILN_CPU=avx2) and
// the faster of OpenBLAS's AVX2 core types (Haswell, Zen) — what a CPU without AVX-512 compares,
// approximated on this one:
//   bench gemm_f32_1024_avx2_vs_openblas_avx2: 0.95 ratio (median of 5 paired rounds)
// GFLOP/s = 2·M·N·K / seconds / 1e9, the median of 11 timed samples (each ~10 ms) after
// warm-up. Each library runs in its own process, so neither one's idle threads, which spin for
// a while after a call (OpenBLAS's for ~0.1 s), steal the cores from the other.
// Both use OMP_NUM_THREADS threads (bench/run.sh sets 2). OPENBLAS_L2_SIZE is unset in the
// OpenBLAS runs, so that OpenBLAS sizes its blocks for the cache it detects. OpenBLAS is linked
// into this benchmark only, never into kiln.
//
// Then kiln's f32 gemm on the portable path (the micro-kernel in the compiler's 4-float vectors,
// gemm_tile.h), and its gemm on f16 and bf16 operands (chapter 09), on each path this CPU can
// take: the one cpu_level() picks (KILN_CPU caps it), then the avx512, avx2 and portable levels'
// where they differ ("_avx512", "_avx2", "_portable"), after a comment line with the CPU's features
// (core/cpu_features.h):
//   # cpu: AMD EPYC · avx2 fma f16c avx512f avx512bw avx512_bf16 avx512_vnni (level avx512; ...)
//   bench gemm_f32_1024_avx2: 90.2 GFLOP/s (path avx2-fma)
//   bench gemm_f32_1024_portable: 30.2 GFLOP/s (path vectors)
//   bench gemm_bf16_1024: 280.0 GFLOP/s (path avx512-bf16)
//   bench gemm_bf16_1024_avx2: 151.3 GFLOP/s (path avx2)
// The 16-bit paths differ in how f16/bf16 become f32 and back (gemm.h, "How the path is
// picked") and in the micro-kernel: f32 FMA on every path but bf16's on a CPU with AVX512-BF16
// where vdpbf16ps is the faster (gemm_tile.h), and bf16's on AMX tiles where those are faster
// (path amx-bf16; the "_avx512" line is then the path they replace).
#include <cblas.h>
#include <omp.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/cpu_features.h"
#include "ops/cpu/gemm.h"

extern "C" {  // declared in OpenBLAS's cblas.h
void openblas_set_num_threads(int num_threads);
char* openblas_get_corename(void);
}

namespace {

struct Shape {
    std::string name;  // as printed: gemm_f32_<name>
    bool ta, tb;
    int64_t M, N, K;
};

// A, B and C of one shape in T (float, f16, bf16): uniform in [-1, 1], rounded to T.
template <typename T = float>
struct Operands {
    std::vector<T> A, B, C;
};

template <typename T = float>
Operands<T> make_operands(const Shape& s) {
    std::mt19937 rng(42);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    Operands<T> o{std::vector<T>(static_cast<size_t>(s.M * s.K)),
                  std::vector<T>(static_cast<size_t>(s.K * s.N)),
                  std::vector<T>(static_cast<size_t>(s.M * s.N))};
    for (T& x : o.A) x = T(dist(rng));
    for (T& x : o.B) x = T(dist(rng));
    return o;
}

template <typename T>
void run_kiln(const Shape& s, Operands<T>& o) {
    kiln::cpu::gemm(s.ta, s.tb, s.M, s.N, s.K, 1.0f, o.A.data(), s.ta ? s.M : s.K, o.B.data(),
                    s.tb ? s.K : s.N, 0.0f, o.C.data(), s.N);
}

void run_openblas(const Shape& s, Operands<>& o) {
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

// Median seconds per call of f over 11 samples of ~10 ms each, after a warm-up (page faults,
// packing buffers, waking the thread pool).
template <typename F>
double median_time(F&& f) {
    const double once = time_per_call(f, 2);
    const int reps = std::max(1, static_cast<int>(0.010 / std::max(once, 1e-9)));
    std::vector<double> samples;
    for (int sample = 0; sample < 11; ++sample) samples.push_back(time_per_call(f, reps));
    return median(samples);
}

const Shape kShapes[] = {
    {"1024", false, false, 1024, 1024, 1024},
    // MLP layer, batch 256, 784 -> 256: forward Y = X·Wᵀ, and the weight gradient dYᵀ·X.
    {"mlp_256x256x784", false, true, 256, 256, 784},
    {"mlp_dw_256x784x256", true, false, 256, 784, 256},
    // im2col convolution: 64 output channels, 3×3×64 = 576, a 64×64 output image.
    {"conv_64x4096x576", false, false, 64, 4096, 576},
    // small: read in place, not packed (gemm.cpp, "Small products"); on one thread.
    {"64", false, false, 64, 64, 64},
};

// OpenBLAS 0.3.21's x86-64 core types (names that OPENBLAS_CORETYPE accepts and that have
// kernels of their own; Katmai, Northwood and the like are other names for Prescott's).
const char* const kCoreTypes[] = {"Prescott",  "Atom",         "Core2",      "Penryn",      "Dunnington",
                                  "Nehalem",   "Nano",         "Opteron",    "Opteron_SSE3", "Barcelona",
                                  "Bulldozer", "Piledriver",   "Steamroller", "Excavator",  "Sandybridge",
                                  "Haswell",   "Zen",          "SkylakeX",   "Cooperlake",  "SapphireRapids"};

// GFLOP/s of one library on one shape.
template <typename F>
double gflops(const Shape& s, F&& f) {
    return 2.0 * s.M * s.N * s.K / median_time(f) / 1e9;
}

// `bench_gemm openblas`: OpenBLAS alone, with the core type of this process's environment.
// Prints "corename <name>", then one "<shape> <GFLOP/s>" line per shape.
void openblas_child(int threads) {
    openblas_set_num_threads(threads);
    std::printf("corename %s\n", openblas_get_corename());
    for (const Shape& s : kShapes) {
        Operands<> o = make_operands(s);
        std::printf("%s %.1f\n", s.name.c_str(), gflops(s, [&] { run_openblas(s, o); }));
    }
}

// One OpenBLAS core type's figures, by shape name; empty, with `why` set, when it did not run.
struct CoreRun {
    std::string core;
    std::map<std::string, double> gflops;
    std::string why;
};

// Runs this program again as `bench_gemm openblas` with OPENBLAS_CORETYPE=core.
CoreRun run_core_type(const std::string& self, const char* core) {
    CoreRun run{core, {}, ""};
    setenv("OPENBLAS_CORETYPE", core, 1);
    unsetenv("OPENBLAS_L2_SIZE");
    FILE* child = popen(("'" + self + "' openblas 2>/dev/null").c_str(), "r");
    if (!child) {
        run.why = "could not start";
        return run;
    }
    char name[256];
    double value = 0;
    std::string got;
    if (std::fscanf(child, "corename %255s", name) == 1) got = name;
    while (std::fscanf(child, "%255s %lf", name, &value) == 2) run.gflops[name] = value;
    const int status = pclose(child);
    if (!got.empty() && got != core) {
        run.why = "not in this OpenBLAS build (it ran " + got + ")";
        run.gflops.clear();
    } else if (status != 0 || run.gflops.size() != std::size(kShapes)) {
        // The shell reports a child killed by signal n as exit status 128 + n (SIGILL: 132).
        run.why = "cannot run on this CPU (exit status " + std::to_string(WEXITSTATUS(status)) + ")";
        run.gflops.clear();
    }
    return run;
}

// This program's own path, for running it again.
std::string self_path() {
    char path[4096];
    const ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
    if (n <= 0) {
        std::perror("bench_gemm: /proc/self/exe");
        std::exit(1);
    }
    return std::string(path, static_cast<size_t>(n));
}

// Runs every core type in turn, prints one comment line each, and returns those that ran.
std::vector<CoreRun> run_core_types() {
    const std::string self = self_path();
    std::vector<CoreRun> ran;
    for (const char* core : kCoreTypes) {
        CoreRun run = run_core_type(self, core);
        std::printf("# OpenBLAS %s:", core);
        if (!run.why.empty()) {
            std::printf(" %s\n", run.why.c_str());
        } else {
            for (const Shape& s : kShapes) std::printf(" %s %.1f", s.name.c_str(), run.gflops[s.name]);
            std::printf(" GFLOP/s\n");
            ran.push_back(run);
        }
        std::fflush(stdout);
    }
    return ran;
}

// The core type with the highest geometric mean of GFLOP/s over the shapes.
const CoreRun& fastest(const std::vector<CoreRun>& ran) {
    const auto log_mean = [](const CoreRun& run) {
        double sum = 0;
        for (const auto& [shape, g] : run.gflops) sum += std::log(g);
        return sum;  // the same number of shapes for every run: the sum orders them as the mean
    };
    return *std::max_element(ran.begin(), ran.end(),
                             [&](const CoreRun& a, const CoreRun& b) { return log_mean(a) < log_mean(b); });
}

// The fastest of the core types in `ran` whose kernels use AVX2 at most (Haswell, Zen): what
// OpenBLAS runs on a CPU without AVX-512. Null if none ran.
const CoreRun* fastest_avx2(const std::vector<CoreRun>& ran) {
    std::vector<CoreRun> avx2;
    for (const CoreRun& run : ran)
        if (run.core == "Haswell" || run.core == "Zen") avx2.push_back(run);
    if (avx2.empty()) return nullptr;
    const std::string core = fastest(avx2).core;
    return &*std::find_if(ran.begin(), ran.end(), [&](const CoreRun& run) { return run.core == core; });
}

// kiln's f32 GFLOP/s on every shape, by name, at CPU level `level`.
std::map<std::string, double> kiln_figures(kiln::CpuLevel level) {
    const kiln::CpuLevel before = kiln::set_cpu_level_cap(level);
    std::map<std::string, double> g;
    for (const Shape& s : kShapes) {
        Operands<> o = make_operands(s);
        g[s.name] = gflops(s, [&] { run_kiln(s, o); });
    }
    kiln::set_cpu_level_cap(before);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // kiln's threads fall asleep
    return g;
}

// The three `make bench` lines of each shape: kiln at CPU level `level`, the core type `best`,
// their ratio, each the median of kPairedRounds rounds of kiln then `best` (header comment).
// `suffix` tells the lines apart when kiln is capped below its level ("_avx2").
constexpr int kPairedRounds = 5;

void print_comparison(const std::string& self, const CoreRun& best, size_t core_types, kiln::CpuLevel level,
                      const std::string& suffix) {
    std::map<std::string, std::vector<double>> kiln, blas, ratio;
    for (int round = 0; round < kPairedRounds; ++round) {
        const std::map<std::string, double> k = kiln_figures(level);
        const CoreRun b = run_core_type(self, best.core.c_str());
        for (const Shape& s : kShapes) {
            if (!b.why.empty()) continue;  // a failed round is left out
            kiln[s.name].push_back(k.at(s.name));
            blas[s.name].push_back(b.gflops.at(s.name));
            ratio[s.name].push_back(k.at(s.name) / b.gflops.at(s.name));
        }
    }
    for (const Shape& s : kShapes) {
        if (ratio[s.name].empty()) continue;
        const char* name = s.name.c_str();
        std::printf("bench gemm_f32_%s%s: %.1f GFLOP/s (path %s)\n", name, suffix.c_str(), median(kiln[s.name]),
                    kiln::cpu::gemm_path<float>(level));
        std::printf("bench openblas_gemm_f32_%s%s: %.1f GFLOP/s (core type %s, the fastest of %zu)\n", name,
                    suffix.c_str(), median(blas[s.name]), best.core.c_str(), core_types);
        std::printf("bench gemm_f32_%s%s_vs_openblas%s: %.2f ratio (median of %zu paired rounds)\n", name,
                    suffix.c_str(), suffix.c_str(), median(ratio[s.name]), ratio[s.name].size());
    }
}

// kiln's gemm in T on every shape: on cpu_level()'s path (unless with_main is false: f32's main
// figures are printed beside OpenBLAS's), then on the avx512, avx2 and portable levels' if they differ.
template <typename T>
void bench_paths(const char* type, bool with_main) {
    using kiln::CpuLevel;
    using kiln::cpu::gemm_path;
    std::vector<CpuLevel> levels;  // the main level, then each lower one whose path differs
    for (CpuLevel level : {kiln::cpu_level(), CpuLevel::Avx512, CpuLevel::Avx2, CpuLevel::Portable}) {
        bool seen = level > kiln::cpu_level();
        for (CpuLevel l : levels) seen = seen || std::strcmp(gemm_path<T>(l), gemm_path<T>(level)) == 0;
        if (!seen) levels.push_back(level);
    }
    if (!with_main) levels.erase(levels.begin());
    for (const Shape& s : kShapes) {
        Operands<T> o = make_operands<T>(s);
        for (CpuLevel level : levels) {
            const CpuLevel before = kiln::set_cpu_level_cap(level);
            const double g = gflops(s, [&] { run_kiln(s, o); });
            kiln::set_cpu_level_cap(before);
            const std::string suffix = level == kiln::cpu_level() ? "" : std::string("_") + kiln::cpu_level_name(level);
            std::printf("bench gemm_%s_%s%s: %.1f GFLOP/s (path %s)\n", type, s.name.c_str(), suffix.c_str(), g,
                        gemm_path<T>(level));
            std::fflush(stdout);
        }
    }
}

}  // namespace

int main(int argc, char** argv) {
    const int threads = omp_get_max_threads();  // OMP_NUM_THREADS
    if (argc > 1 && std::strcmp(argv[1], "openblas") == 0) {
        openblas_child(threads);
        return 0;
    }
    std::printf("# kiln gemm vs OpenBLAS at its best core type, %d thread(s), each figure the median of 11 samples\n",
                threads);
    if (const char* env = std::getenv("OPENBLAS_CORETYPE")) {
        std::printf("# OpenBLAS runs as %s here (OPENBLAS_CORETYPE=%s)\n", openblas_get_corename(), env);
    } else {
        std::printf("# OpenBLAS detects this CPU as %s\n", openblas_get_corename());
    }
    std::fflush(stdout);
    std::printf("# cpu: %s (level %s; the CPU's best is %s, KILN_CPU caps it)\n", kiln::cpu_features_line().c_str(),
                kiln::cpu_level_name(kiln::cpu_level()), kiln::cpu_level_name(kiln::detected_cpu_level()));
    bench_paths<float>("f32", false);
    bench_paths<kiln::f16>("f16", true);
    bench_paths<kiln::bf16>("bf16", true);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // kiln's threads fall asleep

    const std::vector<CoreRun> ran = run_core_types();
    if (ran.empty()) {
        std::printf("bench_gemm: no OpenBLAS core type ran\n");
        return 1;
    }
    print_comparison(self_path(), fastest(ran), ran.size(), kiln::cpu_level(), "");
    // On an AVX-512 CPU, also what a learner's AVX2 CPU would compare: kiln's avx2 path against
    // OpenBLAS's AVX2 kernels (on this CPU, not on an AVX2 one: a proxy).
    const CoreRun* avx2 = fastest_avx2(ran);
    if (kiln::cpu_level() > kiln::CpuLevel::Avx2 && avx2)
        print_comparison(self_path(), *avx2, 2, kiln::CpuLevel::Avx2, "_avx2");
    return 0;
}
