// data_parallel.cpp — buckets of the gradient slab all-reduced as backward produces them
// (data_parallel.h).
#include "dist/data_parallel.h"

#include <chrono>
#include <map>

#include "core/error.h"
#include "ops/ops.h"

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

void broadcast_model(Module& model, Communicator& comm) {
    const auto buffers = model.named_buffers();
    const std::vector<int64_t> counts = comm.gather_all(model.num_parameters()),
                               nbuffers = comm.gather_all(int64_t(buffers.size()));
    for (int r = 1; r < comm.size(); r++)
        KILN_CHECK(counts[size_t(r)] == counts[0] && nbuffers[size_t(r)] == nbuffers[0], "data parallel: rank ", r,
                   " built a model of ", counts[size_t(r)], " parameters and ", nbuffers[size_t(r)],
                   " buffers, rank 0 one of ", counts[0], " and ", nbuffers[0],
                   ": start every rank with the same flags (mpirun runs one command on all of them)");
    comm.broadcast(model.values_view(), 0);
    broadcast_buffers(model, comm);
}

void broadcast_buffers(Module& model, Communicator& comm) {
    for (auto& [name, buffer] : model.named_buffers()) comm.broadcast(*buffer, 0);
}

int64_t offset_in_slab(const Tensor& view, const Tensor& slab) {
    return (static_cast<const char*>(view.raw()) - static_cast<const char*>(slab.raw())) / int64_t(sizeof(float));
}

DataParallel::DataParallel(Module& model, Communicator& comm, DataParallelOptions options)
    : model_(model), comm_(comm), opt_(options) {
    KILN_CHECK(model.packed(), model.name(), ": data parallel training all-reduces the gradient slab; pack() the "
                                             "model first (the chapter models come packed)");
    KILN_CHECK(opt_.bucket_bytes > 0, "data parallel: the bucket size must be positive, got ", opt_.bucket_bytes);
    broadcast_model(model, comm);
    slab_ = model.grads_view();
    slab_ = slab_.view(0, {slab_.numel()});

    // Where each parameter's gradient lies in the slab, and which module owns it ("fc1.weight"
    // belongs to "fc1"): that module's backward hook says when the gradient is complete.
    const auto named = model.named_parameters();
    std::vector<Parameter*> params;
    std::vector<std::pair<int64_t, int64_t>> ranges;
    std::map<std::string, std::vector<Parameter*>> owned;
    for (auto& [name, p] : named) {
        const int64_t at = offset_in_slab(p->grad, slab_);
        params.push_back(p);
        ranges.push_back({at, at + p->grad.numel()});
        const size_t dot = name.rfind('.');
        owned[dot == std::string::npos ? std::string() : name.substr(0, dot)].push_back(p);
    }
    buckets_ = plan_buckets(params, ranges, slab_.numel(), std::max<int64_t>(1, opt_.bucket_bytes / 4));
    for (size_t b = 0; b < buckets_.size(); b++)
        for (Parameter* p : buckets_[b].params) bucket_of_[p] = b;
    waiting_.resize(buckets_.size());
    requests_.resize(buckets_.size());
    for (size_t b = 0; b < buckets_.size(); b++) waiting_[b] = int(buckets_[b].params.size());

    if (opt_.overlap)
        for (auto& [path, ps] : owned)
            hooks_.push_back(model.module_at(path).register_backward_hook(
                [this, ps = ps](Module&, const Tensor&, Tensor&) {
                    for (Parameter* p : ps) param_ready(p);
                    start_ready_buckets();
                    comm_.progress();
                }));
    hooks_.push_back(model.register_backward_hook([this](Module&, const Tensor&, Tensor&) { finish_backward(); }));
    if (opt_.broadcast_buffers && !model.named_buffers().empty())
        hooks_.push_back(model.register_forward_pre_hook([this](Module& m, const Tensor&) {
            if (m.keeps_cache()) broadcast_buffers(model_, comm_);
        }));
}

DataParallel::~DataParallel() {
    for (HookHandle& h : hooks_) h.remove();
}

void DataParallel::param_ready(Parameter* p) { waiting_[bucket_of_.at(p)]--; }

// Buckets start in order 0, 1, … (every rank must start the same collectives in the same
// order): a bucket whose gradients are ready waits for the ones before it.
void DataParallel::start_ready_buckets() {
    while (started_ < buckets_.size() && waiting_[started_] == 0) start(started_);
}

void DataParallel::start(size_t b) {
    const GradBucket& bucket = buckets_[b];
    requests_[b] = comm_.all_reduce_start(slab_.view(size_t(bucket.begin) * sizeof(float), {bucket.end - bucket.begin}));
    stats_.all_reduces++;
    stats_.bytes += (bucket.end - bucket.begin) * int64_t(sizeof(float));
    started_++;
}

// After the whole backward: g = (1/p) Σ_r g_r in every bucket.
void DataParallel::finish_backward() {
    const auto t0 = std::chrono::steady_clock::now();
    if (opt_.overlap) {
        while (started_ < buckets_.size()) start(started_);  // a parameter that got no gradient
        for (CommRequest r : requests_) comm_.wait(r);
    } else {
        comm_.all_reduce(slab_);
        stats_.all_reduces++;
        stats_.bytes += slab_.numel() * int64_t(sizeof(float));
    }
    stats_.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    scale_(slab_, 1.0f / float(comm_.size()));
    started_ = 0;
    for (size_t b = 0; b < buckets_.size(); b++) waiting_[b] = int(buckets_[b].params.size());
}

}  // namespace kiln
