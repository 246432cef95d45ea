// loss_log.h — the training losses left where they were computed, on the GPU, and read back many
// steps at a time: one wait for the host per `capacity` steps instead of one per step.
//
// Why it pays. A CUDA kernel launch returns at once: the host queues the step's kernels and the
// GPU runs them in order, a queue between the two. Reading a number back (PyTorch's
// loss.item(), kiln's softmax_cross_entropy) empties the queue: the host waits until the GPU has
// run everything queued so far, and only then goes on queueing the backward. The GPU then idles
// while the host prepares and launches the next kernels, and every step pays the round trip once.
// On a small net, whose kernels take about as long as their launches, that gap is a large share
// of the step (chapter 04: launch overhead). With the losses kept on the device the host runs
// ahead, queueing steps while the GPU works through the earlier ones, and waits only when the log
// is full (or the epoch ends): the progress bar then learns `capacity` steps' losses at once.
//
// What it costs: a loss that turned NaN is seen when the log is read, up to `capacity` steps
// later; those steps have been taken (as in PyTorch's own loops, which check only what they log).
// The training loop then stops with the error it gives today, naming the step whose loss was
// first not finite. A label outside the classes is found the same way, named by step and row.
//
//   LossLog log(Device::CUDA);
//   step: train_step(..., StepOptions{... .loss_log = &log}); log.end_step();
//   if (log.full()) for (const LossLog::Step& s : log.read()) progress.step(s.batch_size, s.loss, s.correct);
//
// On the CPU nothing waits: the loops read every step's loss at once, as before (no LossLog).
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "ops/loss.h"  // LossTotals

namespace kiln {

class LossLog {
public:
    // Room for `capacity` micro-batches' totals (32 bytes each) on `device`.
    explicit LossLog(Device device, int capacity = 32);

    // Where the next micro-batch of the step being run writes its loss kernel's totals (memory on
    // the device): `rows` rows of logits, `share` its part of the step's batch (train/loop.h: the
    // step's loss is Σ share · the micro-batch's mean loss).
    LossTotals* slot(int64_t rows, float share);
    // The step's micro-batches are done: it is one step of the log, of batch_size images.
    void end_step(int64_t batch_size);
    // Whether a step of `micro_batches` more would not fit: read() first.
    bool full(int micro_batches = 1) const { return used_ + micro_batches > capacity_; }
    int64_t steps_waiting() const { return int64_t(steps_.size()); }
    // Takes a slot for each micro-batch `captured` holds (every slot it handed out: one step's),
    // with the same rows and share, and copies their totals into them on the device (one copy):
    // how a step replayed from a CUDA Graph, whose loss kernels write into the graph's own log,
    // joins the training loop's log (train/step_graph.h). end_step() follows, as after a step.
    void copy_slots_from(const LossLog& captured);

    struct Step {
        int64_t index;       // counts the log's steps from 0 (train_epoch: the epoch's step − 1)
        float loss;          // the batch's mean loss, as train_step computes it (StepResult::loss)
        int64_t correct;     // rows predicted right
        int64_t batch_size;
    };
    // The steps logged since the last read, in order, from one copy to the host (the one wait).
    // A bad label is a kiln::Error naming the step and the row. Empties the log.
    std::vector<Step> read();

private:
    struct Part {           // one micro-batch: what its totals are read against
        int64_t rows;
        float share;
    };
    struct Pending {
        int64_t first_part, parts, batch_size;
    };
    Tensor totals_;         // capacity × LossTotals on the device
    int capacity_, used_ = 0;
    int64_t next_index_ = 0;
    std::vector<Part> parts_;
    std::vector<Pending> steps_;
};

}  // namespace kiln
