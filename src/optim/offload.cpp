// offload.cpp — the optimizer's state on the host (the step, and what it overlaps: offload.h).
#include "optim/offload.h"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "core/alloc_size.h"
#include "core/cuda_memory.h"
#include "core/cuda_stream.h"
#include "core/error.h"
#include "ops/ops.h"
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

const char* offload_schedule_name(OffloadSchedule s) { return s == OffloadSchedule::Serial ? "serial" : "overlapped"; }

const char* offload_event_name(OffloadEvent::Kind kind) {
    switch (kind) {
    case OffloadEvent::GradsDown: return "grads down";
    case OffloadEvent::UpdateBegins: return "update begins";
    case OffloadEvent::UpdateEnds: return "update ends";
    case OffloadEvent::ForwardWaits: return "forward waits";
    }
    return "?";
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

// ---- the overlapped schedule (offload.h) ------------------------------------------------------------
// One bucket's way through a step: Idle → Down (its gradients queued down) → Handed (to the update
// thread) → Updating → Up (its weights queued up; the next forward's pre-hook makes the launch
// stream wait for them, and the bucket is Idle again for the next backward).
class OffloadedOptimizer::Pipeline {
public:
    Pipeline(OffloadedOptimizer& owner, Module& model, OffloadOptions options);
    ~Pipeline();

    void before_last_backward(AfterBackward next);
    float clip_gradients(const std::vector<Parameter*>& params, float max_norm);
    void step();
    void finish();  // every handed bucket updated, every weight copy waited for by the launch stream
    const std::vector<GradBucket>& buckets() const { return buckets_; }

private:
    enum class Stage { Idle, Down, Handed, Updating, Up };
    OffloadedOptimizer& owner_;
    OffloadOptions options_;
    std::vector<GradBucket> buckets_;
    std::vector<std::vector<size_t>> members_;  // per bucket: its parameters' indices (groups in order)
    std::vector<std::vector<bool>> which_;      // per bucket: the same as a mask, for Optimizer::update
    std::vector<Parameter*> device_;            // the GPU's parameters, groups in order
    cuda::CopyStream stream_;
    std::vector<std::unique_ptr<cuda::Event>> grads_ready_, grads_down_, weights_up_;  // per bucket
    std::unique_ptr<BucketReadiness> readiness_;
    std::vector<HookHandle> hooks_;

    std::mutex mu_;  // guards what follows; the update thread and the trainer's share it
    std::condition_variable changed_;
    std::vector<Stage> stage_;
    std::vector<bool> sent_;               // per bucket: its gradients queued down this step (trainer's thread)
    bool armed_ = false;                   // before_last_backward ran this step: copies go as buckets finish
    AfterBackward next_ = AfterBackward::Other;
    float factor_ = 1.0f;                  // the clip factor of this step's gradients (1: not clipped)
    std::vector<float> factor_of_;         // per bucket: the factor when it was handed
    size_t to_update_ = 0;                 // buckets of this step not yet updated; at 0 the host rule counts the step
    bool stop_ = false;
    std::exception_ptr error_;             // the update thread's, thrown on the trainer's thread
    std::thread worker_;

    void emit(OffloadEvent::Kind kind, size_t b) const {
        if (options_.observer) options_.observer(OffloadEvent{kind, b});
    }
    void send_down(size_t b);      // queue b's gradients down (trainer's thread)
    void send_rest_down();         // every bucket not yet on its way
    void begin_updates();          // this step's updates may begin: state made, groups set
    void hand(size_t b);           // to the update thread
    void wait_for_weights(size_t b, bool forward);  // the forward pre-hook's (forward), or finish()'s
    void work();                   // the update thread
    void update(size_t b, float factor);
    void rethrow();
    bool busy() const {  // a bucket handed or being updated (mu_ held)
        return std::any_of(stage_.begin(), stage_.end(), [](Stage s) { return s == Stage::Handed || s == Stage::Updating; });
    }
};

OffloadedOptimizer::OffloadedOptimizer(std::unique_ptr<Optimizer> device_optimizer, Module& model,
                                       OffloadOptions options)
    : OffloadedOptimizer(std::move(device_optimizer)) {
    if (options.schedule == OffloadSchedule::Overlapped)
        pipeline_ = std::make_unique<Pipeline>(*this, model, std::move(options));
}

OffloadedOptimizer::~OffloadedOptimizer() = default;  // the pipeline first: it waits for its thread

void OffloadedOptimizer::before_last_backward(AfterBackward next) {
    if (pipeline_) pipeline_->before_last_backward(next);
}

float OffloadedOptimizer::clip_gradients(const std::vector<Parameter*>& params, float max_norm) {
    return pipeline_ ? pipeline_->clip_gradients(params, max_norm) : Optimizer::clip_gradients(params, max_norm);
}

void OffloadedOptimizer::synchronize() {
    if (pipeline_) pipeline_->finish();
}

std::vector<Tensor> OffloadedOptimizer::state_of(size_t i) const {
    if (pipeline_) pipeline_->finish();
    return host_->state_of(i);
}

const std::vector<GradBucket>& OffloadedOptimizer::buckets() const {
    KILN_CHECK(pipeline_, "offload: the serial schedule has no buckets (it copies every gradient after backward)");
    return pipeline_->buckets();
}

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

OffloadedOptimizer::Pipeline::Pipeline(OffloadedOptimizer& owner, Module& model, OffloadOptions options)
    : owner_(owner), options_(std::move(options)) {
    KILN_CHECK(model.packed(), model.name(), ": the overlapped offload copies the gradient slab in buckets; pack() the "
                               "model first (the chapter models come packed)");
    device_ = owner.device_params();
    std::map<const Parameter*, size_t> index;  // device parameter -> its place, groups in order
    for (size_t k = 0; k < device_.size(); k++) index[device_[k]] = k;
    buckets_ = plan_model_buckets(model, options_.bucket_bytes);
    for (const GradBucket& bucket : buckets_) {
        members_.emplace_back();
        which_.emplace_back(device_.size(), false);
        for (const Parameter* p : bucket.params) {
            KILN_CHECK(index.count(p), "offload: the model's parameter '", p->name, "' is not in the optimizer; the "
                       "overlapped schedule updates the model's buckets (give the optimizer every parameter, or use "
                       "the serial schedule)");
            members_.back().push_back(index.at(p));
            which_.back()[index.at(p)] = true;
        }
        grads_ready_.push_back(std::make_unique<cuda::Event>());
        grads_down_.push_back(std::make_unique<cuda::Event>());
        weights_up_.push_back(std::make_unique<cuda::Event>());
    }
    size_t in_buckets = 0;
    for (const std::vector<size_t>& m : members_) in_buckets += m.size();
    KILN_CHECK(in_buckets == index.size(), "offload: the optimizer holds parameters the model does not: build it on "
                                           "the model's parameters");
    stage_.assign(buckets_.size(), Stage::Idle);
    sent_.assign(buckets_.size(), false);
    factor_of_.assign(buckets_.size(), 1.0f);
    readiness_ = std::make_unique<BucketReadiness>(model, buckets_, [this](const std::vector<size_t>& finished) {
        // Not before the batch's last backward (the gradients are not whole yet), nor when something
        // rewrites them after it (a GradScaler's unscale): then step() sends them.
        if (!armed_ || next_ == AfterBackward::Other) return;
        for (size_t b : finished) {
            send_down(b);
            if (next_ == AfterBackward::Step) hand(b);
        }
    });
    // The first reader of a bucket's weights in forward waits for them (and no one else does).
    std::map<const Parameter*, size_t> bucket_of;
    for (size_t b = 0; b < buckets_.size(); b++)
        for (const Parameter* p : buckets_[b].params) bucket_of[p] = b;
    for (auto& [path, params] : parameters_by_owner(model)) {
        std::vector<size_t> of;
        for (const Parameter* p : params)
            if (std::find(of.begin(), of.end(), bucket_of.at(p)) == of.end()) of.push_back(bucket_of.at(p));
        hooks_.push_back(model.module_at(path).register_forward_pre_hook([this, of](Module&, const Tensor&) {
            for (size_t b : of) wait_for_weights(b, true);
        }));
    }
    worker_ = std::thread([this] { work(); });
}

OffloadedOptimizer::Pipeline::~Pipeline() {
    {
        std::unique_lock<std::mutex> lock(mu_);
        changed_.wait(lock, [&] { return !busy(); });
        stop_ = true;
    }
    changed_.notify_all();
    worker_.join();
    for (HookHandle& h : hooks_) h.remove();
}

void OffloadedOptimizer::Pipeline::rethrow() {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void OffloadedOptimizer::Pipeline::before_last_backward(AfterBackward next) {
    rethrow();
    readiness_->reset();
    sent_.assign(buckets_.size(), false);
    {
        std::lock_guard<std::mutex> lock(mu_);
        factor_ = 1.0f;
    }
    next_ = next;
    armed_ = true;
    if (next == AfterBackward::Step) begin_updates();  // a step is certain: buckets go to the update thread as they finish
}

// Queues b's gradients down once backward's kernels so far (the bucket's last) have run. The
// host's copies must be free: the bucket's previous update, which read them, is over. (Its weights,
// if no forward has waited for them, are waited for now.)
void OffloadedOptimizer::Pipeline::send_down(size_t b) {
    bool up;
    {
        std::unique_lock<std::mutex> lock(mu_);
        changed_.wait(lock, [&] { return stage_[b] != Stage::Handed && stage_[b] != Stage::Updating; });
        up = stage_[b] == Stage::Up;
    }
    if (up) cuda::launch_stream_wait(*weights_up_[b]);
    grads_ready_[b]->record();
    stream_.wait(*grads_ready_[b]);
    for (size_t k : members_[b])
        stream_.copy_to_host(owner_.host_params_[k].grad.raw(), device_[k]->grad.raw(), device_[k]->grad.nbytes());
    stream_.record(*grads_down_[b]);
    {
        std::lock_guard<std::mutex> lock(mu_);
        stage_[b] = Stage::Down;
    }
    sent_[b] = true;
    emit(OffloadEvent::GradsDown, b);
}

void OffloadedOptimizer::Pipeline::send_rest_down() {
    for (size_t b = 0; b < buckets_.size(); b++)
        if (!sent_[b]) send_down(b);
}

// The host rule's state is made here, on this thread and in pinned memory (an empty update), not
// on the update thread; the groups' lr and weight decay are this step's.
void OffloadedOptimizer::Pipeline::begin_updates() {
    {
        std::unique_lock<std::mutex> lock(mu_);
        changed_.wait(lock, [&] { return !busy(); });  // the last step's updates are over
    }
    {
        AllocatorScope pinned(*owner_.pinned_);
        owner_.host_->update(std::vector<bool>(owner_.host_params_.size(), false));
    }
    owner_.set_host_groups();
    std::lock_guard<std::mutex> lock(mu_);
    to_update_ = buckets_.size();
}

void OffloadedOptimizer::Pipeline::hand(size_t b) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stage_[b] = Stage::Handed;
        factor_of_[b] = factor_;
    }
    changed_.notify_all();
}

// With clipping the norm is the GPU's, as clip_grad_norm computes it; the launch stream first waits
// for the copies down, since the scaling writes what they read. The host's copies are multiplied by
// the same factor before their update.
float OffloadedOptimizer::Pipeline::clip_gradients(const std::vector<Parameter*>& params, float max_norm) {
    const double squares = grad_squares(params);
    send_rest_down();
    for (const auto& e : grads_down_) cuda::launch_stream_wait(*e);
    std::vector<Tensor> grads;
    for (const Parameter* p : params) grads.push_back(p->grad);
    const float total = clip_to_norm(grads, squares, max_norm);
    std::lock_guard<std::mutex> lock(mu_);
    factor_ = clip_factor(squares, max_norm);
    return total;
}

// What is not on its way yet goes now: the copies down (all of them for an unannounced step), then
// every bucket to the update thread. The next zero_grad must not overwrite what the copies read:
// the launch stream waits for them (they follow backward closely; the updates it does not wait for).
void OffloadedOptimizer::Pipeline::step() {
    rethrow();
    if (!armed_ || next_ != AfterBackward::Step) {
        send_rest_down();
        begin_updates();
        for (size_t b = buckets_.size(); b-- > 0;) hand(b);
    } else {
        for (size_t b = 0; b < buckets_.size(); b++)
            if (!sent_[b]) {  // a bucket no layer finished (a parameter without a gradient this step)
                send_down(b);
                hand(b);
            }
    }
    for (const auto& e : grads_down_) cuda::launch_stream_wait(*e);
    sent_.assign(buckets_.size(), false);
    {
        std::lock_guard<std::mutex> lock(mu_);
        factor_ = 1.0f;
    }
    armed_ = false;
    next_ = AfterBackward::Other;
    readiness_->reset();
}

// A layer's forward reads bucket b's weights: once b's update has been queued (the host waits for
// that), the launch stream waits for its copy up; the layers before it have been launched already.
void OffloadedOptimizer::Pipeline::wait_for_weights(size_t b, bool forward) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (stage_[b] != Stage::Handed && stage_[b] != Stage::Updating && stage_[b] != Stage::Up) return;
    }
    if (forward) emit(OffloadEvent::ForwardWaits, b);  // (outside the lock: an observer may block)
    {
        std::unique_lock<std::mutex> lock(mu_);
        changed_.wait(lock, [&] { return stage_[b] == Stage::Up || error_; });
        if (error_) return;  // thrown by the next step()
        stage_[b] = Stage::Idle;
    }
    changed_.notify_all();
    cuda::launch_stream_wait(*weights_up_[b]);
}

void OffloadedOptimizer::Pipeline::finish() {
    for (size_t b = 0; b < buckets_.size(); b++) wait_for_weights(b, false);
    rethrow();
}

// The update thread: the handed bucket the next forward reads first (the highest), one at a time.
void OffloadedOptimizer::Pipeline::work() {
    for (;;) {
        size_t b = 0;
        float factor = 1.0f;
        {
            std::unique_lock<std::mutex> lock(mu_);
            const auto handed = [&] { return std::find(stage_.rbegin(), stage_.rend(), Stage::Handed); };
            changed_.wait(lock, [&] { return stop_ || handed() != stage_.rend(); });
            if (handed() == stage_.rend()) return;  // stopping, nothing left
            b = size_t(stage_.rend() - handed()) - 1;
            stage_[b] = Stage::Updating;
            factor = factor_of_[b];
        }
        emit(OffloadEvent::UpdateBegins, b);
        try {
            update(b, factor);
        } catch (...) {
            std::lock_guard<std::mutex> lock(mu_);
            error_ = std::current_exception();
        }
        {
            std::lock_guard<std::mutex> lock(mu_);
            stage_[b] = Stage::Up;
            if (--to_update_ == 0) owner_.host_->count_step();
        }
        emit(OffloadEvent::UpdateEnds, b);
        changed_.notify_all();
    }
}

// b's gradients have arrived, and the last step's copy of b's weights up has read the masters this
// update changes; then the rule (after the clip factor, if any) and b's weights up.
void OffloadedOptimizer::Pipeline::update(size_t b, float factor) {
    grads_down_[b]->synchronize();
    weights_up_[b]->synchronize();
    std::vector<Parameter>& host = owner_.host_params_;
    if (factor < 1.0f)
        for (size_t k : members_[b]) scale_(host[k].grad, factor);  // the GPU's clip: the same f32 products
    owner_.host_->update(which_[b]);
    for (size_t k : members_[b])
        stream_.copy_to_device(device_[k]->value.raw(), host[k].value.raw(), device_[k]->value.nbytes());
    stream_.record(*weights_up_[b]);
}

void OffloadedOptimizer::set_host_groups() {
    for (size_t g = 0; g < groups_.size(); g++) {
        host_->param_groups()[g].lr = groups_[g].lr;
        host_->param_groups()[g].weight_decay = groups_[g].weight_decay;
    }
}

// Serial: 1. gradients down (each copy waits for the kernels before it: backward), 2. the rule on
// the host with the groups' lr and weight decay of now (a scheduler sets them on this optimizer),
// 3. the weights up, queued from pinned memory: the next forward's kernels run after them.
// Overlapped: the buckets not yet on their way go (Pipeline::step).
void OffloadedOptimizer::step() {
    if (pipeline_) {
        pipeline_->step();
        steps_++;
        return;
    }
    const std::vector<Parameter*> device = device_params();
    for (size_t k = 0; k < device.size(); k++) host_params_[k].grad.copy_from(device[k]->grad);
    set_host_groups();
    {
        AllocatorScope pinned(*pinned_);  // the state, made at the first step, is pinned too
        host_->step();
    }
    for (size_t k = 0; k < device.size(); k++)
        cuda::copy_to_device_async(device[k]->value.raw(), host_params_[k].value.raw(), device[k]->value.nbytes());
    steps_++;
}

void OffloadedOptimizer::save_state(StateDict& state, const std::string& prefix) const {
    if (pipeline_) pipeline_->finish();
    for (size_t g = 0; g < groups_.size(); g++) host_->param_groups()[g].lr = groups_[g].lr;
    host_->save_state(state, prefix);
}

void OffloadedOptimizer::load_state(const StateDict& state, const std::string& prefix) {
    if (pipeline_) pipeline_->finish();
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

std::unique_ptr<Optimizer> offload_optimizer(std::unique_ptr<Optimizer> device_optimizer, Module& model,
                                             OffloadOptions options) {
    return std::make_unique<OffloadedOptimizer>(std::move(device_optimizer), model, std::move(options));
}

}  // namespace kiln
