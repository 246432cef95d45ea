// test_memtrace.cpp — the memory recorder and its report (src/train/memory_trace.h), against
// bytes computed by hand from the shapes of a tiny MLP: Linear(8, 16), ReLU, Linear(16, 4) on a
// batch of 5, trained one step with SGD and momentum; then the JSON trace, the SVG timeline,
// the training loop's hook, the pool's rounding and the errors.
//
// Every figure of the report is in tensor bytes (Tensor::nbytes: elements × 4 for f32), the
// bytes a tensor asks for, so these numbers do not depend on the allocator's size classes;
// what the rounding adds is the pool's line (tested last, on a pool of its own).
//
//   make test T='[memtrace]'
#include <catch2/catch.hpp>

#include <fstream>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>

#include "core/allocator.h"
#include "core/rng.h"
#include "data/loader.h"
#include "fixtures.h"
#include "nn/layers.h"
#include "optim/optimizer.h"
#include "train/cli.h"
#include "train/loop.h"
#include "train/memory_trace.h"

using namespace kiln;

namespace {

// fc1: W [16, 8], b [16];  relu;  fc2: W [4, 16], b [4]
std::unique_ptr<Sequential> tiny_mlp(Device device) {
    Rng rng(7);
    auto m = std::make_unique<Sequential>("tiny");
    m->add("fc1", std::make_unique<Linear>(8, 16, rng));
    m->add("relu", std::make_unique<ReLU>());
    m->add("fc2", std::make_unique<Linear>(16, 4, rng));
    m->to(device);
    m->pack();
    return m;
}

const ModuleMemory& row(const StepMemory& m, const std::string& name) {
    for (const ModuleMemory& r : m.modules)
        if (r.name == name) return r;
    FAIL("no row " << name);
    return m.modules.front();
}

int64_t total(const std::array<int64_t, kNumCategories>& in_use) {
    return std::accumulate(in_use.begin(), in_use.end(), int64_t(0));
}

// One recorded training step of the tiny MLP on a batch of 5 (x [5, 8], labels [5]).
struct OneStep {
    std::unique_ptr<Sequential> model;
    SGD sgd;
    MemoryTrace trace;
    explicit OneStep(Device device)
        : model(tiny_mlp(device)), sgd(model->parameters(), 0.1f, SGD::Options{}.with_momentum(0.9f)) {
        Tensor x = Tensor::full({5, 8}, 0.5, DType::F32, device, Category::Data);
        Tensor y = Tensor::zeros({5}, DType::I32, device, Category::Data);
        MemoryRecorder recorder(*model);
        train_step(*model, sgd, x, y, StepOptions{});
        recorder.end_step();
        recorder.stop();
        trace = recorder.trace();
    }
};

void check_tiny_step(Device device) {
    OneStep s(device);
    const StepMemory m = measure_step(s.trace, 0, *s.model, s.sgd, device, nullptr);
    // tree order, full names: the root (its own name), then its children
    REQUIRE(m.modules.size() == 4);
    REQUIRE(m.modules[0].name == "tiny");
    REQUIRE(m.modules[1].name == "fc1");
    REQUIRE(m.modules[3].name == "fc2");

    // parameters = gradients = momentum buffers (SGD with momentum keeps one per parameter):
    //   fc1: 16·8 + 16 = 144 floats = 576 B;  fc2: 4·16 + 4 = 68 floats = 272 B
    for (const char* name : {"fc1", "fc2"}) {
        const ModuleMemory& r = row(m, name);
        const int64_t bytes = std::string(name) == "fc1" ? 576 : 272;
        CHECK(r.parameters == bytes);
        CHECK(r.gradients == bytes);
        CHECK(r.optimizer_state == bytes);
    }
    CHECK(row(m, "relu").parameters == 0);
    CHECK(m.total.parameters == 848);
    CHECK(m.total.optimizer_state == 848);

    // Kept for backward, by who allocated it:
    //   fc1's output [5, 16] is freed once ReLU has made its own: 0 (fc1 keeps x, the data)
    //   relu's output [5, 16] = 320 B (relu keeps it, and fc2 keeps it as its input)
    //   fc2's output [5, 4] is the model's output (the logits): not counted
    CHECK(row(m, "fc1").activations_kept == 0);
    CHECK(row(m, "relu").activations_kept == 5 * 16 * 4);
    CHECK(row(m, "fc2").activations_kept == 0);
    CHECK(m.total.activations_kept == 320);
    CHECK(m.total.workspace_peak == 0);  // Linear and ReLU need no workspace

    // The peak, above what was in use when the recording started (parameters, grads, x, y):
    //   relu's backward allocates its dx [5, 16] (320) while alive are its output y (320),
    //   the logits [5, 4] (80), dL/dlogits (80) and fc2's dx [5, 16] (320): 1120 B.
    //   The optimizer's step later allocates the momentum slab: 576 + 272 with each tensor at
    //   a 256-byte boundary (fc1.W 0..512, fc1.b 512..576, fc2.W 768..1024, fc2.b 1024..1040)
    //   = 1040 B, and nothing else is alive then: less than 1120.
    const int64_t at_start = total(s.trace.in_use_at_start[int(device)]);
    CHECK(m.peak.bytes - at_start == 320 + 80 + 80 + 320 + 320);
    CHECK(m.peak.module == "relu");
    CHECK(m.peak.phase == Phase::Backward);
    CHECK(m.peak.by_category[int(Category::Activation)] == 1120);

    // The momentum slab: one allocation of the optimizer phase, outside every module.
    int64_t optimizer_allocs = 0;
    for (const MemoryEvent& e : s.trace.events)
        if (e.device == device && !e.freed() && e.phase == Phase::Optimizer) {
            CHECK(e.module.empty());
            CHECK(e.bytes == 1040);
            optimizer_allocs++;
        }
    CHECK(optimizer_allocs == 1);
}

// A layer that needs scratch space: 100 + 50 floats at once in forward, 300 in backward.
class Scratch : public Module {
public:
    Scratch() : Module("scratch") {}
    Tensor forward(const Tensor& x) override {
        Tensor a = workspace(100), b = workspace(50);
        return x;
    }
    Tensor backward(const Tensor& dy) override {
        Tensor a = workspace(300);
        return dy;
    }

private:
    static Tensor workspace(int64_t floats) {
        return Tensor::empty({floats}, DType::F32, Device::CPU, Category::Workspace);
    }
};

// Checks that text is one JSON value's worth of balanced brackets and braces (outside strings,
// escapes skipped) and returns how many times `key` occurs as a key.
int64_t balanced_count(const std::string& text, const std::string& key) {
    std::vector<char> open;
    bool in_string = false;
    int64_t keys = 0;
    for (size_t i = 0; i < text.size(); i++) {
        const char c = text[i];
        if (in_string) {
            if (c == '\\') i++;
            else if (c == '"') in_string = false;
            continue;
        }
        if (c == '"') {
            in_string = true;
            if (text.compare(i, key.size() + 3, "\"" + key + "\":") == 0) keys++;
        } else if (c == '{' || c == '[') {
            open.push_back(c);
        } else if (c == '}' || c == ']') {
            REQUIRE(!open.empty());
            REQUIRE(open.back() == (c == '}' ? '{' : '['));
            open.pop_back();
        }
    }
    REQUIRE(open.empty());
    REQUIRE(!in_string);
    return keys;
}

std::string read_text(const std::string& path) {
    std::ifstream in(path);
    REQUIRE(in);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

}  // namespace

TEST_CASE("memory report: a tiny MLP's step, module by module, by hand", "[memtrace][cpu][lesson08]") {
    check_tiny_step(Device::CPU);
}

TEST_CASE("memory report: the same step on the cuda device counts the device's memory", "[memtrace][cuda][lesson08]") {
    check_tiny_step(Device::CUDA);
}

TEST_CASE("memory report: a module's workspace peak is the most workspace in use while it ran",
          "[memtrace][cpu][lesson08]") {
    Rng rng(1);
    Sequential model("net");
    model.add("fc", std::make_unique<Linear>(8, 4, rng));
    model.add("scratch", std::make_unique<Scratch>());
    SGD sgd(model.parameters(), 0.1f);
    MemoryRecorder recorder(model);
    {
        Tensor y = model.call(Tensor::ones({2, 8}));
        model.call_backward(Tensor::ones({2, 4}));
    }
    recorder.end_step();
    recorder.stop();
    const StepMemory m = measure_step(recorder.trace(), 0, model, sgd, Device::CPU, nullptr);
    CHECK(row(m, "scratch").workspace_peak == 300 * 4);  // backward's 1200 B > forward's 400 + 200
    CHECK(row(m, "fc").workspace_peak == 0);
    CHECK(m.total.workspace_peak == 1200);
    CHECK(row(m, "fc").optimizer_state == 0);  // SGD keeps nothing before its first step
    // what the scratch layer returns is its input: no activation of its own
    CHECK(row(m, "scratch").activations_kept == 0);
    CHECK(row(m, "fc").activations_kept == 0);  // its output [2, 4] is the model's output
    const std::string text = format_step_memory(m);
    CHECK(text.find("scratch") != std::string::npos);
    CHECK(text.find("peak of the step") != std::string::npos);
}

TEST_CASE("memory trace: valid JSON with every event, and a timeline with a legend", "[memtrace][cpu][lesson08]") {
    test::TempDir dir;
    OneStep s(Device::CPU);
    const std::string json = dir.file("tiny.json");
    write_memory_trace(s.trace, Device::CPU, json, "tiny");
    const std::string text = read_text(json);
    CHECK(balanced_count(text, "op") == int64_t(s.trace.events.size()));  // one "op" per event
    CHECK(s.trace.events.size() >= 10);  // forward 3, loss 3 and more, backward 2, optimizer 1, their frees
    CHECK(text.find("\"device\": \"cpu\"") != std::string::npos);
    CHECK(text.find("\"categories\": [\"parameter\", \"gradient\", \"optimizer state\"") != std::string::npos);
    CHECK(text.find("\"module\": \"relu\"") != std::string::npos);
    const std::string svg = read_text(timeline_path(json));
    REQUIRE(timeline_path(json) == dir.file("tiny.svg"));
    CHECK(svg.rfind("<svg", 0) == 0);
    for (const char* label : {">activation<", ">optimizer state<", ">parameter<", ">backward phase<", "peak "})
        CHECK(svg.find(label) != std::string::npos);
}

TEST_CASE("memory trace: the training loop records the first steps, then stops", "[memtrace][cpu][lesson08]") {
    test::TempDir dir;
    ImageSet set;  // 20 images of 1×2×4 = 8 pixels, 4 classes
    set.n = 20, set.c = 1, set.h = 2, set.w = 4;
    set.classes = {"a", "b", "c", "d"};
    for (int64_t i = 0; i < set.n * 8; i++) set.pixels.push_back(uint8_t(i * 7 % 256));
    for (int64_t i = 0; i < set.n; i++) set.labels.push_back(int32_t(i % 4));
    LoaderOptions batches;
    batches.batch_size = 5;
    DataLoader loader(set, batches);
    auto model = std::make_unique<Sequential>("tiny");
    Rng rng(3);
    model->add("flatten", std::make_unique<Flatten>());
    model->add("fc", std::make_unique<Linear>(8, 4, rng));
    SGD sgd(model->parameters(), 0.1f);
    MemoryRecording recording(MemoryTraceOptions{false, dir.file("loop.json"), 2, {}}, *model, sgd, Device::CPU, nullptr);
    TrainOptions opt;
    opt.memory = &recording;
    train_epoch(*model, sgd, loader, 0, opt);  // 4 steps of 5
    recording.finish();
    const std::string text = read_text(dir.file("loop.json"));
    CHECK(text.find("\"steps\": 2,") != std::string::npos);
    CHECK(text.find("\"step\": 1,") != std::string::npos);
    CHECK(text.find("\"step\": 2,") == std::string::npos);  // not the third step
    CHECK(text.find("\"phase\": \"data\"") != std::string::npos);
    CHECK(read_text(dir.file("loop.svg")).find("step 2") != std::string::npos);

    CommonFlags flags;  // without --mem-report or --mem-trace the loop records nothing
    CHECK(memory_recording(flags, *model, sgd, nullptr, loader) == nullptr);
    flags.mem_report = true;
    CHECK(memory_recording(flags, *model, sgd, nullptr, loader) != nullptr);
}

TEST_CASE("memory trace: a path that cannot be written fails before training, naming it",
          "[memtrace][cpu][lesson08]") {
    Rng rng(1);
    Linear model(2, 2, rng);
    SGD sgd(model.parameters(), 0.1f);
    const std::string missing = "/nonexistent-folder/trace.json";
    REQUIRE_THROWS_WITH(check_trace_path(missing), Catch::Contains(missing) && Catch::Contains("existing folder"));
    REQUIRE_THROWS_WITH(MemoryRecording(MemoryTraceOptions{false, missing, 2, {}}, model, sgd, Device::CPU, nullptr),
                        Catch::Contains("cannot write"));
    REQUIRE_THROWS_WITH(check_trace_path("/tmp/trace.txt"), Catch::Contains("must end in .json"));
    REQUIRE_THROWS_WITH(MemoryRecording(MemoryTraceOptions{true, "", 0, {}}, model, sgd, Device::CPU, nullptr),
                        Catch::Contains("--mem-trace-steps"));
}

TEST_CASE("pool statistics: what the tensors asked for beside the rounded blocks", "[memtrace][allocator][cpu][lesson08]") {
    PoolAllocator pool("test pool", Device::CPU);
    void* small = pool.allocate(100, Category::Activation);        // rounded up to 512
    void* large = pool.allocate((3 << 20) + 1, Category::Workspace);  // > 1 MiB: up to 4 MiB
    MemoryStats s = pool.stats();
    CHECK(s.requested[int(Category::Activation)] == 100);
    CHECK(s.requested[int(Category::Workspace)] == (3 << 20) + 1);
    CHECK(s.allocated == 512 + (4 << 20));
    CHECK(s.allocated - (100 + (3 << 20) + 1) == 412 + (1 << 20) - 1);  // the rounding's cost
    pool.deallocate(small);
    s = pool.stats();
    CHECK(s.requested[int(Category::Activation)] == 0);
    CHECK(s.reserved - s.allocated == 512);  // the freed block, cached
    CHECK(pool.cached_bytes() == 512);
    pool.deallocate(large);
}
