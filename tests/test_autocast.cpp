// test_autocast.cpp — chapter 09's autocast (ops/autocast.h): the policy table, the weights'
// low-precision copies (made once per scope, counted as "weight copy"), the types of every
// tensor a step makes, and an f16/bf16 step against the f32 one within bounds derived from the
// formats' unit roundoff.
//
// Run: make build/tests/kiln_tests && build/tests/kiln_tests '[autocast]'
#include <catch2/catch.hpp>
#include <cmath>
#include <memory>

#include "core/allocator.h"
#include "fixtures.h"
#include "nn/layers.h"
#include "nn/misc.h"
#include "nn/models.h"
#include "ops/attention.h"
#include "ops/autocast.h"
#include "ops/conv.h"
#include "ops/elementwise.h"
#include "ops/pool.h"
#include "ops/loss.h"
#include "ops/ops.h"
#include "train/loop.h"

using namespace kiln;

namespace {

// Unit roundoff (half the gap between 1 and the next number): f16 2^-11, bf16 2^-8.
double unit_roundoff(DType t) { return test::low_format(t).u; }

// zero_grad, then train_step's forward and backward (train/loop.h; the model's input needs no
// gradient); with a loss scale s, backward runs on s·L and the gradients are divided by s
// after (a GradScaler's work, optim/grad_scaler.h, without its inf checks).
float forward_backward(Module& m, const Tensor& x, const Tensor& y, float loss_scale = 1.0f) {
    m.input_needs_grad = false;
    m.zero_grad();
    const float loss = kiln::forward_backward(m, x, y, loss_scale, nullptr).first;
    if (loss_scale != 1.0f)
        for (Parameter* p : m.parameters()) scale_(p->grad, 1.0f / loss_scale);
    return loss;
}

// a·b / (‖a‖·‖b‖): 1 when the two point the same way.
double cosine(const Tensor& a, const Tensor& b) {
    Tensor fa = a.to(DType::F32), fb = b.to(DType::F32);
    double dot = 0, na = 0, nb = 0;
    for (int64_t i = 0; i < fb.numel(); i++) {
        const double x = fa.data<float>()[i], y = fb.data<float>()[i];
        dot += x * y, na += x * x, nb += y * y;
    }
    return dot / std::sqrt(na * nb);
}

// ‖a − b‖ / ‖b‖ over all elements, both read as f32.
double relative_error(const Tensor& a, const Tensor& b) {
    Tensor fa = a.to(DType::F32), fb = b.to(DType::F32);
    double diff = 0, norm = 0;
    for (int64_t i = 0; i < fb.numel(); i++) {
        const double d = double(fa.data<float>()[i]) - double(fb.data<float>()[i]);
        diff += d * d;
        norm += double(fb.data<float>()[i]) * double(fb.data<float>()[i]);
    }
    return std::sqrt(diff / norm);
}

// How much a layer y = x·Wᵀ amplifies the rounding of its factors: each product x_i·w_ji is
// off by up to about 2u of its size (x and w each rounded once), so y_nj by up to
// 2u·Σ_i |x_ni·w_ji| — relative to y, 2u times κ = ‖|x|·|W|ᵀ‖ / ‖x·Wᵀ‖ (norms over all n, j),
// which is large when the terms' signs cancel (κ ≈ 20 for 784 pixels and random-sign weights).
double condition(const Tensor& x, const Tensor& w) {
    const int64_t N = x.size(0), K = x.size(1), J = w.size(0);
    double abs_norm = 0, norm = 0;
    for (int64_t n = 0; n < N; n++)
        for (int64_t j = 0; j < J; j++) {
            double sum = 0, abs_sum = 0;
            for (int64_t i = 0; i < K; i++) {
                const double t = double(x.data<float>()[n * K + i]) * double(w.data<float>()[j * K + i]);
                sum += t;
                abs_sum += std::fabs(t);
            }
            norm += sum * sum;
            abs_norm += abs_sum * abs_sum;
        }
    return std::sqrt(abs_norm / norm);
}

Tensor labels(int64_t n, Rng& rng) {
    Tensor y = Tensor::empty({n}, DType::I32);
    for (int64_t i = 0; i < n; i++) y.data<int32_t>()[i] = int32_t(rng.next_below(10));
    return y;
}

}  // namespace

TEST_CASE("autocast: the policy table and the types it gives", "[autocast][lesson09][cpu]") {
    for (CastPolicy c : {CastPolicy::LowPrecision, CastPolicy::F32, CastPolicy::Widest, CastPolicy::Input})
        CHECK(cast_policy(c) == c);  // each class runs under its own policy unless overridden
    {
        CastPolicyOverride f32(CastPolicy::Input, CastPolicy::F32);
        CHECK(cast_policy(CastPolicy::Input) == CastPolicy::F32);
        CHECK(cast_policy(CastPolicy::Widest) == CastPolicy::Widest);
    }
    CHECK(cast_policy(CastPolicy::Input) == CastPolicy::Input);
    // No scope: every op keeps its input's type; Add promotes mixed types anyway.
    CHECK(autocast_dtype() == DType::F32);
    CHECK(autocast_target(CastPolicy::LowPrecision, DType::F32) == DType::F32);
    CHECK(autocast_target(CastPolicy::Widest, DType::F16, DType::F32) == DType::F32);
    CHECK(autocast_target(CastPolicy::Widest, DType::BF16, DType::BF16) == DType::BF16);
    {
        AutocastScope amp(DType::BF16);
        CHECK(autocast_dtype() == DType::BF16);
        CHECK(autocast_target(CastPolicy::LowPrecision, DType::F32) == DType::BF16);
        CHECK(autocast_target(CastPolicy::F32, DType::BF16) == DType::F32);
        CHECK(autocast_target(CastPolicy::Input, DType::BF16) == DType::BF16);
        CHECK(autocast_target(CastPolicy::Widest, DType::F16, DType::BF16) == DType::F32);
        {
            AutocastScope inner(DType::F16);  // scopes nest; the inner one ends first
            CHECK(autocast_dtype() == DType::F16);
        }
        CHECK(autocast_dtype() == DType::BF16);
    }
    CHECK(autocast_dtype() == DType::F32);
    REQUIRE_THROWS_WITH(AutocastScope(DType::F32), Catch::Contains("must be f16 or bf16"));
}

TEST_CASE("autocast: a weight's copy is made once per scope, counted as 'weight copy', freed with the scope",
          "[autocast][lesson09][cpu]") {
    Rng rng(1);
    Tensor w = Tensor::uniform({64, 32}, -1, 1, rng, Device::CPU, Category::Parameter);
    const auto copies_in_use = [] { return device_memory_stats(Device::CPU).in_use[int(Category::WeightCopy)]; };
    const int64_t before = copies_in_use();
    CHECK(AmpCast(CastPolicy::LowPrecision, DType::F32).weight(w).raw() == w.raw());  // no scope: the parameter itself
    {
        AutocastScope amp(DType::F16);
        const AmpCast conv(CastPolicy::LowPrecision, DType::F32);
        const Tensor a = conv.weight(w);
        const Tensor b = conv.weight(w);
        CHECK(a.raw() == b.raw());  // the same copy, not a second one
        CHECK(a.dtype() == DType::F16);
        CHECK(a.category() == Category::WeightCopy);
        CHECK(copies_in_use() - before >= 64 * 32 * 2);
        CHECK(float(a.data<f16>()[5]) == float(f16(w.data<float>()[5])));  // rounded to nearest even
        CHECK(!conv.weight(Tensor()).defined());
    }
    CHECK(copies_in_use() == before);
}

namespace {

// One op of a class, run forward and backward on an input of type `in`: the types its output
// and its dx come out in.
using test::AmpRun;
using OpRun = AmpRun (*)(DType in);

Tensor input(const Shape& s, DType t) {
    Rng rng(7);
    return Tensor::uniform(s, -1, 1, rng).to(t);
}
Tensor param(const Shape& s) {
    Rng rng(8);
    return Tensor::uniform(s, -0.5f, 0.5f, rng, Device::CPU, Category::Parameter);
}

AmpRun run_conv2d(DType in) {
    Tensor x = input({2, 3, 6, 6}, in), w = param({4, 3, 3, 3}), b = param({4}), saved;
    Tensor y = conv2d(x, w, b, Conv2dArgs{}, &saved);
    Tensor dw = Tensor::zeros(w.shape()), db = Tensor::zeros(b.shape());
    return {y.dtype(), conv2d_backward(saved, w, Tensor::ones(y.shape(), y.dtype()), dw, db, true, Conv2dArgs{}).dtype()};
}
AmpRun run_linear(DType in) {
    Tensor x = input({4, 6}, in), w = param({5, 6}), b = param({5}), saved;
    Tensor y = linear(x, w, b, &saved);
    Tensor dw = Tensor::zeros(w.shape()), db = Tensor::zeros(b.shape());
    return {y.dtype(), linear_backward(saved, w, Tensor::ones(y.shape(), y.dtype()), dw, db, true).dtype()};
}
AmpRun run_cross_entropy(DType in) {
    Tensor z = input({4, 10}, in), dz;
    Tensor labels = Tensor::zeros({4}, DType::I32);
    softmax_cross_entropy(z, labels, &dz);
    return {dz.dtype(), dz.dtype()};
}
AmpRun run_add(DType in) {
    Tensor y = add(input({4}, in), input({4}, in));
    return {y.dtype(), y.dtype()};
}
AmpRun run_maxpool(DType in) {
    Tensor x = input({2, 2, 4, 4}, in), argmax;
    Tensor y = maxpool2d(x, Pool2dArgs{2, 2, 0}, &argmax);
    CHECK(avgpool2d(x, Pool2dArgs{2, 2, 0}).dtype() == y.dtype());
    CHECK(global_avgpool(x).dtype() == y.dtype());
    return {y.dtype(), maxpool2d_backward(input(y.shape(), in), argmax, x.shape(), Pool2dArgs{2, 2, 0}).dtype()};
}
AmpRun run_avgpool_backward(DType in) {
    const Tensor dx = avgpool2d_backward(input({2, 2, 2, 2}, in), Shape{2, 2, 4, 4}, Pool2dArgs{2, 2, 0});
    return {dx.dtype(), global_avgpool_backward(input({2, 2}, in), Shape{2, 2, 4, 4}).dtype()};
}
AmpRun run_relu(DType in) {
    Tensor y = relu(input({8}, in));
    return {y.dtype(), relu_backward(y, input({8}, in)).dtype()};
}
AmpRun run_gelu(DType in) {
    Tensor saved;
    Tensor y = gelu(input({8}, in), &saved);
    return {y.dtype(), gelu_backward(saved, input({8}, in)).dtype()};
}
AmpRun run_dropout(DType in) {
    Tensor mask;
    Tensor y = dropout(input({8}, in), 0.5f, 1, 0, &mask);
    return {y.dtype(), dropout_backward(input({8}, in), mask, 0.5f).dtype()};
}
AmpRun run_attention(DType in) {
    Tensor qkv = input({1, 3, 12}, in), saved, saved_flash;
    Tensor y = causal_self_attention(qkv, 2, AttentionKind::Textbook, {}, &saved);
    Tensor dqkv = causal_self_attention_backward(qkv, y, saved, input(y.shape(), in), 2, AttentionKind::Textbook, {});
    Tensor yf = causal_self_attention(qkv, 2, AttentionKind::Flash, {}, &saved_flash);
    CHECK(causal_self_attention_backward(qkv, yf, saved_flash, input(y.shape(), in), 2, AttentionKind::Flash, {})
              .dtype() == dqkv.dtype());
    Tensor k = Tensor::zeros({1, 5, 4}, y.dtype()), v = Tensor::zeros({1, 5, 4}, y.dtype());
    CHECK(yf.dtype() == y.dtype());
    CHECK(cached_attention(input({1, 1, 12}, in), k, v, 2, 2).dtype() == y.dtype());
    return {y.dtype(), dqkv.dtype()};
}
AmpRun run_softmax(DType in) {
    Tensor y = softmax(input({2, 5}, in));
    return {y.dtype(), softmax_backward(y, input({2, 5}, in)).dtype()};
}

}  // namespace

// Each op reads its class's policy where it dispatches (test::check_autocast_class: the class's
// type, then the class overridden to F32 and to LowPrecision). Here some ops of every class; each
// op's own test file checks it too (batch norm and layer norm: test_norm.cpp).
TEST_CASE("autocast: every class is what its ops run in", "[autocast][lesson09][cpu]") {
    const std::vector<std::pair<CastPolicy, std::vector<OpRun>>> classes = {
        {CastPolicy::LowPrecision, {run_conv2d, run_linear, run_attention}},
        {CastPolicy::F32, {run_cross_entropy, run_softmax}},
        {CastPolicy::Widest, {run_add}},
        {CastPolicy::Input, {run_maxpool, run_avgpool_backward, run_relu, run_gelu, run_dropout}},
    };
    for (const auto& [op_class, ops] : classes) {
        INFO("class " << int(op_class));
        for (OpRun run : ops) test::check_autocast_class(op_class, run);
    }
}

// Chapter 09's exercise 4: the Input class at F32 changes what runs — batch norm and the layers
// after it up to the next convolution compute in f32, and a layer's dx goes back in its input's
// type.
TEST_CASE("autocast: the Input class at f32 runs the CIFAR net's batch norms in f32", "[autocast][lesson09][cpu]") {
    Rng rng(4);
    Tensor x = Tensor::normal({4, 3, 32, 32}, 0, 1, rng);
    Rng init(1);
    std::unique_ptr<Module> net = cifar_net(init, {8, 16, 32});
    net->input_needs_grad = false;
    AutocastScope amp(DType::F16);
    DType bn_out = DType::F16;
    net->module_at("block1a.bn").register_forward_hook([&](Module&, const Tensor&, Tensor& y) { bn_out = y.dtype(); });
    net->call(x);
    CHECK(bn_out == DType::F16);  // batch norm's class, Input: the input's type
    CastPolicyOverride f32(CastPolicy::Input, CastPolicy::F32);
    Tensor logits = net->call(x);
    CHECK(bn_out == DType::F32);
    CHECK(logits.dtype() == DType::F16);  // the head is a Linear: low precision again
    net->call_backward(Tensor::zeros(logits.shape(), logits.dtype()));
}

TEST_CASE("autocast: an MLP step in f16 and bf16 against f32, every gradient f32", "[autocast][lesson09][cpu]") {
    for (DType low : {DType::F16, DType::BF16}) {
        INFO(dtype_name(low));
        Rng rng(3);
        std::unique_ptr<Module> model = mlp(rng, 64, 32);
        Tensor x = Tensor::uniform({16, 1, 28, 28}, 0, 1, rng);
        Tensor y = labels(16, rng);
        const float loss32 = forward_backward(*model, x, y);
        std::vector<Tensor> grads32;
        for (Parameter* p : model->parameters()) grads32.push_back(p->grad.clone());

        AutocastScope amp(low);
        Tensor logits = model->call(x);
        CHECK(logits.dtype() == low);  // the last Linear ran in the low type
        const float loss = forward_backward(*model, x, y);
        // Every value on the way is rounded to the low type a few times (the input and weight
        // copies, each layer's output, each gradient): a handful of roundings of relative size u
        // each, on a loss of about log(10). 8u covers them with room; the sums themselves are f32.
        const double u = unit_roundoff(low);
        CHECK(std::fabs(loss - loss32) <= 8 * u * std::fabs(loss32));
        // The gradients inherit the first layer's error (2u·κ relative, `condition`), carried
        // through the softmax and the second layer, plus a few roundings of their own (each
        // gradient is rounded to the low type once before it is widened): 2u·κ + 4u.
        const double kappa = condition(x.reshape({16, 784}), model->parameters()[0]->value);
        INFO("kappa of fc1 " << kappa);
        std::vector<Parameter*> params = model->parameters();
        for (size_t i = 0; i < params.size(); i++) {
            INFO(params[i]->name);
            CHECK(params[i]->value.dtype() == DType::F32);  // master weights
            CHECK(params[i]->grad.dtype() == DType::F32);
            CHECK(relative_error(params[i]->grad, grads32[i]) <= 2 * u * kappa + 4 * u);
        }
    }
}

TEST_CASE("autocast: a residual sums an f16 body and an f32 shortcut in f32, and sends each its dy in its type",
          "[autocast][lesson09][cpu]") {
    Rng rng(2);
    auto body = std::make_unique<Sequential>("body");
    body->add("fc", std::make_unique<Linear>(8, 8, rng));
    Residual res(std::move(body));
    Tensor x = Tensor::uniform({4, 8}, -1, 1, rng);
    AutocastScope amp(DType::F16);
    Tensor out = res.call(x);
    CHECK(out.dtype() == DType::F32);  // f16 body + the f32 identity: the wider
    Tensor dx = res.call_backward(Tensor::ones({4, 8}));
    CHECK(dx.dtype() == DType::F32);  // the input's type
}

TEST_CASE("autocast: the CIFAR net in f16 keeps half the activation bytes and trains like f32",
          "[autocast][lesson09][cpu]") {
    Rng rng(4);
    Tensor x = Tensor::normal({8, 3, 32, 32}, 0, 1, rng);
    Tensor y = labels(8, rng);
    // The activations kept for backward: what the activation category holds after forward.
    const auto kept_after_forward = [&](Module& m, DType low) {
        const int64_t before = device_memory_stats(Device::CPU).in_use[int(Category::Activation)];
        std::unique_ptr<AutocastScope> amp;
        if (low != DType::F32) amp = std::make_unique<AutocastScope>(low);
        Tensor logits = m.call(x);
        const int64_t kept = device_memory_stats(Device::CPU).in_use[int(Category::Activation)] - before;
        m.call_backward(Tensor::zeros(logits.shape(), logits.dtype()));
        return kept;
    };
    for (DType low : {DType::F16, DType::BF16}) {
        INFO(dtype_name(low));
        Rng init(1);
        std::unique_ptr<Module> net = cifar_net(init, {8, 16, 32});
        net->input_needs_grad = false;
        const int64_t kept32 = kept_after_forward(*net, DType::F32);
        const int64_t kept16 = kept_after_forward(*net, low);
        INFO("kept for backward: f32 " << kept32 << " bytes, " << dtype_name(low) << " " << kept16);
        // Every kept tensor is half the bytes, except BN's per-channel statistics (f32, a few
        // hundred bytes) and the pool's i32 argmax: between 1/2 and 0.6 of f32's.
        CHECK(kept16 >= kept32 / 2);
        CHECK(kept16 <= kept32 * 6 / 10);

        const float loss32 = forward_backward(*net, x, y);
        std::vector<Tensor> g32;
        for (Parameter* p : net->parameters()) g32.push_back(p->grad.clone());
        AutocastScope amp(low);
        // f16's smallest normal number is 2^-14: gradients deep in the net fall below it and
        // lose their digits as subnormals unless the loss is scaled; 2^10 lifts them into the
        // normal range. bf16 has f32's range: no scale.
        const float loss = forward_backward(*net, x, y, low == DType::F16 ? 1024.0f : 1.0f);
        const double u = unit_roundoff(low);
        // The loss: a few roundings per layer over about 15 layers, 32u.
        CHECK(std::fabs(loss - loss32) <= 32 * u * std::fabs(loss32));
        // The head's gradient, dW = dyᵀ·h: dy rounded once to the low type, h (the pooled
        // features) carrying the forward's error, so a few u: 4u.
        std::vector<Parameter*> params = net->parameters();
        REQUIRE(params.back()->name == "head.weight");
        CHECK(relative_error(params.back()->grad, g32.back()) <= 4 * u);
        // Below the head no bound in u holds element by element: a max-pool sends each gradient
        // to its window's largest input, and rounding changes the winner of a near-tie now and
        // then, moving a whole gradient entry; batch norm's backward subtracts the batch means
        // of dy and dy·x̂, which cancel on a batch of 8. What must hold is that each gradient
        // points the same way as f32's (the lesson's full runs check that training follows).
        for (size_t i = 0; i < params.size(); i++) {
            INFO(params[i]->name << ": relative error " << relative_error(params[i]->grad, g32[i]));
            CHECK(cosine(params[i]->grad, g32[i]) >= 0.9);
        }
    }
}

TEST_CASE("autocast: LeNet in f16 on the CUDA device (emulator) computes what the CPU computes",
          "[autocast][lesson09][cuda]") {
    Rng rng(6);
    Tensor x = Tensor::uniform({4, 1, 28, 28}, 0, 1, rng);
    Tensor y = labels(4, rng);
    Rng init_cpu(1), init_gpu(1);
    std::unique_ptr<Module> cpu_net = lenet(init_cpu), gpu_net = lenet(init_gpu);
    gpu_net->to(Device::CUDA);
    AutocastScope amp(DType::F16);
    const float cpu_loss = forward_backward(*cpu_net, x, y, 1024.0f);
    const float gpu_loss = forward_backward(*gpu_net, x.to(Device::CUDA), y.to(Device::CUDA), 1024.0f);
    // The same roundings to f16 on both sides; only the f32 sums' order differs (2^-24 each),
    // which can flip an f16 rounding now and then: u on the loss, 4u on the head's gradient.
    const double u = unit_roundoff(DType::F16);
    CHECK(std::fabs(cpu_loss - gpu_loss) <= u * std::fabs(cpu_loss));
    Tensor cpu_head = cpu_net->parameters().back()->grad;
    Tensor gpu_head = gpu_net->parameters().back()->grad.to(Device::CPU);
    CHECK(gpu_head.dtype() == DType::F32);
    CHECK(relative_error(gpu_head, cpu_head) <= 4 * u);
}
