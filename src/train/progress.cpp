// progress.cpp — the progress bar and the result line.
#include "train/progress.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>

#include "core/allocator.h"

namespace kiln {

Progress::Progress(int epoch, int epochs, int64_t steps)
    : epoch_(epoch), epochs_(epochs), steps_(steps), tty_(isatty(STDOUT_FILENO)),
      start_(std::chrono::steady_clock::now()), last_draw_(start_) {}

double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double Progress::images_per_second() const {
    double s = seconds_since(start_);
    return s > 0 ? double(images_) / s : 0.0;
}

void Progress::step(int64_t batch_size, float loss, int64_t correct) {
    done_++;
    images_ += batch_size;
    correct_ += correct;
    if (std::isfinite(loss)) {  // always, unless a GradScaler skipped the step (loop.h)
        loss_sum_ += double(loss) * double(batch_size);
        loss_images_ += batch_size;
    }
    if (tty_) {
        if (seconds_since(last_draw_) > 0.1 || done_ == steps_) draw(false);
    } else if (int quarter = int(4 * done_ / steps_); quarter > last_quarter_ && done_ < steps_) {
        last_quarter_ = quarter;
        draw(false);
    }
}

double Progress::mean_loss() const { return loss_images_ ? loss_sum_ / double(loss_images_) : NAN; }

void Progress::show_scaler(float scale, int64_t skipped) {
    scale_ = scale;
    skipped_ = skipped;
}

void Progress::draw(bool final_line) {
    last_draw_ = std::chrono::steady_clock::now();
    double ips = images_per_second();
    double eta = done_ > 0 ? seconds_since(start_) / double(done_) * double(steps_ - done_) : 0.0;
    char bar[21] = {};
    int filled = steps_ > 0 ? int(20 * done_ / steps_) : 20;
    for (int i = 0; i < 20; i++) bar[i] = i < filled ? '#' : '.';
    char loss[32] = "   n/a";  // no step had a finite loss: none to show (not 0)
    if (loss_images_) std::snprintf(loss, sizeof loss, "%.4f", mean_loss());
    double acc = images_ ? 100.0 * double(correct_) / double(images_) : 0.0;
    char scaler[64] = "";
    if (scale_ > 0) std::snprintf(scaler, sizeof scaler, "scale %.9g skipped %lld  ", double(scale_), (long long)skipped_);
    std::printf("%sepoch %d/%d [%s] %5lld/%lld  loss %s  acc %.2f%%  %s%.0f img/s  %s %.0fs%s", tty_ ? "\r" : "",
                epoch_, epochs_, bar, (long long)done_, (long long)steps_, loss, acc, scaler, ips,
                final_line ? "time" : "ETA", final_line ? seconds_since(start_) : eta,
                tty_ && !final_line ? "   " : "\n");
    std::fflush(stdout);
}

float Progress::finish() {
    draw(true);
    return float(mean_loss());
}

int64_t peak_memory(Device device) { return device_peaks(device).peak; }

std::string result_line(double test_accuracy, double seconds, int64_t peak_bytes) {
    char line[160];
    std::snprintf(line, sizeof line, "result: test_acc=%.2f%% time=%.1fs peak_mem=%s", 100.0 * test_accuracy, seconds,
                  format_bytes(peak_bytes).c_str());
    return line;
}

}  // namespace kiln
