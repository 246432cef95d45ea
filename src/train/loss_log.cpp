// loss_log.cpp — LossLog (loss_log.h).
#include "train/loss_log.h"

#include <algorithm>

#include "core/cuda_memory.h"
#include "core/error.h"
#include "ops/loss.h"  // loss_from_totals

namespace kiln {

LossLog::LossLog(Device device, int capacity)
    : totals_(Tensor::empty({int64_t(capacity) * int64_t(sizeof(LossTotals))}, DType::U8, device, Category::Other)),
      capacity_(capacity) {
    KILN_CHECK(capacity >= 1, "LossLog: room for ", capacity, " micro-batches: at least 1");
}

LossTotals* LossLog::slot(int64_t rows, float share) {
    KILN_CHECK(used_ < capacity_, "LossLog: all ", capacity_, " places are taken: read() the log before the next step");
    parts_.push_back({rows, share});
    return static_cast<LossTotals*>(totals_.raw()) + used_++;
}

void LossLog::copy_slots_from(const LossLog& captured) {
    const int n = captured.used_;
    KILN_CHECK(n >= 1 && used_ + n <= capacity_, "LossLog: ", n, " slots copied into a log with ", capacity_ - used_,
               " free: read() the log before the next step");
    KILN_CHECK(totals_.device() == captured.totals_.device(), "LossLog: copy_slots_from a log on another device");
    LossTotals* first = static_cast<LossTotals*>(totals_.raw()) + used_;
    for (int i = 0; i < n; i++) slot(captured.parts_[size_t(i)].rows, captured.parts_[size_t(i)].share);
    const size_t bytes = size_t(n) * sizeof(LossTotals);
    if (totals_.device() == Device::CUDA) cuda::copy_device_to_device(first, captured.totals_.raw(), bytes);
    else std::copy_n(static_cast<const LossTotals*>(captured.totals_.raw()), n, first);
}

void LossLog::end_step(int64_t batch_size) {
    const int64_t first = steps_.empty() ? 0 : steps_.back().first_part + steps_.back().parts;
    KILN_CHECK(int64_t(parts_.size()) > first, "LossLog: end_step() of a step that logged no loss");
    steps_.push_back({first, int64_t(parts_.size()) - first, batch_size});
}

std::vector<LossLog::Step> LossLog::read() {
    KILN_CHECK(int64_t(parts_.size()) == (steps_.empty() ? 0 : steps_.back().first_part + steps_.back().parts),
               "LossLog: read() in the middle of a step (end_step() first)");
    std::vector<LossTotals> host(parts_.size());
    if (!host.empty()) {
        const size_t bytes = host.size() * sizeof(LossTotals);
        if (totals_.device() == Device::CUDA) cuda::copy_to_host(host.data(), totals_.raw(), bytes);  // the one wait
        else std::copy_n(static_cast<const LossTotals*>(totals_.raw()), host.size(), host.data());
    }
    std::vector<Step> out;
    for (const Pending& p : steps_) {
        Step s{next_index_++, 0.0f, 0, p.batch_size};
        double loss = 0.0;  // Σ share · L_i, in train_step's order and types
        for (int64_t i = p.first_part, row = 0; i < p.first_part + p.parts; row += parts_[size_t(i)].rows, i++) {
            const Part& part = parts_[size_t(i)];
            const LossTotals& t = host[size_t(i)];
            KILN_CHECK(t.bad == 0, "softmax_cross_entropy: at step ", s.index + 1, " the label at row ",
                       row + part.rows - int64_t(t.bad), " of the batch is outside [0, ", t.classes, ") classes");
            int64_t correct = 0;
            loss += double(part.share) * loss_from_totals(t, part.rows, &correct);
            s.correct += correct;
        }
        s.loss = float(loss);
        out.push_back(s);
    }
    parts_.clear();
    steps_.clear();
    used_ = 0;
    return out;
}

}  // namespace kiln
