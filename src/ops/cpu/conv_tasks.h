// conv_tasks.h — what the CPU convolutions (conv.cpp, winograd.cpp, quant.cpp) share: how a batch
// is split among threads (groups of consecutive images, one group per task, and a floor of work
// below which a loop stays on one thread). Internal to ops/cpu; short_rows.h has the loops over
// a plane's short rows.
#pragma once
#include <algorithm>
#include <cstdint>

#include "core/parallel.h"
#include "ops/params.h"

namespace kiln::cpu {

// Below this many flops a parallel region costs more than it saves (waking a team and its
// barrier take microseconds — much more when the cores are shared with other programs).
constexpr double kParallelMinFlops = 2.0 * 96 * 96 * 96;  // the same bar as gemm.cpp's

// The grain of a loop of n iterations that do total_flops between them: at least
// kParallelMinFlops a chunk, so a small loop stays on one thread.
inline int64_t flop_grain(int64_t n, double total_flops) {
    const double per_iteration = std::max(1.0, total_flops / double(std::max<int64_t>(n, 1)));
    return std::max<int64_t>(1, int64_t(kParallelMinFlops / per_iteration));
}

// Runs body(n, k, slot) for the images n0 .. n0 + count − 1 in groups of up to `group`
// consecutive ones: body does images n .. n + k − 1, and its workspace starts at image `slot`
// (slot = n − n0). Several groups: one group per thread at a time. One group, or little work:
// on this thread (the GEMMs inside then use every thread if they are big enough).
// Groups are handed out one at a time (parallel_chunks): on a machine shared with other
// programs, a thread that loses its core for a while then simply does fewer of them, instead of
// the others waiting for it. Which thread does a group never changes its result.
template <typename Body>
void for_images(int64_t n0, int64_t count, int64_t group, double flops_per_image, Body body) {
    const int64_t groups = (count + group - 1) / group;
    parallel_chunks(
        groups, [&](int64_t j) { body(n0 + j * group, std::min(group, count - j * group), j * group); },
        double(count) * flops_per_image >= kParallelMinFlops);
}

// Multiply-adds ×2 of one image's convolution by the textbook formula (any of the three passes).
inline double flops_per_image(const Conv2dParams& p) {
    return 2.0 * double(p.O) * double(p.P() * p.Q()) * double(p.Cg() * p.KH * p.KW);
}

// A group of images is made big enough that its GEMMs have at least this many columns: with
// one 7×7 image a GEMM would have N = 49, too narrow to amortize the packing of its A.
constexpr int64_t kGroupColumns = 256;

// Images per group when each image gives `columns` GEMM columns: ⌈kGroupColumns / columns⌉,
// at most `chunk`.
inline int64_t images_per_group(int64_t columns, int64_t chunk) {
    return std::clamp<int64_t>((kGroupColumns + columns - 1) / columns, 1, chunk);
}

}  // namespace kiln::cpu
