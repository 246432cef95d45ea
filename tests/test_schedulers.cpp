// test_schedulers.cpp — the learning-rate schedulers (src/optim/scheduler.h) against
//   1. their closed forms, written again here from PyTorch's documentation, for 100 steps;
//   2. values printed by PyTorch 1.13 (Debian's python3-torch) for the same arguments, every
//      11th step of 100. The script, to regenerate them:
//        p = torch.nn.Parameter(torch.zeros(1)); opt = torch.optim.SGD([p], lr=0.1, momentum=0.9)
//        s = <scheduler>(opt, ...); lrs = []
//        for t in range(100): lrs.append(opt.param_groups[0]['lr']); opt.step(); s.step()
//        print([f"{x:.9g}" for x in lrs[::11]])
// plus state save/load, several groups, and bad arguments.
//
//   make test T='[scheduler]'
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <memory>
#include <vector>

#include "optim/scheduler.h"

using namespace kiln;
using Catch::Contains;

namespace {

constexpr double kPi = 3.14159265358979323846;

// One parameter, lr 0.1: the optimizer every case schedules.
struct Tiny {
    Parameter p{"p", Tensor::zeros({1}), Tensor::zeros({1})};
    SGD sgd{{&p}, 0.1f, SGD::Options{}.with_momentum(0.9f)};
};

// The lr seen by each of the first n steps (before step() is called), as PyTorch's loop above.
std::vector<double> lrs_of(LRScheduler& s, Optimizer& opt, int n = 100) {
    std::vector<double> lrs;
    for (int t = 0; t < n; t++) {
        lrs.push_back(opt.lr());
        s.step();
    }
    return lrs;
}

// Each lr against the closed form f(t) (f32 rounding: 1e-6 relative) and every 11th against
// PyTorch's printed values.
void check_schedule(const std::vector<double>& lrs, const std::function<double(int)>& closed_form,
                    const std::vector<double>& torch_every_11th) {
    for (size_t t = 0; t < lrs.size(); t++) {
        INFO("step " << t);
        REQUIRE(lrs[t] == Approx(closed_form(int(t))).epsilon(1e-6).margin(1e-12));
    }
    for (size_t i = 0; i < torch_every_11th.size(); i++) {
        INFO("step " << 11 * i << " against PyTorch");
        REQUIRE(lrs[11 * i] == Approx(torch_every_11th[i]).epsilon(2e-6).margin(1e-12));
    }
}

}  // namespace

TEST_CASE("StepLR, MultiStepLR and ExponentialLR follow their closed forms and PyTorch", "[scheduler][cpu][lesson07]") {
    SECTION("StepLR(step_size 30, gamma 0.5)") {
        Tiny m;
        StepLR s(m.sgd, 30, 0.5);
        check_schedule(lrs_of(s, m.sgd), [](int t) { return 0.1 * std::pow(0.5, t / 30); },
                       {0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025, 0.025, 0.025, 0.0125});
    }
    SECTION("MultiStepLR(milestones 10, 45, 80, gamma 0.2)") {
        Tiny m;
        MultiStepLR s(m.sgd, {10, 45, 80}, 0.2);
        check_schedule(lrs_of(s, m.sgd),
                       [](int t) { return 0.1 * std::pow(0.2, (t >= 10) + (t >= 45) + (t >= 80)); },
                       {0.1, 0.02, 0.02, 0.02, 0.02, 0.004, 0.004, 0.004, 0.0008, 0.0008});
    }
    SECTION("ExponentialLR(gamma 0.97)") {
        Tiny m;
        ExponentialLR s(m.sgd, 0.97);
        check_schedule(lrs_of(s, m.sgd), [](int t) { return 0.1 * std::pow(0.97, t); },
                       {0.1, 0.0715301403, 0.0511656097, 0.0365988324, 0.0261791962, 0.0187260158, 0.0133947454,
                        0.00958128014, 0.00685350313, 0.0049023204});
    }
}

TEST_CASE("CosineAnnealingLR and LinearLR follow their closed forms and PyTorch", "[scheduler][cpu][lesson07]") {
    SECTION("CosineAnnealingLR(T_max 40, eta_min 0.001): down, then up again past T_max") {
        Tiny m;
        CosineAnnealingLR s(m.sgd, 40, 0.001);
        check_schedule(lrs_of(s, m.sgd),
                       [](int t) { return 0.001 + (0.1 - 0.001) * (1 + std::cos(kPi * t / 40)) / 2; },
                       {0.1, 0.0826476784, 0.042756494, 0.00829431186, 0.00342270244, 0.0315571701, 0.0729725297,
                        0.0986323111, 0.0905463412, 0.0543837252});
    }
    SECTION("LinearLR(start 0.1, end 1, 20 steps): warm-up, then constant") {
        Tiny m;
        LinearLR s(m.sgd, 0.1, 1.0, 20);
        check_schedule(lrs_of(s, m.sgd), [](int t) { return 0.1 * (0.1 + 0.9 * std::min(t, 20) / 20.0); },
                       {0.01, 0.0595, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1});
    }
}

TEST_CASE("OneCycleLR follows PyTorch's phases, cosine and linear", "[scheduler][cpu][lesson07]") {
    // max_lr 0.4, 100 steps: initial = 0.4/25 = 0.016, min = 0.016/1e4 = 1.6e-6.
    const double initial = 0.016, top = 0.4, low = 1.6e-6;
    auto cos_anneal = [](double a, double b, double p) { return b + (a - b) * (1 + std::cos(kPi * p)) / 2; };
    auto lin_anneal = [](double a, double b, double p) { return a + (b - a) * p; };
    SECTION("two phases, cosine: up over steps 0..29, down over 29..99") {
        Tiny m;
        OneCycleLR s(m.sgd, top, 100);
        check_schedule(
            lrs_of(s, m.sgd),
            [&](int t) { return t <= 29 ? cos_anneal(initial, top, t / 29.0) : cos_anneal(top, low, (t - 29) / 70.0); },
            {0.016, 0.136933474, 0.347391134, 0.396785931, 0.356366471, 0.278605492, 0.18207301, 0.0898218444,
             0.0238823981, 1.6e-06});
    }
    SECTION("three phases, linear: up 0..29, back down 29..58, then to the minimum 58..99") {
        Tiny m;
        OneCycleLR s(m.sgd, top, 100, {0.3, OneCycleLR::Anneal::Linear, 25.0, 1e4, true});
        check_schedule(lrs_of(s, m.sgd),
                       [&](int t) {
                           if (t <= 29) return lin_anneal(initial, top, t / 29.0);
                           if (t <= 58) return lin_anneal(top, initial, (t - 29) / 29.0);
                           return lin_anneal(initial, low, (t - 58) / 41.0);
                       },
                       {0.016, 0.161655172, 0.307310345, 0.347034483, 0.20137931, 0.0557241379, 0.012878361,
                        0.00858610732, 0.00429385366, 1.6e-06});
    }
    SECTION("stepping past total_steps is an error that says what to do") {
        Tiny m;
        OneCycleLR s(m.sgd, top, 3);
        for (int i = 0; i < 3; i++) s.step();
        REQUIRE_THROWS_WITH(s.step(), Contains("total_steps is 3") && Contains("batches per epoch"));
    }
}

TEST_CASE("SequentialLR: linear warm-up then cosine, as PyTorch chains them", "[scheduler][cpu][lesson07]") {
    Tiny m;
    LinearLR warm(m.sgd, 0.01, 1.0, 10);
    CosineAnnealingLR cosine(m.sgd, 90);
    SequentialLR s(m.sgd, {&warm, &cosine}, {10});
    check_schedule(lrs_of(s, m.sgd),
                   [](int t) {
                       if (t < 10) return 0.1 * (0.01 + 0.99 * t / 10.0);
                       return 0.1 * (1 + std::cos(kPi * (t - 10) / 90)) / 2;
                   },
                   {0.001, 0.0999695414, 0.0956772729, 0.0847329185, 0.0687303297, 0.05, 0.0312696703,
                    0.0152670815, 0.00432272712, 3.0458649e-05});
}

TEST_CASE("ReduceLROnPlateau halves the lr after patience bad epochs, with cooldown and min_lr",
          "[scheduler][cpu][lesson07]") {
    // The metric improves (1/(1+t)) for 20 epochs, then sits near 0.05 (0.05 + 0.001·(7t mod 3)):
    // the best is 0.05 at epoch 20 or so, and nothing after beats it by 1%. Patience 3, cooldown 2
    // give a halving every 6 epochs from epoch 23 on (4 bad epochs, then 2 of cooldown), down to
    // min_lr 0.001. PyTorch 1.13 gives: lr 0.1 through epoch 22, 0.05 from 23, 0.025 from 29,
    // 0.0125 from 35, 0.00625 from 41, 0.003125 from 47, 0.0015625 from 53, 0.001 from 59 on.
    Parameter p{"p", Tensor::zeros({1}), Tensor::zeros({1})};
    SGD sgd({&p}, 0.1f);
    ReduceLROnPlateau s(sgd, {ReduceLROnPlateau::Mode::Min, 0.5, 3, 0.01, ReduceLROnPlateau::ThresholdMode::Rel, 2,
                              0.001, 1e-8});
    auto torch_lr = [](int t) {
        if (t < 23) return 0.1;
        if (t >= 59) return 0.001;
        return 0.1 * std::pow(0.5, 1 + (t - 23) / 6);
    };
    for (int t = 0; t < 100; t++) {
        const double metric = t < 20 ? 1.0 / (1 + t) : 0.05 + 0.001 * ((t * 7) % 3);
        s.step(metric);
        INFO("epoch " << t << ", metric " << metric);
        REQUIRE(sgd.lr() == Approx(torch_lr(t)).epsilon(1e-6));
    }
    SECTION("mode max with an absolute threshold counts an increase below the threshold as bad") {
        ReduceLROnPlateau up(sgd, {ReduceLROnPlateau::Mode::Max, 0.5, 0, 0.1, ReduceLROnPlateau::ThresholdMode::Abs,
                                   0, 0.0, 1e-8});
        const float before = sgd.lr();
        up.step(1.0);   // better than -inf
        REQUIRE(sgd.lr() == before);
        up.step(1.05);  // not above 1.0 + 0.1: bad, patience 0 -> halve
        REQUIRE(sgd.lr() == Approx(before * 0.5));
    }
}

TEST_CASE("schedulers keep each parameter group's own base", "[scheduler][cpu][lesson07]") {
    Parameter a{"a", Tensor::zeros({1}), Tensor::zeros({1})}, b{"b", Tensor::zeros({1}), Tensor::zeros({1})};
    SGD sgd(std::vector<ParamGroup>{{{&a}, 0.1f, 0.0f}, {{&b}, 0.01f, 0.0f}}, SGD::Options{});
    LinearLR warm(sgd, 0.5, 1.0, 4);
    CosineAnnealingLR cosine(sgd, 10);  // made second: scales the groups' initial lrs, not warm's
    SequentialLR s(sgd, {&warm, &cosine}, {4});
    REQUIRE(s.last_lr()[0] == Approx(0.05));
    REQUIRE(s.last_lr()[1] == Approx(0.005));
    for (int i = 0; i < 4; i++) s.step();
    REQUIRE(s.last_lr()[0] == Approx(0.1));
    REQUIRE(s.last_lr()[1] == Approx(0.01));
}

TEST_CASE("a scheduler's state round-trips: a resumed schedule continues exactly", "[scheduler][cpu][lesson07]") {
    Tiny whole, first, second;
    OneCycleLR s_whole(whole.sgd, 0.4, 50), s_first(first.sgd, 0.4, 50), s_second(second.sgd, 0.4, 50);
    for (int i = 0; i < 17; i++) s_first.step();
    StateDict state;
    first.sgd.save_state(state, "optimizer");
    s_first.save_state(state, "scheduler");
    second.sgd.load_state(state, "optimizer");
    s_second.load_state(state, "scheduler");
    REQUIRE(s_second.last_epoch() == 17);
    for (int i = 0; i < 17; i++) s_whole.step();
    for (int i = 17; i < 50; i++) {
        REQUIRE(second.sgd.lr() == whole.sgd.lr());  // bit for bit
        s_whole.step();
        s_second.step();
    }

    Parameter p{"p", Tensor::zeros({1}), Tensor::zeros({1})};
    SGD sgd({&p}, 0.1f), sgd2({&p}, 0.1f);
    ReduceLROnPlateau plateau(sgd, {ReduceLROnPlateau::Mode::Min, 0.5, 1, 0.0, ReduceLROnPlateau::ThresholdMode::Abs,
                                    1, 0.0, 1e-8}),
        resumed(sgd2);
    for (double metric : {3.0, 2.0, 2.5}) plateau.step(metric);
    StateDict ps;
    plateau.save_state(ps, "plateau");
    resumed.load_state(ps, "plateau");
    REQUIRE(resumed.best() == 2.0);
    REQUIRE(resumed.num_bad_epochs() == 1);
}

TEST_CASE("schedulers reject bad arguments with a message naming them", "[scheduler][cpu][lesson07]") {
    Tiny m;
    REQUIRE_THROWS_WITH(StepLR(m.sgd, 0), Contains("StepLR: step_size"));
    REQUIRE_THROWS_WITH(MultiStepLR(m.sgd, {10, 5}), Contains("increasing"));
    REQUIRE_THROWS_WITH(OneCycleLR(m.sgd, 0.1, 0), Contains("total_steps must be ≥ 1"));
    REQUIRE_THROWS_WITH(OneCycleLR(m.sgd, 0.1, 10, {1.5, OneCycleLR::Anneal::Cos, 25, 1e4, false}),
                        Contains("pct_start"));
    REQUIRE_THROWS_WITH(LinearLR(m.sgd, 0.0, 1.0, 5), Contains("start_factor"));
    LinearLR warm(m.sgd);
    REQUIRE_THROWS_WITH(SequentialLR(m.sgd, {&warm}, {3}), Contains("1 schedulers need 0 milestones"));
    REQUIRE_THROWS_WITH(ReduceLROnPlateau(m.sgd, {ReduceLROnPlateau::Mode::Min, 1.5}), Contains("factor"));
    StateDict empty;
    REQUIRE_THROWS_WITH(warm.load_state(empty, "scheduler"), Contains("scheduler.last_epoch"));
}
