// kernel_times.cu — each kernel's time from CUDA events: what --time-report prints per kernel on
// a CUDA device (src/core/cuda_memory.h, train/time_report.h).
//
// While kernel timing is on, KILN_LAUNCH (cuda/kiln_cuda.h) calls kernel_timing_start before the
// kernel is queued and KILN_CHECK_LAUNCH calls kernel_timing_stop after it: each records an event
// on the launch's stream, so the pair brackets the kernel on the GPU's own clock (a host clock
// would time the launch queue, since launches return before their kernels run). The events come
// from a pool reused from step to step. take_kernel_times waits for the device, reads every pair
// (cudaEventElapsedTime) and sums them per kernel name.
//
// On the emulator a launch runs before it returns and an event holds the host clock, so the same
// code times the kernels as the CPU runs them.
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "core/cuda_memory.h"
#include "kiln_cuda.h"

#if defined(__CUDACC__)
#include <cuda_profiler_api.h>
#endif

namespace kiln::cuda {
namespace {

struct Timed {
    const char* kernel;  // the launch macro's #kernel: a string literal
    cudaEvent_t start, stop;
    cudaStream_t stream;
    bool stopped;
};

struct KernelTimer {
    std::mutex mutex;
    std::vector<cudaEvent_t> pool;  // events not in use
    std::vector<Timed> timed;       // this round's launches, in order

    cudaEvent_t event() {
        if (!pool.empty()) {
            cudaEvent_t e = pool.back();
            pool.pop_back();
            return e;
        }
        cudaEvent_t e = nullptr;
        KILN_CUDA_CHECK(cudaEventCreate(&e));
        return e;
    }
    void stop_last() {
        if (timed.empty() || timed.back().stopped) return;
        KILN_CUDA_CHECK(cudaEventRecord(timed.back().stop, timed.back().stream));
        timed.back().stopped = true;
    }
};

KernelTimer& timer() {
    static KernelTimer* t = new KernelTimer;  // never destroyed: launches may come at exit
    return *t;
}

}  // namespace

void set_kernel_timing(bool on) { cuda_detail::kernel_timing().store(on); }

void set_profiler_capture(bool on) {
#if defined(__CUDACC__)
    KILN_CUDA_CHECK(on ? cudaProfilerStart() : cudaProfilerStop());
#else
    (void)on;  // the emulator has no profiler to tell
#endif
}
bool kernel_timing_on() { return cuda_detail::kernel_timing().load(); }

std::vector<KernelTime> take_kernel_times() {
    KernelTimer& t = timer();
    std::lock_guard<std::mutex> lock(t.mutex);
    t.stop_last();
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
    std::map<std::string, KernelTime> by_name;
    std::vector<std::string> order;  // first launch first
    for (const Timed& k : t.timed) {
        float ms = 0;
        KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, k.start, k.stop));
        auto [it, fresh] = by_name.try_emplace(k.kernel, KernelTime{k.kernel, 0, 0.0});
        if (fresh) order.push_back(k.kernel);
        it->second.launches++;
        it->second.ms += double(ms);
        t.pool.push_back(k.start);
        t.pool.push_back(k.stop);
    }
    t.timed.clear();
    std::vector<KernelTime> out;
    for (const std::string& name : order) out.push_back(by_name.at(name));
    return out;
}

}  // namespace kiln::cuda

namespace kiln::cuda_detail {

void kernel_timing_start(const char* kernel, cudaStream_t stream) {
    cuda::KernelTimer& t = cuda::timer();
    std::lock_guard<std::mutex> lock(t.mutex);
    t.stop_last();  // a launch KILN_CHECK_LAUNCH did not follow ends here
    const cuda::Timed k{kernel, t.event(), t.event(), stream, false};
    KILN_CUDA_CHECK(cudaEventRecord(k.start, stream));
    t.timed.push_back(k);
}

void kernel_timing_stop() {
    cuda::KernelTimer& t = cuda::timer();
    std::lock_guard<std::mutex> lock(t.mutex);
    t.stop_last();
}

}  // namespace kiln::cuda_detail
