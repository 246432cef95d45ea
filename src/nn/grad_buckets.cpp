// grad_buckets.cpp — buckets of the gradient slab, and a count of the finished ones (grad_buckets.h).
#include "nn/grad_buckets.h"

#include <algorithm>

#include "core/error.h"

namespace kiln {

std::vector<GradBucket> plan_buckets(const std::vector<Parameter*>& params,
                                     const std::vector<std::pair<int64_t, int64_t>>& ranges, int64_t total,
                                     int64_t bucket_elements, const std::vector<bool>& starts_unit) {
    KILN_CHECK(params.size() == ranges.size() && !params.empty() && bucket_elements > 0, "plan_buckets: ",
               params.size(), " parameters, ", ranges.size(), " ranges, bucket of ", bucket_elements,
               " elements: want as many ranges as parameters, at least one, and a positive bucket size");
    std::vector<GradBucket> buckets;
    GradBucket b{0, total, {}};
    for (size_t i = params.size(); i-- > 0;) {
        b.params.push_back(params[i]);
        b.begin = ranges[i].first;
        const bool full = b.end - b.begin >= bucket_elements || (!starts_unit.empty() && starts_unit.at(i));
        if (full || i == 0) {
            if (i == 0) b.begin = 0;  // the first bucket reaches the slab's start
            buckets.push_back(b);
            b = GradBucket{0, b.begin, {}};
        }
    }
    return buckets;
}

std::vector<GradBucket> plan_model_buckets(Module& model, int64_t bucket_bytes) {
    KILN_CHECK(bucket_bytes > 0, model.name(), ": the bucket size must be positive, got ", bucket_bytes, " bytes");
    Tensor slab = model.grads_view();
    slab = slab.view(0, {slab.numel()});
    std::vector<Parameter*> params;
    std::vector<std::pair<int64_t, int64_t>> ranges;
    for (auto& [name, p] : model.named_parameters()) {
        const int64_t at = offset_in_slab(p->grad, slab);
        params.push_back(p);
        ranges.push_back({at, at + p->grad.numel()});
    }
    return plan_buckets(params, ranges, slab.numel(), std::max<int64_t>(1, bucket_bytes / 4));
}

int64_t offset_in_slab(const Tensor& view, const Tensor& slab) {
    return (static_cast<const char*>(view.raw()) - static_cast<const char*>(slab.raw())) / int64_t(sizeof(float));
}

std::map<std::string, std::vector<Parameter*>> parameters_by_owner(Module& model) {
    std::map<std::string, std::vector<Parameter*>> owned;
    for (auto& [name, p] : model.named_parameters()) {
        const size_t dot = name.rfind('.');
        owned[dot == std::string::npos ? std::string() : name.substr(0, dot)].push_back(p);
    }
    return owned;
}

BucketReadiness::BucketReadiness(Module& model, const std::vector<GradBucket>& buckets, AfterLayer after_layer)
    : after_layer_(std::move(after_layer)) {
    for (size_t b = 0; b < buckets.size(); b++) {
        size_.push_back(int(buckets[b].params.size()));
        for (const Parameter* p : buckets[b].params) bucket_of_[p] = b;
    }
    reset();
    for (auto& [path, ps] : parameters_by_owner(model)) {
        std::vector<size_t> of;  // the bucket of each parameter the module owns
        for (const Parameter* p : ps)
            if (bucket_of_.count(p)) of.push_back(bucket_of_.at(p));
        if (of.empty()) continue;
        hooks_.push_back(model.module_at(path).register_backward_hook([this, of](Module&, const Tensor&, Tensor&) {
            std::vector<size_t> finished;
            for (size_t b : of)
                if (--waiting_[b] == 0) finished.push_back(b);
            after_layer_(finished);
        }));
    }
}

BucketReadiness::~BucketReadiness() {
    for (HookHandle& h : hooks_) h.remove();
}

void BucketReadiness::reset() { waiting_ = size_; }

}  // namespace kiln
