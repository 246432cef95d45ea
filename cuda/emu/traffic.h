// traffic.h — the scheduler's side of the memory counters (emu.h: "memory traffic"; traffic.cpp).
//
// A launch with counting on owns a Counter; the scheduler tells it, on the OS thread that runs
// each block, where the block's shared memory is (begin_block), when every thread has arrived at
// a __syncthreads() (barrier) and when the block is done (end_block). In between, the traced
// code's callbacks record each access of the running thread on that OS thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "emu.h"

namespace kiln::emu::traffic {

// A range of bytes: one shared memory region, or one device allocation.
struct Span {
    std::uintptr_t at;
    std::size_t bytes;
};

// Every cudaMalloc allocation, by address (runtime.cpp).
std::vector<Span> device_allocations();

// The stack the running emulated thread's frames are on (its fiber's, or the OS thread's for a
// thread run as a plain call), set by the scheduler each time it resumes one: its accesses there
// are the kernel's local variables, never counted, and told apart at once.
extern __thread std::uintptr_t running_stack_lo, running_stack_hi;

class Counter {
public:
    Counter(const char* kernel, dim3 grid, dim3 block);  // takes the allocations as they are now
    void begin_block(const std::vector<Span>& shared);    // on the block's OS thread
    void barrier();    // every thread of the block is at a barrier: its warps' requests are whole
    void end_block();  // the block is done: its counts join the launch's
    void finish();     // the launch is done: it joins take_traffic()'s list

    const std::vector<Span>& allocations() const { return allocations_; }

private:
    LaunchTraffic totals_;
    std::vector<Span> allocations_;  // sorted by address
    std::mutex mutex_;               // totals_, from the OS threads that run blocks
};

}  // namespace kiln::emu::traffic
