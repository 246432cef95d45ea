// text.cpp — UTF-8, the character tokenizer, the split and the windows (see text.h).
#include "data/text.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "io/archive.h"

namespace kiln {

// ---- UTF-8 ------------------------------------------------------------------------------------
namespace {

// "line L, column C" of byte `at` (1-based; a column counts code points, as an editor does).
std::string where_in(const std::vector<uint8_t>& bytes, size_t at) {
    int64_t line = 1, column = 1;
    for (size_t i = 0; i < at; i++) {
        if (bytes[i] == '\n') line++, column = 1;
        else if ((bytes[i] & 0xC0) != 0x80) column++;  // a continuation byte starts no character
    }
    std::ostringstream os;
    os << "byte " << at << " (line " << line << ", column " << column << ")";
    return os.str();
}

std::string hex_bytes(const std::vector<uint8_t>& bytes, size_t at, size_t n) {
    std::string out;
    char b[4];
    for (size_t i = at; i < std::min(bytes.size(), at + n); i++) {
        std::snprintf(b, sizeof b, "%02x", bytes[i]);
        out += (out.empty() ? "" : " ") + std::string(b);
    }
    return out;
}

}  // namespace

// A sequence is a lead byte giving its length (0xxxxxxx 1, 110xxxxx 2, 1110xxxx 3, 11110xxx 4)
// and 10xxxxxx continuation bytes; the value must need that length (no overlong forms), must
// not be a surrogate (U+D800..U+DFFF) and must be at most U+10FFFF.
std::u32string decode_utf8(const std::vector<uint8_t>& bytes, const std::string& name) {
    std::u32string out;
    out.reserve(bytes.size());
    for (size_t i = 0; i < bytes.size();) {
        const uint8_t b = bytes[i];
        int len;
        char32_t c, min;
        if (b < 0x80) len = 1, c = b, min = 0;
        else if ((b & 0xE0) == 0xC0) len = 2, c = b & 0x1F, min = 0x80;
        else if ((b & 0xF0) == 0xE0) len = 3, c = b & 0x0F, min = 0x800;
        else if ((b & 0xF8) == 0xF0) len = 4, c = b & 0x07, min = 0x10000;
        else
            KILN_FAIL("'", name, "' is not UTF-8 text: at ", where_in(bytes, i), " the byte ", hex_bytes(bytes, i, 1),
                      " starts no character (a binary file, or text in another encoding: convert it with "
                      "`iconv -t UTF-8`)");
        KILN_CHECK(i + len <= bytes.size(), "'", name, "' is not UTF-8 text: it ends inside a character (",
                   hex_bytes(bytes, i, len), " at ", where_in(bytes, i), "): the file is truncated");
        for (int k = 1; k < len; k++) {
            KILN_CHECK((bytes[i + k] & 0xC0) == 0x80, "'", name, "' is not UTF-8 text: at ", where_in(bytes, i),
                       " the bytes ", hex_bytes(bytes, i, len), " are not one character (convert it with "
                       "`iconv -t UTF-8`)");
            c = (c << 6) | (bytes[i + k] & 0x3F);
        }
        KILN_CHECK(c >= min && !(c >= 0xD800 && c <= 0xDFFF) && c <= 0x10FFFF, "'", name,
                   "' is not UTF-8 text: at ", where_in(bytes, i), " the bytes ", hex_bytes(bytes, i, len),
                   " encode no valid character (an overlong form, a surrogate or a value above U+10FFFF)");
        out.push_back(c);
        i += size_t(len);
    }
    return out;
}

std::string encode_utf8(const std::u32string& text) {
    std::string out;
    out.reserve(text.size());
    for (char32_t c : text) {
        if (c < 0x80) {
            out += char(c);
        } else if (c < 0x800) {
            out += char(0xC0 | (c >> 6));
            out += char(0x80 | (c & 0x3F));
        } else if (c < 0x10000) {
            out += char(0xE0 | (c >> 12));
            out += char(0x80 | ((c >> 6) & 0x3F));
            out += char(0x80 | (c & 0x3F));
        } else {
            out += char(0xF0 | (c >> 18));
            out += char(0x80 | ((c >> 12) & 0x3F));
            out += char(0x80 | ((c >> 6) & 0x3F));
            out += char(0x80 | (c & 0x3F));
        }
    }
    return out;
}

// ---- the tokenizer ----------------------------------------------------------------------------
CharTokenizer::CharTokenizer(std::u32string sorted_unique) : chars_(std::move(sorted_unique)) {
    for (size_t i = 0; i < chars_.size(); i++) ids_[chars_[i]] = int32_t(i);
}

CharTokenizer CharTokenizer::from_text(const std::u32string& text) {
    std::u32string chars = text;
    std::sort(chars.begin(), chars.end());
    chars.erase(std::unique(chars.begin(), chars.end()), chars.end());
    return CharTokenizer(std::move(chars));
}

namespace {
constexpr const char* kVocabKey = "\"code_points\"";
}

std::string CharTokenizer::to_json() const {
    std::string json = "{\"tokenizer\": \"char\", \"code_points\": [";
    for (size_t i = 0; i < chars_.size(); i++) json += (i ? ", " : "") + std::to_string(uint32_t(chars_[i]));
    return json + "]}\n";
}

void CharTokenizer::save(const std::string& path) const {
    const std::string tmp = path + ".tmp";
    const int err = write_file(tmp, to_json());
    KILN_CHECK(err == 0, "cannot write the vocabulary '", tmp, "': ", std::strerror(err));
    std::error_code ec;
    std::filesystem::rename(tmp, path, ec);
    KILN_CHECK(!ec, "cannot rename '", tmp, "' to '", path, "': ", ec.message());
}

CharTokenizer CharTokenizer::load(const std::string& path) {
    std::error_code ec;
    KILN_CHECK(std::filesystem::exists(path, ec), "no vocabulary '", path,
               "': a checkpoint's folder keeps vocab.json beside its weights (lesson-14 --save writes both)");
    const std::vector<uint8_t> bytes = read_file(path);
    return from_json(std::string(bytes.begin(), bytes.end()), path);
}

CharTokenizer CharTokenizer::from_json(const std::string& text, const std::string& what) {
    const size_t key = text.find(kVocabKey);
    const size_t open = key == std::string::npos ? key : text.find('[', key);
    const size_t close = open == std::string::npos ? open : text.find(']', open);
    KILN_CHECK(close != std::string::npos && text.find("\"tokenizer\": \"char\"") != std::string::npos, "'", what,
               "' is not a character vocabulary (expected {\"tokenizer\": \"char\", \"code_points\": [...]})");
    std::u32string chars;
    std::istringstream in(text.substr(open + 1, close - open - 1));
    for (std::string item; std::getline(in, item, ',');) {
        const size_t first = item.find_first_not_of(" \n\t"), last = item.find_last_not_of(" \n\t");
        if (first == std::string::npos) continue;
        item = item.substr(first, last - first + 1);
        const bool digits = item.size() <= 7 && item.find_first_not_of("0123456789") == std::string::npos;
        const unsigned long v = digits ? std::stoul(item) : 0;
        KILN_CHECK(digits && v <= 0x10FFFF && !(v >= 0xD800 && v <= 0xDFFF) && (chars.empty() || v > chars.back()),
                   "'", what, "': '", item, "' after ", chars.size(),
                   " code points is not the next one (code points are increasing integers up to 0x10FFFF)");
        chars.push_back(char32_t(v));
    }
    KILN_CHECK(!chars.empty(), "'", what, "' holds an empty vocabulary");
    return CharTokenizer(std::move(chars));
}

namespace {
// "'a' (U+61)"
std::string describe_char(char32_t c) {
    std::ostringstream os;
    os << "'" << encode_utf8(std::u32string(1, c)) << "' (U+" << std::uppercase << std::hex << uint32_t(c) << ")";
    return os.str();
}
}  // namespace

std::string CharTokenizer::difference(const CharTokenizer& o, const std::string& name, const std::string& other_name) const {
    for (size_t i = 0; i < std::min(chars_.size(), o.chars_.size()); i++)
        if (chars_[i] != o.chars_[i])
            return "id " + std::to_string(i) + " is " + describe_char(chars_[i]) + " in " + name + ", " +
                   describe_char(o.chars_[i]) + " in " + other_name;
    if (chars_.size() != o.chars_.size())
        return std::to_string(chars_.size()) + " characters in " + name + ", " + std::to_string(o.chars_.size()) +
               " in " + other_name;
    return "";
}

std::vector<int32_t> CharTokenizer::encode(const std::u32string& text, const std::string& what) const {
    std::vector<int32_t> ids(text.size());
    for (size_t i = 0; i < text.size(); i++) {
        const auto it = ids_.find(text[i]);
        KILN_CHECK(it != ids_.end(), what, ": the character '", encode_utf8(std::u32string(1, text[i])), "' (U+",
                   std::hex, uint32_t(text[i]), std::dec, ") at position ", i,
                   " is not in the vocabulary of the text the model was trained on (", size(), " characters)");
        ids[i] = it->second;
    }
    return ids;
}

std::string CharTokenizer::decode(const int32_t* ids, int64_t n) const {
    std::u32string text(size_t(n), U' ');
    for (int64_t i = 0; i < n; i++) {
        KILN_CHECK(ids[i] >= 0 && ids[i] < size(), "decode: token ", ids[i], " at position ", i,
                   " is outside the vocabulary [0, ", size(), ")");
        text[size_t(i)] = chars_[size_t(ids[i])];
    }
    return encode_utf8(text);
}

// ---- the file and its split -------------------------------------------------------------------
TextData load_text(const std::string& path, int64_t limit, double val_fraction, const std::string& hint) {
    std::error_code ec;
    KILN_CHECK(std::filesystem::exists(path, ec), "text file '", path, "' not found", hint);
    std::u32string text = decode_utf8(read_file(path), path);
    KILN_CHECK(!text.empty(), "text file '", path, "' is empty: there is nothing to learn from");
    if (limit > 0 && limit < int64_t(text.size())) text.resize(size_t(limit));
    TextData d{CharTokenizer::from_text(text), {}, {}, int64_t(text.size())};
    std::vector<int32_t> ids = d.tokenizer.encode(text, path);
    const size_t n_train = size_t(double(ids.size()) * (1.0 - val_fraction));  // int(n · 0.9)
    d.train.assign(ids.begin(), ids.begin() + std::ptrdiff_t(n_train));
    d.val.assign(ids.begin() + std::ptrdiff_t(n_train), ids.end());
    return d;
}

// ---- windows ----------------------------------------------------------------------------------
TextWindows::TextWindows(const std::vector<int32_t>& tokens, int64_t block_size, int64_t batch_size, uint64_t seed,
                         const std::string& what)
    : tokens_(tokens), T_(block_size), B_(batch_size), rng_(seed) {
    KILN_CHECK(block_size > 0 && batch_size > 0, "TextWindows: block size ", block_size, " and batch size ",
               batch_size, " must be positive");
    KILN_CHECK(int64_t(tokens.size()) > block_size, what, " holds ", tokens.size(),
               " tokens: too few for one window of block size + 1 = ", block_size + 1,
               " (lower --block-size, or give more text)");
}

int64_t TextWindows::offset(int64_t k, int64_t b) const {
    const uint64_t starts = uint64_t(int64_t(tokens_.size()) - T_);  // offsets 0 .. n − T − 1
    return int64_t(rng_.at(uint64_t(k) * uint64_t(B_) + uint64_t(b)) % starts);
}

namespace {

// x[i, t] = tokens[start_i + t], y[i, t] = tokens[start_i + t + 1], i32 [count, T], moved to device.
void fill_windows(const std::vector<int32_t>& tokens, int64_t T, const std::vector<int64_t>& starts, Tensor& x,
                  Tensor& y, Device device) {
    const int64_t n = int64_t(starts.size());
    Tensor hx = Tensor::empty({n, T}, DType::I32, Device::CPU, Category::Data);
    Tensor hy = Tensor::empty({n, T}, DType::I32, Device::CPU, Category::Data);
    int32_t* px = hx.data<int32_t>();
    int32_t* py = hy.data<int32_t>();
    for (int64_t i = 0; i < n; i++) {
        const int32_t* w = tokens.data() + starts[size_t(i)];
        std::copy(w, w + T, px + i * T);
        std::copy(w + 1, w + T + 1, py + i * T);
    }
    x = hx.to(device);
    y = hy.to(device);
}

}  // namespace

void TextWindows::batch(int64_t k, Tensor& x, Tensor& y, Device device, int rank, int world) const {
    KILN_CHECK(world >= 1 && rank >= 0 && rank < world && B_ % world == 0, "TextWindows: rank ", rank, " of ", world,
               " cannot take an equal share of a batch of ", B_, " windows: use a --batch-size that the ranks divide");
    const int64_t n = B_ / world, first = rank * n;
    std::vector<int64_t> starts(static_cast<size_t>(n));
    for (int64_t b = 0; b < n; b++) starts[size_t(b)] = offset(k, first + b);
    fill_windows(tokens_, T_, starts, x, y, device);
}

int64_t ordered_window_count(const std::vector<int32_t>& tokens, int64_t block_size) {
    return tokens.empty() ? 0 : (int64_t(tokens.size()) - 1) / block_size;
}

void ordered_windows(const std::vector<int32_t>& tokens, int64_t block_size, int64_t first, int64_t count, Tensor& x,
                     Tensor& y, Device device) {
    KILN_CHECK(first >= 0 && count > 0 && first + count <= ordered_window_count(tokens, block_size),
               "ordered_windows: windows [", first, ", ", first + count, ") of ",
               ordered_window_count(tokens, block_size), " (", tokens.size(), " tokens, block size ", block_size, ")");
    std::vector<int64_t> starts(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; i++) starts[size_t(i)] = (first + i) * block_size;
    fill_windows(tokens, block_size, starts, x, y, device);
}

}  // namespace kiln
