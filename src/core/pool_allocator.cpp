// pool_allocator.cpp — the caching pool (PyTorch's caching allocator in miniature): size classes,
// free lists, a freed block kept for the next request of its class (allocator.h).
#include "core/alloc_size.h"
#include "core/allocator.h"
#include "core/error.h"

namespace kiln {

size_t PoolAllocator::round_size(size_t bytes) {
    if (bytes == 0) bytes = 1;
    return bytes <= kSmallMax ? round_up(bytes, kRound) : round_up(bytes, kLargeRound);
}

PoolAllocator::~PoolAllocator() {
    std::lock_guard<std::mutex> g(mu_);
    release_all_cached();
}

// A cached block for `size` bytes, or nullptr on a miss; *block gets the block's real size.
void* PoolAllocator::take_cached(size_t size, size_t* block) {
    auto& pool = size <= kSmallMax ? small_free_ : large_free_;
    auto it = pool.lower_bound(size);
    // small pool: exactly this size class; large pool: the smallest block that fits, if it
    // wastes less than half of itself
    bool fits = it != pool.end() && (size <= kSmallMax ? it->first == size : it->first <= 2 * size);
    if (!fits) return nullptr;
    void* p = it->second;
    *block = it->first;
    pool.erase(it);
    return p;
}

void* PoolAllocator::allocate(size_t bytes, Category category) {
    std::lock_guard<std::mutex> g(mu_);
    size_t size = round_size(bytes), block = size;
    void* p = take_cached(size, &block);
    if (p) {
        stats_.cache_hits++;
    } else {
        stats_.cache_misses++;
        try {
            p = system_alloc(size, category, bytes);
        } catch (const OutOfMemory&) {
            release_all_cached();  // like PyTorch: give the cache back, then try once more
            p = system_alloc(size, category, bytes);
        }
    }
    live_[p] = Block{block, bytes, category};
    note_alloc(int64_t(block), int64_t(bytes), category);
    return p;
}

void PoolAllocator::deallocate(void* ptr) {
    std::lock_guard<std::mutex> g(mu_);
    auto it = live_.find(ptr);
    KILN_CHECK(it != live_.end(), "pool '", name(), "': deallocate of a pointer it did not hand out");
    Block b = it->second;
    live_.erase(it);
    note_free(int64_t(b.size), int64_t(b.requested), b.category);
    (b.size <= kSmallMax ? small_free_ : large_free_).emplace(b.size, ptr);
}

void PoolAllocator::release_all_cached() {
    for (auto* pool : {&small_free_, &large_free_}) {
        for (auto& [size, ptr] : *pool) system_free(ptr, size);
        pool->clear();
    }
}

void PoolAllocator::empty_cache() {
    std::lock_guard<std::mutex> g(mu_);
    release_all_cached();
}

int64_t PoolAllocator::cached_bytes() const {
    std::lock_guard<std::mutex> g(mu_);
    int64_t sum = 0;
    for (auto* pool : {&small_free_, &large_free_})
        for (auto& kv : *pool) sum += int64_t(kv.first);
    return sum;
}

}  // namespace kiln
