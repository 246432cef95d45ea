// loop.cpp — the training step and the epoch loop (see loop.h for the steps).
#include "train/loop.h"

#include <cmath>
#include <optional>

#include "nn/layers.h"
#include "train/evaluate.h"
#include "train/memory_trace.h"
#include "train/progress.h"

namespace kiln {

StepResult train_step(Module& model, Optimizer& optimizer, const Tensor& x, const Tensor& y, const StepOptions& opt) {
    StepResult r;
    model.input_needs_grad = false;  // the input is data: no dL/dx to compute (module.h)
    {
        std::optional<AllocatorScope> scope;
        if (opt.arena) scope.emplace(*opt.arena);  // this step's activations come from the arena
        CrossEntropyLoss criterion;
        model.zero_grad();  // one fill when the model is packed
        Tensor logits = model.call(x);
        r.loss = criterion.forward(logits, y);
        r.correct = count_correct(logits, y);
        model.call_backward(criterion.backward());
    }  // every tensor of the step is gone here
    r.loss_finite = std::isfinite(r.loss);
    if (r.loss_finite && opt.clip_norm > 0.0f) {
        r.grad_norm = clip_grad_norm(model.parameters(), opt.clip_norm);
        r.grads_finite = std::isfinite(r.grad_norm);
    }
    if (r.finite()) {
        ContextScope phase(Phase::Optimizer);
        optimizer.step();  // outside the arena's scope: optimizer state must outlive the step
        r.stepped = true;
    }
    if (opt.arena) opt.arena->reset();
    return r;
}

EpochResult train_epoch(Module& model, Optimizer& optimizer, DataLoader& loader, int epoch, const TrainOptions& opt) {
    model.train();
    loader.start_epoch(epoch);
    Progress bar(epoch + 1, opt.epochs, loader.num_batches());
    Batch batch;  // from the pool: it lives across the arena's reset
    int64_t step = 0, correct_total = 0, seen = 0;
    auto next = [&] {
        if (opt.memory) opt.memory->step_begins();  // a recorded step starts with loading its batch
        ContextScope phase(Phase::Data);
        return loader.next(batch);
    };
    while (next()) {
        const StepResult r = train_step(model, optimizer, batch.x, batch.y, StepOptions{opt.arena, opt.clip_norm});
        if (opt.memory) opt.memory->step_ends();
        KILN_CHECK(r.finite(), "training diverged: the ", r.loss_finite ? "gradient norm" : "loss", " is ",
                   r.loss_finite ? r.grad_norm : r.loss, " at epoch ", epoch + 1, ", step ", step + 1,
                   ". Try a smaller --lr (now ", optimizer.lr(), ") or check the input data");
        if (opt.scheduler && opt.per_batch) opt.scheduler->step();
        bar.step(batch.size(), r.loss, r.correct);
        correct_total += r.correct;
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
