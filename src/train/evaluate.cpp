// evaluate.cpp — counting correct predictions.
#include "train/evaluate.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <vector>

#include "ops/ops.h"

namespace kiln {

int64_t count_correct(const Tensor& logits, const Tensor& labels) { return count_equal(argmax_rows(logits), labels); }

namespace {

// One epoch of `loader` through the model in evaluation mode (restored after) and without
// caches for backward (a NoGradScope; eval mode keeps none already — the scope says so), and of
// `mirrored` in step with it if given: the correct counts of f(x) and of f(x) + f(flip(x)).
// With an arena, each batch's activations come from it and it is reset after the batch.
MirrorAccuracy score(Module& model, DataLoader& loader, DataLoader* mirrored, BumpAllocator* arena) {
    NoGradScope no_grad;
    bool was_training = model.training();
    model.eval();
    loader.start_epoch(0);
    if (mirrored) mirrored->start_epoch(0);
    int64_t plain = 0, averaged = 0, seen = 0;
    Batch b, m;
    while (loader.next(b) && (!mirrored || mirrored->next(m))) {
        {
            std::optional<AllocatorScope> scope;
            if (arena) scope.emplace(*arena);
            Tensor logits = model.call(b.x);  // [N, classes]
            plain += count_correct(logits, b.y);
            if (mirrored) averaged += count_correct(add(logits, model.call(m.x)), b.y);
        }  // the batch's activations are gone here
        if (arena) arena->reset();
        seen += b.size();
    }
    model.train(was_training);
    if (seen == 0) return {0.0, 0.0};
    return {double(plain) / double(seen), double(averaged) / double(seen)};
}

}  // namespace

double evaluate(Module& model, DataLoader& loader, BumpAllocator* arena) {
    return score(model, loader, nullptr, arena).plain;
}

TimedAccuracy evaluate_timed(Module& model, DataLoader& loader, BumpAllocator* arena, int passes) {
    KILN_CHECK(passes >= 1, "evaluate_timed: passes ", passes, " should be at least 1");
    double acc = 0.0;
    std::vector<double> rates;
    for (int i = 0; i < passes; i++) {
        const auto t0 = std::chrono::steady_clock::now();
        acc = evaluate(model, loader, arena);
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        rates.push_back(double(loader.set().n) / s);
    }
    std::sort(rates.begin(), rates.end());
    return {acc, rates[rates.size() / 2]};
}

MirrorAccuracy evaluate_with_mirror(Module& model, DataLoader& loader, DataLoader& mirrored, BumpAllocator* arena) {
    KILN_CHECK(loader.num_batches() == mirrored.num_batches(), "evaluate_with_mirror: the mirrored loader has ",
               mirrored.num_batches(), " batches, the loader ", loader.num_batches(),
               "; build both from the same set with the same batch size");
    return score(model, loader, &mirrored, arena);
}

}  // namespace kiln
