// test_cli.cpp — the trainers' command line (train/cli.h): values parsed in both spellings,
// unknown flags and bad values refused with the usage, and a shared flag a trainer takes back
// with Cli::remove (lesson 13 has no --device or --save).
#include <catch2/catch.hpp>

#include <string>
#include <vector>

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

TEST_CASE("Cli::remove takes a shared flag back: not in the usage, unknown on the command line", "[cli][cpu]") {
    CommonFlags f;
    Cli cli("lesson-test", "a test");
    f.add_to(cli);
    REQUIRE_THAT(cli.usage(), Contains("--save") && Contains("--device"));
    cli.remove("--save");
    cli.remove("--device");
    CHECK_THAT(cli.usage(), !Contains("--save") && !Contains("--device") && Contains("--resume"));
    CHECK_THROWS_WITH(parse(cli, {"--save", "runs/x"}), Contains("unknown flag '--save'"));
    CHECK_THROWS_WITH(parse(cli, {"--device=cuda"}), Contains("unknown flag '--device'"));
    CHECK(f.save.empty());
    CHECK(f.device == "cpu");
    CHECK_THROWS_WITH(cli.remove("--save"), Contains("cannot remove flag --save, which was never added"));
    parse(cli, {"--resume", "last.safetensors"});  // the others still parse
    CHECK(f.resume == "last.safetensors");
}
