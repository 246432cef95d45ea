// test_emu.cpp — the CUDA kernel emulator (cuda/emu/): small kernels, written as CUDA, run by
// g++ on the CPU. Each checks one thing a real kernel relies on: barriers and shared memory,
// warp shuffles and votes, atomics across parallel blocks, launch shapes, the runtime API, and
// that the emulator reports what a GPU would get wrong (a missing barrier, barrier divergence,
// a bad launch) with a message naming the kernel. Its checks each catch a planted bug: the
// shuffled schedule a missing barrier, the poison a read of memory nobody wrote (static and
// dynamic shared memory, a __device__ function's __shared__ array, cudaMalloc), the race detector
// two threads writing one shared word (static, dynamic or a __device__ function's) and two blocks
// writing one global word. The wmma fragments (chapter 09): one mma with every layout, exact, and
// their misuse failing the launch with a message naming the call.
//
// Every kernel runs under the three schedules (in order, reversed, shuffled) where it matters.
// These test the emulator itself, so the GPU build (make CUDA=1, KILN_CUDA defined) leaves
// them out: there the same kernels would run on the real device, with nothing to emulate.
#ifndef KILN_CUDA
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

#include "emu/symbols.h"
#include "fixtures.h"
#include "kiln_cuda.h"
#include "ops/ops.h"

using kiln::emu::Schedule;
using kiln::emu::ScopedSchedule;

namespace {

const Schedule kSchedules[] = {Schedule::InOrder, Schedule::Reverse, Schedule::Shuffle};

// Device memory for a test: the vector's contents copied in, copied back by get().
template <typename T>
class DeviceBuffer {
public:
    explicit DeviceBuffer(const std::vector<T>& host) : n_(host.size()) {
        KILN_CUDA_CHECK(cudaMalloc(&p_, n_ * sizeof(T)));
        KILN_CUDA_CHECK(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
    }
    explicit DeviceBuffer(std::size_t n) : DeviceBuffer(std::vector<T>(n)) {}
    ~DeviceBuffer() { cudaFree(p_); }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
    T* get() const { return p_; }
    std::vector<T> host() const {
        std::vector<T> h(n_);
        KILN_CUDA_CHECK(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
        return h;
    }

private:
    std::size_t n_;
    T* p_ = nullptr;
};

// --- kernels ---------------------------------------------------------------------------------------

// Tree reduction in shared memory: out[b] = sum of block b's slice of x (n elements).
//   s: [0 1 2 3 4 5 6 7] -> stride 4: [4 6 8 10 ...] -> stride 2: [12 16 ...] -> stride 1: [28]
template <int BLOCK>
__global__ void block_sum(const float* x, float* out, int n) {
    __shared__ float s[BLOCK];
    const int t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
    s[t] = i < n ? x[i] : 0.0f;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if (t < stride) s[t] += s[t + stride];
        __syncthreads();
    }
    if (t == 0) out[blockIdx.x] = s[0];
}

// out[i] = in[i - 1] within a block (0 for its first thread), through shared memory.
__global__ void shift_racy(const int* in, int* out) {
    __shared__ int s[256];
    const int t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
    s[t] = in[i];
    // BUG (on purpose): no __syncthreads() here, so thread t may read s[t - 1] before thread
    // t - 1 wrote it. Running threads in order hides it; the reversed schedule exposes it.
    out[i] = t > 0 ? s[t - 1] : 0;
}
__global__ void shift_fixed(const int* in, int* out) {
    __shared__ int s[256];
    const int t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
    s[t] = in[i];
    __syncthreads();
    out[i] = t > 0 ? s[t - 1] : 0;
}

// Warp sums: with __shfl_down_sync lane 0 ends with the sum; with __shfl_xor_sync every lane.
__device__ float warp_sum_down(float v) {
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
    return v;
}
__device__ int warp_sum_xor(int v) {
    for (int mask = 16; mask > 0; mask /= 2) v += __shfl_xor_sync(0xffffffffu, v, mask);
    return v;
}
__global__ void warp_sums(const float* x, const int* xi, float* down, int* xor_all) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const float d = warp_sum_down(x[i]);
    xor_all[i] = warp_sum_xor(xi[i]);
    if (threadIdx.x % 32 == 0) down[i / 32] = d;
}

// __shfl_sync broadcast, and an inclusive scan over segments of 8 lanes with __shfl_up_sync.
__global__ void shfl_idx_up(const int* x, int* bcast, int* scan8) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    bcast[i] = __shfl_sync(0xffffffffu, x[i], 5);  // every lane gets lane 5's value
    int v = x[i];
    for (int d = 1; d < 8; d *= 2) {
        const int up = __shfl_up_sync(0xffffffffu, v, d, 8);
        if ((threadIdx.x % 8) >= static_cast<unsigned>(d)) v += up;
    }
    scan8[i] = v;
}

__global__ void vote(const int* pred, unsigned* ballot, int* any, int* all) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned b = __ballot_sync(0xffffffffu, pred[i]);
    const int a = __any_sync(0xffffffffu, pred[i]);
    const int l = __all_sync(0xffffffffu, pred[i]);
    if (threadIdx.x % 32 == 0) ballot[i / 32] = b, any[i / 32] = a, all[i / 32] = l;
}

__global__ void barrier_votes(const int* pred, int* count, int* all, int* any) {
    const int p = pred[blockIdx.x * blockDim.x + threadIdx.x];
    const int c = __syncthreads_count(p);
    const int a = __syncthreads_and(p);
    const int o = __syncthreads_or(p);
    if (threadIdx.x == 0) count[blockIdx.x] = c, all[blockIdx.x] = a, any[blockIdx.x] = o;
}

__global__ void atomic_sums(const int* xi, const float* xf, int n, int* isum, float* fsum, int* imax,
                            unsigned* count) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    atomicAdd(isum, xi[i]);
    atomicAdd(fsum, xf[i]);
    atomicMax(imax, xi[i]);
    atomicAdd(count, 1u);
}

// Every block tries to claim the slot; exactly one atomicCAS sees 0.
__global__ void claim(int* slot, int* winners, int* last) {
    if (threadIdx.x != 0) return;
    if (atomicCAS(slot, 0, static_cast<int>(blockIdx.x) + 1) == 0) atomicAdd(winners, 1);
    atomicExch(last, static_cast<int>(blockIdx.x));
}

// BUG (on purpose): threads past n return before the barrier the others wait at.
__global__ void early_return(float* x, int n) {
    __shared__ float s[64];
    const int t = threadIdx.x;
    if (t >= n) return;
    s[t] = x[t];
    __syncthreads();
    x[t] = s[(t + 1) % n];
}

// BUG (on purpose): lanes past n leave, yet the shuffle's full mask names them.
__global__ void early_return_shuffle(float* x, int n) {
    const int t = threadIdx.x;
    if (t >= n) return;
    x[t] = __shfl_down_sync(0xffffffffu, x[t], 1);
}

// Reverses each block's slice through dynamic shared memory; a second view of the same bytes
// (ints) checks that the dynamic arrays alias, as in CUDA.
__global__ void reverse_block(const float* in, float* out, int* first_bits) {
    KILN_DYNAMIC_SHARED(float, s);
    KILN_DYNAMIC_SHARED(int, s_bits);
    const int t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
    s[t] = in[i];
    __syncthreads();
    out[i] = s[blockDim.x - 1 - t];
    if (t == 0) first_bits[blockIdx.x] = s_bits[0];
}

__global__ void big_shared(float* out) {
    KILN_DYNAMIC_SHARED(float, s);
    s[threadIdx.x] = 1.0f;
    __syncthreads();
    if (threadIdx.x == 0) out[0] = s[64 * 1024 / sizeof(float) - 1];
}

// BUG (on purpose): block_sum without the __syncthreads() inside the loop. Thread t runs all
// its strides at once, reading s[t + stride] whether or not thread t + stride has added into it
// yet. Reversed, every higher thread has finished before a lower one starts, so the sum comes
// out right and the bug hides; in order it shows, and shuffled it shows whatever the seed.
__global__ void block_sum_racy(const float* x, float* out, int n) {
    __shared__ float s[256];
    const int t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
    s[t] = i < n ? x[i] : 0.0f;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2)
        if (t < stride) s[t] += s[t + stride];
    __syncthreads();
    if (t == 0) out[blockIdx.x] = s[0];
}

// Where a kernel below keeps its shared words: a static __shared__ array of its own, dynamic
// shared memory, or the __shared__ array of a __device__ function it calls (CUDA gives every
// block its own of each).
enum class Where { Static, Dynamic, Device };
__device__ float* device_tile() {
    __shared__ float dtile[64];
    return dtile;
}

// Sums the first `written` threads' values through shared memory (where W says): thread 0 adds
// all blockDim.x (<= 64) words. BUG (on purpose) when written < blockDim.x: the words past it are
// never written, so the sum reads uninitialised shared memory (the poison makes it NaN).
template <Where W>
__global__ void sum_through_shared(const float* x, float* out, int written) {
    __shared__ float tile[64];
    KILN_DYNAMIC_SHARED(float, dynamic);
    float* s = W == Where::Static ? tile : W == Where::Dynamic ? dynamic : device_tile();
    const int t = threadIdx.x;
    if (t < written) s[t] = x[blockIdx.x * blockDim.x + t];
    __syncthreads();
    if (t != 0) return;
    float sum = 0.0f;
    for (unsigned j = 0; j < blockDim.x; ++j) sum += s[j];
    out[blockIdx.x] = sum;
}

// out[i] += x[i]: correct only on an output someone has set (cudaMemset) first.
__global__ void accumulate(const float* x, float* out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] += x[i];
}

// BUG (on purpose) when `racy`: threads t and t + 32 both write word t % 32 of shared memory
// (where W says) with no barrier between, so which value survives depends on the order. Fixed:
// one writer each.
template <Where W>
__global__ void fold_to_warp(const float* x, float* out, bool racy) {
    __shared__ float tile[32];
    KILN_DYNAMIC_SHARED(float, dynamic);
    float* s = W == Where::Static ? tile : W == Where::Dynamic ? dynamic : device_tile();
    const int t = threadIdx.x;
    if (racy || t < 32) s[t % 32] = x[t];
    __syncthreads();
    if (t >= 32) s[t % 32] = x[t];  // after the barrier: ordered, not a race
    __syncthreads();
    out[t] = s[t % 32];
}

// Every thread adds 1 to one shared counter: atomics on one word are not a race.
__global__ void count_in_shared(int* out) {
    KILN_DYNAMIC_SHARED(int, count);
    if (threadIdx.x == 0) count[0] = 0;
    __syncthreads();
    atomicAdd(&count[0], 1);
    __syncthreads();
    if (threadIdx.x == 0) out[0] = count[0];
}

// out[i] = in[i - 1] + in[i] + in[i + 1] within a block (0 past its ends), through a tile in
// shared memory. BUG (on purpose) when `racy`: no barrier between the tile's load and the
// neighbours' reads (a read-write race), so a thread reads a neighbour's word before the
// neighbour wrote it and gets the poison (NaN): in order the right one, reversed the left one.
__global__ void stencil3(const float* in, float* out, bool racy) {
    __shared__ float tile[64];
    const int t = threadIdx.x, n = blockDim.x, i = blockIdx.x * n + t;
    tile[t] = in[i];
    if (!racy) __syncthreads();
    out[i] = (t > 0 ? tile[t - 1] : 0.0f) + tile[t] + (t + 1 < n ? tile[t + 1] : 0.0f);
}

// bins[x[i]] += 1 over all threads of the grid. BUG (on purpose) unless `atomic`: two blocks
// add to one bin with a plain read-modify-write, so on a GPU one increment can be lost.
__global__ void histogram(const int* x, int n, int* bins, bool atomic) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    if (atomic) atomicAdd(&bins[x[i]], 1);
    else bins[x[i]] += 1;
}

// One record per thread: its thread and block coordinates.
__global__ void coords(uint3* thread, uint3* block) {
    const unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    const unsigned id = b * (blockDim.x * blockDim.y * blockDim.z) + t;
    thread[id] = threadIdx;
    block[id] = blockIdx;
}

__global__ void noop() {}

std::vector<float> iota_floats(std::size_t n, float start = 0.0f) {
    std::vector<float> v(n);
    std::iota(v.begin(), v.end(), start);
    return v;
}

}  // namespace

// --- tests -------------------------------------------------------------------------------------------

TEST_CASE("emu: shared-memory tree reduction", "[emu][cuda]") {
    const int n = 1000;  // not a multiple of the block: the last block reads zeros past n
    const auto x = iota_floats(n, 1.0f);
    for (Schedule s : kSchedules) {
        ScopedSchedule scope(s);
        INFO("schedule " << kiln::emu::schedule_name(s));
        DeviceBuffer<float> dx(x), dout(4);
        KILN_LAUNCH(block_sum<256>, 4, 256, 0)(dx.get(), dout.get(), n);
        KILN_CHECK_LAUNCH(block_sum<256>, 4, 256);
        const auto out = dout.host();
        for (int b = 0; b < 4; ++b) {
            float want = 0;
            for (int i = b * 256; i < std::min(n, (b + 1) * 256); ++i) want += x[i];
            CHECK(out[b] == want);
        }
    }
}

TEST_CASE("emu: a 1024-thread block reduces too", "[emu][cuda]") {
    const auto x = iota_floats(2048);
    DeviceBuffer<float> dx(x), dout(2);
    KILN_LAUNCH(block_sum<1024>, 2, 1024, 0)(dx.get(), dout.get(), 2048);
    KILN_CHECK_LAUNCH(block_sum<1024>, 2, 1024);
    const auto out = dout.host();
    CHECK(out[0] == 1023.0f * 1024 / 2);
    CHECK(out[1] == (1024.0f + 2047) * 1024 / 2);
}

TEST_CASE("emu: the reversed schedule exposes a missing __syncthreads()", "[emu][cuda]") {
    const int blocks = 8, n = blocks * 256;
    int salt = 0;  // new values each run, so stale shared memory cannot look right
    auto run = [&](auto kernel, Schedule s) {
        ScopedSchedule scope(s);
        std::vector<int> in(n), want(n);
        salt += 100000;
        for (int i = 0; i < n; ++i) in[i] = salt + i;
        for (int i = 0; i < n; ++i) want[i] = i % 256 ? in[i - 1] : 0;
        DeviceBuffer<int> din(in), dout(n);
        KILN_LAUNCH(kernel, blocks, 256, 0)(din.get(), dout.get());
        KILN_CHECK_LAUNCH(kernel, blocks, 256);
        return dout.host() == want;
    };
    CHECK(run(shift_racy, Schedule::InOrder));    // in order the bug hides ...
    CHECK_FALSE(run(shift_racy, Schedule::Reverse));  // ... reversed it shows
    CHECK_FALSE(run(shift_racy, Schedule::Shuffle));
    for (Schedule s : kSchedules) {
        INFO("schedule " << kiln::emu::schedule_name(s));
        CHECK(run(shift_fixed, s));
    }
}

TEST_CASE("emu: warp shuffle reductions (down, xor), broadcast and segmented scan", "[emu][cuda]") {
    const int n = 256;
    const auto x = iota_floats(n);
    std::vector<int> xi(n);
    for (int i = 0; i < n; ++i) xi[i] = i * 3 - 100;
    for (Schedule s : kSchedules) {
        ScopedSchedule scope(s);
        INFO("schedule " << kiln::emu::schedule_name(s));
        DeviceBuffer<float> dx(x), ddown(n / 32);
        DeviceBuffer<int> dxi(xi), dxor(n), dbcast(n), dscan(n);
        KILN_LAUNCH(warp_sums, 2, 128, 0)(dx.get(), dxi.get(), ddown.get(), dxor.get());
        KILN_CHECK_LAUNCH(warp_sums, 2, 128);
        KILN_LAUNCH(shfl_idx_up, 2, 128, 0)(dxi.get(), dbcast.get(), dscan.get());
        KILN_CHECK_LAUNCH(shfl_idx_up, 2, 128);
        const auto down = ddown.host();
        const auto xr = dxor.host(), bcast = dbcast.host(), scan = dscan.host();
        for (int w = 0; w < n / 32; ++w) {
            float fsum = 0;
            int isum = 0;
            for (int l = 0; l < 32; ++l) fsum += x[w * 32 + l], isum += xi[w * 32 + l];
            CHECK(down[w] == fsum);
            for (int l = 0; l < 32; ++l) {
                const int i = w * 32 + l;
                CHECK(xr[i] == isum);
                CHECK(bcast[i] == xi[w * 32 + 5]);
                int want = 0;
                for (int k = i - i % 8; k <= i; ++k) want += xi[k];
                CHECK(scan[i] == want);
            }
        }
    }
}

TEST_CASE("emu: __ballot_sync, __any_sync, __all_sync, __syncthreads_count/and/or", "[emu][cuda]") {
    // warp 0: none; warp 1: all; warp 2: odd lanes; warp 3: lane 7 only
    std::vector<int> pred(128, 0);
    for (int l = 0; l < 32; ++l) pred[32 + l] = 1, pred[64 + l] = l % 2, pred[96 + l] = l == 7;
    for (Schedule s : kSchedules) {
        ScopedSchedule scope(s);
        DeviceBuffer<int> dp(pred), dany(4), dall(4);
        DeviceBuffer<unsigned> dballot(4);
        KILN_LAUNCH(vote, 1, 128, 0)(dp.get(), dballot.get(), dany.get(), dall.get());
        KILN_CHECK_LAUNCH(vote, 1, 128);
        CHECK(dballot.host() == std::vector<unsigned>{0u, 0xffffffffu, 0xaaaaaaaau, 0x80u});
        CHECK(dany.host() == std::vector<int>{0, 1, 1, 1});
        CHECK(dall.host() == std::vector<int>{0, 1, 0, 0});

        DeviceBuffer<int> dcount(2), dand(2), dor(2);  // block 0: warps 0-1; block 1: warps 2-3
        KILN_LAUNCH(barrier_votes, 2, 64, 0)(dp.get(), dcount.get(), dand.get(), dor.get());
        KILN_CHECK_LAUNCH(barrier_votes, 2, 64);
        CHECK(dcount.host() == std::vector<int>{32, 17});
        CHECK(dand.host() == std::vector<int>{0, 0});
        CHECK(dor.host() == std::vector<int>{1, 1});
    }
}

TEST_CASE("emu: atomics are exact across parallel blocks", "[emu][cuda]") {
    const int n = 1 << 20;  // 4096 blocks of 256
    std::vector<int> xi(n);
    std::vector<float> xf(n);
    long long want_i = 0;
    double want_f = 0;
    for (int i = 0; i < n; ++i) {
        xi[i] = static_cast<int>((i * 7919LL) % 1000);
        xf[i] = static_cast<float>((i * 31) % 100) / 100.0f;
        want_i += xi[i];
        want_f += xf[i];
    }
    DeviceBuffer<int> dxi(xi), disum(1), dimax(1);
    DeviceBuffer<float> dxf(xf), dfsum(1);
    DeviceBuffer<unsigned> dcount(1);
    KILN_LAUNCH(atomic_sums, n / 256, 256, 0)(dxi.get(), dxf.get(), n, disum.get(), dfsum.get(), dimax.get(), dcount.get());
    KILN_CHECK_LAUNCH(atomic_sums, n / 256, 256);
    CHECK(disum.host()[0] == want_i);
    CHECK(dimax.host()[0] == 999);
    CHECK(dcount.host()[0] == static_cast<unsigned>(n));
    CHECK(dfsum.host()[0] == Approx(want_f).epsilon(1e-3));

    DeviceBuffer<int> dslot(1), dwinners(1), dlast(std::vector<int>{-1});
    KILN_LAUNCH(claim, 1000, 32, 0)(dslot.get(), dwinners.get(), dlast.get());
    KILN_CHECK_LAUNCH(claim, 1000, 32);
    CHECK(dwinners.host()[0] == 1);
    CHECK(dslot.host()[0] >= 1);
    CHECK(dlast.host()[0] >= 0);
}

TEST_CASE("emu: barrier divergence fails the launch, naming the kernel", "[emu][cuda]") {
    for (Schedule s : kSchedules) {
        ScopedSchedule scope(s);
        INFO("schedule " << kiln::emu::schedule_name(s));
        DeviceBuffer<float> dx(iota_floats(64));
        KILN_LAUNCH(early_return, 1, 64, 0)(dx.get(), 40);
        CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
        const std::string detail = kiln::emu::last_error_detail();
        CHECK_THAT(detail, Catch::Contains("early_return") && Catch::Contains("__syncthreads()") &&
                               Catch::Contains("exited"));
        CHECK(cudaGetLastError() == cudaSuccess);  // reading the error resets it

        KILN_LAUNCH(early_return, 1, 64, 0)(dx.get(), 40);
        CHECK_THROWS_WITH([&] { KILN_CHECK_LAUNCH(early_return, 1, 64); }(),
                          Catch::Contains("kernel early_return") && Catch::Contains("block (64, 1, 1)") &&
                              Catch::Contains("unspecified launch failure") && Catch::Contains("barrier divergence"));

        KILN_LAUNCH(early_return_shuffle, 1, 32, 0)(dx.get(), 20);
        CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
        CHECK_THAT(kiln::emu::last_error_detail(),
                   Catch::Contains("__shfl_down_sync") && Catch::Contains("exited"));
    }
    // The emulator recovers: the next launch works.
    DeviceBuffer<float> dx(iota_floats(64));
    KILN_LAUNCH(early_return, 1, 64, 0)(dx.get(), 64);
    KILN_CHECK_LAUNCH(early_return, 1, 64);
    CHECK(dx.host()[0] == 1.0f);
}

TEST_CASE("emu: dynamic shared memory", "[emu][cuda]") {
    const int block = 128, blocks = 3, n = block * blocks;
    const auto x = iota_floats(n);
    for (Schedule s : kSchedules) {
        ScopedSchedule scope(s);
        DeviceBuffer<float> din(x), dout(n);
        DeviceBuffer<int> dbits(blocks);
        KILN_LAUNCH(reverse_block, blocks, block, block * sizeof(float))(din.get(), dout.get(), dbits.get());
        KILN_CHECK_LAUNCH(reverse_block, blocks, block);
        const auto out = dout.host();
        const auto bits = dbits.host();
        for (int i = 0; i < n; ++i) CHECK(out[i] == x[(i / block) * block + block - 1 - i % block]);
        for (int b = 0; b < blocks; ++b) CHECK(bits[b] == __float_as_int(x[b * block]));
    }
    // Above 48 KiB a kernel must opt in, as on a GPU.
    DeviceBuffer<float> dout(1);
    KILN_LAUNCH(big_shared, 1, 32, 64 * 1024)(dout.get());
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    CHECK_THAT(kiln::emu::last_error_detail(), Catch::Contains("cudaFuncSetAttribute"));
    KILN_CUDA_CHECK(cudaFuncSetAttribute(big_shared, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024));
    KILN_LAUNCH(big_shared, 1, 32, 64 * 1024)(dout.get());
    KILN_CHECK_LAUNCH(big_shared, 1, 32);
}

TEST_CASE("emu: 2D and 3D grids and blocks", "[emu][cuda]") {
    const dim3 grid(3, 2, 2), block(4, 3, 2);
    const int total = 3 * 2 * 2 * 4 * 3 * 2;
    DeviceBuffer<uint3> dthread(total), dblock(total);
    KILN_LAUNCH(coords, grid, block, 0)(dthread.get(), dblock.get());
    KILN_CHECK_LAUNCH(coords, grid, block);
    const auto th = dthread.host(), bl = dblock.host();
    int id = 0;
    for (unsigned bz = 0; bz < 2; ++bz)
        for (unsigned by = 0; by < 2; ++by)
            for (unsigned bx = 0; bx < 3; ++bx)
                for (unsigned tz = 0; tz < 2; ++tz)
                    for (unsigned ty = 0; ty < 3; ++ty)
                        for (unsigned tx = 0; tx < 4; ++tx, ++id) {
                            INFO("record " << id);
                            CHECK((th[id].x == tx && th[id].y == ty && th[id].z == tz));
                            CHECK((bl[id].x == bx && bl[id].y == by && bl[id].z == bz));
                        }
}

TEST_CASE("emu: cudaMemcpy and cudaMemset round trip, and misuse is reported", "[emu][cuda]") {
    const std::size_t n = 1000;
    std::vector<int> host(n), back(n, -1);
    std::iota(host.begin(), host.end(), 7);
    int *a = nullptr, *b = nullptr;
    KILN_CUDA_CHECK(cudaMalloc(&a, n * sizeof(int)));
    KILN_CUDA_CHECK(cudaMalloc(&b, n * sizeof(int)));
    KILN_CUDA_CHECK(cudaMemset(b, 0, n * sizeof(int)));
    KILN_CUDA_CHECK(cudaMemcpy(a, host.data(), n * sizeof(int), cudaMemcpyHostToDevice));
    KILN_CUDA_CHECK(cudaMemcpyAsync(b, a, n * sizeof(int), cudaMemcpyDeviceToDevice, nullptr));
    KILN_CUDA_CHECK(cudaMemcpy(back.data(), b, n * sizeof(int), cudaMemcpyDeviceToHost));
    CHECK(back == host);
    KILN_CUDA_CHECK(cudaMemsetAsync(a, 0xab, 8, nullptr));
    KILN_CUDA_CHECK(cudaMemcpy(back.data(), a, 8, cudaMemcpyDeviceToHost));
    CHECK(static_cast<unsigned>(back[0]) == 0xababababu);

    // Swapped arguments: a GPU rejects them, so does the emulator, and says which pointer.
    CHECK(cudaMemcpy(back.data(), a, 4, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
    CHECK_THAT(kiln::emu::last_error_detail(), Catch::Contains("not device memory"));
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    CHECK_THROWS_WITH([&] { KILN_CUDA_CHECK(cudaMemcpy(a, host.data(), (n + 1) * sizeof(int), cudaMemcpyHostToDevice)); }(),
                      Catch::Contains("cudaMemcpy") && Catch::Contains("invalid argument") &&
                          Catch::Contains("past the end"));

    std::size_t free_before = 0, total = 0;
    KILN_CUDA_CHECK(cudaMemGetInfo(&free_before, &total));
    CHECK(total > 0);
    KILN_CUDA_CHECK(cudaFree(a));
    KILN_CUDA_CHECK(cudaFree(b));
    CHECK(cudaFree(a) == cudaErrorInvalidValue);  // freed twice
    cudaGetLastError();

    int count = 0, dev = -1;
    KILN_CUDA_CHECK(cudaGetDeviceCount(&count));
    KILN_CUDA_CHECK(cudaSetDevice(0));
    KILN_CUDA_CHECK(cudaGetDevice(&dev));
    CHECK((count == 1 && dev == 0));
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
}

TEST_CASE("emu: an invalid launch shape is reported", "[emu][cuda]") {
    KILN_LAUNCH(noop, 1, 2048, 0)();
    CHECK(cudaPeekAtLastError() == cudaErrorInvalidConfiguration);
    CHECK_THROWS_WITH([] { KILN_CHECK_LAUNCH(noop, 1, 2048); }(),
                      Catch::Contains("kernel noop") && Catch::Contains("invalid configuration argument") &&
                          Catch::Contains("2048 threads"));
    KILN_LAUNCH(noop, 0, 32, 0)();
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    CHECK_THAT(kiln::emu::last_error_detail(), Catch::Contains("zero dimension"));
    KILN_LAUNCH(noop, 1, dim3(1, 1, 65), 0)();
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    KILN_LAUNCH(noop, dim3(1, 70000), 32, 0)();
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    KILN_LAUNCH(noop, 1, dim3(32, 32), 0)();  // exactly 1024: fine
    CHECK(cudaGetLastError() == cudaSuccess);
}

TEST_CASE("emu: streams, events and device properties", "[emu][cuda]") {
    cudaStream_t stream;
    cudaEvent_t start, stop;
    KILN_CUDA_CHECK(cudaStreamCreate(&stream));
    KILN_CUDA_CHECK(cudaEventCreate(&start));
    KILN_CUDA_CHECK(cudaEventCreate(&stop));
    KILN_CUDA_CHECK(cudaEventRecord(start, stream));
    KILN_LAUNCH_STREAM(noop, 64, 64, 0, stream)();
    KILN_CHECK_LAUNCH(noop, 64, 64);
    KILN_CUDA_CHECK(cudaEventRecord(stop, stream));
    KILN_CUDA_CHECK(cudaEventSynchronize(stop));
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
    float ms = -1;
    KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    CHECK(ms >= 0);
    KILN_CUDA_CHECK(cudaEventDestroy(start));
    KILN_CUDA_CHECK(cudaEventDestroy(stop));
    KILN_CUDA_CHECK(cudaStreamDestroy(stream));

    cudaDeviceProp prop;
    KILN_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    CHECK(prop.warpSize == 32);
    CHECK(prop.maxThreadsPerBlock == 1024);
    CHECK(cudaGetErrorString(cudaErrorInvalidValue) == std::string("invalid argument"));
}

TEST_CASE("emu: half and bfloat16 conversions and math intrinsics", "[emu][cuda]") {
    const __half h = __float2half(1.5f);
    const __nv_bfloat16 b = __float2bfloat16(-2.5f);
    CHECK(__half2float(h) == 1.5f);
    CHECK(__bfloat162float(b) == -2.5f);
    CHECK(__half2float(__hadd(h, h)) == 3.0f);
    CHECK(__expf(0.0f) == 1.0f);
    CHECK(rsqrtf(4.0f) == 0.5f);
    CHECK(__fdividef(1.0f, 4.0f) == 0.25f);
    CHECK(min(3, 4) == 3);
    CHECK(max(3.0f, 4.0f) == 4.0f);
    CHECK(__popc(0xf0u) == 4);
    CHECK(__brev(1u) == 0x80000000u);
}

// Byte i of a word is bits 8i .. 8i + 7: 0x04030201 holds the bytes 1, 2, 3, 4 (byte 0 first).
TEST_CASE("emu: __dp4a multiplies four bytes, signed or unsigned, and wraps like a 32-bit adder", "[emu][cuda]") {
    // 10 + 1·5 + 2·6 + 3·7 + 4·8
    CHECK(__dp4a(0x04030201, 0x08070605, 10) == 80);
    // signed bytes (−1, −128, 127, 0) · (1, −128, −128, 5) = −1 + 16384 − 16256 + 0
    CHECK(__dp4a(int(0x007F80FFu), int(0x05808001u), 0) == 127);
    // The same bits read as signed or unsigned: (2, 1, 0xFF, 0x80) · (5, 4, 3, 2) + 5
    CHECK(__dp4a(int(0x80FF0102u), 0x02030405, 5) == 5 + 10 + 4 - 3 - 256);      // −1, −128
    CHECK(__dp4a(0x80FF0102u, 0x02030405u, 5u) == 5u + 10u + 4u + 765u + 256u);  // 255, 128
    // Wrap-around: INT_MAX + 4·(−128)·(−128) = 2^31 − 1 + 65536 − 2^32
    CHECK(__dp4a(int(0x80808080u), int(0x80808080u), 2147483647) == -2147418113);
    // unsigned: (2^32 − 1) + 4·255·255 = 260100 − 1 (mod 2^32)
    CHECK(__dp4a(0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu) == 260099u);
    // The vector overloads: .x is byte 0. (1, −2, 3, −4) · (−5, 6, −7, 8) = −5 − 12 − 21 − 32
    CHECK(__dp4a(make_char4(1, -2, 3, -4), make_char4(-5, 6, -7, 8), 0) == -70);
    CHECK(__dp4a(make_uchar4(1, 2, 3, 200), make_uchar4(4, 5, 6, 200), 1u) == 1u + 4u + 10u + 18u + 40000u);
}

// --- the checks: shuffled schedule, poison ----------------------------------------------------------

TEST_CASE("emu: under_schedules runs the shuffled schedule, which shows a missing barrier reversed hides", "[emu][cuda]") {
    const int blocks = 4, n = blocks * 256;
    const auto x = iota_floats(n, 1.0f);  // integers: every partial sum is exact in f32
    std::vector<float> want(blocks, 0.0f);
    for (int i = 0; i < n; ++i) want[i / 256] += x[i];
    auto right = [&](auto kernel) {
        DeviceBuffer<float> dx(x), dout(blocks);
        KILN_LAUNCH(kernel, blocks, 256, 0)(dx.get(), dout.get(), n);
        KILN_CHECK_LAUNCH(kernel, blocks, 256);
        return dout.host() == want;
    };
    std::vector<Schedule> seen;
    std::vector<bool> racy_right;
    kiln::test::under_schedules([&] {
        seen.push_back(kiln::emu::schedule());
        racy_right.push_back(right(block_sum_racy));
        CHECK(right(block_sum<256>));  // the correct reduction passes under every schedule
    });
    REQUIRE(seen == std::vector<Schedule>{Schedule::InOrder, Schedule::Reverse, Schedule::Shuffle});
    CHECK(racy_right[1]);        // reversed, the bug hides ...
    CHECK_FALSE(racy_right[2]);  // ... shuffled, it shows
    for (std::uint64_t seed = 2; seed <= 5; ++seed) {  // and it does not hinge on one lucky seed
        ScopedSchedule scope(Schedule::Shuffle, seed);
        INFO("seed " << seed);
        CHECK_FALSE(right(block_sum_racy));
    }
}

TEST_CASE("emu: poison makes a read of memory nobody wrote NaN", "[emu][cuda]") {
    // Static __shared__ arrays too: without the poison they would start at zero and keep the
    // previous block's values, and the forgotten word would look written.
    const int blocks = 3, block = 64;
    const auto x = iota_floats(blocks * block);
    auto poisoned = [&](auto kernel, std::size_t shared) {
        for (Schedule s : kSchedules) {
            ScopedSchedule scope(s);
            INFO("schedule " << kiln::emu::schedule_name(s));
            DeviceBuffer<float> dx(x), dout(blocks);
            for (int written : {block, block - 1}) {  // all words written; the last one forgotten
                KILN_LAUNCH(kernel, blocks, block, shared)(dx.get(), dout.get(), written);
                KILN_CHECK_LAUNCH(kernel, blocks, block);
                for (float v : dout.host()) CHECK(std::isnan(v) == (written < block));
            }
        }
    };
    SECTION("dynamic shared memory, in every block and under every schedule") {
        poisoned(sum_through_shared<Where::Dynamic>, block * sizeof(float));
    }
    SECTION("a static __shared__ array, in every block and under every schedule") {
        poisoned(sum_through_shared<Where::Static>, 0);
    }
    SECTION("a __shared__ array of a __device__ function, in every block and under every schedule") {
        poisoned(sum_through_shared<Where::Device>, 0);
    }
    SECTION("cudaMalloc: 0xFF bytes, which are NaN as f32, f16 and bf16") {
        const int n = 100;
        float* p = nullptr;
        KILN_CUDA_CHECK(cudaMalloc(&p, n * sizeof(float)));
        std::vector<std::uint32_t> bits(n);
        KILN_CUDA_CHECK(cudaMemcpy(bits.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost));
        for (std::uint32_t b : bits) CHECK(b == 0xFFFFFFFFu);
        CHECK(std::isnan(__half2float(__ushort_as_half(0xFFFF))));
        CHECK(std::isnan(__bfloat162float(__ushort_as_bfloat16(0xFFFF))));
        KILN_CUDA_CHECK(cudaFree(p));

        // A kernel that accumulates into a fresh buffer reads the poison; after cudaMemset it is right.
        const auto x = iota_floats(n);
        DeviceBuffer<float> dx(x);
        KILN_CUDA_CHECK(cudaMalloc(&p, n * sizeof(float)));
        KILN_LAUNCH(accumulate, 1, 128, 0)(dx.get(), p, n);
        KILN_CHECK_LAUNCH(accumulate, 1, 128);
        std::vector<float> out(n);
        KILN_CUDA_CHECK(cudaMemcpy(out.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost));
        for (float v : out) CHECK(std::isnan(v));
        KILN_CUDA_CHECK(cudaMemset(p, 0, n * sizeof(float)));
        KILN_LAUNCH(accumulate, 1, 128, 0)(dx.get(), p, n);
        KILN_CHECK_LAUNCH(accumulate, 1, 128);
        KILN_CUDA_CHECK(cudaMemcpy(out.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost));
        CHECK(out == x);
        KILN_CUDA_CHECK(cudaFree(p));
    }
}

TEST_CASE("emu: the race detector names two threads writing one shared word between barriers", "[emu][cuda]") {
    kiln::emu::ScopedRacecheck on(true);
    const auto x = iota_floats(64, 1.0f);
    DeviceBuffer<float> dx(x), dout(64);
    auto caught = [&](auto kernel, std::size_t shared, const std::string& where) {
        {
            ScopedSchedule in_order(Schedule::InOrder);  // thread 0 writes first, whatever KILN_EMU_SCHEDULE says
            KILN_LAUNCH(kernel, 1, 64, shared)(dx.get(), dout.get(), true);
        }
        CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
        CHECK_THAT(kiln::emu::last_error_detail(),
                   Catch::Contains("race in " + where + ": thread (0, 0, 0) and thread (32, 0, 0)") &&
                       Catch::Matches(".* at byte offset [0-3] .*"));  // a byte of word 0 that changed
        for (Schedule s : kSchedules) {  // the fixed kernel, and atomics, pass under every schedule
            ScopedSchedule scope(s);
            INFO("schedule " << kiln::emu::schedule_name(s));
            KILN_LAUNCH(kernel, 1, 64, shared)(dx.get(), dout.get(), false);
            KILN_CHECK_LAUNCH(kernel, 1, 64);
            const auto out = dout.host();
            for (int t = 0; t < 64; ++t) CHECK(out[t] == x[32 + t % 32]);
        }
        kiln::emu::ScopedRacecheck off(false);  // off (the default), the race goes unreported
        KILN_LAUNCH(kernel, 1, 64, shared)(dx.get(), dout.get(), true);
        KILN_CHECK_LAUNCH(kernel, 1, 64);
    };
    SECTION("dynamic shared memory") {
        caught(fold_to_warp<Where::Dynamic>, 32 * sizeof(float), "dynamic shared memory");
        KILN_LAUNCH(fold_to_warp<Where::Dynamic>, 1, 64, 32 * sizeof(float))(dx.get(), dout.get(), true);
        CHECK_THAT(kiln::emu::last_error_detail(), Catch::Contains("kernel fold_to_warp<Where::Dynamic>"));
    }
    SECTION("a static __shared__ array, named") {
        caught(fold_to_warp<Where::Static>, 0, "__shared__ array tile");
    }
    SECTION("a __shared__ array of a __device__ function, named") {
        caught(fold_to_warp<Where::Device>, 0, "__shared__ array dtile");
    }
    SECTION("atomics on one word are not a race") {
        for (Schedule s : kSchedules) {
            ScopedSchedule scope(s);
            DeviceBuffer<int> dcount(1);
            KILN_LAUNCH(count_in_shared, 2, 96, sizeof(int))(dcount.get());
            KILN_CHECK_LAUNCH(count_in_shared, 2, 96);
            CHECK(dcount.host()[0] == 96);
        }
    }
}

// The static arrays are found through the symbol table: each with its size and declared name,
// a kernel's own and those of __device__ functions.
TEST_CASE("emu: a kernel's static __shared__ arrays are found by its address", "[emu][cuda]") {
    const auto& arrays = kiln::emu::static_shared_arrays(reinterpret_cast<const void*>(&block_sum<256>));
    REQUIRE(arrays.size() >= 2);  // its s, then the __device__ functions' (device_tile's dtile, ...)
    CHECK(arrays[0].name == "s");
    CHECK(arrays[0].bytes == 256 * sizeof(float));
    CHECK(kiln::emu::static_shared_arrays(reinterpret_cast<const void*>(&block_sum<1024>))[0].bytes ==
          1024 * sizeof(float));
    // Arrays of __device__ functions belong to every kernel (any may call the function), after
    // the kernel's own: device_tile's dtile is checked for accumulate too, which has none.
    const auto dtile = [](const std::vector<kiln::emu::StaticShared>& a) {
        return std::find_if(a.begin(), a.end(), [](const kiln::emu::StaticShared& s) { return s.name == "dtile"; });
    };
    const auto& of_accumulate = kiln::emu::static_shared_arrays(reinterpret_cast<const void*>(&accumulate));
    REQUIRE(dtile(of_accumulate) != of_accumulate.end());
    CHECK(dtile(of_accumulate)->bytes == 64 * sizeof(float));
    CHECK(dtile(arrays) != arrays.end());
    CHECK(std::none_of(of_accumulate.begin(), of_accumulate.end(),
                       [](const kiln::emu::StaticShared& s) { return s.name == "s"; }));
}

// A read-write race (a thread reads a word another writes between the same two barriers) is not
// reported: the race detector sees only writes. The poison and the schedules catch this one:
// whichever neighbour runs later has not written its word yet, so the read finds NaN.
TEST_CASE("emu: a stencil missing its barrier reads the poison under every schedule", "[emu][cuda]") {
    const int blocks = 3, block = 64, n = blocks * block;
    const auto x = iota_floats(n, 1.0f);  // small integers: every sum is exact in f32
    std::vector<float> want(n);
    for (int i = 0; i < n; ++i) {
        const int t = i % block;
        want[i] = (t > 0 ? x[i - 1] : 0.0f) + x[i] + (t + 1 < block ? x[i + 1] : 0.0f);
    }
    for (Schedule s : kSchedules) {
        ScopedSchedule scope(s);
        INFO("schedule " << kiln::emu::schedule_name(s));
        DeviceBuffer<float> dx(x), dout(n);
        KILN_LAUNCH(stencil3, blocks, block, 0)(dx.get(), dout.get(), false);
        KILN_CHECK_LAUNCH(stencil3, blocks, block);
        CHECK(dout.host() == want);
        KILN_LAUNCH(stencil3, blocks, block, 0)(dx.get(), dout.get(), true);
        KILN_CHECK_LAUNCH(stencil3, blocks, block);
        const auto racy = dout.host();
        CHECK(std::any_of(racy.begin(), racy.end(), [](float v) { return std::isnan(v); }));
    }
}

// Global memory: two blocks changing one byte of an allocation a pointer argument points into.
TEST_CASE("emu: the race detector names two blocks writing one global word without an atomic", "[emu][cuda]") {
    kiln::emu::ScopedRacecheck on(true);
    const int n = 256, block = 64, nbins = 16;
    std::vector<int> x(n);
    for (int i = 0; i < n; ++i) x[i] = i % nbins;  // every block adds to every bin
    DeviceBuffer<int> dx(x), dbins(nbins);
    KILN_LAUNCH(histogram, n / block, block, 0)(dx.get(), n, dbins.get(), false);
    CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
    CHECK_THAT(kiln::emu::last_error_detail(),
               Catch::Contains("kernel histogram") && Catch::Contains("race in global memory") &&
                   Catch::Contains("block (0, 0, 0) and block (1, 0, 0)") &&
                   Catch::Contains("of the 64-byte allocation") && Catch::Contains("argument 2 points into it"));
    DeviceBuffer<int> dfresh(nbins);  // with atomics: no race, and the count is right
    KILN_LAUNCH(histogram, n / block, block, 0)(dx.get(), n, dfresh.get(), true);
    KILN_CHECK_LAUNCH(histogram, n / block, block);
    CHECK(dfresh.host() == std::vector<int>(nbins, n / nbins));
}

// kiln's own kernels, static shared arrays included, pass the race detector: its GEMM (tiles in
// static __shared__ arrays, barriers between their loads and uses) and its sum (a tree reduction).
TEST_CASE("emu: kiln's GEMM and sum kernels pass the race detector", "[emu][cuda]") {
    kiln::emu::ScopedRacecheck on(true);
    auto small_ints = [](int n) {  // -8 .. 8: products <= 64, 70-term sums < 2^24, exact in f32
        std::vector<float> v(n);
        for (int i = 0; i < n; ++i) v[i] = float(i % 17 - 8);
        return v;
    };
    const kiln::Tensor a = kiln::test::tensor_of({40, 70}, small_ints(40 * 70));
    const kiln::Tensor b = kiln::test::tensor_of({70, 30}, small_ints(70 * 30));
    kiln::test::under_schedules([&] {
        kiln::test::require_identical(kiln::matmul(a.to(kiln::Device::CUDA), b.to(kiln::Device::CUDA)),
                                      kiln::matmul(a, b));
        CHECK(kiln::sum(a.to(kiln::Device::CUDA)) == kiln::sum(a));
    });
}

// ---- the wmma fragment API (cuda/emu/wmma.h, chapter 09) ------------------------------------------------
// The fragment tests multiply small integers: every product and sum is an integer far below 2^11,
// exact in f16, bf16 and f32, so the result must equal the integer product exactly, whatever order
// the sums take. The misuse tests check that the emulator fails a launch where a GPU would compute
// garbage or fault, with a message naming the call.
namespace wmma = nvcuda::wmma;

namespace {

// One warp: d = a·b + c for one M×N×K tile, a and b read with layouts LA and LB (ldm = their
// column count when row-major, row count when column-major), c read with layout lc (or, when
// c is null, every element 0.5 by fill_fragment), d stored with layout ld; every element of
// the accumulator is then doubled through x[] (elementwise, whatever the lane mapping).
template <int M, int N, int K, typename T, typename LA, typename LB>
__global__ void mma_tile(const T* a, const T* b, const float* c, float* d, wmma::layout_t lc, wmma::layout_t ld) {
    constexpr bool a_row = std::is_same_v<LA, wmma::row_major>, b_row = std::is_same_v<LB, wmma::row_major>;
    wmma::fragment<wmma::matrix_a, M, N, K, T, LA> fa;
    wmma::fragment<wmma::matrix_b, M, N, K, T, LB> fb;
    wmma::fragment<wmma::accumulator, M, N, K, float> acc;
    wmma::load_matrix_sync(fa, a, a_row ? K : M);
    wmma::load_matrix_sync(fb, b, b_row ? N : K);
    if (c) wmma::load_matrix_sync(acc, c, lc == wmma::mem_row_major ? N : M, lc);
    else wmma::fill_fragment(acc, 0.5f);
    wmma::mma_sync(acc, fa, fb, acc);
    for (int e = 0; e < acc.num_elements; e++) acc.x[e] *= 2.0f;
    wmma::store_matrix_sync(d, acc, ld == wmma::mem_row_major ? N : M, ld);
}

// Small integers: a[i][k] = (i + 2k) mod 7 − 3, b[k][j] = (3k + j) mod 5 − 2, c[i][j] = i − j.
// Stored row- or column-major as asked, in T (exact), on the device.
template <typename T>
struct Tile {
    int rows, cols;
    std::vector<float> logical;  // row-major
    T* device = nullptr;
    Tile(int r, int c, int (*value)(int, int), bool row_major) : rows(r), cols(c), logical(size_t(r * c)) {
        std::vector<T> stored(logical.size());
        for (int i = 0; i < r; i++)
            for (int j = 0; j < c; j++) {
                logical[size_t(i * c + j)] = float(value(i, j));
                stored[size_t(row_major ? i * c + j : j * r + i)] = T(float(value(i, j)));
            }
        KILN_CUDA_CHECK(cudaMalloc(&device, stored.size() * sizeof(T)));
        KILN_CUDA_CHECK(cudaMemcpy(device, stored.data(), stored.size() * sizeof(T), cudaMemcpyHostToDevice));
    }
    ~Tile() { cudaFree(device); }
    Tile(const Tile&) = delete;
    Tile& operator=(const Tile&) = delete;
    float at(int i, int j) const { return logical[size_t(i * cols + j)]; }
};

int a_value(int i, int k) { return (i + 2 * k) % 7 - 3; }
int b_value(int k, int j) { return (3 * k + j) % 5 - 2; }
int c_value(int i, int j) { return i - j; }

// Runs mma_tile for one shape and layout combination and checks every element of d exactly.
template <int M, int N, int K, typename T, typename LA, typename LB>
void check_mma_tile(bool with_c, wmma::layout_t lc, wmma::layout_t ld) {
    constexpr bool a_row = std::is_same_v<LA, wmma::row_major>, b_row = std::is_same_v<LB, wmma::row_major>;
    INFO(M << "×" << N << "×" << K << ", a " << (a_row ? "row" : "col") << "-major, b " << (b_row ? "row" : "col")
           << "-major, c " << (with_c ? (lc == wmma::mem_row_major ? "row-major" : "col-major") : "filled")
           << ", d " << (ld == wmma::mem_row_major ? "row" : "col") << "-major");
    const Tile<T> a(M, K, a_value, a_row), b(K, N, b_value, b_row);
    const Tile<float> c(M, N, c_value, lc == wmma::mem_row_major);
    float* d = nullptr;
    KILN_CUDA_CHECK(cudaMalloc(&d, M * N * sizeof(float)));
    constexpr auto kernel = mma_tile<M, N, K, T, LA, LB>;
    KILN_LAUNCH(kernel, 1, 32, 0)(a.device, b.device, with_c ? c.device : nullptr, d, lc, ld);
    KILN_CHECK_LAUNCH(kernel, 1, 32);
    std::vector<float> got(M * N);
    KILN_CUDA_CHECK(cudaMemcpy(got.data(), d, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
    cudaFree(d);
    int bad = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float want = with_c ? c.at(i, j) : 0.5f;
            for (int k = 0; k < K; k++) want += a.at(i, k) * b.at(k, j);
            want *= 2.0f;
            const float g = got[size_t(ld == wmma::mem_row_major ? i * N + j : j * M + i)];
            if (g != want && bad++ == 0) FAIL_CHECK("d[" << i << "][" << j << "] = " << g << ", want " << want);
        }
    REQUIRE(bad == 0);
}

template <typename T, typename LA, typename LB>
void check_layouts() {
    for (auto lc : {wmma::mem_row_major, wmma::mem_col_major})
        for (auto ld : {wmma::mem_row_major, wmma::mem_col_major}) check_mma_tile<16, 16, 16, T, LA, LB>(true, lc, ld);
    check_mma_tile<16, 16, 16, T, LA, LB>(false, wmma::mem_row_major, wmma::mem_row_major);
    check_mma_tile<32, 8, 16, T, LA, LB>(true, wmma::mem_col_major, wmma::mem_row_major);
    check_mma_tile<8, 32, 16, T, LA, LB>(true, wmma::mem_row_major, wmma::mem_col_major);
}

// Misuse, one kernel with a switch: which lane skips the load of a (-1: none), and an offset
// (elements) and ldm for a.
__global__ void misused(const __half* a, const __half* b, float* d, int skipping_lane, int offset, unsigned lda,
                        unsigned ldd) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    if (int(threadIdx.x) != skipping_lane) wmma::load_matrix_sync(fa, a + offset, lda);
    wmma::load_matrix_sync(fb, b, 16);
    wmma::mma_sync(acc, fa, fb, acc);
    wmma::store_matrix_sync(d, acc, ldd, wmma::mem_row_major);
}

// Lane 3 returns before the load the others wait in.
__global__ void lane_returns_early(const __half* a) {
    if (threadIdx.x == 3) return;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
    wmma::load_matrix_sync(fa, a, 16);
}

// Each lane passes its own pointer: lanes disagree on the arguments.
__global__ void lanes_disagree(const __half* a) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
    wmma::load_matrix_sync(fa, a + 16 * (threadIdx.x % 2), 16);
}

std::string failure_of_misused(unsigned threads, int skipping_lane, int offset, unsigned lda, unsigned ldd) {
    __half *a = nullptr, *b = nullptr;
    float* d = nullptr;
    KILN_CUDA_CHECK(cudaMalloc(&a, 512 * sizeof(__half)));
    KILN_CUDA_CHECK(cudaMalloc(&b, 256 * sizeof(__half)));
    KILN_CUDA_CHECK(cudaMalloc(&d, 512 * sizeof(float)));
    KILN_LAUNCH(misused, 1, threads, 0)(a, b, d, skipping_lane, offset, lda, ldd);
    std::string message;
    try {
        KILN_CHECK_LAUNCH(misused, 1, threads);
    } catch (const kiln::Error& e) {
        message = e.what();
    }
    cudaFree(a), cudaFree(b), cudaFree(d);
    return message;
}

}  // namespace

TEST_CASE("wmma fragments on the emulator: one mma with every layout, exact", "[emu][wmma][cuda][lesson09]") {
    using wmma::col_major;
    using wmma::row_major;
    check_layouts<__half, row_major, row_major>();
    check_layouts<__half, col_major, row_major>();
    check_layouts<__half, row_major, col_major>();
    check_layouts<__nv_bfloat16, col_major, col_major>();
    check_layouts<__nv_bfloat16, row_major, col_major>();
    // x[] spreads the tile over the lanes: 256 elements of a 16×16 fragment, 8 per lane.
    CHECK(wmma::fragment<wmma::accumulator, 16, 16, 16, float>::num_elements * 32 == 256);
    CHECK(wmma::fragment<wmma::matrix_a, 32, 8, 16, __half, row_major>::num_elements * 32 == 32 * 16);
}

TEST_CASE("wmma misuse fails the launch with a message naming the call", "[emu][wmma][cuda][lesson09]") {
    using Catch::Contains;
    // The well-formed launch works (and so the failures below come from the misuse alone).
    CHECK(failure_of_misused(32, -1, 0, 16, 16).empty());
    // Lane 5 skips load_matrix_sync: it reaches the next call while the others wait in this one.
    CHECK_THAT(failure_of_misused(32, 5, 0, 16, 16),
               Contains("kernel misused") && Contains("wmma::load_matrix_sync") && Contains("thread (5, 0, 0)") &&
                   Contains("disagree"));
    // Pointers off the 32-byte grid: 1 element, and 8 elements (16 bytes).
    for (int offset : {1, 8})
        CHECK_THAT(failure_of_misused(32, -1, offset, 16, 16),
                   Contains("wmma::load_matrix_sync") && Contains("256-bit (32-byte) aligned"));
    // ldm not a multiple of 16 bytes: 12 halves, 6 floats.
    CHECK_THAT(failure_of_misused(32, -1, 0, 12, 16),
               Contains("wmma::load_matrix_sync") && Contains("ldm = 12 must be a multiple of 8"));
    CHECK_THAT(failure_of_misused(32, -1, 0, 16, 6),
               Contains("wmma::store_matrix_sync") && Contains("ldm = 6 must be a multiple of 4"));
    // A warp of 16 threads.
    CHECK_THAT(failure_of_misused(16, -1, 0, 16, 16), Contains("wmma::") && Contains("all 32 lanes"));
    // A lane that has returned, and lanes passing different pointers.
    __half* a = nullptr;
    KILN_CUDA_CHECK(cudaMalloc(&a, 512 * sizeof(__half)));
    KILN_LAUNCH(lane_returns_early, 1, 32, 0)(a);
    CHECK_THROWS_WITH([&] { KILN_CHECK_LAUNCH(lane_returns_early, 1, 32); }(),
                      Contains("wmma::load_matrix_sync") && Contains("thread (3, 0, 0) has already exited"));
    KILN_LAUNCH(lanes_disagree, 1, 32, 0)(a);
    CHECK_THROWS_WITH([&] { KILN_CHECK_LAUNCH(lanes_disagree, 1, 32); }(),
                      Contains("wmma::load_matrix_sync") && Contains("disagree") && Contains("same fragment type"));
    cudaFree(a);
}

#endif  // KILN_CUDA
