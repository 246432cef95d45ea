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

// One forward and backward of `batch` random images (train_step's forward_backward), in an
// arena of its own and from an empty pool cache: the peak, or 0 if it ran out of memory. After a
// failure the layers may still hold cached tensors of the failed forward; they belonged to the
// probe's arena, which is gone by then, so dropping them later frees nothing
// (Allocator::deallocate_if_alive), and the next forward replaces them.
int64_t probe(Module& model, const ImageShape& image, Device device, int64_t batch) {
    pool_allocator(device).empty_cache();  // each probe as in a fresh run: no blocks an earlier one cached
    reset_phase_peak(device);
    try {
        BumpAllocator arena("probe arena", device);  // declared first: outlives the batch
        Rng rng{uint64_t(batch)};
        const Tensor x = Tensor::normal({batch, image.c, image.h, image.w}, 0.0f, 1.0f, rng, device, Category::Data);
        const Tensor y = Tensor::zeros({batch}, DType::I32, device, Category::Data);
        forward_backward(model, x, y, 1.0f, &arena);
        model.zero_grad();
        return device_peaks(device).phase_peak;
    } catch (const OutOfMemory&) {
        model.zero_grad();
        return 0;
    }
}

}  // namespace

BatchSearch find_batch_size(Module& model, const ImageShape& image, Device device, int64_t max_batch) {
    KILN_CHECK(max_batch >= 1, "find_batch_size: max_batch must be ≥ 1, got ", max_batch);
    // the running statistics the probes' forwards update, put back at the end
    std::map<std::string, Tensor> buffers;
    for (auto& [name, t] : model.named_buffers()) buffers[name] = t->clone();
    const bool input_needs_grad = model.input_needs_grad;
    model.input_needs_grad = false;  // as in a training step: the input is data
    model.train();

    BatchSearch s;
    auto run = [&](int64_t b) {
        const int64_t peak = probe(model, image, device, b);
        s.probes.push_back({b, peak > 0, peak});
        if (peak > 0 && b > s.largest) s.largest = b, s.peak = peak;
        return peak > 0;
    };
    int64_t lo = 0, hi = 0;  // lo fits (0: none known), hi does not (0: none found)
    for (int64_t b = 1; hi == 0 && lo < max_batch; b = std::min(2 * b, max_batch)) {
        if (run(b)) lo = b;
        else hi = b;
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

std::string describe(const BatchSearch& search, int64_t limit) {
    std::ostringstream os;
    const std::string budget = limit > 0 ? "--mem-limit " + format_bytes(limit) : "this machine's memory";
    os << "finding the largest batch that fits in " << budget << ":\n";
    for (const BatchProbe& p : search.probes)
        os << "  batch " << p.batch << ": " << (p.fits ? "fits, peak " + format_bytes(p.peak) : "out of memory") << "\n";
    if (search.largest == 0)
        os << "not even one image fits: the model alone fills " << budget << "\n";
    else
        os << "largest batch: " << search.largest << " (peak " << format_bytes(search.peak) << ")\n";
    return os.str();
}

void print_largest_batch(Module& model, const Optimizer& optimizer, const DataLoader& train, DType amp) {
    const Device device = train.options().device;
    const ImageShape image = train.image_shape();
    BatchSearch s;
    {
        std::optional<AutocastScope> autocast;  // the weights' low copies, made by the first probe
        if (amp != DType::F32) autocast.emplace(amp);
        s = find_batch_size(model, image, device, train.set().n);
    }
    std::printf("%s", describe(s, memory_limit(device)).c_str());
    if (s.largest == 0) return;
    // beside it, the prediction from the shapes alone (train/memory_model.h), in an arena as the probes ran
    try {
        const MemoryPrediction p = predict_memory(
            model, memory_model_options(model, optimizer, Shape{s.largest, image.c, image.h, image.w}, device, true, amp));
        std::printf("predicted from the shapes alone for batch %lld: peak %s in %s (%s)\n", (long long)s.largest,
                    format_bytes(p.peak).c_str(), p.peak_module.c_str(), phase_name(p.peak_phase));
    } catch (const Error& e) {
        std::printf("no prediction for this model: %s\n", e.what());
    }
}

}  // namespace kiln
