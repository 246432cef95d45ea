// safetensors.cpp — the safetensors writer and reader (see safetensors.h for the layout).
#include "io/safetensors.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>

#include "core/error.h"
#include "io/archive.h"

// The data section is the tensors' bytes as they lie in memory: that is little-endian only on a
// little-endian machine (x86, ARM as Linux runs it).
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "checkpoints assume a little-endian machine");

namespace kiln {

namespace {

const char* const kCrcKey = "kiln.crc32";               // the data section's CRC-32
const char* const kMetadataCrcKey = "kiln.metadata_crc32";  // the values' (safetensors.h)
const char* const kCorruptHint =
    "the file is truncated or corrupt: resume from an earlier checkpoint instead (a trainer's --save DIR "
    "keeps the epoch before the last as DIR/prev.safetensors)";

// ---- dtypes -----------------------------------------------------------------------------------
// safetensors' names, in the order the reference writer lays tensors out: descending alignment
// (F32 first), so that with the header padded to 8 bytes every tensor starts aligned.
struct DTypeName {
    DType dtype;
    const char* name;
};
const DTypeName kDTypes[] = {{DType::F32, "F32"}, {DType::I32, "I32"}, {DType::BF16, "BF16"},
                             {DType::F16, "F16"}, {DType::I8, "I8"},   {DType::U8, "U8"}};

int dtype_rank(DType t) {
    int i = 0;
    while (kDTypes[i].dtype != t) i++;
    return i;
}

}  // namespace

// ---- writing ----------------------------------------------------------------------------------
void append_json_string(std::string& out, const std::string& s) {
    out += '"';
    for (unsigned char c : s) {
        switch (c) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            case '\r': out += "\\r"; break;
            case '\t': out += "\\t"; break;
            case '\b': out += "\\b"; break;
            case '\f': out += "\\f"; break;
            default:
                if (c < 0x20) {
                    char esc[8];
                    std::snprintf(esc, sizeof esc, "\\u%04x", c);
                    out += esc;
                } else {
                    out += char(c);
                }
        }
    }
    out += '"';
}

namespace {

// The header JSON, compact, "__metadata__" first, then the tensors in data order; padded with
// spaces to a multiple of 8.
std::string make_header(const std::vector<std::pair<const std::string*, const Tensor*>>& order,
                        const std::map<std::string, std::string>& metadata) {
    std::string h = "{\"__metadata__\":{";
    bool first = true;
    for (const auto& [key, value] : metadata) {
        if (!first) h += ',';
        first = false;
        append_json_string(h, key);
        h += ':';
        append_json_string(h, value);
    }
    h += '}';
    size_t offset = 0;
    for (const auto& [name, t] : order) {
        h += ',';
        append_json_string(h, *name);
        h += ":{\"dtype\":\"";
        h += kDTypes[dtype_rank(t->dtype())].name;
        h += "\",\"shape\":[";
        for (int d = 0; d < t->ndim(); d++) h += (d ? "," : "") + std::to_string(t->size(d));
        h += "],\"data_offsets\":[" + std::to_string(offset) + ",";
        offset += t->nbytes();
        h += std::to_string(offset) + "]}";
    }
    h += '}';
    h.append((8 - h.size() % 8) % 8, ' ');
    return h;
}

SaveStepHook save_step_hook = nullptr;

void reached(const char* step) {
    if (save_step_hook) save_step_hook(step);
}

// The bytes of the file into `tmp`, flushed and synced to the disk. Returns the errno of the
// first failure (0: done); on failure `tmp` is removed.
int write_synced(const std::string& tmp, const std::string& header,
                 const std::vector<std::pair<const std::string*, const Tensor*>>& order) {
    std::FILE* f = std::fopen(tmp.c_str(), "wb");
    if (!f) return errno;  // nothing was created
    uint8_t length[8];
    for (int i = 0; i < 8; i++) length[i] = uint8_t(uint64_t(header.size()) >> (8 * i));  // little-endian
    bool ok = std::fwrite(length, 1, 8, f) == 8 && std::fwrite(header.data(), 1, header.size(), f) == header.size();
    for (size_t i = 0; ok && i < order.size(); i++) {
        const Tensor& t = *order[i].second;
        ok = std::fwrite(t.raw(), 1, t.nbytes(), f) == t.nbytes();
    }
    ok = ok && std::fflush(f) == 0 && fsync(fileno(f)) == 0;  // the bytes are on the disk
    int err = ok ? 0 : errno;
    if (std::fclose(f) != 0 && ok) err = errno;
    if (err != 0) std::remove(tmp.c_str());
    return err;
}

// A copy of `from` at `to`, synced: where a hard link cannot be made (a file system without them).
int copy_synced(const std::string& from, const std::string& to) {
    std::error_code error;
    if (!std::filesystem::copy_file(from, to, std::filesystem::copy_options::overwrite_existing, error))
        return error.value() ? error.value() : EIO;
    const int fd = open(to.c_str(), O_RDONLY);
    if (fd < 0) return errno;
    const int err = fsync(fd) == 0 ? 0 : errno;
    close(fd);
    return err;
}

// `path`'s file becomes also `previous`, replacing what `previous` held in one rename; `path` is
// not touched. A hard link costs no bytes (nothing to fill a disk with); a copy where there are none.
int keep_as_previous(const std::string& path, const std::string& previous) {
    std::error_code error;
    if (!std::filesystem::exists(path, error)) return 0;  // the first save: nothing to keep
    const std::string tmp = previous + ".tmp";
    std::remove(tmp.c_str());  // left by a save that was killed
    int err = link(path.c_str(), tmp.c_str()) == 0 ? 0 : errno;
    if (err == EPERM || err == EXDEV || err == EMLINK || err == ENOTSUP || err == ENOSYS) err = copy_synced(path, tmp);
    if (err == 0 && std::rename(tmp.c_str(), previous.c_str()) != 0) err = errno;
    if (err != 0) std::remove(tmp.c_str());
    return err;
}

// The checkpoint at `path`, replaced so that `path` holds a whole file at every moment, the old
// one or the new one: the new bytes on the disk first (path.tmp), then the old file kept as
// `previous` (if asked), then one rename over `path`, then the folder synced (which makes the
// renames durable). Returns the errno of the first failure (0: done); on failure `path` is as
// it was and no temporary file is left.
int write_atomically(const std::string& path, const std::string& previous, const std::string& header,
                     const std::vector<std::pair<const std::string*, const Tensor*>>& order) {
    const std::string tmp = path + ".tmp";
    int err = write_synced(tmp, header, order);
    if (err != 0) return err;
    reached("temporary file written");
    if (!previous.empty()) err = keep_as_previous(path, previous);
    if (err == 0) reached("previous kept");
    if (err == 0 && std::rename(tmp.c_str(), path.c_str()) != 0) err = errno;
    if (err != 0) {
        std::remove(tmp.c_str());
        return err;
    }
    reached("renamed");
    std::string dir = std::filesystem::path(path).parent_path().string();
    int fd = open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
    if (fd < 0) return errno;
    if (fsync(fd) != 0) err = errno;
    close(fd);
    return err;
}

// ---- reading ----------------------------------------------------------------------------------
[[noreturn]] void corrupt(const std::string& path, const std::string& what) {
    KILN_FAIL("'", path, "' is not a valid safetensors checkpoint: ", what, ". ", kCorruptHint);
}

// One tensor's entry in the header.
struct Entry {
    std::string name;
    DType dtype = DType::F32;
    Shape shape;
    uint64_t begin = 0, end = 0;
};

// A reader for exactly the JSON a safetensors header holds: an object of objects, strings and
// arrays of non-negative integers. Every way it can go wrong ends in corrupt().
class HeaderParser {
public:
    HeaderParser(const std::string& path, const char* text, size_t size)
        : path_(path), begin_(text), p_(text), end_(text + size) {}

    void parse(std::vector<Entry>& entries, std::map<std::string, std::string>& metadata) {
        std::set<std::string> seen;
        expect('{');
        if (!peek('}')) {
            do {
                std::string key = string();
                if (!seen.insert(key).second) fail("\"" + key + "\" appears twice");
                expect(':');
                if (key == "__metadata__") {
                    string_map(metadata);
                } else {
                    entries.push_back(tensor_entry(key));
                }
            } while (accept(','));
        }
        expect('}');
        skip_space();  // the padding
        if (p_ != end_) fail("unexpected text after the JSON object");
    }

private:
    [[noreturn]] void fail(const std::string& what) const {
        corrupt(path_, "bad header at byte " + std::to_string(8 + (p_ - begin_)) + ": " + what);
    }
    void skip_space() {
        while (p_ < end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) p_++;
    }
    bool peek(char c) {
        skip_space();
        return p_ < end_ && *p_ == c;
    }
    bool accept(char c) {
        if (!peek(c)) return false;
        p_++;
        return true;
    }
    void expect(char c) {
        if (!accept(c)) fail(std::string("expected '") + c + "'");
    }

    // "..." with JSON's escapes; \uXXXX (and surrogate pairs) become UTF-8.
    std::string string() {
        expect('"');
        std::string s;
        for (;;) {
            if (p_ >= end_) fail("a string is not closed");
            unsigned char c = static_cast<unsigned char>(*p_++);
            if (c == '"') return s;
            if (c < 0x20) fail("a control character inside a string");
            if (c != '\\') {
                s += char(c);
                continue;
            }
            if (p_ >= end_) fail("a string is not closed");
            switch (*p_++) {
                case '"': s += '"'; break;
                case '\\': s += '\\'; break;
                case '/': s += '/'; break;
                case 'b': s += '\b'; break;
                case 'f': s += '\f'; break;
                case 'n': s += '\n'; break;
                case 'r': s += '\r'; break;
                case 't': s += '\t'; break;
                case 'u': append_utf8(s, code_point()); break;
                default: fail("an unknown escape in a string");
            }
        }
    }
    uint32_t hex4() {
        if (end_ - p_ < 4) fail("a \\u escape is cut short");
        uint32_t v = 0;
        for (int i = 0; i < 4; i++) {
            char c = *p_++;
            int d = c >= '0' && c <= '9'   ? c - '0'
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10
                    : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                           : -1;
            if (d < 0) fail("a \\u escape with a non-hex digit");
            v = v * 16 + uint32_t(d);
        }
        return v;
    }
    uint32_t code_point() {
        uint32_t u = hex4();
        if (u < 0xD800 || u > 0xDFFF) return u;
        // A UTF-16 surrogate pair: \uD8xx\uDCxx
        if (u > 0xDBFF || end_ - p_ < 2 || p_[0] != '\\' || p_[1] != 'u') fail("a lone UTF-16 surrogate");
        p_ += 2;
        uint32_t low = hex4();
        if (low < 0xDC00 || low > 0xDFFF) fail("a lone UTF-16 surrogate");
        return 0x10000 + ((u - 0xD800) << 10) + (low - 0xDC00);
    }
    static void append_utf8(std::string& s, uint32_t cp) {
        if (cp < 0x80) {
            s += char(cp);
        } else if (cp < 0x800) {
            s += char(0xC0 | (cp >> 6)), s += char(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            s += char(0xE0 | (cp >> 12)), s += char(0x80 | ((cp >> 6) & 0x3F)), s += char(0x80 | (cp & 0x3F));
        } else {
            s += char(0xF0 | (cp >> 18)), s += char(0x80 | ((cp >> 12) & 0x3F));
            s += char(0x80 | ((cp >> 6) & 0x3F)), s += char(0x80 | (cp & 0x3F));
        }
    }

    // A non-negative integer without sign, fraction or exponent (sizes and offsets).
    uint64_t integer() {
        skip_space();
        if (p_ >= end_ || *p_ < '0' || *p_ > '9') fail("expected a non-negative integer");
        uint64_t v = 0;
        while (p_ < end_ && *p_ >= '0' && *p_ <= '9') {
            uint64_t digit = uint64_t(*p_++ - '0');
            if (v > (UINT64_MAX - digit) / 10) fail("an integer too large");
            v = v * 10 + digit;
        }
        if (p_ < end_ && (*p_ == '.' || *p_ == 'e' || *p_ == 'E')) fail("expected an integer, not a fraction");
        return v;
    }
    std::vector<uint64_t> integers() {
        std::vector<uint64_t> v;
        expect('[');
        if (!peek(']')) {
            do v.push_back(integer());
            while (accept(','));
        }
        expect(']');
        return v;
    }

    void string_map(std::map<std::string, std::string>& out) {
        expect('{');
        if (!peek('}')) {
            do {
                std::string key = string();
                expect(':');
                if (!peek('"')) fail("__metadata__ value \"" + key + "\" is not a string");
                if (!out.emplace(key, string()).second) fail("__metadata__ \"" + key + "\" appears twice");
            } while (accept(','));
        }
        expect('}');
    }

    // {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}, fields in any order.
    Entry tensor_entry(const std::string& name) {
        Entry e;
        e.name = name;
        bool has_dtype = false, has_shape = false, has_offsets = false;
        expect('{');
        do {
            std::string field = string();
            expect(':');
            if (field == "dtype" && !has_dtype) {
                std::string d = string();
                auto it = std::find_if(std::begin(kDTypes), std::end(kDTypes),
                                       [&](const DTypeName& n) { return d == n.name; });
                if (it == std::end(kDTypes))
                    fail("tensor \"" + name + "\" has dtype \"" + d + "\"; kiln reads F32, F16, BF16, I8, I32 and U8");
                e.dtype = it->dtype;
                has_dtype = true;
            } else if (field == "shape" && !has_shape) {
                std::vector<uint64_t> dims = integers();
                if (dims.size() > size_t(Shape::kMaxDims))
                    fail("tensor \"" + name + "\" has " + std::to_string(dims.size()) +
                         " dims; kiln tensors have at most " + std::to_string(Shape::kMaxDims));
                for (uint64_t d : dims) {
                    if (d > uint64_t(INT64_MAX)) fail("tensor \"" + name + "\" has a dimension too large");
                    e.shape.dims[e.shape.ndim++] = int64_t(d);
                }
                has_shape = true;
            } else if (field == "data_offsets" && !has_offsets) {
                std::vector<uint64_t> o = integers();
                if (o.size() != 2) fail("tensor \"" + name + "\": data_offsets must be [begin, end]");
                e.begin = o[0], e.end = o[1];
                has_offsets = true;
            } else {
                fail("tensor \"" + name + "\" has an unexpected or repeated field \"" + field + "\"");
            }
        } while (accept(','));
        expect('}');
        if (!has_dtype || !has_shape || !has_offsets)
            fail("tensor \"" + name + "\" lacks one of dtype, shape, data_offsets");
        return e;
    }

    const std::string& path_;
    const char* begin_;
    const char* p_;
    const char* end_;
};

// bytes = numel · dtype size, or false when that overflows.
bool byte_size(const Entry& e, uint64_t& bytes) {
    bytes = dtype_size(e.dtype);
    for (int d = 0; d < e.shape.ndim; d++) {
        const uint64_t n = uint64_t(e.shape.dims[d]);
        if (n != 0 && bytes > UINT64_MAX / n) return false;
        bytes *= n;
    }
    return true;
}

// The tensors must tile the data section: back to back from 0, each as long as its shape and
// dtype say, the last ending at the end of the file.
void check_offsets(const std::string& path, std::vector<Entry>& entries, uint64_t data_size) {
    std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
    uint64_t next = 0;
    for (const Entry& e : entries) {
        const std::string where = "tensor \"" + e.name + "\" (" + dtype_name(e.dtype) + e.shape.str() + ") at [" +
                                  std::to_string(e.begin) + ", " + std::to_string(e.end) + ")";
        uint64_t bytes = 0;
        if (!byte_size(e, bytes)) corrupt(path, where + ": its size overflows");
        if (e.begin != next)
            corrupt(path, where + ": it should start at byte " + std::to_string(next) +
                              " of the data (tensors lie back to back, without overlaps or gaps)");
        if (e.end < e.begin || e.end - e.begin != bytes)
            corrupt(path, where + ": its shape and dtype make " + std::to_string(bytes) + " bytes");
        if (e.end > data_size)
            corrupt(path, where + ": the data section is only " + std::to_string(data_size) + " bytes long");
        next = e.end;
    }
    if (next != data_size)
        corrupt(path, "the data section is " + std::to_string(data_size) + " bytes long but the tensors fill only " +
                          std::to_string(next));
}

// The CRC as the header stores it: 8 lowercase hex digits.
std::string crc_text(uint32_t crc) {
    char text[16];
    std::snprintf(text, sizeof text, "%08x", crc);
    return text;
}

// The CRC-32 of the values: every key and value of the metadata but the two checksums, in key
// order, each followed by a zero byte. (Of the values, not of the header's bytes: a tool that
// rewrites the JSON another way, with the same values, leaves it right.)
std::string metadata_crc(const std::map<std::string, std::string>& metadata) {
    uLong crc = crc32_z(0, nullptr, 0);
    const Bytef zero = 0;
    for (const auto& [key, value] : metadata) {
        if (key == kCrcKey || key == kMetadataCrcKey) continue;
        crc = crc32_z(crc, reinterpret_cast<const Bytef*>(key.data()), key.size());
        crc = crc32_z(crc, &zero, 1);
        crc = crc32_z(crc, reinterpret_cast<const Bytef*>(value.data()), value.size());
        crc = crc32_z(crc, &zero, 1);
    }
    return crc_text(uint32_t(crc));
}

}  // namespace

void set_save_step_hook(SaveStepHook hook) { save_step_hook = hook; }

void write_safetensors(const std::string& path, const StateDict& s, const std::string& previous) {
    for (const char* key : {kCrcKey, kMetadataCrcKey})
        KILN_CHECK(!s.values.count(key), "write_safetensors '", path, "': the value name \"", key,
                   "\" is reserved for a checksum");
    std::vector<std::pair<const std::string*, const Tensor*>> order;
    for (const auto& [name, t] : s.tensors) {
        KILN_CHECK(name != "__metadata__", "write_safetensors '", path, "': \"__metadata__\" cannot name a tensor");
        KILN_CHECK(t.defined() && t.device() == Device::CPU, "write_safetensors '", path, "': tensor \"", name,
                   "\" must be a CPU tensor (StateDict::put makes CPU copies)");
        order.emplace_back(&name, &t);
    }
    // Within a dtype the map's name order holds (stable sort).
    std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
        return dtype_rank(a.second->dtype()) < dtype_rank(b.second->dtype());
    });
    uLong crc = crc32_z(0, nullptr, 0);
    for (const auto& entry : order)
        crc = crc32_z(crc, static_cast<const Bytef*>(entry.second->raw()), entry.second->nbytes());
    std::map<std::string, std::string> metadata = s.values;
    metadata[kCrcKey] = crc_text(uint32_t(crc));
    metadata[kMetadataCrcKey] = metadata_crc(s.values);

    int err = write_atomically(path, previous, make_header(order, metadata), order);
    KILN_CHECK(err == 0, "cannot write checkpoint '", path, "': ", std::strerror(err),
               " (does the folder exist and is it writable? is the disk full?)");
}

StateDict read_safetensors(const std::string& path) { return parse_safetensors(read_file(path), path); }

StateDict parse_safetensors(const std::vector<uint8_t>& bytes, const std::string& path) {
    if (bytes.size() < 8)
        corrupt(path, "it is " + std::to_string(bytes.size()) + " bytes long, too short for the 8-byte header length");
    uint64_t header_size = 0;
    for (int i = 7; i >= 0; i--) header_size = header_size << 8 | bytes[size_t(i)];  // little-endian
    if (header_size > bytes.size() - 8)
        corrupt(path, "the header length says " + std::to_string(header_size) + " bytes but only " +
                          std::to_string(bytes.size() - 8) + " follow");

    std::vector<Entry> entries;
    StateDict s;
    HeaderParser(path, reinterpret_cast<const char*>(bytes.data()) + 8, size_t(header_size)).parse(entries, s.values);
    const uint8_t* data = bytes.data() + 8 + header_size;
    const uint64_t data_size = bytes.size() - 8 - header_size;
    check_offsets(path, entries, data_size);

    auto crc = s.values.find(kCrcKey);
    if (crc != s.values.end()) {  // written by kiln
        std::string actual = crc_text(uint32_t(crc32_z(crc32_z(0, nullptr, 0), data, size_t(data_size))));
        if (actual != crc->second)
            corrupt(path, "the data's CRC-32 is " + actual + " but the header says " + crc->second +
                              ": some bytes have changed since it was written");
        s.values.erase(crc);
    }
    auto values_crc = s.values.find(kMetadataCrcKey);
    if (values_crc != s.values.end()) {  // written by kiln since the values have their own
        const std::string expected = values_crc->second;
        s.values.erase(values_crc);
        const std::string actual = metadata_crc(s.values);
        if (actual != expected)
            corrupt(path, "the CRC-32 of the values (\"__metadata__\") is " + actual + " but the header says " +
                              expected + ": a value has changed since it was written");
    }
    for (const Entry& e : entries) {
        Tensor t = Tensor::empty(e.shape, e.dtype);
        if (e.end > e.begin) std::memcpy(t.raw(), data + e.begin, size_t(e.end - e.begin));
        s.tensors.emplace(e.name, std::move(t));
    }
    return s;
}


}  // namespace kiln
