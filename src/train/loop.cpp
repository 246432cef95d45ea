// loop.cpp — the training step and the epoch loop (see loop.h for the steps).
#include "train/loop.h"

#include <cmath>
#include <optional>

#include "nn/layers.h"
#include "ops/ops.h"
#include "train/evaluate.h"
#include "train/memory_trace.h"
#include "train/progress.h"

namespace kiln {

namespace {

// Images [first, first + n) of a batch: a view of x's bytes, no copy (the batch is contiguous,
// image after image).
Tensor rows(const Tensor& x, int64_t first, int64_t n) {
    Shape s = x.shape();
    const size_t row_bytes = x.nbytes() / size_t(s[0]);
    s.dims[0] = n;
    return x.view(size_t(first) * row_bytes, s);
}


}  // namespace

std::pair<float, int64_t> forward_backward(Module& model, const Tensor& x, const Tensor& y, float scale,
                                           BumpAllocator* arena) {
    std::optional<AllocatorScope> scope;
    if (arena) scope.emplace(*arena);  // this micro-batch's activations come from the arena
    CrossEntropyLoss criterion;
    Tensor logits = model.call(x);
    const float loss = criterion.forward(logits, y);
    const int64_t correct = count_correct(logits, y);
    model.call_backward(criterion.backward(scale));
    return {loss, correct};
}  // every tensor of the micro-batch is gone here

StepResult train_step(Module& model, Optimizer& optimizer, const Tensor& x, const Tensor& y, const StepOptions& opt) {
    const int64_t B = x.size(0), K = opt.accumulate;
    KILN_CHECK(K >= 1 && K <= B, "train_step: ", K, " micro-batches (--accumulate) for a batch of ", B,
               " images: use between 1 and the batch size, one that divides --batch-size");
    StepResult r;
    model.input_needs_grad = false;  // the input is data: no dL/dx to compute (module.h)
    model.zero_grad();               // one fill when the model is packed
    double loss = 0.0;               // Σ (n_i / B) · L_i: the whole batch's mean loss
    for (int64_t i = 0, first = 0; i < K; i++) {
        const int64_t n = B / K + (i < B % K);  // near-equal parts: B/K each when K divides B
        const float share = float(n) / float(B);
        const auto [loss_i, correct_i] =
            forward_backward(model, rows(x, first, n), rows(y, first, n), share, opt.arena);
        loss += double(share) * loss_i;
        r.correct += correct_i;
        first += n;
        if (opt.arena) opt.arena->reset();  // the next micro-batch (or the next step) starts afresh
    }
    r.loss = float(loss);
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
        const StepResult r = train_step(model, optimizer, batch.x, batch.y, StepOptions{opt.arena, opt.clip_norm, opt.accumulate});
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
