// test_run_log.cpp — the run log every trainer keeps through fit: run.json (valid JSON, the
// values fit computed), curves.svg, the folder (--save or runs/<trainer>/), an unwritable folder
// refused before training, and --resume continuing the log.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "data/loader.h"
#include "fixtures.h"
#include "nn/layers.h"
#include "optim/optimizer.h"
#include "optim/scheduler.h"
#include "train/evaluate.h"
#include "train/fit.h"
#include "train/progress.h"
#include "train/run_log.h"

using namespace kiln;
using Catch::Contains;

namespace {

// 96 "images" of 1×4×4: class k (of 3) has a bright column k, plus a ramp that varies by image.
ImageSet striped_images() {
    ImageSet s;
    s.n = 96; s.c = 1; s.h = 4; s.w = 4;
    for (int64_t i = 0; i < s.n; i++) {
        const int32_t label = int32_t(i % 3);
        for (int64_t p = 0; p < 16; p++) s.pixels.push_back(uint8_t(p % 4 == label ? 200 : (i * 7 + p * 13) % 90));
        s.labels.push_back(label);
    }
    return s;
}

// Flatten, then Linear 16→3.
std::unique_ptr<Sequential> linear_probe(Rng& rng) {
    auto m = std::make_unique<Sequential>("probe");
    m->emplace<Flatten>();
    m->emplace<Linear>(16, 3, rng);
    return m;
}

// A trainer's pieces: a linear classifier, SGD, the loaders; flags parsed from `args` by a Cli
// named "test-run", as a trainer's main does.
struct Trainer {
    explicit Trainer(std::vector<std::string> args) : cli("test-run", "a run-log test") {
        flags.epochs = 2;
        flags.add_to(cli);
        args.insert(args.begin(), "test-run");
        std::vector<char*> argv;
        for (std::string& a : args) argv.push_back(a.data());
        cli.parse(int(argv.size()), argv.data());
    }
    double fit() { return kiln::fit(*model, sgd, train, test, flags, nullptr); }

    ImageSet set = striped_images();
    Cli cli;
    CommonFlags flags;
    Rng rng{3};
    std::unique_ptr<Sequential> model = linear_probe(rng);
    SGD sgd{model->parameters(), 0.1f};
    DataLoader train{set, {16, true, false, 1, {0.3f}, {0.3f}, Device::CPU}};
    DataLoader test{set, {48, false, false, 1, {0.3f}, {0.3f}, Device::CPU}};
};

std::string read_text(const std::string& path) {
    std::ifstream in(path);
    REQUIRE(in);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
}

// A JSON checker (RFC 8259's grammar, no more): true if `text` is exactly one JSON value.
class JsonChecker {
public:
    explicit JsonChecker(const std::string& text) : s_(text) {}
    bool valid() { return value() && (space(), i_ == s_.size()); }

private:
    void space() {
        while (i_ < s_.size() && std::string(" \t\r\n").find(s_[i_]) != std::string::npos) i_++;
    }
    bool eat(char c) {
        space();
        if (i_ < s_.size() && s_[i_] == c) return ++i_, true;
        return false;
    }
    bool string() {
        if (!eat('"')) return false;
        while (i_ < s_.size() && s_[i_] != '"') i_ += s_[i_] == '\\' ? 2 : 1;
        return i_++ < s_.size();
    }
    bool number() {
        size_t start = i_;
        if (s_[i_] == '-') i_++;
        while (i_ < s_.size() && std::string("0123456789.eE+-").find(s_[i_]) != std::string::npos) i_++;
        return i_ > start && std::isdigit(static_cast<unsigned char>(s_[i_ - 1]));
    }
    template <typename Item> bool sequence(char close, Item item) {
        if (eat(close)) return true;
        do {
            if (!item()) return false;
        } while (eat(','));
        return eat(close);
    }
    bool value() {
        space();
        if (i_ >= s_.size()) return false;
        if (eat('{')) return sequence('}', [&] { return string() && eat(':') && value(); });
        if (eat('[')) return sequence(']', [&] { return value(); });
        if (s_[i_] == '"') return string();
        for (const char* word : {"true", "false", "null"})
            if (s_.compare(i_, std::strlen(word), word) == 0) return i_ += std::strlen(word), true;
        return number();
    }
    const std::string& s_;
    size_t i_ = 0;
};

size_t count(const std::string& text, const std::string& what) {
    size_t n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) n++;
    return n;
}

}  // namespace

TEST_CASE("JsonChecker accepts JSON and nothing else", "[runlog][cpu][lesson08]") {
    REQUIRE(JsonChecker(R"({"a": [1, -2.5e3, "x\"y"], "b": {}, "c": null})").valid());
    REQUIRE_FALSE(JsonChecker(R"({"a": 1,})").valid());
    REQUIRE_FALSE(JsonChecker(R"({"a": 1} x)").valid());
    REQUIRE_FALSE(JsonChecker(R"({"a" 1})").valid());
}

TEST_CASE("fit writes run.json and curves.svg into --save after every epoch", "[runlog][cpu][lesson08]") {
    test::TempDir dir;
    Trainer t({"--epochs", "2", "--save", dir.path});
    const double acc = t.fit();
    const int64_t peak = peak_memory(Device::CPU);

    // The same run by hand: train_epoch and evaluate, the lr dropping tenfold after epoch 1.
    Trainer twin({"--epochs", "2"});
    MultiStepLR decay(twin.sgd, {1}, 0.1);
    std::vector<EpochRecord> want;
    TrainOptions two_epochs;
    two_epochs.epochs = 2;
    for (int epoch = 0; epoch < 2; epoch++) {
        const float lr = twin.sgd.lr();
        const EpochResult r = train_epoch(*twin.model, twin.sgd, twin.train, epoch, two_epochs);
        decay.step();
        want.push_back({epoch + 1, r.loss, r.accuracy, evaluate(*twin.model, twin.test), lr, 0.0, 0});
    }

    const std::string json = read_text(dir.file("run.json"));
    INFO(json);
    REQUIRE(JsonChecker(json).valid());
    REQUIRE(json.find(R"("trainer": "test-run")") != std::string::npos);
    REQUIRE(json.find("\"command_line\": [\"--epochs\", \"2\", \"--save\", \"" + dir.path + "\"]") != std::string::npos);
    REQUIRE(json.find(R"("device": "cpu")") != std::string::npos);
    REQUIRE(json.find("\"cpu\": \"" + cpu_model() + "\"") != std::string::npos);
    const std::vector<EpochRecord> got = read_epochs(json, "run.json");
    REQUIRE(got.size() == 2);
    for (size_t i = 0; i < 2; i++) {
        INFO("epoch " << i + 1);
        REQUIRE(got[i].epoch == want[i].epoch);
        REQUIRE(got[i].train_loss == want[i].train_loss);
        REQUIRE(got[i].train_accuracy == want[i].train_accuracy);
        REQUIRE(got[i].test_accuracy == want[i].test_accuracy);
        REQUIRE(got[i].lr == want[i].lr);
        REQUIRE(got[i].images_per_second > 0);
        REQUIRE(got[i].peak_bytes > 0);
    }
    REQUIRE(got[0].lr == 0.1f);
    REQUIRE(got[1].lr == 0.01f);
    REQUIRE(got[1].test_accuracy == acc);                      // what fit returned
    REQUIRE(got[1].peak_bytes == peak);                        // the result line's peak

    // curves.svg: the loss curve and the two accuracy curves, two epochs each, and the result
    const std::string svg = read_text(dir.file("curves.svg"));
    REQUIRE(count(svg, "<polyline") == 5);  // 3 curves + 2 axes frames
    REQUIRE(count(svg, "stroke=\"#1f77b4\"") == 2);  // training loss, training accuracy
    REQUIRE(count(svg, "stroke=\"#d62728\"") == 1);  // test accuracy
    char title[64];
    std::snprintf(title, sizeof title, "final test accuracy %.2f%% after epoch 2", 100 * acc);
    REQUIRE(svg.find(title) != std::string::npos);
    for (const char* words : {"training loss", "training accuracy", "test accuracy", "accuracy (%)", "epoch"})
        REQUIRE(svg.find(words) != std::string::npos);
}

TEST_CASE("without --save the log goes to runs/<trainer>/; without a Cli there is none", "[runlog][cpu][lesson08]") {
    Trainer t({"--epochs", "1"});
    REQUIRE(run_info(t.flags).dir == "runs/test-run");
    REQUIRE(run_info(CommonFlags{}).trainer.empty());

    test::TempDir dir;  // the trainer's working folder
    const std::string before = std::filesystem::current_path();
    REQUIRE(chdir(dir.path.c_str()) == 0);
    t.fit();
    REQUIRE(chdir(before.c_str()) == 0);
    REQUIRE(std::filesystem::exists(dir.file("runs/test-run/run.json")));
    REQUIRE(std::filesystem::exists(dir.file("runs/test-run/curves.svg")));
}

TEST_CASE("an unwritable log folder fails before training, naming it", "[runlog][cpu][lesson08]") {
    test::TempDir dir;
    test::write_bytes(dir.file("a-file"), test::bytes_of("not a folder"));
    const std::string folder = dir.file("a-file/run");
    Trainer t({"--save", folder});
    REQUIRE_THROWS_WITH(t.fit(), Contains(folder) && Contains("--save DIR") && Contains("cannot create"));
    REQUIRE(t.sgd.steps() == 0);
}

TEST_CASE("a run.json that cannot be written is named, with the reason", "[runlog][cpu][lesson08]") {
    test::TempDir dir;
    std::filesystem::create_directories(dir.file("run.json"));  // a folder where the file should go
    Trainer t({"--save", dir.path});
    REQUIRE_THROWS_WITH(t.fit(), Contains(dir.file("run.json")) && Contains("Is a directory"));
}

TEST_CASE("--resume continues the log from the run.json in the folder", "[runlog][cpu][lesson08]") {
    test::TempDir dir;
    Trainer whole({"--epochs", "3", "--save", dir.path});
    whole.fit();
    const std::vector<EpochRecord> all = read_epochs(read_text(dir.file("run.json")), "run.json");
    REQUIRE(all.size() == 3);

    // resumed after epoch 2 (prev.safetensors): epochs 1 and 2 read back, epoch 3 trained again
    Trainer resumed({"--epochs", "3", "--save", dir.path, "--resume", dir.file("prev.safetensors")});
    resumed.fit();
    const std::vector<EpochRecord> got = read_epochs(read_text(dir.file("run.json")), "run.json");
    REQUIRE(got.size() == 3);
    for (size_t i = 0; i < 3; i++) {
        INFO("epoch " << i + 1);
        REQUIRE(got[i].epoch == all[i].epoch);
        REQUIRE(got[i].train_loss == all[i].train_loss);
        REQUIRE(got[i].test_accuracy == all[i].test_accuracy);
        if (i < 2) REQUIRE(got[i].images_per_second == all[i].images_per_second);  // read back, not rerun
    }
    REQUIRE_THROWS_WITH(read_epochs("    {\"epoch\": 1, \"train_loss\": x}", "run.json"),
                        Contains("run.json") && Contains("train_loss"));
}
