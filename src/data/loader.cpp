// loader.cpp — shuffling, batching and normalizing an ImageSet.
#include "data/loader.h"

#include <numeric>

#include "core/rng.h"

namespace kiln {

DataLoader::DataLoader(const ImageSet& set, LoaderOptions options) : set_(set), opt_(std::move(options)) {
    KILN_CHECK(opt_.batch_size > 0, "DataLoader: batch size must be positive, got ", opt_.batch_size);
    KILN_CHECK(set_.n > 0, "DataLoader: the data set is empty");
    KILN_CHECK(opt_.mean.size() == opt_.std.size() && (opt_.mean.empty() || int64_t(opt_.mean.size()) == set_.c),
               "DataLoader: mean and std need one value per channel (", set_.c, "), got ", opt_.mean.size(), " and ",
               opt_.std.size());
    for (float s : opt_.std) KILN_CHECK(s > 0.0f, "DataLoader: std must be positive, got ", s);
    start_epoch(0);
}

// Fisher–Yates shuffle driven by a stream seeded with (seed, epoch): every epoch has its own
// order, and epoch e's order is the same in every run.
void DataLoader::start_epoch(int64_t epoch) {
    order_.resize(size_t(set_.n));
    std::iota(order_.begin(), order_.end(), 0);
    if (opt_.shuffle) {
        Rng rng(splitmix64(opt_.seed) ^ uint64_t(epoch));
        for (int64_t i = set_.n - 1; i > 0; i--) std::swap(order_[size_t(i)], order_[rng.next_below(uint64_t(i + 1))]);
    }
    pos_ = 0;
}

int64_t DataLoader::num_batches() const {
    return opt_.drop_last ? set_.n / opt_.batch_size : (set_.n + opt_.batch_size - 1) / opt_.batch_size;
}

void DataLoader::seek(int64_t position) {
    KILN_CHECK(position >= 0 && position <= set_.n, "DataLoader::seek(", position, "): outside [0, ", set_.n, "]");
    pos_ = position;
}

bool DataLoader::next(Batch& batch) {
    int64_t B = std::min(opt_.batch_size, set_.n - pos_);
    if (B <= 0 || (opt_.drop_last && B < opt_.batch_size)) return false;
    int64_t C = set_.c, HW = set_.h * set_.w;
    Tensor x = Tensor::empty({B, C, set_.h, set_.w}, DType::F32, Device::CPU, Category::Data);
    Tensor y = Tensor::empty({B}, DType::I32, Device::CPU, Category::Data);
    float* xp = x.data<float>();
    int32_t* yp = y.data<int32_t>();
    // x = (pixel / 255 − mean[c]) / std[c]  =  pixel · a[c] + b[c]
    std::vector<float> a(size_t(C), 1.0f / 255.0f), b(size_t(C), 0.0f);
    for (int64_t c = 0; c < C && !opt_.mean.empty(); c++) {
        a[size_t(c)] = 1.0f / (255.0f * opt_.std[size_t(c)]);
        b[size_t(c)] = -opt_.mean[size_t(c)] / opt_.std[size_t(c)];
    }
#pragma omp parallel for schedule(static) if (B * C * HW > (1 << 16))
    for (int64_t i = 0; i < B; i++) {
        int64_t src = order_[size_t(pos_ + i)];
        const uint8_t* px = set_.pixels.data() + src * C * HW;
        for (int64_t c = 0; c < C; c++)
            for (int64_t k = 0; k < HW; k++)
                xp[(i * C + c) * HW + k] = float(px[c * HW + k]) * a[size_t(c)] + b[size_t(c)];
        yp[i] = set_.labels[size_t(src)];
    }
    pos_ += B;
    batch.x = x.to(opt_.device);
    batch.y = y.to(opt_.device);
    return true;
}

ImageSet take_first(const ImageSet& set, int64_t n) {
    if (n <= 0 || n >= set.n) return set;
    ImageSet s;
    s.n = n;
    s.c = set.c;
    s.h = set.h;
    s.w = set.w;
    s.pixels.assign(set.pixels.begin(), set.pixels.begin() + n * set.c * set.h * set.w);
    s.labels.assign(set.labels.begin(), set.labels.begin() + n);
    s.classes = set.classes;
    return s;
}

}  // namespace kiln
