// data_parallel.cpp — buckets of the gradient slab all-reduced as backward produces them
// (data_parallel.h).
#include "dist/data_parallel.h"

#include <chrono>

#include "core/error.h"
#include "ops/ops.h"

namespace kiln {

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

DataParallel::DataParallel(Module& model, Communicator& comm, DataParallelOptions options)
    : model_(model), comm_(comm), opt_(options) {
    KILN_CHECK(model.packed(), model.name(), ": data parallel training all-reduces the gradient slab; pack() the "
                                             "model first (the chapter models come packed)");
    KILN_CHECK(opt_.bucket_bytes > 0, "data parallel: the bucket size must be positive, got ", opt_.bucket_bytes);
    broadcast_model(model, comm);
    slab_ = model.grads_view();
    slab_ = slab_.view(0, {slab_.numel()});
    buckets_ = plan_model_buckets(model, opt_.bucket_bytes);
    requests_.resize(buckets_.size());
    // Each layer's backward hook says when its gradients are complete (nn/grad_buckets.h).
    if (opt_.overlap)
        readiness_ = std::make_unique<BucketReadiness>(model, buckets_, [this](const std::vector<size_t>&) {
            start_ready_buckets();
            comm_.progress();
        });
    hooks_.push_back(model.register_backward_hook([this](Module&, const Tensor&, Tensor&) { finish_backward(); }));
    if (opt_.broadcast_buffers && !model.named_buffers().empty())
        hooks_.push_back(model.register_forward_pre_hook([this](Module& m, const Tensor&) {
            if (m.keeps_cache()) broadcast_buffers(model_, comm_);
        }));
}

DataParallel::~DataParallel() {
    for (HookHandle& h : hooks_) h.remove();
}

// Buckets start in order 0, 1, … (every rank must start the same collectives in the same
// order): a bucket whose gradients are ready waits for the ones before it.
void DataParallel::start_ready_buckets() {
    while (started_ < buckets_.size() && readiness_->finished(started_)) start(started_);
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
    if (readiness_) readiness_->reset();
}

}  // namespace kiln
