// test_recompute.cpp — chapter 08's ways to keep fewer activations: no-grad mode (NoGradScope),
// recomputation (Checkpoint, nn/recompute.h) and the in-place ReLU (ReLU::InPlace). Each must
// compute exactly what the plain network computes — same bits — with fewer bytes.
//
// Run: make build/tests/kiln_tests && build/tests/kiln_tests '[lesson08]'
#include <cstring>
#include <memory>

#include <catch2/catch.hpp>

#include "core/allocator.h"
#include "fixtures.h"
#include "nn/layers.h"
#include "nn/misc.h"
#include "nn/models.h"
#include "nn/norm.h"
#include "nn/recompute.h"

using namespace kiln;
using Catch::Matchers::Contains;
using test::forward_backward;
using test::require_identical;

namespace {

// x [B, 3, H, W] ~ N(0, 1) and labels in [0, 10), seed 5, on `device`.
struct Data {
    Data(int64_t B, int64_t H, Device device = Device::CPU) {
        Rng rng(5);
        x = Tensor::normal({B, 3, H, H}, 0, 1, rng).to(device);
        Tensor labels = Tensor::empty({B}, DType::I32);
        for (int64_t i = 0; i < B; i++) labels.data<int32_t>()[i] = int32_t(rng.next_below(10));
        y = labels.to(device);
    }
    Tensor x, y;
};

// Every gradient and every buffer (running statistics) of two models of the same layout: the
// same bytes, in order.
void require_same_grads_and_buffers(Module& a, Module& b) {
    std::vector<Parameter*> pa = a.parameters(), pb = b.parameters();
    REQUIRE(pa.size() == pb.size());
    for (size_t i = 0; i < pa.size(); i++) {
        INFO(pa[i]->name << " vs " << pb[i]->name);
        require_identical(pb[i]->grad, pa[i]->grad);
    }
    auto ba = a.named_buffers(), bb = b.named_buffers();
    REQUIRE(ba.size() == bb.size());
    for (size_t i = 0; i < ba.size(); i++) {
        INFO(ba[i].first << " vs " << bb[i].first);
        require_identical(*bb[i].second, *ba[i].second);
    }
}

int64_t activation_in_use() { return pool_allocator(Device::CPU).stats().in_use[int(Category::Activation)]; }

// The most activation bytes alive at once during f, above those alive before it (the pool's).
template <typename F> int64_t activation_peak_of(F&& f) {
    PoolAllocator& pool = pool_allocator(Device::CPU);
    const int64_t before = activation_in_use();
    pool.reset_peak();
    f();
    return pool.stats().peak_use[int(Category::Activation)] - before;
}

}  // namespace

// ---- no-grad mode ------------------------------------------------------------------------------
TEST_CASE("NoGradScope: training-mode forward keeps no cache, batch norm still uses the batch",
          "[recompute][nograd][cpu][lesson08]") {
    Rng rng(2);
    Linear fc(6, 3, rng);
    BatchNorm1d bn(3);
    Tensor x = Tensor::normal({4, 6}, 0, 1, rng);
    Tensor dy = Tensor::ones({4, 3});
    Tensor y_plain = bn.forward(fc.forward(x));  // with caches: what no-grad must reproduce
    bn.backward(dy);
    fc.backward(dy);
    const Tensor mean_after_one = bn.running_mean.clone();
    REQUIRE(grad_enabled());
    {
        NoGradScope no_grad;
        REQUIRE_FALSE(grad_enabled());
        REQUIRE(fc.training());
        REQUIRE_FALSE(fc.keeps_cache());
        Tensor y = bn.forward(fc.forward(x));
        require_identical(y, y_plain);  // the batch's statistics, as in training
        REQUIRE_THROWS_WITH(fc.backward(dy), Contains("backward without a training-mode forward"));
        REQUIRE_THROWS_WITH(bn.backward(dy), Contains("backward without a training-mode forward"));
    }
    REQUIRE(grad_enabled());  // the scope ends, the switch is back
    // The running statistics moved once more (momentum 0.1 towards the same batch mean).
    REQUIRE(std::memcmp(bn.running_mean.raw(), mean_after_one.raw(), mean_after_one.nbytes()) != 0);
}

// ---- Checkpoint --------------------------------------------------------------------------------
TEST_CASE("Checkpoint: the CIFAR net's gradients and running statistics, bit for bit",
          "[recompute][cpu][lesson08]") {
    Rng r1(3), r2(3);
    auto plain = cifar_net(r1, {8, 16, 16}, true, false);
    auto ckpt = cifar_net(r2, {8, 16, 16}, true, true);
    REQUIRE(ckpt->named_parameters()[2].first == "block1a.inner.conv.weight");
    REQUIRE(ckpt->packed());
    Data d(4, 32);
    for (int step = 0; step < 2; step++) {  // the second step starts from updated running statistics
        INFO("step " << step + 1);
        const float a = forward_backward(*plain, d.x, d.y);
        const float b = forward_backward(*ckpt, d.x, d.y);
        REQUIRE(a == b);
        require_same_grads_and_buffers(*plain, *ckpt);
    }
}

// Recomputation must draw the masks the first forward drew; without the rewind of the Dropout's
// stream it would draw the next ones, and dW of fc1 would differ.
TEST_CASE("Checkpoint: dropout draws the same masks when recomputed", "[recompute][cpu][lesson08]") {
    auto block = [](Rng& rng) {
        auto m = std::make_unique<Sequential>("block");
        m->add("fc1", std::make_unique<Linear>(12, 32, rng));
        m->add("drop", std::make_unique<Dropout>(0.5f, 9));
        m->add("relu", std::make_unique<ReLU>());
        m->add("fc2", std::make_unique<Linear>(32, 10, rng));
        return m;
    };
    Rng r1(4), r2(4);
    auto plain = block(r1);
    Checkpoint ckpt(block(r2));
    Rng rng(6);
    Tensor x = Tensor::normal({8, 12}, 0, 1, rng);
    Tensor y = Tensor::empty({8}, DType::I32);
    for (int i = 0; i < 8; i++) y.data<int32_t>()[i] = i % 10;
    for (int step = 0; step < 2; step++) {
        INFO("step " << step + 1);
        REQUIRE(forward_backward(*plain, x, y) == forward_backward(ckpt, x, y));
        require_same_grads_and_buffers(*plain, ckpt);
        // the stream continues where a plain step leaves it: the next step draws new masks
        REQUIRE(static_cast<Dropout&>(ckpt.inner().module_at("drop")).rng.counter() ==
                static_cast<Dropout&>(plain->module_at("drop")).rng.counter());
    }
}

TEST_CASE("Checkpoint: in eval mode it is its inside, and keeps nothing", "[recompute][cpu][lesson08]") {
    Rng r1(4), r2(4);
    auto plain = make_deep_net(r1, 3, 4);
    auto ckpt = make_deep_net(r2, 3, 4, 2);
    plain->eval();
    ckpt->eval();
    Data d(2, 8);
    require_identical(ckpt->call(d.x), plain->call(d.x));
    REQUIRE_THROWS_WITH(ckpt->module_at("segment1").backward(Tensor::ones({2, 4, 8, 8})),
                        Contains("segment1: backward without a training-mode forward"));
}

// The deep net (conv-BN-ReLU layers) with a Checkpoint every 4 layers: the same gradients, and
// of its activations only the segments' inputs stay alive between forward and backward.
TEST_CASE("Checkpoint: the deep net keeps fewer activation bytes, same gradients", "[recompute][cpu][lesson08]") {
    Rng r1(8), r2(8);
    auto plain = make_deep_net(r1, 8, 8);
    auto ckpt = make_deep_net(r2, 8, 8, 4);
    Data d(4, 16);
    auto kept_after_forward = [&](Module& m) {
        const int64_t before = activation_in_use();
        Tensor logits = m.call(d.x);
        const int64_t kept = activation_in_use() - before;
        m.call_backward(Tensor::ones(logits.shape()));  // spend the caches
        return kept;
    };
    const int64_t plain_kept = kept_after_forward(*plain), ckpt_kept = kept_after_forward(*ckpt);
    const int64_t plain_peak = activation_peak_of([&] { forward_backward(*plain, d.x, d.y); });
    const int64_t ckpt_peak = activation_peak_of([&] { forward_backward(*ckpt, d.x, d.y); });
    INFO("kept " << plain_kept << " -> " << ckpt_kept << " bytes, peak " << plain_peak << " -> " << ckpt_peak);
    // One [4, 8, 16, 16] activation is 32 KiB. Plain: per layer BN's input and the ReLU's output
    // (= the next conv's input), 16 of them. Checkpointed: the two segments' inputs.
    const int64_t act = 4 * 8 * 16 * 16 * 4;
    CHECK(plain_kept >= 16 * act);
    CHECK(ckpt_kept < 3 * act);
    CHECK(ckpt_peak < plain_peak * 2 / 3);  // one segment recomputed at a time
    require_same_grads_and_buffers(*plain, *ckpt);
}

TEST_CASE("Checkpoint on the CUDA device: the same gradients as without", "[recompute][cuda][lesson08]") {
    Rng r1(8), r2(8);
    auto plain = make_deep_net(r1, 3, 4);
    auto ckpt = make_deep_net(r2, 3, 4, 2);
    plain->to(Device::CUDA);
    ckpt->to(Device::CUDA);
    Data d(2, 8, Device::CUDA);
    REQUIRE(forward_backward(*plain, d.x, d.y) == forward_backward(*ckpt, d.x, d.y));
    require_same_grads_and_buffers(*plain, *ckpt);
}

// ---- in-place ReLU ------------------------------------------------------------------------------
// Linear -> ReLU -> Linear: the Linear keeps its input, not its output, so the ReLU may write
// over it (layers.h). The same loss and gradients; one [16, 64] activation fewer at the
// forward's peak, and in a step arena (which frees nothing) one fewer in all.
TEST_CASE("ReLU in place: the same values, fewer bytes", "[inplace][cpu][lesson08]") {
    auto net = [](ReLU::Mode mode) {
        Rng rng(1);
        auto m = std::make_unique<Sequential>("net");
        m->add("fc1", std::make_unique<Linear>(32, 64, rng));
        m->add("relu", std::make_unique<ReLU>(mode));
        m->add("fc2", std::make_unique<Linear>(64, 10, rng));
        return m;
    };
    auto plain = net(ReLU::OutOfPlace), inplace = net(ReLU::InPlace);
    Rng rng(2);
    Tensor x = Tensor::normal({16, 32}, 0, 1, rng);
    Tensor y = Tensor::empty({16}, DType::I32);
    for (int i = 0; i < 16; i++) y.data<int32_t>()[i] = i % 10;
    const int64_t relu_bytes = 16 * 64 * 4;

    REQUIRE(forward_backward(*plain, x, y) == forward_backward(*inplace, x, y));
    require_same_grads_and_buffers(*plain, *inplace);
    // The forward's peak (the backward's, with its gradients, is the same for both): plain,
    // fc1's output and the ReLU's at once; in place, fc1's output (become the ReLU's) and the
    // logits [16, 10] (640 bytes, 1024 in the pool's 512-byte size classes).
    auto forward_peak = [&](Module& m) {
        Tensor logits;
        const int64_t peak = activation_peak_of([&] { logits = m.call(x); });
        m.call_backward(Tensor::ones(logits.shape()));  // spend the caches
        return peak;
    };
    CHECK(forward_peak(*plain) == 2 * relu_bytes);
    CHECK(forward_peak(*inplace) == relu_bytes + 1024);

    auto arena_bytes = [&](Module& m) {
        BumpAllocator arena("test arena", Device::CPU, size_t(1) << 20);
        {
            AllocatorScope scope(arena);
            forward_backward(m, x, y);
        }
        return int64_t(arena.high_water());
    };
    CHECK(arena_bytes(*inplace) == arena_bytes(*plain) - relu_bytes);
    // x itself is untouched: the ReLU wrote over fc1's output, not over the data
    Rng again(2);
    require_identical(x, Tensor::normal({16, 32}, 0, 1, again));
}
