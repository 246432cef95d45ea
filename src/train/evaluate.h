// evaluate.h — accuracy of a model over a whole data set, in evaluation mode.
#pragma once
#include <vector>

#include "core/allocator.h"
#include "data/loader.h"
#include "nn/module.h"

namespace kiln {

// Number of rows of logits[N, C] whose largest entry is at the label's index.
int64_t count_correct(const Tensor& logits, const Tensor& labels);

// Fraction of the loader's images the model classifies correctly (model.eval() during it,
// restored after). The loader runs one epoch in its order. With an arena, each batch's
// activations come from it (reset after every batch), as a training step's do: in evaluation
// mode no layer keeps a cache, so a batch size that trains within the arena evaluates within it.
double evaluate(Module& model, DataLoader& loader, BumpAllocator* arena = nullptr);

// Accuracy and speed of inference: `passes` runs of evaluate() over the whole loader, the
// accuracy of the last and the median of their images per second (a machine's speed varies
// from run to run; the median of an odd number ignores the odd slow one).
struct TimedAccuracy {
    double acc, images_per_second;
};
TimedAccuracy evaluate_timed(Module& model, DataLoader& loader, BumpAllocator* arena = nullptr, int passes = 3);

// How many times faster `b` scores the loader than `a`, in a way a machine others share still
// tells: `passes` evaluations of each, in turns (a, b, a, b, ...), each timed in the process's
// CPU seconds — the work's own time, not the share of a core the process got — and the median of
// the pass-by-pass ratios CPU(a) / CPU(b). (On several threads, their CPU seconds add up.)
double paired_speedup(Module& a, BumpAllocator* arena_a, Module& b, BumpAllocator* arena_b, DataLoader& loader,
                      int passes = 3);

// Test-time augmentation with mirror images. `mirrored` delivers the same images as `loader`,
// in the same order, each flipped left to right (a RandomHorizontalFlip(1.0) transform). An
// image's prediction is then the class with the largest sum of logits over the two views:
//   pred = argmax_c ( f(x)_c + f(flip(x))_c )
// The network was trained on random flips, so both views are images it knows; averaging them
// cancels part of each one's error. Returns both accuracies from one pass over the data.
struct MirrorAccuracy {
    double plain;     // f(x) alone: what evaluate() returns
    double averaged;  // f(x) + f(flip(x))
};
MirrorAccuracy evaluate_with_mirror(Module& model, DataLoader& loader, DataLoader& mirrored,
                                    BumpAllocator* arena = nullptr);

// The same with any views (chapter 13): each loader in `views` delivers the loader's images in
// its order through a fixed transform of its own (a mirror, a shift by a pixel: Translate), and
//   pred = argmax_c ( weights[0] · f(x)_c + Σ_v weights[v + 1] · f(view_v(x))_c ).
// `averaged` is that prediction's accuracy, `plain` f(x)'s alone.
MirrorAccuracy evaluate_views(Module& model, DataLoader& loader, const std::vector<DataLoader*>& views,
                              const std::vector<float>& weights, BumpAllocator* arena = nullptr);

}  // namespace kiln
