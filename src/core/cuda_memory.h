// cuda_memory.h — the few CUDA runtime calls the engine's C++ side needs: device memory and
// copies. Implemented in cuda/memory.cu, which nvcc compiles for a GPU or g++ compiles
// against the kernel emulator (cuda/emu/), so the engine links the same way in both builds.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace kiln::cuda {

void* malloc_device(size_t bytes);  // nullptr when the device is out of memory
void free_device(void* ptr);
void copy_to_device(void* dst, const void* src, size_t bytes);
void copy_to_host(void* dst, const void* src, size_t bytes);
void copy_device_to_device(void* dst, const void* src, size_t bytes);
void memset_device(void* dst, int value, size_t bytes);
// Page-locked host memory (cudaMallocHost / cudaFreeHost): the GPU's copy engines read and write
// it directly, so a copy from or to it runs at the bus's speed and an async copy does not wait
// for the host. nullptr when the host has no room. The emulator answers with aligned host memory.
void* malloc_host(size_t bytes);
void free_host(void* ptr);
// A host-to-device copy queued on the default stream (cudaMemcpyAsync): from pinned memory it
// returns at once, and the kernels launched after it run after it. The source must stay unchanged
// until the stream has run it (a later blocking copy, or synchronize(), waits for it).
void copy_to_device_async(void* dst, const void* src, size_t bytes);
// Free and total memory of the device (cudaMemGetInfo); the emulator reports the host's.
void memory_info(size_t* free_bytes, size_t* total_bytes);
bool is_emulated();  // true when kernels run on the CPU emulator
void synchronize();
// Host-to-device copies that do not wait: a copy from pageable memory (cudaMemcpy from a
// std::vector or a CPU tensor) blocks the CPU until the GPU has taken the bytes, and the GPU
// finishes its queue first. PinnedStaging copies the bytes into page-locked host memory it owns
// and queues cudaMemcpyAsync from there: the CPU goes on launching the step's kernels, which the
// stream runs after the copy. One round (begin, then copies at consecutive offsets) per batch;
// begin waits for the previous round's copies before reusing the buffer — by then the step's
// loss read-back has waited for them, so that wait costs nothing.
class PinnedStaging {
public:
    PinnedStaging() = default;
    ~PinnedStaging();
    PinnedStaging(const PinnedStaging&) = delete;
    PinnedStaging& operator=(const PinnedStaging&) = delete;
    void begin(size_t bytes);  // a round of copies of `bytes` in all
    void copy_to_device(void* dst, const void* src, size_t bytes);

private:
    void* buffer_ = nullptr;  // page-locked (cudaMallocHost)
    size_t capacity_ = 0, used_ = 0, round_ = 0;
    void* done_ = nullptr;    // a cudaEvent_t recorded after each copy
};

// KILN_SYNC_LAUNCHES=1 (cuda/kiln_cuda.h): every launch waits for its kernel, so a fault is
// reported at the launch that made it. read_sync_launches_env reads the variable again (it is
// read once, at the first launch); launch_syncs counts the launches that have waited.
void read_sync_launches_env();
int64_t launch_syncs();
// Each kernel's time on the device (cuda/kernel_times.cu): while kernel timing is on, every launch
// is bracketed by two CUDA events on its stream (KILN_LAUNCH ... KILN_CHECK_LAUNCH); the GPU's own
// clock, not the host's, which sees only the launch queue. take_kernel_times waits for the device,
// then returns per kernel (its launch macro's name, first launched first) the launches and
// milliseconds since the last call, and starts a new round.
struct KernelTime {
    std::string kernel;
    int64_t launches = 0;
    double ms = 0;
};
void set_kernel_timing(bool on);
bool kernel_timing_on();
std::vector<KernelTime> take_kernel_times();
// TF32 (cuda/gemm.cu; the trainers' --tf32): while on, the f32 matrix products of cuda::gemm and of
// the implicit-GEMM convolutions (forward, dx, dw) run on the tensor cores with each operand rounded
// to tf32 (8 exponent bits, 10 mantissa bits: a relative error up to 2^-11 per operand) and f32
// sums. Off by default, as PyTorch 2.x's torch.backends.cuda.matmul.allow_tf32 (lesson 09's README
// compares). f16 and bf16 products, and the CPU, are unaffected.
void set_tf32(bool on);
bool tf32_on();
// cudaProfilerStart (on) and cudaProfilerStop: what a profiler run with its capture range on the
// profiler API profiles (ncu --profile-from-start off, nsys --capture-range=cudaProfilerApi).
// Nothing on the emulator.
void set_profiler_capture(bool on);

// ---- CUDA Graphs (cuda/graph.cu; the trainers' --cuda-graph, train/step_graph.h) ----------------
// A launch costs the host a few microseconds, and the GPU idles between two kernels when they are
// shorter than that. A CUDA Graph records a sequence of kernels, copies and fills once, by stream
// capture, and cudaGraphLaunch then hands the whole sequence to the GPU in one call. What the
// recording holds is fixed: the kernels' arguments (pointers and sizes) as they were captured.
//   cuda::Graph g;
//   g.capture([&] { work(); });   // work()'s launches are recorded, not run
//   g.launch();                    // runs them; again and again
// During capture kiln's launches, device-to-device copies and fills go to the capturing stream
// (cuda_detail::launch_stream); anything that reads back to the host, waits for the device, or
// takes memory from it fails with CUDA's error and a message naming the call (kiln_cuda.h
// capture_hint), and the capture is abandoned.
class Graph {
public:
    Graph() = default;
    ~Graph();
    Graph(const Graph&) = delete;
    Graph& operator=(const Graph&) = delete;
    // Records what `work` launches (replacing an earlier recording). If `work` throws or the
    // capture fails, the capture is ended, nothing is kept and the error is thrown.
    void capture(const std::function<void()>& work);
    void launch();  // runs the recording on the legacy default stream, after the work queued there
    bool empty() const { return exec_ == nullptr; }
    void reset();   // drops the recording

private:
    void* stream_ = nullptr;  // cudaStream_t: the capturing stream
    void* graph_ = nullptr;   // cudaGraph_t
    void* exec_ = nullptr;    // cudaGraphExec_t
};
bool capturing();  // whether a Graph is capturing now (on any thread)
// Host-side counts since the program started: kernel launches (KILN_LAUNCH, captured ones
// included) and graph launches (Graph::launch). --time-report prints them per step.
int64_t kernel_launches();
int64_t graph_launches();

// "note: no GPU build — CUDA kernels run on kiln's emulator (slow, exact)" on the emulator,
// nullptr on a GPU build; a trainer run with --device cuda prints it once (first call only).
const char* emulator_note();
void print_emulator_note_once();

}  // namespace kiln::cuda
