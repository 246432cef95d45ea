// test_allocator.cpp — the pool and bump allocators: reuse, alignment, statistics per
// category, arena reset and overflow, the memory limit and its out-of-memory message.
#include <catch2/catch.hpp>
#include <cstdint>
#include <optional>

#include "core/allocator.h"
#include "core/tensor.h"

using namespace kiln;

TEST_CASE("pool rounds sizes into classes", "[allocator][cpu][lesson01]") {
    REQUIRE(PoolAllocator::round_size(1) == 512);
    REQUIRE(PoolAllocator::round_size(512) == 512);
    REQUIRE(PoolAllocator::round_size(513) == 1024);
    REQUIRE(PoolAllocator::round_size(1 << 20) == (1 << 20));
    REQUIRE(PoolAllocator::round_size((1 << 20) + 1) == (2 << 20));  // large: 2 MiB multiples
}

TEST_CASE("pool reuses freed blocks and counts hits and misses", "[allocator][cpu][lesson01]") {
    PoolAllocator pool("test pool", Device::CPU);
    void* a = pool.allocate(1000, Category::Activation);
    REQUIRE(reinterpret_cast<uintptr_t>(a) % 256 == 0);
    pool.deallocate(a);
    void* b = pool.allocate(900, Category::Activation);  // same 1024-byte class: reused
    REQUIRE(b == a);
    void* c = pool.allocate(3000, Category::Gradient);   // another class: a miss
    REQUIRE(c != a);
    MemoryStats s = pool.stats();
    REQUIRE(s.cache_hits == 1);
    REQUIRE(s.cache_misses == 2);
    REQUIRE(s.in_use[int(Category::Activation)] == 1024);
    REQUIRE(s.in_use[int(Category::Gradient)] == 3072);
    REQUIRE(s.allocated == 1024 + 3072);
    REQUIRE(s.reserved == 1024 + 3072);
    pool.deallocate(b);
    pool.deallocate(c);
    REQUIRE(pool.stats().allocated == 0);
    REQUIRE(pool.stats().peak_allocated == 1024 + 3072);
    REQUIRE(pool.cached_bytes() == 1024 + 3072);
    pool.empty_cache();
    REQUIRE(pool.stats().reserved == 0);
    REQUIRE_THROWS_WITH(pool.deallocate(a), Catch::Contains("did not hand out"));
}

TEST_CASE("pool's large blocks are reused best-fit", "[allocator][cpu][lesson01]") {
    PoolAllocator pool("large pool", Device::CPU);
    void* big = pool.allocate(5 << 20, Category::Activation);  // 6 MiB block
    pool.deallocate(big);
    void* fits = pool.allocate(4 << 20, Category::Activation);  // 4 MiB ≤ 6 MiB ≤ 2·4 MiB
    REQUIRE(fits == big);
    REQUIRE(pool.stats().in_use[int(Category::Activation)] == (6 << 20));
    pool.deallocate(fits);
    void* small = pool.allocate(2 << 20, Category::Activation);  // would waste > half: new block
    REQUIRE(small != big);
    pool.deallocate(small);
}

TEST_CASE("tensors go back to the pool they came from", "[allocator][cpu][lesson01]") {
    PoolAllocator pool("scoped pool", Device::CPU);
    {
        AllocatorScope scope(pool);
        Tensor t = Tensor::zeros({256}, DType::F32, Device::CPU, Category::Parameter);
        REQUIRE(pool.stats().in_use[int(Category::Parameter)] == 1024);
        Tensor view = t.reshape({16, 16});  // a view allocates nothing
        REQUIRE(pool.stats().num_allocs == 1);
    }
    REQUIRE(pool.stats().allocated == 0);
    REQUIRE(&current_allocator(Device::CPU) == &pool_allocator(Device::CPU));
}

TEST_CASE("bump allocator: bump, reset, grow", "[allocator][cpu][lesson01]") {
    BumpAllocator arena("test arena", Device::CPU, 4096);
    REQUIRE(arena.stats().reserved == 4096);
    void* a = arena.allocate(100, Category::Activation);
    void* b = arena.allocate(300, Category::Workspace);
    REQUIRE(static_cast<char*>(b) - static_cast<char*>(a) == 256);  // 100 rounded to 256
    REQUIRE(reinterpret_cast<uintptr_t>(b) % 256 == 0);
    REQUIRE(arena.used() == 256 + 512);
    REQUIRE(arena.stats().in_use[int(Category::Workspace)] == 512);
    // still in use: reset refuses and says why
    REQUIRE_THROWS_WITH(arena.reset(), Catch::Contains("still alive"));
    arena.deallocate(a);
    arena.deallocate(b);
    arena.reset();
    REQUIRE(arena.used() == 0);
    REQUIRE(arena.high_water() == 768);
    void* again = arena.allocate(64, Category::Activation);
    REQUIRE(again == a);  // the slab starts over
    // more than the slab holds: a new chunk of at least 1 MiB, the old one kept until reset
    void* big = arena.allocate(5000, Category::Activation);
    REQUIRE(arena.capacity() == 4096 + BumpAllocator::kMinGrowth);
    REQUIRE(arena.used() == 256 + 5120);
    arena.deallocate(again);
    arena.deallocate(big);
    arena.reset();  // the step needed 5376 bytes: one slab of that size replaces the two chunks
    REQUIRE(arena.capacity() == 5376);
    REQUIRE(arena.stats().reserved == 5376);
    REQUIRE(arena.high_water() == 5376);
}

TEST_CASE("an arena grows from nothing, and only as far as the memory limit allows", "[allocator][cpu][lesson01]") {
    BumpAllocator arena("growing arena", Device::CPU);
    REQUIRE(arena.capacity() == 0);
    void* p = arena.allocate(3 << 20, Category::Activation);  // a chunk of exactly the request
    REQUIRE(arena.capacity() == size_t(3) << 20);
    pool_allocator(Device::CPU).empty_cache();  // (the arena would hand it back before failing)
    const int64_t before = device_memory_stats(Device::CPU).reserved;
    set_memory_limit(Device::CPU, before + (1 << 20));
    REQUIRE_THROWS_AS(arena.allocate(2 << 20, Category::Activation), OutOfMemory);
    REQUIRE_THROWS_WITH(arena.allocate(2 << 20, Category::Activation),
                        Catch::Contains("growing arena") && Catch::Contains("asked for 2.0MiB (activation"));
    set_memory_limit(Device::CPU, 0);
    arena.deallocate(p);
    arena.reset();
    REQUIRE(arena.capacity() == size_t(3) << 20);  // one chunk: nothing to merge
}

TEST_CASE("a tensor may outlive its arena", "[allocator][cpu][lesson01]") {
    // A trainer's model keeps a failed step's activations after its arena is gone; dropping
    // them must touch neither the dead arena nor a new one that lives at the same address.
    std::optional<BumpAllocator> arena;
    arena.emplace("first arena", Device::CPU, 4096);
    Tensor survivor;
    {
        AllocatorScope scope(*arena);
        survivor = Tensor::zeros({16}, DType::F32, Device::CPU, Category::Activation);
    }
    arena.reset();
    arena.emplace("second arena", Device::CPU, 4096);  // same address, another allocator
    survivor = Tensor();
    REQUIRE(arena->stats().num_frees == 0);
    REQUIRE(arena->stats().allocated == 0);
}

TEST_CASE("a memory limit fails with a report of what used the memory", "[allocator][cpu][lesson01]") {
    PoolAllocator pool("limited pool", Device::CPU);
    int64_t before = device_memory_stats(Device::CPU).reserved;
    set_memory_limit(Device::CPU, before + (3 << 20));
    void* p = pool.allocate(2 << 20, Category::Parameter);
    REQUIRE_THROWS_AS(pool.allocate(2 << 20, Category::Activation), OutOfMemory);
    try {
        pool.allocate(2 << 20, Category::Activation);
    } catch (const OutOfMemory& e) {
        std::string m = e.what();
        CHECK(m.find("limited pool") != std::string::npos);
        CHECK(m.find("asked for 2.0MiB (activation") != std::string::npos);
        CHECK(m.find("parameter 2.0MiB") != std::string::npos);
        CHECK(m.find("try: a smaller --batch-size") != std::string::npos);
        CHECK(m.find("--mem-limit") != std::string::npos);
    }
    // The model's own state not fitting: the batch size cannot help, and the message says so.
    try {
        pool.allocate(2 << 20, Category::Gradient);
        FAIL("no OutOfMemory");
    } catch (const OutOfMemory& e) {
        std::string m = e.what();
        CHECK(m.find("a smaller --batch-size cannot help") != std::string::npos);
        CHECK(m.find("try a larger --mem-limit") != std::string::npos);
    }
    // Cached blocks count as reserved; when the limit is hit the pool gives its cache back
    // and tries once more (as PyTorch does).
    pool.deallocate(p);                                      // 2 MiB cached
    set_memory_limit(Device::CPU, before + (5 << 20));
    void* q = pool.allocate(3 << 20, Category::Activation);  // 4 MiB block: 2 + 4 > 5, so the cache goes
    REQUIRE(pool.cached_bytes() == 0);
    REQUIRE(pool.stats().reserved == (4 << 20));
    pool.deallocate(q);
    set_memory_limit(Device::CPU, 0);
}

// Issue 46, item 9: the message names the program's own ways to fit (set from its command line)
// and tells reserved from in use, which is what the limit counts.
TEST_CASE("out of memory: the trainer's ways to fit, and what is reserved but not in use", "[allocator][cpu][lesson08]") {
    BumpAllocator arena("hint arena", Device::CPU);
    // The pool's cache from earlier tests first: on the way to out of memory the arena has the pool
    // give its cache back, which would make room under a limit counted with that cache in it.
    pool_allocator(Device::CPU).empty_cache();
    int64_t before = device_memory_stats(Device::CPU).reserved;
    set_memory_limit(Device::CPU, before + (3 << 20));
    arena.deallocate(arena.allocate(2 << 20, Category::Activation));  // 2 MiB of slab, nothing in use
    set_out_of_memory_hints({"--accumulate 2 (2 micro-batches)", "--recompute (recomputed blocks)"});
    try {
        arena.allocate(2 << 20, Category::Activation);
        FAIL("no OutOfMemory");
    } catch (const OutOfMemory& e) {
        const std::string m = e.what();
        CHECK_THAT(m, Catch::Contains("try: a smaller --batch-size") && Catch::Contains("--accumulate 2 (2 micro-batches)") &&
                          Catch::Contains("--recompute (recomputed blocks)") && Catch::Contains("or a larger --mem-limit"));
        CHECK_THAT(m, Catch::Contains("reserved but not in use: 2.0MiB"));
    }
    set_out_of_memory_hints({});
    set_memory_limit(Device::CPU, 0);
}

TEST_CASE("memory sizes parse and print", "[allocator][cpu][lesson01]") {
    REQUIRE(parse_bytes("64MiB") == 64 << 20);
    REQUIRE(parse_bytes("2GiB") == int64_t(2) << 30);
    REQUIRE(parse_bytes("1.5KiB") == 1536);
    REQUIRE(parse_bytes("1000") == 1000);
    REQUIRE_THROWS_WITH(parse_bytes("lots"), Catch::Contains("64MiB"));
    REQUIRE_THROWS(parse_bytes("12 parsecs"));
    REQUIRE(format_bytes(13212057) == "12.6MiB");
    // format_bytes prints TiB, so parse_bytes reads it (and T, TB)
    REQUIRE(parse_bytes("2TiB") == int64_t(2) << 40);
    REQUIRE(parse_bytes("1T") == int64_t(1) << 40);
    REQUIRE(parse_bytes("3TB") == int64_t(3000000000000));
    REQUIRE(parse_bytes(format_bytes(int64_t(3) << 40)) == int64_t(3) << 40);
    // beyond what an int64_t holds: refused, not undefined behaviour (nor a "small" limit)
    REQUIRE_THROWS_WITH(parse_bytes("1e30GiB"), Catch::Contains("more bytes than kiln can count"));
    REQUIRE_THROWS_WITH(parse_bytes("8EiB"), Catch::Contains("64MiB"));
    REQUIRE(parse_bytes("8388607TiB") == int64_t(8388607) << 40);  // 2^63 − 2^40
    REQUIRE_THROWS_WITH(parse_bytes("8388608TiB"), Catch::Contains("8 EiB at most"));  // 2^63
    REQUIRE_THROWS_WITH(parse_bytes("-1MiB"), Catch::Contains("cannot read '-1MiB'"));
    REQUIRE_THROWS(parse_bytes("nan"));
    REQUIRE_THROWS(parse_bytes("inf"));
    REQUIRE(format_bytes(512) == "512B");
}

TEST_CASE("memory_summary lists categories and allocators", "[allocator][cpu][lesson01]") {
    PoolAllocator pool("summary pool", Device::CPU);
    AllocatorScope scope(pool);
    Tensor w = Tensor::zeros({1024}, DType::F32, Device::CPU, Category::Parameter);
    std::string s = memory_summary(Device::CPU);
    REQUIRE(s.find("parameter") != std::string::npos);
    REQUIRE(s.find("optimizer state") != std::string::npos);
    REQUIRE(s.find("summary pool") != std::string::npos);
    REQUIRE(s.find("4.0KiB") != std::string::npos);
}
