// test_checkpoint.cpp — checkpoints (src/io/safetensors.h, src/train/checkpoint.h): the
// safetensors layout byte by byte, round trips, every kind of damage rejected with a message naming the file and the
// tensor, saves that fail without harming the previous checkpoint, a run stopped at step k
// and resumed that ends bit for bit where an uninterrupted run does (with another --seed too),
// resumes with other flags (--limit, --epochs, the schedule) refused by name, and edited values
// refused by their CRC-32 or their range.
//
//   build/tests/kiln_tests '[checkpoint]'
#include <catch2/catch.hpp>

#include <sys/resource.h>

#include <csignal>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "fixtures.h"
#include "io/archive.h"
#include "nn/layers.h"
#include "nn/misc.h"
#include "nn/models.h"
#include "optim/adam.h"
#include "train/checkpoint.h"
#include "train/fit.h"

using namespace kiln;
using Catch::Contains;
using kiln::test::bytes_of;
using kiln::test::TempDir;
using kiln::test::write_bytes;

namespace {

bool same_bytes(const Tensor& a, const Tensor& b) {
    return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// A file in the layout: 8-byte little-endian length, the header, the data.
std::vector<uint8_t> safetensors_bytes(const std::string& header, const std::vector<uint8_t>& data) {
    std::vector<uint8_t> out(8);
    for (int i = 0; i < 8; i++) out[size_t(i)] = uint8_t(uint64_t(header.size()) >> (8 * i));
    out.insert(out.end(), header.begin(), header.end());
    out.insert(out.end(), data.begin(), data.end());
    return out;
}

// Two F32 tensors and one U8, for the damage tests.
StateDict small_state() {
    StateDict s;
    Tensor w = Tensor::arange(12).reshape({3, 4}), b = Tensor::full({3}, 0.5), u = Tensor::arange(5, DType::U8);
    s.put("fc.weight", w);
    s.put("fc.bias", b);
    s.put("mask", u);
    s.set("train.epoch", int64_t(2));
    return s;
}

// Runs f() as if the disk were full (a file size limit of 64 bytes: a write past it fails with
// EFBIG) and returns the message of the kiln::Error it throws ("" if none).
template <typename F> std::string error_on_a_full_disk(F f) {
    rlimit old{};
    getrlimit(RLIMIT_FSIZE, &old);
    rlimit small = old;
    small.rlim_cur = 64;
    auto old_handler = std::signal(SIGXFSZ, SIG_IGN);  // fail the write with EFBIG, not the process
    setrlimit(RLIMIT_FSIZE, &small);
    std::string message;
    try {
        f();
    } catch (const Error& e) {
        message = e.what();
    }
    setrlimit(RLIMIT_FSIZE, &old);
    std::signal(SIGXFSZ, old_handler);
    return message;
}

}  // namespace

// ---- the layout -------------------------------------------------------------------------------

// The example, drawn out (219 bytes):
//   [0, 8)      c8 00 00 00 00 00 00 00             header length 200, little-endian
//   [8, 208)    {"__metadata__":{"kiln.crc32":"8d8f477b","kiln.metadata_crc32":"c5d75acb","lr":"0x1p-4"},
//                "b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
//                "a":{"dtype":"U8","shape":[3],"data_offsets":[8,11]}}      + 5 spaces
//   [208, 216)  00 00 80 3f  00 00 00 c0             b = [1, -2]  (F32 first, though "a" < "b")
//   [216, 219)  01 02 03                             a = [1, 2, 3]
// 8d8f477b is zlib's crc32 of the 11 data bytes (Python: zlib.crc32(data)); c5d75acb that of
// the values, each key and value followed by a zero byte (zlib.crc32(b"lr\0" b"0x1p-4\0")).
TEST_CASE("a checkpoint is laid out as safetensors, byte by byte", "[checkpoint][cpu]") {
    TempDir dir;
    StateDict s;
    Tensor a = Tensor::empty({3}, DType::U8), b = Tensor::empty({2});
    a.data<uint8_t>()[0] = 1, a.data<uint8_t>()[1] = 2, a.data<uint8_t>()[2] = 3;
    b.data<float>()[0] = 1.0f, b.data<float>()[1] = -2.0f;
    s.put("a", a);
    s.put("b", b);
    s.set("lr", 0.0625);
    write_safetensors(dir.file("x.safetensors"), s);

    std::string json =
        "{\"__metadata__\":{\"kiln.crc32\":\"8d8f477b\",\"kiln.metadata_crc32\":\"c5d75acb\",\"lr\":\"0x1p-4\"},"
        "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
        "\"a\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[8,11]}}";
    REQUIRE(json.size() == 195);
    json += "     ";  // to 200, a multiple of 8
    std::vector<uint8_t> want = safetensors_bytes(json, {0, 0, 0x80, 0x3f, 0, 0, 0, 0xc0, 1, 2, 3});
    std::vector<uint8_t> got = read_file(dir.file("x.safetensors"));
    REQUIRE(got.size() == 219);
    REQUIRE(got[0] == 200);
    REQUIRE(std::string(got.begin() + 8, got.begin() + 208) == json);
    REQUIRE(got == want);
    REQUIRE_FALSE(std::filesystem::exists(dir.file("x.safetensors.tmp")));
}

// The example in the reference implementation's own tests (safetensors/src/tensor.rs,
// test_serialization): no metadata, so no CRC, and a header of exactly 64 bytes.
TEST_CASE("a file written by the reference safetensors reads", "[checkpoint][cpu]") {
    TempDir dir;
    std::string json = "{\"attn.0\":{\"dtype\":\"F32\",\"shape\":[1,2,3],\"data_offsets\":[0,24]}}";
    REQUIRE(json.size() == 64);
    std::vector<uint8_t> data;
    for (float v : {0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f}) {
        uint8_t b[4];
        std::memcpy(b, &v, 4);
        data.insert(data.end(), b, b + 4);
    }
    write_bytes(dir.file("ref.safetensors"), safetensors_bytes(json, data));
    StateDict s = read_safetensors(dir.file("ref.safetensors"));
    REQUIRE(s.values.empty());
    REQUIRE(s.tensors.size() == 1);
    const Tensor& t = s.tensors.at("attn.0");
    REQUIRE(t.shape() == Shape({1, 2, 3}));
    REQUIRE(t.get({0, 1, 2}) == 5.0);
}

TEST_CASE("every dtype, odd names and values survive a round trip", "[checkpoint][cpu]") {
    TempDir dir;
    StateDict s;
    Rng rng(7);
    Tensor f = Tensor::normal({2, 3, 4}, 0, 1, rng);
    f.data<float>()[0] = -0.0f;
    f.data<float>()[1] = std::numeric_limits<float>::quiet_NaN();
    f.data<float>()[2] = std::numeric_limits<float>::infinity();
    f.data<float>()[3] = 1e-45f;  // subnormal
    s.put("f32", f);
    s.put("f16", f.to(DType::F16));
    s.put("bf16", f.to(DType::BF16));
    s.put("i8", Tensor::full({7}, -100, DType::I8));
    s.put("i32", Tensor::full({2, 2}, -123456789, DType::I32));
    s.put("u8", Tensor::arange(255, DType::U8).reshape({5, 51}));
    s.put("five.dims", Tensor::ones({1, 2, 1, 2, 1}));
    s.put("empty", Tensor::zeros({0, 3}));
    s.put("quote\" back\\slash\nnewline é", Tensor::ones({1}, DType::U8));
    s.set("pi", 3.14159265358979);
    s.set("big", int64_t(-9000000000000000000));
    s.set("text", std::string("tab\there \"quoted\" \x01 ünïcode"));
    write_safetensors(dir.file("all.safetensors"), s);

    StateDict r = read_safetensors(dir.file("all.safetensors"));
    REQUIRE(r.values == s.values);
    REQUIRE(r.get_double("pi") == 3.14159265358979);
    REQUIRE(r.tensors.size() == s.tensors.size());
    for (const auto& [name, t] : s.tensors) {
        INFO(name);
        REQUIRE(r.tensors.count(name));
        REQUIRE(same_bytes(r.tensors.at(name), t));
    }
    // Every tensor starts aligned to its element size (the file's data section starts at a
    // multiple of 8): the reason F32 comes first.
    std::vector<uint8_t> bytes = read_file(dir.file("all.safetensors"));
    uint64_t header = 0;
    std::memcpy(&header, bytes.data(), 8);
    REQUIRE(header % 8 == 0);
}

// ---- damage -----------------------------------------------------------------------------------

TEST_CASE("a file cut short anywhere is rejected, naming the file", "[checkpoint][cpu]") {
    TempDir dir;
    const std::string good = dir.file("good.safetensors"), cut = dir.file("cut.safetensors");
    write_safetensors(good, small_state());
    std::vector<uint8_t> bytes = read_file(good);
    for (size_t n = 0; n < bytes.size(); n++) {
        INFO("cut to " << n << " of " << bytes.size() << " bytes");
        write_bytes(cut, std::vector<uint8_t>(bytes.begin(), bytes.begin() + long(n)));
        REQUIRE_THROWS_WITH(read_safetensors(cut), Contains(cut) && Contains("truncated or corrupt"));
    }
    // Cut inside the data: the message names the tensor that no longer fits.
    write_bytes(cut, std::vector<uint8_t>(bytes.begin(), bytes.end() - 1));
    REQUIRE_THROWS_WITH(read_safetensors(cut), Contains("tensor \"mask\"") && Contains("only"));
    write_bytes(cut, std::vector<uint8_t>(bytes.begin(), bytes.begin() + 5));
    REQUIRE_THROWS_WITH(read_safetensors(cut), Contains("5 bytes long"));
}

TEST_CASE("a flipped bit in the data fails the CRC-32", "[checkpoint][cpu]") {
    TempDir dir;
    const std::string good = dir.file("good.safetensors"), bad = dir.file("bad.safetensors");
    write_safetensors(good, small_state());
    std::vector<uint8_t> bytes = read_file(good);
    const size_t data_start = 8 + bytes[0] + 256 * size_t(bytes[1]);
    for (size_t i = data_start; i < bytes.size(); i++) {
        INFO("byte " << i);
        std::vector<uint8_t> flipped = bytes;
        flipped[i] ^= 0x10;
        write_bytes(bad, flipped);
        REQUIRE_THROWS_WITH(read_safetensors(bad), Contains(bad) && Contains("CRC-32"));
    }
}

TEST_CASE("garbage headers are rejected with what was wrong", "[checkpoint][cpu]") {
    TempDir dir;
    const std::string path = dir.file("bad.safetensors");
    auto rejects = [&](const std::string& json, const std::vector<uint8_t>& data, const std::string& what) {
        INFO(json);
        write_bytes(path, safetensors_bytes(json, data));
        REQUIRE_THROWS_WITH(read_safetensors(path), Contains(path) && Contains(what) && Contains("corrupt"));
    };
    const std::vector<uint8_t> four(4, 0);
    rejects("{\"w\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,4]}}", four, "\"F64\"");
    rejects("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", four, "tensor \"w\"");
    rejects("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,8]}}", four, "tensor \"w\"");
    rejects("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", four, "tensor \"w\"");
    rejects("{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", four, "lacks");
    rejects("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"extra\":1}}", four, "\"extra\"");
    rejects("{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", four, "non-negative integer");
    rejects("{\"w\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", four, "fraction");
    rejects("{\"w\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],\"data_offsets\":[0,4]}}", four, "too large");
    rejects("{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,4]}}", four,
            "overflows");
    rejects("{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1],\"data_offsets\":[0,4]}}", four, "at most 5");
    // Overlapping, and a gap.
    rejects("{\"a\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]},"
            "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]}}",
            four, "tensor \"b\"");
    rejects("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
            "\"b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[3,4]}}",
            four, "tensor \"b\"");
    rejects("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", four, "fill only 2");
    rejects("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
            "\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}",
            four, "twice");
    // Not JSON, or not this JSON.
    rejects("", four, "expected '{'");
    rejects("garbage!", four, "expected '{'");
    rejects("{\"w\":", four, "bad header");
    rejects("{\"w\":{\"dtype\":\"F32", four, "not closed");
    rejects("{\"w\":{\"dtype\":\"F\\q32\"}}", four, "unknown escape");
    rejects("{\"__metadata__\":{\"k\":3}}", four, "not a string");
    rejects("{}  x", four, "after the JSON");
    rejects(std::string("{\"\x01\":{}}"), four, "control character");
    // A header length far beyond the file: refused before anything is allocated.
    std::vector<uint8_t> huge = safetensors_bytes("{}", four);
    huge[5] = 0x40;
    write_bytes(path, huge);
    REQUIRE_THROWS_WITH(read_safetensors(path), Contains(path) && Contains("header length says"));
    huge[7] = 0xff;  // ~2^63
    write_bytes(path, huge);
    REQUIRE_THROWS_WITH(read_safetensors(path), Contains("header length says"));
    REQUIRE_THROWS_WITH(read_safetensors(dir.file("missing.safetensors")), Contains("missing.safetensors"));
}

// ---- the model --------------------------------------------------------------------------------

TEST_CASE("a model loads from its checkpoint; another model's is refused by name", "[checkpoint][cpu]") {
    Rng rng(1), other(2);
    auto a = mlp(rng, 16, 8);
    auto b = mlp(other, 16, 8);
    StateDict s;
    save_model(s, *a);
    REQUIRE(s.tensors.count("fc1.weight"));
    REQUIRE(s.tensors.count("fc3.bias"));
    REQUIRE_FALSE(same_bytes(a->parameters()[0]->value, b->parameters()[0]->value));
    load_model(s, *b);
    for (size_t i = 0; i < a->parameters().size(); i++)
        REQUIRE(same_bytes(a->parameters()[i]->value, b->parameters()[i]->value));

    auto wider = mlp(rng, 16, 9);
    REQUIRE_THROWS_WITH(load_model(s, *wider),
                        Contains("\"fc2.weight\"") && Contains("[8, 16]") && Contains("[9, 16]"));
    StateDict missing = s;
    missing.tensors.erase("fc3.bias");
    REQUIRE_THROWS_WITH(load_model(missing, *b), Contains("\"fc3.bias\""));
    StateDict extra = s;
    extra.put("fc4.weight", Tensor::ones({2}));
    REQUIRE_THROWS_WITH(load_model(extra, *b), Contains("\"fc4.weight\"") && Contains("another model"));
}

TEST_CASE("batch norm's running statistics are saved with the model", "[checkpoint][cpu]") {
    Rng rng(3);
    auto net = cifar_net(rng, {4, 4, 4});
    auto buffers = net->named_buffers();
    REQUIRE_FALSE(buffers.empty());
    StateDict s;
    save_model(s, *net);
    for (auto& [name, t] : buffers) REQUIRE(s.tensors.count(name));
    const std::string& name = buffers.front().first;
    s.tensors.at(name).data<float>()[0] = 42.0f;
    load_model(s, *net);
    REQUIRE(buffers.front().second->get({0}) == 42.0);
}

// ---- failed saves -----------------------------------------------------------------------------

TEST_CASE("a save that fails leaves nothing behind and the old checkpoint intact", "[checkpoint][cpu]") {
    TempDir dir;
    StateDict s = small_state();

    // A folder that does not exist.
    const std::string nowhere = dir.file("no/such/folder/ckpt.safetensors");
    REQUIRE_THROWS_WITH(write_safetensors(nowhere, s), Contains(nowhere) && Contains("No such file"));
    REQUIRE(std::filesystem::is_empty(dir.path));

    // The temporary file cannot be created (here a folder is in its way): the previous
    // checkpoint stays as it was.
    const std::string path = dir.file("ckpt.safetensors");
    write_safetensors(path, s);
    const std::vector<uint8_t> before = read_file(path);
    std::filesystem::create_directory(path + ".tmp");
    s.put("fc.bias", Tensor::full({3}, 9.0));
    REQUIRE_THROWS_WITH(write_safetensors(path, s), Contains(path));
    REQUIRE(read_file(path) == before);
    std::filesystem::remove(path + ".tmp");

    // The disk fills in the middle of the write: the half-written temporary file is removed,
    // the previous checkpoint stays.
    REQUIRE_THAT(error_on_a_full_disk([&] { write_safetensors(path, s); }), Contains(path) && Contains("too large"));
    REQUIRE_FALSE(std::filesystem::exists(path + ".tmp"));
    REQUIRE(read_file(path) == before);
}

// A save killed at any of its steps (the hook throws there, so nothing after it runs, as after a
// kill -9) leaves last.safetensors whole: the old one or the new one; prev.safetensors too.
TEST_CASE("a save killed at any step leaves a whole last.safetensors", "[checkpoint][cpu]") {
    TempDir dir;
    const std::string last = dir.file("last.safetensors"), prev = dir.file("prev.safetensors");
    StateDict older = small_state(), old = small_state(), fresh = small_state();
    old.set("train.epoch", int64_t(3));
    fresh.set("train.epoch", int64_t(4));
    struct Killed {};
    static std::string kill_at;
    set_save_step_hook([](const char* step) {
        if (kill_at == step) throw Killed{};
    });
    // Where each step leaves the two files: (last, prev) as epochs.
    struct Step {
        const char* name;
        int64_t last, prev;
    };
    for (const Step& step : {Step{"temporary file written", 3, 2}, Step{"previous kept", 3, 3}, Step{"renamed", 4, 3}}) {
        INFO("killed after: " << step.name);
        write_safetensors(last, older, prev);
        write_safetensors(last, old, prev);  // last: epoch 3, prev: epoch 2
        kill_at = step.name;
        REQUIRE_THROWS_AS(write_safetensors(last, fresh, prev), Killed);
        kill_at.clear();
        REQUIRE(read_safetensors(last).get_int("train.epoch") == step.last);
        REQUIRE(read_safetensors(prev).get_int("train.epoch") == step.prev);
    }
    set_save_step_hook(nullptr);
    StateDict next = small_state();
    next.set("train.epoch", int64_t(5));
    write_safetensors(last, next, prev);  // the next save cleans up after the killed one
    REQUIRE(read_safetensors(last).get_int("train.epoch") == 5);
    REQUIRE(read_safetensors(prev).get_int("train.epoch") == 4);
    REQUIRE_FALSE(std::filesystem::exists(last + ".tmp"));
    REQUIRE_FALSE(std::filesystem::exists(prev + ".tmp"));
}

// ---- resume -----------------------------------------------------------------------------------

namespace {

// 96 random 1×28×28 "images" with labels 0..9.
ImageSet random_images() {
    ImageSet s;
    s.n = 96, s.c = 1, s.h = 28, s.w = 28;
    Rng rng(11);
    for (int64_t i = 0; i < s.n * 28 * 28; i++) s.pixels.push_back(uint8_t(rng.next_below(256)));
    for (int64_t i = 0; i < s.n; i++) s.labels.push_back(int32_t(rng.next_below(10)));
    return s;
}

// Everything a run has, built from the same seeds each time: a small MLP with dropout, an
// optimizer whose lr halves every 4 steps, a shuffling loader with random crops (6 batches an
// epoch).
enum class Opt { SGD, Adam, AdamW };

struct Trainee {
    // seed: the loader's (the trainers' --seed); dropout_seed: dropout's stream.
    Trainee(const ImageSet& set, Opt which, uint64_t seed = 3, uint64_t dropout_seed = 9)
        : init(5),
          model(make_model(init, dropout, dropout_seed)),
          optimizer(make_optimizer(*model, which)),
          scheduler(*optimizer, 4, 0.5),
          loader(set, options(seed)) {}

    static std::unique_ptr<Sequential> make_model(Rng& rng, Dropout*& dropout, uint64_t dropout_seed) {
        auto m = std::make_unique<Sequential>("net");
        m->emplace<Flatten>();
        m->emplace<Linear>(784, 32, rng, true, "fc1");
        m->emplace<ReLU>();
        dropout = &m->emplace<Dropout>(0.25f, dropout_seed, "drop");
        m->emplace<Linear>(32, 10, rng, true, "fc2");
        return m;
    }
    static std::unique_ptr<Optimizer> make_optimizer(Module& m, Opt which) {
        switch (which) {
            case Opt::SGD:
                return std::make_unique<SGD>(m.parameters(), 0.05f,
                                             SGD::Options{}.with_momentum(0.9f).with_weight_decay(1e-3f).with_nesterov());
            case Opt::Adam:  // with AMSGrad: a third buffer to carry over
                return std::make_unique<Adam>(m.parameters(), 1e-3f,
                                              Adam::Options{}.with_betas(0.9f, 0.99f).with_amsgrad());
            case Opt::AdamW: return std::make_unique<AdamW>(m.parameters(), 1e-3f);
        }
        return nullptr;
    }
    static LoaderOptions options(uint64_t seed) {
        LoaderOptions o;
        o.batch_size = 16;
        o.seed = seed;
        o.transforms.push_back(std::make_shared<RandomCrop>(28, 2));
        return o;
    }
    TrainingRun run() { return TrainingRun{*model, *optimizer, &scheduler, &loader, {{"dropout", &dropout->rng}}}; }

    // Trains from `at` until `steps` optimizer steps in all; returns where it stopped.
    ResumePoint train_until(ResumePoint at, int64_t steps) {
        CrossEntropyLoss criterion;
        Batch b;
        while (at.step < steps) {
            if (!loader.next(b)) {
                loader.start_epoch(++at.epoch);
                at.position = 0;
                continue;
            }
            optimizer->zero_grad();
            criterion.forward(model->forward(b.x), b.y);
            model->backward(criterion.backward());
            optimizer->step();
            scheduler.step();
            at.position = loader.position();
            at.step++;
        }
        return at;
    }

    Rng init;
    Dropout* dropout = nullptr;
    std::unique_ptr<Sequential> model;
    std::unique_ptr<Optimizer> optimizer;
    StepLR scheduler;
    DataLoader loader;
};

// The model and optimizer of two runs hold the same bits (every tensor and value of their state).
void require_same_state(Trainee& a, Trainee& b) {
    StateDict sa, sb;
    save_model(sa, *a.model);
    save_model(sb, *b.model);
    a.optimizer->save_state(sa, "optimizer");
    b.optimizer->save_state(sb, "optimizer");
    a.scheduler.save_state(sa, "scheduler");
    b.scheduler.save_state(sb, "scheduler");
    REQUIRE(sa.values == sb.values);
    REQUIRE(sa.tensors.size() == sb.tensors.size());
    for (const auto& [name, t] : sa.tensors) {
        INFO(name);
        REQUIRE(sb.tensors.count(name));
        REQUIRE(same_bytes(sb.tensors.at(name), t));
    }
    REQUIRE(a.dropout->rng.counter() == b.dropout->rng.counter());
}

}  // namespace

TEST_CASE("a run stopped at step k and resumed equals an uninterrupted run, bit for bit", "[checkpoint][cpu]") {
    TempDir dir;
    const ImageSet set = random_images();
    const int64_t n = 14;  // into the third epoch
    for (Opt which : {Opt::SGD, Opt::Adam, Opt::AdamW}) {
        INFO("optimizer " << int(which));
        Trainee straight(set, which);
        const float first_lr = straight.optimizer->lr();
        straight.train_until({}, n);

        for (int64_t k : {4, 6, 9}) {  // mid-epoch, at an epoch's end, mid-epoch again
            INFO("stopped at step " << k);
            const std::string path = dir.file("step" + std::to_string(k) + ".safetensors");
            {
                Trainee first(set, which);
                TrainingRun run = first.run();
                save_checkpoint(path, run, first.train_until({}, k));
            }
            Trainee resumed(set, which);
            TrainingRun run = resumed.run();
            ResumePoint at = load_checkpoint(path, run);
            REQUIRE(at.step == k);
            REQUIRE(at.epoch == (k - 1) / 6);  // stopped after an epoch's last batch: still that epoch
            REQUIRE(resumed.optimizer->steps() == k);
            REQUIRE(resumed.scheduler.last_epoch() == k);
            REQUIRE(resumed.optimizer->lr() == first_lr * std::pow(0.5f, float(k / 4)));
            resumed.train_until(at, n);
            require_same_state(resumed, straight);
        }

        // The comparison sees what a checkpoint misses: the same resume with dropout's stream
        // restarted ends elsewhere.
        Trainee forgetful(set, which);
        TrainingRun run = forgetful.run();
        ResumePoint at = load_checkpoint(dir.file("step4.safetensors"), run);
        forgetful.dropout->rng.set_counter(0);
        forgetful.train_until(at, n);
        REQUIRE_FALSE(same_bytes(forgetful.model->parameters()[0]->value, straight.model->parameters()[0]->value));
    }
}

TEST_CASE("resuming with other flags is refused by name", "[checkpoint][cpu]") {
    TempDir dir;
    const ImageSet set = random_images();
    const std::string path = dir.file("ckpt.safetensors");
    Trainee t(set, Opt::SGD);
    TrainingRun run = t.run();
    save_checkpoint(path, run, t.train_until({}, 2));

    ImageSet fewer = take_spread(set, 80);
    Trainee other_limit(fewer, Opt::SGD);
    TrainingRun run2 = other_limit.run();
    REQUIRE_THROWS_WITH(load_checkpoint(path, run2), Contains(path) && Contains("96 images") && Contains("--limit"));

    Trainee no_rng(set, Opt::SGD);
    TrainingRun run4{*no_rng.model, *no_rng.optimizer, nullptr, nullptr, {{"augment", &no_rng.init}}};
    REQUIRE_THROWS_WITH(load_checkpoint(path, run4), Contains("train.rng.augment.seed") && Contains(path));
}

// --seed fixes the data order and dropout's stream. A resume takes the checkpoint's seeds, so a
// run resumed with another --seed still ends where the uninterrupted run does.
TEST_CASE("a resume with another seed continues the checkpoint's run exactly", "[checkpoint][cpu]") {
    TempDir dir;
    const ImageSet set = random_images();
    const std::string path = dir.file("ckpt.safetensors");
    Trainee straight(set, Opt::SGD);
    straight.train_until({}, 14);
    {
        Trainee first(set, Opt::SGD);
        TrainingRun run = first.run();
        save_checkpoint(path, run, first.train_until({}, 4));
    }
    Trainee reseeded(set, Opt::SGD, /*seed=*/77, /*dropout_seed=*/123);
    TrainingRun run = reseeded.run();
    const ResumePoint at = load_checkpoint(path, run);
    REQUIRE(reseeded.loader.options().seed == 3);
    REQUIRE(reseeded.dropout->rng.seed_hash() == straight.dropout->rng.seed_hash());
    reseeded.train_until(at, 14);
    require_same_state(reseeded, straight);
}

TEST_CASE("the schedule record holds the lr the scheduler sets at each epoch's start", "[checkpoint][cpu]") {
    const ImageSet set = random_images();
    Trainee t(set, Opt::SGD);  // lr 0.05, halved every 4 steps; 6 steps an epoch
    const ScheduleRecord record = record_schedule(*t.optimizer, &t.scheduler, 3, 6);
    REQUIRE(record.epochs == 3);
    REQUIRE(record.epoch_start_lrs.size() == 3);
    for (int64_t epoch = 0; epoch < 3; epoch++) {
        INFO("epoch " << epoch);
        REQUIRE(record.epoch_start_lrs[size_t(epoch)] == t.optimizer->lr());
        for (int step = 0; step < 6; step++) t.scheduler.step();
    }
    REQUIRE(record.epoch_start_lrs[1] == 0.025f);  // t = 6: halved once
    // Without a scheduler the lr stays what it is.
    REQUIRE(record_schedule(*t.optimizer, nullptr, 2, 6).epoch_start_lrs == std::vector<float>(2, t.optimizer->lr()));
}

TEST_CASE("resuming with another --epochs or another schedule is refused by name", "[checkpoint][cpu]") {
    TempDir dir;
    const ImageSet set = random_images();
    const std::string path = dir.file("ckpt.safetensors");
    // t's run, with the schedule recorded as fit would: `epochs` epochs of `steps` steps each.
    const auto run_over = [](Trainee& t, int64_t epochs, int64_t steps) {
        TrainingRun run = t.run();
        run.schedule = record_schedule(*t.optimizer, &t.scheduler, epochs, steps);
        return run;
    };
    Trainee t(set, Opt::SGD);
    TrainingRun run = run_over(t, 3, 6);
    save_checkpoint(path, run, t.train_until({}, 6));

    Trainee longer(set, Opt::SGD);
    TrainingRun run2 = run_over(longer, 4, 6);
    REQUIRE_THROWS_WITH(load_checkpoint(path, run2),
                        Contains(path) && Contains("3 epochs") && Contains("over 4") && Contains("--epochs"));
    REQUIRE(longer.scheduler.last_epoch() == 0);  // refused before the scheduler was loaded

    Trainee per_epoch(set, Opt::SGD);  // the same scheduler stepped once an epoch: another schedule
    TrainingRun run3 = run_over(per_epoch, 3, 1);
    REQUIRE_THROWS_WITH(load_checkpoint(path, run3),
                        Contains("starts epoch 2 at lr 0.025") && Contains("at lr 0.05") && Contains("--lr"));

    Trainee same(set, Opt::SGD);
    TrainingRun run4 = run_over(same, 3, 6);
    REQUIRE(load_checkpoint(path, run4).step == 6);
}

TEST_CASE("fit's --save keeps the epoch before as prev.safetensors; --resume checks --epochs", "[checkpoint][cpu]") {
    TempDir dir;
    const ImageSet set = random_images();
    Trainee t(set, Opt::SGD);
    const TrainOptions two_epochs{2, &t.scheduler, /*per_batch=*/true, nullptr, 0.0f, dir.path, ""};
    fit(*t.model, *t.optimizer, t.loader, t.loader, two_epochs);
    REQUIRE(read_safetensors(dir.file("last.safetensors")).get_int("train.epoch") == 2);
    REQUIRE(read_safetensors(dir.file("prev.safetensors")).get_int("train.epoch") == 1);

    // A finished two-epoch run, resumed as a three-epoch one, would train its third epoch on a
    // schedule laid out for two: refused.
    Trainee resumed(set, Opt::SGD);
    const TrainOptions three_epochs{3, &resumed.scheduler, true, nullptr, 0.0f, "", dir.file("last.safetensors")};
    REQUIRE_THROWS_WITH(fit(*resumed.model, *resumed.optimizer, resumed.loader, resumed.loader, three_epochs),
                        Contains("2 epochs") && Contains("--epochs"));
}

// The disk fills while --save writes the epoch's checkpoint (a file size limit does the same):
// the run stops with the reason, and DIR keeps both checkpoints it had.
TEST_CASE("a full disk during fit's --save leaves last.safetensors and prev.safetensors", "[checkpoint][cpu]") {
    TempDir dir;
    const ImageSet set = random_images();
    Trainee t(set, Opt::SGD);
    fit(*t.model, *t.optimizer, t.loader, t.loader, TrainOptions{2, &t.scheduler, true, nullptr, 0.0f, dir.path, ""});
    const std::vector<uint8_t> last = read_file(dir.file("last.safetensors")), prev = read_file(dir.file("prev.safetensors"));

    // Epoch 2 again, from prev.safetensors, with no room to save it.
    Trainee again(set, Opt::SGD);
    const TrainOptions resumed{2, &again.scheduler, true, nullptr, 0.0f, dir.path, dir.file("prev.safetensors")};
    REQUIRE_THAT(error_on_a_full_disk([&] { fit(*again.model, *again.optimizer, again.loader, again.loader, resumed); }),
                 Contains("last.safetensors") && Contains("too large"));
    REQUIRE(read_file(dir.file("last.safetensors")) == last);
    REQUIRE(read_file(dir.file("prev.safetensors")) == prev);
}

// --save DIR of a new run into a folder that holds another run's checkpoints: refused, naming
// --resume and --overwrite; with either, it goes ahead.
TEST_CASE("a new run does not replace another run's checkpoints without --overwrite", "[checkpoint][cpu]") {
    TempDir dir;
    const ImageSet set = random_images();
    Trainee first(set, Opt::SGD);
    fit(*first.model, *first.optimizer, first.loader, first.loader, TrainOptions{1, &first.scheduler, true, nullptr, 0.0f, dir.path, ""});
    const std::vector<uint8_t> kept = read_file(dir.file("last.safetensors"));

    Trainee second(set, Opt::SGD);
    TrainOptions fresh{1, &second.scheduler, true, nullptr, 0.0f, dir.path, ""};
    REQUIRE_THROWS_WITH(fit(*second.model, *second.optimizer, second.loader, second.loader, fresh),
                        Contains(dir.path) && Contains("another run") && Contains("--resume") && Contains("--overwrite"));
    REQUIRE(read_file(dir.file("last.safetensors")) == kept);
    REQUIRE(second.optimizer->steps() == 0);  // refused before training

    fresh.overwrite = true;
    fit(*second.model, *second.optimizer, second.loader, second.loader, fresh);
    REQUIRE(read_safetensors(dir.file("prev.safetensors")).get_int("train.epoch") == 1);

    Trainee third(set, Opt::SGD);  // continuing DIR's own run is no overwrite
    fit(*third.model, *third.optimizer, third.loader, third.loader,
        TrainOptions{1, &third.scheduler, true, nullptr, 0.0f, dir.path, dir.file("last.safetensors")});

    // Any checkpoint counts, not only last and prev (lesson-10 saves pruned.safetensors).
    TempDir pruned;
    write_safetensors(pruned.file("pruned.safetensors"), small_state());
    Trainee fourth(set, Opt::SGD);
    REQUIRE_THROWS_WITH(fit(*fourth.model, *fourth.optimizer, fourth.loader, fourth.loader,
                            TrainOptions{1, &fourth.scheduler, true, nullptr, 0.0f, pruned.path, ""}),
                        Contains("pruned.safetensors") && Contains("--overwrite"));
}

// A checkpoint's values are covered by a CRC-32 of their own: one edited by hand is refused.
// Edited and checksummed again (as a program would), each is checked against its range, and the
// error names the key and the file.
TEST_CASE("edited values are refused: by their CRC-32, and by range", "[checkpoint][cpu]") {
    TempDir dir;
    const ImageSet set = random_images();
    const std::string path = dir.file("ckpt.safetensors"), edited = dir.file("edited.safetensors");
    {
        Trainee t(set, Opt::SGD);
        TrainingRun run = t.run();
        run.schedule = record_schedule(*t.optimizer, &t.scheduler, 3, 6);
        save_checkpoint(path, run, t.train_until({}, 6));  // after epoch 1's last batch: epoch 0, position 96
    }
    std::vector<uint8_t> bytes = read_file(path);
    const std::string text(bytes.begin(), bytes.end()), was = "\"train.epoch\":\"0\"";
    const size_t at = text.find(was);
    REQUIRE(at != std::string::npos);
    bytes[at + was.size() - 2] = '9';
    write_bytes(edited, bytes);
    REQUIRE_THROWS_WITH(read_safetensors(edited), Contains(edited) && Contains("CRC-32 of the values") &&
                                                      Contains("a value has changed"));

    const auto refused = [&](const std::string& key, const std::string& value) {
        INFO(key << " = " << value);
        StateDict s = read_safetensors(path);
        REQUIRE(s.values.count(key));
        s.values[key] = value;
        write_safetensors(edited, s);
        Trainee t(set, Opt::SGD);
        TrainingRun run = t.run();
        run.schedule = record_schedule(*t.optimizer, &t.scheduler, 3, 6);
        REQUIRE_THROWS_WITH(load_checkpoint(edited, run), Contains("\"" + key + "\"") && Contains(edited));
    };
    refused("train.epoch", "9");           // past the 3 epochs: would train nothing
    refused("train.epoch", "-1");          // would train an epoch more
    refused("train.epoch", "2147483648");  // would wrap around in an int
    refused("train.position", "97");       // past the 96 images of an epoch
    refused("train.step", "-3");
    refused("optimizer.steps", "0");       // would drop the momentum buffers
    refused("optimizer.steps", "-1");
    refused("optimizer.group0.lr", "-0x1p-4");
    refused("optimizer.group0.lr", "nan");
    refused("scheduler.last_epoch", "-2");
    refused("train.schedule.epochs", "0");
}

TEST_CASE("ReduceLROnPlateau's state travels under \"plateau.\"", "[checkpoint][cpu]") {
    TempDir dir;
    const std::string path = dir.file("plateau.safetensors");
    Rng rng(1);
    auto model = mlp(rng, 8, 8);
    SGD sgd(model->parameters(), 0.1f);
    ReduceLROnPlateau::Options o;
    o.patience = 1;
    ReduceLROnPlateau plateau(sgd, o);
    for (double loss : {1.0, 0.9, 0.95, 0.97, 0.96}) plateau.step(loss);  // one cut, then one bad epoch
    REQUIRE(sgd.lr() < 0.1f);
    TrainingRun run{*model, sgd, nullptr, nullptr, {}, &plateau};
    save_checkpoint(path, run, {5, 0, 0});

    SGD sgd2(model->parameters(), 0.1f);
    ReduceLROnPlateau plateau2(sgd2, o);
    TrainingRun run2{*model, sgd2, nullptr, nullptr, {}, &plateau2};
    REQUIRE(load_checkpoint(path, run2).epoch == 5);
    REQUIRE(sgd2.lr() == sgd.lr());
    REQUIRE(plateau2.best() == plateau.best());
    REQUIRE(plateau2.num_bad_epochs() == plateau.num_bad_epochs());
    REQUIRE(read_safetensors(path).values.count("plateau.best"));
}

TEST_CASE("saving a checkpoint copies nothing on the CPU", "[checkpoint][memory][cpu][lesson08]") {
    TempDir dir;
    Rng rng(1);
    auto model = mlp(rng, 256, 256);
    SGD sgd(model->parameters(), 0.1f, SGD::Options{}.with_momentum(0.9f));
    TrainingRun run{*model, sgd, nullptr, nullptr, {}, nullptr};
    const int64_t params = model->num_parameters() * 4;
    reset_phase_peak(Device::CPU);
    const int64_t before = device_peaks(Device::CPU).in_use;
    save_checkpoint(dir.file("m.safetensors"), run, {1, 0, 0});
    // Copies of the parameters and momentum buffers would add twice the parameters' bytes;
    // sharing them adds no tensor at all.
    REQUIRE(device_peaks(Device::CPU).phase_peak - before < params / 10);
    // and what was written is the model
    StateDict s = read_safetensors(dir.file("m.safetensors"));
    REQUIRE(same_bytes(s.tensors.at("fc1.weight"), model->parameters()[0]->value));
}

// ---- seeds for the fuzzers ----------------------------------------------------------------------

// Small valid files for fuzz/safetensors.cpp (make fuzz), written into $KILN_FUZZ_SEEDS/safetensors:
// kiln's own (both checksums, every dtype, a run's checkpoint with its values) and one written
// by the reference implementation (no metadata). Each reads back. Hidden: make fuzz runs it.
TEST_CASE("fuzz seeds: safetensors files", "[.][fuzz-seeds]") {
    const char* root = std::getenv("KILN_FUZZ_SEEDS");
    REQUIRE(root != nullptr);  // the folder to write into (make fuzz sets it)
    const std::string dir = std::string(root) + "/safetensors";
    std::filesystem::create_directories(dir);
    write_safetensors(dir + "/small.safetensors", small_state());

    StateDict dtypes;
    dtypes.put("f32", Tensor::full({2, 2}, 1.5));
    dtypes.put("f16", Tensor::full({3}, -2.0).to(DType::F16));
    dtypes.put("bf16", Tensor::full({1, 1, 2}, 0.25).to(DType::BF16));
    dtypes.put("i8", Tensor::full({2}, -7, DType::I8));
    dtypes.put("i32", Tensor::full({1}, 123456, DType::I32));
    dtypes.put("u8", Tensor::arange(3, DType::U8));
    dtypes.put("empty", Tensor::zeros({0, 2}));
    dtypes.set("text", std::string("tab\t\"quoted\" é"));
    write_safetensors(dir + "/dtypes.safetensors", dtypes);

    Rng rng(1);
    auto model = mlp(rng, 2, 2);  // the smallest chapter model: 784 → 2 → 2 → 10
    SGD sgd(model->parameters(), 0.1f, SGD::Options{}.with_momentum(0.9f));
    ReduceLROnPlateau plateau(sgd, {});
    TrainingRun run{*model, sgd, nullptr, nullptr, {}, &plateau};
    run.schedule = record_schedule(sgd, nullptr, 3, 10);
    save_checkpoint(dir + "/run.safetensors", run, {1, 0, 0});

    std::vector<uint8_t> data(24, 0);
    write_bytes(dir + "/reference.safetensors",
                safetensors_bytes("{\"attn.0\":{\"dtype\":\"F32\",\"shape\":[1,2,3],\"data_offsets\":[0,24]}}", data));
    for (const char* name : {"small", "dtypes", "run", "reference"})
        REQUIRE_NOTHROW(read_safetensors(dir + "/" + name + ".safetensors"));
}
