// data_parallel.h — data parallel training (chapter 12), as PyTorch's DistributedDataParallel.
//
// Every rank holds the whole model and trains on its own share of each batch (LoaderOptions::
// rank). After backward each rank has the gradient of its share's mean loss; the all-reduce
// averages them, so every rank holds the gradient of the whole batch's mean loss
//     g = (1/p) Σ_r g_r       (equal shares: the mean of means is the mean)
// and takes the same optimizer step from the same parameters: the copies never drift apart.
//
//   DataParallel ddp(model, comm);                 // broadcasts rank 0's parameters and buffers
//   train_step(model, sgd, x, y, step_options);    // unchanged: ddp's hooks do the rest
//
// Buckets and overlap. The gradient slab (Module::pack) is cut into buckets of about
// bucket_bytes (25 MiB, as DDP), in reverse layer order — the order backward produces them:
//
//   gradient slab  [ conv1 | conv2 | fc1 ............ | fc2 | fc3 ]
//   buckets          └──── bucket 1 ─────┘└────── bucket 0 ──────┘      (bucket 0 ready first)
//
// A backward hook on each layer marks its parameters' gradients ready (nn/grad_buckets.h's
// BucketReadiness, shared with chapter 15's offload); when a bucket's are all ready its all-reduce starts (non-blocking) while backward goes on with the layers below. A
// hook on the whole model, after backward, starts what is left, waits for every bucket and
// divides by p. With overlap off, that last hook does one all-reduce of the whole slab instead.
//
// Batch norm: each rank normalizes with its own share's statistics (DDP does the same; a
// SyncBatchNorm would all-reduce them), and before every training forward the buffers (running
// statistics) are broadcast from rank 0, DDP's broadcast_buffers = True, so the model every
// rank evaluates and saves is rank 0's.
//
// Gradient accumulation (--accumulate K) works: each micro-batch's backward all-reduces, and
// since the gradients already summed are equal on every rank, the sum stays the average. It
// costs K all-reduces per step, where PyTorch's no_sync() would do one.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "dist/comm.h"
#include "nn/grad_buckets.h"
#include "nn/module.h"

namespace kiln {

struct DataParallelOptions {
    int64_t bucket_bytes = 25 << 20;  // DDP's bucket_cap_mb = 25
    bool overlap = true;              // false: one all-reduce of the whole slab after backward
    bool broadcast_buffers = true;    // rank 0's buffers to every rank before each training forward
};

// What the communication cost, for the scaling measurements (lesson 12).
struct CommStats {
    int64_t all_reduces = 0;   // collectives started
    int64_t bytes = 0;         // bytes all-reduced
    double wait_seconds = 0;   // time backward's end waited for them: the communication not hidden
    void reset() { *this = {}; }
};

class DataParallel {
public:
    // The model must be packed (Module::pack) and built the same way on every rank: its
    // parameter count is checked across ranks. Broadcasts rank 0's parameters and buffers.
    DataParallel(Module& model, Communicator& comm, DataParallelOptions options = {});
    ~DataParallel();  // takes its hooks off the model
    DataParallel(const DataParallel&) = delete;
    DataParallel& operator=(const DataParallel&) = delete;

    const std::vector<GradBucket>& buckets() const { return buckets_; }
    CommStats& stats() { return stats_; }

private:
    Module& model_;
    Communicator& comm_;
    DataParallelOptions opt_;
    Tensor slab_;                       // the gradient slab, 1-D
    std::vector<GradBucket> buckets_;
    std::unique_ptr<BucketReadiness> readiness_;  // with overlap: which buckets backward has finished
    std::vector<CommRequest> requests_; // per bucket: its all-reduce, once started
    size_t started_ = 0;                // buckets started this backward (in order 0, 1, …)
    std::vector<HookHandle> hooks_;
    CommStats stats_;

    void start_ready_buckets();
    void start(size_t bucket);
    void finish_backward();             // the last hook: start the rest, wait, average
};

// Broadcasts rank 0's parameters (the value slab) and buffers to every rank, after checking that
// every rank has as many parameters and buffers: what DataParallel and ZeRO do at the start.
void broadcast_model(Module& model, Communicator& comm);
// Rank 0's buffers (batch norm's running statistics) to every rank: before each training
// forward (DataParallel) or after each step (ZeRO-1).
void broadcast_buffers(Module& model, Communicator& comm);

}  // namespace kiln
