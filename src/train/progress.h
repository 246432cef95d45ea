// progress.h — what a trainer prints: a progress bar per epoch, and the result line.
//
// On a terminal the bar redraws in place:
//   epoch 2/10 [#########.........]  412/938  loss 0.2143  acc 93.81%  18234 img/s  ETA 3s
// With a GradScaler (--amp f16) it also shows the loss scale and the steps skipped this epoch:
//   epoch 2/10 [#########.........]  412/938  loss 0.2143  acc 93.81%  scale 65536 skipped 3  ...
// When stdout is a file or a pipe (CI, `| tee`), it prints plain lines at 25%, 50%, 75% and
// the end of each epoch instead, so logs stay readable.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>

#include "core/device.h"

namespace kiln {

class Progress {
public:
    Progress(int epoch, int epochs, int64_t steps);
    // After each step: the batch's loss and the number of correct predictions in it. The loss
    // shown is the mean over the batches whose loss was finite: a step a GradScaler skipped
    // may have an inf or NaN loss, and the training goes on (train/loop.h). While no batch has
    // had a finite loss, "n/a" is shown.
    void step(int64_t batch_size, float loss, int64_t correct);
    // With a GradScaler: its scale now and the steps it skipped this epoch, shown from now on.
    void show_scaler(float scale, int64_t skipped);
    // Ends the epoch's line; returns the epoch's mean loss (over the finite ones), NaN when no
    // batch had a finite loss — never a 0 that no step computed.
    float finish();
    double images_per_second() const;

private:
    void draw(bool final_line);
    double mean_loss() const;
    int epoch_, epochs_;
    int64_t steps_, done_ = 0, images_ = 0, correct_ = 0;
    double loss_sum_ = 0;
    int64_t loss_images_ = 0;  // the images of the batches whose loss was finite
    float scale_ = 0;  // 0: no scaler to show
    int64_t skipped_ = 0;
    int last_quarter_ = 0;
    bool tty_;
    std::chrono::steady_clock::time_point start_, last_draw_;
};

// Seconds since `start`.
double seconds_since(std::chrono::steady_clock::time_point start);

// Peak memory handed out to tensors on the device at one moment (pool and arenas together),
// for the result line.
int64_t peak_memory(Device device);

// The last line of every trainer, exactly:   result: test_acc=98.42% time=41.3s peak_mem=12.6MiB
std::string result_line(double test_accuracy, double seconds, int64_t peak_bytes);

}  // namespace kiln
