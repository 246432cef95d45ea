// offload.cpp — the optimizer's state on the host (the step, and what it overlaps: offload.h).
#include "optim/offload.h"

#include <algorithm>

#include "core/alloc_size.h"
#include "core/cuda_memory.h"
#include "core/error.h"
#include "optim/adam.h"

namespace kiln {

// ---- pinned host memory ---------------------------------------------------------------------
PinnedHostAllocator::~PinnedHostAllocator() {
    for (auto& [ptr, block] : live_) cuda::free_host(ptr);
}

void* PinnedHostAllocator::allocate(size_t bytes, Category category) {
    const size_t size = (std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
    void* p = cuda::malloc_host(size);
    if (!p) throw OutOfMemory("out of pinned host memory: cudaMallocHost of " + std::to_string(size) +
                              " bytes failed (the optimizer's state offloaded to the host does not fit in its RAM)");
    std::lock_guard<std::mutex> lock(mu_);
    live_[p] = Block{size, bytes, category};
    note_reserve(int64_t(size));
    note_alloc(int64_t(size), int64_t(bytes), category);
    return p;
}

void PinnedHostAllocator::deallocate(void* ptr) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(ptr);
    KILN_CHECK(it != live_.end(), "PinnedHostAllocator: freeing a pointer it did not hand out");
    note_free(int64_t(it->second.size), int64_t(it->second.requested), it->second.category);
    note_reserve(-int64_t(it->second.size));
    cuda::free_host(ptr);
    live_.erase(it);
}

// ---- the optimizer ----------------------------------------------------------------------------
namespace {

// The groups over other parameters: the same lrs and weight decays, params[k] for the k-th
// parameter (groups in order).
std::vector<ParamGroup> groups_over(const std::vector<ParamGroup>& like, std::vector<Parameter>& params) {
    std::vector<ParamGroup> groups = like;
    size_t k = 0;
    for (ParamGroup& g : groups)
        for (Parameter*& p : g.params) p = &params[k++];
    return groups;
}

// The same rule as `device` (SGD, Adam or AdamW with its options) over `groups`.
std::unique_ptr<Optimizer> same_rule(const Optimizer& device, std::vector<ParamGroup> groups) {
    if (const auto* adam = dynamic_cast<const Adam*>(&device)) {
        Adam::Options o = adam->options();
        o.weight_decay = 0.0f;  // each group brings its own
        if (adam->decoupled()) return std::make_unique<AdamW>(std::move(groups), o);
        return std::make_unique<Adam>(std::move(groups), o);
    }
    if (const auto* sgd = dynamic_cast<const SGD*>(&device)) {
        SGD::Options o = sgd->options();
        o.weight_decay = 0.0f;
        return std::make_unique<SGD>(std::move(groups), o);
    }
    KILN_FAIL("offload: the optimizer is not an SGD, Adam or AdamW, the rules offload runs on the host (a ZeRO "
              "optimizer shards its state over the GPUs instead: use one or the other)");
}

}  // namespace

OffloadedOptimizer::OffloadedOptimizer(std::unique_ptr<Optimizer> device_optimizer)
    : Optimizer(device_optimizer ? device_optimizer->param_groups() : std::vector<ParamGroup>{}),
      pinned_(std::make_unique<PinnedHostAllocator>()) {
    for (const Parameter* p : device_params())
        KILN_CHECK(p->value.device() == Device::CUDA && p->value.dtype() == DType::F32, "offload: parameter '", p->name,
                   "' is ", p->value.desc(), "; offload moves the optimizer from a GPU's memory to the host's, so it "
                   "needs f32 parameters on cuda (on the CPU there is nothing to move: drop --offload)");
    std::vector<Shape> shapes;
    for (const Parameter* p : device_params()) shapes.push_back(p->value.shape());
    {
        AllocatorScope pinned(*pinned_);
        Slab values = make_slab(shapes, DType::F32, Device::CPU, Category::OptimizerState);  // the f32 masters
        Slab grads = make_slab(shapes, DType::F32, Device::CPU, Category::Gradient);
        host_values_ = values.whole, host_grads_ = grads.whole;
        size_t k = 0;
        for (const Parameter* p : device_params()) {
            host_params_.push_back(Parameter{p->name, values.views[k], grads.views[k]});
            k++;
        }
    }
    host_ = same_rule(*device_optimizer, groups_over(groups_, host_params_));
    if (device_optimizer->steps() > 0) {  // its state moves to the host; the GPU's copy goes with the optimizer
        StateDict state;
        device_optimizer->save_state(state, "moved");
        AllocatorScope pinned(*pinned_);
        host_->load_state(state, "moved");
        steps_ = host_->steps();
    }
    take_weights_from_device();
}

std::vector<Parameter*> OffloadedOptimizer::device_params() const {
    std::vector<Parameter*> params;
    for (const ParamGroup& g : groups_) params.insert(params.end(), g.params.begin(), g.params.end());
    return params;
}

void OffloadedOptimizer::take_weights_from_device() {
    size_t k = 0;
    for (const Parameter* p : device_params()) host_params_[k++].value.copy_from(p->value);
}

// 1. gradients down (each copy waits for the kernels before it: backward), 2. the rule on the
// host with the groups' lr and weight decay of now (a scheduler sets them on this optimizer),
// 3. the weights up, queued from pinned memory: the next forward's kernels run after them.
void OffloadedOptimizer::step() {
    const std::vector<Parameter*> device = device_params();
    for (size_t k = 0; k < device.size(); k++) host_params_[k].grad.copy_from(device[k]->grad);
    for (size_t g = 0; g < groups_.size(); g++) {
        host_->param_groups()[g].lr = groups_[g].lr;
        host_->param_groups()[g].weight_decay = groups_[g].weight_decay;
    }
    {
        AllocatorScope pinned(*pinned_);  // the state, made at the first step, is pinned too
        host_->step();
    }
    for (size_t k = 0; k < device.size(); k++)
        cuda::copy_to_device_async(device[k]->value.raw(), host_params_[k].value.raw(), device[k]->value.nbytes());
    steps_++;
}

void OffloadedOptimizer::save_state(StateDict& state, const std::string& prefix) const {
    for (size_t g = 0; g < groups_.size(); g++) host_->param_groups()[g].lr = groups_[g].lr;
    host_->save_state(state, prefix);
}

void OffloadedOptimizer::load_state(const StateDict& state, const std::string& prefix) {
    {
        AllocatorScope pinned(*pinned_);
        host_->load_state(state, prefix);
    }
    steps_ = host_->steps();
    for (size_t g = 0; g < groups_.size(); g++) groups_[g].lr = host_->param_groups()[g].lr;
    take_weights_from_device();
}

int64_t OffloadedOptimizer::bytes_each_way() const {
    int64_t elements = 0;
    for (const Parameter& p : host_params_) elements += p.value.numel();
    return 4 * elements;
}

std::unique_ptr<Optimizer> offload_optimizer(std::unique_ptr<Optimizer> device_optimizer) {
    return std::make_unique<OffloadedOptimizer>(std::move(device_optimizer));
}

}  // namespace kiln
