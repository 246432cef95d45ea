// loop.cpp — the training step and the epoch loop (see loop.h for the steps).
#include "train/loop.h"

#include <cmath>
#include <cstdio>
#include <optional>
#include <vector>

#include "nn/layers.h"
#include "ops/autocast.h"
#include "ops/loss.h"
#include "ops/ops.h"
#include "train/evaluate.h"
#include "train/grad_hist.h"
#include "train/loss_log.h"
#include "train/memory_trace.h"
#include "train/progress.h"
#include "train/step_graph.h"

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

// After backward, with a GradScaler (PyTorch's recipe, optim/grad_scaler.h): the gradients
// unscaled and checked, clipped if asked (the true gradients, so max_norm means what it says
// without scaling), the optimizer's step unless an inf/NaN was found, the scale updated.
void scaled_update(Module& model, Optimizer& optimizer, const StepOptions& opt, StepResult& r) {
    GradScaler& scaler = *opt.scaler;
    ContextScope phase(Phase::Optimizer);
    scaler.unscale_(model);
    r.grads_finite = !scaler.found_inf();
    if (r.grads_finite && opt.clip_norm > 0.0f) r.grad_norm = optimizer.clip_gradients(model.parameters(), opt.clip_norm);
    r.stepped = scaler.step(optimizer, model);
    scaler.update();
}

// What follows the batch's last backward, for an optimizer that updates during it
// (Optimizer::before_last_backward): the step is certain only when every loss is finite and nothing
// reads all the gradients first.
AfterBackward after_backward(const StepOptions& opt, bool losses_finite) {
    if (opt.scaler || !losses_finite) return AfterBackward::Other;
    return opt.clip_norm > 0.0f ? AfterBackward::Clip : AfterBackward::Step;
}

}  // namespace

// --grad-hist: the gradients the optimizer was given (unscaled, clipped if asked), against f16's
// range as they are and at the scale the step used; the figure too, in the run's folder if any.
void print_grad_hist(Module& model, float loss_scale, const RunInfo& run) {
    std::vector<Tensor> grads;
    std::vector<std::pair<std::string, Tensor>> named;
    for (auto& [name, p] : model.named_parameters()) {
        grads.push_back(p->grad);
        named.emplace_back(name, p->grad);
    }
    const GradHistogram h = grad_histogram(grads, loss_scale);
    std::printf("%s", grad_hist_text(h).c_str());
    std::printf("%s", grad_zones_text(grad_histograms(named, loss_scale)).c_str());  // which layers
    if (run.trainer.empty()) return;
    const std::string path = run.dir + "/grad-hist.svg";
    grad_hist_svg(h, run.trainer + ": the first step's gradients against f16's range").save(path);
    std::printf("wrote %s\n", path.c_str());
}

std::pair<float, int64_t> forward_backward(Module& model, const Tensor& x, const Tensor& y, float scale,
                                           BumpAllocator* arena, float label_smoothing, LossTotals* totals,
                                           const std::function<void(float loss)>& before_backward) {
    std::optional<AllocatorScope> scope;
    if (arena) scope.emplace(*arena);  // this micro-batch's activations come from the arena
    CrossEntropyLoss criterion(label_smoothing);
    Tensor logits = model.call(x);
    int64_t correct = 0;
    float loss = NAN;
    if (totals) criterion.forward_into(logits, y, totals);  // left on the device: no wait
    else loss = criterion.forward(logits, y, &correct);      // one read-back on a GPU for both
    if (before_backward) before_backward(loss);
    model.call_backward(criterion.backward(scale));
    return {loss, correct};
}  // every tensor of the micro-batch is gone here

StepResult train_step(Module& model, Optimizer& optimizer, const Tensor& x, const Tensor& y, const StepOptions& opt) {
    const int64_t B = x.size(0), K = opt.accumulate;
    KILN_CHECK(K >= 1 && K <= B, "train_step: ", K, " micro-batches (--accumulate) for a batch of ", B,
               " images: use between 1 and the batch size, one that divides --batch-size");
    KILN_CHECK(!opt.loss_log || (!opt.scaler && opt.clip_norm == 0.0f),
               "train_step: a LossLog leaves the loss on the device, and a GradScaler or clipping reads the step back: "
               "use a LossLog without them");
    StepResult r;
    r.loss_logged = opt.loss_log != nullptr;
    model.input_needs_grad = false;  // the input is data: no dL/dx to compute (module.h)
    model.zero_grad();               // one fill when the model is packed
    if (opt.scaler) r.loss_scale = opt.scaler->loss_scale();
    double loss = 0.0;               // Σ (n_i / B) · L_i: the whole batch's mean loss
    std::optional<AutocastScope> amp;  // the weights' low copies: made once, for every micro-batch
    if (opt.amp != DType::F32) amp.emplace(opt.amp);
    for (int64_t i = 0, first = 0; i < K; i++) {
        const int64_t n = B / K + (i < B % K);  // near-equal parts: B/K each when K divides B
        const float share = float(n) / float(B);
        const float grad_scale = opt.scaler ? share * r.loss_scale : share;  // × S with a GradScaler
        LossTotals* totals = opt.loss_log ? opt.loss_log->slot(n, share) : nullptr;
        const auto announce = [&](float loss_i) {  // the last backward: say what follows it
            const bool finite = r.loss_logged || std::isfinite(float(loss + double(share) * loss_i));
            optimizer.before_last_backward(after_backward(opt, finite));
        };
        const auto [loss_i, correct_i] =
            forward_backward(model, rows(x, first, n), rows(y, first, n), grad_scale, opt.arena, opt.label_smoothing,
                             totals, i == K - 1 ? std::function<void(float)>(announce) : std::function<void(float)>());
        loss += double(share) * loss_i;
        r.correct += correct_i;
        first += n;
        if (opt.arena) opt.arena->reset();  // the next micro-batch (or the next step) starts afresh
    }
    amp.reset();  // the copies go before the optimizer changes the weights they were made from
    if (r.loss_logged) {  // the loss is on the device, not known here: the step is taken (loss_log.h)
        ContextScope phase(Phase::Optimizer);
        optimizer.step();
        r.stepped = true;
        return r;
    }
    r.loss = float(loss);
    r.loss_finite = std::isfinite(r.loss);
    if (opt.scaler) {
        scaled_update(model, optimizer, opt, r);
        return r;
    }
    if (r.loss_finite && opt.clip_norm > 0.0f) {
        r.grad_norm = optimizer.clip_gradients(model.parameters(), opt.clip_norm);
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
    int64_t step = 0, correct_total = 0, seen = 0, skipped = 0;
    auto next = [&] {
        if (opt.memory) opt.memory->step_begins();  // a recorded step starts with loading its batch
        ContextScope phase(Phase::Data);
        return loader.next(batch);
    };
    // On a GPU, without a scaler or clipping, the losses wait on the device (loss_log.h).
    std::optional<LossLog> log;
    if (loader.options().device == Device::CUDA && !opt.scaler && opt.clip_norm == 0.0f && opt.loss_read_every > 1)
        log.emplace(Device::CUDA, opt.loss_read_every * opt.accumulate);
    std::optional<StepGraph> graph;
    if (opt.cuda_graph) {
        KILN_CHECK(loader.options().device == Device::CUDA, "--cuda-graph captures CUDA kernels: use --device cuda");
        KILN_CHECK(!opt.memory, "--cuda-graph with --mem-report or --mem-trace: the recording watches uncaptured "
                                "steps; run them without --cuda-graph");
        KILN_CHECK(log, "--cuda-graph: the losses must stay on the device (loss_read_every > 1, no GradScaler, no "
                        "clipping); run without --cuda-graph");
        graph.emplace();
    }
    // What the loop does with a step's loss once it is known: stop if it is not finite, show it.
    const auto account = [&](int64_t at, float loss, int64_t correct, int64_t images) {
        KILN_CHECK(std::isfinite(loss), "training diverged: the loss is ", loss, " at epoch ", epoch + 1, ", step ",
                   at + 1, ". Try a smaller --lr (now ", optimizer.lr(), ") or check the input data");
        bar.step(images, loss, correct);
        correct_total += correct;
    };
    const auto read_log = [&] {
        for (const LossLog::Step& s : log->read()) account(s.index, s.loss, s.correct, s.batch_size);
    };
    while (next()) {
        StepOptions step_opt{opt.arena, opt.clip_norm, opt.accumulate, opt.scaler, opt.amp, opt.label_smoothing};
        if (log) {
            if (log->full(opt.accumulate)) read_log();  // the one wait per loss_read_every steps
            step_opt.loss_log = &*log;
        }
        const StepResult r = graph ? graph->step(model, optimizer, batch.x, batch.y, step_opt)
                                   : train_step(model, optimizer, batch.x, batch.y, step_opt);
        if (opt.memory) opt.memory->step_ends();
        if (log) log->end_step(batch.size());
        if (!opt.scaler && !r.loss_logged) account(step, r.loss, r.correct, batch.size());  // the loss first
        KILN_CHECK(r.grads_finite || opt.scaler, "training diverged: the gradient norm is ", r.grad_norm, " at epoch ",
                   epoch + 1, ", step ", step + 1, ". Try a smaller --lr (now ", optimizer.lr(),
                   ") or check the input data");
        KILN_CHECK(r.stepped || !opt.scaler || opt.scaler->loss_scale() >= kMinLossScale,
                   "training diverged: at epoch ", epoch + 1, ", step ", step + 1, " the GradScaler skipped the step ",
                   "again (", r.loss_finite ? "a gradient is inf or NaN" : "the loss itself is inf or NaN",
                   ") and its scale fell to ", opt.scaler->loss_scale(), ", below ", kMinLossScale,
                   ": the gradients overflow even at their true size, which no loss scale can fix. Try a smaller ",
                   "--lr (now ", optimizer.lr(), ") or check the input data");
        if (opt.grad_hist && step == 0) print_grad_hist(model, r.loss_scale, opt.run);
        // Only after an update: a schedule counts the optimizer's steps (optim/grad_scaler.h).
        if (opt.scheduler && opt.per_batch && r.stepped) opt.scheduler->step();
        skipped += !r.stepped;
        if (opt.scaler) {  // a skipped step's loss is shown as it is (Progress leaves out a non-finite one)
            bar.show_scaler(opt.scaler->loss_scale(), skipped);
            bar.step(batch.size(), r.loss, r.correct);
            correct_total += r.correct;
        }
        seen += batch.size();
        step++;
    }
    if (log) read_log();
    EpochResult r;
    r.images_per_second = bar.images_per_second();
    r.loss = bar.finish();
    r.accuracy = seen ? double(correct_total) / double(seen) : 0.0;
    r.skipped = skipped;
    if (opt.scaler) r.loss_scale = opt.scaler->loss_scale();
    return r;
}

}  // namespace kiln
