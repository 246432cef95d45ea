// alloc_size.h — the sizes the allocators hand out (allocator.cpp, pool_allocator.cpp,
// bump_allocator.cpp): every block starts on kAlign bytes and is rounded up to a multiple.
#pragma once
#include <cstddef>

namespace kiln {

// A GPU's cudaMalloc alignment; enough for AVX-512's 64-byte loads.
inline constexpr size_t kAlign = 256;

// n rounded up to a multiple of `to`.
inline constexpr size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace kiln
