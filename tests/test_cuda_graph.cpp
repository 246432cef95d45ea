// test_cuda_graph.cpp — a training step captured as a CUDA Graph (train/step_graph.h,
// --cuda-graph) and the emulator's stream capture under it (cuda/emu/runtime.cpp): an epoch
// of lesson 05's LeNet through the graph is the uncaptured epoch bit for bit (losses, weights,
// momentum), with a learning rate that changes during the epoch too; the emulator's counts show
// one graph launch per captured step running the step's kernels; what a capture cannot hold (a
// read back to the host, an allocation, a wait) fails naming the call.
//
//   make test T='[graph]'
#include <catch2/catch.hpp>

#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "core/cuda_memory.h"
#include "data/loader.h"
#include "nn/models.h"
#include "ops/ops.h"
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

// Lesson 05's model and optimizer: LeNet on the device, SGD with momentum 0.9.
struct LeNetRun {
    Rng rng{1};
    std::unique_ptr<Sequential> model = lenet(rng);
    SGD sgd{model->parameters(), 0.05f, SGD::Options{}.with_momentum(0.9f)};
    BumpAllocator arena{"step arena", Device::CUDA};
    LeNetRun() { model->to(Device::CUDA); }
};

LoaderOptions on_cuda(int64_t batch) { return {batch, true, false, 1, {0.5f}, {0.25f}, Device::CUDA}; }

std::vector<uint8_t> bytes_of(const Tensor& t) {
    const Tensor h = t.to(Device::CPU);
    const auto* p = static_cast<const uint8_t*>(h.raw());
    return {p, p + h.nbytes()};
}

// Every parameter and every momentum buffer, bit for bit.
void check_same_state(LeNetRun& a, LeNetRun& b) {
    const auto pa = a.model->parameters(), pb = b.model->parameters();
    REQUIRE(pa.size() == pb.size());
    for (size_t i = 0; i < pa.size(); i++) {
        INFO("parameter " << pa[i]->name);
        CHECK(bytes_of(pa[i]->value) == bytes_of(pb[i]->value));
        const auto sa = a.sgd.state_of(i), sb = b.sgd.state_of(i);
        REQUIRE(sa.size() == sb.size());
        for (size_t k = 0; k < sa.size(); k++) CHECK(bytes_of(sa[k]) == bytes_of(sb[k]));
    }
    CHECK(a.sgd.steps() == b.sgd.steps());
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
    const bool schedule = GENERATE(false, true);  // the lr halved every 3 steps: captured again
    INFO((schedule ? "with" : "without") << " a per-step schedule");
    LeNetRun plain, graphed;
    const auto run = [&](LeNetRun& r, bool graph) {
        DataLoader loader(set, on_cuda(8));
        TrainOptions opt;
        opt.arena = &r.arena;
        opt.cuda_graph = graph;
        StepLR decay(r.sgd, 3, 0.5);
        if (schedule) opt.scheduler = &decay, opt.per_batch = true;
        const Counts before = counts_now();
        const EpochResult e = train_epoch(*r.model, r.sgd, loader, 0, opt);
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
    CHECK(plain.sgd.lr() == graphed.sgd.lr());

    // Steps 1-2 uncaptured, 3-10 graph launches, step 11 (3 images) uncaptured.
    CHECK(c_plain.graph_launches == 0);
    CHECK(c_graph.graph_launches == 8);
    REQUIRE(c_plain.host_launches % 11 == 0);
    const int64_t per_step = c_plain.host_launches / 11;  // kernel launches of one step
    CHECK(per_step > 20);
    // The host launched 3 steps' kernels and recorded the captures' (1, or one per lr: steps 3,
    // 4, 7 and 10 see a new lr under the schedule); the graph launched the rest.
    const int64_t captures = schedule ? 4 : 1;
    CHECK(c_graph.host_launches == (3 + captures) * per_step);
#ifndef KILN_CUDA
    // The emulator ran the same kernels either way: a graph launch runs the step's kernels.
    CHECK(c_graph.kernels_run == c_plain.kernels_run);
#endif
}

TEST_CASE("StepGraph refuses what a captured step cannot do", "[cuda][graph]") {
    LeNetRun r;
    const ImageSet set = test::random_images(4 * 8, 6);
    DataLoader loader(set, on_cuda(8));
    TrainOptions opt;
    opt.cuda_graph = true;
    SECTION("clipping reads the norm back") {
        opt.clip_norm = 1.0f;
        CHECK_THROWS_WITH(train_epoch(*r.model, r.sgd, loader, 0, opt),
                          Catch::Contains("--cuda-graph") && Catch::Contains("loss_read_every"));
    }
    SECTION("the losses read every step") {
        opt.loss_read_every = 1;
        CHECK_THROWS_WITH(train_epoch(*r.model, r.sgd, loader, 0, opt), Catch::Contains("--cuda-graph"));
    }
    SECTION("Adam keeps its step count on the host") {
        Adam adam(r.model->parameters(), 1e-3f);
        CHECK_THROWS_WITH(train_epoch(*r.model, adam, loader, 0, opt),
                          Catch::Contains("only SGD") && Catch::Contains("--cuda-graph"));
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
