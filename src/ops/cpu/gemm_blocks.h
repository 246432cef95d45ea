// gemm_blocks.h — how a GEMM is cut up (chapter 03): into cache blocks of even size, and into
// rectangles of C for the threads. Shared by the f32 loops (gemm.cpp) and the AMX ones
// (gemm_amx.cpp), whose tiles differ but whose cutting does not.
#pragma once
#include <algorithm>
#include <cstdint>

namespace kiln::cpu {

// Split n into the fewest blocks of at most max_block, all of (nearly) the same size,
// rounded up to a multiple of unit: n = 784, max 256, unit 1 -> 196.
inline int64_t split_evenly(int64_t n, int64_t max_block, int64_t unit) {
    const int64_t blocks = (n + max_block - 1) / max_block;
    const int64_t size = (n + blocks - 1) / blocks;
    return (size + unit - 1) / unit * unit;
}

// ---- Threads: each rectangle of C is one task --------------------------------------------------
// C is cut into tm × tn rectangles on tile boundaries (mr rows, nr columns); a thread takes a
// rectangle, computes it with its own packing buffers, and takes the next: no barrier, no shared
// writes. There are up to 4 rectangles per thread, handed out dynamically, so that a thread
// slowed down (another process on its core, the data loader) gets fewer of them.
// The price: A is packed once per column of rectangles, B once per row, so we pick the grid
// with the least packing, tn·M·K + tm·K·N.
struct Grid {
    int64_t tm, tn;
};

// How many rectangles a product of `flops` (2·M·N·K) wants on `threads` threads: 1 to 4 per
// thread, each of at least min_flops (more rectangles pack more), and the same number for every
// thread (3 rectangles on 2 threads: one thread computes the third while the other waits).
inline int64_t rectangles_for(double flops, int64_t threads, double min_flops) {
    return threads * std::clamp<int64_t>(static_cast<int64_t>(flops / (threads * min_flops)), 1, 4);
}

// The grid of at most `parts` rectangles, as many as possible, with the least packing.
inline Grid choose_grid(int64_t M, int64_t N, int64_t mr, int64_t nr, int64_t parts) {
    const int64_t m_tiles = (M + mr - 1) / mr, n_tiles = (N + nr - 1) / nr;
    Grid best{1, 1};
    double best_cost = 0;
    for (int64_t tm = 1; tm <= parts; ++tm) {
        const int64_t tn = std::min(parts / tm, n_tiles);
        if (tm > m_tiles) break;
        const double cost = static_cast<double>(tn) * M + static_cast<double>(tm) * N;
        const bool more_parts = tm * tn > best.tm * best.tn;
        if (more_parts || (tm * tn == best.tm * best.tn && cost < best_cost)) {
            best = {tm, tn};
            best_cost = cost;
        }
    }
    return best;
}

// Part `index` of `parts` of n items that come in units of `unit`: [begin, end).
inline void split_range(int64_t n, int64_t unit, int64_t parts, int64_t index, int64_t& begin, int64_t& end) {
    const int64_t units = (n + unit - 1) / unit;
    begin = std::min(n, units * index / parts * unit);
    end = std::min(n, units * (index + 1) / parts * unit);
}

}  // namespace kiln::cpu
