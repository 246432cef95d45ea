// test_data_parallel.cpp — chapter 12 on 2 ranks (mpirun -np 2): the collectives, data
// parallel training against one process with the whole batch, buckets against one all-reduce,
// ZeRO-1 (its clipping too) and ZeRO-2 against plain data parallel, checkpoints, and a rank that
// never joins.
//
// Run: make build/tests/kiln_mpi_tests && mpirun -np 2 build/tests/kiln_mpi_tests '[ddp]'
// (as root add --allow-run-as-root --oversubscribe; make test runs them all)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <memory>
#include <thread>

#include <unistd.h>

#include <catch2/catch.hpp>

#include "data/loader.h"
#include "dist/data_parallel.h"
#include "dist/zero.h"
#include "dist/zero2.h"
#include "nn/models.h"
#include "ops/ops.h"
#include "optim/adam.h"
#include "optim/optimizer.h"
#include "optim/scheduler.h"
#include "train/fit.h"
#include "train/memory_model.h"
#include "train/loop.h"
#include "world.h"

using namespace kiln;
using Catch::Matchers::Contains;

namespace {

// n MNIST-shaped images of random pixels with random labels (seed 3): the same on every rank.
ImageSet random_images(int64_t n) {
    ImageSet set;
    set.n = n, set.c = 1, set.h = 28, set.w = 28;
    Rng rng(3);
    set.pixels.resize(size_t(n * 28 * 28));
    for (uint8_t& p : set.pixels) p = uint8_t(rng.next_below(256));
    for (int64_t i = 0; i < n; i++) set.labels.push_back(int32_t(rng.next_below(10)));
    for (int k = 0; k < 10; k++) set.classes.push_back(std::to_string(k));
    return set;
}

LoaderOptions loader_options(int64_t batch, int rank, int world_size) {
    LoaderOptions o;
    o.batch_size = batch, o.seed = 5, o.prefetch = false, o.rank = rank, o.world_size = world_size;
    o.mean = {0.5f}, o.std = {0.25f};
    return o;
}

std::vector<float> values_of(Module& m) {
    Tensor v = m.values_view();
    return std::vector<float>(v.data<float>(), v.data<float>() + v.numel());
}

bool same_floats(const Tensor& a, const Tensor& b) {
    Tensor x = a.to(Device::CPU), y = b.to(Device::CPU);
    return x.numel() == y.numel() && std::equal(x.data<float>(), x.data<float>() + x.numel(), y.data<float>());
}

SGD::Options momentum() {
    SGD::Options o;
    o.momentum = 0.9f, o.weight_decay = 5e-4f;
    return o;
}

// The same for parameter groups, which bring their own weight decay (decay_groups).
SGD::Options group_momentum() {
    SGD::Options o = momentum();
    o.weight_decay = 0.0f;
    return o;
}

// `steps` steps of LeNet with SGD on this rank's share of batches of `batch` per rank; returns
// each step's loss averaged over the ranks (the whole batch's mean loss) and the parameters.
struct Trained {
    std::vector<double> losses;
    std::vector<float> params;
};
Trained train_lenet(const ImageSet& set, int64_t batch, int rank, int world_size, int steps,
                    const DataParallelOptions* ddp) {
    Rng rng(11);
    auto model = lenet(rng);
    SGD sgd(model->parameters(), 0.05f, momentum());
    std::unique_ptr<DataParallel> dp;
    if (ddp) dp = std::make_unique<DataParallel>(*model, world(), *ddp);
    DataLoader loader(set, loader_options(batch, rank, world_size));
    Trained t;
    Batch b;
    for (int s = 0; s < steps && loader.next(b); s++) {
        const StepResult r = train_step(*model, sgd, b.x, b.y, {});
        t.losses.push_back(ddp ? world().sum(r.loss) / world().size() : r.loss);
    }
    t.params = values_of(*model);
    return t;
}

}  // namespace

TEST_CASE("the collectives: all-reduce, reduce-scatter, all-gather, broadcast", "[lesson12][cpu][mpi][comm]") {
    Communicator& comm = world();
    REQUIRE(comm.size() == 2);
    const int r = comm.rank();
    // x_r[i] = (r + 1) · i  →  Σ_r x_r[i] = 3i on both ranks
    Tensor x = Tensor::arange(1000);
    scale_(x, float(r + 1));
    comm.all_reduce(x);
    for (int64_t i = 0; i < 1000; i++) REQUIRE(x.data<float>()[i] == 3.0f * float(i));

    // reduce-scatter: rank r's piece holds the sum; all-gather puts every piece back everywhere
    const std::vector<int64_t> pieces = even_pieces(1000, 2, 16);
    REQUIRE(pieces == std::vector<int64_t>{0, 512, 1000});
    Tensor y = Tensor::arange(1000);
    scale_(y, float(r + 1));
    comm.reduce_scatter(y, pieces);
    for (int64_t i = pieces[size_t(r)]; i < pieces[size_t(r) + 1]; i++) REQUIRE(y.data<float>()[i] == 3.0f * float(i));
    comm.all_gather(y, pieces);
    for (int64_t i = 0; i < 1000; i++) REQUIRE(y.data<float>()[i] == 3.0f * float(i));

    Tensor z = Tensor::full({7}, double(r + 10), DType::I32);
    comm.broadcast(z, 1);
    for (int64_t i = 0; i < 7; i++) REQUIRE(z.data<int32_t>()[i] == 11);
    REQUIRE(comm.sum(0.5 + r) == 2.0);
    REQUIRE(comm.gather_all(r * 7) == std::vector<int64_t>{0, 7});
}

TEST_CASE("2 ranks × batch 32 give the losses of 1 process × batch 64 (no batch norm)", "[lesson12][cpu][mpi][ddp]") {
    const ImageSet set = random_images(64 * 50);
    DataParallelOptions ddp;
    const Trained two = train_lenet(set, 32, world().rank(), 2, 50, &ddp);
    const Trained one = train_lenet(set, 64, 0, 1, 50, nullptr);  // every rank computes the reference
    REQUIRE(two.losses.size() == 50);
    // The gradients differ in rounding only: (1/64) Σ_64 against ((1/32) Σ_32 + (1/32) Σ_32) / 2,
    // summed in another order by the GEMMs. Over 50 steps the losses stay within 1e-6 of each
    // other (relative; each loss is about 2.3).
    double worst = 0;
    for (size_t s = 0; s < 50; s++) worst = std::max(worst, std::abs(two.losses[s] - one.losses[s]) / one.losses[s]);
    INFO("largest relative loss difference over 50 steps: " << worst);
    REQUIRE(worst < 1e-6);
}

TEST_CASE("buckets overlapped with backward give exactly the one all-reduce's result", "[lesson12][cpu][mpi][ddp]") {
    const ImageSet set = random_images(32 * 2 * 4);
    DataParallelOptions small, whole;
    small.bucket_bytes = 16 << 10;  // 16 KiB: LeNet's 44,426 parameters make several buckets
    whole.overlap = false;
    const Trained a = train_lenet(set, 32, world().rank(), 2, 4, &small);
    const Trained b = train_lenet(set, 32, world().rank(), 2, 4, &whole);
    // a + b is the same float whichever bucket carries it: bit-identical
    REQUIRE(a.params == b.params);
    REQUIRE(a.losses == b.losses);

    Rng rng(11);
    auto model = lenet(rng);
    DataParallel dp(*model, world(), small);
    REQUIRE(dp.buckets().size() > 2);
    REQUIRE(dp.buckets().front().end == model->grads_view().numel());  // bucket 0: the last layers
    REQUIRE(dp.buckets().back().begin == 0);
    for (size_t k = 1; k < dp.buckets().size(); k++) REQUIRE(dp.buckets()[k].end == dp.buckets()[k - 1].begin);
}

// ZeRO-2 (dist/zero2.h) also reduces each bucket into its rank's piece during backward and keeps no
// gradient slab: the same sums and updates, so the same bits too.
TEST_CASE("ZeRO-1 and ZeRO-2 take the same steps as plain data parallel, with half the optimizer state",
          "[lesson12][cpu][mpi][zero]") {
    const ImageSet set = random_images(32 * 2 * 4);
    const int rank = world().rank();
    for (const std::pair<int, bool>& run : std::vector<std::pair<int, bool>>{{1, false}, {1, true}, {2, false}, {2, true}}) {
        const int stage = run.first;
        const bool adam = run.second;
        DYNAMIC_SECTION("ZeRO-" << stage << (adam ? " Adam" : " SGD with momentum")) {
            auto make = [adam](std::vector<ParamGroup> groups) -> std::unique_ptr<Optimizer> {
                if (adam) return std::make_unique<Adam>(std::move(groups), Adam::Options{});
                return std::make_unique<SGD>(std::move(groups), group_momentum());
            };
            Rng rng_a(11), rng_b(11);
            auto plain = lenet(rng_a), sharded = lenet(rng_b);
            auto full = make(decay_groups(*plain, 0.01f, 5e-4f));
            DataParallel dp(*plain, world());
            Zero2Options small;
            small.bucket_bytes = 16 << 10;  // 16 KiB: LeNet's 44,426 parameters make several buckets
            std::unique_ptr<ZeroOptimizer> sharding;
            if (stage == 1)
                sharding = std::make_unique<ZeroOptimizer>(*sharded, decay_groups(*sharded, 0.01f, 5e-4f), world(), make);
            else
                sharding = std::make_unique<Zero2Optimizer>(*sharded, decay_groups(*sharded, 0.01f, 5e-4f), world(), make, small);
            ZeroOptimizer& zero = *sharding;
            REQUIRE(sharded->packed() == (stage == 1));  // ZeRO-2 let the gradient slab go
            DataLoader la(set, loader_options(32, rank, 2)), lb(set, loader_options(32, rank, 2));
            Batch a, b;
            while (la.next(a) && lb.next(b)) {
                train_step(*plain, *full, a.x, a.y, {});
                train_step(*sharded, zero, b.x, b.y, {});
                if (stage == 2)  // every bucket's buffer went back after its reduce-scatter
                    for (Parameter* p : sharded->parameters()) REQUIRE_FALSE(p->grad.defined());
            }
            if (stage == 2) REQUIRE(static_cast<Zero2Optimizer&>(zero).buckets().size() > 2);
            REQUIRE(values_of(*sharded) == values_of(*plain));  // the same floats, bit for bit

            // this rank keeps the state of its piece of the slab only: about half
            int64_t kept = 0, whole = 0;
            for (size_t i = 0; i < plain->parameters().size(); i++) {
                for (const Tensor& t : zero.state_of(i)) kept += t.numel();
                for (const Tensor& t : full->state_of(i)) whole += t.numel();
            }
            const int64_t piece = zero.pieces()[size_t(rank) + 1] - zero.pieces()[size_t(rank)];
            REQUIRE(kept <= whole / plain->num_parameters() * piece);
            REQUIRE(kept > whole / 2 - whole / 10);
            // chapter 08's prediction from shapes counts this rank's piece, tensor for tensor
            const MemoryPrediction predicted = predict_memory(
                *sharded, memory_model_options(*sharded, zero, Shape{32, 1, 28, 28}, Device::CPU, true, DType::F32));
            REQUIRE(predicted.modules.front().optimizer_state == kept * 4);

            // the gathered checkpoint state is the unsharded optimizer's, name for name
            StateDict s_full, s_zero;
            full->save_state(s_full, "optimizer");
            zero.save_state(s_zero, "optimizer");
            REQUIRE(s_zero.tensors.size() == s_full.tensors.size());
            for (auto& [key, t] : s_full.tensors) {
                INFO(key);
                REQUIRE(s_zero.tensors.count(key) == 1);
                REQUIRE(same_floats(s_zero.tensors.at(key), t));
            }
        }
    }
}

TEST_CASE("ZeRO-1 resumes exactly from its gathered state", "[lesson12][cpu][mpi][zero]") {
    const ImageSet set = random_images(32 * 2 * 6);
    auto make = [](std::vector<ParamGroup> groups) -> std::unique_ptr<Optimizer> {
        return std::make_unique<SGD>(std::move(groups), group_momentum());
    };
    DataLoader loader(set, loader_options(32, world().rank(), 2));
    std::vector<Batch> batches(6);
    for (Batch& b : batches) REQUIRE(loader.next(b));

    Rng rng(11);
    auto model = lenet(rng);
    ZeroOptimizer zero(*model, decay_groups(*model, 0.01f, 0.0f), world(), make);
    for (int s = 0; s < 3; s++) train_step(*model, zero, batches[size_t(s)].x, batches[size_t(s)].y, {});
    StateDict saved;
    zero.save_state(saved, "optimizer");
    const std::vector<float> at3 = values_of(*model);
    for (int s = 3; s < 6; s++) train_step(*model, zero, batches[size_t(s)].x, batches[size_t(s)].y, {});

    Rng other(99);  // other initial values: everything comes from the saved state
    auto again = lenet(other);
    ZeroOptimizer resumed(*again, decay_groups(*again, 0.01f, 0.0f), world(), make);
    Tensor v = again->values_view();
    std::copy(at3.begin(), at3.end(), v.data<float>());
    resumed.load_state(saved, "optimizer");
    for (int s = 3; s < 6; s++) train_step(*again, resumed, batches[size_t(s)].x, batches[size_t(s)].y, {});
    REQUIRE(values_of(*again) == values_of(*model));
}

namespace {

// LeNet (Adam over decay_groups) trained with its gradients clipped to a global norm of max_norm:
// alone (one process, batch 64), or on this rank's 32 of each 64 with plain data parallel, ZeRO-1
// or ZeRO-2 (buckets of 16 KiB).
enum class Sync { Alone, DataParallel, Zero1, Zero2 };
struct Clipped : Trained {
    std::vector<float> norms;  // each step's norm before clipping (StepResult::grad_norm)
};
Clipped train_clipped(const ImageSet& set, Sync sync, int steps, float max_norm) {
    auto make = [](std::vector<ParamGroup> groups) -> std::unique_ptr<Optimizer> {
        return std::make_unique<Adam>(std::move(groups), Adam::Options{});
    };
    Rng rng(11);
    auto model = lenet(rng);
    std::unique_ptr<DataParallel> dp;
    std::unique_ptr<Optimizer> opt;
    if (sync == Sync::Zero1) {
        opt = std::make_unique<ZeroOptimizer>(*model, decay_groups(*model, 0.01f, 5e-4f), world(), make);
    } else if (sync == Sync::Zero2) {
        Zero2Options small;
        small.bucket_bytes = 16 << 10;
        opt = std::make_unique<Zero2Optimizer>(*model, decay_groups(*model, 0.01f, 5e-4f), world(), make, small);
    } else {
        opt = make(decay_groups(*model, 0.01f, 5e-4f));
        if (sync == Sync::DataParallel) dp = std::make_unique<DataParallel>(*model, world());
    }
    const bool alone = sync == Sync::Alone;
    DataLoader loader(set, loader_options(alone ? 64 : 32, alone ? 0 : world().rank(), alone ? 1 : 2));
    StepOptions clip;
    clip.clip_norm = max_norm;
    Clipped t;
    Batch b;
    for (int s = 0; s < steps && loader.next(b); s++) {
        const StepResult r = train_step(*model, *opt, b.x, b.y, clip);
        t.losses.push_back(alone ? r.loss : world().sum(r.loss) / world().size());
        t.norms.push_back(r.grad_norm);
    }
    t.params = values_of(*model);
    return t;
}

}  // namespace

// ZeRO-1's gradients are summed over the ranks only inside the optimizer, in pieces: its
// clip_gradients takes the norm from every rank's piece (one all-reduce of a number). Against
// plain data parallel, which clips the whole summed gradient on every rank with clip_grad_norm:
// the same norms and the same parameters, bit for bit (the two sum the same squares in double,
// in another grouping, and differ there by rounding far below what the float they give sees);
// against one process with the whole batch, the same within data parallel's rounding (the test
// above). A norm from this rank's piece alone would be about 1/√2 of it, and clip unlike. ZeRO-2
// clips its piece, reduced during backward, the same way.
TEST_CASE("ZeRO-1 and ZeRO-2 clip by the global norm over the ranks' pieces, as clip_grad_norm does on the summed gradients",
          "[lesson12][lesson14][cpu][mpi][zero][clip]") {
    const ImageSet set = random_images(64 * 6);
    const float max_norm = 0.05f;  // below every step's norm: each step clips
    const Clipped zero = train_clipped(set, Sync::Zero1, 6, max_norm);
    const Clipped ddp = train_clipped(set, Sync::DataParallel, 6, max_norm);
    const Clipped alone = train_clipped(set, Sync::Alone, 6, max_norm);
    REQUIRE(zero.norms.size() == 6);
    for (size_t s = 0; s < 6; s++) {
        INFO("step " << s << ": norm " << zero.norms[s] << " under ZeRO-1, " << ddp.norms[s] << " data parallel, "
                     << alone.norms[s] << " alone");
        CHECK(zero.norms[s] > max_norm);
        CHECK(zero.norms[s] == ddp.norms[s]);
        CHECK(zero.norms[s] == Approx(alone.norms[s]).epsilon(1e-5));
        CHECK(zero.losses[s] == Approx(alone.losses[s]).epsilon(1e-6));
    }
    REQUIRE(zero.params == ddp.params);
    const Clipped zero2 = train_clipped(set, Sync::Zero2, 6, max_norm);
    CHECK(zero2.norms == ddp.norms);
    REQUIRE(zero2.params == ddp.params);

    Rng rng(11);  // the model's parameters only: anything else is refused by name
    auto model = lenet(rng);
    ZeroOptimizer opt(*model, decay_groups(*model, 0.01f, 0.0f), world(), [](std::vector<ParamGroup> g) {
        return std::unique_ptr<Optimizer>(std::make_unique<Adam>(std::move(g), Adam::Options{}));
    });
    std::vector<Parameter*> some = model->parameters();
    some.pop_back();
    REQUIRE_THROWS_WITH(opt.clip_gradients(some, 1.0f), Contains("pass model.parameters()"));
}

TEST_CASE("a rank that never joins an all-reduce is an error after the timeout, not a hang", "[lesson12][cpu][mpi][comm]") {
    MpiCommunicator& comm = world();
    Tensor x = Tensor::ones({4});
    if (comm.rank() == 0) {
        comm.set_timeout(0.5);
        const CommRequest r = comm.all_reduce_start(x);
        REQUIRE_THROWS_WITH(comm.wait(r), Contains("never joined") && Contains("rank 0 of 2"));
        comm.set_timeout(60);  // rank 1 arrives now: the same all-reduce finishes
        comm.wait(r);
    } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(1500));
        comm.all_reduce(x);
    }
    REQUIRE(x.data<float>()[0] == 2.0f);
}

TEST_CASE("ranks that built different models are told so", "[lesson12][cpu][mpi][ddp]") {
    Rng rng(11);
    auto model = world().rank() == 0 ? lenet(rng) : mlp(rng, 32, 16);
    REQUIRE_THROWS_WITH(DataParallel(*model, world()), Contains("rank 1 built a model of") && Contains("same flags"));
}

TEST_CASE("rank 0 writes the checkpoints, and a data parallel run resumes from them exactly", "[lesson12][cpu][mpi][checkpoint]") {
    Communicator& comm = world();
    const int rank = comm.rank();
    const ImageSet set = random_images(32 * 2 * 3);  // 3 steps an epoch
    const std::string dir = "/tmp/kiln-mpi-test-" + std::to_string(comm.gather_all(int64_t(getpid()))[0]);
    for (int zero : {0, 1, 2}) {
        DYNAMIC_SECTION("ZeRO-" << zero) {
            // two epochs with --save; then the same run resumed from the first epoch's checkpoint
            auto run = [&](const std::string& save, const std::string& resume) {
                Rng rng(11);
                auto model = lenet(rng);
                auto make = [](std::vector<ParamGroup> g) -> std::unique_ptr<Optimizer> {
                    return std::make_unique<SGD>(std::move(g), group_momentum());
                };
                std::unique_ptr<Optimizer> optimizer;
                std::unique_ptr<DataParallel> dp;
                if (zero == 2) {
                    optimizer = std::make_unique<Zero2Optimizer>(*model, decay_groups(*model, 0.05f, 5e-4f), comm, make);
                } else if (zero == 1) {
                    optimizer = std::make_unique<ZeroOptimizer>(*model, decay_groups(*model, 0.05f, 5e-4f), comm, make);
                } else {
                    optimizer = make(decay_groups(*model, 0.05f, 5e-4f));
                    dp = std::make_unique<DataParallel>(*model, comm);
                }
                LoaderOptions in_order = loader_options(64, 0, 1);
                in_order.shuffle = false;
                DataLoader train(set, loader_options(32, rank, 2)), test(set, in_order);
                StepLR decay(*optimizer, 1, 0.5f);
                TrainOptions o;
                o.epochs = 2, o.scheduler = &decay, o.save_dir = save, o.resume = resume, o.main_process = rank == 0;
                fit(*model, *optimizer, train, test, o);
                return values_of(*model);
            };
            const std::vector<float> straight = run(dir, "");
            comm.sum(0);  // rank 0 has written both checkpoints
            REQUIRE(std::filesystem::exists(dir + "/prev.safetensors"));
            const std::vector<float> resumed = run("", dir + "/prev.safetensors");
            REQUIRE(resumed == straight);
            comm.sum(0);  // both have read it
            if (rank == 0) std::filesystem::remove_all(dir);
        }
    }
}

TEST_CASE("a collective on the wrong dtype or with wrong pieces is refused by name, on every rank", "[lesson12][cpu][mpi][comm]") {
    Communicator& comm = world();
    Tensor ints = Tensor::zeros({8}, DType::I32);
    REQUIRE_THROWS_WITH(comm.all_reduce(ints), Contains("all_reduce") && Contains("i32"));
    Tensor x = Tensor::zeros({10});
    REQUIRE_THROWS_WITH(comm.reduce_scatter(x, {0, 5}), Contains("2 offsets for a world of 2 ranks"));
    REQUIRE_THROWS_WITH(comm.all_gather(x, {0, 11, 10}), Contains("offsets[1] = 11 > offsets[2]"));
    REQUIRE_THROWS_WITH(comm.broadcast(x, 2), Contains("broadcast from rank 2 in a world of 2"));
    comm.all_reduce(x);  // the ranks are still in step: nothing was started
    REQUIRE(x.data<float>()[0] == 0.0f);
}
