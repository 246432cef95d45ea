// evaluate.cpp — counting correct predictions.
#include "train/evaluate.h"

#include <time.h>

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
// each of `views` in step with it: the correct counts of f(x) and of
//   weights[0] · f(x) + Σ_v weights[v + 1] · f(views[v](x)).
// With an arena, each batch's activations come from it and it is reset after the batch.
MirrorAccuracy score(Module& model, DataLoader& loader, const std::vector<DataLoader*>& views,
                     const std::vector<float>& weights, BumpAllocator* arena) {
    KILN_CHECK(weights.size() == views.size() + 1, "evaluate: ", weights.size(), " weights for ", views.size() + 1,
               " views (the loader and ", views.size(), " more)");
    for (size_t v = 0; v < views.size(); v++)
        KILN_CHECK(views[v]->num_batches() == loader.num_batches(), "evaluate: view ", v + 1, " (the mirrored or shifted ",
                   "loader) has ", views[v]->num_batches(), " batches, the loader ", loader.num_batches(),
                   "; build every view from the same set with the same batch size");
    NoGradScope no_grad;
    bool was_training = model.training();
    model.eval();
    loader.start_epoch(0);
    for (DataLoader* v : views) v->start_epoch(0);
    int64_t plain = 0, combined = 0, seen = 0;
    Batch b;
    std::vector<Batch> vb(views.size());
    while (loader.next(b)) {
        for (size_t v = 0; v < views.size(); v++) KILN_CHECK(views[v]->next(vb[v]), "evaluate: a view ran out of batches");
        {
            std::optional<AllocatorScope> scope;
            if (arena) scope.emplace(*arena);
            Tensor logits = model.call(b.x);  // [N, classes]
            plain += count_correct(logits, b.y);
            if (!views.empty()) {
                Tensor sum = logits.clone();
                if (weights[0] != 1.0f) scale_(sum, weights[0]);
                for (size_t v = 0; v < views.size(); v++) axpy_(sum, weights[v + 1], model.call(vb[v].x));
                combined += count_correct(sum, b.y);
            }
        }  // the batch's activations are gone here
        if (arena) arena->reset();
        seen += b.size();
    }
    model.train(was_training);
    if (seen == 0) return {0.0, 0.0};
    return {double(plain) / double(seen), double(combined) / double(seen)};
}

}  // namespace

double evaluate(Module& model, DataLoader& loader, BumpAllocator* arena) {
    return score(model, loader, {}, {1.0f}, arena).plain;
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

static double cpu_seconds() {
    timespec t{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

double paired_speedup(Module& a, BumpAllocator* arena_a, Module& b, BumpAllocator* arena_b, DataLoader& loader,
                      int passes) {
    KILN_CHECK(passes >= 1, "paired_speedup: passes ", passes, " should be at least 1");
    const auto cpu_time = [&](Module& m, BumpAllocator* arena) {
        const double t0 = cpu_seconds();
        evaluate(m, loader, arena);
        return cpu_seconds() - t0;
    };
    std::vector<double> ratios;
    for (int i = 0; i < passes; i++) {
        const double ta = cpu_time(a, arena_a);
        ratios.push_back(ta / cpu_time(b, arena_b));
    }
    std::sort(ratios.begin(), ratios.end());
    return ratios[ratios.size() / 2];
}

MirrorAccuracy evaluate_with_mirror(Module& model, DataLoader& loader, DataLoader& mirrored, BumpAllocator* arena) {
    return score(model, loader, {&mirrored}, {1.0f, 1.0f}, arena);
}

MirrorAccuracy evaluate_views(Module& model, DataLoader& loader, const std::vector<DataLoader*>& views,
                              const std::vector<float>& weights, BumpAllocator* arena) {
    return score(model, loader, views, weights, arena);
}

}  // namespace kiln
