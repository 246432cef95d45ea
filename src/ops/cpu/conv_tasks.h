// conv_tasks.h — what the CPU convolutions (conv.cpp, winograd.cpp, quant.cpp) share: how a batch
// is split among threads (groups of consecutive images, one group per task, and a floor of work
// below which a loop stays on one thread). Internal to ops/cpu; short_rows.h has the loops over
// a plane's short rows.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdint>

#include "core/parallel.h"
#include "ops/params.h"

namespace kiln::cpu {

// Below this many flops a parallel region costs more than it saves (waking a team and its
// barrier take microseconds — much more when the cores are shared with other programs).
constexpr double kParallelMinFlops = 2.0 * 96 * 96 * 96;  // (gemm.cpp splits one product above 2·128³)

// The grain of a loop of n iterations that do total_flops between them: at least
// kParallelMinFlops a chunk, so a small loop stays on one thread.
inline int64_t flop_grain(int64_t n, double total_flops) {
    const double per_iteration = std::max(1.0, total_flops / double(std::max<int64_t>(n, 1)));
    return std::max<int64_t>(1, int64_t(kParallelMinFlops / per_iteration));
}

// Runs group(j, slot) for j = 0 .. groups − 1, each in one of `slots` scratch areas (slot <
// slots): one task per slot, which takes the next group until none is left. A thread so goes on
// in the scratch it used last, still in its core's cache. (With a stretch of the workspace per
// group, a pass walked all of it: LeNet's conv1 wrote 3.7 MB of columns for a batch of 64 and
// its GEMMs read them back from L3; lesson 03, "Write where you will soon read".) And a thread
// that loses its core for a while (a machine shared with other programs) simply takes fewer
// groups, instead of the others waiting for it. At most min(groups, slots, threads) tasks; with
// parallel = false (too little work to wake the pool), all on this thread through slot 0.
// Which thread or slot does a group never changes its result.
template <typename Body>
void for_groups_in_slots(int64_t groups, int64_t slots, bool parallel, Body group) {
    const int64_t tasks = parallel ? std::min<int64_t>({groups, slots, max_threads()}) : 1;
    std::atomic<int64_t> next{0};
    parallel_chunks(tasks, [&](int64_t slot) {
        for (int64_t j = next++; j < groups; j = next++) group(j, slot);
    });
}

// Runs body(n, k, at) for the images n0 .. n0 + count − 1 in groups of up to `group`
// consecutive ones: body does images n .. n + k − 1 with the scratch that starts at image `at`
// of a workspace of `slots` groups (at = slot · group, for_groups_in_slots). One group, or little
// work: on this thread (the GEMMs inside then use every thread if they are big enough).
template <typename Body>
void for_images(int64_t n0, int64_t count, int64_t group, int64_t slots, double flops_per_image, Body body) {
    const int64_t groups = (count + group - 1) / group;
    for_groups_in_slots(groups, slots, double(count) * flops_per_image >= kParallelMinFlops,
                        [&](int64_t j, int64_t slot) {
                            body(n0 + j * group, std::min(group, count - j * group), slot * group);
                        });
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
