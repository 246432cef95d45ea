// loader.cpp — shuffling, batching and normalizing an ImageSet.
#include "data/loader.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <numeric>
#include <thread>

#include "core/parallel.h"
#include "core/rng.h"

namespace kiln {

DataLoader::DataLoader(const ImageSet& set, LoaderOptions options) : set_(set), opt_(std::move(options)) {
    KILN_CHECK(opt_.batch_size > 0, "DataLoader: batch size must be positive, got ", opt_.batch_size);
    KILN_CHECK(set_.n > 0, "DataLoader: the data set is empty");
    KILN_CHECK(opt_.mean.size() == opt_.std.size() && (opt_.mean.empty() || int64_t(opt_.mean.size()) == set_.c),
               "DataLoader: mean and std need one value per channel (", set_.c, "), got ", opt_.mean.size(), " and ",
               opt_.std.size());
    for (float s : opt_.std) KILN_CHECK(s > 0.0f, "DataLoader: std must be positive, got ", s);
    KILN_CHECK(opt_.world_size >= 1 && opt_.rank >= 0 && opt_.rank < opt_.world_size, "DataLoader: rank ", opt_.rank,
               " of a world of ", opt_.world_size, ": the rank must be in [0, world size)");
    out_shape_ = {set_.c, set_.h, set_.w};
    for (auto& t : opt_.transforms) out_shape_ = t->output_shape(out_shape_);
    if (opt_.on_device) upload_set();
    start_epoch(0);
}

namespace {

// Normalize: x = (pixel / 255 − mean[c]) / std[c]  =  pixel · scale[c] + shift[c], one fma.
struct Normalize {
    std::vector<float> scale, shift;
};
Normalize normalize_of(const LoaderOptions& o, int64_t channels) {
    Normalize n{std::vector<float>(size_t(channels), 1.0f / 255.0f), std::vector<float>(size_t(channels), 0.0f)};
    for (int64_t c = 0; c < channels && !o.mean.empty(); c++) {
        n.scale[size_t(c)] = 1.0f / (255.0f * o.std[size_t(c)]);
        n.shift[size_t(c)] = -o.mean[size_t(c)] / o.std[size_t(c)];
    }
    return n;
}

}  // namespace

// on_device: the windows' sizes and Normalize for the kernel, then the set's bytes, once (or
// another loader's, LoaderOptions::device_set).
void DataLoader::upload_set() {
    const int64_t windows = int64_t(opt_.alternating_flip) + int64_t(opt_.transforms.size());
    KILN_CHECK(opt_.device == Device::CUDA, "DataLoader: on_device builds batches on a GPU: set device to cuda");
    KILN_CHECK(set_.c <= kMaxAugmentChannels && windows <= kMaxWindows, "DataLoader: on_device takes images of at most ",
               kMaxAugmentChannels, " channels through at most ", kMaxWindows, " windows, got ", set_.c, " and ",
               windows, ": build the batches on the CPU (on_device = false)");
    const Normalize n = normalize_of(opt_, set_.c);
    AugmentGeometry& g = geometry_;
    g.channels = int32_t(set_.c);
    g.windows = int32_t(windows);
    std::copy(n.scale.begin(), n.scale.end(), g.scale);
    std::copy(n.shift.begin(), n.shift.end(), g.shift);
    ImageShape s{set_.c, set_.h, set_.w};
    g.h[0] = int32_t(s.h), g.w[0] = int32_t(s.w);
    int k = 0;
    if (opt_.alternating_flip) ++k, g.h[k] = g.h[0], g.w[k] = g.w[0];
    for (size_t t = 0; t < opt_.transforms.size(); t++) {
        ImageWindow unused;
        KILN_CHECK(opt_.transforms[t]->window(s, 0, &unused), "DataLoader: on_device builds batches with crops, ",
                   "shifts and flips, and transform ", t + 1, " of ", opt_.transforms.size(),
                   " is none of them (a Resize?): build the batches on the CPU (on_device = false)");
        s = opt_.transforms[t]->output_shape(s);
        ++k, g.h[k] = int32_t(s.h), g.w[k] = int32_t(s.w);
    }
    const Tensor& shared = opt_.device_set;
    if (shared.defined()) {  // another loader's copy of this set
        KILN_CHECK(shared.device() == Device::CUDA && shared.dtype() == DType::U8 &&
                       shared.numel() == int64_t(set_.pixels.size()),
                   "DataLoader: device_set must be the bytes of this set on the GPU (", set_.pixels.size(),
                   " u8 on cuda), got ", shared.numel(), " ", dtype_name(shared.dtype()), " on ",
                   device_name(shared.device()), ": pass device_set() of a loader of the same set");
        device_pixels_ = shared;
        return;
    }
    device_pixels_ = Tensor::empty({int64_t(set_.pixels.size())}, DType::U8, Device::CUDA, Category::Data);
    cuda::copy_to_device(device_pixels_.raw(), set_.pixels.data(), set_.pixels.size());
}

// One background thread running one job at a time: submit() hands it a job and returns its
// result's future; the thread waits for the next job in between.
class DataLoader::Prefetcher {
public:
    Prefetcher() : thread_([this] { run(); }) {}
    ~Prefetcher() {
        {
            std::lock_guard<std::mutex> lock(mu_);
            stop_ = true;
        }
        cv_.notify_all();
        thread_.join();
    }
    std::future<Batch> submit(std::function<Batch()> job) {
        std::packaged_task<Batch()> task(std::move(job));
        std::future<Batch> result = task.get_future();
        {
            std::lock_guard<std::mutex> lock(mu_);
            task_ = std::move(task);
            has_task_ = true;
        }
        cv_.notify_all();
        return result;
    }

private:
    void run() {
        for (;;) {
            std::packaged_task<Batch()> task;
            {
                std::unique_lock<std::mutex> lock(mu_);
                cv_.wait(lock, [&] { return has_task_ || stop_; });
                if (!has_task_) return;
                task = std::move(task_);
                has_task_ = false;
            }
            task();  // an exception goes into the future
        }
    }
    std::mutex mu_;
    std::condition_variable cv_;
    std::packaged_task<Batch()> task_;
    bool has_task_ = false, stop_ = false;
    std::thread thread_;  // last: it starts once the rest exists
};

DataLoader::~DataLoader() { drop_prefetch(); }

void DataLoader::drop_prefetch() {
    if (pending_.valid()) pending_.wait();
    pending_ = {};
    pending_start_ = -1;
}

// Fisher–Yates shuffle driven by a stream seeded with (seed, epoch): every epoch has its own
// order, and epoch e's order is the same in every run. With world_size p > 1 this rank keeps
// every p-th position of it (LoaderOptions::rank).
void DataLoader::start_epoch(int64_t epoch) {
    drop_prefetch();
    std::vector<int64_t> all(size_t(set_.n));
    std::iota(all.begin(), all.end(), 0);
    if (opt_.shuffle) {
        Rng rng(splitmix64(opt_.seed) ^ uint64_t(epoch));
        for (int64_t i = set_.n - 1; i > 0; i--) std::swap(all[size_t(i)], all[rng.next_below(uint64_t(i + 1))]);
    }
    const int64_t p = opt_.world_size, share = (set_.n + p - 1) / p;
    order_.resize(size_t(share));
    for (int64_t i = 0; i < share; i++) order_[size_t(i)] = all[size_t((i * p + opt_.rank) % set_.n)];
    epoch_ = epoch;
    pos_ = 0;
}

int64_t DataLoader::num_batches() const {
    return opt_.drop_last ? size() / opt_.batch_size : (size() + opt_.batch_size - 1) / opt_.batch_size;
}

void DataLoader::seek(int64_t position) {
    KILN_CHECK(position >= 0 && position <= size(), "DataLoader::seek(", position, "): outside [0, ", size(), "]");
    drop_prefetch();
    pos_ = position;
}

void DataLoader::reseed(uint64_t seed) {
    drop_prefetch();  // a batch made with the old seed
    opt_.seed = seed;
}

// Images order_[start .. start+count) as one batch: Normalize, then the transforms.
Batch DataLoader::make_batch(int64_t start, int64_t count, bool parallel) const {
    Batch batch = empty_batch(count);
    fill_batch(batch, start, parallel);
    return batch;
}

Batch DataLoader::empty_batch(int64_t count) const {
    const ImageShape o = out_shape_;
    return {Tensor::empty({count, o.c, o.h, o.w}, DType::F32, Device::CPU, Category::Data),
            Tensor::empty({count}, DType::I32, Device::CPU, Category::Data)};
}

DataLoader::ImagePlan DataLoader::plan_of(int64_t position) const {
    const Rng augment(splitmix64(opt_.seed) + 1);    // the augmentations' stream, apart from the order's
    const Rng flip_half(splitmix64(opt_.seed) + 2);  // alternating_flip: image i starts mirrored if bit 0 is set
    const int64_t source = order_[size_t(position)];
    // the image's position in the one-process order of the epoch (the same with any world size)
    const int64_t global = position * opt_.world_size + opt_.rank;
    return {source, opt_.alternating_flip && ((flip_half.at(uint64_t(source)) ^ uint64_t(epoch_)) & 1),
            augment.at(uint64_t(epoch_) * uint64_t(set_.n) + uint64_t(global))};
}

void DataLoader::fill_batch(Batch& batch, int64_t start, bool parallel) const {
    const int64_t C = set_.c, HW = set_.h * set_.w, count = batch.size();
    const ImageShape o = out_shape_;
    float* xp = batch.x.data<float>();
    int32_t* yp = batch.y.data<int32_t>();
    const Normalize n = normalize_of(opt_, C);
    bool chained = !opt_.transforms.empty();
    parallel_for(count, parallel ? grain_of(1 << 16, C * HW) : count, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; i++) {
            const ImagePlan plan = plan_of(start + i);
            const uint8_t* px = set_.pixels.data() + plan.source * C * HW;
            std::vector<float> cur(chained ? size_t(C * HW) : 0), next;
            float* first = chained ? cur.data() : xp + i * C * HW;
            for (int64_t c = 0; c < C; c++)
                for (int64_t k = 0; k < HW; k++)
                    first[c * HW + k] = std::fma(float(px[c * HW + k]), n.scale[size_t(c)], n.shift[size_t(c)]);
            ImageShape s{C, set_.h, set_.w};
            if (plan.mirrored)
                for (int64_t row = 0; row < C * set_.h; row++) std::reverse(first + row * set_.w, first + (row + 1) * set_.w);
            for (size_t t = 0; t < opt_.transforms.size(); t++) {
                ImageShape so = opt_.transforms[t]->output_shape(s);
                bool last = t + 1 == opt_.transforms.size();
                next.resize(last ? 0 : size_t(so.c * so.h * so.w));
                float* dst = last ? xp + i * o.c * o.h * o.w : next.data();
                opt_.transforms[t]->apply(cur.data(), s, dst, splitmix64(plan.bits + t));
                cur.swap(next);
                s = so;
            }
            yp[i] = set_.labels[size_t(plan.source)];
        }
    });
}

// on_device: the plan of each image (its source, its windows) and its label go up through the
// page-locked staging, then one kernel makes the batch from the bytes already on the GPU.
void DataLoader::device_batch(int64_t start, int64_t count, Batch& batch) {
    const int64_t S = geometry_.windows;
    std::vector<ImageWindow> windows(size_t(std::max<int64_t>(1, count * S)));
    std::vector<int32_t> source(static_cast<size_t>(count)), labels(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; i++) {
        const ImagePlan plan = plan_of(start + i);
        source[size_t(i)] = int32_t(plan.source);
        labels[size_t(i)] = set_.labels[size_t(plan.source)];
        ImageWindow* w = windows.data() + i * S;
        if (opt_.alternating_flip) *w++ = ImageWindow{0, 0, plan.mirrored, 0};
        const int first = opt_.alternating_flip;  // geometry_'s sizes: before transform t, [first + t]
        for (size_t t = 0; t < opt_.transforms.size(); t++) {
            const ImageShape s{set_.c, geometry_.h[first + int(t)], geometry_.w[first + int(t)]};
            opt_.transforms[t]->window(s, splitmix64(plan.bits + t), w++);
        }
    }
    const size_t window_bytes = windows.size() * sizeof(ImageWindow), index_bytes = size_t(count) * sizeof(int32_t);
    Tensor plan = Tensor::empty({int64_t(window_bytes + index_bytes)}, DType::U8, Device::CUDA, Category::Data);
    batch.x = Tensor::empty({count, out_shape_.c, out_shape_.h, out_shape_.w}, DType::F32, Device::CUDA, Category::Data);
    batch.y = Tensor::empty({count}, DType::I32, Device::CUDA, Category::Data);
    if (!staging_) staging_ = std::make_unique<cuda::PinnedStaging>();
    staging_->begin(window_bytes + 2 * index_bytes);
    auto* device_windows = static_cast<ImageWindow*>(plan.raw());
    auto* device_source = reinterpret_cast<int32_t*>(static_cast<char*>(plan.raw()) + window_bytes);
    staging_->copy_to_device(device_windows, windows.data(), window_bytes);
    staging_->copy_to_device(device_source, source.data(), index_bytes);
    staging_->copy_to_device(batch.y.raw(), labels.data(), index_bytes);
    cuda::augment_images(device_pixels_.data<uint8_t>(), device_source, device_windows, geometry_, count,
                         batch.x.data<float>());
}  // `plan` goes back to the pool; the kernel queued before it reads it first (one stream)

bool DataLoader::next(Batch& batch) {
    auto count_at = [this](int64_t start) {
        int64_t B = std::min(opt_.batch_size, size() - start);
        return (B <= 0 || (opt_.drop_last && B < opt_.batch_size)) ? int64_t(0) : B;
    };
    int64_t B = count_at(pos_);
    if (B == 0) return false;
    if (opt_.on_device) {  // no CPU batch, no prefetch: the GPU makes it
        device_batch(pos_, B, batch);
        pos_ += B;
        return true;
    }
    Batch host;
    if (pending_.valid() && pending_start_ == pos_) host = pending_.get();
    else host = make_batch(pos_, B, true);
    pos_ += B;
    pending_ = {};
    pending_start_ = -1;
    if (int64_t nb = count_at(pos_); opt_.prefetch && nb > 0) {  // start on the next batch now
        pending_start_ = pos_;
        if (!prefetcher_) prefetcher_ = std::make_unique<Prefetcher>();
        // The next batch's memory is taken here, from the pool as the thread would take it, and
        // the thread only fills it: so the batch is in use from now on, whether the thread is
        // quick or slow, and a step's peak in use is the same in every run.
        Batch ahead = [&] {
            AllocatorScope pool(pool_allocator(Device::CPU));
            return empty_batch(nb);
        }();
        pending_ = prefetcher_->submit([this, start = pos_, ahead]() mutable {
            fill_batch(ahead, start, false);
            return ahead;
        });
    }
    if (opt_.device != Device::CUDA) {
        batch = host;
        return true;
    }
    if (!staging_) staging_ = std::make_unique<cuda::PinnedStaging>();
    staging_->begin(host.x.nbytes() + host.y.nbytes());
    for (auto [from, to] : {std::pair{&host.x, &batch.x}, std::pair{&host.y, &batch.y}}) {
        *to = Tensor::empty(from->shape(), from->dtype(), Device::CUDA, from->category());
        staging_->copy_to_device(to->raw(), from->raw(), from->nbytes());
    }
    return true;
}

ImageSet take_spread(const ImageSet& set, int64_t n) {
    if (n <= 0 || n >= set.n) return set;
    ImageSet s;
    s.n = n;
    s.c = set.c;
    s.h = set.h;
    s.w = set.w;
    s.classes = set.classes;
    const int64_t image = set.c * set.h * set.w;
    s.pixels.resize(size_t(n * image));
    for (int64_t i = 0; i < n; i++) {
        int64_t src = i * set.n / n;
        std::copy_n(set.pixels.begin() + src * image, image, s.pixels.begin() + i * image);
        s.labels.push_back(set.labels[size_t(src)]);
    }
    return s;
}

}  // namespace kiln
