// test_dist.cpp — chapter 12's parts that need no second process: the pieces of a slab, the
// gradient buckets, each rank's share of the data, the world size in checkpoints, the ZeRO-1
// memory table. The collectives themselves run as 2 ranks in tests/mpi/.
//
// Run: make build/tests/kiln_tests && build/tests/kiln_tests '[lesson12]'
#include <catch2/catch.hpp>

#include "data/loader.h"
#include "data/transforms.h"
#include "dist/comm.h"
#include "dist/data_parallel.h"
#include "dist/zero.h"
#include "fixtures.h"
#include "nn/models.h"
#include "optim/optimizer.h"
#include "train/checkpoint.h"

using namespace kiln;
using kiln::test::TempDir;
using Catch::Matchers::Contains;

namespace {

// n 4×4 grey images, pixel values from the image's index, label i mod 10.
ImageSet small_images(int64_t n) {
    ImageSet s;
    s.n = n, s.c = 1, s.h = 4, s.w = 4;
    for (int64_t i = 0; i < n; i++) {
        for (int k = 0; k < 16; k++) s.pixels.push_back(uint8_t((7 * i + k) % 256));
        s.labels.push_back(int32_t(i % 10));
    }
    for (int k = 0; k < 10; k++) s.classes.push_back(std::to_string(k));
    return s;
}

LoaderOptions shared_options(int64_t batch, int rank, int world) {
    LoaderOptions o;
    o.batch_size = batch, o.seed = 9, o.rank = rank, o.world_size = world, o.prefetch = false;
    o.transforms = {std::make_shared<RandomCrop>(4, 1), std::make_shared<RandomHorizontalFlip>()};
    return o;
}

// Row i of a batch's x (one image, C·H·W floats).
std::vector<float> image_of(const Batch& b, int64_t i) {
    const int64_t n = b.x.numel() / b.size();
    const float* p = b.x.data<float>() + i * n;
    return std::vector<float>(p, p + n);
}

}  // namespace

TEST_CASE("even_pieces: one piece per rank, aligned, covering the slab", "[lesson12][cpu][dist]") {
    REQUIRE(even_pieces(10, 3) == std::vector<int64_t>{0, 4, 8, 10});        // ⌈10/3⌉ = 4
    REQUIRE(even_pieces(1000, 2, 16) == std::vector<int64_t>{0, 512, 1000});  // ⌈1000/32⌉·16 = 512
    REQUIRE(even_pieces(5, 4, 16) == std::vector<int64_t>{0, 5, 5, 5, 5});     // too few for 4 ranks
    REQUIRE(even_pieces(0, 2) == std::vector<int64_t>{0, 0, 0});
    REQUIRE_THROWS_WITH(even_pieces(10, 0), Contains("p = 0"));
}

TEST_CASE("buckets: reverse layer order, about the cap each, the whole slab covered", "[lesson12][cpu][dist]") {
    std::vector<Parameter> params(4);
    std::vector<Parameter*> ps;
    for (Parameter& p : params) ps.push_back(&p);
    // slab of 1000: parameters at [0,300) [320,420) [448,848) [896,990), padding between
    const std::vector<std::pair<int64_t, int64_t>> ranges{{0, 300}, {320, 420}, {448, 848}, {896, 990}};
    const auto buckets = plan_buckets(ps, ranges, 1000, 450);
    // from the end: p3 (104 with its padding), + p2 → [448, 1000) = 552 ≥ 450: closed; then p1, p0
    REQUIRE(buckets.size() == 2);
    REQUIRE(buckets[0].begin == 448);
    REQUIRE(buckets[0].end == 1000);
    REQUIRE(buckets[0].params == std::vector<Parameter*>{ps[3], ps[2]});
    REQUIRE(buckets[1].begin == 0);
    REQUIRE(buckets[1].end == 448);
    REQUIRE(buckets[1].params == std::vector<Parameter*>{ps[1], ps[0]});

    // a bucket that holds exactly the cap is full: [448, 1000) is 552 elements
    const auto at_cap = plan_buckets(ps, ranges, 1000, 552);
    REQUIRE(at_cap.size() == 2);
    REQUIRE(at_cap[0].begin == 448);
    REQUIRE(at_cap[1].params == std::vector<Parameter*>{ps[1], ps[0]});

    const auto one = plan_buckets(ps, ranges, 1000, int64_t(1) << 40);  // DDP's cap far above the model
    REQUIRE(one.size() == 1);
    REQUIRE(one[0].begin == 0);
    REQUIRE(one[0].end == 1000);
    const auto each = plan_buckets(ps, ranges, 1000, 1);  // every parameter its own bucket
    REQUIRE(each.size() == 4);
    REQUIRE(each[3].begin == 0);
    REQUIRE(each[2].begin == 320);

    // ZeRO-3's units: a bucket also closes before a unit's first parameter (p1: units {p0} {p1 p2 p3})
    const auto units = plan_buckets(ps, ranges, 1000, int64_t(1) << 40, {true, true, false, false});
    REQUIRE(units.size() == 2);
    REQUIRE(units[0].begin == 320);
    REQUIRE(units[0].params == std::vector<Parameter*>{ps[3], ps[2], ps[1]});
    REQUIRE(units[1].params == std::vector<Parameter*>{ps[0]});
}

TEST_CASE("2 ranks' batches hold the one-process batch's images, augmented the same", "[lesson12][cpu][dist][loader]") {
    const ImageSet set = small_images(64);
    DataLoader one(set, shared_options(8, 0, 1)), r0(set, shared_options(4, 0, 2)), r1(set, shared_options(4, 1, 2));
    for (int64_t epoch : {0, 3}) {
        one.start_epoch(epoch), r0.start_epoch(epoch), r1.start_epoch(epoch);
        REQUIRE(r0.num_batches() == one.num_batches());
        Batch b, b0, b1;
        while (one.next(b)) {
            REQUIRE(r0.next(b0));
            REQUIRE(r1.next(b1));
            // the one-process order, dealt out in turn: rank 0 takes positions 0, 2, 4, …
            for (int64_t i = 0; i < b.size(); i++) {
                const Batch& share = i % 2 == 0 ? b0 : b1;
                REQUIRE(image_of(b, i) == image_of(share, i / 2));
                REQUIRE(b.y.data<int32_t>()[i] == share.y.data<int32_t>()[i / 2]);
            }
        }
        REQUIRE_FALSE(r0.next(b0));
    }
}

TEST_CASE("an epoch that does not split evenly is padded from its start, as DistributedSampler does", "[lesson12][cpu][dist][loader]") {
    const ImageSet set = small_images(7);
    LoaderOptions o = shared_options(8, 0, 1);
    o.transforms = {};
    DataLoader one(set, o);
    o.world_size = 2, o.rank = 1;
    DataLoader second(set, o);
    REQUIRE(second.size() == 4);  // ⌈7/2⌉
    Batch all, mine;
    one.next(all);
    second.next(mine);
    // rank 1 takes positions 1, 3, 5 and then 7 → 7 mod 7 = 0: the epoch's first image again
    for (int64_t i = 0; i < 3; i++) REQUIRE(mine.y.data<int32_t>()[i] == all.y.data<int32_t>()[2 * i + 1]);
    REQUIRE(mine.y.data<int32_t>()[3] == all.y.data<int32_t>()[0]);
    o.rank = 2;
    REQUIRE_THROWS_WITH(DataLoader(set, o), Contains("rank 2 of a world of 2"));
}

TEST_CASE("a checkpoint of 2 data parallel ranks is refused by a run of 1", "[lesson12][cpu][dist][checkpoint]") {
    TempDir dir;
    const ImageSet set = small_images(32);
    Rng rng(1);
    auto model = softmax_regression(rng);  // only its state is saved: it never sees these images
    SGD sgd(model->parameters(), 0.1f);
    DataLoader two_ranks(set, shared_options(4, 0, 2)), alone(set, shared_options(8, 0, 1));
    const std::string path = dir.file("ranks.safetensors");
    TrainingRun saved{*model, sgd, nullptr, &two_ranks, {}};
    save_checkpoint(path, saved, {1, 0, 4});
    REQUIRE(read_safetensors(path).get_int("train.loader.world_size") == 2);
    TrainingRun resumed{*model, sgd, nullptr, &alone, {}};
    REQUIRE_THROWS_WITH(load_checkpoint(path, resumed), Contains("2 data parallel rank") && Contains("mpirun -np 2"));
    TrainingRun again{*model, sgd, nullptr, &two_ranks, {}};
    REQUIRE(load_checkpoint(path, again).epoch == 1);
}

TEST_CASE("ZeRO-1's memory table: the optimizer state divided by the ranks", "[lesson12][cpu][dist][zero]") {
    // P = 1,000,000 parameters with Adam (2 slabs): 4 MB each of parameters and gradients, 8 MB of
    // state; over 8 ranks ZeRO-1 keeps 1 MB of state per rank: 9 MB in all instead of 16.
    const std::string t = zero_memory_table(1000000, 2, {1, 8});
    REQUIRE_THAT(t, Contains(format_bytes(8000000)) && Contains(format_bytes(1000000)) &&
                        Contains(format_bytes(16000000)) && Contains(format_bytes(9000000)));
    REQUIRE_THROWS_WITH(zero_memory_table(10, 1, {0}), Contains("a world of 0 ranks"));
}

TEST_CASE("ZeRO-1's pieces without a communicator: every element kept by exactly one rank", "[lesson12][cpu][dist][zero]") {
    Rng rng(3);
    std::unique_ptr<Sequential> net = mlp(rng, 24, 16);  // 784·24+24, 24·16+16, 16·10+10 = 19,410 parameters
    net->pack();
    const std::vector<Parameter*> params = net->parameters();
    const int64_t slab = net->grads_view().numel();  // the 19,410 and the gaps that align each tensor
    REQUIRE(slab >= 19410);
    for (int world : {1, 2, 8}) {
        INFO("world " << world);
        std::vector<int64_t> total(params.size(), 0);
        int64_t rank0 = 0;
        for (int r = 0; r < world; r++) {
            const std::vector<int64_t> e = zero_state_elements(*net, r, world);
            REQUIRE(e.size() == params.size());
            for (size_t i = 0; i < e.size(); i++) total[i] += e[i];
            if (r == 0) for (int64_t n : e) rank0 += n;
        }
        for (size_t i = 0; i < params.size(); i++) CHECK(total[i] == params[i]->value.numel());
        // rank 0 owns the slab's first ⌈slab / (16·world)⌉·16 elements: over 2 or 8 ranks all of
        // them within the first weight (784·24 = 18,816 elements); alone, every parameter (the
        // gaps between them hold no parameter)
        CHECK(rank0 == (world == 1 ? 19410 : (slab + 16 * world - 1) / (16 * world) * 16));
    }
    // the first weight starts the slab and is cut between the 2 ranks at rank 0's piece's end
    const int64_t half = (slab + 31) / 32 * 16;
    CHECK(zero_state_elements(*net, 0, 2)[0] == half);
    CHECK(zero_state_elements(*net, 1, 2)[0] == 18816 - half);
    REQUIRE_THROWS_WITH(zero_state_elements(*net, 2, 2), Contains("0 <= rank < world"));
}
