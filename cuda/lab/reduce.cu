// reduce.cu — the kernel lab's reduction: three versions of s = Σ_i x[i] side by side, each
// validated against the CPU at several block sizes, then timed against cuBLAS on a GPU.
//
// Letters: n = element count, t = threadIdx.x, T = blockDim.x, P = blocks (partial sums).
//
// Every version makes two passes and no atomics, so its sum is the same on every run:
//   pass 1  P = min(ceil(n / T), 1024) blocks; thread t of block b first adds x[b·T + t] and
//           every P·T-th element after it in a register (a grid-stride loop, coalesced), then
//           the block folds its T values into partial[b]
//   pass 2  one block folds the P partials the same way; the host copies the sum back
// The versions differ only in how a block folds T values:
//   version 1  interleaved   the pairwise-sum picture, literally: for s = 1, 2, 4, ...:
//              if (t % (2s) == 0) sh[t] += sh[t + s]. The active threads are scattered over
//              every warp (each warp runs at a fraction of its lanes, until the last step)
//              and t % (2s) is a slow integer division.
//   version 2  tree          the same tree folded the other way: for s = T/2, T/4, ..., 1:
//              if (t < s) sh[t] += sh[t + s]. The active threads are the first s, so whole
//              warps retire, and sh[t], sh[t + s] sit in different banks.
//   version 3  sum           (cuda/reduce.cu, the engine's cuda::sum; common.cuh's
//              detail::block_reduce) version 2 down to 64 values, then the first warp ends
//              with __shfl_down_sync: registers exchanged within the warp, no shared memory and
//              no barrier for the last 5 steps. Block 256, sums in double.
//   cuBLAS     cublasSasum (Σ|x|, equal to Σx here: the inputs are in [0, 1)), the reference
// Versions 1 and 2 sum in float, like most GPU code; the inputs are in [0, 1), so every
// partial sum is positive and float keeps ~7 digits of it.
//
// Build and run (from the repository root; `make lab` builds and runs every lab file):
//   make lab                   the emulator: validates every version at n = 100,003
//   make CUDA=1 lab            a GPU: validates at n = 2^26, then prints one line per version
//                              and block size: "bench reduce_67108864_v2_tree_b512: ... GB/s
//                              (..% of cublas)"
//   build-cuda/lab/reduce 2    version 2 only (build/lab/reduce on the emulator)
#include <algorithm>
#include <cstdint>

#include "common.h"
#include "ops/all.h"

namespace kiln::lab {

constexpr int kMaxBlocks = 1024;

// ---- versions 1 and 2: one kernel each, used for both passes ----------------------------------
// partial[b] = Σ over the elements block b owns (see above); dynamic shared memory of T floats.
__global__ void reduce_interleaved_kernel(const float* x, int64_t n, float* partial) {
    KILN_DYNAMIC_SHARED(float, sh);
    const unsigned t = threadIdx.x;
    float v = 0.0f;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + t; i < n; i += int64_t(gridDim.x) * blockDim.x) v += x[i];
    sh[t] = v;
    __syncthreads();
    for (unsigned s = 1; s < blockDim.x; s *= 2) {
        if (t % (2 * s) == 0) sh[t] += sh[t + s];
        __syncthreads();
    }
    if (t == 0) partial[blockIdx.x] = sh[0];
}

__global__ void reduce_tree_kernel(const float* x, int64_t n, float* partial) {
    KILN_DYNAMIC_SHARED(float, sh);
    const unsigned t = threadIdx.x;
    float v = 0.0f;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + t; i < n; i += int64_t(gridDim.x) * blockDim.x) v += x[i];
    sh[t] = v;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) sh[t] += sh[t + s];
        __syncthreads();
    }
    if (t == 0) partial[blockIdx.x] = sh[0];
}

// ---- launchers: both passes, then the sum back to the host --------------------------------------
// partial holds kMaxBlocks + 1 floats: the P partial sums, then the total.
unsigned partial_count(int64_t n, int block_size) {
    return unsigned(std::min<int64_t>((n + block_size - 1) / block_size, kMaxBlocks));
}
float copy_sum(const float* device_sum) {
    float sum = 0.0f;
    KILN_CUDA_CHECK(cudaMemcpy(&sum, device_sum, sizeof sum, cudaMemcpyDeviceToHost));
    return sum;
}

double reduce1(const float* x, int64_t n, int block_size, float* partial) {
    const unsigned P = partial_count(n, block_size);
    const dim3 grid1(P), grid2(1), block(block_size);
    const size_t shared_bytes = size_t(block_size) * sizeof(float);
    KILN_LAUNCH(reduce_interleaved_kernel, grid1, block, shared_bytes)(x, n, partial);
    KILN_CHECK_LAUNCH(reduce_interleaved_kernel, grid1, block);
    KILN_LAUNCH(reduce_interleaved_kernel, grid2, block, shared_bytes)(partial, int64_t(P), partial + P);
    KILN_CHECK_LAUNCH(reduce_interleaved_kernel, grid2, block);
    return copy_sum(partial + P);
}

double reduce2(const float* x, int64_t n, int block_size, float* partial) {
    const unsigned P = partial_count(n, block_size);
    const dim3 grid1(P), grid2(1), block(block_size);
    const size_t shared_bytes = size_t(block_size) * sizeof(float);
    KILN_LAUNCH(reduce_tree_kernel, grid1, block, shared_bytes)(x, n, partial);
    KILN_CHECK_LAUNCH(reduce_tree_kernel, grid1, block);
    KILN_LAUNCH(reduce_tree_kernel, grid2, block, shared_bytes)(partial, int64_t(P), partial + P);
    KILN_CHECK_LAUNCH(reduce_tree_kernel, grid2, block);
    return copy_sum(partial + P);
}

// ---- every version by number (version 3 is the engine's, with its own block) ------------------
double reduce(int version, const float* x, int64_t n, int block_size, float* partial) {
    switch (version) {
    case 1: return reduce1(x, n, block_size, partial);
    case 2: return reduce2(x, n, block_size, partial);
    default: return cuda::sum(x, n);
    }
}

const std::vector<Version> kVersions = {
    {1, "interleaved", {64, 256, 1024}}, {2, "tree", {64, 256, 1024}}, {3, "sum", {0}}};

bool run_lab(int chosen) {
    const int64_t n = kTiming ? int64_t(1) << 26 : 100003;
    std::printf("reduce n = %lld\n", (long long)n);
    const std::vector<float> x = random_floats(size_t(n), 1, 0.0f, 1.0f);
    double want = 0.0;
    for (float v : x) want += v;

    DeviceArray<float> dx(x), partial(kMaxBlocks + 1);
    double got = 0.0;
    const auto launch = [&](int version, int block) { got = reduce(version, dx.get(), n, block, partial.get()); };
    // Float partial sums of ~n/(P·T) values each, then trees of at most 1024: a relative error
    // of a few 1e-7; 1e-5 leaves room and still catches a lost or doubled element (≥ 1/n).
    const bool ok = validate_versions(
        kVersions, chosen, [&](int version, int block) {
            got = NAN;
            launch(version, block);
        },
        [&](const std::string& label) { return validate_values({float(got)}, {float(want)}, label, 0.0, 1e-5); });
    if (!ok || !kTiming) return ok;
#ifdef KILN_CUDA
    cublasHandle_t handle;
    CUBLAS_CHECK(cublasCreate(&handle));
    float cublas_sum = 0.0f;
    const double cublas_ms = time_ms([&] { CUBLAS_CHECK(cublasSasum(handle, int(n), dx.get(), 1, &cublas_sum)); });
    CUBLAS_CHECK(cublasDestroy(handle));
    time_versions(kVersions, chosen, launch, "reduce_" + std::to_string(n), double(n) * sizeof(float) / 1e9, "GB/s",
                  cublas_ms, "cublas");
#endif
    return true;
}

}  // namespace kiln::lab

int main(int argc, char** argv) {
    using namespace kiln::lab;
    return lab_main("reduce", [&] { return run_lab(chosen_version(argc, argv, kVersions)); });
}
