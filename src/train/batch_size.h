// batch_size.h — --find-batch-size: the largest batch whose training step fits in the memory
// limit, found with real steps.
//
// The model's parameters, gradients and optimizer state take the same memory at any batch size;
// a step's activations, workspace and data batch grow with it. So there is a largest batch B
// that fits under --mem-limit, and a probe tells whether b ≤ B: run a forward and backward of b
// images and see whether an OutOfMemory is thrown. The search doubles b from 1 until a probe
// fails, then bisects between the last b that fit and the first that did not:
//   1, 2, 4, ..., 2^k (fails)  →  bisect (2^(k-1), 2^k)      about 2·log2(B) probes.
// A probe runs steps as the trainer does: in a step arena, or from the pool when the trainer
// uses none (recomputation: chapter 08), and with --accumulate K as micro-batches of b/K images
// out of a data batch of b — only one micro-batch's activations are alive at a time, so the
// search is over the micro-batch m and the batch it reports is K·m. It runs three steps, on the
// training set through a loader like the trainer's (whose next batch is built while a step runs):
// the later steps find the pool's cache as the first left it, as every step of a run does, and a
// batch whose second step no longer fits (the cached blocks of the wrong sizes) does not fit.
// A probe changes nothing the training after it sees: it takes no optimizer step (the
// optimizer's memory does not grow with the batch), zeroes the gradients it made, and puts batch
// norm's running statistics (every buffer) back.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "data/loader.h"
#include "data/transforms.h"
#include "nn/module.h"
#include "optim/optimizer.h"

namespace kiln {

// How the trainer's steps run, which the probes copy.
struct BatchProbeOptions {
    bool arena = true;       // activations from a step arena (StepOptions::arena), else from the pool
    int accumulate = 1;      // micro-batches per step (--accumulate)
    DType amp = DType::F32;  // --amp: the probes run under an AutocastScope, as training does
    // The optimizer: if its first step has not run yet, the state that step will make (SGD's
    // momentum, Adam's moments: state_slab, optim/optimizer.h) is made for the probes, as it will
    // be alive in every step after the first. Null: none.
    const Optimizer* optimizer = nullptr;
};

struct BatchProbe {
    int64_t batch;  // the step's batch: accumulate micro-batches of batch / accumulate images
    bool fits;
    int64_t peak;  // the most memory in use on the device during the probe (0 when it did not fit)
};

struct BatchSearch {
    int64_t largest = 0;  // the largest batch that fits (0: not even one image)
    int64_t peak = 0;     // its probe's peak
    std::vector<BatchProbe> probes;  // in the order they ran
};

// Searches batches of random images of `image`'s shape on `device`, up to max_batch, under the
// device's memory limit (set_memory_limit; without one, the system's memory is the limit), each
// probe a step as `options` says (its amp aside: the caller opens the AutocastScope).
BatchSearch find_batch_size(Module& model, const ImageShape& image, Device device, int64_t max_batch,
                            const BatchProbeOptions& options = {});

// The same search on the training set's batches, through a loader with train's options (its
// transforms, its device), up to the training set's size.
BatchSearch find_batch_size(Module& model, const DataLoader& train, const BatchProbeOptions& options);

// What --find-batch-size prints: each probe, then the largest batch and its peak.
std::string describe(const BatchSearch& search, int64_t limit, int accumulate = 1);

// --find-batch-size: the search for the training loader's images (on its device, up to the
// training set's size), printed, with the peak that predict_memory gives for the largest batch's
// micro-batch beside the measured one (the memory model replays f32 steps only: no prediction
// with --amp).
void print_largest_batch(Module& model, const Optimizer& optimizer, const DataLoader& train,
                         const BatchProbeOptions& options);

}  // namespace kiln
