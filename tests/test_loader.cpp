// test_loader.cpp — batching, seeded shuffling, drop_last, normalization, --limit, and batches
// built on the GPU (on_device).
#include <catch2/catch.hpp>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>

#include "data/loader.h"

using namespace kiln;

// 10 one-pixel "images" whose pixel value is 10·i and label i.
static ImageSet tiny_set(int64_t n = 10) {
    ImageSet s;
    s.n = n; s.c = 1; s.h = 1; s.w = 1;
    for (int64_t i = 0; i < n; i++) {
        s.pixels.push_back(uint8_t(10 * i));
        s.labels.push_back(int32_t(i));
    }
    return s;
}

static std::vector<int32_t> epoch_labels(DataLoader& loader, int64_t epoch) {
    loader.start_epoch(epoch);
    std::vector<int32_t> out;
    Batch b;
    while (loader.next(b))
        for (int64_t i = 0; i < b.size(); i++) out.push_back(b.y.data<int32_t>()[i]);
    return out;
}

TEST_CASE("batches cover the set once per epoch, in a seeded order", "[loader][cpu][lesson01]") {
    ImageSet s = tiny_set();
    LoaderOptions o;
    o.batch_size = 4;
    o.seed = 3;
    DataLoader a(s, o), b(s, o);
    REQUIRE(a.num_batches() == 3);
    auto e0 = epoch_labels(a, 0);
    REQUIRE(e0.size() == 10);
    REQUIRE(std::set<int32_t>(e0.begin(), e0.end()).size() == 10);
    REQUIRE(e0 == epoch_labels(b, 0));   // same seed, same epoch: same order
    REQUIRE(e0 != epoch_labels(a, 1));   // another epoch: another order
    o.seed = 4;
    DataLoader c(s, o);
    REQUIRE(e0 != epoch_labels(c, 0));
    o.shuffle = false;
    DataLoader d(s, o);
    REQUIRE(epoch_labels(d, 5) == std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
}

TEST_CASE("drop_last skips the short batch", "[loader][cpu][lesson01]") {
    ImageSet s = tiny_set();
    LoaderOptions o;
    o.batch_size = 4;
    o.drop_last = true;
    DataLoader l(s, o);
    REQUIRE(l.num_batches() == 2);
    REQUIRE(epoch_labels(l, 0).size() == 8);
}

TEST_CASE("pixels are scaled and normalized per channel", "[loader][cpu][lesson01]") {
    ImageSet s = tiny_set();
    LoaderOptions o;
    o.batch_size = 10;
    o.shuffle = false;
    o.mean = {0.5f};
    o.std = {0.25f};
    DataLoader l(s, o);
    Batch b;
    REQUIRE(l.next(b));
    REQUIRE(b.x.shape() == Shape({10, 1, 1, 1}));
    REQUIRE(b.x.category() == Category::Data);
    // pixel 50: (50/255 − 0.5) / 0.25
    REQUIRE(b.x.get({5, 0, 0, 0}) == Approx((50.0 / 255 - 0.5) / 0.25));
    REQUIRE_FALSE(l.next(b));
    o.mean = {0.5f, 0.5f};
    o.std = {1, 1};
    REQUIRE_THROWS_WITH(DataLoader(s, o), Catch::Contains("one value per channel"));
}

TEST_CASE("take_spread keeps n images spread over the set; seek resumes an epoch", "[loader][cpu][lesson01]") {
    ImageSet s = take_spread(tiny_set(), 3);  // images 0, 3, 6 of 10
    REQUIRE(s.n == 3);
    REQUIRE(s.labels == std::vector<int32_t>{0, 3, 6});
    REQUIRE(s.pixels == std::vector<uint8_t>{0, 30, 60});
    REQUIRE(take_spread(s, 0).n == 3);
    ImageSet t = tiny_set();
    LoaderOptions o;
    o.batch_size = 3;
    o.seed = 9;
    DataLoader full(t, o), resumed(t, o);
    auto all = epoch_labels(full, 2);
    resumed.start_epoch(2);
    resumed.seek(6);
    Batch b;
    REQUIRE(resumed.next(b));
    REQUIRE(b.y.data<int32_t>()[0] == all[6]);
}

// ---- transforms --------------------------------------------------------------------------

// A 1×3×3 image with values 1..9:   1 2 3
//                                   4 5 6
//                                   7 8 9
static std::vector<float> nine() { return {1, 2, 3, 4, 5, 6, 7, 8, 9}; }

TEST_CASE("RandomCrop pads with zeros and cuts a window", "[transforms][cpu][lesson03]") {
    RandomCrop crop(3, 1);  // 5×5 padded, window at one of 3×3 places
    std::vector<float> in = nine(), out(9);
    bool saw_shift = false;
    for (uint64_t bits = 0; bits < 50; bits++) {
        crop.apply(in.data(), {1, 3, 3}, out.data(), bits);
        float total = 0;
        for (float v : out) total += v;
        // every crop is the image shifted by (dy, dx) in {-1,0,1}²: its values are a subset
        for (float v : out) REQUIRE((v == 0 || (v >= 1 && v <= 9)));
        if (total != 45) saw_shift = true;
    }
    REQUIRE(saw_shift);
    RandomCrop same(3, 0);
    same.apply(in.data(), {1, 3, 3}, out.data(), 7);
    REQUIRE(out == nine());
}

TEST_CASE("RandomHorizontalFlip mirrors rows", "[transforms][cpu][lesson03]") {
    std::vector<float> in = nine(), out(9);
    RandomHorizontalFlip always(1.0f), never(0.0f);
    always.apply(in.data(), {1, 3, 3}, out.data(), 0);
    REQUIRE(out == std::vector<float>{3, 2, 1, 6, 5, 4, 9, 8, 7});
    never.apply(in.data(), {1, 3, 3}, out.data(), 0);
    REQUIRE(out == nine());
}

TEST_CASE("Resize is bilinear at pixel centres; CenterCrop cuts the middle", "[transforms][cpu][lesson03]") {
    // 1×1×2 [0 4] -> 1×1×4: source x = (o + 0.5)/2 − 0.5 = −0.25 (clamped 0), 0.25, 0.75, 1.25 (clamped)
    //                       values 0, 1, 3, 4
    std::vector<float> in = {0, 4}, out(4);
    Resize(1, 4).apply(in.data(), {1, 1, 2}, out.data(), 0);
    REQUIRE(out == std::vector<float>{0, 1, 3, 4});
    std::vector<float> img = nine(), mid(1);
    CenterCrop(1).apply(img.data(), {1, 3, 3}, mid.data(), 0);
    REQUIRE(mid[0] == 5);
    REQUIRE_THROWS_WITH(CenterCrop(4).output_shape({1, 3, 3}), Catch::Contains("too small"));
}

TEST_CASE("augmented batches are repeatable, and prefetching changes nothing", "[loader][cpu][lesson03]") {
    ImageSet s;
    s.n = 20; s.c = 3; s.h = 4; s.w = 4;
    for (int64_t i = 0; i < s.n * 48; i++) s.pixels.push_back(uint8_t((i * 37) % 256));
    for (int64_t i = 0; i < s.n; i++) s.labels.push_back(int32_t(i % 10));
    LoaderOptions o;
    o.batch_size = 6;
    o.seed = 5;
    o.mean = {0.5f, 0.5f, 0.5f};
    o.std = {0.2f, 0.2f, 0.2f};
    o.transforms = {std::make_shared<RandomCrop>(4, 1), std::make_shared<RandomHorizontalFlip>(),
                    std::make_shared<Resize>(6, 6)};
    auto collect = [&](bool prefetch, int64_t epoch) {
        o.prefetch = prefetch;
        DataLoader l(s, o);
        l.start_epoch(epoch);
        std::vector<float> all;
        Batch b;
        while (l.next(b)) all.insert(all.end(), b.x.data<float>(), b.x.data<float>() + b.x.numel());
        REQUIRE(l.image_shape().h == 6);
        return all;
    };
    auto a = collect(true, 1), b = collect(false, 1), c = collect(true, 2);
    REQUIRE(a.size() == size_t(20 * 3 * 36));
    REQUIRE(a == b);
    REQUIRE(a != c);
}

// The memory a step sees in use must not depend on how far the prefetch thread has got (chapter
// 09's bf16 step peaked at 76.7 or 78.7 MiB from run to run): the next batch's tensors are taken
// by next() itself, on the calling thread, from the pool, and the thread only fills them.
TEST_CASE("the loader takes the next batch's memory in next(), on the calling thread, from the pool",
          "[loader][memory][cpu][lesson08]") {
    ImageSet s = tiny_set();
    LoaderOptions o;
    o.batch_size = 4;
    DataLoader loader(s, o);
    std::mutex mu;
    std::vector<std::thread::id> takers;  // the thread of each Data allocation
    set_allocation_observer([&](const AllocationEvent& e) {
        if (e.category != Category::Data || e.freed) return;
        std::lock_guard<std::mutex> lock(mu);
        takers.push_back(std::this_thread::get_id());
    });
    BumpAllocator arena("test arena", Device::CPU);
    Batch b;
    {
        AllocatorScope in_arena(arena);  // a trainer's step arena: the next batch stays out of it
        REQUIRE(loader.next(b));  // the first batch (made here) and the next one's x and y
    }
    std::vector<std::thread::id> after_next;
    {
        std::lock_guard<std::mutex> lock(mu);
        after_next = takers;
    }
    REQUIRE(loader.next(b));  // the prefetched batch; the third one's tensors taken
    set_allocation_observer({});
    REQUIRE(after_next.size() >= 2);
    CHECK(arena.stats().num_allocs == 2);  // only the first batch, made in next() under the scope
    for (const std::thread::id& id : after_next) CHECK(id == std::this_thread::get_id());
    CHECK(after_next.size() == 4);
    for (const std::thread::id& id : takers) CHECK(id == std::this_thread::get_id());
}

// on_device (chapter 13): the GPU makes each batch from the bytes it holds and the host's plan —
// the same floats as the CPU's batch, bit for bit, for every kind of window (reflected and
// zero-padded crops, shifts, flips, centre crops, the alternating flip), every epoch, the short
// last batch, and a data-parallel rank's share.
TEST_CASE("batches built on the GPU are the CPU's, bit for bit", "[loader][cuda][lesson13]") {
    ImageSet s;
    s.n = 23; s.c = 3; s.h = 9; s.w = 7;
    for (int64_t i = 0; i < s.n * s.c * s.h * s.w; i++) s.pixels.push_back(uint8_t((i * 37 + i / 11) % 256));
    for (int64_t i = 0; i < s.n; i++) s.labels.push_back(int32_t(i % 10));
    struct Case {
        const char* name;
        Transforms transforms;
        bool alternating_flip;
        int rank, world_size;
    };
    const std::vector<Case> cases = {
        {"airbench: alternating flip, reflected crop", {std::make_shared<RandomCrop>(7, 2, Padding::Reflect)}, true, 0, 1},
        {"zero-padded crop, random flip", {std::make_shared<RandomCrop>(6, 3), std::make_shared<RandomHorizontalFlip>()}, false, 0, 1},
        {"shift, mirror, centre crop", {std::make_shared<Translate>(-1, 2, Padding::Reflect),
                                        std::make_shared<RandomHorizontalFlip>(1.0f), std::make_shared<CenterCrop>(5)},
         false, 0, 1},
        {"zero-padded shift", {std::make_shared<Translate>(3, -4, Padding::Zeros)}, true, 0, 1},
        {"no transform: Normalize alone", {}, false, 0, 1},
        {"rank 1 of 2", {std::make_shared<RandomCrop>(7, 2, Padding::Reflect)}, true, 1, 2},
    };
    for (const Case& c : cases) {
        INFO(c.name);
        LoaderOptions o{5, true, false, 9, {0.4f, 0.5f, 0.6f}, {0.2f, 0.25f, 0.3f}, Device::CUDA};
        o.transforms = c.transforms;
        o.alternating_flip = c.alternating_flip;
        o.rank = c.rank, o.world_size = c.world_size;
        DataLoader on_cpu(s, o);
        o.on_device = true;
        DataLoader on_gpu(s, o);
        for (int64_t epoch : {0, 1, 2}) {
            on_cpu.start_epoch(epoch);
            on_gpu.start_epoch(epoch);
            Batch a, b;
            int64_t batches = 0;
            while (on_cpu.next(a)) {
                REQUIRE(on_gpu.next(b));
                REQUIRE(b.x.device() == Device::CUDA);
                REQUIRE(b.x.shape() == a.x.shape());
                const Tensor xa = a.x.to(Device::CPU), xb = b.x.to(Device::CPU);
                const Tensor ya = a.y.to(Device::CPU), yb = b.y.to(Device::CPU);
                REQUIRE(std::memcmp(xa.raw(), xb.raw(), xa.nbytes()) == 0);
                REQUIRE(std::memcmp(ya.raw(), yb.raw(), ya.nbytes()) == 0);
                batches++;
            }
            REQUIRE_FALSE(on_gpu.next(b));
            REQUIRE(batches == on_cpu.num_batches());
        }
    }
}

// Chapter 13's test-time views: several loaders of one set, each with its windows, read one copy
// of its bytes on the GPU (LoaderOptions::device_set) — and still make the CPU's batches.
TEST_CASE("loaders of one set share its bytes on the GPU", "[loader][cuda][lesson13]") {
    ImageSet s;
    s.n = 11; s.c = 3; s.h = 6; s.w = 5;
    for (int64_t i = 0; i < s.n * s.c * s.h * s.w; i++) s.pixels.push_back(uint8_t((i * 53 + i / 7) % 256));
    for (int64_t i = 0; i < s.n; i++) s.labels.push_back(int32_t(i % 10));
    LoaderOptions o{4, false, false, 3, {0.4f, 0.5f, 0.6f}, {0.2f, 0.25f, 0.3f}, Device::CUDA};
    o.on_device = true;
    DataLoader plain(s, o);
    o.transforms = {std::make_shared<Translate>(1, 1, Padding::Reflect), std::make_shared<RandomHorizontalFlip>(1.0f)};
    o.device_set = plain.device_set();
    DataLoader view(s, o);
    REQUIRE(view.device_set().raw() == plain.device_set().raw());  // no second upload
    o.on_device = false, o.device_set = {};
    DataLoader on_cpu(s, o);
    Batch a, b;
    int64_t batches = 0;
    while (on_cpu.next(a)) {
        REQUIRE(view.next(b));
        const Tensor xa = a.x.to(Device::CPU), xb = b.x.to(Device::CPU);
        REQUIRE(std::memcmp(xa.raw(), xb.raw(), xa.nbytes()) == 0);
        batches++;
    }
    REQUIRE(batches == 3);
    // another set's bytes (a different size) are refused, naming what was expected
    ImageSet other = s;
    other.n = 10, other.pixels.resize(size_t(10 * 3 * 6 * 5)), other.labels.resize(10);
    o.on_device = true, o.device_set = plain.device_set();
    REQUIRE_THROWS_WITH(DataLoader(other, o), Catch::Contains("device_set must be the bytes of this set") &&
                                                  Catch::Contains("900 u8 on cuda") && Catch::Contains("got 990"));
}

TEST_CASE("on_device refuses what it cannot build, and the CPU device", "[loader][cuda][lesson13]") {
    ImageSet s = tiny_set();
    LoaderOptions o{4, true, false, 1, {}, {}, Device::CUDA};
    o.on_device = true;
    o.transforms = {std::make_shared<Resize>(2, 2)};
    REQUIRE_THROWS_WITH(DataLoader(s, o), Catch::Contains("transform 1 of 1 is none of them (a Resize?)") &&
                                              Catch::Contains("on_device = false"));
    o.transforms = {};
    o.device = Device::CPU;
    REQUIRE_THROWS_WITH(DataLoader(s, o), Catch::Contains("set device to cuda"));
}
