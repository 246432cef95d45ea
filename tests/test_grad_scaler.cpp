// test_grad_scaler.cpp — loss scaling (chapter 09): GradScaler's rules replayed step by step
// against sequences written by hand from PyTorch's rules, its checks on the call order, the
// unscale_and_check_ kernel on the CPU and the CUDA emulator, train_step and train_epoch with a
// scaler (a skipped step changes nothing and training goes on), exact resume with the scaler's
// state, its place in run.json and curves.svg, --amp, and the --grad-hist histogram.
//
//   build/tests/kiln_tests '[scaler]'
#include <catch2/catch.hpp>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <vector>

#include "core/rng.h"
#include "data/idx.h"
#include "data/loader.h"
#include "fixtures.h"
#include "nn/layers.h"
#include "nn/models.h"
#include "ops/ops.h"
#include "ops/optim.h"
#include "optim/grad_scaler.h"
#include "optim/optimizer.h"
#include "optim/scheduler.h"
#include "train/checkpoint.h"
#include "train/cli.h"
#include "train/fit.h"
#include "train/grad_hist.h"
#include "train/loop.h"
#include "train/progress.h"
#include "train/run_log.h"

using namespace kiln;
using Catch::Contains;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// A packed one-layer model (3 inputs, 2 outputs: 8 parameters) and plain SGD on it.
struct Tiny {
    Rng rng{7};
    Sequential model{"tiny"};
    Tiny() {
        model.emplace<Linear>(3, 2, rng, true, "fc");
        model.pack();
    }
    // Every gradient := value, then grads[0] := first (the scaled gradients of a step).
    void set_grads(float value, float first) {
        Tensor g = model.grads_view();
        fill_(g, value);
        model.parameters()[0]->grad.data<float>()[0] = first;
    }
};

// Bytes of every parameter, to see whether a step changed any.
std::vector<float> values(Module& m) {
    std::vector<float> v;
    for (Parameter* p : m.parameters())
        v.insert(v.end(), p->value.data<float>(), p->value.data<float>() + p->value.numel());
    return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

const ImageSet& mnist_small() {
    static ImageSet set = take_spread(load_mnist("data/mnist", true), 256);
    return set;
}

LoaderOptions loader_options() { return {64, true, false, 1, {0.1307f}, {0.3081f}, Device::CPU}; }

}  // namespace

// ---- the rules, step by step -------------------------------------------------------------------

// init_scale 2^16, growth_interval 3, an inf or NaN in the gradients at steps 3, 4 and 10 of 12.
// PyTorch's update(): inf → S·0.5, tracker 0 (the step skipped); clean → tracker + 1, and at 3,
// S·2 and tracker 0. So:
//   step  grads  stepped  tracker  S
//    1    clean  yes      1        65536
//    2    clean  yes      2        65536
//    3    +inf   no       0        32768    backoff
//    4    NaN    no       0        16384    backoff again: NaN counts as inf
//    5    clean  yes      1        16384
//    6    clean  yes      2        16384
//    7    clean  yes      0        32768    3 clean steps in a row: growth
//    8    clean  yes      1        32768
//    9    clean  yes      2        32768
//   10    −inf   no       0        16384    backoff
//   11    clean  yes      1        16384
//   12    clean  yes      2        16384
TEST_CASE("GradScaler replays PyTorch's rules: backoff on inf/NaN, growth after growth_interval clean steps",
          "[scaler][lesson09][cpu]") {
    struct Expected {
        float bad;  // 0: clean, else the value put in the gradients
        bool stepped;
        int64_t tracker;
        float scale;
    };
    const std::vector<Expected> script = {
        {0, true, 1, 65536},     {0, true, 2, 65536},     {kInf, false, 0, 32768}, {kNaN, false, 0, 16384},
        {0, true, 1, 16384},     {0, true, 2, 16384},     {0, true, 0, 32768},     {0, true, 1, 32768},
        {0, true, 2, 32768},     {-kInf, false, 0, 16384}, {0, true, 1, 16384},    {0, true, 2, 16384}};
    Tiny t;
    SGD sgd(t.model.parameters(), 0.1f);
    GradScaler::Options o;
    o.growth_interval = 3;
    GradScaler scaler(o);
    REQUIRE(scaler.loss_scale() == 65536.0f);
    int64_t steps = 0;
    for (size_t i = 0; i < script.size(); i++) {
        INFO("step " << i + 1);
        const Expected& e = script[i];
        t.set_grads(0.25f * scaler.loss_scale(), e.bad != 0 || std::isnan(e.bad) ? e.bad : 0.5f);
        const std::vector<float> before = values(t.model);
        const bool stepped = scaler.step(sgd, t.model);
        scaler.update();
        REQUIRE(stepped == e.stepped);
        REQUIRE(same_bits(values(t.model), before) == !e.stepped);  // a skipped step changes nothing
        REQUIRE(scaler.growth_tracker() == e.tracker);
        REQUIRE(scaler.loss_scale() == e.scale);
        steps += stepped;
        REQUIRE(sgd.steps() == steps);
    }
    REQUIRE(sgd.steps() == 9);
}

TEST_CASE("GradScaler enforces PyTorch's call order", "[scaler][lesson09][cpu]") {
    Tiny t;
    SGD sgd(t.model.parameters(), 0.1f);
    GradScaler scaler;
    t.set_grads(1.0f, 1.0f);
    REQUIRE_THROWS_WITH(scaler.update(), Contains("update() without an inf check"));
    scaler.unscale_(t.model);
    REQUIRE_THROWS_WITH(scaler.unscale_(t.model), Contains("unscale_() has already been called since the last update()"));
    StateDict s;
    REQUIRE_THROWS_WITH(scaler.save_state(s, "scaler"), Contains("after update()"));
    REQUIRE(scaler.step(sgd, t.model));  // the step after an explicit unscale_ does not unscale again
    REQUIRE_THROWS_WITH(scaler.step(sgd, t.model), Contains("step() has already been called"));
    REQUIRE_THROWS_WITH(scaler.unscale_(t.model), Contains("after step()"));
    scaler.update();
    scaler.unscale_(t.model);  // a new step
    REQUIRE_THROWS_AS(GradScaler(GradScaler::Options{65536.0f, 1.0, 0.5, 2000, true}), Error);  // growth ≤ 1
    REQUIRE_THROWS_WITH(GradScaler(GradScaler::Options{65536.0f, 2.0, 1.5, 2000, true}), Contains("backoff_factor"));
    REQUIRE_THROWS_WITH(GradScaler(GradScaler::Options{65536.0f, 2.0, 0.5, 0, true}), Contains("growth_interval"));
}

// unscale_ multiplies by float(1 / double(S)); with S = 3 (not a power of two, so the rounding
// shows) the step must equal SGD on gradients multiplied by that float, bit for bit.
TEST_CASE("the optimizer steps on the unscaled gradients", "[scaler][lesson09][cpu]") {
    GradScaler::Options o;
    o.init_scale = 3.0f;
    GradScaler scaler(o);
    const float inv_scale = float(1.0 / 3.0);
    Tiny scaled, plain;
    SGD sgd_scaled(scaled.model.parameters(), 0.1f), sgd_plain(plain.model.parameters(), 0.1f);
    Rng rng(3);
    Tensor g = scaled.model.grads_view(), h = plain.model.grads_view();
    for (int64_t i = 0; i < g.numel(); i++) {
        const float v = float(rng.next_below(1000)) / 7.0f;
        g.data<float>()[i] = v;
        h.data<float>()[i] = v * inv_scale;
    }
    REQUIRE(scaler.step(sgd_scaled, scaled.model));
    sgd_plain.step();
    REQUIRE(same_bits(values(scaled.model), values(plain.model)));
}

TEST_CASE("a growth that would make the scale inf is not applied", "[scaler][lesson09][cpu]") {
    Tiny t;
    SGD sgd(t.model.parameters(), 0.1f);
    GradScaler::Options o;
    o.init_scale = 0x1p127f;  // 2^127 · 2 = 2^128 is past FLT_MAX (just under 2^128): inf
    o.growth_interval = 1;
    GradScaler scaler(o);
    t.set_grads(0.0f, 0.0f);
    REQUIRE(scaler.step(sgd, t.model));
    scaler.update();
    REQUIRE(scaler.loss_scale() == 0x1p127f);  // kept, not grown to inf
    REQUIRE(scaler.growth_tracker() == 0);     // but the count restarts, as in PyTorch
    // FLT_MAX / 1.5 grows to FLT_MAX · 4/3: also past f32's range, also kept.
    o.init_scale = FLT_MAX / 1.5f;
    GradScaler near_max(o);
    t.set_grads(0.0f, 0.0f);
    near_max.step(sgd, t.model);
    near_max.update();
    REQUIRE(near_max.loss_scale() == FLT_MAX / 1.5f);
}

TEST_CASE("unscale_ on a model that is not packed checks and unscales every gradient", "[scaler][lesson09][cpu]") {
    Rng rng(2);
    Linear fc(3, 2, rng);  // its weight and bias in two blocks of their own
    GradScaler scaler;
    fill_(fc.weight.grad, 2.0f);
    fill_(fc.bias.grad, 4.0f);
    fc.bias.grad.set({1}, kNaN);  // in the last gradient
    scaler.unscale_(fc);
    REQUIRE(scaler.found_inf());
    REQUIRE(fc.weight.grad.get({1, 2}) == 0x1p-15);
    REQUIRE(fc.bias.grad.get({0}) == 0x1p-14);
}

// A packed model's gradients are views into one slab, 256-byte aligned, with padding between
// them. With 1/scale = inf (a scale below 2^-128) a clean step makes every gradient inf — and
// would make the padding 0 · inf = NaN, for the next step's check to find if it read the slab.
TEST_CASE("unscale_ checks the gradients, not the padding between them in the slab", "[scaler][lesson09][cpu]") {
    Rng rng(1);
    auto model = mlp(rng, 3, 5);  // fc1.weight: 3 × 784 floats = 9408 bytes, then 192 of padding
    REQUIRE(model->packed());
    REQUIRE(model->grads_view().numel() > model->num_parameters());
    GradScaler scaler(GradScaler::Options{1e-40f, 2.0, 0.5, 2000, true});  // 1 / 1e-40 overflows f32
    for (int step = 0; step < 2; step++) {
        INFO("step " << step + 1);
        for (Parameter* p : model->parameters()) fill_(p->grad, 1.0f);  // new finite gradients, no zero_grad
        scaler.unscale_(*model);
        REQUIRE_FALSE(scaler.found_inf());
        REQUIRE(std::isinf(model->parameters()[0]->grad.get({0, 0})));
        scaler.update();
    }
}

TEST_CASE("a disabled GradScaler does nothing but step", "[scaler][lesson09][cpu]") {
    Tiny t;
    SGD sgd(t.model.parameters(), 0.1f);
    GradScaler::Options o;
    o.enabled = false;
    GradScaler scaler(o);
    REQUIRE(scaler.loss_scale() == 1.0f);
    t.set_grads(kInf, kInf);
    scaler.unscale_(t.model);
    REQUIRE(scaler.step(sgd, t.model));  // no check: the optimizer steps
    scaler.update();
    REQUIRE(sgd.steps() == 1);
}

// ---- the kernel -------------------------------------------------------------------------------

namespace {

// n values of both signs over many binades, bad (if not 0) at `at`.
Tensor scaled_grads(int64_t n, int64_t at, float bad, Device device) {
    Tensor g = Tensor::empty({n}, DType::F32, Device::CPU);
    Rng rng(5);
    for (int64_t i = 0; i < n; i++)
        g.data<float>()[i] = std::ldexp(float(rng.next_below(1u << 20)) - float(1 << 19), int(rng.next_below(40)) - 20);
    if (bad != 0 || std::isnan(bad)) g.data<float>()[at] = bad;
    return g.to(device);
}

}  // namespace

TEST_CASE("unscale_and_check_: every value times inv_scale exactly, inf/NaN found anywhere",
          "[scaler][lesson09][cpu]") {
    const int64_t n = 100003;  // above the CPU kernel's threshold for threads
    const float inv_scale = float(1.0 / 3.0);
    struct Case {
        const char* name;
        int64_t at;
        float bad;
        bool found;
    };
    for (const Case& c : {Case{"clean", 0, 0.0f, false}, Case{"+inf first", 0, kInf, true},
                          Case{"+inf last", n - 1, kInf, true}, Case{"-inf", n / 2, -kInf, true},
                          Case{"NaN", 7, kNaN, true}}) {
        INFO(c.name);
        Tensor g = scaled_grads(n, c.at, c.bad, Device::CPU);
        const Tensor before = g.clone();
        REQUIRE(unscale_and_check_({g}, inv_scale) == c.found);
        for (int64_t i = 0; i < n; i++) {
            const float want = before.data<float>()[i] * inv_scale;
            REQUIRE((std::memcmp(&want, g.data<float>() + i, sizeof want) == 0 || (std::isnan(want) && std::isnan(g.data<float>()[i]))));
        }
    }
    Tensor ints = Tensor::zeros({4}, DType::I32);
    REQUIRE_THROWS_WITH(unscale_and_check_({ints}, 1.0f), Contains("unscale_and_check_"));
}

TEST_CASE("cuda unscale_and_check_ matches the CPU, flag and values", "[scaler][lesson09][cuda]") {
    const int64_t n = 300001;  // more than the 1024 × 256 threads of the grid: the grid-stride loop
    const float inv_scale = float(1.0 / 65536.0);
    struct Case {
        int64_t at;
        float bad;
    };
    test::under_schedules([&] {
        for (const Case& c : {Case{0, 0.0f}, Case{0, kInf}, Case{n - 1, kInf}, Case{n / 3, -kInf}, Case{12345, kNaN}}) {
            INFO("bad value " << c.bad << " at " << c.at);
            Tensor cpu = scaled_grads(n, c.at, c.bad, Device::CPU), gpu = scaled_grads(n, c.at, c.bad, Device::CUDA);
            // as two tensors, the bad value in either: one flag for both launches
            const int64_t half = n / 2;
            const bool found = unscale_and_check_({cpu.view(0, {half}), cpu.view(size_t(half) * 4, {n - half})}, inv_scale);
            REQUIRE(unscale_and_check_({gpu.view(0, {half}), gpu.view(size_t(half) * 4, {n - half})}, inv_scale) == found);
            REQUIRE(found == (c.bad != 0 || std::isnan(c.bad)));
            test::require_close(gpu, cpu, 0.0);  // exactly equal; NaN matches NaN whatever its bits
        }
    });
}

// ---- in train_step and train_epoch --------------------------------------------------------------

// With no inf, a scale of 2^16 changes no bit: multiplying by a power of two is exact in f32 (no
// value leaves its range here), so backward computes exactly 2^16 times each gradient and
// unscale_ gives it back.
TEST_CASE("train_step with a GradScaler: exact when finite; an inf skips the step and halves the scale",
          "[scaler][lesson09][cpu]") {
    const Tensor x = Tensor::ones({4, 1, 28, 28}), y = Tensor::arange(4, DType::I32);
    Rng r1(1), r2(1);
    auto scaled = mlp(r1, 8, 4), plain = mlp(r2, 8, 4);
    SGD sgd_scaled(scaled->parameters(), 0.1f), sgd_plain(plain->parameters(), 0.1f);
    GradScaler scaler;
    StepOptions with_scaler;
    with_scaler.scaler = &scaler;
    with_scaler.accumulate = 2;
    StepOptions without = with_scaler;
    without.scaler = nullptr;

    const StepResult a = train_step(*scaled, sgd_scaled, x, y, with_scaler);
    const StepResult b = train_step(*plain, sgd_plain, x, y, without);
    REQUIRE(a.stepped);
    REQUIRE(a.loss_scale == 65536.0f);
    REQUIRE(b.loss_scale == 1.0f);
    REQUIRE(a.loss == b.loss);
    REQUIRE(same_bits(values(*scaled), values(*plain)));
    REQUIRE(scaler.growth_tracker() == 1);

    // An inf in the logits: the loss and its gradient are NaN, every gradient too.
    bool inject = true;
    HookHandle hook = scaled->register_forward_hook([&](Module&, const Tensor&, Tensor& logits) {
        if (inject) logits.set({0, 0}, kInf);
    });
    const std::vector<float> before = values(*scaled);
    const StepResult c = train_step(*scaled, sgd_scaled, x, y, with_scaler);
    REQUIRE(!c.loss_finite);
    REQUIRE(!c.grads_finite);
    REQUIRE(!c.stepped);
    REQUIRE(same_bits(values(*scaled), before));
    REQUIRE(scaler.loss_scale() == 32768.0f);
    REQUIRE(scaler.growth_tracker() == 0);
    REQUIRE(sgd_scaled.steps() == 1);
    hook.remove();
}

// The epoch goes on past a skipped step (without a scaler the same inf stops it), counts it, and
// a per-batch schedule advances only with the optimizer: after 4 batches with one skipped, the
// one-cycle schedule is at t = 3 = the optimizer's steps.
TEST_CASE("train_epoch with a GradScaler goes on past a skipped step; the schedule counts updates",
          "[scaler][lesson09][cpu]") {
    DataLoader loader(mnist_small(), loader_options());  // 4 batches of 64
    Rng rng(1);
    auto model = mlp(rng, 16, 8);
    SGD sgd(model->parameters(), 0.05f);
    OneCycleLR schedule(sgd, 0.1, 4);
    GradScaler scaler;
    int forward = 0;
    model->register_forward_hook([&](Module&, const Tensor&, Tensor& logits) {
        if (++forward == 2) logits.set({0, 0}, kInf);  // the second batch's loss
    });
    TrainOptions opt;
    opt.scheduler = &schedule;
    opt.per_batch = true;
    opt.scaler = &scaler;
    const EpochResult r = train_epoch(*model, sgd, loader, 0, opt);
    REQUIRE(r.skipped == 1);
    REQUIRE(r.loss_scale == 32768.0f);
    REQUIRE(sgd.steps() == 3);
    REQUIRE(schedule.last_epoch() == 3);
    REQUIRE(sgd.lr() == float(schedule.lr_at(3, 0.0)));

    forward = 0;
    opt.scaler = nullptr;
    REQUIRE_THROWS_WITH(train_epoch(*model, sgd, loader, 0, opt), Contains("epoch 1, step 2"));
}

// A run whose every loss is inf (--amp f16 with too high an lr) would halve the scale towards 0
// at every step, as PyTorch's GradScaler does: the loop stops once the scale falls below 1.
TEST_CASE("train_epoch stops once skipped steps take the scale below 1", "[scaler][lesson09][cpu]") {
    DataLoader loader(mnist_small(), loader_options());  // 4 batches of 64
    Rng rng(1);
    auto model = mlp(rng, 16, 8);
    SGD sgd(model->parameters(), 0.05f);
    GradScaler scaler(GradScaler::Options{4.0f, 2.0, 0.5, 2000, true});  // 4, 2, 1, then 0.5
    model->register_forward_hook([&](Module&, const Tensor&, Tensor& logits) { logits.set({0, 0}, kNaN); });
    TrainOptions opt;
    opt.scaler = &scaler;
    REQUIRE_THROWS_WITH(train_epoch(*model, sgd, loader, 0, opt),
                        Contains("diverged") && Contains("epoch 1, step 3") && Contains("loss itself") &&
                            Contains("fell to 0.5, below 1") && Contains("--lr"));
    REQUIRE(sgd.steps() == 0);
}

// An epoch without a finite loss has no mean loss: NaN, shown as "n/a" and written as null, not 0.
TEST_CASE("an epoch whose every loss was inf reports no loss, not 0", "[scaler][lesson09][cpu]") {
    Progress bar(1, 1, 2);
    bar.step(64, kInf, 3);
    bar.step(64, kNaN, 5);
    const float loss = bar.finish();
    REQUIRE(std::isnan(loss));

    test::TempDir dir;
    RunInfo info;
    info.trainer = "lesson-test";
    info.dir = dir.path;
    RunLog log(info, 0);
    log.add({1, loss, 0.0625, 0.1, 0.01f, 100.0, 1024, 2.0f, 2});
    std::ifstream in(dir.file("run.json"));
    std::stringstream json;
    json << in.rdbuf();
    REQUIRE(json.str().find("\"train_loss\": null") != std::string::npos);
    const std::vector<EpochRecord> epochs = read_epochs(json.str(), "run.json");
    REQUIRE(epochs.size() == 1);
    REQUIRE(std::isnan(epochs[0].train_loss));
    REQUIRE(epochs[0].skipped_steps == 2);
    REQUIRE(std::filesystem::exists(dir.file("curves.svg")));
}

// ---- checkpoints -------------------------------------------------------------------------------

namespace {

// A run with a GradScaler whose scale moves: growth every 2 clean steps, an inf injected into
// the loss at batches 3 and 8 (counted from 1 over the whole run, 4 batches an epoch).
struct ScaledRun {
    Rng rng{1};
    std::unique_ptr<Sequential> model = mlp(rng, 16, 8);
    SGD sgd{model->parameters(), 0.05f, SGD::Options{}.with_momentum(0.9f).with_nesterov()};
    GradScaler scaler{GradScaler::Options{65536.0f, 2.0, 0.5, 2, true}};
    DataLoader loader{mnist_small(), loader_options()};
    int64_t batches = 0;  // in the whole run, skipped ones included
    ScaledRun() {
        model->register_forward_hook([this](Module&, const Tensor&, Tensor& logits) {
            if (batches == 2 || batches == 7) logits.set({0, 0}, kInf);
        });
    }
    TrainingRun run() { return TrainingRun{*model, sgd, nullptr, &loader, {}, nullptr, {}, &scaler}; }

    // Trains from `at` until `until` batches in all; returns where it stopped.
    ResumePoint train_until(ResumePoint at, int64_t until) {
        Batch b;
        StepOptions o;
        o.scaler = &scaler;
        while (batches < until) {
            if (!loader.next(b)) {
                loader.start_epoch(++at.epoch);
                continue;
            }
            train_step(*model, sgd, b.x, b.y, o);
            batches++;
        }
        return {at.epoch, loader.position(), batches};
    }
};

}  // namespace

TEST_CASE("a scaled run stopped and resumed equals an uninterrupted one, scale and tracker included",
          "[scaler][checkpoint][lesson09][cpu]") {
    test::TempDir dir;
    const int64_t n = 11;
    ScaledRun straight;
    straight.train_until({}, n);
    REQUIRE(straight.sgd.steps() == n - 2);
    for (int64_t k : {3, 4, 6}) {  // after the first skipped batch; at an epoch's end; tracker 1
        INFO("stopped after batch " << k);
        const std::string path = dir.file("scaled.safetensors");
        {
            ScaledRun first;
            TrainingRun run = first.run();
            save_checkpoint(path, run, first.train_until({}, k));
        }
        ScaledRun resumed;
        TrainingRun run = resumed.run();
        const ResumePoint at = load_checkpoint(path, run);
        resumed.batches = at.step;
        resumed.train_until(at, n);
        REQUIRE(resumed.scaler.loss_scale() == straight.scaler.loss_scale());
        REQUIRE(resumed.scaler.growth_tracker() == straight.scaler.growth_tracker());
        REQUIRE(same_bits(values(*resumed.model), values(*straight.model)));
    }
    // By the rules (growth_interval 2): batch 1 tracker 1; 2 grows to 131072; 3 (inf) backs off to
    // 65536; 4 tracker 1; 5 grows to 131072; 6 tracker 1; 7 grows to 262144; 8 (inf) backs off to
    // 131072; 9 tracker 1; 10 grows to 262144; 11 tracker 1.
    REQUIRE(straight.scaler.loss_scale() == 262144.0f);
    REQUIRE(straight.scaler.growth_tracker() == 1);
}

TEST_CASE("a checkpoint with a scaler's state and a run without one (or the reverse) is refused",
          "[scaler][checkpoint][lesson09][cpu]") {
    test::TempDir dir;
    const std::string scaled_path = dir.file("scaled.safetensors"), plain_path = dir.file("plain.safetensors");
    {
        ScaledRun r;
        TrainingRun run = r.run();
        save_checkpoint(scaled_path, run, r.train_until({}, 1));
        run.scaler = nullptr;
        save_checkpoint(plain_path, run, {0, r.loader.position(), 1});
    }
    ScaledRun a, b;
    TrainingRun without = a.run();
    without.scaler = nullptr;
    REQUIRE_THROWS_WITH(load_checkpoint(scaled_path, without), Contains("--amp") && Contains(scaled_path));
    TrainingRun with = b.run();
    REQUIRE_THROWS_WITH(load_checkpoint(plain_path, with), Contains("no GradScaler state") && Contains("--amp"));
}

// A scaler's values edited in a checkpoint (and checksummed again, as a program would) are each
// checked against the range the scaler keeps them in; the error names the key and the file.
TEST_CASE("a checkpoint's GradScaler values out of range are refused by name", "[scaler][checkpoint][lesson09][cpu]") {
    test::TempDir dir;
    const std::string path = dir.file("scaled.safetensors"), edited = dir.file("edited.safetensors");
    {
        ScaledRun r;
        TrainingRun run = r.run();
        save_checkpoint(path, run, r.train_until({}, 1));
    }
    for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
             {"scaler.scale", "0x0p+0"}, {"scaler.scale", "-0x1p+16"}, {"scaler.scale", "inf"},
             {"scaler.growth_tracker", "-1"}, {"scaler.growth_tracker", "2"},  // the interval is 2
             {"scaler.growth_factor", "0x1p+0"}, {"scaler.backoff_factor", "0x1p+0"},
             {"scaler.growth_interval", "0"}}) {
        INFO(key << " = " << value);
        StateDict s = read_safetensors(path);
        REQUIRE(s.values.count(key));
        s.values[key] = value;
        write_safetensors(edited, s);
        ScaledRun r;
        TrainingRun run = r.run();
        REQUIRE_THROWS_WITH(load_checkpoint(edited, run), Contains("\"" + key + "\"") && Contains(edited));
    }
}

// ---- the log, the flags --------------------------------------------------------------------------

TEST_CASE("fit with a GradScaler logs the scale and the skipped steps; curves.svg draws the scale",
          "[scaler][runlog][lesson09][cpu]") {
    test::TempDir dir;
    DataLoader train(mnist_small(), loader_options()), test(mnist_small(), loader_options());
    Rng rng(1);
    auto model = mlp(rng, 16, 8);
    SGD sgd(model->parameters(), 0.05f);
    GradScaler scaler;
    int forward = 0;  // training batches (evaluation runs the model in eval mode)
    model->register_forward_hook([&](Module& m, const Tensor&, Tensor& logits) {
        if (m.training() && ++forward == 6) logits.set({0, 0}, kNaN);  // epoch 2's second batch
    });
    TrainOptions opt{2, nullptr, false, nullptr, 0.0f, dir.path + "/run", ""};
    opt.run.trainer = "lesson-test";
    opt.run.dir = dir.path + "/run";
    opt.scaler = &scaler;
    fit(*model, sgd, train, test, opt);
    std::ifstream in(dir.path + "/run/run.json");
    std::stringstream json;
    json << in.rdbuf();
    const std::vector<EpochRecord> epochs = read_epochs(json.str(), "run.json");
    REQUIRE(epochs.size() == 2);
    REQUIRE(epochs[0].loss_scale == 65536.0f);
    REQUIRE(epochs[0].skipped_steps == 0);
    REQUIRE(epochs[1].loss_scale == 32768.0f);
    REQUIRE(epochs[1].skipped_steps == 1);
    REQUIRE(sgd.steps() == 7);  // 4 training batches an epoch, one skipped
    REQUIRE(std::isfinite(epochs[1].train_loss));  // the skipped step's NaN loss is left out of the mean
    std::ifstream svg(dir.path + "/run/curves.svg");
    std::stringstream text;
    text << svg.rdbuf();
    REQUIRE_THAT(text.str(), Contains("log2 of the loss scale"));
    REQUIRE(run_json(opt.run, epochs) == json.str());  // the scaler's fields read back exactly
}

TEST_CASE("--amp takes f16, bf16 or f32; f16 alone brings a GradScaler", "[scaler][lesson09][cpu]") {
    auto parse = [](std::vector<const char*> args) {
        CommonFlags f;
        Cli cli("lesson-test", "test");
        f.add_to(cli);
        args.insert(args.begin(), "lesson-test");
        cli.parse(int(args.size()), const_cast<char**>(args.data()));
        return f;
    };
    REQUIRE(parse({}).amp == DType::F32);
    REQUIRE(grad_scaler(parse({})) == nullptr);
    REQUIRE(parse({"--amp", "bf16"}).amp == DType::BF16);
    REQUIRE(grad_scaler(parse({"--amp=bf16"})) == nullptr);
    const CommonFlags f16 = parse({"--amp", "f16", "--grad-hist"});
    REQUIRE(f16.amp == DType::F16);
    REQUIRE(f16.grad_hist);
    const std::unique_ptr<GradScaler> scaler = grad_scaler(f16);
    REQUIRE(scaler);
    REQUIRE(scaler->loss_scale() == 65536.0f);
    REQUIRE(scaler->options().growth_interval == 2000);
    REQUIRE_THROWS_WITH(parse({"--amp", "fp16"}), Contains("--amp") && Contains("'fp16' is not one of f16, bf16, f32"));
}

// ---- --grad-hist ---------------------------------------------------------------------------------

// 14 values in two tensors, scale S = 2^16. Exponents (floor(log2 |g|)) and f16 zones:
//   g          e      g alone      S·g
//   0, 0       -      (zeros)
//   1          0      normal       65536      overflow (≥ 65520)
//   -1.5       0      normal       98304      overflow
//   0.75       -1     normal       49152      normal
//   2^-20      -20    subnormal    2^-4       normal
//   2^-30      -30    underflow    2^-14      normal (the smallest normal)
//   2^-40      -40    underflow    2^-24      subnormal (the smallest subnormal)
//   2^-45      -45    underflow    2^-29      underflow
//   40000      15     normal       2.6e9      overflow
//   0.001      -10    normal       65.5       normal      (2^-10 = 0.000977 ≤ 0.001 < 2^-9)
//   2^-149     -149   underflow    2^-133     underflow   (f32's smallest subnormal)
//   inf, NaN   -      (non-finite)
// Alone: 4 underflow, 1 subnormal. At S: 2 underflow, 1 subnormal, 3 overflow.
TEST_CASE("grad_histogram counts binary exponents and f16 zones, alone and at the scale",
          "[scaler][gradhist][lesson09][cpu]") {
    Tensor a = Tensor::empty({8}, DType::F32), b = Tensor::empty({2, 3}, DType::F32);
    const float av[] = {0.0f, 1.0f, -1.5f, 0.75f, 0x1p-20f, 0x1p-30f, 0x1p-40f, 0x1p-45f};
    const float bv[] = {40000.0f, 0.001f, 0x1p-149f, kInf, kNaN, -0.0f};
    std::memcpy(a.data<float>(), av, sizeof av);
    std::memcpy(b.data<float>(), bv, sizeof bv);
    const GradHistogram h = grad_histogram({a, b}, 65536.0f);
    REQUIRE(h.values == 14);
    REQUIRE(h.zeros == 2);
    REQUIRE(h.non_finite == 2);
    for (auto [e, n] : std::vector<std::pair<int, int64_t>>{
             {0, 2}, {-1, 1}, {-20, 1}, {-30, 1}, {-40, 1}, {-45, 1}, {15, 1}, {-10, 1}, {-149, 1}, {1, 0}, {-21, 0}}) {
        INFO("exponent " << e);
        REQUIRE(h.count(e) == n);
    }
    REQUIRE(h.underflow == 4);
    REQUIRE(h.subnormal == 1);
    REQUIRE(h.underflow_scaled == 2);
    REQUIRE(h.subnormal_scaled == 1);
    REQUIRE(h.overflow_scaled == 3);

    const std::string text = grad_hist_text(h);
    REQUIRE_THAT(text, Contains("14 values, loss scale S = 65536"));
    REQUIRE_THAT(text, Contains("    -20           1  subnormal      normal     #"));  // 1 of at most 2: half a bar
    REQUIRE_THAT(text, Contains("      0           2  normal         overflow   ########################################"));
    REQUIRE_THAT(text, Contains("f16 without scaling: 4 (28.57%) underflow (|g| < 2^-24), 1 (7.14%) subnormal"));
    REQUIRE_THAT(text, Contains("f16 at S = 65536: 2 (14.29%) underflow, 1 (7.14%) subnormal, 3 (21.43%) overflow"));
    REQUIRE(std::count(text.begin(), text.end(), '\n') == 2 + (15 - (-149) + 1) + 3);  // every binade between
    REQUIRE_THAT(text, Contains("\n      1           0  normal         overflow\n"));  // an empty one
    REQUIRE_THROWS_WITH(grad_histogram({a}, 0.0f), Contains("loss scale"));

    // The figure: one bar for g and one for S·g per exponent present (9 of them), f16's four
    // zones shaded, the scale in the legend.
    const std::string svg = grad_hist_svg(h, "test").str();
    size_t bars = 0;
    for (size_t at = svg.find("fill-opacity=\"0.75\""); at != std::string::npos;
         at = svg.find("fill-opacity=\"0.75\"", at + 1))
        bars++;
    REQUIRE(bars == 2 * 9);
    REQUIRE_THAT(svg, Contains(">f16 underflow<") && Contains(">subnormal<") && Contains(">overflow<"));
    REQUIRE_THAT(svg, Contains("S·g, scaled by S = 65536"));

    // Parameter by parameter (chapter 09, exercise 1: which layers' gradients underflow): a holds
    // 2^-20 (subnormal), 2^-30, 2^-40, 2^-45 (underflow); b holds 2^-149 (underflow).
    const std::vector<NamedGradHistogram> layers = grad_histograms({{"fc1.weight", a}, {"fc2.bias", b}}, 65536.0f);
    REQUIRE(layers.size() == 2);
    CHECK((layers[0].h.underflow == 3 && layers[0].h.subnormal == 1 && layers[0].h.underflow_scaled == 1));
    CHECK((layers[1].h.underflow == 1 && layers[1].h.subnormal == 0 && layers[1].h.overflow_scaled == 1));
    const std::string zones = grad_zones_text(layers);
    CHECK_THAT(zones, Contains("fc1.weight            8          3          1           1           1           2\n"));
    CHECK_THAT(zones, Contains("fc2.bias              6          1          0           1           0           1\n"));
}
