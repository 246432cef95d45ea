// loop.h — one epoch of training: the loop every trainer runs.
//
// One step, in order:
//   1. logits = model.forward(x)            activations come from the arena (if given)
//   2. loss   = cross_entropy(logits, y)    and dL/dlogits
//   3. model.backward(dL/dlogits)           fills every parameter's grad
//   4. optimizer.step()                     p -= lr · (update from grad)
//   5. arena.reset()                        this step's activations are gone, in O(1)
#pragma once
#include "core/allocator.h"
#include "data/loader.h"
#include "nn/module.h"
#include "optim/optimizer.h"

namespace kiln {

struct EpochResult {
    float loss = 0;                // mean training loss over the epoch
    double accuracy = 0;           // training accuracy over the epoch
    double images_per_second = 0;
};

// Trains one epoch (epoch counts from 0) with a progress bar. Throws kiln::Error if the loss
// stops being finite, naming the step.
EpochResult train_epoch(Module& model, Optimizer& optimizer, DataLoader& loader, int epoch, int epochs,
                        BumpAllocator* arena = nullptr);

}  // namespace kiln
