// test_cuda_memory.cpp — tensors on Device::CUDA: creation and copies in both directions, the
// CUDA pool allocator's statistics, and running out of device memory (the --mem-limit report,
// and cuda::malloc_device's nullptr that the allocator turns into the same report).
//
//   make test T='[cuda][memory]'
#include <catch2/catch.hpp>

#include <cstring>
#include <string>

#include "core/allocator.h"
#include "core/cuda_memory.h"
#include "core/tensor.h"
#include "train/cli.h"

using namespace kiln;

TEST_CASE("cuda tensors: zeros, full and to(device) round trips", "[cuda][lesson04][memory]") {
    Tensor z = Tensor::zeros({3, 5}, DType::F32, Device::CUDA);
    REQUIRE(z.device() == Device::CUDA);
    REQUIRE(z.desc() == "f32[3, 5] on cuda");
    Tensor hz = z.to(Device::CPU);
    for (int64_t i = 0; i < 15; i++) REQUIRE(hz.data<float>()[i] == 0.0f);

    Tensor f = Tensor::full({4, 2}, 2.5, DType::F32, Device::CUDA).to(Device::CPU);
    for (int64_t i = 0; i < 8; i++) REQUIRE(f.data<float>()[i] == 2.5f);

    // cpu -> cuda -> cuda (clone: device to device) -> cpu, for several dtypes: the same bytes.
    for (DType dt : {DType::F32, DType::I32, DType::U8, DType::F16}) {
        INFO(dtype_name(dt));
        Tensor a = Tensor::arange(1001, dt);
        Tensor back = a.to(Device::CUDA).clone().to(Device::CPU);
        REQUIRE(back.device() == Device::CPU);
        REQUIRE(back.dtype() == dt);
        REQUIRE(std::memcmp(back.raw(), a.raw(), a.nbytes()) == 0);
    }
    // to() the device a tensor is already on is the same tensor, not a copy.
    Tensor d = Tensor::ones({2}, DType::F32, Device::CUDA);
    REQUIRE(d.to(Device::CUDA).raw() == d.raw());
    // copy_from between two device tensors.
    Tensor e = Tensor::zeros({2}, DType::F32, Device::CUDA);
    e.copy_from(d);
    REQUIRE(e.to(Device::CPU).get({1}) == 1.0);
    // An empty tensor moves too.
    REQUIRE(Tensor::zeros({0}, DType::F32, Device::CUDA).to(Device::CPU).numel() == 0);
}

TEST_CASE("cuda pool allocator: stats, size classes and cache hits", "[cuda][lesson04][memory]") {
    PoolAllocator& pool = pool_allocator(Device::CUDA);
    REQUIRE(pool.device() == Device::CUDA);
    REQUIRE(pool.name() == "cuda pool");
    const MemoryStats before = pool.stats();
    {
        // 1000 floats = 4000 bytes, rounded up to the 512-byte class of 4096.
        Tensor t = Tensor::empty({1000}, DType::F32, Device::CUDA, Category::Activation);
        const MemoryStats s = pool.stats();
        REQUIRE(s.allocated - before.allocated == 4096);
        REQUIRE(s.in_use[int(Category::Activation)] - before.in_use[int(Category::Activation)] == 4096);
        REQUIRE(s.num_allocs == before.num_allocs + 1);
    }
    const MemoryStats freed = pool.stats();
    REQUIRE(freed.allocated == before.allocated);
    REQUIRE(freed.reserved >= before.reserved);  // the block is cached, not given back
    {
        Tensor again = Tensor::empty({1000}, DType::F32, Device::CUDA, Category::Gradient);
        REQUIRE(pool.stats().cache_hits == freed.cache_hits + 1);  // a cached block: no cudaMalloc
        REQUIRE(pool.stats().reserved == freed.reserved);
    }
    REQUIRE(memory_summary(Device::CUDA).find("cuda pool") != std::string::npos);
    REQUIRE(device_memory_stats(Device::CUDA).allocated >= 0);
}

TEST_CASE("cuda --mem-limit: past it, allocation fails with a report", "[cuda][lesson04][memory]") {
    PoolAllocator& pool = pool_allocator(Device::CUDA);
    pool.empty_cache();
    // The trainers' path: --device cuda --mem-limit sets the limit on the CUDA device, once the
    // model is built.
    CommonFlags flags;
    flags.device = "cuda";
    const int64_t reserved = device_memory_stats(Device::CUDA).reserved;
    flags.mem_limit = std::to_string(reserved + (1 << 20));  // 1 MiB above what is reserved now
    REQUIRE(flags.apply() == Device::CUDA);
    REQUIRE(memory_limit(Device::CUDA) == 0);
    flags.apply_memory_limit(Device::CUDA);
    REQUIRE(memory_limit(Device::CUDA) == reserved + (1 << 20));
    std::string message;
    try {
        Tensor big = Tensor::empty({1 << 20}, DType::F32, Device::CUDA, Category::Activation);  // 4 MiB
    } catch (const OutOfMemory& e) {
        message = e.what();
    }
    set_memory_limit(Device::CUDA, 0);
    INFO(message);
    REQUIRE(message.find("out of memory on cuda") != std::string::npos);
    REQUIRE(message.find("cuda pool") != std::string::npos);
    REQUIRE(message.find("--mem-limit") != std::string::npos);
    REQUIRE(message.find("--batch-size") != std::string::npos);
    // Below the limit it works again.
    Tensor ok = Tensor::empty({1 << 20}, DType::F32, Device::CUDA);
    REQUIRE(ok.defined());
}

TEST_CASE("cuda device out of memory: malloc_device says nullptr, the allocator says why",
          "[cuda][lesson04][memory]") {
    size_t free_bytes = 0, total_bytes = 0;
    cuda::memory_info(&free_bytes, &total_bytes);
    REQUIRE(total_bytes > 0);
    REQUIRE(free_bytes <= total_bytes);
    // More than the device has (on the emulator: more than the host's RAM): refused before
    // cudaMalloc is even asked, by the check against cudaMemGetInfo's free bytes.
    const size_t too_much = total_bytes * 4;
    REQUIRE(cuda::malloc_device(too_much) == nullptr);
    std::string message;
    try {
        Tensor t = Tensor::empty({int64_t(too_much / 4)}, DType::F32, Device::CUDA);
    } catch (const OutOfMemory& e) {
        message = e.what();
    }
    INFO(message);
    REQUIRE(message.find("out of memory on cuda") != std::string::npos);
    REQUIRE(message.find("the system refused it") != std::string::npos);
    // The failure left no error behind: the next kernel launch checks cleanly.
    Tensor x = Tensor::zeros({10}, DType::F32, Device::CUDA);
    REQUIRE(x.to(Device::CPU).get({9}) == 0.0);
}

TEST_CASE("cuda: the emulator says so", "[cuda][lesson04][memory]") {
#ifndef KILN_CUDA
    REQUIRE(cuda::is_emulated());
    REQUIRE(std::string(cuda::emulator_note()).find("emulator") != std::string::npos);
#else
    REQUIRE_FALSE(cuda::is_emulated());
    REQUIRE(cuda::emulator_note() == nullptr);
#endif
    cuda::synchronize();
}
