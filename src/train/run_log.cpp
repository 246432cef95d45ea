// run_log.cpp — run.json and curves.svg (see run_log.h).
#include "train/run_log.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <type_traits>

#include "core/cuda_memory.h"
#include "core/error.h"
#include "io/archive.h"
#include "io/svg.h"
#include "train/checkpoint.h"

namespace kiln {

RunInfo run_info(const CommonFlags& flags) {
    RunInfo info;
    if (!flags.cli) return info;
    info.trainer = flags.cli->program();
    info.arguments = flags.cli->arguments();
    info.device = flags.device == "cuda" ? Device::CUDA : Device::CPU;
    info.dir = flags.save.empty() ? "runs/" + info.trainer : flags.save;
    flags.use("--save");  // the folder of the run's files
    return info;
}

std::string cpu_model() {
    std::ifstream in("/proc/cpuinfo");
    for (std::string line; std::getline(in, line);) {
        if (line.rfind("model name", 0) != 0) continue;
        size_t colon = line.find(':');
        if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
    return "unknown";
}

namespace {

// A number in the shortest decimal form that reads back as the same value (C++17 to_chars);
// JSON's null for one that is not finite (an epoch without a finite loss: train_loss).
template <typename T> std::string number(T v) {
    if constexpr (std::is_floating_point_v<T>)
        if (!std::isfinite(v)) return "null";
    char text[32];
    return std::string(text, std::to_chars(text, text + sizeof text, v).ptr);
}

std::string device_text(Device d) {
    if (d == Device::CPU) return "cpu";
    return cuda::is_emulated() ? "cuda (kiln's kernel emulator, on the CPU)" : "cuda";
}

// A GradScaler's fields of an epoch's line, ", \"loss_scale\": 65536, \"skipped_steps\": 3";
// nothing for an epoch without one.
std::string scaler_json(const EpochRecord& r) {
    if (r.loss_scale <= 0) return "";
    return ", \"loss_scale\": " + number(r.loss_scale) + ", \"skipped_steps\": " + number(r.skipped_steps);
}

// One epoch's line of run.json: {"epoch": 1, "train_loss": 0.31, ...}
std::string epoch_json(const EpochRecord& r) {
    return "{\"epoch\": " + number(r.epoch) + ", \"train_loss\": " + number(r.train_loss) +
           ", \"train_accuracy\": " + number(r.train_accuracy) + ", \"test_accuracy\": " + number(r.test_accuracy) +
           ", \"lr\": " + number(r.lr) + ", \"images_per_second\": " + number(r.images_per_second) +
           ", \"peak_bytes\": " + number(r.peak_bytes) + scaler_json(r) + "}";
}

// The number after "key": in one epoch's line (null: NaN), or an error naming the file and the key.
double field(const std::string& line, const std::string& key, const std::string& path) {
    const std::string quoted = "\"" + key + "\":";
    size_t at = line.find(quoted);
    char* end = nullptr;
    const char* begin = at == std::string::npos ? nullptr : line.c_str() + at + quoted.size();
    if (begin && std::strncmp(begin, " null", 5) == 0) return NAN;
    double v = begin ? std::strtod(begin, &end) : 0.0;
    KILN_CHECK(begin && end != begin, path, ": an epoch without a number for \"", key, "\" (", line,
               "); delete the file to start the log afresh");
    return v;
}

}  // namespace

std::string run_json(const RunInfo& info, const std::vector<EpochRecord>& epochs) {
    std::string s = "{\n  \"trainer\": ";
    append_json_string(s, info.trainer);
    s += ",\n  \"command_line\": [";
    for (size_t i = 0; i < info.arguments.size(); i++) {
        if (i) s += ", ";
        append_json_string(s, info.arguments[i]);
    }
    s += "],\n  \"device\": ";
    append_json_string(s, device_text(info.device));
    s += ",\n  \"cpu\": ";
    append_json_string(s, cpu_model());
    s += ",\n  \"peak_bytes\": \"the most bytes in use on the device at once since the run started, "
         "training and evaluation (a running peak, not reset between epochs)\",\n  \"epochs\": [";
    for (size_t i = 0; i < epochs.size(); i++) s += (i ? ",\n    " : "\n    ") + epoch_json(epochs[i]);
    s += epochs.empty() ? "]\n}\n" : "\n  ]\n}\n";
    return s;
}

std::vector<EpochRecord> read_epochs(const std::string& json, const std::string& path) {
    std::vector<EpochRecord> epochs;
    std::istringstream in(json);
    for (std::string line; std::getline(in, line);) {
        if (line.find("{\"epoch\":") == std::string::npos) continue;
        EpochRecord r;
        r.epoch = int(field(line, "epoch", path));
        r.train_loss = float(field(line, "train_loss", path));
        r.train_accuracy = field(line, "train_accuracy", path);
        r.test_accuracy = field(line, "test_accuracy", path);
        r.lr = float(field(line, "lr", path));
        r.images_per_second = field(line, "images_per_second", path);
        r.peak_bytes = int64_t(field(line, "peak_bytes", path));
        if (line.find("\"loss_scale\":") != std::string::npos) {  // an epoch with a GradScaler
            r.loss_scale = float(field(line, "loss_scale", path));
            r.skipped_steps = int64_t(field(line, "skipped_steps", path));
        }
        epochs.push_back(r);
    }
    return epochs;
}

RunLog::RunLog(RunInfo info, int epochs_done) : info_(std::move(info)) {
    const std::string json_path = info_.dir + "/run.json";
    std::error_code error;
    std::filesystem::create_directories(info_.dir, error);
    KILN_CHECK(!error, "run log: cannot create the folder ", info_.dir, " for run.json and curves.svg (",
               error.message(), "); pass --save DIR with a folder you can write to");
    if (std::ifstream in{json_path}; in && epochs_done > 0) {
        std::stringstream text;
        text << in.rdbuf();
        for (const EpochRecord& r : read_epochs(text.str(), json_path))
            if (r.epoch <= epochs_done) epochs_.push_back(r);
    }
    write();
}

void RunLog::add(const EpochRecord& record) {
    epochs_.push_back(record);
    write();
}

void RunLog::write() const {
    const std::string path = info_.dir + "/run.json";
    const int err = write_file(path, run_json(info_, epochs_));
    KILN_CHECK(err == 0, "run log: cannot write ", path, " (", std::strerror(err),
               "); pass --save DIR with a folder you can write to");
    if (!epochs_.empty()) save_curves(info_.dir + "/curves.svg", info_.trainer, epochs_);
}

// ---- curves.svg ---------------------------------------------------------------------------

namespace {

const char* const kTrainColour = "#1f77b4";  // blue
const char* const kTestColour = "#d62728";   // red
const char* const kScaleColour = "#2ca02c";  // green

// [lo, hi] of the values with 5% of the span added on each side, within [floor, ceiling].
Range padded(const std::vector<double>& v, double floor, double ceiling) {
    auto [lo, hi] = std::minmax_element(v.begin(), v.end());
    const double pad = 0.05 * (*hi - *lo);
    return {std::max(floor, *lo - pad), std::min(ceiling, *hi + pad)};
}

// A line through the points, with a small square at each (one epoch is a point, not a line).
void curve(Svg& svg, const std::vector<Point>& points, const std::string& colour) {
    svg.polyline(points, colour, 2);
    for (const Point& p : points) svg.rect({p.x - 2.5, p.y - 2.5, 5, 5}, colour);
}

}  // namespace

void save_curves(const std::string& path, const std::string& trainer, const std::vector<EpochRecord>& epochs) {
    std::vector<double> x, loss_x, loss, train_acc, test_acc, scale_x, log2_scale;
    for (const EpochRecord& r : epochs) {
        x.push_back(r.epoch);
        if (std::isfinite(r.train_loss)) {  // an epoch without a finite loss has no point
            loss_x.push_back(r.epoch);
            loss.push_back(r.train_loss);
        }
        train_acc.push_back(100 * r.train_accuracy);
        test_acc.push_back(100 * r.test_accuracy);
        if (r.loss_scale > 0) {
            scale_x.push_back(r.epoch);
            log2_scale.push_back(std::log2(double(r.loss_scale)));
        }
    }
    std::vector<double> both = train_acc;
    both.insert(both.end(), test_acc.begin(), test_acc.end());
    const Range epoch_range{0, x.back()};

    const double width = log2_scale.empty() ? 900 : 1350;  // a third panel for the loss scale
    Svg svg(width, 380);
    char title[160];
    std::snprintf(title, sizeof title, "%s: final test accuracy %.2f%% after epoch %d", trainer.c_str(),
                  100 * epochs.back().test_accuracy, epochs.back().epoch);
    svg.text({width / 2, 24}, title, 16, Anchor::Middle);

    Plot left(svg, {70, 50, 340, 260}, epoch_range, loss.empty() ? Range{0, 1} : padded(loss, 0, 1e30));
    left.axes("epoch", "training loss");
    if (!loss.empty()) curve(svg, left.points(loss_x, loss), kTrainColour);
    left.legend({{"training loss", kTrainColour}});

    const Box acc_area{520, 50, 340, 260};
    Plot right(svg, acc_area, epoch_range, padded(both, 0, 100));
    right.axes("epoch", "accuracy (%)");
    curve(svg, right.points(x, train_acc), kTrainColour);
    curve(svg, right.points(x, test_acc), kTestColour);
    // the legend in the bottom-right corner, where rising accuracy curves are not
    Plot(svg, {acc_area.x, acc_area.y + acc_area.h - 44, acc_area.w, 44}, epoch_range, {0, 1})
        .legend({{"training accuracy", kTrainColour}, {"test accuracy", kTestColour}});

    if (!log2_scale.empty()) {  // whole powers of two on the axis: the scale halves and doubles
        Range r = padded(log2_scale, -1e30, 1e30);
        r = {std::floor(r.lo), std::ceil(r.hi)};
        Plot scale(svg, {970, 50, 340, 260}, epoch_range, r);
        scale.axes("epoch", "log2 of the loss scale");
        curve(svg, scale.points(scale_x, log2_scale), kScaleColour);
        scale.legend({{"GradScaler's scale", kScaleColour}});
    }
    svg.save(path);
}

}  // namespace kiln
