// allocator.cpp — what every allocator shares: the registry of live allocators per device, their
// statistics, the memory limit and its out-of-memory report, which allocator new tensors use, the
// allocation observer, and the memory summary. The pool is in pool_allocator.cpp, the arena in
// bump_allocator.cpp; allocator.h has the design.
#include "core/allocator.h"

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "core/cuda_memory.h"
#include "core/alloc_size.h"
#include "core/error.h"

namespace kiln {

const char* category_name(Category c) {
    static const char* names[kNumCategories] = {"parameter", "gradient", "optimizer state",
                                                "activation", "workspace", "data", "weight copy", "other"};
    return names[int(c)];
}

// ---- the registry of live allocators, per device, and the limit -------------------------
namespace {
struct Registry {
    std::mutex mu;
    std::vector<Allocator*> allocators[2];
    std::atomic<int64_t> limit[2] = {0, 0};
    std::atomic<int64_t> reserved[2] = {0, 0}, peak_reserved[2] = {0, 0};  // by every allocator of the device
    // bytes handed out by every allocator of the device, and the most at one moment: since
    // the start, and since reset_phase_peak
    std::atomic<int64_t> allocated[2] = {0, 0}, peak[2] = {0, 0}, phase_peak[2] = {0, 0};
    std::atomic<uint64_t> next_id{1};
    static Registry& get() { static Registry r; return r; }
};
}  // namespace

Allocator::Allocator(std::string name, Device device)
    : name_(std::move(name)), device_(device), id_(Registry::get().next_id++) {
    auto& r = Registry::get();
    std::lock_guard<std::mutex> g(r.mu);
    r.allocators[int(device)].push_back(this);
}

Allocator::~Allocator() {
    auto& r = Registry::get();
    // Tensors still alive from this allocator will never tell it they are gone (their bytes go
    // with it): they stop counting as in use on the device now.
    r.allocated[int(device_)] -= stats_.allocated;
    std::lock_guard<std::mutex> g(r.mu);
    auto& v = r.allocators[int(device_)];
    v.erase(std::remove(v.begin(), v.end(), this), v.end());
}

void Allocator::deallocate_if_alive(Allocator* allocator, uint64_t id, void* ptr) {
    auto& r = Registry::get();
    std::lock_guard<std::mutex> g(r.mu);  // so the allocator cannot be destroyed meanwhile
    // `allocator` may point at a destroyed object: compare the address, never dereference it
    for (const std::vector<Allocator*>& device_allocators : r.allocators)
        for (Allocator* a : device_allocators)
            if (a == allocator && a->id_ == id) return a->deallocate(ptr);
}

MemoryStats Allocator::stats() const {
    std::lock_guard<std::mutex> g(mu_);
    return stats_;
}

void Allocator::reset_peak() {
    std::lock_guard<std::mutex> g(mu_);
    stats_.peak_use = stats_.in_use;
    stats_.peak_allocated = stats_.allocated;
    stats_.peak_reserved = stats_.reserved;
}

// peak := max(peak, value), with other threads' allocators updating it too.
static void raise_to(std::atomic<int64_t>& peak, int64_t value) {
    int64_t seen = peak.load();
    while (seen < value && !peak.compare_exchange_weak(seen, value)) {}
}

void Allocator::note_alloc(int64_t bytes, int64_t requested, Category c) {
    auto& r = Registry::get();
    const int64_t device_total = r.allocated[int(device_)] += bytes;
    raise_to(r.peak[int(device_)], device_total);
    raise_to(r.phase_peak[int(device_)], device_total);
    int i = int(c);
    stats_.in_use[i] += bytes;
    stats_.requested[i] += requested;
    stats_.peak_use[i] = std::max(stats_.peak_use[i], stats_.in_use[i]);
    stats_.allocated += bytes;
    stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
    stats_.num_allocs++;
}

void Allocator::note_free(int64_t bytes, int64_t requested, Category c) {
    Registry::get().allocated[int(device_)] -= bytes;
    stats_.in_use[int(c)] -= bytes;
    stats_.requested[int(c)] -= requested;
    stats_.allocated -= bytes;
    stats_.num_frees++;
}

void Allocator::note_reserve(int64_t bytes) {
    auto& r = Registry::get();
    raise_to(r.peak_reserved[int(device_)], r.reserved[int(device_)] += bytes);
    stats_.reserved += bytes;
    stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
}

MemoryStats device_memory_stats(Device device) {
    auto& r = Registry::get();
    std::lock_guard<std::mutex> g(r.mu);
    MemoryStats total;
    for (Allocator* a : r.allocators[int(device)]) {
        MemoryStats s = a->stats();
        for (int i = 0; i < kNumCategories; i++) {
            total.in_use[i] += s.in_use[i];
            total.peak_use[i] += s.peak_use[i];
            total.requested[i] += s.requested[i];
        }
        total.allocated += s.allocated;
        total.peak_allocated += s.peak_allocated;
        total.reserved += s.reserved;
        total.peak_reserved += s.peak_reserved;
        total.num_allocs += s.num_allocs;
        total.num_frees += s.num_frees;
        total.cache_hits += s.cache_hits;
        total.cache_misses += s.cache_misses;
    }
    return total;
}

DevicePeaks device_peaks(Device device) {
    auto& r = Registry::get();
    return {r.allocated[int(device)], r.peak[int(device)], r.phase_peak[int(device)], r.reserved[int(device)],
            r.peak_reserved[int(device)]};
}

void reset_phase_peak(Device device) {
    auto& r = Registry::get();
    r.phase_peak[int(device)] = r.allocated[int(device)].load();
}

void set_memory_limit(Device device, int64_t bytes) {
    KILN_CHECK(bytes >= 0, "memory limit must be ≥ 0 bytes, got ", bytes);
    Registry::get().limit[int(device)] = bytes;
}

int64_t memory_limit(Device device) { return Registry::get().limit[int(device)]; }

// In use per category on the device: `mine` for the allocator asking (its mutex is held),
// the others' read under their own locks.
static MemoryStats usage_with(Device device, const Allocator* self, const MemoryStats& mine) {
    auto& r = Registry::get();
    std::lock_guard<std::mutex> g(r.mu);
    MemoryStats all = mine;
    for (Allocator* a : r.allocators[int(device)]) {
        if (a == self) continue;
        MemoryStats s = a->stats();
        for (int i = 0; i < kNumCategories; i++) all.in_use[i] += s.in_use[i];
    }
    return all;
}

static std::mutex g_hints_mu;
static std::vector<std::string> g_hints;

void set_out_of_memory_hints(std::vector<std::string> hints) {
    std::lock_guard<std::mutex> g(g_hints_mu);
    g_hints = std::move(hints);
}

static std::string oom_message(const std::string& who, Device device, size_t request, size_t rounded,
                               Category c, int64_t limit, int64_t reserved, const MemoryStats& all) {
    std::ostringstream os;
    os << "out of memory on " << device_name(device) << ": '" << who << "' asked for "
       << format_bytes(int64_t(request)) << " (" << category_name(c) << ", " << format_bytes(int64_t(rounded))
       << " with rounding)";
    if (limit > 0)
        os << " but the limit is " << format_bytes(limit) << " and " << format_bytes(reserved)
           << " is already reserved";
    else
        os << " and the system refused it";
    os << ".\n  in use by category:";
    int64_t in_use = 0;
    for (int i = 0; i < kNumCategories; i++) {
        if (all.in_use[i] > 0) os << " " << category_name(Category(i)) << " " << format_bytes(all.in_use[i]) << ";";
        in_use += all.in_use[i];
    }
    if (limit > 0 && reserved > in_use)  // reserved is what the limit counts
        os << "\n  reserved but not in use: " << format_bytes(reserved - in_use) << " (the pool's cached blocks, an "
           << "arena's slab beyond this step's tensors)";
    const bool model_state = c == Category::Parameter || c == Category::Gradient || c == Category::OptimizerState;
    if (model_state) {
        os << "\n  the model's own parameters, gradients and optimizer state do not fit: a smaller --batch-size "
              "cannot help";
        if (limit > 0) os << "; try a larger --mem-limit";
        return os.str();
    }
    os << "\n  try: a smaller --batch-size (a step's activations and workspace grow with it)";
    std::lock_guard<std::mutex> g(g_hints_mu);
    for (const std::string& hint : g_hints) os << ";\n       " << hint;
    if (limit > 0) os << (g_hints.empty() ? ", " : ";\n       ") << "or a larger --mem-limit";
    return os.str();
}

// A CUDA Graph records addresses, not allocations: memory a captured step uses must have been
// taken before the capture (train/step_graph.h warms its pool up with one uncaptured step).
static void refuse_during_capture(const std::string& allocator, Device device, const char* what, size_t bytes) {
    KILN_CHECK(device != Device::CUDA || !cuda::capturing(), "allocator '", allocator, "' would ", what, " ", bytes,
               " bytes of device memory while a CUDA Graph is being captured (--cuda-graph): the captured step "
               "needs memory its uncaptured warm-up step did not, so its shapes or its allocations differ from "
               "step to step; run without --cuda-graph");
}

void* Allocator::system_alloc(size_t bytes, Category c, size_t request) {
    refuse_during_capture(name_, device_, "take", bytes);
    int64_t limit = memory_limit(device_);
    int64_t reserved = Registry::get().reserved[int(device_)];
    if (limit > 0 && reserved + int64_t(bytes) > limit)
        throw OutOfMemory(oom_message(name_, device_, request, bytes, c, limit, reserved,
                                      usage_with(device_, this, stats_)));
    void* p = device_ == Device::CPU ? std::aligned_alloc(kAlign, bytes) : cuda::malloc_device(bytes);
    if (!p)
        throw OutOfMemory(oom_message(name_, device_, request, bytes, c, 0, reserved, usage_with(device_, this, stats_)));
    note_reserve(int64_t(bytes));
    return p;
}

void Allocator::system_free(void* ptr, size_t bytes) {
    refuse_during_capture(name_, device_, "give back", bytes);
    if (device_ == Device::CPU) std::free(ptr);
    else cuda::free_device(ptr);
    note_reserve(-int64_t(bytes));
}

// ---- which allocator new tensors use --------------------------------------------------------
static thread_local PoolAllocator* t_pool[2] = {nullptr, nullptr};  // PoolScope's

PoolScope::PoolScope(PoolAllocator& pool) : previous_(t_pool[int(pool.device())]), device_(pool.device()) {
    t_pool[int(device_)] = &pool;
}
PoolScope::~PoolScope() { t_pool[int(device_)] = previous_; }

PoolAllocator& pool_allocator(Device device) {
    if (PoolAllocator* scoped = t_pool[int(device)]) return *scoped;
    // Created on first use and never destroyed: tensors in static storage may outlive main().
    static PoolAllocator* pools[2] = {nullptr, nullptr};
    static std::once_flag once[2];
    std::call_once(once[int(device)], [device] {
        pools[int(device)] = new PoolAllocator(device == Device::CPU ? "cpu pool" : "cuda pool", device);
    });
    return *pools[int(device)];
}

static thread_local Allocator* t_current[2] = {nullptr, nullptr};

Allocator& current_allocator(Device device) {
    Allocator* a = t_current[int(device)];
    return a ? *a : pool_allocator(device);
}

AllocatorScope::AllocatorScope(Allocator& a) : previous_(t_current[int(a.device())]), device_(a.device()) {
    t_current[int(device_)] = &a;
}

AllocatorScope::~AllocatorScope() { t_current[int(device_)] = previous_; }

// ---- the observer --------------------------------------------------------------------------
// The observer, called under its mutex: the loader's prefetch thread allocates too. Without an
// observer an allocation reads one flag and returns.
static std::mutex g_observer_mu;
static AllocationObserver g_observer;  // empty: no observer
static std::atomic<bool> g_observing{false};

void set_allocation_observer(AllocationObserver observer) {
    std::lock_guard<std::mutex> g(g_observer_mu);
    g_observer = std::move(observer);
    g_observing.store(bool(g_observer), std::memory_order_relaxed);
}

void notify_allocation(const void* ptr, int64_t bytes, Category category, Device device, bool freed) {
    if (!g_observing.load(std::memory_order_relaxed)) return;
    std::lock_guard<std::mutex> g(g_observer_mu);
    if (g_observer) g_observer(AllocationEvent{ptr, bytes, category, device, freed});
}

// ---- text --------------------------------------------------------------------------------
int64_t parse_bytes(const std::string& text) {
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    const std::string unit = end ? std::string(end) : "";
    constexpr double Ki = 1024.0;
    static const std::pair<const char*, double> units[] = {
        {"", 1},          {"B", 1},           {"KiB", Ki},   {"MiB", Ki * Ki}, {"GiB", Ki * Ki * Ki},
        {"TiB", Ki * Ki * Ki * Ki}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9},   {"TB", 1e12},
        {"K", Ki},        {"M", Ki * Ki},     {"G", Ki * Ki * Ki}, {"T", Ki * Ki * Ki * Ki}};
    const auto unit_is = [&](const std::pair<const char*, double>& u) { return unit == u.first; };
    const auto* named = std::find_if(std::begin(units), std::end(units), unit_is);
    KILN_USAGE_CHECK(named != std::end(units) && end != text.c_str() && v >= 0 && std::isfinite(v),
                     "cannot read '", text, "' as a memory size; write it like 64MiB, 2GiB, 1TiB, 512KiB or 1000000");
    const double bytes = v * named->second;
    // 2^63 bytes (8 EiB) is the first size an int64_t cannot hold; no machine has half of it
    KILN_USAGE_CHECK(bytes < 9223372036854775808.0, "'", text, "' is more bytes than kiln can count (8 EiB at most)");
    return int64_t(bytes);
}

std::string format_bytes(int64_t bytes) {
    static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = double(bytes);
    int u = 0;
    while (std::fabs(v) >= 1024 && u < 4) { v /= 1024; u++; }
    char buf[32];
    std::snprintf(buf, sizeof buf, u == 0 ? "%.0f%s" : "%.1f%s", v, units[u]);
    return buf;
}

std::string memory_summary(Device device) {
    std::vector<std::pair<std::string, MemoryStats>> each;
    {
        auto& r = Registry::get();
        std::lock_guard<std::mutex> g(r.mu);
        for (Allocator* a : r.allocators[int(device)]) each.emplace_back(a->name(), a->stats());
    }
    MemoryStats all = device_memory_stats(device);
    std::ostringstream os;
    char line[160];
    const char* rule = "|===============================================================|\n";
    os << rule;
    std::snprintf(line, sizeof line, "| %-61s |\n", ("kiln memory summary (" + std::string(device_name(device)) + ")").c_str());
    os << line << "|---------------------------------------------------------------|\n";
    std::snprintf(line, sizeof line, "| %-24s | %16s | %16s |\n", "category", "in use", "peak");
    os << line << "|---------------------------------------------------------------|\n";
    for (int i = 0; i < kNumCategories; i++) {
        std::snprintf(line, sizeof line, "| %-24s | %16s | %16s |\n", category_name(Category(i)),
                      format_bytes(all.in_use[i]).c_str(), format_bytes(all.peak_use[i]).c_str());
        os << line;
    }
    std::snprintf(line, sizeof line, "| %-24s | %16s | %16s |\n", "all allocated", format_bytes(all.allocated).c_str(),
                  format_bytes(all.peak_allocated).c_str());
    os << line << "|---------------------------------------------------------------|\n";
    std::snprintf(line, sizeof line, "| %-14s | %9s | %9s | %6s | %6s | %6s |\n", "allocator", "reserved", "peak res",
                  "allocs", "hits", "misses");
    os << line;
    for (auto& [name, s] : each) {
        std::snprintf(line, sizeof line, "| %-14.14s | %9s | %9s | %6" PRId64 " | %6" PRId64 " | %6" PRId64 " |\n",
                      name.c_str(), format_bytes(s.reserved).c_str(), format_bytes(s.peak_reserved).c_str(),
                      s.num_allocs, s.cache_hits, s.cache_misses);
        os << line;
    }
    int64_t limit = memory_limit(device);
    std::snprintf(line, sizeof line, "| %-61s |\n",
                  ("limit: " + (limit > 0 ? format_bytes(limit) : std::string("none"))).c_str());
    os << line << rule;
    return os.str();
}

}  // namespace kiln
