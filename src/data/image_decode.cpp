// image_decode.cpp — stb_image and the checks around it (see image_decode.h). The Makefile
// compiles this file with -fwrapv -fno-sanitize=signed-integer-overflow (stb's known overflow).
#include "data/image_decode.h"

#include <algorithm>
#include <climits>
#include <string>
#include <utility>
#include <vector>

#include "core/stb_warnings.h"

// stb_image, compiled into this file only (STB_IMAGE_STATIC: no symbols exported, so another
// file may include its own copy). JPEG and PNG only, from memory only.
KILN_STB_BEGIN
#define STB_IMAGE_IMPLEMENTATION
#define STB_IMAGE_STATIC
#define STBI_ONLY_JPEG
#define STBI_ONLY_PNG
#define STBI_NO_STDIO
#define STBI_NO_LINEAR
#define STBI_NO_HDR
#include <stb/stb_image.h>
KILN_STB_END

namespace kiln {

namespace {

// The stb_image that Debian ships (2.27) trusts a JPEG's tables in two ways that a damaged file
// turns into reads and writes out of bounds (both found by make fuzz):
//  - the code counts of a Huffman table (DHT segment): 16 counts summing to more than 256 make
//    it write past its tables;
//  - a scan (SOS) or frame (SOF) may name a Huffman or quantization table the file never
//    defined: stb then decodes with whatever its memory held, and a code's symbol index can
//    land outside the table (stbi__jpeg_huff_decode, index −63 of 257).
// Both are invalid JPEG, so this walks the file's markers the way stb does and names what is
// wrong before stb sees it; "" means nothing to refuse.
std::string jpeg_tables_problem(const uint8_t* p, size_t n) {
    // The start of image as stb finds it: 0xFF, any number of 0xFF fill bytes, then 0xD8.
    size_t i = 0;
    while (i < n && p[i] == 0xFF) ++i;
    if (i == 0 || i >= n || p[i] != 0xD8) return "";  // not a JPEG to stb: nothing to check
    ++i;
    auto at = [&](size_t j) -> uint32_t { return j < n ? p[j] : 0; };  // stb reads 0 past the end
    unsigned huffman_defined[2] = {0, 0};                            // bit t: table t of class DC (0), AC (1)
    unsigned quant_defined = 0, quant_used = 0;                      // bit t: quantization table t
    bool progressive = false;
    while (i + 1 < n) {
        // Outside segments (and inside entropy-coded data) only 0xFF <marker> matters;
        // 0xFF 0x00 is a stuffed byte, 0xFF 0xFF a fill byte, RSTn/TEM have no length.
        if (p[i] != 0xFF) { ++i; continue; }
        const uint8_t m = p[i + 1];
        if (m == 0xFF) { ++i; continue; }
        if (m == 0x00 || m == 0x01 || (m >= 0xD0 && m <= 0xD7)) { i += 2; continue; }
        if (m == 0xD9) break;  // EOI
        const size_t len = at(i + 2) << 8 | at(i + 3);
        const size_t body = i + 4;
        if (m == 0xC4) {  // DHT: tables of (class/id byte, 16 counts, sum(counts) symbols)
            int64_t left = int64_t(len) - 2;
            size_t j = body;
            while (left > 0) {
                const uint32_t q = at(j++);
                if ((q >> 4) > 1 || (q & 15) > 3) break;  // stb rejects this table itself
                uint32_t symbols = 0;
                for (int k = 0; k < 16; ++k) symbols += at(j++);
                if (symbols > 256) return "a Huffman table has more than 256 codes";
                huffman_defined[q >> 4] |= 1u << (q & 15);
                j += symbols;
                left -= 17 + int64_t(symbols);
            }
        } else if (m == 0xDB) {  // DQT: tables of (precision/id byte, 64 entries of 1 or 2 bytes)
            int64_t left = int64_t(len) - 2;
            size_t j = body;
            while (left > 0) {
                const uint32_t q = at(j++);
                if ((q >> 4) > 1 || (q & 15) > 3) break;  // stb rejects this table itself
                quant_defined |= 1u << (q & 15);
                j += (q >> 4) ? 128 : 64;
                left -= (q >> 4) ? 129 : 65;
            }
        } else if (m == 0xC0 || m == 0xC1 || m == 0xC2) {  // SOF: per component (id, sampling, table)
            progressive = m == 0xC2;
            const uint32_t components = at(body + 5);
            for (uint32_t c = 0; c < components && c < 4; ++c) quant_used |= 1u << (at(body + 8 + 3 * c) & 3);
        } else if (m == 0xDA) {  // SOS: per component (id, DC table << 4 | AC table), then Ss, Se, Ah/Al
            if ((quant_used & ~quant_defined) != 0) return "its frame uses a quantization table the file never defines";
            const uint32_t components = at(body);
            const uint32_t ss = at(body + 1 + 2 * components), ah = at(body + 3 + 2 * components) >> 4;
            // A baseline scan decodes DC and AC codes; a progressive one DC (first pass) or AC only.
            const bool dc = !progressive || (ss == 0 && ah == 0), ac = !progressive || ss != 0;
            for (uint32_t c = 0; c < components && c < 4; ++c) {
                const uint32_t tables = at(body + 2 + 2 * c);
                if ((dc && !(huffman_defined[0] >> (tables >> 4 & 3) & 1)) ||
                    (ac && !(huffman_defined[1] >> (tables & 3) & 1)))
                    return "a scan uses a Huffman table the file never defines";
            }
        }
        i += 2 + std::max<size_t>(len, 2);
    }
    return "";
}

// A PNG is its 8-byte signature, then chunks: a 4-byte big-endian length, a 4-byte type, the
// data, a 4-byte CRC, up to IEND. Two things stb_image 2.27 gets wrong (both found by make fuzz):
//  - it trusts a chunk's length when it gathers the image data (IDAT): it grows its buffer to the
//    length claimed before it reads, so a file of 100 bytes can have it allocate 2 GiB. A chunk
//    longer than what follows it is invalid PNG: such a file is refused before stb sees it;
//  - an empty IDAT chunk before any image data has it copy 0 bytes to a null buffer (undefined
//    behaviour). An empty IDAT chunk is valid and carries nothing, so it is left out instead.
constexpr uint8_t kPngSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};

bool is_png(const uint8_t* p, size_t n) { return n >= 8 && std::equal(kPngSignature, kPngSignature + 8, p); }

// Calls f(offset, length, type) for each chunk up to and with IEND; false if one is longer than
// the rest of the file.
template <typename F> bool for_each_png_chunk(const uint8_t* p, size_t n, F f) {
    for (size_t i = 8; i + 8 <= n;) {
        const uint64_t length = uint64_t(p[i]) << 24 | uint64_t(p[i + 1]) << 16 | uint64_t(p[i + 2]) << 8 | p[i + 3];
        if (length > n - i - 8) return false;
        const std::string type(p + i + 4, p + i + 8);
        f(i, size_t(length), type);
        if (type == "IEND") break;
        i += 8 + size_t(length) + 4;
    }
    return true;
}

bool png_chunks_fit(const uint8_t* p, size_t n) {
    return !is_png(p, n) || for_each_png_chunk(p, n, [](size_t, size_t, const std::string&) {});
}

// The file without its empty IDAT chunks, or an empty vector when it has none (a PNG whose
// chunks fit).
std::vector<uint8_t> png_without_empty_idat(const uint8_t* p, size_t n) {
    std::vector<std::pair<size_t, size_t>> drop;  // [begin, end) of each empty IDAT chunk
    if (!is_png(p, n)) return {};
    for_each_png_chunk(p, n, [&](size_t at, size_t length, const std::string& type) {
        if (type == "IDAT" && length == 0) drop.emplace_back(at, std::min(n, at + 12));
    });
    if (drop.empty()) return {};
    std::vector<uint8_t> out;
    size_t from = 0;
    for (const auto& [begin, end] : drop) {
        out.insert(out.end(), p + from, p + begin);
        from = end;
    }
    out.insert(out.end(), p + from, p + n);
    return out;
}

void free_pixels(void* p) { stbi_image_free(p); }

// The most pixels an image may have: the largest CIFAR-10 file, a PNG sprite of 10,000 images,
// has 1024 × 10,000. A header that claims more would have stb allocate gigabytes first.
constexpr int64_t kMaxPixels = int64_t(1) << 24;

}  // namespace

ImagePixels decode_rgb_image(const uint8_t* bytes, size_t size, int& w, int& h, std::string& why) {
    ImagePixels none(nullptr, free_pixels);
    if (size == 0) why = "the file is empty";
    else if (size > size_t(INT_MAX)) why = "the file is larger than stb_image reads (2 GiB)";
    else if (const std::string jpeg = jpeg_tables_problem(bytes, size); !jpeg.empty()) why = "it is a corrupt JPEG (" + jpeg + ")";
    else if (!png_chunks_fit(bytes, size)) why = "it is a corrupt PNG (a chunk is longer than the rest of the file)";
    if (!why.empty()) return none;
    const std::vector<uint8_t> cleaned = png_without_empty_idat(bytes, size);
    if (!cleaned.empty()) bytes = cleaned.data(), size = cleaned.size();
    int comp = 0;
    if (stbi_info_from_memory(bytes, int(size), &w, &h, &comp) && int64_t(w) * int64_t(h) > kMaxPixels) {
        why = "its header says " + std::to_string(w) + "x" + std::to_string(h) + " pixels, more than the " +
              std::to_string(kMaxPixels) + " kiln decodes";
        return none;
    }
    ImagePixels px(stbi_load_from_memory(bytes, int(size), &w, &h, &comp, 3), free_pixels);
    if (!px) {
        const char* reason = stbi_failure_reason();
        why = std::string("it is corrupt or not a JPEG/PNG (stb_image: ") + (reason ? reason : "unknown error") + ")";
    }
    return px;
}

}  // namespace kiln
