// loop.h — one epoch of training: the loop every trainer runs.
//
// One step, in order:
//   1. logits = model.forward(x)            activations come from the arena (if given)
//   2. loss   = cross_entropy(logits, y)    and dL/dlogits
//   3. model.backward(dL/dlogits)           fills every parameter's grad
//      clip_grad_norm(grads, clip_norm)    if asked (chapter 07)
//   4. optimizer.step()                     p -= lr · (update from grad)
//   5. scheduler.step()                     if the lr changes every batch (OneCycleLR)
//   6. arena.reset()                        this step's activations are gone, in O(1)
#pragma once
#include <string>

#include "core/allocator.h"
#include "data/loader.h"
#include "nn/module.h"
#include "optim/optimizer.h"
#include "optim/scheduler.h"

namespace kiln {

struct EpochResult {
    float loss = 0;                // mean training loss over the epoch
    double accuracy = 0;           // training accuracy over the epoch
    double images_per_second = 0;
};

// How to train: the loop's options (train_epoch) and the epochs' (fit, train/fit.h).
struct TrainOptions {
    int epochs = 1;
    LRScheduler* scheduler = nullptr;  // stepped after every epoch, or after every batch when
    bool per_batch = false;            // per_batch (OneCycleLR); null: the lr stays as it is
    BumpAllocator* arena = nullptr;    // each step's activations (reset after the step)
    float clip_norm = 0.0f;            // > 0: clip the gradients' global norm to it each step
    std::string save_dir;              // fit: a checkpoint after every epoch, save_dir/last.safetensors
    std::string resume;                // fit: continue from this checkpoint (train/checkpoint.h)
    DataLoader* test_mirrored = nullptr;  // fit: the test set flipped; also score with mirrors (evaluate.h)
};

// Trains one epoch (epoch counts from 0, of opt.epochs) with a progress bar. Throws kiln::Error
// if the loss stops being finite, naming the step.
EpochResult train_epoch(Module& model, Optimizer& optimizer, DataLoader& loader, int epoch, const TrainOptions& opt);

}  // namespace kiln
