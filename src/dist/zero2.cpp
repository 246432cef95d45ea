// zero2.cpp — ZeRO-2: buckets of gradients reduce-scattered into this rank's piece as backward
// completes them, their buffers let go (zero2.h).
#include "dist/zero2.h"

#include <algorithm>
#include <map>

#include "core/allocator.h"
#include "core/error.h"
#include "ops/ops.h"

namespace kiln {

namespace {

// Elements [at, at + n) of a 1-D f32 tensor.
Tensor floats(const Tensor& t, int64_t at, int64_t n) { return t.view(size_t(at) * sizeof(float), {n}); }

}  // namespace

Zero2Optimizer::Zero2Optimizer(Module& model, std::vector<ParamGroup> groups, Communicator& comm, const Factory& make,
                               Zero2Options options)
    : ZeroOptimizer(model, std::move(groups), comm, make), opt_(std::move(options)) {
    KILN_CHECK(opt_.bucket_bytes > 0, "ZeRO-2: the bucket size must be positive, got ", opt_.bucket_bytes);
    const Device device = values_.device();
    const int64_t lo = pieces_[size_t(comm.rank())], hi = pieces_[size_t(comm.rank()) + 1];

    // Where each parameter's gradient lay in the slab (the value slab's offsets), and the layer
    // whose backward writes it ("h.0.mlp.c_fc.weight" belongs to "h.0.mlp.c_fc").
    std::vector<std::pair<int64_t, int64_t>> ranges;
    std::map<std::string, std::vector<size_t>> owned;
    for (auto& [name, p] : model.named_parameters()) {
        at_.push_back(offset_in_slab(p->value, values_));
        ranges.push_back({at_.back(), at_.back() + p->value.numel()});
        const size_t dot = name.rfind('.');
        owned[dot == std::string::npos ? std::string() : name.substr(0, dot)].push_back(params_.size());
        params_.push_back(p);
    }
    buckets_ = plan_buckets(params_, ranges, values_.numel(), std::max<int64_t>(1, opt_.bucket_bytes / 4), opt_.starts_unit);
    bucket_of_.resize(params_.size());
    for (size_t b = 0; b < buckets_.size(); b++)
        for (Parameter* p : buckets_[b].params)
            bucket_of_[size_t(std::find(params_.begin(), params_.end(), p) - params_.begin())] = b;
    buffers_.resize(buckets_.size());
    waiting_.resize(buckets_.size());

    // The piece of the gradient this rank keeps; the inner optimizer's shards read it.
    piece_ = Tensor::zeros({hi - lo}, DType::F32, device, Category::Gradient);
    for (Piece& piece : mine_)
        piece.shard->grad = floats(piece_, offset_in_slab(piece.shard->value, values_) - lo, piece.shard->value.numel());
    grads_ = Tensor();
    model.drop_grad_slab();

    std::vector<size_t> early;
    for (const Parameter* p : opt_.written_early) {
        const auto it = std::find(params_.begin(), params_.end(), p);
        KILN_CHECK(it != params_.end(), "ZeRO-2: written_early lists ", p->name, ", not a parameter of ", model.name());
        early.push_back(bucket_of_[size_t(it - params_.begin())]);
    }
    hooks_.push_back(model.register_backward_pre_hook([this, early](Module&, const Tensor&) {
        reduced_ = 0;
        for (size_t b = 0; b < buckets_.size(); b++) waiting_[b] = int(buckets_[b].params.size());
        for (size_t b : early) give_buffer(b);
    }));
    for (auto& [path, indices] : owned) {
        Module& layer = model.module_at(path);
        hooks_.push_back(layer.register_backward_pre_hook([this, indices = indices](Module&, const Tensor&) {
            for (size_t i : indices) give_buffer(bucket_of_[i]);
        }));
        hooks_.push_back(layer.register_backward_hook([this, indices = indices](Module& m, const Tensor&, Tensor&) {
            for (size_t i : indices)
                KILN_CHECK(--waiting_[bucket_of_[i]] >= 0, "ZeRO-2: ", m.name(), "'s backward ran twice in one "
                           "backward; its bucket was already reduced (a layer used twice is not supported)");
            reduce_ready_buckets();
        }));
    }
    hooks_.push_back(model.register_backward_hook([this](Module&, const Tensor&, Tensor&) { finish_backward(); }));
}

Zero2Optimizer::~Zero2Optimizer() {
    for (HookHandle& h : hooks_) h.remove();
}

// Zeros, from the pool (not a step's arena: the buffer goes back before backward ends).
void Zero2Optimizer::give_buffer(size_t b) {
    if (buffers_[b].defined()) return;
    KILN_CHECK(b >= reduced_, "ZeRO-2: a layer's backward began after its bucket ", b, " was reduced (",
               "a layer used twice, or a tied weight not listed in written_early)");
    const GradBucket& bucket = buckets_[b];
    AllocatorScope pool(pool_allocator(values_.device()));
    buffers_[b] = Tensor::zeros({bucket.end - bucket.begin}, DType::F32, values_.device(), Category::Gradient);
    for (Parameter* p : bucket.params) {
        const int64_t at = at_[size_t(std::find(params_.begin(), params_.end(), p) - params_.begin())];
        p->grad = buffers_[b].view(size_t(at - bucket.begin) * sizeof(float), p->value.shape());
    }
}

// In order 0, 1, …: every rank must run the same collectives in the same order.
void Zero2Optimizer::reduce_ready_buckets() {
    while (reduced_ < buckets_.size() && waiting_[reduced_] == 0) reduce(reduced_);
}

//   bucket [begin, end) := Σ_ranks over rank r's part [pieces_r, pieces_r+1) ∩ [begin, end)
//   piece_[this rank's part] := (or +=) that sum
void Zero2Optimizer::reduce(size_t b) {
    give_buffer(b);  // a bucket no layer wrote this backward: zeros
    const GradBucket& bucket = buckets_[b];
    std::vector<int64_t> offsets;
    for (int64_t at : pieces_) offsets.push_back(std::clamp(at, bucket.begin, bucket.end) - bucket.begin);
    comm_.reduce_scatter(buffers_[b], offsets);
    const int r = comm_.rank();
    const int64_t lo = pieces_[size_t(r)], first = offsets[size_t(r)], n = offsets[size_t(r) + 1] - first;
    if (n > 0) {
        Tensor mine = floats(piece_, bucket.begin + first - lo, n);
        const Tensor sum = floats(buffers_[b], first, n);
        if (accumulate_)
            axpy_(mine, 1.0f, sum);
        else
            mine.copy_from(sum);
    }
    for (Parameter* p : bucket.params) p->grad = Tensor();
    buffers_[b] = Tensor();
    reduced_++;
}

void Zero2Optimizer::finish_backward() {
    while (reduced_ < buckets_.size()) reduce(reduced_);  // and the buckets of parameters no layer wrote
    accumulate_ = true;  // a further micro-batch before step() adds to the piece
}

void Zero2Optimizer::step() {
    ZeroOptimizer::step();
    accumulate_ = false;
}

}  // namespace kiln
