// batch_size.h — --find-batch-size: the largest batch whose training step fits in the memory
// limit, found with real steps.
//
// The model's parameters, gradients and optimizer state take the same memory at any batch size;
// a step's activations, workspace and data batch grow with it. So there is a largest batch B
// that fits under --mem-limit, and a probe tells whether b ≤ B: run a forward and backward of b
// images and see whether an OutOfMemory is thrown. The search doubles b from 1 until a probe
// fails, then bisects between the last b that fit and the first that did not:
//   1, 2, 4, ..., 2^k (fails)  →  bisect (2^(k-1), 2^k)      about 2·log2(B) probes.
// A probe changes nothing the training after it sees: it takes no optimizer step (the
// optimizer's memory does not grow with the batch), zeroes the gradients it made, and puts batch
// norm's running statistics (every buffer) back.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/loader.h"
#include "data/transforms.h"
#include "nn/module.h"
#include "optim/optimizer.h"

namespace kiln {

struct BatchProbe {
    int64_t batch;
    bool fits;
    int64_t peak;  // the most memory in use on the device during the probe (0 when it did not fit)
};

struct BatchSearch {
    int64_t largest = 0;  // the largest batch that fits (0: not even one image)
    int64_t peak = 0;     // its probe's peak
    std::vector<BatchProbe> probes;  // in the order they ran
};

// Searches batches of random images of `image`'s shape on `device`, up to max_batch, under the
// device's memory limit (set_memory_limit; without one, the system's memory is the limit).
BatchSearch find_batch_size(Module& model, const ImageShape& image, Device device, int64_t max_batch);

// What --find-batch-size prints: each probe, then the largest batch and its peak.
std::string describe(const BatchSearch& search, int64_t limit);

// --find-batch-size: the search for the training loader's images (on its device, up to the
// training set's size), printed, with the peak that predict_memory gives for the largest batch
// beside the measured one. With amp (--amp f16|bf16) the probes run under an AutocastScope, as
// training does (the memory model replays f32 steps only: no prediction then).
void print_largest_batch(Module& model, const Optimizer& optimizer, const DataLoader& train, DType amp);

}  // namespace kiln
