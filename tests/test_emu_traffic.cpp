// test_emu_traffic.cpp — the emulator's memory counts (cuda/emu/traffic.cpp, emu.h "memory
// traffic"): small kernels with planted access patterns whose requests, sectors and wavefronts are
// worked out by hand below, each checked exactly. This file is compiled for tracing (the Makefile's
// TRACE_FLAGS: clang, every load and store reported to the emulator), as the lab's kernels are.
//
// Global memory, one warp of 32 lanes loading 4-byte floats (cudaMalloc'd, so 256-byte aligned):
//   x[t]            bytes 0..127                     4 sectors of 32 bytes   (coalesced)
//   x[t + 1]        bytes 4..131                     5 sectors               (misaligned by one)
//   x[2t]           bytes 0, 8, ..., 248             8 sectors               (stride 2)
//   x[32t]          one float per 128 bytes          32 sectors              (stride 32)
//   float4 x4[t]    bytes 0..511, 16 per lane        16 sectors, 1 request
// Shared memory, 32 banks of 4 bytes; word w lies in bank w % 32:
//   s[t]            words 0..31, one per bank        1 wavefront
//   s[2t]           words 0, 2, ..., 62: banks 0, 2, ..., 30 twice each       2 wavefronts
//   s[32t]          words 0, 32, ..., 992: all in bank 0                     32 wavefronts
//   tile[t][0] of float[32][33]  words 33t: bank t (the padding)              1 wavefront
//   s[0]            one word for all lanes: a broadcast                      1 wavefront
//   float4 s4[t]    quarter-warps of 8 lanes × 16 bytes = 128 bytes each      4 wavefronts, ideal 4
//   float4 at 32t bytes: words 8t..8t+3, so lanes t and t + 4 of a quarter share banks
//                                                                             8 wavefronts, ideal 4
//
//   make test T='[traffic]'
#ifndef KILN_CUDA
#include <catch2/catch.hpp>

#include <functional>
#include <vector>

#include "core/tensor.h"
#include "kiln_cuda.h"
#include "ops/ops.h"

using kiln::emu::LaunchTraffic;

namespace {

// The global load each lane makes: x[t·stride + offset].
__global__ void load_strided(const float* x, float* y, int stride, int offset) {
    const int t = threadIdx.x;
    y[t] = x[t * stride + offset];
}

__global__ void load_float4(const float4* x, float* y) {
    const int t = threadIdx.x;
    const float4 v = x[t];
    y[t] = v.x + v.y + v.z + v.w;
}

// Lanes below `active` load: a partial request.
__global__ void load_some(const float* x, float* y, int active) {
    const int t = threadIdx.x;
    if (t < active) y[t] = x[t];
}

// Four loads per lane from one instruction in a loop: four requests.
__global__ void load_in_loop(const float* x, float* y) {
    const int t = threadIdx.x;
    float sum = 0.0f;
    for (int i = 0; i < 4; i++) sum += x[i * 32 + t];
    y[t] = sum;
}

// Each lane stores and then loads word t·stride of a static __shared__ array.
__global__ void shared_strided(float* y, int stride) {
    __shared__ float s[32 * 32];
    const int t = threadIdx.x;
    s[t * stride] = float(t);
    __syncthreads();
    y[t] = s[t * stride];
}

// A column of a 32×32 tile, unpadded (32-way conflict) or padded to 33 (none).
template <int kWidth>
__global__ void shared_column(float* y) {
    __shared__ float tile[32][kWidth];
    const int t = threadIdx.x;
    tile[t][0] = float(t);
    __syncthreads();
    y[t] = tile[t][0];
}

__global__ void shared_broadcast(float* y) {
    __shared__ float s[32];
    const int t = threadIdx.x;
    if (t == 0) s[0] = 5.0f;
    __syncthreads();
    y[t] = s[0];
}

// The same column in dynamic shared memory.
__global__ void dynamic_strided(float* y, int stride) {
    KILN_DYNAMIC_SHARED(float, s);
    const int t = threadIdx.x;
    s[t * stride] = float(t);
    __syncthreads();
    y[t] = s[t * stride];
}

// float4 loads from shared memory: lane t's at float 4t (contiguous) or 8t (every other 16 bytes).
__global__ void shared_float4(float* y, int floats_apart) {
    __shared__ __align__(16) float s[32 * 8];
    const int t = threadIdx.x;
    for (int i = 0; i < 8; i++) s[t * 8 + i] = float(t);
    __syncthreads();
    const float4 v = *reinterpret_cast<const float4*>(&s[t * floats_apart]);
    y[t] = v.x + v.w;
}

// A __shared__ array of a __device__ function the kernel calls.
__device__ float* scratch() {
    __shared__ float buf[64];
    return buf;
}
__global__ void device_array(float* y) {
    float* buf = scratch();
    const int t = threadIdx.x;
    buf[2 * t] = float(t);
    __syncthreads();
    y[t] = buf[2 * t];
}

// One load instruction in two rounds with a barrier between: in round 0 lanes 0-15 run it twice
// and lanes 16-31 once, in round 1 every lane once. A GPU issues it three times: 32 lanes, then
// lanes 0-15 alone, then (after the barrier, where the block is together again) 32 lanes.
__global__ void load_diverging(const float* x, float* y) {
    const int t = threadIdx.x;
    float sum = 0.0f;
    for (int round = 0; round < 2; round++) {
        const int times = round == 0 && t < 16 ? 2 : 1;
        for (int i = 0; i < times; i++) sum += x[round * 32 + t];
        __syncthreads();
    }
    y[t] = sum;
}

__global__ void add_atomically(float* y) { atomicAdd(&y[0], 1.0f); }

// Runs launch() with counting on and returns the one launch it counted.
LaunchTraffic counted(const std::function<void()>& launch) {
    kiln::emu::take_traffic();
    {
        kiln::emu::ScopedTraffic on;
        launch();
    }
    const std::vector<LaunchTraffic> launches = kiln::emu::take_traffic();
    REQUIRE(launches.size() == 1);
    REQUIRE(launches[0].traced);
    return launches[0];
}

struct Device {
    float* x = nullptr;
    float* y = nullptr;
    Device() {
        KILN_CUDA_CHECK(cudaMalloc(&x, 32 * 33 * sizeof(float)));
        KILN_CUDA_CHECK(cudaMalloc(&y, 64 * sizeof(float)));
        KILN_CUDA_CHECK(cudaMemset(x, 0, 32 * 33 * sizeof(float)));
    }
    ~Device() {
        cudaFree(x);
        cudaFree(y);
    }
};

// (requests, sectors or wavefronts, ideal) of one kind of access
std::vector<std::uint64_t> counts(const kiln::emu::AccessCounts& c) { return {c.requests, c.sectors, c.ideal}; }

}  // namespace

TEST_CASE("emu traffic: a warp's global loads, sectors per request by hand", "[emu][cuda][traffic]") {
    Device d;
    const auto strided = [&](int stride, int offset) {
        return counted([&] {
            KILN_LAUNCH(load_strided, 1, 32, 0)(d.x, d.y, stride, offset);
            KILN_CHECK_LAUNCH(load_strided, 1, 32);
        });
    };
    const LaunchTraffic coalesced = strided(1, 0);
    CHECK(coalesced.kernel == "load_strided");
    CHECK(counts(coalesced.global_load) == std::vector<std::uint64_t>{1, 4, 0});
    CHECK(coalesced.global_load.bytes == 128);
    CHECK(counts(coalesced.global_store) == std::vector<std::uint64_t>{1, 4, 0});
    CHECK(counts(coalesced.shared_load) == std::vector<std::uint64_t>{0, 0, 0});
    CHECK(strided(1, 1).global_load.sectors == 5);
    CHECK(strided(2, 0).global_load.sectors == 8);
    CHECK(strided(32, 0).global_load.sectors == 32);
    CHECK(strided(32, 0).global_load.requests == 1);

    const LaunchTraffic f4 = counted([&] {
        KILN_LAUNCH(load_float4, 1, 32, 0)(reinterpret_cast<const float4*>(d.x), d.y);
        KILN_CHECK_LAUNCH(load_float4, 1, 32);
    });
    CHECK(counts(f4.global_load) == std::vector<std::uint64_t>{1, 16, 0});  // one 16-byte load per lane
    CHECK(f4.global_load.bytes == 512);
}

TEST_CASE("emu traffic: requests follow the warps: two warps, a partial warp, a loop", "[emu][cuda][traffic]") {
    Device d;
    const LaunchTraffic two = counted([&] {
        KILN_LAUNCH(load_strided, 1, 64, 0)(d.x, d.y, 1, 0);
        KILN_CHECK_LAUNCH(load_strided, 1, 64);
    });
    CHECK(counts(two.global_load) == std::vector<std::uint64_t>{2, 8, 0});  // 64 floats: 2 × 4 sectors
    const LaunchTraffic half = counted([&] {
        KILN_LAUNCH(load_some, 1, 32, 0)(d.x, d.y, 16);
        KILN_CHECK_LAUNCH(load_some, 1, 32);
    });
    CHECK(counts(half.global_load) == std::vector<std::uint64_t>{1, 2, 0});  // 16 lanes: 64 bytes
    const LaunchTraffic loop = counted([&] {
        KILN_LAUNCH(load_in_loop, 1, 32, 0)(d.x, d.y);
        KILN_CHECK_LAUNCH(load_in_loop, 1, 32);
    });
    CHECK(counts(loop.global_load) == std::vector<std::uint64_t>{4, 16, 0});
    CHECK(counts(loop.global_store) == std::vector<std::uint64_t>{1, 4, 0});
    // Lanes are matched anew after each barrier: 32 lanes (4 sectors), 16 (2), 32 (4).
    const LaunchTraffic diverging = counted([&] {
        KILN_LAUNCH(load_diverging, 1, 32, 0)(d.x, d.y);
        KILN_CHECK_LAUNCH(load_diverging, 1, 32);
    });
    CHECK(counts(diverging.global_load) == std::vector<std::uint64_t>{3, 10, 0});
}

TEST_CASE("emu traffic: shared memory bank conflicts, static and dynamic, by hand", "[emu][cuda][traffic]") {
    Device d;
    const auto stride = [&](int s, bool dynamic) {
        return counted([&] {
            if (dynamic) {
                KILN_LAUNCH(dynamic_strided, 1, 32, 32 * 32 * sizeof(float))(d.y, s);
                KILN_CHECK_LAUNCH(dynamic_strided, 1, 32);
            } else {
                KILN_LAUNCH(shared_strided, 1, 32, 0)(d.y, s);
                KILN_CHECK_LAUNCH(shared_strided, 1, 32);
            }
        });
    };
    for (bool dynamic : {false, true}) {
        INFO((dynamic ? "dynamic shared memory" : "a static __shared__ array"));
        CHECK(counts(stride(1, dynamic).shared_store) == std::vector<std::uint64_t>{1, 1, 1});
        CHECK(counts(stride(1, dynamic).shared_load) == std::vector<std::uint64_t>{1, 1, 1});
        CHECK(counts(stride(2, dynamic).shared_load) == std::vector<std::uint64_t>{1, 2, 1});
        CHECK(counts(stride(32, dynamic).shared_store) == std::vector<std::uint64_t>{1, 32, 1});  // 32-way
        CHECK(counts(stride(32, dynamic).shared_load) == std::vector<std::uint64_t>{1, 32, 1});
        CHECK(stride(32, dynamic).global_store.sectors == 4);  // y[t] is still coalesced
    }
    const auto column = [&](auto kernel) {
        return counted([&] {
            KILN_LAUNCH(kernel, 1, 32, 0)(d.y);
            KILN_CHECK_LAUNCH(kernel, 1, 32);
        });
    };
    CHECK(counts(column(shared_column<32>).shared_load) == std::vector<std::uint64_t>{1, 32, 1});
    CHECK(counts(column(shared_column<33>).shared_load) == std::vector<std::uint64_t>{1, 1, 1});  // padded: none
    CHECK(counts(column(shared_broadcast).shared_load) == std::vector<std::uint64_t>{1, 1, 1});
    CHECK(counts(column(shared_broadcast).shared_store) == std::vector<std::uint64_t>{1, 1, 1});  // lane 0 alone
    CHECK(counts(column(device_array).shared_load) == std::vector<std::uint64_t>{1, 2, 1});  // a __device__ function's
}

TEST_CASE("emu traffic: 16-byte shared loads go by quarter-warps", "[emu][cuda][traffic]") {
    Device d;
    const auto f4 = [&](int floats_apart) {
        return counted([&] {
            KILN_LAUNCH(shared_float4, 1, 32, 0)(d.y, floats_apart);
            KILN_CHECK_LAUNCH(shared_float4, 1, 32);
        });
    };
    CHECK(counts(f4(4).shared_load) == std::vector<std::uint64_t>{1, 4, 4});  // 512 bytes: 4 wavefronts, no conflict
    CHECK(counts(f4(8).shared_load) == std::vector<std::uint64_t>{1, 8, 4});  // 2-way within each quarter
    CHECK(counts(f4(8).shared_store) == std::vector<std::uint64_t>{8, 8 * 8, 8});  // the fill: s[8t + i], stride 8
}

// Blocks run on every OpenMP thread, and an OS thread other than the program's first keeps its
// thread-local variables (the static __shared__ arrays among them) inside its stack's mapping:
// they are shared memory all the same, for the thread the block starts with too.
TEST_CASE("emu traffic: every block counts alike, whichever OS thread runs it", "[emu][cuda][traffic]") {
    Device d;
    const int blocks = 32;
    const LaunchTraffic t = counted([&] {
        KILN_LAUNCH(shared_strided, blocks, 32, 0)(d.y, 32);
        KILN_CHECK_LAUNCH(shared_strided, blocks, 32);
    });
    CHECK(counts(t.shared_store) == std::vector<std::uint64_t>{blocks, 32 * blocks, blocks});
    CHECK(counts(t.shared_load) == std::vector<std::uint64_t>{blocks, 32 * blocks, blocks});
}

TEST_CASE("emu traffic: the counts do not depend on the schedule", "[emu][cuda][traffic]") {
    Device d;
    for (auto s : {kiln::emu::Schedule::InOrder, kiln::emu::Schedule::Reverse, kiln::emu::Schedule::Shuffle}) {
        kiln::emu::ScopedSchedule scope(s);
        INFO("schedule " << kiln::emu::schedule_name(s));
        const LaunchTraffic t = counted([&] {
            KILN_LAUNCH(shared_strided, 2, 64, 0)(d.y, 2);
            KILN_CHECK_LAUNCH(shared_strided, 2, 64);
        });
        CHECK(counts(t.shared_load) == std::vector<std::uint64_t>{4, 8, 4});  // 2 blocks × 2 warps × 2-way
        CHECK(counts(t.global_store) == std::vector<std::uint64_t>{4, 16, 0});
    }
}

TEST_CASE("emu traffic: off by default; atomics and untraced kernels count nothing", "[emu][cuda][traffic]") {
    Device d;
    kiln::emu::take_traffic();
    KILN_LAUNCH(load_strided, 1, 32, 0)(d.x, d.y, 1, 0);
    KILN_CHECK_LAUNCH(load_strided, 1, 32);
    CHECK(kiln::emu::take_traffic().empty());  // counting is off

    const LaunchTraffic atomic = counted([&] {
        KILN_LAUNCH(add_atomically, 1, 32, 0)(d.y);
        KILN_CHECK_LAUNCH(add_atomically, 1, 32);
    });
    CHECK(atomic.global_load.requests + atomic.global_store.requests == 0);

    // The engine's kernels (libkiln.a) are compiled without tracing: counted as launches, marked untraced.
    const kiln::Tensor x = kiln::Tensor::ones({64}).to(kiln::Device::CUDA);
    std::vector<LaunchTraffic> launches;
    {
        kiln::emu::ScopedTraffic on;
        kiln::relu(x);
        launches = kiln::emu::take_traffic();
    }
    REQUIRE(!launches.empty());
    CHECK(!launches[0].traced);
    CHECK(launches[0].global_load.requests == 0);
}
#endif
