// test_offload.cpp — the optimizer's state on the host (optim/offload.h, chapter 15): training
// steps with it, serial or overlapped, are the GPU-resident optimizer's bit for bit on kiln's
// emulator (losses, weights, moments, the checkpoint's state; to 1e-5 on a GPU, whose compiler may
// fuse multiply-adds); the overlapped schedule is checked as a recorded order of events (a bucket's
// update runs while backward is held before the first layer; the next forward's first layer runs
// while the last layers' bucket is still being updated; a layer's forward waits for its own bucket
// only); the emulator's copy stream runs its copies only when waited for, so a missing wait reads
// stale bytes; the GPU keeps none of the state while the host's pinned memory does, the measured
// step's device bytes equal chapter 15's plan with offload, and the bad uses are refused.
//
//   make test T='[offload]'
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "core/allocator.h"
#include "core/cuda_memory.h"
#include "core/cuda_stream.h"
#include "fixtures.h"
#include "nn/gpt.h"
#include "nn/grad_buckets.h"
#include "optim/adam.h"
#include "optim/offload.h"
#include "train/gpt_recipe.h"
#include "train/loop.h"
#include "train/memory_plan.h"

using namespace kiln;

namespace {

using MakeOptimizer = std::function<std::unique_ptr<Optimizer>(GPT& model)>;

// A GPT small enough for the emulator: 2 layers, width 16, context 12.
GPTConfig small_gpt() {
    GPTConfig c;
    c.block_size = 12, c.vocab_size = 11, c.n_layer = 2, c.n_head = 2, c.n_embd = 16;
    return c;
}

using test::random_ids;

// On kiln's emulator the GPU's kernels and the CPU's round alike: the same bytes, wherever the two
// tensors live. On a GPU nvcc may fuse a·b + c into one rounding where the CPU's kernel rounds
// twice (cuda/optim.cu), so there the values agree to 1e-5 of the largest.
bool same_values(const Tensor& a, const Tensor& b) {
    const Tensor x = a.to(Device::CPU), y = b.to(Device::CPU);
    if (cuda::is_emulated()) return test::same_bits(x, y);
    if (x.shape() != y.shape() || x.dtype() != DType::F32 || y.dtype() != DType::F32) return false;
    float largest = 0.0f, diff = 0.0f;
    for (int64_t i = 0; i < x.numel(); i++) {
        largest = std::max({largest, std::fabs(x.data<float>()[i]), std::fabs(y.data<float>()[i])});
        diff = std::max(diff, std::fabs(x.data<float>()[i] - y.data<float>()[i]));
    }
    return diff <= 1e-5f * largest;
}

bool same_losses(const std::vector<float>& a, const std::vector<float>& b) {
    if (cuda::is_emulated() || a.size() != b.size()) return a == b;
    for (size_t i = 0; i < a.size(); i++)
        if (std::fabs(a[i] - b[i]) > 1e-5f * std::fabs(a[i])) return false;
    return true;
}

struct Run {
    std::vector<float> losses;
    std::unique_ptr<GPT> model;
    std::unique_ptr<Optimizer> optimizer;
};

enum class Mode { Resident, Serial, Overlapped };
constexpr int64_t kBucketBytes = 4096;  // the small GPT's ~7,000 parameters in 7 buckets of about 1,024

struct RunOptions {
    float clip = 1.0f;                                  // 0: none (the overlapped schedule's Step case)
    std::function<void(const OffloadEvent&)> observer;  // the overlapped schedule's
    std::function<void(GPT&)> before_optimizer;         // hooks a test puts on the model first
};

// `steps` training steps on the GPU (the emulator here), clipped unless asked, a new batch and a
// new lr each; at the end the optimizer is synchronized (the overlapped step may still run).
Run train(const MakeOptimizer& make, Mode mode, DType amp, int steps, const RunOptions& o = {}) {
    const GPTConfig c = small_gpt();
    Run run;
    run.model = make_gpt(c, 1);
    run.model->to(Device::CUDA);
    if (o.before_optimizer) o.before_optimizer(*run.model);
    run.optimizer = make(*run.model);
    if (mode == Mode::Serial) run.optimizer = offload_optimizer(std::move(run.optimizer));
    if (mode == Mode::Overlapped)
        run.optimizer = offload_optimizer(std::move(run.optimizer), *run.model,
                                          OffloadOptions{OffloadSchedule::Overlapped, kBucketBytes, o.observer});
    BumpAllocator arena("step", Device::CUDA);
    const StepOptions options{&arena, o.clip, 1, nullptr, amp};
    for (int it = 0; it < steps; it++) {
        run.optimizer->set_lr(1e-2f / float(it + 1));
        const Tensor x = random_ids(3, c.block_size, c.vocab_size, 10 + it).to(Device::CUDA);
        const Tensor y = random_ids(3, c.block_size, c.vocab_size, 20 + it).to(Device::CUDA);
        const StepResult r = train_step(*run.model, *run.optimizer, x, y, options);
        REQUIRE(r.stepped);
        run.losses.push_back(r.loss);
    }
    run.optimizer->synchronize();
    return run;
}

using MakeFn = std::unique_ptr<Optimizer> (*)(GPT&);

// The GPU-resident run of 2 steps with `make`, `amp` and `clip`, made once per test program and
// shared by the cases that compare against it (each costs the emulator a second or two). Kept to
// the program's end and never destroyed: its tensors must not outlive the allocators at exit.
const Run& resident_run(MakeFn make, DType amp, float clip) {
    static auto* runs = new std::map<std::tuple<MakeFn, DType, float>, Run>;
    const auto key = std::make_tuple(make, amp, clip);
    auto it = runs->find(key);
    if (it == runs->end()) {
        RunOptions o;
        o.clip = clip;
        it = runs->emplace(key, train(make, Mode::Resident, amp, 2, o)).first;
    }
    return it->second;
}

// Two runs took the same steps: losses, weights, the optimizer's state (on the GPU or the host)
// and its checkpoint keys and values.
void check_same_run(const Run& a, const Run& b) {
    CHECK(same_losses(a.losses, b.losses));
    const std::vector<Parameter*> pa = a.model->parameters(), pb = b.model->parameters();
    REQUIRE(pa.size() == pb.size());
    for (size_t i = 0; i < pa.size(); i++) {
        INFO(pa[i]->name);
        CHECK(pb[i]->value.device() == Device::CUDA);
        CHECK(same_values(pa[i]->value, pb[i]->value));
    }
    for (size_t i = 0; i < a.optimizer->num_params(); i++) {
        const std::vector<Tensor> s = a.optimizer->state_of(i), t = b.optimizer->state_of(i);
        REQUIRE(s.size() == t.size());
        REQUIRE(!s.empty());
        for (size_t j = 0; j < s.size(); j++) CHECK(same_values(s[j], t[j]));
    }
    StateDict sa, sb;  // the same keys and values: a checkpoint resumes with or without offload
    a.optimizer->save_state(sa, "optimizer");
    b.optimizer->save_state(sb, "optimizer");
    CHECK(sa.values == sb.values);
    REQUIRE(sa.tensors.size() == sb.tensors.size());
    for (const auto& [key, tensor] : sa.tensors) {
        INFO(key);
        REQUIRE(sb.tensors.count(key) == 1);
        CHECK(same_values(tensor, sb.tensors.at(key)));
    }
}

// The order things happened in, from the trainer's thread and the update thread: the offload's
// events ("update begins 3") and the test's own marks ("forward transformer.wte").
class Schedule {
public:
    void note(const std::string& line) {
        {
            std::lock_guard<std::mutex> lock(mu_);
            log_.push_back(line);
        }
        changed_.notify_all();
    }
    void note(const OffloadEvent& e) { note(std::string(offload_event_name(e.kind)) + " " + std::to_string(e.bucket)); }
    // Waits until `line` has been noted, at most 20 s (a schedule that cannot get there fails, slowly).
    bool wait_for(const std::string& line) {
        std::unique_lock<std::mutex> lock(mu_);
        return changed_.wait_for(lock, std::chrono::seconds(20),
                                 [&] { return std::find(log_.begin(), log_.end(), line) != log_.end(); });
    }
    std::vector<std::string> lines() {
        std::lock_guard<std::mutex> lock(mu_);
        return log_;
    }

private:
    std::mutex mu_;
    std::condition_variable changed_;
    std::vector<std::string> log_;
};

std::unique_ptr<Optimizer> adamw(GPT& model) { return gpt_optimizer(model, GPTRecipe{}); }
std::unique_ptr<Optimizer> adam(GPT& model) {
    return std::make_unique<Adam>(decay_groups(model, 1e-2f, 0.1f), Adam::Options{}.with_amsgrad());
}
std::unique_ptr<Optimizer> sgd(GPT& model) {
    return std::make_unique<SGD>(decay_groups(model, 1e-2f, 1e-3f), SGD::Options{}.with_momentum(0.9f).with_nesterov());
}

}  // namespace

TEST_CASE("offload: steps with the optimizer's state on the host, serial or overlapped, are the GPU's, bit for bit: "
          "losses, weights, moments, the checkpoint's state (AdamW, Adam with AMSGrad, SGD with Nesterov; f32 and bf16 "
          "autocast; clipped)",
          "[offload][optim][cuda][lesson15]") {
    struct Case { const char* name; MakeFn make; DType amp; };
    for (const Case& k : {Case{"AdamW", adamw, DType::F32}, Case{"AdamW", adamw, DType::BF16}, Case{"Adam", adam, DType::F32},
                          Case{"SGD", sgd, DType::F32}}) {
        INFO(k.name << ", " << dtype_name(k.amp));
        const Run& gpu = resident_run(k.make, k.amp, 1.0f);
        const Run off = train(k.make, Mode::Serial, k.amp, 2);
        check_same_run(gpu, off);
        CHECK(gpu.optimizer->state_of(0).front().device() == Device::CUDA);  // the state: on the GPU for one,
        CHECK(off.optimizer->state_of(0).front().device() == Device::CPU);   // on the host for the other
        // The overlapped schedule: AdamW f32 in the schedule case below; AMSGrad's serial run is enough
        // (the overlapped one runs the same host rule).
        if (k.make == adam || (k.make == adamw && k.amp == DType::F32)) continue;
        INFO("overlapped");
        check_same_run(gpu, train(k.make, Mode::Overlapped, k.amp, 2));
    }
}

TEST_CASE("offload: resumed from a checkpoint's state, an offloaded optimizer goes on as the straight run",
          "[offload][optim][cuda][lesson15]") {
    const GPTConfig c = small_gpt();
    const Run straight = train(adamw, Mode::Serial, DType::F32, 2);
    // A step on the GPU without offload, its state saved; a new model takes the weights and an
    // offloaded optimizer the state, and takes the second step.
    const Run first = train(adamw, Mode::Resident, DType::F32, 1);
    StateDict state;
    first.optimizer->save_state(state, "optimizer");
    for (const OffloadSchedule schedule : {OffloadSchedule::Serial, OffloadSchedule::Overlapped}) {
        INFO(offload_schedule_name(schedule));
        auto model = make_gpt(c, 7);
        model->to(Device::CUDA);
        const std::vector<Parameter*> from = first.model->parameters(), to = model->parameters();
        for (size_t i = 0; i < to.size(); i++) to[i]->value.copy_from(from[i]->value);
        auto optimizer = offload_optimizer(adamw(*model), *model, OffloadOptions{schedule, kBucketBytes, {}});
        optimizer->load_state(state, "optimizer");
        CHECK(optimizer->steps() == 1);
        optimizer->set_lr(1e-2f / 2.0f);
        BumpAllocator arena("step", Device::CUDA);
        const Tensor x = random_ids(3, c.block_size, c.vocab_size, 11).to(Device::CUDA);
        const Tensor y = random_ids(3, c.block_size, c.vocab_size, 21).to(Device::CUDA);
        const float loss = train_step(*model, *optimizer, x, y, StepOptions{&arena, 1.0f}).loss;
        optimizer->synchronize();
        CHECK(same_losses({loss}, {straight.losses[1]}));
        const std::vector<Parameter*> want = straight.model->parameters();
        for (size_t i = 0; i < to.size(); i++) {
            INFO(to[i]->name);
            CHECK(same_values(to[i]->value, want[i]->value));
        }
    }
}

// The overlapped schedule as it ran. Without clipping (a step is certain before backward): the test
// holds backward at the first layer (the embedding's backward pre-hook) until bucket 0 — the last
// layers, finished first — has been updated; the serial schedule never gets there. Each bucket's
// copy down is queued only after the backward of every layer that owns one of its parameters (the
// emulator cannot show a copy that runs before its kernels: they finish before they return). The
// steps stay the resident optimizer's, bit for bit.
TEST_CASE("offload, overlapped: without clipping a bucket's update runs while backward is still before the first "
          "layer, and the steps are the GPU's bit for bit",
          "[offload][optim][cuda][lesson15]") {
    Schedule schedule;
    bool held = false, updated_meanwhile = false;
    RunOptions o;
    o.clip = 0.0f;
    o.observer = [&](const OffloadEvent& e) { schedule.note(e); };
    std::map<std::string, std::vector<Parameter*>> owned;
    o.before_optimizer = [&](GPT& model) {
        owned = parameters_by_owner(model);
        for (auto& [path, params] : owned)
            model.module_at(path).register_backward_hook(
                [&, path = path](Module&, const Tensor&, Tensor&) { schedule.note("backward ends " + path); });
        model.module_at("transformer.wte").register_backward_pre_hook([&](Module&, const Tensor&) {
            if (held) return;  // the first step
            held = true;
            schedule.note("backward reaches transformer.wte");
            updated_meanwhile = schedule.wait_for("update ends 0");
        });
        model.module_at("transformer.wte").register_backward_hook(
            [&](Module&, const Tensor&, Tensor&) { schedule.note("backward of transformer.wte ends"); });
    };
    const Run overlapped = train(adamw, Mode::Overlapped, DType::F32, 2, o);
    CHECK(updated_meanwhile);
    const std::vector<std::string> lines = schedule.lines();
    const auto at = [&](const std::string& line) { return std::find(lines.begin(), lines.end(), line) - lines.begin(); };
    CHECK(at("update begins 0") < at("backward of transformer.wte ends"));
    CHECK(at("grads down 0") < at("update begins 0"));
    const std::vector<GradBucket>& buckets = static_cast<const OffloadedOptimizer&>(*overlapped.optimizer).buckets();
    std::map<std::string, int> backwards;  // per layer: its backward passes so far
    std::vector<int> downs(buckets.size(), 0);
    for (const std::string& line : lines) {
        if (line.rfind("backward ends ", 0) == 0) backwards[line.substr(14)]++;
        if (line.rfind("grads down ", 0) != 0) continue;
        const size_t b = std::stoul(line.substr(11));
        REQUIRE(b < buckets.size());
        downs[b]++;  // this step's copy: every owner of b's parameters has run backward this step
        for (auto& [path, params] : owned)
            for (const Parameter* p : params)
                if (std::find(buckets[b].params.begin(), buckets[b].params.end(), p) != buckets[b].params.end()) {
                    INFO(line << " (step " << downs[b] << ") before the backward of " << path);
                    CHECK(backwards[path] >= downs[b]);
                }
    }
    CHECK(std::count(downs.begin(), downs.end(), 2) == int(buckets.size()));  // each bucket once a step
    check_same_run(resident_run(adamw, DType::F32, 0.0f), overlapped);
}

// With clipping the updates wait for the norm, then go first-layer-first: the test holds bucket 0's
// update (the last layers) until the next step's forward has run the embedding, which waited for its
// own bucket only. Every forward wait comes from a layer that owns a parameter of that bucket, once
// a bucket a step. The steps are the resident AdamW's, bit for bit.
TEST_CASE("offload, overlapped: with clipping the next forward's first layer runs while the last layers' bucket is "
          "still being updated; a layer's forward waits for its own bucket only; the steps are the GPU's bit for bit",
          "[offload][optim][cuda][lesson15]") {
    Schedule schedule;
    bool held = false, forward_meanwhile = false;
    RunOptions o;
    o.observer = [&](const OffloadEvent& e) {
        schedule.note(e);
        if (e.kind == OffloadEvent::UpdateBegins && e.bucket == 0 && !held) {
            held = true;  // the first step's, until the second step's embedding has run
            forward_meanwhile = schedule.wait_for("forward of transformer.wte ran, step 2");
        }
    };
    std::map<std::string, std::vector<const Parameter*>> owned;
    int embeddings = 0;  // forwards of the embedding so far
    o.before_optimizer = [&](GPT& model) {
        for (auto& [path, params] : parameters_by_owner(model)) {
            owned[path].assign(params.begin(), params.end());
            model.module_at(path).register_forward_pre_hook(
                [&, path = path](Module&, const Tensor&) { schedule.note("forward " + path); });
        }
        model.module_at("transformer.wte").register_forward_hook([&](Module&, const Tensor&, Tensor&) {
            schedule.note("forward of transformer.wte ran, step " + std::to_string(++embeddings));
        });
    };
    const Run run = train(adamw, Mode::Overlapped, DType::F32, 2, o);
    CHECK(forward_meanwhile);
    const std::vector<GradBucket>& buckets = static_cast<const OffloadedOptimizer&>(*run.optimizer).buckets();
    REQUIRE(buckets.size() >= 4);
    std::vector<int> waits(buckets.size(), 0);
    std::string layer;  // the layer whose forward is starting
    for (const std::string& line : schedule.lines()) {
        if (line.rfind("forward waits ", 0) != 0) {
            if (line.rfind("forward ", 0) == 0 && line.find(" ran") == std::string::npos) layer = line.substr(8);
            continue;
        }
        const size_t b = std::stoul(line.substr(14));
        INFO(line << " in the forward of " << layer);
        REQUIRE(b < buckets.size());
        waits[b]++;
        const std::vector<Parameter*>& in = buckets[b].params;
        CHECK(std::any_of(owned[layer].begin(), owned[layer].end(),
                          [&](const Parameter* p) { return std::find(in.begin(), in.end(), p) != in.end(); }));
    }
    for (size_t b = 0; b < buckets.size(); b++) {
        INFO("bucket " << b);
        CHECK(waits[b] == 1);  // the second step's forward, once
    }
    check_same_run(resident_run(adamw, DType::F32, 1.0f), run);
}

// The device's bytes by category (the CUDA pool's accounting) after steps with and without
// offload: the optimizer's state leaves the GPU, and the host's pinned memory holds the masters,
// the gradients and the moments. Then chapter 15's plan with offload against the measured step.
TEST_CASE("offload: the GPU keeps no optimizer state, the host's pinned memory does, and the measured step's "
          "device bytes are the plan's with offload",
          "[offload][memplan][cuda][lesson15]") {
    const int64_t on_gpu = pool_allocator(Device::CUDA).stats().in_use[int(Category::OptimizerState)];
    const Run off = train(adamw, Mode::Serial, DType::F32, 1);
    CHECK(pool_allocator(Device::CUDA).stats().in_use[int(Category::OptimizerState)] == on_gpu);  // none added
    const int64_t psi = gpt_num_params(*off.model, false);
    const MemoryStats host = static_cast<const OffloadedOptimizer&>(*off.optimizer).host_stats();
    // Masters and two moments (3 slabs), gradients (1): each 4Ψ plus the slab's alignment padding
    // (under 256 bytes a parameter).
    const int64_t padding = 256 * int64_t(off.model->parameters().size());
    CHECK(host.requested[int(Category::OptimizerState)] >= 3 * 4 * psi);
    CHECK(host.requested[int(Category::OptimizerState)] <= 3 * (4 * psi + padding));
    CHECK(host.requested[int(Category::Gradient)] >= 4 * psi);
    CHECK(host.requested[int(Category::Gradient)] <= 4 * psi + padding);
    CHECK(static_cast<const OffloadedOptimizer&>(*off.optimizer).bytes_each_way() == 4 * psi);

    // chapter 14's GPT (2 layers, width 96, context 32): a steady step measured on the device,
    // with and without offload, against the plan
    GPTConfig c = baby_gpt_config(65);
    c.n_layer = 2, c.n_embd = 96, c.block_size = 32, c.attention = AttentionKind::Textbook;
    const OffloadMeasured m = measure_gpt_offload(c, 4);
    INFO("planned " << m.offloaded.total() << " bytes with offload, measured " << m.offloaded_bytes << "; without: "
                    << "planned " << m.resident.total() << ", measured " << m.resident_bytes << "; host planned "
                    << m.offloaded.host << ", measured " << m.host_bytes);
    CHECK(double(m.offloaded.total()) == Approx(double(m.offloaded_bytes)).epsilon(0.03));
    CHECK(double(m.resident.total()) == Approx(double(m.resident_bytes)).epsilon(0.03));
    // what offload saves: the moments and their slabs' rounding
    CHECK(double(m.resident.total() - m.offloaded.total()) ==
          Approx(double(m.resident_bytes - m.offloaded_bytes)).epsilon(0.01));
    CHECK(double(m.offloaded.host) == Approx(double(m.host_bytes)).epsilon(0.03));
    CHECK(double(m.resident.total()) > 1.03 * double(m.offloaded_bytes));  // the plan without offload would not pass
}

// core/cuda_stream.h's CopyStream and Event, as the overlapped offload uses them. On the emulator a
// copy stream's copy runs only when something waits for it, so reading without the wait gets the
// old bytes (a GPU might do either).
TEST_CASE("a copy stream's copies run before what waits for them; on the emulator not before",
          "[offload][cuda][emu]") {
    float* device = static_cast<float*>(cuda::malloc_device(4 * sizeof(float)));
    float* pinned = static_cast<float*>(cuda::malloc_host(4 * sizeof(float)));
    REQUIRE(device);
    REQUIRE(pinned);
    const float zeros[4] = {}, ones[4] = {1, 2, 3, 4};
    float read[4] = {};
    cuda::copy_to_device(device, zeros, sizeof zeros);
    {
        cuda::CopyStream stream;
        cuda::Event up, ready, down;
        std::copy(ones, ones + 4, pinned);
        stream.copy_to_device(device, pinned, sizeof ones);  // up
        stream.record(up);
        cuda::copy_to_host(read, device, sizeof read);       // no wait
        if (cuda::is_emulated()) CHECK(read[2] == 0.0f);     // not run yet: the stale bytes
        cuda::launch_stream_wait(up);
        cuda::copy_to_host(read, device, sizeof read);
        CHECK(read[2] == 3.0f);

        cuda::copy_to_device(device, zeros, sizeof zeros);   // down, after the launch stream's work
        ready.record();
        stream.wait(ready);
        stream.copy_to_host(pinned, device, sizeof zeros);
        stream.record(down);
        if (cuda::is_emulated()) CHECK(pinned[2] == 3.0f);   // not yet
        down.synchronize();
        CHECK(pinned[2] == 0.0f);

        std::copy(ones, ones + 4, pinned);
        stream.copy_to_device(device, pinned, sizeof ones);
        // the stream's destructor runs what is left
    }
    cuda::copy_to_host(read, device, sizeof read);
    CHECK(read[3] == 4.0f);
    cuda::free_host(pinned);
    cuda::free_device(device);
}

TEST_CASE("offload: parameters on the CPU and optimizers it cannot run are refused by name",
          "[offload][optim][cpu][lesson15]") {
    auto model = make_gpt(small_gpt(), 1);  // on the CPU
    CHECK_THROWS_WITH(offload_optimizer(adamw(*model)),
                      Catch::Contains("parameter 'transformer.wte.weight'") && Catch::Contains("needs f32 parameters on cuda") &&
                          Catch::Contains("drop --offload"));
    struct Custom : Optimizer {
        using Optimizer::Optimizer;
        void step() override {}
        std::vector<Tensor> state_of(size_t) const override { return {}; }
    };
    model->to(Device::CUDA);
    CHECK_THROWS_WITH(offload_optimizer(std::make_unique<Custom>(model->parameters(), 0.1f, 0.0f)),
                      Catch::Contains("not an SGD, Adam or AdamW"));
    CHECK_THROWS_WITH(offload_optimizer(nullptr), Catch::Contains("no parameter groups"));
}
