// loader.cpp — shuffling, batching and normalizing an ImageSet.
#include "data/loader.h"

#include <algorithm>
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
    start_epoch(0);
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

void DataLoader::fill_batch(Batch& batch, int64_t start, bool parallel) const {
    const int64_t C = set_.c, HW = set_.h * set_.w, count = batch.size();
    const ImageShape o = out_shape_;
    float* xp = batch.x.data<float>();
    int32_t* yp = batch.y.data<int32_t>();
    // Normalize: x = (pixel / 255 − mean[c]) / std[c]  =  pixel · a[c] + b[c]
    std::vector<float> a(size_t(C), 1.0f / 255.0f), b(size_t(C), 0.0f);
    for (int64_t c = 0; c < C && !opt_.mean.empty(); c++) {
        a[size_t(c)] = 1.0f / (255.0f * opt_.std[size_t(c)]);
        b[size_t(c)] = -opt_.mean[size_t(c)] / opt_.std[size_t(c)];
    }
    Rng augment(splitmix64(opt_.seed) + 1);  // the augmentations' stream, apart from the order's
    const Rng flip_half(splitmix64(opt_.seed) + 2);  // alternating_flip: image i starts mirrored if bit 0 is set
    bool chained = !opt_.transforms.empty();
    parallel_for(count, parallel ? grain_of(1 << 16, C * HW) : count, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; i++) {
            int64_t src = order_[size_t(start + i)];
            const uint8_t* px = set_.pixels.data() + src * C * HW;
            std::vector<float> cur(chained ? size_t(C * HW) : 0), next;
            float* first = chained ? cur.data() : xp + i * C * HW;
            for (int64_t c = 0; c < C; c++)
                for (int64_t k = 0; k < HW; k++) first[c * HW + k] = float(px[c * HW + k]) * a[size_t(c)] + b[size_t(c)];
            ImageShape s{C, set_.h, set_.w};
            if (opt_.alternating_flip && ((flip_half.at(uint64_t(src)) ^ uint64_t(epoch_)) & 1))
                for (int64_t row = 0; row < C * set_.h; row++) std::reverse(first + row * set_.w, first + (row + 1) * set_.w);
            // the image's position in the one-process order of the epoch (the same with any world size)
            const int64_t global = (start + i) * opt_.world_size + opt_.rank;
            uint64_t bits = augment.at(uint64_t(epoch_) * uint64_t(set_.n) + uint64_t(global));
            for (size_t t = 0; t < opt_.transforms.size(); t++) {
                ImageShape so = opt_.transforms[t]->output_shape(s);
                bool last = t + 1 == opt_.transforms.size();
                next.resize(last ? 0 : size_t(so.c * so.h * so.w));
                float* dst = last ? xp + i * o.c * o.h * o.w : next.data();
                opt_.transforms[t]->apply(cur.data(), s, dst, splitmix64(bits + t));
                cur.swap(next);
                s = so;
            }
            yp[i] = set_.labels[size_t(src)];
        }
    });
}

bool DataLoader::next(Batch& batch) {
    auto count_at = [this](int64_t start) {
        int64_t B = std::min(opt_.batch_size, size() - start);
        return (B <= 0 || (opt_.drop_last && B < opt_.batch_size)) ? int64_t(0) : B;
    };
    int64_t B = count_at(pos_);
    if (B == 0) return false;
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
