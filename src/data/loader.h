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
// Each pixel becomes x = (pixel / 255 − mean[c]) / std[c] (Normalize), then the image goes
// through the transforms in order (transforms.h: RandomCrop, RandomHorizontalFlip, Resize,
// CenterCrop). The order and the random augmentations depend only on the seed, the epoch
// and the position, so a run can be repeated exactly (and resumed: position(), seek()).
//
// With prefetch on (the default) the loader prepares the next batch on a background thread
// while the current one trains; with on_device the GPU makes each batch instead. Its memory (Category::Data, from the CPU pool) is taken when the
// current batch is handed out, so a step's memory in use does not depend on the thread's pace.
#pragma once
#include <future>
#include <memory>
#include <vector>

#include "core/cuda_memory.h"
#include "core/tensor.h"
#include "data/image_set.h"
#include "data/transforms.h"
#include "ops/augment.h"

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
    Transforms transforms = {};       // applied in order after Normalize
    bool prefetch = true;             // build the next batch on a background thread
    // Alternating flip (airbench, chapter 13), before the transforms: a fixed random half of the
    // images (from seed) is mirrored in even epochs, the other half in odd ones, so that every
    // image is seen both ways in any two epochs in a row — where independent random flips leave
    // a quarter of them unmirrored or mirrored twice running.
    bool alternating_flip = false;
    // Data parallel training (chapter 12), as PyTorch's DistributedSampler: each epoch's order
    // of all N images (from seed and epoch, the same on every rank) is padded to a multiple of
    // world_size by repeating its first images, and rank r takes positions r, r + world_size,
    // r + 2·world_size, … — ⌈N / world_size⌉ images, the same count on every rank. A batch of
    // B on each of p ranks then holds the same images as one batch of p·B in the one-process
    // order, and every image is augmented as it would be there (by its position in that order).
    int rank = 0, world_size = 1;
    // Build each batch on the GPU (device CUDA; chapter 13, as airbench does): the set's bytes go
    // up once (N·C·H·W bytes of Category::Data, kept while the loader lives), and per batch only
    // the plan does — which image, its crop, shift and flips, its label: 8 bytes an image and 16
    // a window — and one kernel (ops/augment.h) makes the f32 batch from them: the CPU's
    // batch, bit for bit, without the CPU's work or the upload of 4 bytes a pixel. Every
    // transform must be a window (a crop, a shift or a flip: Transform::window); Resize is refused.
    bool on_device = false;
    // on_device: the set's bytes already on the GPU — another loader's device_set() for the same
    // ImageSet — shared instead of uploaded again (the test-time views of chapter 13: six loaders,
    // one copy of the test set). Empty: this loader uploads its own.
    Tensor device_set = {};
};

class DataLoader {
public:
    DataLoader(const ImageSet& set, LoaderOptions options);
    ~DataLoader();
    DataLoader(const DataLoader&) = delete;
    DataLoader& operator=(const DataLoader&) = delete;
    void start_epoch(int64_t epoch);   // reorders (if shuffle) and rewinds
    bool next(Batch& batch);           // false once the epoch is over
    int64_t num_batches() const;       // per epoch
    int64_t position() const { return pos_; }  // images handed out this epoch (of this rank's share)
    int64_t size() const { return int64_t(order_.size()); }  // images per epoch: N, or this rank's share
    void seek(int64_t position);       // continue an epoch from a checkpoint
    void reseed(uint64_t seed);        // another seed (a checkpoint's); then start_epoch
    const ImageSet& set() const { return set_; }
    const LoaderOptions& options() const { return opt_; }
    ImageShape image_shape() const { return out_shape_; }  // after the transforms
    const Tensor& device_set() const { return device_pixels_; }  // on_device: the set's bytes on the GPU

private:
    // Where image `position` of this epoch's order (this rank's share) comes from, and how it is
    // augmented: the stored image, whether the alternating flip mirrors it, the transforms' bits.
    struct ImagePlan {
        int64_t source;
        bool mirrored;
        uint64_t bits;
    };
    ImagePlan plan_of(int64_t position) const;
    Batch make_batch(int64_t start, int64_t count, bool parallel) const;  // on the CPU
    Batch empty_batch(int64_t count) const;                                 // its tensors, not yet filled
    void fill_batch(Batch& batch, int64_t start, bool parallel) const;      // images start, start + 1, ...
    void drop_prefetch();
    void upload_set();                                          // on_device: the bytes, once
    void device_batch(int64_t start, int64_t count, Batch& batch);  // on_device: one kernel

    const ImageSet& set_;
    LoaderOptions opt_;
    ImageShape out_shape_;
    std::vector<int64_t> order_;
    int64_t epoch_ = 0, pos_ = 0;
    std::future<Batch> pending_;  // the batch that starts at pending_start_
    int64_t pending_start_ = -1;
    // The thread that builds the next batch: one for the loader's life, started with the first
    // prefetch, not one per batch — each new thread pays its start, and the CUDA emulator's
    // __shared__ arrays are thread-local storage: megabytes cleared per thread.
    class Prefetcher;
    std::unique_ptr<Prefetcher> prefetcher_;
    std::unique_ptr<cuda::PinnedStaging> staging_;  // Device::CUDA: batches go up without a wait
    Tensor device_pixels_;                           // on_device: the set's bytes on the GPU
    AugmentGeometry geometry_;                       // on_device: the windows' sizes, Normalize
};

// n images spread evenly over the set — image ⌊i·N/n⌋ for i < n — (all of them if n ≤ 0 or
// n ≥ N): the trainers' --limit. Spread, not the first n, so that a set stored class by class
// (CIFAR-10's image folders) keeps every class.
ImageSet take_spread(const ImageSet& set, int64_t n);

}  // namespace kiln
