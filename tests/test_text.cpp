// test_text.cpp — chapter 14's text data (data/text.h): UTF-8 decoding and its errors, the
// character tokenizer and its file, the 90/10 split, and the windows a batch is cut from.
//
//   make test T='[text]'
//   build/tests/kiln_tests '[moby-dick]'    the real text (bash data/fetch.sh moby-dick)
#include <catch2/catch.hpp>

#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "data/text.h"
#include "fixtures.h"
#include "io/archive.h"

using namespace kiln;
using Catch::Contains;
using kiln::test::TempDir;

namespace {

std::vector<uint8_t> bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

std::u32string utf32(const std::string& s) { return decode_utf8(bytes(s), "test"); }

}  // namespace

TEST_CASE("UTF-8: one to four bytes decode to their code points, and encode back", "[text][lesson14][cpu]") {
    // "a" U+0061, "é" U+00E9 (c3 a9), "—" U+2014 (e2 80 94), "𝄞" U+1D11E (f0 9d 84 9e)
    const std::string s = "a\xc3\xa9\xe2\x80\x94\xf0\x9d\x84\x9e";
    const std::u32string c = utf32(s);
    REQUIRE(c == std::u32string{U'a', 0xE9, 0x2014, 0x1D11E});
    CHECK(encode_utf8(c) == s);
}

TEST_CASE("UTF-8: what is not UTF-8 is refused, naming the file, the line and the column", "[text][lesson14][cpu]") {
    // a byte that starts nothing, on line 2, column 3
    CHECK_THROWS_WITH(decode_utf8(bytes("ab\ncd\xff"), "book.txt"),
                      Contains("'book.txt' is not UTF-8 text") && Contains("line 2, column 3") && Contains("ff") &&
                          Contains("iconv"));
    // cut short at the end of the file
    CHECK_THROWS_WITH(decode_utf8(bytes("ok \xe2\x80"), "cut.txt"), Contains("ends inside a character") &&
                                                                        Contains("truncated"));
    // a lead byte followed by another lead byte
    CHECK_THROWS_WITH(decode_utf8(bytes("\xc3\x41"), "x"), Contains("are not one character"));
    // '/' written in two bytes (overlong), a surrogate, a value above U+10FFFF
    CHECK_THROWS_WITH(decode_utf8(bytes("\xc0\xaf"), "x"), Contains("encode no valid character"));
    CHECK_THROWS_WITH(decode_utf8(bytes("\xed\xa0\x80"), "x"), Contains("encode no valid character"));
    CHECK_THROWS_WITH(decode_utf8(bytes("\xf4\x90\x80\x80"), "x"), Contains("encode no valid character"));
}

TEST_CASE("the character tokenizer: the text's characters sorted by code point, ids their ranks",
          "[text][lesson14][cpu]") {
    // sorted(set("hello, world\n")) = ['\n', ' ', ',', 'd', 'e', 'h', 'l', 'o', 'r', 'w']
    const CharTokenizer tok = CharTokenizer::from_text(utf32("hello, world\n"));
    REQUIRE(tok.size() == 10);
    CHECK(tok.characters() == U"\n ,dehlorw");
    CHECK(tok.encode(utf32("hello"), "t") == std::vector<int32_t>{5, 4, 6, 6, 7});
    CHECK(tok.decode(std::vector<int32_t>{9, 7, 8, 6, 3}) == "world");
    CHECK_THROWS_WITH(tok.encode(utf32("hex"), "the prompt"),
                      Contains("the prompt") && Contains("'x'") && Contains("position 2") &&
                          Contains("not in the vocabulary"));
    CHECK_THROWS_WITH(tok.decode(std::vector<int32_t>{1, 10}), Contains("token 10") && Contains("[0, 10)"));
}

TEST_CASE("the vocabulary file: saved beside a checkpoint, loaded back the same; a bad one is refused",
          "[text][lesson14][cpu]") {
    TempDir tmp;
    const CharTokenizer tok = CharTokenizer::from_text(utf32("Call me Ishmael\xe2\x80\x94"));
    tok.save(tmp.file("vocab.json"));
    CHECK(CharTokenizer::load(tmp.file("vocab.json")) == tok);
    CHECK_FALSE(std::filesystem::exists(tmp.file("vocab.json.tmp")));

    CHECK_THROWS_WITH(CharTokenizer::load(tmp.file("none.json")), Contains("no vocabulary") && Contains("--save"));
    test::write_bytes(tmp.file("bad.json"), bytes("{\"weights\": [1, 2]}"));
    CHECK_THROWS_WITH(CharTokenizer::load(tmp.file("bad.json")), Contains("is not a character vocabulary"));
    test::write_bytes(tmp.file("order.json"), bytes("{\"tokenizer\": \"char\", \"code_points\": [32, 10]}"));
    CHECK_THROWS_WITH(CharTokenizer::load(tmp.file("order.json")), Contains("'10'") && Contains("increasing"));
    test::write_bytes(tmp.file("word.json"), bytes("{\"tokenizer\": \"char\", \"code_points\": [32, x]}"));
    CHECK_THROWS_WITH(CharTokenizer::load(tmp.file("word.json")), Contains("'x'"));
}

TEST_CASE("load_text: the first 90% of the tokens train, the last 10% validate; bad files are named",
          "[text][lesson14][cpu]") {
    TempDir tmp;
    std::string text;
    for (int i = 0; i < 100; i++) text += char('a' + i % 7);
    test::write_bytes(tmp.file("t.txt"), bytes(text));
    const TextData d = load_text(tmp.file("t.txt"));
    CHECK(d.characters == 100);
    CHECK(d.tokenizer.size() == 7);
    REQUIRE(d.train.size() == 90);
    REQUIRE(d.val.size() == 10);
    CHECK(d.tokenizer.decode(d.val) == text.substr(90));
    CHECK(load_text(tmp.file("t.txt"), 20).train.size() == 18);  // --limit 20: 18 + 2

    test::write_bytes(tmp.file("empty.txt"), {});
    CHECK_THROWS_WITH(load_text(tmp.file("empty.txt")), Contains("empty.txt' is empty"));
    CHECK_THROWS_WITH(load_text(tmp.file("none.txt"), 0, 0.1, "; run `make data`"),
                      Contains("none.txt' not found; run `make data`"));
    test::write_bytes(tmp.file("latin1.txt"), bytes("caf\xe9!"));  // é in Latin-1, not UTF-8
    CHECK_THROWS_WITH(load_text(tmp.file("latin1.txt")), Contains("latin1.txt' is not UTF-8"));
}

TEST_CASE("windows: y is x shifted by one token, offsets uniform over [0, n − T − 1] from (seed, k)",
          "[text][lesson14][cpu]") {
    std::vector<int32_t> tokens(50);
    for (int i = 0; i < 50; i++) tokens[size_t(i)] = i;  // token = its position: a window shows its offset
    const TextWindows w(tokens, 8, 4, 7, "the training split");
    Tensor x, y;
    w.batch(3, x, y);
    REQUIRE(x.shape() == Shape{4, 8});
    REQUIRE(y.shape() == Shape{4, 8});
    const Rng rng(7);
    for (int64_t b = 0; b < 4; b++) {
        const int64_t off = int64_t(rng.at(uint64_t(3 * 4 + b)) % 42);  // n − T = 42 starts
        CHECK(w.offset(3, b) == off);
        for (int64_t t = 0; t < 8; t++) {
            CHECK(x.get({b, t}) == off + t);
            CHECK(y.get({b, t}) == off + t + 1);
        }
    }
    // every start is reached, none past n − T − 1 (the last window ends at the last token)
    std::set<int64_t> seen;
    for (int64_t k = 0; k < 200; k++)
        for (int64_t b = 0; b < 4; b++) seen.insert(w.offset(k, b));
    CHECK(seen.size() == 42);
    CHECK(*seen.rbegin() == 41);

    CHECK_THROWS_WITH(TextWindows(tokens, 50, 4, 7, "the validation split"),
                      Contains("the validation split holds 50 tokens") && Contains("block size + 1 = 51") &&
                          Contains("--block-size"));
}

// Data parallel training (lesson-14 under mpirun): rank r of p takes windows [r·B/p, (r+1)·B/p)
// of batch k, so the ranks' shares, in rank order, are the batch one process draws.
TEST_CASE("windows: the ranks' shares of batch k, in rank order, are the whole batch", "[text][lesson14][cpu]") {
    std::vector<int32_t> tokens(50);
    for (int i = 0; i < 50; i++) tokens[size_t(i)] = i;
    const TextWindows w(tokens, 8, 6, 7, "the training split");
    Tensor x, y;
    w.batch(5, x, y);
    for (int world : {2, 3}) {
        for (int r = 0; r < world; r++) {
            INFO("rank " << r << " of " << world);
            Tensor xr, yr;
            w.batch(5, xr, yr, Device::CPU, r, world);
            const int64_t n = 6 / world;
            REQUIRE(xr.shape() == Shape{n, 8});
            for (int64_t b = 0; b < n; b++)
                for (int64_t t = 0; t < 8; t++) {
                    CHECK(xr.get({b, t}) == x.get({r * n + b, t}));
                    CHECK(yr.get({b, t}) == y.get({r * n + b, t}));
                }
        }
    }
    CHECK_THROWS_WITH(w.batch(5, x, y, Device::CPU, 0, 4), Contains("rank 0 of 4") && Contains("batch of 6 windows"));
}

TEST_CASE("ordered windows cover a split at offsets 0, T, 2T, ...", "[text][lesson14][cpu]") {
    std::vector<int32_t> tokens(21);
    for (int i = 0; i < 21; i++) tokens[size_t(i)] = i;
    REQUIRE(ordered_window_count(tokens, 5) == 4);  // (21 − 1) / 5: the last window is 15..20
    Tensor x, y;
    ordered_windows(tokens, 5, 1, 3, x, y);
    REQUIRE(x.shape() == Shape{3, 5});
    CHECK(x.get({0, 0}) == 5);
    CHECK(x.get({2, 4}) == 19);
    CHECK(y.get({2, 4}) == 20);
    CHECK_THROWS_WITH(ordered_windows(tokens, 5, 2, 3, x, y), Contains("windows [2, 5) of 4"));
}

// Hidden: build/tests/kiln_tests '[moby-dick]' (bash data/fetch.sh moby-dick first).
TEST_CASE("the real Moby-Dick: 1,190,317 characters, 83 of them distinct", "[.][moby-dick][text][cpu]") {
    const std::string path = "data/moby-dick/moby-dick.txt";
    if (!std::filesystem::exists(path)) FAIL("no " << path << ": run `bash data/fetch.sh moby-dick` first");
    const TextData d = load_text(path);
    CHECK(d.characters == 1190317);
    CHECK(d.tokenizer.size() == 83);
    CHECK(d.train.size() == 1071285);  // int(1190317 · 0.9)
    CHECK(d.tokenizer.decode(d.train.data(), 22) == "CHAPTER 1. Loomings.\n\n");
}
