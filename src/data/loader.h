// loader.h — turns an ImageSet (bytes) into batches of float tensors for training.
//
//   DataLoader loader(train_set, {.batch_size = 64, .shuffle = true, .seed = 1,
//                                 .mean = {0.1307f}, .std = {0.3081f}});
//   for (int epoch = 0; epoch < E; epoch++) {
//       loader.start_epoch(epoch);                 // a new order, fixed by (seed, epoch)
//       Batch b;
//       while (loader.next(b)) { ... b.x: f32[B, C, H, W], b.y: i32[B] ... }
//   }
//
// Each pixel becomes x = (pixel / 255 − mean[c]) / std[c]. The order depends only on the seed
// and the epoch, so a run can be repeated exactly (and resumed from a checkpoint: position()).
#pragma once
#include <vector>

#include "core/tensor.h"
#include "data/image_set.h"

namespace kiln {

struct Batch {
    Tensor x;  // f32[B, C, H, W], Category::Data
    Tensor y;  // i32[B]
    int64_t size() const { return x.defined() ? x.size(0) : 0; }
};

struct LoaderOptions {
    int64_t batch_size = 64;
    bool shuffle = true;
    bool drop_last = false;           // skip a last batch smaller than batch_size
    uint64_t seed = 0;
    std::vector<float> mean, std;     // per channel; empty = no normalization (x = pixel / 255)
    Device device = Device::CPU;      // where the batches go
};

class DataLoader {
public:
    DataLoader(const ImageSet& set, LoaderOptions options);
    void start_epoch(int64_t epoch);   // reorders (if shuffle) and rewinds
    bool next(Batch& batch);           // false once the epoch is over
    int64_t num_batches() const;       // per epoch
    int64_t position() const { return pos_; }  // images handed out this epoch
    void seek(int64_t position);       // continue an epoch from a checkpoint
    const ImageSet& set() const { return set_; }

private:
    const ImageSet& set_;
    LoaderOptions opt_;
    std::vector<int64_t> order_;
    int64_t pos_ = 0;
};

// The first n images of a set (all of them if n ≤ 0 or n ≥ N): the trainers' --limit.
ImageSet take_first(const ImageSet& set, int64_t n);

}  // namespace kiln
