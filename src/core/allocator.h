// allocator.h — where every byte of a tensor comes from.
//
// Two allocators, one interface:
//   PoolAllocator  caching: a freed block goes to a free list and is handed out again to the
//                  next request of the same size class, so a training loop stops calling the
//                  system after its first step (PyTorch's CUDA caching allocator in miniature).
//                    small pool: requests ≤ 1 MiB, rounded up to a multiple of 512 bytes,
//                                reused only for exactly the same rounded size;
//                    large pool: requests > 1 MiB, rounded up to a multiple of 2 MiB, reused
//                                best-fit by any request at least half the block's size.
//                  empty_cache() returns the cached blocks to the system.
//   BumpAllocator  an arena: one slab, allocation = bump a pointer, free = nothing; reset()
//                  once per training step makes the whole slab free again in O(1). It grows
//                  when a step needs more than its slab, and from the next step on its one
//                  slab is as large as the largest step was.
//
// Every allocation carries a Category, so a report can say what the memory is for. Both keep
// MemoryStats; memory_summary() prints them. A limit per device (set_memory_limit, the
// trainers' --mem-limit) makes a small GPU reproducible anywhere: a request that would push
// the memory reserved from the system past it throws OutOfMemory with a report.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "core/device.h"

namespace kiln {

// WeightCopy: a weight's copy in another type, kept beside it (the f16/bf16 weights a mixed-
// precision step reads, ops/autocast.h).
enum class Category : uint8_t { Parameter, Gradient, OptimizerState, Activation, Workspace, Data, WeightCopy, Other };
constexpr int kNumCategories = 8;
const char* category_name(Category c);

struct MemoryStats {
    std::array<int64_t, kNumCategories> in_use{};    // bytes handed out now, per category
    std::array<int64_t, kNumCategories> peak_use{};  // the most each category ever held
    // Of in_use, what the tensors asked for: in_use − requested is what the allocator's
    // rounding (and a pool's reuse of a larger block) costs.
    std::array<int64_t, kNumCategories> requested{};
    int64_t allocated = 0;       // bytes handed out now (sum of in_use)
    int64_t peak_allocated = 0;  // the most ever handed out at once
    int64_t reserved = 0;        // bytes taken from the system (handed out + cached / slab)
    int64_t peak_reserved = 0;
    int64_t num_allocs = 0, num_frees = 0;
    int64_t cache_hits = 0, cache_misses = 0;  // pool: served from a free list / from the system
};

class Allocator {
public:
    Allocator(std::string name, Device device);
    virtual ~Allocator();
    Allocator(const Allocator&) = delete;
    Allocator& operator=(const Allocator&) = delete;

    // Returns memory aligned to 256 bytes (a GPU's cudaMalloc alignment; enough for AVX-512).
    virtual void* allocate(size_t bytes, Category category) = 0;
    virtual void deallocate(void* ptr) = 0;

    // Storage's way back: deallocate(ptr) if the allocator with this address and id still
    // exists, nothing if it has been destroyed. An arena may die before a tensor it served (a
    // trainer's model, still holding a failed step's activations, destroyed after its arena);
    // its slab is gone with it, so there is nothing left to return. The id tells a destroyed
    // allocator from a new one that happens to live at the same address.
    static void deallocate_if_alive(Allocator* allocator, uint64_t id, void* ptr);

    MemoryStats stats() const;
    void reset_peak();  // peaks := current values, to measure one phase
    const std::string& name() const { return name_; }
    Device device() const { return device_; }
    uint64_t id() const { return id_; }  // unique for the life of the program

protected:
    // Book-keeping shared by both allocators (called with mu_ held).
    // `bytes` handed out (rounded) for a request of `requested` bytes
    void note_alloc(int64_t bytes, int64_t requested, Category c);
    void note_free(int64_t bytes, int64_t requested, Category c);
    void note_reserve(int64_t bytes);  // negative to release
    // Takes `bytes` from the system for this device, honouring the device's limit.
    void* system_alloc(size_t bytes, Category c, size_t request);
    void system_free(void* ptr, size_t bytes);

    mutable std::mutex mu_;
    MemoryStats stats_;

private:
    std::string name_;
    Device device_;
    uint64_t id_;
};

class PoolAllocator : public Allocator {
public:
    static constexpr size_t kRound = 512;                 // every size is a multiple of this
    static constexpr size_t kSmallMax = size_t(1) << 20;  // ≤ 1 MiB: small pool
    static constexpr size_t kLargeRound = size_t(2) << 20;

    PoolAllocator(std::string name, Device device) : Allocator(std::move(name), device) {}
    ~PoolAllocator() override;

    void* allocate(size_t bytes, Category category) override;
    void deallocate(void* ptr) override;
    void empty_cache();  // give every cached (free) block back to the system
    int64_t cached_bytes() const;

    static size_t round_size(size_t bytes);  // the size class a request falls into

private:
    struct Block { size_t size, requested; Category category; };
    void* take_cached(size_t size, size_t* block);
    void release_all_cached();

    std::map<void*, Block> live_;                 // handed-out blocks
    std::multimap<size_t, void*> small_free_;     // size -> cached block
    std::multimap<size_t, void*> large_free_;
};

class BumpAllocator : public Allocator {
public:
    // Reserves `capacity` bytes now (0: nothing until the first allocation).
    BumpAllocator(std::string name, Device device, size_t capacity = 0);
    ~BumpAllocator() override;

    // Bumps a pointer in the current chunk. When the chunk is full the arena grows: it takes a
    // new chunk of max(bytes, 1 MiB) from the system (under the device's limit, like any
    // reservation), so a step that needs more than the arena was sized for still runs.
    void* allocate(size_t bytes, Category category) override;
    void deallocate(void* ptr) override;  // bookkeeping only: space returns at reset()
    // Frees the whole arena for the next step. Throws if a tensor from it is still alive. If the
    // step grew the arena into several chunks, they are replaced by one slab of high_water()
    // bytes: the arena sizes itself to the largest step it has seen.
    void reset();
    size_t capacity() const;    // bytes reserved now, over all chunks
    size_t used() const;        // bytes bumped since the last reset
    size_t high_water() const;  // the most ever used between two resets

    static constexpr size_t kMinGrowth = size_t(1) << 20;

private:
    struct Chunk {
        char* base;
        size_t size;
    };
    void add_chunk(size_t bytes, Category category);  // a new chunk of bytes (rounded to 256)
    void release_chunks();

    std::vector<Chunk> chunks_;  // the last one is bumped; the others are full until reset()
    size_t offset_ = 0;          // into the last chunk
    size_t used_ = 0, high_water_ = 0;
    struct Block { size_t size, requested; Category category; };
    std::map<void*, Block> live_;
};

// ---- the allocator tensors use -----------------------------------------------------------
// Each device has one PoolAllocator; an AllocatorScope redirects new tensors on its device to
// another allocator (e.g. a BumpAllocator for one step's activations) until it ends.
PoolAllocator& pool_allocator(Device device);
Allocator& current_allocator(Device device);

// Scratch memory for one call (a kernel's partial sums, the loss's totals), from the device's
// pool with Category::Workspace: the pool's figures and --mem-limit count it, and after the
// first step it is a cached block, not a cudaMalloc. Not a tensor: the memory report's rows,
// which follow tensors, do not show it.
class Workspace {
public:
    explicit Workspace(size_t bytes, Device device = Device::CUDA)
        : device_(device), ptr_(pool_allocator(device).allocate(bytes, Category::Workspace)) {}
    ~Workspace() { pool_allocator(device_).deallocate(ptr_); }
    Workspace(const Workspace&) = delete;
    Workspace& operator=(const Workspace&) = delete;
    template <typename T>
    T* as() const { return static_cast<T*>(ptr_); }

private:
    Device device_;
    void* ptr_;
};

// Redirects pool_allocator(device) on this thread — every tensor outside an AllocatorScope, and
// every Workspace — to `pool` until it ends: a captured CUDA Graph's private pool
// (train/step_graph.h), whose blocks no code outside the graph's steps is handed, so the
// addresses the graph recorded stay its own between its launches (PyTorch's graphs keep a private
// pool for the same reason).
class PoolScope {
public:
    explicit PoolScope(PoolAllocator& pool);
    ~PoolScope();
    PoolScope(const PoolScope&) = delete;
    PoolScope& operator=(const PoolScope&) = delete;

private:
    PoolAllocator* previous_;
    Device device_;
};

class AllocatorScope {
public:
    explicit AllocatorScope(Allocator& a);
    ~AllocatorScope();
    AllocatorScope(const AllocatorScope&) = delete;
    AllocatorScope& operator=(const AllocatorScope&) = delete;

private:
    Allocator* previous_;
    Device device_;
};

// ---- watching the allocations ------------------------------------------------------------
// One allocation (freed = false) or free (freed = true) of a tensor's bytes.
struct AllocationEvent {
    const void* ptr;
    int64_t bytes;
    Category category;
    Device device;
    bool freed;
};
using AllocationObserver = std::function<void(const AllocationEvent&)>;
// Calls `observer` on every tensor allocation and free, on the thread doing it, until it is
// replaced; an empty function removes it. Calls are serialized (the data loader's prefetch
// thread allocates while a step runs), so the observer must not allocate tensors itself. Being
// on the allocating thread, the observer can ask that thread what it is doing (which module,
// which phase of a step: nn/module.h's current_context, what the memory recorder reads).
void set_allocation_observer(AllocationObserver observer);
// Storage's report to the observer (nothing when there is none).
void notify_allocation(const void* ptr, int64_t bytes, Category category, Device device, bool freed);

// ---- limits and reports ------------------------------------------------------------------
void set_memory_limit(Device device, int64_t bytes);  // 0 = no limit
// What an out-of-memory message suggests besides a smaller --batch-size: the running program's
// own ways to cut a step's memory, one phrase each ("--accumulate K (K micro-batches: 1/K of the
// activations)"), set from its command line (CommonFlags::apply). Empty: the batch size alone.
void set_out_of_memory_hints(std::vector<std::string> hints);
int64_t memory_limit(Device device);
// The sum of every live allocator's stats on a device (pool + arenas). Its peaks are the sums
// of each allocator's own peak, which need not have happened at the same moment.
MemoryStats device_memory_stats(Device device);
// Bytes handed out on the device over all its allocators, counted at every allocation and free:
// now, the most at any one moment since the program started, and the most since the last
// reset_phase_peak(device) — how a trainer tells a training step's peak from evaluation's. And
// the bytes reserved from the system (what --mem-limit counts: blocks the pool keeps cached, an
// arena's whole slab): now and the most since the start.
struct DevicePeaks {
    int64_t in_use, peak, phase_peak;
    int64_t reserved, peak_reserved;
};
DevicePeaks device_peaks(Device device);
void reset_phase_peak(Device device);
// A table like PyTorch's torch.cuda.memory_summary(): per category in use and peak, then
// reserved, allocation count and cache hits/misses of each allocator.
std::string memory_summary(Device device);

// "64MiB", "2GiB", "1TiB", "512KiB", "1000" (bytes) -> bytes: binary units K/KiB, M/MiB, G/GiB,
// T/TiB, decimal KB, MB, GB, TB. Throws kiln::UsageError on anything else, a negative size or
// one of 2^63 bytes or more (an int64_t cannot hold it).
int64_t parse_bytes(const std::string& text);
std::string format_bytes(int64_t bytes);  // 13212057 -> "12.6MiB"

}  // namespace kiln
