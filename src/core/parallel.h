// parallel.h — kiln's threads: parallel_for over chunks of a range, on a pool of worker
// threads that the calling thread joins (chapter 03).
//
// Why not `#pragma omp parallel for`? An OpenMP loop ends at a barrier: the calling thread
// waits until every thread of the team has arrived. On a machine where another program is busy
// on one core, one of kiln's two threads shares that core and is off it for a whole time slice
// (milliseconds) now and then; every loop that starts while it is off waits for it, and a
// training step runs a few hundred loops, so the step slows by far more than the core's share.
//
// parallel_for(n, grain, body) instead cuts [0, n) into chunks and puts them up for grabs:
// the calling thread takes chunks one at a time, and so does every worker that is awake. A
// chunk is claimed by one atomic step, and the call returns when every chunk is done — so it
// waits only for chunks that a running thread has claimed, never for a thread that has not
// started. A worker that is off its core takes no chunk, and the caller does its share.
//
//   parallel_for(n, 4096, [&](int64_t begin, int64_t end) {
//       for (int64_t i = begin; i < end; ++i) y[i] = x[i] * 2;
//   });
//
// Chunks: about 8 per thread (so a slow thread does fewer), never shorter than `grain`
// elements; a range of one chunk runs on the calling thread, without touching the pool. The
// chunk boundaries depend on n, grain and the thread count only; kernels whose result must not
// depend on the thread count (reductions) give chunk boundaries of their own with
// parallel_chunks.
//
// Threads: max_threads() is OpenMP's (OMP_NUM_THREADS, or --threads: omp_set_num_threads),
// the calling thread included. A parallel_for inside a parallel_for runs on its thread alone.
// Idle workers poll for new work for about 300 µs, then sleep until woken (polling for 50 µs
// cost LeNet about 10% of its idle speed: the gaps between its loops are often longer).
#pragma once
#include <cstdint>
#include <functional>

namespace kiln {

// The body of a loop: does [begin, end).
using RangeFn = std::function<void(int64_t begin, int64_t end)>;

// Runs body over [0, n) in chunks of at least `grain` elements, on the pool (see above).
void parallel_for(int64_t n, int64_t grain, const RangeFn& body);

// Runs body(c) for every chunk index c in [0, chunks), one chunk per claim, on the pool:
// the caller decides what a chunk is (a fixed block of a reduction, a tile of a GEMM, a group
// of images). With parallel = false (too little work to wake the pool), all on this thread.
void parallel_chunks(int64_t chunks, const std::function<void(int64_t chunk)>& body, bool parallel = true);

// The grain of a loop whose iterations touch `per_iteration` elements each: enough iterations
// that a chunk touches at least `min_elements` (a loop over rows of 784 floats, at least 32768
// floats a chunk: grain_of(32768, 784) = 41 rows).
inline int64_t grain_of(int64_t min_elements, int64_t per_iteration) {
    return per_iteration >= min_elements ? 1 : min_elements / (per_iteration > 0 ? per_iteration : 1);
}

int max_threads();   // how many threads a parallel_for may use, the caller included
bool in_parallel();  // true inside the body of a parallel_for or parallel_chunks

}  // namespace kiln
