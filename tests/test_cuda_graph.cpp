// test_cuda_graph.cpp — a training step captured as a CUDA Graph (train/step_graph.h,
// --cuda-graph) and the emulator's stream capture under it (cuda/emu/runtime.cpp): an epoch
// of lesson 05's LeNet through the graph is the uncaptured epoch bit for bit (losses, weights,
// momentum or Adam's moments), with a learning rate that changes every few steps too, from one
// capture (the optimizer reads its scalars from device memory); the emulator's counts show one
// graph launch per captured step running the step's kernels; what a capture cannot hold (a read
// back to the host, an allocation, a wait) fails naming the call.
//
//   make test T='[graph]'
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <string>
#include <memory>
#include <thread>
#include <vector>

#include "core/cuda_memory.h"
#include "data/loader.h"
#include "nn/models.h"
#include "ops/ops.h"
#include "ops/optim.h"
#include "optim/adam.h"
#include "optim/optimizer.h"
#include "optim/scheduler.h"
#include "train/loop.h"
#include "train/step_graph.h"

#include "fixtures.h"
#ifndef KILN_CUDA
#include "emu/emu.h"  // kernels_run, graph_launches: the emulator's counts
#endif

using namespace kiln;

namespace {

// Lesson 05's model and optimizer: LeNet on the device, SGD with momentum 0.9 — or AdamW, whose
// bias corrections change every step.
struct LeNetRun {
    Rng rng{1};
    std::unique_ptr<Sequential> model = lenet(rng);
    std::unique_ptr<Optimizer> optimizer;
    BumpAllocator arena{"step arena", Device::CUDA};
    explicit LeNetRun(bool adamw = false) {
        model->to(Device::CUDA);
        if (adamw) optimizer = std::make_unique<AdamW>(model->parameters(), 2e-3f);
        else optimizer = std::make_unique<SGD>(model->parameters(), 0.05f, SGD::Options{}.with_momentum(0.9f));
    }
    Optimizer& opt() { return *optimizer; }
};

LoaderOptions on_cuda(int64_t batch) { return {batch, true, false, 1, {0.5f}, {0.25f}, Device::CUDA}; }

std::vector<uint8_t> bytes_of(const Tensor& t) {
    const Tensor h = t.to(Device::CPU);
    const auto* p = static_cast<const uint8_t*>(h.raw());
    return {p, p + h.nbytes()};
}

// Every parameter and the optimizer's state (momentum, or Adam's moments), bit for bit.
void check_same_state(LeNetRun& a, LeNetRun& b) {
    const auto pa = a.model->parameters(), pb = b.model->parameters();
    REQUIRE(pa.size() == pb.size());
    for (size_t i = 0; i < pa.size(); i++) {
        INFO("parameter " << pa[i]->name);
        CHECK(bytes_of(pa[i]->value) == bytes_of(pb[i]->value));
        const auto sa = a.opt().state_of(i), sb = b.opt().state_of(i);
        REQUIRE(sa.size() == sb.size());
        for (size_t k = 0; k < sa.size(); k++) CHECK(bytes_of(sa[k]) == bytes_of(sb[k]));
    }
    CHECK(a.opt().steps() == b.opt().steps());
}

struct Counts {
    int64_t host_launches = 0, graph_launches = 0;
    std::uint64_t kernels_run = 0;
};
Counts counts_now() {
    Counts c;
    c.host_launches = cuda::kernel_launches();
    c.graph_launches = cuda::graph_launches();
#ifndef KILN_CUDA
    c.kernels_run = emu::kernels_run();
#endif
    return c;
}

}  // namespace

TEST_CASE("lesson 05: an epoch through a CUDA Graph is the uncaptured epoch, bit for bit",
          "[cuda][graph][lesson05][trainer]") {
    // 10 steps of 8 images, then a last step of 3 (another shape: uncaptured).
    const ImageSet set = test::random_images(10 * 8 + 3, 5);
    const bool adamw = GENERATE(false, true);
    const bool schedule = GENERATE(false, true);  // the lr halved every 3 steps: read from memory
    INFO((adamw ? "AdamW" : "SGD") << ", " << (schedule ? "with" : "without") << " a per-step schedule");
    LeNetRun plain(adamw), graphed(adamw);
    const auto run = [&](LeNetRun& r, bool graph) {
        DataLoader loader(set, on_cuda(8));
        TrainOptions opt;
        opt.arena = &r.arena;
        opt.cuda_graph = graph;
        StepLR decay(r.opt(), 3, 0.5);
        if (schedule) opt.scheduler = &decay, opt.per_batch = true;
        const Counts before = counts_now();
        const EpochResult e = train_epoch(*r.model, r.opt(), loader, 0, opt);
        const Counts after = counts_now();
        return std::make_pair(e, Counts{after.host_launches - before.host_launches,
                                        after.graph_launches - before.graph_launches,
                                        after.kernels_run - before.kernels_run});
    };
    const auto [e_plain, c_plain] = run(plain, false);
    const auto [e_graph, c_graph] = run(graphed, true);
    CHECK(e_graph.loss == e_plain.loss);
    CHECK(e_graph.accuracy == e_plain.accuracy);
    check_same_state(plain, graphed);
    CHECK(plain.opt().lr() == graphed.opt().lr());

    // Steps 1-2 uncaptured, 3-10 graph launches, step 11 (3 images) uncaptured.
    CHECK(c_plain.graph_launches == 0);
    CHECK(c_graph.graph_launches == 8);
    REQUIRE(c_plain.host_launches % 11 == 0);
    const int64_t per_step = c_plain.host_launches / 11;  // kernel launches of one step
    CHECK(per_step > 20);
    // The host launched 3 steps' kernels and recorded one capture's, whether the lr changes or
    // not; the graph launched the rest.
    CHECK(c_graph.host_launches == (3 + 1) * per_step);
#ifndef KILN_CUDA
    // The emulator ran the same kernels either way: a graph launch runs the step's kernels.
    CHECK(c_graph.kernels_run == c_plain.kernels_run);
#endif
}

// The kernels read the same floats from memory as they were given as arguments: the same bits,
// on either device, with the lr changing between steps and the bias corrections with t.
TEST_CASE("a capturable optimizer's steps are its plain steps, bit for bit", "[cuda][cpu][graph][optim]") {
    const Device device = GENERATE(Device::CPU, Device::CUDA);
    const bool adamw = GENERATE(false, true);
    INFO(device_name(device) << (adamw ? " AdamW" : " SGD Nesterov"));
    std::vector<Parameter> a, b;
    for (int64_t n : {5, 130}) {
        std::vector<float> w, g;
        for (int64_t i = 0; i < n; i++) w.push_back(std::sin(0.7f * float(i))), g.push_back(std::cos(1.3f * float(i + n)));
        const Tensor wt = test::tensor_of({n}, w, device), gt = test::tensor_of({n}, g, device);
        a.push_back(Parameter{"w" + std::to_string(n), wt.clone(), gt.clone()});
        b.push_back(Parameter{"w" + std::to_string(n), wt.clone(), gt.clone()});
    }
    const auto make = [&](std::vector<Parameter>& ps) -> std::unique_ptr<Optimizer> {
        std::vector<Parameter*> ptrs;
        for (Parameter& p : ps) ptrs.push_back(&p);
        if (adamw) return std::make_unique<AdamW>(ptrs, 1e-2f);
        return std::make_unique<SGD>(ptrs, 0.1f, SGD::Options{}.with_momentum(0.9f).with_nesterov().with_weight_decay(1e-3f));
    };
    auto plain = make(a), capturable = make(b);
    capturable->make_capturable();
    for (int step = 0; step < 4; step++) {
        plain->set_lr(0.1f / float(step + 1)), capturable->set_lr(0.1f / float(step + 1));
        plain->step(), capturable->step();
    }
    for (size_t i = 0; i < a.size(); i++) CHECK(bytes_of(a[i].value) == bytes_of(b[i].value));

    // The kernels take the scalars in memory over their arguments: lr 1 given, 0.25 in memory.
    const Tensor in_memory = test::tensor_of({4}, {0.25f, 0.5f, 0.75f, 0.0f}, device);
    Tensor p1 = test::tensor_of({3}, {1, 2, 3}, device), p2 = p1.clone(), g = test::tensor_of({3}, {4, 5, 6}, device);
    SgdParams from_memory{1.0f, 0.0f, 0.0f, 0.0f, false, true, static_cast<const float*>(in_memory.raw())};
    sgd_update({p1}, {g}, {}, from_memory);
    sgd_update({p2}, {g}, {}, SgdParams{0.25f, 0.0f, 0.0f, 0.0f, false, true});
    CHECK(bytes_of(p1) == bytes_of(p2));
    // Adam's three: step size 0.25, sqrt(1 − β2^t) 0.5, decay 0.75 (AdamW), against the rule by hand
    Tensor m = test::tensor_of({3}, {0, 0, 0}, device), v = m.clone();
    AdamParams adam{1.0f, 0.9f, 0.999f, 1e-8f, 0.1f, true, 1};
    adam.scalars = static_cast<const float*>(in_memory.raw());
    adam_update({p1}, {g}, {m}, {v}, {}, adam);
    const Tensor p1_after = p1.to(Device::CPU), p2_before = p2.to(Device::CPU);
    for (int64_t i = 0; i < 3; i++) {
        const float gi = float(4 + i), mi = (1.0f - 0.9f) * gi, vi = (1.0f - 0.999f) * gi * gi;
        const float want = p2_before.data<float>()[i] * 0.75f - 0.25f * mi / (std::sqrt(vi) / 0.5f + 1e-8f);
        CHECK(p1_after.data<float>()[i] == Approx(want).epsilon(1e-6));
    }
}

TEST_CASE("StepGraph refuses what a captured step cannot do", "[cuda][graph]") {
    LeNetRun r;
    const ImageSet set = test::random_images(4 * 8, 6);
    DataLoader loader(set, on_cuda(8));
    TrainOptions opt;
    opt.cuda_graph = true;
    SECTION("clipping reads the norm back") {
        opt.clip_norm = 1.0f;
        CHECK_THROWS_WITH(train_epoch(*r.model, r.opt(), loader, 0, opt),
                          Catch::Contains("--cuda-graph") && Catch::Contains("loss_read_every"));
    }
    SECTION("the losses read every step") {
        opt.loss_read_every = 1;
        CHECK_THROWS_WITH(train_epoch(*r.model, r.opt(), loader, 0, opt), Catch::Contains("--cuda-graph"));
    }
    SECTION("an optimizer whose kernels take their scalars as arguments only") {
        struct HostScalars : SGD {
            using SGD::SGD;
            bool can_capture() const override { return false; }
        } host_scalars(r.model->parameters(), 0.05f);
        CHECK_THROWS_WITH(train_epoch(*r.model, host_scalars, loader, 0, opt),
                          Catch::Contains("only SGD's, Adam's and AdamW's") && Catch::Contains("--cuda-graph"));
        CHECK_THROWS_WITH(host_scalars.make_capturable(), Catch::Contains("cannot be captured"));
    }
    SECTION("the CPU has no graphs") {
        Rng rng(1);
        auto cpu_model = lenet(rng);
        SGD sgd(cpu_model->parameters(), 0.05f);
        LoaderOptions o = on_cuda(8);
        o.device = Device::CPU;
        DataLoader cpu_loader(set, o);
        CHECK_THROWS_WITH(train_epoch(*cpu_model, sgd, cpu_loader, 0, opt), Catch::Contains("--device cuda"));
    }
}

TEST_CASE("a captured graph runs its kernels at each launch, not at capture", "[cuda][graph]") {
    Tensor x = Tensor::full({1000}, 1.0f, DType::F32, Device::CUDA);
    Tensor y = Tensor::full({1000}, 0.0f, DType::F32, Device::CUDA);
    cuda::Graph g;
    const Counts before = counts_now();
    g.capture([&] { y.copy_from(x); scale_(y, 3.0f); });
    CHECK(y.to(Device::CPU).data<float>()[7] == 0.0f);  // recorded, not run
    g.launch();
    CHECK(y.to(Device::CPU).data<float>()[7] == 3.0f);
    fill_(x, 2.0f);  // the graph reads x's memory at each launch
    g.launch();
    CHECK(y.to(Device::CPU).data<float>()[999] == 6.0f);
    const Counts after = counts_now();
    CHECK(after.graph_launches - before.graph_launches == 2);
#ifndef KILN_CUDA
    // x.fill_ is one kernel; each launch runs the captured scale kernel once more.
    CHECK(after.kernels_run - before.kernels_run == 2 + 1);
#endif
}

TEST_CASE("what a capture cannot hold fails naming the call, and the next capture works", "[cuda][graph]") {
    Tensor x = Tensor::full({16}, 1.0f, DType::F32, Device::CUDA);
    cuda::Graph g;
    SECTION("a read back to the host") {
        (void)sum(x);  // its scratch is a cached block from here on: the capture takes no memory
        CHECK_THROWS_WITH(g.capture([&] { (void)sum(x); }),
                          Catch::Contains("a read back to the host (8 bytes)") && Catch::Contains("--cuda-graph"));
    }
    SECTION("a new allocation from the device") {
        PoolAllocator fresh("fresh pool", Device::CUDA);
        CHECK_THROWS_WITH(g.capture([&] {
                              PoolScope scope(fresh);
                              (void)Tensor::empty({1 << 20}, DType::F32, Device::CUDA);
                          }),
                          Catch::Contains("fresh pool") && Catch::Contains("CUDA Graph is being captured"));
    }
    SECTION("a wait for the device") {
        CHECK_THROWS_WITH(g.capture([&] { cuda::synchronize(); }),
                          Catch::Contains("a wait for the device") && Catch::Contains("--cuda-graph"));
    }
    CHECK(g.empty());
    CHECK_FALSE(cuda::capturing());
    Tensor y = Tensor::full({16}, 0.0f, DType::F32, Device::CUDA);
    g.capture([&] { y.copy_from(x); });
    g.launch();
    CHECK(y.to(Device::CPU).data<float>()[3] == 1.0f);
}

#ifndef KILN_CUDA
TEST_CASE("emulator: stream capture records, refuses what CUDA refuses, and invalidates the capture",
          "[cuda][graph][emu]") {
    cudaStream_t s = nullptr;
    REQUIRE(cudaStreamCreate(&s) == cudaSuccess);
    CHECK(cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeGlobal) == cudaErrorStreamCaptureUnsupported);
    (void)cudaGetLastError();
    REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    CHECK(cudaStreamIsCapturing(s, &status) == cudaSuccess);
    CHECK(status == cudaStreamCaptureStatusActive);
    void* p = nullptr;
    CHECK(cudaMalloc(&p, 256) == cudaErrorStreamCaptureUnsupported);
    CHECK_THAT(emu::last_error_detail(), Catch::Contains("cudaMalloc (256 bytes)") && Catch::Contains("captured"));
    CHECK(cudaStreamIsCapturing(s, &status) == cudaSuccess);
    CHECK(status == cudaStreamCaptureStatusInvalidated);
    cudaGraph_t graph = nullptr;
    CHECK(cudaStreamEndCapture(s, &graph) == cudaErrorStreamCaptureInvalidated);
    CHECK(graph == nullptr);
    CHECK_THAT(emu::last_error_detail(), Catch::Contains("invalidated by cudaMalloc"));
    (void)cudaGetLastError();

    // A synchronous copy during a capture: the legacy stream, refused.
    REQUIRE(cudaMalloc(&p, 256) == cudaSuccess);
    REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    float host[4] = {};
    CHECK(cudaMemcpy(host, p, sizeof host, cudaMemcpyDeviceToHost) == cudaErrorStreamCaptureImplicit);
    CHECK_THAT(emu::last_error_detail(), Catch::Contains("cudaMemcpy (device to host, 16 bytes)"));
    CHECK(cudaStreamEndCapture(s, &graph) == cudaErrorStreamCaptureInvalidated);
    (void)cudaGetLastError();

    // A fill queued on the capturing stream is recorded, then run by each launch.
    REQUIRE(cudaMemset(p, 0, 256) == cudaSuccess);
    REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    REQUIRE(cudaMemsetAsync(p, 7, 256, s) == cudaSuccess);
    REQUIRE(cudaStreamEndCapture(s, &graph) == cudaSuccess);
    CHECK(static_cast<unsigned char*>(p)[9] == 0);  // not run yet
    cudaGraphExec_t exec = nullptr;
    REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
    const std::uint64_t launches = emu::graph_launches();
    REQUIRE(cudaGraphLaunch(exec, nullptr) == cudaSuccess);
    CHECK(static_cast<unsigned char*>(p)[9] == 7);
    CHECK(emu::graph_launches() == launches + 1);
    CHECK(cudaGraphExecDestroy(exec) == cudaSuccess);
    CHECK(cudaGraphDestroy(graph) == cudaSuccess);

    // cuda::Graph's way: a non-blocking stream in thread-local mode. Another thread may allocate
    // and copy on the legacy stream meanwhile (the data loader's); this thread may not allocate.
    cudaStream_t nb = nullptr;
    REQUIRE(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking) == cudaSuccess);
    REQUIRE(cudaStreamBeginCapture(nb, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
    cudaError_t other_malloc = cudaErrorUnknown, other_copy = cudaErrorUnknown;
    std::thread loader([&] {
        void* q = nullptr;
        other_malloc = cudaMalloc(&q, 64);
        const float one = 1.0f;
        other_copy = cudaMemcpy(q, &one, sizeof one, cudaMemcpyHostToDevice);
        (void)cudaFree(q);
    });
    loader.join();
    CHECK(other_malloc == cudaSuccess);
    CHECK(other_copy == cudaSuccess);
    void* q = nullptr;
    CHECK(cudaMalloc(&q, 64) == cudaErrorStreamCaptureUnsupported);
    CHECK(cudaStreamEndCapture(nb, &graph) == cudaErrorStreamCaptureInvalidated);
    (void)cudaGetLastError();
    CHECK(cudaStreamDestroy(nb) == cudaSuccess);
    CHECK(cudaFree(p) == cudaSuccess);
    CHECK(cudaStreamDestroy(s) == cudaSuccess);
}
#endif
