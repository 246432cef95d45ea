// bump_allocator.cpp — the arena: one slab, a pointer bumped per allocation, everything freed at
// once by reset(); it grows by chunks and becomes one slab of the largest step (allocator.h).
#include <algorithm>

#include "core/alloc_size.h"
#include "core/allocator.h"
#include "core/error.h"

namespace kiln {

BumpAllocator::BumpAllocator(std::string name, Device device, size_t capacity) : Allocator(std::move(name), device) {
    std::lock_guard<std::mutex> g(mu_);
    if (capacity > 0) add_chunk(capacity, Category::Workspace);
}

BumpAllocator::~BumpAllocator() {
    std::lock_guard<std::mutex> g(mu_);
    release_chunks();
}

void BumpAllocator::add_chunk(size_t bytes, Category category) {
    const size_t size = round_up(bytes, kAlign);
    chunks_.push_back({static_cast<char*>(system_alloc(size, category, bytes)), size});
    offset_ = 0;
}

void BumpAllocator::release_chunks() {
    for (const Chunk& c : chunks_) system_free(c.base, c.size);
    chunks_.clear();
    offset_ = 0;
}

// ptr = chunk + offset; offset += round_up(bytes, 256). Nothing is searched, nothing is freed.
void* BumpAllocator::allocate(size_t bytes, Category category) {
    std::unique_lock<std::mutex> lock(mu_);
    const size_t size = round_up(std::max<size_t>(bytes, 1), kAlign);
    if (chunks_.empty() || offset_ + size > chunks_.back().size) {
        try {
            add_chunk(std::max(size, kMinGrowth), category);
        } catch (const OutOfMemory&) {
            // Like the pool: its cached blocks go back to the system, then one more try. (Not
            // holding this arena's lock meanwhile: a pool's out-of-memory report reads this
            // arena's statistics under the pool's lock.)
            lock.unlock();
            pool_allocator(device()).empty_cache();
            lock.lock();
            add_chunk(std::max(size, kMinGrowth), category);
        }
    }
    void* p = chunks_.back().base + offset_;
    offset_ += size;
    used_ += size;
    high_water_ = std::max(high_water_, used_);
    live_[p] = Block{size, bytes, category};
    note_alloc(int64_t(size), int64_t(bytes), category);
    stats_.cache_hits++;  // served from the arena's own memory
    return p;
}

void BumpAllocator::deallocate(void* ptr) {
    std::lock_guard<std::mutex> g(mu_);
    auto it = live_.find(ptr);
    KILN_CHECK(it != live_.end(), "arena '", name(), "': deallocate of a pointer it did not hand out");
    note_free(int64_t(it->second.size), int64_t(it->second.requested), it->second.category);
    live_.erase(it);
}

void BumpAllocator::reset() {
    std::lock_guard<std::mutex> g(mu_);
    KILN_CHECK(live_.empty(), "arena '", name(), "': reset() while ", live_.size(),
               " tensor(s) from this step are still alive (first: ", format_bytes(int64_t(live_.begin()->second.size)),
               " of ", category_name(live_.begin()->second.category),
               "). Let every tensor made inside the AllocatorScope go out of scope before reset().");
    used_ = 0;
    offset_ = 0;
    if (chunks_.size() <= 1) return;
    // The step outgrew the slab: one slab of the largest step replaces the chunks (freed first,
    // so that the exchange never holds both under a memory limit).
    release_chunks();
    add_chunk(high_water_, Category::Workspace);
}

size_t BumpAllocator::capacity() const {
    std::lock_guard<std::mutex> g(mu_);
    size_t sum = 0;
    for (const Chunk& c : chunks_) sum += c.size;
    return sum;
}

size_t BumpAllocator::used() const {
    std::lock_guard<std::mutex> g(mu_);
    return used_;
}

size_t BumpAllocator::high_water() const {
    std::lock_guard<std::mutex> g(mu_);
    return high_water_;
}

}  // namespace kiln
