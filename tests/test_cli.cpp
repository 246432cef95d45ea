// test_cli.cpp — the trainers' command line (train/cli.h): values parsed in both spellings,
// unknown flags and bad values refused with the usage, a shared flag a trainer refuses by name
// (lesson 13 has no --device), and a flag given but never used caught at the run's end.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/cuda_memory.h"
#include "core/error.h"
#include "train/cli.h"

using namespace kiln;
using Catch::Contains;

namespace {

// Cli::parse on `args`, after the program's name, as main's argv.
void parse(Cli& cli, std::vector<std::string> args) {
    args.insert(args.begin(), cli.program());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    cli.parse(int(argv.size()), argv.data());
}

}  // namespace

TEST_CASE("Cli parses '--flag value' and '--flag=value', switches and element types", "[cli][cpu]") {
    CommonFlags f;
    Cli cli("lesson-test", "a test");
    f.add_to(cli);
    parse(cli, {"--epochs", "3", "--lr=0.25", "--mem-report", "--amp", "bf16", "--data=some/folder"});
    CHECK(f.epochs == 3);
    CHECK(f.lr == 0.25f);
    CHECK(f.mem_report);
    CHECK(f.amp == DType::BF16);
    CHECK(f.data == "some/folder");
    CHECK(f.batch_size == 64);  // untouched: the default
}

TEST_CASE("Cli refuses an unknown flag, a missing value and a bad number, with the usage", "[cli][cpu]") {
    CommonFlags f;
    Cli cli("lesson-test", "a test");
    f.add_to(cli);
    CHECK_THROWS_WITH(parse(cli, {"--epoch", "3"}), Contains("unknown flag '--epoch'") && Contains("usage: lesson-test"));
    CHECK_THROWS_WITH(parse(cli, {"--epochs"}), Contains("flag --epochs needs a value"));
    CHECK_THROWS_AS(parse(cli, {"--epochs", "three"}), Error);
    CHECK_THROWS_WITH(parse(cli, {"--amp", "f64"}), Contains("--amp"));
}

TEST_CASE("Cli::refuse takes a shared flag back: listed apart with why, refused by name", "[cli][cpu]") {
    CommonFlags f;
    Cli cli("lesson-test", "a test");
    f.add_to(cli);
    REQUIRE_THAT(cli.usage(), Contains("--save") && Contains("--device"));
    cli.refuse("--device", "it trains on the CPU only");
    const std::string usage = cli.usage();
    const size_t apart = usage.find("shared flags lesson-test does not take:");
    REQUIRE(apart != std::string::npos);
    CHECK(usage.find("--device") > apart);  // only in the list of refused flags
    CHECK_THAT(usage.substr(apart), Contains("it trains on the CPU only"));
    CHECK_THROWS_WITH(parse(cli, {"--device=cuda"}), "lesson-test does not take --device: it trains on the CPU only");
    CHECK_THROWS_AS(parse(cli, {"--device", "cuda"}), UsageError);
    CHECK(f.device == "cpu");
    CHECK_THROWS_WITH(cli.refuse("--device", "again"), Contains("cannot refuse flag --device, which was never added"));
    parse(cli, {"--resume", "last.safetensors"});  // the others still parse
    CHECK(f.resume == "last.safetensors");
}

// Issue 45, item 12: every value that is not meant is refused, naming the flag, without a
// source line (the fix is on the command line).
TEST_CASE("Cli refuses values that are not meant, naming the flag and no source line", "[cli][cpu]") {
    CommonFlags f;
    Cli cli("lesson-test", "a test");
    f.add_to(cli);
    const auto refused = [&](std::vector<std::string> args, const std::string& says) {
        INFO(args[0] << " " << (args.size() > 1 ? args[1] : ""));
        try {
            parse(cli, args);
            FAIL("accepted");
        } catch (const UsageError& e) {
            const std::string what = e.what();
            CHECK_THAT(what, Contains(args[0].substr(0, args[0].find('='))) && Contains(says));
            CHECK_THAT(what, !Contains(".cpp:"));
        }
    };
    refused({"--seed", "-1"}, "is negative");  // not 2^64 − 1
    refused({"--seed", "18446744073709551616"}, "out of range");
    refused({"--limit", "-5"}, "at least 0");  // not "all images"
    refused({"--epochs", "0"}, "at least 1");
    refused({"--batch-size=-64"}, "at least 1");
    refused({"--threads", "-2"}, "at least 0");
    refused({"--accumulate", "0"}, "at least 1");
    refused({"--time-report", "-1"}, "at least 0");
    refused({"--mem-trace-steps", "0"}, "at least 1");
    refused({"--lr", "0"}, "more than 0");
    refused({"--lr", "nan"}, "not a finite number");
    refused({"--lr", "inf"}, "not a finite number");
    refused({"--epochs", "3.5"}, "not a whole number");
    refused({"--epochs", "99999999999"}, "out of range");
    refused({"--epochs", " 3"}, "not a whole number");
    refused({"--device", "gpu"}, "not one of cpu, cuda");
    refused({"--mem-limit", "1e30GiB"}, "more bytes than kiln can count");
    refused({"--mem-limit", "lots"}, "64MiB");
    refused({"--mem-report=yes"}, "is a switch");
    refused({"--epoch", "3"}, "unknown flag");
    CHECK(f.seed == 1);
    CHECK(f.limit == 0);
    parse(cli, {"--seed", "18446744073709551615", "--limit", "0", "--mem-limit", "2TiB"});  // the edges still parse
    CHECK(f.seed == UINT64_MAX);
    CHECK(f.memory_limit_bytes() == int64_t(2) << 40);
}

TEST_CASE("CommonFlags: the flags given must be used, and contradictions are refused before any work", "[cli][cpu]") {
    CommonFlags f;
    Cli cli("lesson-test", "a test");
    f.add_to(cli);
    parse(cli, {"--save", "runs/x", "--mem-limit", "64MiB", "--epochs", "2"});
    f.use("--epochs");
    CHECK_THROWS_WITH(f.check_used(), Contains("lesson-test took --mem-limit, --save but this run never used them"));
    f.use("--save");
    f.apply_memory_limit(Device::CPU);  // uses it
    set_memory_limit(Device::CPU, 0);
    CHECK_NOTHROW(f.check_used());
    f.use("--batch-size");  // a flag used but not given is fine

    CommonFlags g;
    Cli measuring("lesson-test", "a test");
    g.add_to(measuring);
    parse(measuring, {"--find-batch-size", "--save", "runs/x"});
    CHECK_THROWS_WITH(g.apply(), Contains("--find-batch-size measures a step and stops before training: drop --save"));
    CommonFlags g2;
    Cli timing("lesson-test", "a test");
    g2.add_to(timing);
    parse(timing, {"--time-report", "2", "--epochs", "3", "--lr", "0.1"});
    CHECK_THROWS_WITH(g2.apply(), Contains("--epochs shapes the training that this run does not do: --time-report "
                                           "measures a step and stops before training"));
    CommonFlags h;
    Cli steps("lesson-test", "a test");
    h.add_to(steps);
    parse(steps, {"--mem-trace-steps", "3"});
    CHECK_THROWS_WITH(h.apply(), Contains("add --mem-trace FILE.json"));
    CHECK_THAT(measuring.usage(), Contains("--find-batch-size"));
    CHECK_THROWS_WITH(h.refuse_training_flags("it loads a model", {"--lr"}), Contains("--mem-trace-steps shapes the "
                                                                                      "training that this run does not do: it loads a model"));
}

TEST_CASE("an out-of-memory error suggests the ways to fit that this trainer takes", "[cli][cpu][lesson08]") {
    CommonFlags f;
    Cli cli("lesson-test", "a test");
    f.add_to(cli);
    bool recompute = false;
    cli.add("--recompute", &recompute, "recompute");
    parse(cli, {"--accumulate", "2", "--batch-size", "64"});
    const std::vector<std::string> hints = f.memory_hints();
    REQUIRE(hints.size() == 3);
    CHECK_THAT(hints[0], Contains("--accumulate 4 (4 micro-batches a step"));
    CHECK_THAT(hints[1], Contains("--recompute"));
    CHECK_THAT(hints[2], Contains("--amp bf16"));
    CommonFlags g;
    Cli bare("lesson-test", "a test");
    g.add_to(bare);
    bare.refuse("--accumulate", "not here");
    parse(bare, {"--amp", "bf16"});
    CHECK(g.memory_hints().empty());  // only flags it takes, and not one already given
}

TEST_CASE("--tf32 turns TF32 on for --device cuda, is refused on the CPU, and is off without it",
          "[cli][cuda][tf32]") {
    const auto apply = [](std::vector<std::string> args) {
        CommonFlags f;
        Cli cli("lesson-test", "a test");
        f.add_to(cli);
        parse(cli, args);
        f.apply();
    };
    CHECK_THROWS_WITH(apply({"--tf32"}), Contains("--tf32 runs f32 matrix products on a GPU's tensor cores: use it "
                                                  "with --device cuda"));
    CHECK(!cuda::tf32_on());
    apply({"--tf32", "--device", "cuda"});
    CHECK(cuda::tf32_on());
    apply({"--tf32", "--device", "cuda", "--amp", "bf16"});  // allowed: only what stays f32 changes
    CHECK(cuda::tf32_on());
    apply({"--device", "cuda"});  // a later run without the flag: off again
    CHECK(!cuda::tf32_on());
}
