// common.h — what the kernel lab's files share (llm.c's dev/cuda/common.h): device arrays,
// random inputs, validate_result, timing with CUDA events, the "bench <name>: <value> <unit>"
// line, and the lab's protocol: every version at every block size is validated against the
// CPU reference before any version is timed; on the emulator each version's run also prints what
// a GPU's memory system would do with it (requests, sectors, bank conflicts: print_traffic).
//
// One source, two builds (see each file's header for its command lines):
//   make lab            g++ and kiln's emulator: validates at small sizes, times nothing (the
//                       emulator's times would measure the CPU)
//   make CUDA=1 lab     nvcc, cuBLAS and cuDNN: validates at the real sizes, then times each
//                       version and prints it as a share of the library's (the reference)
// The engine's kernels come from libkiln.a, declared in the family headers of src/ops/ (ops/all.h) and gemm_versions.h;
// the lab never copies them. cuBLAS and cuDNN are linked into the lab binaries only.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include "kiln_cuda.h"
#include "ops/params.h"

#ifdef KILN_CUDA
#include <cublas_v2.h>
#include <cudnn.h>

#define CUBLAS_CHECK(call)                                                                      \
    do {                                                                                        \
        const cublasStatus_t kiln_cublas_status_ = (call);                                      \
        if (kiln_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                       \
            KILN_FAIL(#call, " failed with cuBLAS status ", int(kiln_cublas_status_));          \
    } while (0)
#define CUDNN_CHECK(call)                                                                       \
    do {                                                                                        \
        const cudnnStatus_t kiln_cudnn_status_ = (call);                                        \
        if (kiln_cudnn_status_ != CUDNN_STATUS_SUCCESS)                                         \
            KILN_FAIL(#call, " failed: ", cudnnGetErrorString(kiln_cudnn_status_));             \
    } while (0)
#endif

namespace kiln::lab {

#ifdef KILN_CUDA
// A real GPU: validate at the real sizes, then time. With KILN_LAB_SIZES=emulator in the
// environment, the emulator's small sizes and no timing: the GPU check profiles those launches
// with Nsight Compute, to set its memory counts beside the emulator's (print_traffic).
inline const bool kTiming = [] {
    const char* sizes = std::getenv("KILN_LAB_SIZES");
    return !(sizes && std::string(sizes) == "emulator");
}();
#else
constexpr bool kTiming = false;  // the emulator: validate at small sizes only
#endif

// n values of T in device memory, freed with the object.
template <typename T>
class DeviceArray {
public:
    explicit DeviceArray(size_t n) : n_(n) { KILN_CUDA_CHECK(cudaMalloc(&p_, n * sizeof(T))); }
    explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) {
        KILN_CUDA_CHECK(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
    }
    ~DeviceArray() { cudaFree(p_); }
    DeviceArray(const DeviceArray&) = delete;
    DeviceArray& operator=(const DeviceArray&) = delete;

    T* get() const { return p_; }
    size_t size() const { return n_; }
    // Every byte 0xff: a float NaN, so a value the kernel never wrote fails validation.
    void poison() { KILN_CUDA_CHECK(cudaMemset(p_, 0xff, n_ * sizeof(T))); }

private:
    T* p_ = nullptr;
    size_t n_;
};

// n floats uniform in [low, high), the same for a given seed on every machine.
inline std::vector<float> random_floats(size_t n, unsigned seed, float low = -1.0f, float high = 1.0f) {
    std::mt19937 gen(seed);
    std::uniform_real_distribution<float> dist(low, high);
    std::vector<float> v(n);
    for (float& x : v) x = dist(gen);
    return v;
}

// Compares a result with the CPU's (llm.c's validate_result): element i passes when
//   |gpu − cpu| ≤ atol + rtol·|cpu|          (NaN never passes: an unwritten output is NaN)
// Prints the first values side by side, the largest absolute and relative errors, and the
// first mismatches; returns false when any element fails.
inline bool validate_values(const std::vector<float>& gpu, const std::vector<float>& cpu, const std::string& name,
                            double atol, double rtol) {
    size_t bad = 0;
    double max_abs = 0, max_rel = 0;
    for (size_t i = 0; i < cpu.size(); i++) {
        const double err = std::fabs(double(gpu[i]) - double(cpu[i]));
        const bool ok = err <= atol + rtol * std::fabs(double(cpu[i]));  // false for NaN
        if (!ok && bad++ < 5) std::printf("    MISMATCH %s[%zu]: cpu %.6g, gpu %.6g\n", name.c_str(), i, cpu[i], gpu[i]);
        if (std::isnan(err)) continue;
        max_abs = std::fmax(max_abs, err);
        if (cpu[i] != 0.0f) max_rel = std::fmax(max_rel, err / std::fabs(double(cpu[i])));
    }
    std::printf("  %-48s %s  first cpu %.6g gpu %.6g  max abs err %.2e  max rel err %.2e", name.c_str(),
                bad ? "FAIL" : "ok  ", double(cpu.at(0)), double(gpu.at(0)), max_abs, max_rel);
    if (bad) std::printf("  (%zu of %zu beyond %.1e + %.1e·|cpu|)", bad, cpu.size(), atol, rtol);
    std::printf("\n");
    return bad == 0;
}

// The same for cpu.size() floats of device memory.
inline bool validate_result(const float* device_result, const std::vector<float>& cpu, const std::string& name,
                            double atol, double rtol) {
    std::vector<float> gpu(cpu.size());
    KILN_CUDA_CHECK(cudaMemcpy(gpu.data(), device_result, cpu.size() * sizeof(float), cudaMemcpyDeviceToHost));
    return validate_values(gpu, cpu, name, atol, rtol);
}

// Milliseconds per call of f, timed by two CUDA events (the GPU's own clock: launches are
// asynchronous, so a host timer would measure the launch queue). One timed warm-up call
// decides the repetitions: enough for about 200 ms, at least 2, at most 100.
template <typename F>
double time_ms(F f) {
    cudaEvent_t start, stop;
    KILN_CUDA_CHECK(cudaEventCreate(&start));
    KILN_CUDA_CHECK(cudaEventCreate(&stop));
    const auto timed = [&](int reps) {
        KILN_CUDA_CHECK(cudaEventRecord(start));
        for (int i = 0; i < reps; i++) f();
        KILN_CUDA_CHECK(cudaEventRecord(stop));
        KILN_CUDA_CHECK(cudaEventSynchronize(stop));
        float ms = 0;
        KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
        return double(ms) / reps;
    };
    const double first = timed(1);
    const double ms = timed(int(std::fmin(100.0, std::fmax(2.0, 200.0 / std::fmax(first, 1e-3)))));
    KILN_CUDA_CHECK(cudaEventDestroy(start));
    KILN_CUDA_CHECK(cudaEventDestroy(stop));
    return ms;
}

// One version of a kernel: its number, its name in the output and the block sizes (threads per
// block) it is validated and timed at; {0} when its launcher picks its own (the engine's
// kernels). The numbers are the chapter's ("gemm 3" runs what chapter 04 calls version 3); a
// version the lab adds before the chapter's first is version 0.
struct Version {
    int number;
    const char* name;
    std::vector<int> block_sizes;
};

inline std::string version_label(const Version& version, int block_size) {
    std::string s = "v" + std::to_string(version.number) + "_" + version.name;
    return block_size ? s + "_b" + std::to_string(block_size) : s;
}

// chosen_version's answer when the command line names no version: run them all.
constexpr int kAllVersions = -1;

inline bool is_chosen(const Version& version, int chosen) {
    return chosen == kAllVersions || chosen == version.number;
}

// The version asked for on the command line ("gemm 3": version 3 only), or kAllVersions.
inline int chosen_version(int argc, char** argv, const std::vector<Version>& versions) {
    if (argc < 2) return kAllVersions;
    char* end = nullptr;
    const long v = std::strtol(argv[1], &end, 10);
    bool known = false;
    for (const Version& version : versions) known = known || (*end == '\0' && v == version.number);
    KILN_CHECK(known, "unknown version '", argv[1], "': this lab has versions ", versions.front().number, " to ",
               versions.back().number, " (see the file's header); give none to run them all");
    return int(v);
}

#ifndef KILN_CUDA
// What a GPU's memory system would do with the launches of one version's run, as the emulator
// counted them (cuda/emu/README.md, "requests, sectors, bank conflicts"): per kernel, its global
// loads and stores (requests, 32-byte sectors per request: 4 is a coalesced warp of floats) and
// its shared memory accesses (requests, wavefronts per request, and the bank conflicts: the
// wavefronts beyond the ideal). One line per kernel, under the version's own line.
inline void print_traffic(const std::vector<emu::LaunchTraffic>& launches) {
    struct Kernel {
        std::string name;
        int launches = 0;
        emu::LaunchTraffic sum;
    };
    std::vector<Kernel> kernels;  // in order of first launch
    bool traced = false;
    for (const emu::LaunchTraffic& l : launches) {
        traced = traced || l.traced;
        auto it = std::find_if(kernels.begin(), kernels.end(), [&](const Kernel& k) { return k.name == l.kernel; });
        if (it == kernels.end()) it = kernels.insert(kernels.end(), Kernel{l.kernel, 0, {}});
        it->launches++;
        for (auto [to, from] : {std::pair{&it->sum.global_load, &l.global_load}, {&it->sum.global_store, &l.global_store},
                                {&it->sum.shared_load, &l.shared_load}, {&it->sum.shared_store, &l.shared_store}})
            to->requests += from->requests, to->sectors += from->sectors, to->ideal += from->ideal, to->bytes += from->bytes;
    }
    if (!traced) return;  // kernels built without tracing (not the lab's emulator build): nothing counted
    const auto per = [](const emu::AccessCounts& c) { return c.requests ? double(c.sectors) / double(c.requests) : 0.0; };
    for (const Kernel& k : kernels) {
        const emu::LaunchTraffic& t = k.sum;
        std::printf("      %-30s global ld %7llu req %5.2f sect/req  st %6llu req %5.2f", k.name.c_str(),
                    (unsigned long long)t.global_load.requests, per(t.global_load),
                    (unsigned long long)t.global_store.requests, per(t.global_store));
        if (t.shared_load.requests + t.shared_store.requests > 0)
            std::printf("  shared ld %7llu req %5.2f wavefr/req  st %6llu req %5.2f  conflicts %llu",
                        (unsigned long long)t.shared_load.requests, per(t.shared_load),
                        (unsigned long long)t.shared_store.requests, per(t.shared_store),
                        (unsigned long long)(t.shared_load.sectors - t.shared_load.ideal + t.shared_store.sectors -
                                             t.shared_store.ideal));
        std::printf("\n");
    }
}

// KILN_LAB_TRAFFIC_LOG=FILE in the environment: counting stays on for the whole run, and every
// counted launch is appended to FILE, one line each —
//   page  n  kernel  traced  global ld req, sectors  st req, sectors  shared ld req, wavefronts,
//   ideal  st req, wavefronts, ideal                                               (tab-separated)
// — in launch order, n from 0 per page: `make gpu-check-prepare` carries this for the GPU check,
// which sets Nsight Compute's counts of the same launches (the lab at these sizes on the GPU:
// KILN_LAB_SIZES=emulator) beside them.
inline std::string& lab_page() {
    static std::string page = "lab";
    return page;
}
inline const char* traffic_log_path() { return std::getenv("KILN_LAB_TRAFFIC_LOG"); }

// emu::take_traffic, with the launches it returns appended to the log when there is one.
inline std::vector<emu::LaunchTraffic> take_traffic_logged() {
    std::vector<emu::LaunchTraffic> launches = emu::take_traffic();
    const char* path = traffic_log_path();
    if (!path || launches.empty()) return launches;
    static int n = 0;
    FILE* f = std::fopen(path, "a");
    KILN_CHECK(f, "KILN_LAB_TRAFFIC_LOG: cannot append to '", path, "'");
    const auto c = [](const emu::AccessCounts& a) { return (unsigned long long)a.requests; };
    const auto s = [](const emu::AccessCounts& a) { return (unsigned long long)a.sectors; };
    const auto i = [](const emu::AccessCounts& a) { return (unsigned long long)a.ideal; };
    for (const emu::LaunchTraffic& l : launches)
        std::fprintf(f, "%s\t%d\t%s\t%d\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu\n",
                     lab_page().c_str(), n++, l.kernel.c_str(), int(l.traced), c(l.global_load), s(l.global_load),
                     c(l.global_store), s(l.global_store), c(l.shared_load), s(l.shared_load), i(l.shared_load),
                     c(l.shared_store), s(l.shared_store), i(l.shared_store));
    std::fclose(f);
    return launches;
}
#endif

// Step 1 of the lab's protocol (llm.c's main loop): every chosen version at every block size
// runs (run(version, block) poisons its output first) and is checked against the CPU
// reference (check(label) returns false on a mismatch). On the emulator each runs twice, with
// the threads of a block in order and in reverse between barriers: a missing __syncthreads()
// shows in one of the two; the first run also counts what a GPU's memory system would do with
// its kernels' accesses (print_traffic, under the version's line). Returns false when any version
// disagreed.
template <typename Run, typename Check>
bool validate_versions(const std::vector<Version>& versions, int chosen, Run run, Check check) {
#ifdef KILN_CUDA
    const char* schedules[] = {""};
#else
    const char* schedules[] = {"", "_reverse"};
#endif
    bool ok = true;
    for (const char* schedule : schedules) {
#ifndef KILN_CUDA
        emu::ScopedSchedule scope(*schedule ? emu::Schedule::Reverse : emu::Schedule::InOrder);
#endif
        for (const Version& version : versions) {
            if (!is_chosen(version, chosen)) continue;
            for (int block : version.block_sizes) {
#ifdef KILN_CUDA
                run(version.number, block);
                ok = check(version_label(version, block) + schedule) && ok;
#else
                take_traffic_logged();  // launches before this version's (logged when asked)
                {
                    emu::ScopedTraffic counting(!*schedule);  // the first run only
                    run(version.number, block);
                }
                const std::vector<emu::LaunchTraffic> traffic = take_traffic_logged();
                ok = check(version_label(version, block) + schedule) && ok;
                print_traffic(traffic);
#endif
            }
        }
    }
    return ok;
}

// Step 2, only when step 1 passed and only on a GPU: times each version at each block size
// and prints, one line each,
//   bench <problem>_<version label>: <work / seconds> <unit>  (<share>% of <reference>)
//   bench <problem>_<reference>: <work / seconds> <unit>
// reference_ms is the library's time for the same problem (cuBLAS, cuDNN).
template <typename Run>
void time_versions(const std::vector<Version>& versions, int chosen, Run run, const std::string& problem,
                   double work, const char* unit, double reference_ms, const char* reference) {
    for (const Version& version : versions) {
        if (!is_chosen(version, chosen)) continue;
        for (int block : version.block_sizes) {
            const double ms = time_ms([&] { run(version.number, block); });
            std::printf("bench %s_%s: %.1f %s  (%.1f%% of %s)\n", problem.c_str(),
                        version_label(version, block).c_str(), work / (ms * 1e-3), unit,
                        100.0 * reference_ms / ms, reference);
        }
    }
    std::printf("bench %s_%s: %.1f %s\n", problem.c_str(), reference, work / (reference_ms * 1e-3), unit);
}

#ifdef KILN_CUDA
// The reference of the convolution pages: cuDNN's passes of p in f32 (groups as p says), FMA
// math only (no TF32 tensor cores), each with the fastest algorithm cuDNN's Find reports, on
// NCHW tensors — or NHWC ones (format CUDNN_TENSOR_NHWC: x, y and w [O, KH, KW, C]). Each
// runs once into its output, validates that with check("cudnn_algoN") (ok becomes the check's
// result), then returns its time in milliseconds.
//   forward          y = conv(x, w) + b (b may be null: cudnnAddTensor adds it)
//   backward_data    dx = conv_transpose(dy, w)
//   backward_filter  dw = Σ_n dy_n ⋆ x_n  (overwritten: cuDNN's beta 0)
class CudnnConv {
public:
    explicit CudnnConv(const Conv2dParams& p, cudnnTensorFormat_t format = CUDNN_TENSOR_NCHW) {
        CUDNN_CHECK(cudnnCreate(&handle_));
        CUDNN_CHECK(cudnnCreateTensorDescriptor(&x_));
        CUDNN_CHECK(cudnnCreateTensorDescriptor(&y_));
        CUDNN_CHECK(cudnnCreateTensorDescriptor(&b_));
        CUDNN_CHECK(cudnnCreateFilterDescriptor(&w_));
        CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&conv_));
        CUDNN_CHECK(cudnnSetTensor4dDescriptor(x_, format, CUDNN_DATA_FLOAT, int(p.N), int(p.C), int(p.H), int(p.W)));
        CUDNN_CHECK(cudnnSetTensor4dDescriptor(y_, format, CUDNN_DATA_FLOAT, int(p.N), int(p.O), int(p.P()),
                                               int(p.Q())));
        CUDNN_CHECK(cudnnSetTensor4dDescriptor(b_, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, int(p.O), 1, 1));
        CUDNN_CHECK(cudnnSetFilter4dDescriptor(w_, CUDNN_DATA_FLOAT, format, int(p.O), int(p.Cg()), int(p.KH),
                                               int(p.KW)));
        CUDNN_CHECK(cudnnSetConvolution2dDescriptor(conv_, int(p.padding), int(p.padding), int(p.stride),
                                                    int(p.stride), int(p.dilation), int(p.dilation),
                                                    CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
        CUDNN_CHECK(cudnnSetConvolutionGroupCount(conv_, int(p.groups)));
        CUDNN_CHECK(cudnnSetConvolutionMathType(conv_, CUDNN_FMA_MATH));
    }
    ~CudnnConv() {
        cudnnDestroyConvolutionDescriptor(conv_);
        cudnnDestroyFilterDescriptor(w_);
        cudnnDestroyTensorDescriptor(b_);
        cudnnDestroyTensorDescriptor(y_);
        cudnnDestroyTensorDescriptor(x_);
        cudnnDestroy(handle_);
    }
    CudnnConv(const CudnnConv&) = delete;
    CudnnConv& operator=(const CudnnConv&) = delete;

    template <typename Check>
    double forward(const float* x, const float* w, const float* b, float* y, const std::string& problem, Check check,
                   bool& ok) {
        cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
        int found = 0;
        CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithm(handle_, x_, w_, conv_, y_, CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
                                                         &found, perf));
        KILN_CHECK(found > 0 && perf[0].status == CUDNN_STATUS_SUCCESS, "cuDNN found no forward algorithm for ",
                   problem);
        DeviceArray<char> workspace(std::max<size_t>(perf[0].memory, 1));
        return run(check, ok, int(perf[0].algo), [&] {
            CUDNN_CHECK(cudnnConvolutionForward(handle_, &one_, x_, x, w_, w, conv_, perf[0].algo, workspace.get(),
                                                perf[0].memory, &zero_, y_, y));
            if (b) CUDNN_CHECK(cudnnAddTensor(handle_, &one_, b_, b, &one_, y_, y));
        });
    }
    template <typename Check>
    double backward_data(const float* dy, const float* w, float* dx, const std::string& problem, Check check,
                         bool& ok) {
        cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
        int found = 0;
        CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithm(handle_, w_, y_, conv_, x_,
                                                              CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &found, perf));
        KILN_CHECK(found > 0 && perf[0].status == CUDNN_STATUS_SUCCESS, "cuDNN found no backward-data algorithm for ",
                   problem);
        DeviceArray<char> workspace(std::max<size_t>(perf[0].memory, 1));
        return run(check, ok, int(perf[0].algo), [&] {
            CUDNN_CHECK(cudnnConvolutionBackwardData(handle_, &one_, w_, w, y_, dy, conv_, perf[0].algo,
                                                     workspace.get(), perf[0].memory, &zero_, x_, dx));
        });
    }
    template <typename Check>
    double backward_filter(const float* x, const float* dy, float* dw, const std::string& problem, Check check,
                           bool& ok) {
        cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
        int found = 0;
        CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithm(handle_, x_, y_, conv_, w_,
                                                                CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &found, perf));
        KILN_CHECK(found > 0 && perf[0].status == CUDNN_STATUS_SUCCESS,
                   "cuDNN found no backward-filter algorithm for ", problem);
        DeviceArray<char> workspace(std::max<size_t>(perf[0].memory, 1));
        return run(check, ok, int(perf[0].algo), [&] {
            CUDNN_CHECK(cudnnConvolutionBackwardFilter(handle_, &one_, x_, x, y_, dy, conv_, perf[0].algo,
                                                       workspace.get(), perf[0].memory, &zero_, w_, dw));
        });
    }

private:
    template <typename Check, typename Pass>
    double run(Check check, bool& ok, int algo, Pass pass) {
        pass();
        ok = check("cudnn_algo" + std::to_string(algo));
        return time_ms(pass);
    }
    cudnnHandle_t handle_;
    cudnnTensorDescriptor_t x_, y_, b_;
    cudnnFilterDescriptor_t w_;
    cudnnConvolutionDescriptor_t conv_;
    const float one_ = 1.0f, zero_ = 0.0f;
};
#endif

// Steps 1 and 2 of a convolution page for one layer: every chosen version validated against
// the CPU's `want` (y poisoned before each run), then, on a GPU, timed beside cuDNN's forward of
// the same problem. work is what one forward does, in unit ("GFLOP/s": GFLOP, "GB/s": GB).
struct ConvProblem {
    std::string name;
    const Conv2dParams& p;
    const float *x, *w, *b;  // on the device; b may be null
    DeviceArray<float>& y;
    const std::vector<float>& want;
    double atol;
};

template <typename Launch>
bool validate_and_time_conv(const std::vector<Version>& versions, int chosen, Launch launch, const ConvProblem& c,
                            double work, const char* unit) {
    const auto check = [&](const std::string& label) { return validate_result(c.y.get(), c.want, label, c.atol, 1e-5); };
    const auto run = [&](int version, int block) {
        c.y.poison();
        launch(version, block);
    };
    bool ok = validate_versions(versions, chosen, run, check);
    if (!ok || !kTiming) return ok;
#ifdef KILN_CUDA
    c.y.poison();
    const double cudnn_ms = CudnnConv(c.p).forward(c.x, c.w, c.b, c.y.get(), c.name, check, ok);
    time_versions(versions, chosen, launch, c.name, work, unit, cudnn_ms, "cudnn");
#else
    (void)work, (void)unit;  // nothing is timed on the emulator
#endif
    return ok;
}

// main's body for every lab file: runs body, turns kiln::Error (a failed CUDA call, a bad
// argument) into a message and exit status 2; a validation failure is exit status 1.
template <typename Body>
int lab_main(const char* program, Body body) {
    try {
#ifndef KILN_CUDA
        lab_page() = program;
        if (traffic_log_path()) emu::set_traffic(true);  // every launch, in order
#endif
        const bool ok = body();
#ifndef KILN_CUDA
        take_traffic_logged();
#endif
        if (!ok) std::printf("%s: some versions disagree with the CPU reference (MISMATCH lines above)\n", program);
        return ok ? 0 : 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s: %s\n", program, e.what());
        return 2;
    }
}

}  // namespace kiln::lab
