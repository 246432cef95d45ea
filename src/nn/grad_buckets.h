// grad_buckets.h — the gradient slab cut into buckets, and which of them backward has finished.
// Chapter 12's DataParallel (dist/data_parallel.h) all-reduces a bucket as soon as backward has
// finished it; chapter 15's offloaded optimizer (optim/offload.h) copies it to the host and
// updates it there. Both cut the slab the same way and learn the same way when a bucket is done:
// backward runs the last layer first, so the buckets are planned from the slab's end, and a
// backward hook on each layer that owns parameters counts them down.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "nn/module.h"

namespace kiln {

// A bucket: the elements [begin, end) of the gradient slab, the gradients of a run of
// consecutive parameters (padding between them included).
struct GradBucket {
    int64_t begin = 0, end = 0;
    std::vector<Parameter*> params;
};

// The buckets for parameters whose gradients lie at [ranges[i].first, ranges[i].second) of a
// slab of `total` elements, in slab (forward) order. From the last parameter back, a bucket is
// closed once it holds bucket_elements or more, or at a parameter i with starts_unit[i] (when
// given: ZeRO-3's layers, each its own bucket); together the buckets cover [0, total) with no
// gap, bucket 0 at the end of the slab.
std::vector<GradBucket> plan_buckets(const std::vector<Parameter*>& params,
                                     const std::vector<std::pair<int64_t, int64_t>>& ranges, int64_t total,
                                     int64_t bucket_elements, const std::vector<bool>& starts_unit = {});

// plan_buckets over a packed model's gradient slab (Module::grads_view), every parameter in it.
std::vector<GradBucket> plan_model_buckets(Module& model, int64_t bucket_bytes);

// The element offset of a tensor that is a view into an f32 slab (a parameter's grad in the
// gradient slab, its value in the value slab).
int64_t offset_in_slab(const Tensor& view, const Tensor& slab);

// Each module that owns parameters, by its path in the tree, and the parameters it owns:
// "fc1.weight" belongs to "fc1" (the root's own parameters to ""). That module's backward is the
// last to write their gradients, its forward the first to read their values.
std::map<std::string, std::vector<Parameter*>> parameters_by_owner(Module& model);

// Which buckets backward has finished: a backward hook on each module that owns parameters of
// `buckets` counts them down, then calls after_layer with the buckets that module finished (often
// none). reset() before each backward that should count again.
class BucketReadiness {
public:
    using AfterLayer = std::function<void(const std::vector<size_t>& finished)>;
    BucketReadiness(Module& model, const std::vector<GradBucket>& buckets, AfterLayer after_layer);
    ~BucketReadiness();  // takes its hooks off the model (which must outlive it)
    BucketReadiness(const BucketReadiness&) = delete;
    BucketReadiness& operator=(const BucketReadiness&) = delete;

    bool finished(size_t bucket) const { return waiting_[bucket] == 0; }
    void reset();

private:
    std::vector<int> size_, waiting_;  // per bucket: its parameters, those not yet finished
    std::map<const Parameter*, size_t> bucket_of_;
    std::vector<HookHandle> hooks_;
    AfterLayer after_layer_;
};

}  // namespace kiln
