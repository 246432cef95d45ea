// test_offload.cpp — the optimizer's state on the host (optim/offload.h, chapter 15): training
// steps with it are the GPU-resident optimizer's bit for bit on kiln's emulator (losses, weights,
// moments, the checkpoint's state; to 1e-5 on a GPU, whose compiler may fuse multiply-adds), the GPU keeps none of it while the host's pinned memory does, the measured
// step's device bytes equal chapter 15's plan with offload, and the bad uses are refused.
//
//   make test T='[offload]'
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <vector>

#include "core/allocator.h"
#include "core/cuda_memory.h"
#include "fixtures.h"
#include "nn/gpt.h"
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

// `steps` clipped training steps on the GPU (the emulator here), a new batch and a new lr each.
Run train(const MakeOptimizer& make, bool offload, DType amp, int steps) {
    const GPTConfig c = small_gpt();
    Run run;
    run.model = make_gpt(c, 1);
    run.model->to(Device::CUDA);
    run.optimizer = make(*run.model);
    if (offload) run.optimizer = offload_optimizer(std::move(run.optimizer));
    BumpAllocator arena("step", Device::CUDA);
    const StepOptions options{&arena, 1.0f, 1, nullptr, amp};
    for (int it = 0; it < steps; it++) {
        run.optimizer->set_lr(1e-2f / float(it + 1));
        const Tensor x = random_ids(3, c.block_size, c.vocab_size, 10 + it).to(Device::CUDA);
        const Tensor y = random_ids(3, c.block_size, c.vocab_size, 20 + it).to(Device::CUDA);
        const StepResult r = train_step(*run.model, *run.optimizer, x, y, options);
        REQUIRE(r.stepped);
        run.losses.push_back(r.loss);
    }
    return run;
}

std::unique_ptr<Optimizer> adamw(GPT& model) { return gpt_optimizer(model, GPTRecipe{}); }
std::unique_ptr<Optimizer> adam(GPT& model) {
    return std::make_unique<Adam>(decay_groups(model, 1e-2f, 0.1f), Adam::Options{}.with_amsgrad());
}
std::unique_ptr<Optimizer> sgd(GPT& model) {
    return std::make_unique<SGD>(decay_groups(model, 1e-2f, 1e-3f), SGD::Options{}.with_momentum(0.9f).with_nesterov());
}

}  // namespace

TEST_CASE("offload: steps with the optimizer's state on the host are the GPU's, bit for bit: losses, weights, "
          "moments, the checkpoint's state (AdamW, Adam with AMSGrad, SGD with Nesterov; f32 and bf16 autocast)",
          "[offload][optim][cuda][lesson15]") {
    struct Case { const char* name; MakeOptimizer make; DType amp; };
    for (const Case& k : {Case{"AdamW", adamw, DType::F32}, Case{"AdamW", adamw, DType::BF16}, Case{"Adam", adam, DType::F32},
                          Case{"SGD", sgd, DType::F32}}) {
        INFO(k.name << ", " << dtype_name(k.amp));
        const Run gpu = train(k.make, false, k.amp, 2), off = train(k.make, true, k.amp, 2);
        CHECK(same_losses(gpu.losses, off.losses));
        const std::vector<Parameter*> a = gpu.model->parameters(), b = off.model->parameters();
        REQUIRE(a.size() == b.size());
        for (size_t i = 0; i < a.size(); i++) {
            INFO(a[i]->name);
            CHECK(b[i]->value.device() == Device::CUDA);
            CHECK(same_values(a[i]->value, b[i]->value));
        }
        size_t n = 0;  // the state: on the GPU for one, on the host for the other, the same bits
        for (const ParamGroup& g : gpu.optimizer->param_groups()) n += g.params.size();
        for (size_t i = 0; i < n; i++) {
            const std::vector<Tensor> s = gpu.optimizer->state_of(i), t = off.optimizer->state_of(i);
            REQUIRE(s.size() == t.size());
            REQUIRE(!s.empty());
            for (size_t j = 0; j < s.size(); j++) {
                CHECK(s[j].device() == Device::CUDA);
                CHECK(t[j].device() == Device::CPU);
                CHECK(same_values(s[j], t[j]));
            }
        }
        StateDict sa, sb;  // the same keys and values: a checkpoint resumes with or without offload
        gpu.optimizer->save_state(sa, "optimizer");
        off.optimizer->save_state(sb, "optimizer");
        CHECK(sa.values == sb.values);
        REQUIRE(sa.tensors.size() == sb.tensors.size());
        for (const auto& [key, tensor] : sa.tensors) {
            INFO(key);
            REQUIRE(sb.tensors.count(key) == 1);
            CHECK(same_values(tensor, sb.tensors.at(key)));
        }
    }
}

TEST_CASE("offload: resumed from a checkpoint's state, an offloaded optimizer goes on as the straight run",
          "[offload][optim][cuda][lesson15]") {
    const GPTConfig c = small_gpt();
    const Run straight = train(adamw, true, DType::F32, 2);
    // A step on the GPU without offload, its state saved; a new model takes the weights and an
    // offloaded optimizer the state, and takes the second step.
    const Run first = train(adamw, false, DType::F32, 1);
    StateDict state;
    first.optimizer->save_state(state, "optimizer");
    auto model = make_gpt(c, 7);
    model->to(Device::CUDA);
    const std::vector<Parameter*> from = first.model->parameters(), to = model->parameters();
    for (size_t i = 0; i < to.size(); i++) to[i]->value.copy_from(from[i]->value);
    auto optimizer = offload_optimizer(adamw(*model));
    optimizer->load_state(state, "optimizer");
    CHECK(optimizer->steps() == 1);
    optimizer->set_lr(1e-2f / 2.0f);
    BumpAllocator arena("step", Device::CUDA);
    const Tensor x = random_ids(3, c.block_size, c.vocab_size, 11).to(Device::CUDA);
    const Tensor y = random_ids(3, c.block_size, c.vocab_size, 21).to(Device::CUDA);
    const float loss = train_step(*model, *optimizer, x, y, StepOptions{&arena, 1.0f}).loss;
    CHECK(same_losses({loss}, {straight.losses[1]}));
    const std::vector<Parameter*> want = straight.model->parameters();
    for (size_t i = 0; i < to.size(); i++) {
        INFO(to[i]->name);
        CHECK(same_values(to[i]->value, want[i]->value));
    }
}

// The device's bytes by category (the CUDA pool's accounting) after steps with and without
// offload: the optimizer's state leaves the GPU, and the host's pinned memory holds the masters,
// the gradients and the moments. Then chapter 15's plan with offload against the measured step.
TEST_CASE("offload: the GPU keeps no optimizer state, the host's pinned memory does, and the measured step's "
          "device bytes are the plan's with offload",
          "[offload][memplan][cuda][lesson15]") {
    const int64_t on_gpu = pool_allocator(Device::CUDA).stats().in_use[int(Category::OptimizerState)];
    const Run off = train(adamw, true, DType::F32, 1);
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
