// evaluate.cpp — counting correct predictions.
#include "train/evaluate.h"

#include "ops/ops.h"

namespace kiln {

int64_t count_correct(const Tensor& logits, const Tensor& labels) {
    Tensor pred = argmax_rows(logits).to(Device::CPU);
    Tensor y = labels.to(Device::CPU);
    check_shape(y, pred.shape(), "count_correct", "labels");
    const int32_t* p = pred.data<int32_t>();
    const int32_t* t = y.data<int32_t>();
    int64_t correct = 0;
    for (int64_t i = 0; i < pred.numel(); i++) correct += p[i] == t[i];
    return correct;
}

double evaluate(Module& model, DataLoader& loader) {
    bool was_training = model.training();
    model.eval();
    loader.start_epoch(0);
    int64_t correct = 0, seen = 0;
    Batch b;
    while (loader.next(b)) {
        correct += count_correct(model.forward(b.x), b.y);
        seen += b.size();
    }
    model.train(was_training);
    return seen ? double(correct) / double(seen) : 0.0;
}

}  // namespace kiln
