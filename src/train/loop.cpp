// loop.cpp — the training loop (see loop.h for the five steps).
#include "train/loop.h"

#include <cmath>
#include <optional>

#include "nn/layers.h"
#include "train/evaluate.h"
#include "train/progress.h"

namespace kiln {

EpochResult train_epoch(Module& model, Optimizer& optimizer, DataLoader& loader, int epoch, const TrainOptions& opt) {
    BumpAllocator* arena = opt.arena;
    model.train();
    model.input_needs_grad = false;  // the input is data: no dL/dx to compute (module.h)
    loader.start_epoch(epoch);
    Progress bar(epoch + 1, opt.epochs, loader.num_batches());
    CrossEntropyLoss criterion;
    Batch batch;  // from the pool: it lives across the arena's reset
    int64_t step = 0, correct_total = 0, seen = 0;
    while (loader.next(batch)) {
        float loss;
        int64_t correct;
        {
            std::optional<AllocatorScope> scope;
            if (arena) scope.emplace(*arena);  // this step's activations come from the arena
            optimizer.zero_grad();
            Tensor logits = model.forward(batch.x);
            loss = criterion.forward(logits, batch.y);
            correct = count_correct(logits, batch.y);
            model.backward(criterion.backward());
        }  // every tensor of the step is gone here
        KILN_CHECK(std::isfinite(loss), "training diverged: the loss is ", loss, " at epoch ", epoch + 1, ", step ",
                   step + 1, ". Try a smaller --lr (now ", optimizer.lr(), ") or check the input data");
        if (opt.clip_norm > 0.0f) clip_grad_norm(model.parameters(), opt.clip_norm);
        optimizer.step();  // outside the scope: optimizer state must outlive the step
        if (opt.scheduler && opt.per_batch) opt.scheduler->step();
        if (arena) arena->reset();
        bar.step(batch.size(), loss, correct);
        correct_total += correct;
        seen += batch.size();
        step++;
    }
    EpochResult r;
    r.images_per_second = bar.images_per_second();
    r.loss = bar.finish();
    r.accuracy = seen ? double(correct_total) / double(seen) : 0.0;
    return r;
}

}  // namespace kiln
