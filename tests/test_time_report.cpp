// test_time_report.cpp — the step timer and its report (src/train/time_report.h), with layers
// that sleep for known times: each layer is charged at least its own sleeps, forward apart from
// backward, the first step is not timed, the rest of the step is what no layer ran, and the
// hooks go when the timer does; then the table and the figure.
//
//   make test T='[time]'
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "fixtures.h"
#include "nn/layers.h"
#include "core/cuda_memory.h"
#include "core/rng.h"
#include "train/time_report.h"

using namespace kiln;

namespace {

// The sleeps below are in units of kUnit ms: long enough that a busy machine's oversleeping
// (several ms a call with a dozen jobs on two cores) stays below the gaps the upper bounds check.
constexpr int kUnit = 5;
constexpr double kUnitSeconds = kUnit * 1e-3;
void sleep_units(int units) { std::this_thread::sleep_for(std::chrono::milliseconds(units * kUnit)); }

// Sleeps `forward_units` units in forward and `backward_units` units in backward; passes x and dy through.
class Sleeper : public Module {
public:
    Sleeper(int forward_units, int backward_units) : Module("sleeper"), forward_units_(forward_units), backward_units_(backward_units) {}
    Tensor forward(const Tensor& x) override {
        sleep_units(forward_units_);
        return x;
    }
    Tensor backward(const Tensor& dy) override {
        sleep_units(backward_units_);
        return dy;
    }

private:
    int forward_units_, backward_units_;
};

std::unique_ptr<Sequential> two_sleepers() {
    auto m = std::make_unique<Sequential>("net");
    m->add("a", std::make_unique<Sleeper>(4, 8));
    m->add("b", std::make_unique<Sleeper>(2, 1));
    return m;
}

// One step as a trainer runs it: 3 units loading the batch, the model, 5 units outside the layers.
void step(StepTimer& timer, Module& model) {
    timer.step_begins();
    sleep_units(3);
    timer.batch_loaded();
    model.call(Tensor::ones({2, 3}));
    model.call_backward(Tensor::ones({2, 3}));
    sleep_units(5);
    timer.step_ends();
}

// The numbers of the report's row that starts with `name` ("12.5%" as 12.5; a shape's "[8," skipped).
std::vector<double> numbers_in_row(const std::string& report, const std::string& name) {
    std::istringstream lines(report);
    for (std::string line; std::getline(lines, line);) {
        if (line.compare(0, name.size() + 1, name + " ") != 0) continue;
        std::istringstream words(line.substr(name.size()));
        std::vector<double> numbers;
        for (std::string w; words >> w;) {
            if (!w.empty() && w.back() == '%') w.pop_back();
            char* end = nullptr;
            const double v = std::strtod(w.c_str(), &end);
            if (!w.empty() && *end == '\0') numbers.push_back(v);
        }
        return numbers;
    }
    return {};
}

}  // namespace

TEST_CASE("the step timer charges each layer its own forward and backward, after the untimed first step",
          "[time][cpu][lesson13]") {
    // The upper bounds below catch a layer charged another's time. A loaded machine can oversleep
    // past them now and then (a dozen jobs on two cores: 10 ms late), so the run is repeated, up to
    // 3 times, until they hold; a layer charged another's time fails all three.
    const auto within_upper_bounds = [](const TimeReport& r) {
        return r.layers.size() == 2 && r.layers[0].forward < 3 * 8 * kUnitSeconds &&
               r.layers[1].forward < 3 * 4 * kUnitSeconds && r.layers[1].backward < 3 * 4 * kUnitSeconds &&
               r.data < 3 * 6 * kUnitSeconds;
    };
    TimeReport r;
    for (int attempt = 1; attempt <= 3; ++attempt) {
        auto net = two_sleepers();
        StepTimer timer(*net, Device::CPU, /*skip=*/1);
        for (int i = 0; i < 4; ++i) step(timer, *net);
        r = timer.report();
        if (within_upper_bounds(r)) break;
        WARN("attempt " << attempt << ": a sleep overslept past an upper bound; measuring again");
    }
    REQUIRE(r.steps == 3);  // the first of 4 not timed
    REQUIRE(r.layers.size() == 2);  // the layers, not the Sequential
    CHECK(r.layers[0].name == "a");
    CHECK(r.layers[1].name == "b");
    CHECK(r.layers[0].output == Shape{2, 3});
    // Lower bounds are the sleeps (3 steps each); upper bounds only catch a layer charged another's time.
    CHECK(r.layers[0].forward >= 3 * 4 * kUnitSeconds);
    CHECK(r.layers[0].forward < 3 * 8 * kUnitSeconds);
    CHECK(r.layers[0].backward >= 3 * 8 * kUnitSeconds);
    CHECK(r.layers[1].forward >= 3 * 2 * kUnitSeconds);
    CHECK(r.layers[1].forward < 3 * 4 * kUnitSeconds);
    CHECK(r.layers[1].backward >= 3 * 1 * kUnitSeconds);
    CHECK(r.layers[1].backward < 3 * 4 * kUnitSeconds);
    CHECK(r.data >= 3 * 3 * kUnitSeconds);
    CHECK(r.data < 3 * 6 * kUnitSeconds);
    CHECK(r.outside() >= 3 * 5 * kUnitSeconds * 0.9);  // the step's rest: its 5 units of sleep (clock reads apart)
    CHECK(r.step >= r.data + r.in_layers());
}

TEST_CASE("the time report prints a row per layer, the batch, the rest and the step, scaled to an epoch",
          "[time][cpu][lesson13]") {
    TimeReport r;
    r.steps = 2;
    r.layers = {{"conv", Shape{8, 4, 6, 6}, 0.010, 0.030}, {"fc", Shape{8, 10}, 0.002, 0.002}};
    r.data = 0.004;
    r.step = 0.100;  // 50 ms a step: conv 20 ms (40%), fc 2 ms, data 2 ms, outside 26 ms
    const std::string s = format_time_report(r, 100);
    INFO(s);
    CHECK(s.find("the mean of 2 timed steps, 100 steps per epoch") != std::string::npos);
    CHECK(s.find("conv                         [8, 4, 6, 6]") != std::string::npos);
    // forward, backward, total ms per step; share %; seconds per epoch
    CHECK(numbers_in_row(s, "conv") == std::vector<double>{5, 15, 20, 40, 2});
    CHECK(numbers_in_row(s, "fc") == std::vector<double>{1, 1, 2, 4, 0.2});
    CHECK(numbers_in_row(s, "(loading the batch)") == std::vector<double>{2, 4, 0.2});
    CHECK(numbers_in_row(s, "(outside the layers)") == std::vector<double>{26, 52, 2.6});
    CHECK(numbers_in_row(s, "step") == std::vector<double>{50, 100, 5});
    REQUIRE_THROWS_WITH(format_time_report(TimeReport{}, 10), Catch::Contains("no step was timed"));

    // The figure: a bar per layer (forward and backward), the batch's and the outside's.
    test::TempDir dir;
    const std::string svg_path = dir.file("time.svg");
    write_time_report_svg(r, svg_path, "two layers");
    std::ifstream in(svg_path);
    const std::string svg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    CHECK(svg.find(">conv</text>") != std::string::npos);
    CHECK(svg.find(">(outside the layers)</text>") != std::string::npos);
    CHECK(svg.find(">two layers</text>") != std::string::npos);
    REQUIRE_THROWS_WITH(write_time_report_svg(r, dir.file("no/such/dir/t.svg"), "x"), Catch::Contains("no/such/dir"));
}

TEST_CASE("the step timer's hooks go with it", "[time][cpu][lesson13]") {
    auto net = two_sleepers();
    {
        StepTimer timer(*net, Device::CPU, 0);
        step(timer, *net);
        REQUIRE(timer.steps_timed() == 1);
    }
    // The hooks would write into the destroyed timer: sanitizers (make test SAN=1) would see it.
    net->call(Tensor::ones({2, 3}));
    net->call_backward(Tensor::ones({2, 3}));
    REQUIRE_THROWS_WITH(StepTimer(*net, Device::CPU, -1), Catch::Contains("skip is -1"));
}

// On a CUDA device the timed steps' kernels are timed one by one (CUDA events around each launch):
// an MLP step launches the same kernels every step, the GEMMs among them, and only the timed
// steps count. Then the kernel table: slowest first, launches and ms per step, shares.
TEST_CASE("on a CUDA device the step timer also times every kernel of the timed steps", "[time][cuda][lesson13]") {
    Rng rng(1);
    auto net = std::make_unique<Sequential>("mlp");
    net->add("fc1", std::make_unique<Linear>(8, 16, rng));
    net->emplace<ReLU>();
    net->add("fc2", std::make_unique<Linear>(16, 4, rng));
    net->to(Device::CUDA);
    const Tensor x = Tensor::ones({32, 8}).to(Device::CUDA), dy = Tensor::ones({32, 4}).to(Device::CUDA);
    const auto run = [&](StepTimer& timer) {
        timer.step_begins();
        timer.batch_loaded();
        net->call(x);
        net->call_backward(dy);
        timer.step_ends();
    };
    StepTimer timer(*net, Device::CUDA, /*skip=*/1);
    run(timer);
    const std::vector<cuda::KernelTime> untimed = cuda::take_kernel_times();
    CHECK(untimed.empty());  // the untimed step launched with timing off
    run(timer);
    const std::vector<cuda::KernelTime> one = timer.report().kernels;
    run(timer);
    run(timer);
    const TimeReport& r = timer.report();
    REQUIRE(r.steps == 3);
    REQUIRE(!r.kernels.empty());
    REQUIRE(one.size() == r.kernels.size());
    int64_t launches = 0;
    bool gemm = false, relu = false;
    for (size_t i = 0; i < r.kernels.size(); i++) {
        INFO(r.kernels[i].kernel);
        CHECK(r.kernels[i].kernel == one[i].kernel);
        CHECK(r.kernels[i].launches == 3 * one[i].launches);  // the same launches every step
        CHECK(r.kernels[i].ms >= 0.0);
        launches += r.kernels[i].launches;
        gemm = gemm || r.kernels[i].kernel.find("gemm") != std::string::npos;
        relu = relu || r.kernels[i].kernel.find("relu") != std::string::npos;
    }
    CHECK((gemm && relu));
    // fc1 and fc2: a forward GEMM each (+ bias), backward dW (+ db) each and dx of fc2
    CHECK(launches >= 3 * 6);
    const std::string table = format_kernel_times(r);
    INFO(table);
    CHECK(table.find("the mean of 3 steps") != std::string::npos);
    CHECK(table.find("(all kernels)") != std::string::npos);
    CHECK(numbers_in_row(table, "(all kernels)").at(0) == Approx(double(launches) / 3));
    CHECK(numbers_in_row(table, "(all kernels)").at(2) == Approx(100.0));
    CHECK(format_time_report(r, 10).find("by kernel") != std::string::npos);
    // Timing goes off with the timer: later launches are not recorded.
    CHECK(!cuda::kernel_timing_on());
}
