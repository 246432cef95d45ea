// batch_size.cpp — the largest batch that fits (see batch_size.h).
#include "train/batch_size.h"

#include <cstdio>
#include <map>
#include <optional>
#include <sstream>

#include "core/allocator.h"
#include "core/rng.h"
#include "ops/autocast.h"
#include "train/loop.h"
#include "train/memory_model.h"

namespace kiln {

namespace {

// Where a probe's batches come from: random images of one shape, or the training set through a
// loader like the trainer's (its prefetch thread and transforms allocate as in training).
struct BatchSource {
    ImageShape image;
    const DataLoader* train = nullptr;  // null: random images
};

// Steps of a micro-batch of `micro` images, as the trainer runs them: three data batches of
// accumulate·micro images, each trained as its micro-batches' forward and backward
// (train_step's forward_backward on their rows) without the optimizer's step, which allocates
// nothing — the later steps with the pool's blocks cached by the first, and with a second data
// batch alive, as the loader's thread builds the next one while a step runs (the probes' own
// loader has no thread, so that they allocate in the same order every time). In an arena of its own, reset after each micro-batch, or
// from the pool, as `options` says; all from an empty pool cache. Returns the peak, or 0 if it
// ran out of memory. After a failure the layers may still hold cached tensors of the failed
// forward; those of the probe's arena belonged to it, which is gone by then, so dropping them
// later frees nothing (Allocator::deallocate_if_alive), and the next forward replaces them.
int64_t probe(Module& model, const BatchSource& source, Device device, int64_t micro, const BatchProbeOptions& options) {
    pool_allocator(device).empty_cache();  // each probe as in a fresh run: no blocks an earlier one cached
    reset_phase_peak(device);
    const int64_t K = options.accumulate, batch = micro * K;
    try {
        std::optional<BumpAllocator> arena;  // declared first: outlives the batches
        if (options.arena) arena.emplace("probe arena", device);
        std::optional<DataLoader> loader;
        if (source.train) {  // without its thread, so that the probes (and the answer) are repeatable
            LoaderOptions o = source.train->options();
            o.batch_size = batch, o.rank = 0, o.world_size = 1, o.drop_last = true, o.prefetch = false;
            loader.emplace(source.train->set(), o);
            loader->start_epoch(0);
        }
        const ImageShape im = source.image;
        Rng rng{uint64_t(batch)};
        Batch b;
        for (int step = 0; step < 3; step++) {
            if (loader) {
                if (!loader->next(b)) break;  // a training set of fewer than three batches
            } else {
                b.x = Tensor::normal({batch, im.c, im.h, im.w}, 0.0f, 1.0f, rng, device, Category::Data);
                b.y = Tensor::zeros({batch}, DType::I32, device, Category::Data);
            }
            // the batch the loader's thread builds while this step runs, in training
            const Tensor next = Tensor::empty(b.x.shape(), b.x.dtype(), device, Category::Data);
            const size_t x_row = b.x.nbytes() / size_t(batch), y_row = b.y.nbytes() / size_t(batch);
            for (int64_t i = 0; i < K; i++) {
                forward_backward(model, b.x.view(size_t(i * micro) * x_row, {micro, im.c, im.h, im.w}),
                                 b.y.view(size_t(i * micro) * y_row, {micro}), 1.0f / float(K),
                                 arena ? &*arena : nullptr);
                if (arena) arena->reset();
            }
        }
        b = Batch{};
        model.zero_grad();
        return device_peaks(device).phase_peak;
    } catch (const OutOfMemory&) {
        model.zero_grad();
        return 0;
    }
}

// The search (see batch_size.h) over micro-batches, each probed from `source`.
BatchSearch search(Module& model, const BatchSource& source, Device device, int64_t max_batch,
                   const BatchProbeOptions& options) {
    const int64_t K = options.accumulate;
    KILN_CHECK(K >= 1 && max_batch >= K, "find_batch_size: max_batch must be at least the ", K,
               " micro-batches of --accumulate, got ", max_batch);
    // the optimizer's state, as it will be from the first step on
    std::vector<std::vector<Tensor>> state;
    if (options.optimizer && options.optimizer->steps() == 0)
        for (int k = 0; k < state_slabs(optimizer_kind(*options.optimizer)); k++)
            state.push_back(state_slab(*options.optimizer));
    // the running statistics the probes' forwards update, put back at the end
    std::map<std::string, Tensor> buffers;
    for (auto& [name, t] : model.named_buffers()) buffers[name] = t->clone();
    const bool input_needs_grad = model.input_needs_grad;
    model.input_needs_grad = false;  // as in a training step: the input is data
    model.train();

    BatchSearch s;
    auto run = [&](int64_t m) {  // a micro-batch of m images: a step of K·m
        const int64_t peak = probe(model, source, device, m, options);
        s.probes.push_back({K * m, peak > 0, peak});
        if (peak > 0 && K * m > s.largest) s.largest = K * m, s.peak = peak;
        return peak > 0;
    };
    const int64_t max_micro = max_batch / K;
    int64_t lo = 0, hi = 0;  // micro-batches: lo fits (0: none known), hi does not (0: none found)
    for (int64_t m = 1; hi == 0 && lo < max_micro; m = std::min(2 * m, max_micro)) {
        if (run(m)) lo = m;
        else hi = m;
    }
    while (hi - lo > 1) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (run(mid)) lo = mid;
        else hi = mid;
    }

    for (auto& [name, t] : model.named_buffers()) t->copy_from(buffers.at(name));
    model.input_needs_grad = input_needs_grad;
    return s;
}

}  // namespace

BatchSearch find_batch_size(Module& model, const ImageShape& image, Device device, int64_t max_batch,
                            const BatchProbeOptions& options) {
    return search(model, BatchSource{image, nullptr}, device, max_batch, options);
}

BatchSearch find_batch_size(Module& model, const DataLoader& train, const BatchProbeOptions& options) {
    return search(model, BatchSource{train.image_shape(), &train}, train.options().device, train.size(), options);
}

std::string describe(const BatchSearch& search, int64_t limit, int accumulate) {
    std::ostringstream os;
    const std::string budget = limit > 0 ? "--mem-limit " + format_bytes(limit) : "this machine's memory";
    // "128 (4 micro-batches of 32)" with --accumulate 4, "128" without
    const auto batch = [&](int64_t b) {
        return std::to_string(b) + (accumulate > 1 ? " (" + std::to_string(accumulate) + " micro-batches of " +
                                                         std::to_string(b / accumulate) + ")"
                                                   : "");
    };
    os << "finding the largest batch that fits in " << budget << ":\n";
    for (const BatchProbe& p : search.probes)
        os << "  batch " << batch(p.batch) << ": " << (p.fits ? "fits, peak " + format_bytes(p.peak) : "out of memory")
           << "\n";
    if (search.largest == 0)
        os << "not even one image fits: the model alone fills " << budget << "\n";
    else
        os << "largest batch: " << batch(search.largest) << " (peak " << format_bytes(search.peak) << ")\n";
    return os.str();
}

void print_largest_batch(Module& model, const Optimizer& optimizer, const DataLoader& train,
                         const BatchProbeOptions& options) {
    const Device device = train.options().device;
    const ImageShape image = train.image_shape();
    BatchSearch s;
    {
        std::optional<AutocastScope> autocast;  // the weights' low copies, made by the first probe
        if (options.amp != DType::F32) autocast.emplace(options.amp);
        s = find_batch_size(model, train, options);
    }
    std::printf("%s", describe(s, memory_limit(device), options.accumulate).c_str());
    if (s.largest == 0) return;
    // beside it, the prediction from the shapes alone (train/memory_model.h), for the probes' step
    const int64_t micro = s.largest / options.accumulate;
    try {
        const MemoryPrediction p = predict_memory(
            model, memory_model_options(model, optimizer, Shape{micro, image.c, image.h, image.w}, device, options.arena,
                                        options.amp));
        std::printf("predicted from the shapes alone for %s %lld: peak %s in %s (%s)\n",
                    options.accumulate > 1 ? "a micro-batch of" : "batch", (long long)micro,
                    format_bytes(p.peak).c_str(), p.peak_module.c_str(), phase_name(p.peak_phase));
    } catch (const Error& e) {
        std::printf("no prediction for this model: %s\n", e.what());
    }
}

}  // namespace kiln
