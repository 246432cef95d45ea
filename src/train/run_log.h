// run_log.h — a record of a training run, one entry per epoch, kept on disk as it grows:
//
//   DIR/run.json     who ran what (trainer, command line, device, CPU) and, per epoch, the
//                    training loss and accuracy, the test accuracy, the lr, img/s, peak memory;
//                    with a GradScaler (--amp f16) also its loss scale and the skipped steps
//   DIR/curves.svg   loss against epoch beside training and test accuracy against epoch, and
//                    log2 of the loss scale against epoch when a GradScaler was used
//
// DIR is --save's folder when given, else runs/<trainer>/ (runs/lesson-03/). fit (train/fit.h)
// keeps the log for every trainer; both files are rewritten after each epoch, so a stopped run
// still has its curves, and --resume continues them from the run.json it finds in DIR.
//
//   RunLog log(run_info(flags), /*epochs_done=*/0);   // throws now if DIR cannot be written
//   log.add({1, 0.31f, 0.91, 0.97, 0.05f, 18000.0, peak_memory(device)});
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/device.h"
#include "train/cli.h"

namespace kiln {

// Who made the run: the top of run.json. An empty trainer means no log (fit writes none).
struct RunInfo {
    std::string trainer;                 // "lesson-03"
    std::vector<std::string> arguments;  // the command line after the trainer's name
    Device device = Device::CPU;
    std::string dir;                     // where run.json and curves.svg go
};

// The run as a trainer's flags describe it: flags.cli's name and command line (add_to sets
// flags.cli; without it, no log), the device of --device, and the folder: --save, else
// runs/<trainer>.
RunInfo run_info(const CommonFlags& flags);

// One epoch. peak_bytes: the most bytes in use on the device at once since the run (the
// process) started — the running peak the result line prints, not reset between epochs.
struct EpochRecord {
    int epoch = 0;                 // counts from 1
    float train_loss = 0;          // mean over the epoch's finite losses; NaN (null in run.json) if none
    double train_accuracy = 0;     // 0..1, over the epoch (the weights changing as it goes)
    double test_accuracy = 0;      // 0..1, after the epoch
    float lr = 0;                  // the lr the epoch started with
    double images_per_second = 0;  // training images
    int64_t peak_bytes = 0;
    float loss_scale = 0;          // the GradScaler's scale at the epoch's end; 0: no scaler
    int64_t skipped_steps = 0;     // steps it skipped in the epoch (an inf/NaN gradient)
};

class RunLog {
public:
    // Creates info.dir and writes run.json there at once, so that a folder that cannot be
    // written is an error before training starts. epochs_done > 0 (--resume): the records of
    // epochs 1..epochs_done are first read back from the run.json already in info.dir, if any.
    RunLog(RunInfo info, int epochs_done);

    // Adds the epoch and rewrites run.json and curves.svg.
    void add(const EpochRecord& record);

    const std::vector<EpochRecord>& epochs() const { return epochs_; }
    const RunInfo& info() const { return info_; }

private:
    void write() const;
    RunInfo info_;
    std::vector<EpochRecord> epochs_;
};

// run.json's text: an object with the run's description and "epochs": one object per epoch
// on its own line, numbers in their shortest exact decimal form; "loss_scale" and
// "skipped_steps" only in the epochs that had a scaler.
std::string run_json(const RunInfo& info, const std::vector<EpochRecord>& epochs);

// The epochs recorded in run.json's text (the inverse of run_json's "epochs"); `path` names
// the file in the error a malformed line raises.
std::vector<EpochRecord> read_epochs(const std::string& json, const std::string& path);

// curves.svg: training loss against epoch on the left; training and test accuracy (%) against
// epoch in the middle (on the right without a scaler); log2 of the loss scale against epoch on
// the right when an epoch had a scaler; the final test accuracy above them. Throws kiln::Error
// if it cannot write.
void save_curves(const std::string& path, const std::string& trainer, const std::vector<EpochRecord>& epochs);

// The CPU's name from /proc/cpuinfo ("model name"), or "unknown" where there is none.
std::string cpu_model();

}  // namespace kiln
