// parallel.cpp — the pool behind parallel_for (parallel.h says what it promises and why).
//
// The current job lives in the pool, not on the caller's stack, and one 64-bit word says
// which job it is and which chunk is next:
//     state = generation << 32 | next chunk
// A thread claims chunk i of job g by swapping (g, i) for (g, i + 1) in one compare-and-swap.
// A worker that wakes late, after job g is over, finds another generation or no chunk left and
// claims nothing, so the caller may return (and the job's body go out of scope) as soon as every
// claimed chunk is done. The caller writes a job's fields before it publishes the new state
// (release), and a worker reads them after it loads that state (acquire).
#include "core/parallel.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"

namespace kiln {
namespace {

thread_local bool t_in_parallel = false;

// One instruction that tells the core "this is a spin loop" (lets the other hyperthread run).
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

using ChunkFn = std::function<void(int64_t)>;

class Pool {
public:
    ~Pool();
    void run(int64_t chunks, const ChunkFn& body, int threads);

private:
    static constexpr uint64_t kChunkMask = 0xffffffffu;
    static uint32_t generation(uint64_t state) { return uint32_t(state >> 32); }

    void grow(int workers);
    void worker_main(int index);
    void wait_for_job(uint32_t seen);
    void work(uint32_t generation);

    std::mutex run_mutex_;  // one job at a time; a second caller runs its loop alone
    std::vector<std::thread> workers_;

    std::atomic<uint64_t> state_{0};
    std::atomic<const ChunkFn*> body_{nullptr};
    std::atomic<int64_t> chunks_{0};
    std::atomic<int> helpers_{0};  // workers 0 .. helpers_-1 take part in the current job
    std::atomic<int64_t> done_{0};  // chunks finished in the current job
    std::atomic<bool> failed_{false};
    std::exception_ptr error_;  // the first exception a chunk threw (under error_mutex_)
    std::mutex error_mutex_;

    std::mutex sleep_mutex_;
    std::condition_variable wake_;
    std::atomic<bool> stop_{false};  // set under sleep_mutex_
};

Pool::~Pool() {
    {
        std::lock_guard<std::mutex> lock(sleep_mutex_);
        stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : workers_) t.join();
}

void Pool::grow(int workers) {
    while (int(workers_.size()) < workers) {
        const int index = int(workers_.size());
        workers_.emplace_back([this, index] { worker_main(index); });
    }
}

// Polls for a new generation for about 300 µs (a training step starts its loops microseconds
// apart), then sleeps until run() wakes it.
void Pool::wait_for_job(uint32_t seen) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(300);
    for (int spin = 1;; ++spin) {
        if (generation(state_.load(std::memory_order_acquire)) != seen) return;
        if (spin % 64 == 0 && std::chrono::steady_clock::now() > until) break;
        cpu_relax();
    }
    std::unique_lock<std::mutex> lock(sleep_mutex_);
    wake_.wait(lock, [&] { return stop_ || generation(state_.load(std::memory_order_acquire)) != seen; });
}

void Pool::worker_main(int index) {
    t_in_parallel = true;  // a parallel_for in a chunk's body runs on this thread alone
    uint32_t seen = 0;
    for (;;) {
        wait_for_job(seen);
        if (stop_.load()) return;
        seen = generation(state_.load(std::memory_order_acquire));
        if (index < helpers_.load(std::memory_order_relaxed)) work(seen);
    }
}

// Claims and runs chunks of job `gen` until none is left (or the job is another one).
void Pool::work(uint32_t gen) {
    for (;;) {
        uint64_t s = state_.load(std::memory_order_acquire);
        const int64_t chunk = int64_t(s & kChunkMask);
        if (generation(s) != gen || chunk >= chunks_.load(std::memory_order_relaxed)) return;
        const ChunkFn* body = body_.load(std::memory_order_relaxed);
        if (!state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel)) continue;
        if (!failed_.load(std::memory_order_relaxed)) {  // after a throw, the rest is skipped
            try {
                (*body)(chunk);
            } catch (...) {
                std::lock_guard<std::mutex> lock(error_mutex_);
                if (!error_) error_ = std::current_exception();
                failed_.store(true, std::memory_order_relaxed);
            }
        }
        done_.fetch_add(1, std::memory_order_acq_rel);
    }
}

void Pool::run(int64_t chunks, const ChunkFn& body, int threads) {
    KILN_CHECK(chunks <= int64_t(kChunkMask), "parallel_chunks: ", chunks, " chunks, more than 2^32 - 1");
    std::unique_lock<std::mutex> running(run_mutex_, std::try_to_lock);
    if (!running.owns_lock()) {  // another thread's job is on the pool: do this one alone
        for (int64_t c = 0; c < chunks; ++c) body(c);
        return;
    }
    grow(threads - 1);
    body_.store(&body, std::memory_order_relaxed);
    chunks_.store(chunks, std::memory_order_relaxed);
    helpers_.store(threads - 1, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    failed_.store(false, std::memory_order_relaxed);
    error_ = nullptr;
    const uint32_t gen = generation(state_.load(std::memory_order_relaxed)) + 1;
    state_.store(uint64_t(gen) << 32, std::memory_order_release);  // publishes the job
    {
        std::lock_guard<std::mutex> lock(sleep_mutex_);  // a worker about to sleep sees gen or gets the signal
    }
    wake_.notify_all();

    t_in_parallel = true;
    work(gen);
    t_in_parallel = false;
    // Only chunks that a running worker claimed are left: wait for them.
    for (int spin = 1; done_.load(std::memory_order_acquire) < chunks; ++spin) {
        if (spin % 1024 == 0)
            std::this_thread::yield();  // that worker may be waiting for this core
        else
            cpu_relax();
    }
    if (error_) std::rethrow_exception(error_);
}

Pool& pool() {
    static Pool p;
    return p;
}

}  // namespace

int max_threads() { return std::max(1, omp_get_max_threads()); }

bool in_parallel() { return t_in_parallel || omp_in_parallel(); }

void parallel_chunks(int64_t chunks, const std::function<void(int64_t chunk)>& body, bool parallel) {
    if (chunks <= 0) return;
    const int threads = !parallel || in_parallel() ? 1 : max_threads();
    if (chunks == 1 || threads == 1) {
        for (int64_t c = 0; c < chunks; ++c) body(c);
        return;
    }
    pool().run(chunks, body, int(std::min<int64_t>(threads, chunks)));
}

void parallel_for(int64_t n, int64_t grain, const RangeFn& body) {
    if (n <= 0) return;
    const int64_t threads = in_parallel() ? 1 : max_threads();
    // About 8 chunks per thread, none shorter than grain.
    const int64_t chunk = std::max({grain, int64_t(1), (n + 8 * threads - 1) / (8 * threads)});
    const int64_t chunks = (n + chunk - 1) / chunk;
    parallel_chunks(chunks, [&](int64_t c) { body(c * chunk, std::min(n, (c + 1) * chunk)); });
}

}  // namespace kiln
