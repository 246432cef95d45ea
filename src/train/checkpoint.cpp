// checkpoint.cpp — the safetensors writer and reader, and the model and run state around them.
// See checkpoint.h for the layout.
#include "train/checkpoint.h"

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
#include "data/archive.h"
#include "nn/prune.h"  // is_mask_name: a pruned model's checkpoint

// The data section is the tensors' bytes as they lie in memory: that is little-endian only on a
// little-endian machine (x86, ARM as Linux runs it).
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "checkpoints assume a little-endian machine");

namespace kiln {

namespace {

const char* const kCrcKey = "kiln.crc32";               // the data section's CRC-32
const char* const kMetadataCrcKey = "kiln.metadata_crc32";  // the values' (checkpoint.h)
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
    for (int d = 0; d < e.shape.ndim; d++)
        if (__builtin_mul_overflow(bytes, uint64_t(e.shape.dims[d]), &bytes)) return false;
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

// ---- the run ----------------------------------------------------------------------------------
// The prefixes of a checkpoint's non-model state (load_model leaves them alone).
const char* const kRunPrefixes[] = {"optimizer.", "scheduler.", "plateau.", "lookahead.", "train."};

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// The tensors a model saves and loads, by their names in its tree (PyTorch's state_dict keys).
std::vector<std::pair<std::string, Tensor*>> model_tensors(Module& model) {
    std::vector<std::pair<std::string, Tensor*>> all;
    for (auto& [name, p] : model.named_parameters()) all.emplace_back(name, &p->value);
    for (auto& b : model.named_buffers()) all.push_back(b);
    return all;
}

// The schedule record as saved: "train.schedule.epochs" and "train.schedule.epoch_start_lrs",
// the lrs as text ("%.9g": a float reads back exactly), separated by commas.
const char* const kScheduleEpochs = "train.schedule.epochs";
const char* const kScheduleLrs = "train.schedule.epoch_start_lrs";
// The number of data parallel ranks that shared each epoch, saved only when it is above 1.
const char* const kWorldSize = "train.loader.world_size";
// The training loader's seed: resuming takes it, so that the data order goes on as it was.
const char* const kLoaderSeed = "train.loader.seed";

std::vector<std::string> lr_texts(const std::vector<float>& lrs) {
    std::vector<std::string> texts;
    for (float lr : lrs) {
        char text[32];
        std::snprintf(text, sizeof text, "%.9g", double(lr));
        texts.push_back(text);
    }
    return texts;
}

std::string join(const std::vector<std::string>& parts) {
    std::string s;
    for (const std::string& p : parts) s += (s.empty() ? "" : ",") + p;
    return s;
}

std::vector<std::string> split(const std::string& s) {
    std::vector<std::string> parts;
    size_t begin = 0;
    for (size_t comma; (comma = s.find(',', begin)) != std::string::npos; begin = comma + 1)
        parts.push_back(s.substr(begin, comma - begin));
    parts.push_back(s.substr(begin));
    return parts;
}

// Refuses a resume whose schedule is not the one the checkpoint was trained with, naming the
// first difference: the number of epochs (--epochs), then the lr at an epoch's start (--lr and
// the schedule's flags).
void check_schedule(const StateDict& s, const ScheduleRecord& run) {
    const int64_t epochs = s.get_int(kScheduleEpochs, 1, INT32_MAX);
    KILN_CHECK(epochs == run.epochs, "the checkpoint's run was laid out over ", epochs, " epochs; this one over ",
               run.epochs, ". Resume with the same --epochs (the learning-rate schedule depends on it)");
    const std::vector<std::string> saved = split(s.get_string(kScheduleLrs)), now = lr_texts(run.epoch_start_lrs);
    KILN_CHECK(saved.size() == now.size(), "\"", kScheduleLrs, "\" holds ", saved.size(), " lrs for ", epochs,
               " epochs (the checkpoint is corrupt?)");
    for (size_t e = 0; e < saved.size(); e++)
        KILN_CHECK(saved[e] == now[e], "the checkpoint's schedule starts epoch ", e + 1, " at lr ",
                   std::strtof(saved[e].c_str(), nullptr), "; this run's at lr ", run.epoch_start_lrs[e],
                   ". Resume with the same --lr and schedule flags");
}

}  // namespace

ScheduleRecord record_schedule(const Optimizer& optimizer, const LRScheduler* scheduler, int64_t epochs,
                               int64_t steps_per_epoch) {
    // A scheduler schedules each group from its initial_lr, rounding to the f32 lr as it sets it.
    const ParamGroup& group = optimizer.param_groups().front();
    ScheduleRecord record{epochs, {}};
    for (int64_t e = 0; e < epochs; e++)
        record.epoch_start_lrs.push_back(scheduler ? float(scheduler->lr_at(e * steps_per_epoch, group.initial_lr))
                                                   : group.lr);
    return record;
}

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

StateDict read_safetensors(const std::string& path) {
    const std::vector<uint8_t> bytes = read_file(path);
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

void save_model(StateDict& state, Module& model) {
    for (auto& [name, t] : model_tensors(model)) {
        KILN_CHECK(!state.tensors.count(name), "save_model: two of the model's tensors are named \"", name,
                   "\"; give the layers distinct names");
        state.put(name, *t);
    }
}

void load_model(const StateDict& state, Module& model) {
    const std::vector<std::pair<std::string, Tensor*>> tensors = model_tensors(model);
    std::set<std::string> names;
    for (auto& [name, t] : tensors) names.insert(name);
    for (const auto& [name, t] : state.tensors)
        KILN_CHECK(names.count(name) || !prune::is_mask_name(name),
                   "load_model: the checkpoint holds a pruned model (it has \"", name, "\") and this model is not "
                   "pruned there: call prune::prune_like(state, model) first (nn/prune.h) to prune it the same way");
    for (auto& [name, t] : tensors) state.get_into(name, *t);
    for (const auto& entry : state.tensors) {
        const std::string& name = entry.first;  // a plain reference: C++17 lambdas cannot capture a structured binding
        bool run_state = std::any_of(std::begin(kRunPrefixes), std::end(kRunPrefixes),
                                     [&name](const char* prefix) { return starts_with(name, prefix); });
        KILN_CHECK(run_state || names.count(name), "load_model: the checkpoint has a tensor \"", name, "\" (",
                   entry.second.desc(), ") that the model does not (a checkpoint of another model?)");
    }
}

void save_checkpoint(const std::string& path, TrainingRun& run, const ResumePoint& at) {
    write_safetensors(path, checkpoint_state(run, at));
}

StateDict checkpoint_state(TrainingRun& run, const ResumePoint& at) {
    // Written out before anything changes, so CPU tensors are shared, not copied; a model on a
    // GPU is copied to host memory, never to device memory.
    StateDict s;
    s.share_cpu_tensors = true;
    save_model(s, run.model);
    run.optimizer.save_state(s, "optimizer");
    if (run.scheduler) run.scheduler->save_state(s, "scheduler");
    if (run.plateau) run.plateau->save_state(s, "plateau");
    if (run.scaler) run.scaler->save_state(s, "scaler");
    if (run.lookahead) run.lookahead->save_state(s, "lookahead");
    s.set("train.epoch", at.epoch);
    s.set("train.position", at.position);
    s.set("train.step", at.step);
    if (run.loader) {
        s.set("train.loader.images", run.loader->set().n);
        s.set("train.loader.batches", run.loader->num_batches());
        s.set_u64(kLoaderSeed, run.loader->options().seed);  // the data order and augmentations
        // a share of each epoch per rank (chapter 12): only when there are several
        if (run.loader->options().world_size > 1) s.set(kWorldSize, int64_t(run.loader->options().world_size));
    }
    for (const auto& [name, rng] : run.rngs) {
        s.set_u64("train.rng." + name + ".seed", rng->seed_hash());
        s.set_u64("train.rng." + name + ".counter", rng->counter());
    }
    if (run.schedule.epochs > 0) {
        s.set(kScheduleEpochs, run.schedule.epochs);
        s.set(kScheduleLrs, join(lr_texts(run.schedule.epoch_start_lrs)));
    }
    return s;
}

namespace {

// Where the run stopped, every value checked against what this run can mean by it: an epoch of
// the schedule (of at most INT32_MAX without one: the trainers count epochs in an int), a
// position inside the loader's epoch, and no more optimizer steps than batches so far.
ResumePoint resume_point(const StateDict& s, const TrainingRun& run) {
    ResumePoint at;
    at.epoch = s.get_int("train.epoch", 0, run.schedule.epochs > 0 ? run.schedule.epochs : INT32_MAX);
    at.position = s.get_int("train.position", 0, run.loader ? run.loader->size() : INT64_MAX);
    const int64_t batches = run.loader ? run.loader->num_batches() : 0;
    at.step = s.get_int("train.step", 0, run.loader ? (at.epoch + 1) * batches : INT64_MAX);
    return at;
}

// The loader's set and shares must be this run's; then it takes the checkpoint's seed and goes
// to where the run stopped.
void restore_loader(const StateDict& s, DataLoader& loader, const ResumePoint& at) {
    KILN_CHECK(s.get_int("train.loader.images") == loader.set().n &&
                   s.get_int("train.loader.batches") == loader.num_batches(),
               "the checkpoint was trained on ", s.get_string("train.loader.images"), " images in ",
               s.get_string("train.loader.batches"), " batches an epoch; this run has ", loader.set().n, " in ",
               loader.num_batches(), ". Resume with the same --limit and --batch-size");
    const int64_t ranks = s.has(kWorldSize) ? s.get_int(kWorldSize) : 1;
    KILN_CHECK(ranks == loader.options().world_size, "the checkpoint was written by a run of ", ranks,
               " data parallel rank(s); this run has ", loader.options().world_size, ". Resume with mpirun -np ",
               ranks, ": each rank's share of the data depends on it");
    if (s.has(kLoaderSeed)) loader.reseed(s.get_u64(kLoaderSeed));  // (older checkpoints: the flag's)
    loader.start_epoch(at.epoch);
    loader.seek(at.position);
}

}  // namespace

ResumePoint load_checkpoint(const std::string& path, TrainingRun& run) {
    const StateDict s = read_safetensors(path);
    // StateDict's errors name the tensor or value; these add the file.
    return with_hint((" (in checkpoint '" + path + "')").c_str(), [&] {
        load_model(s, run.model);
        if (run.schedule.epochs > 0) check_schedule(s, run.schedule);
        run.optimizer.load_state(s, "optimizer");
        if (run.scheduler) run.scheduler->load_state(s, "scheduler");
        if (run.plateau) run.plateau->load_state(s, "plateau");
        if (run.scaler) run.scaler->load_state(s, "scaler");  // refuses a checkpoint without its state
        if (run.lookahead) run.lookahead->load_state(s, "lookahead");
        KILN_CHECK((run.scaler && run.scaler->enabled()) || !s.has("scaler.scale"), "the checkpoint was trained with loss scaling (a ",
                   "GradScaler, --amp f16) and this run has none. Resume with the --amp it was trained with");
        const ResumePoint at = resume_point(s, run);
        if (run.loader) restore_loader(s, *run.loader, at);
        for (const auto& [name, rng] : run.rngs) {  // the streams go on as they were, whatever this run's seed
            const uint64_t seed = s.get_u64("train.rng." + name + ".seed");
            rng->set_state(seed, s.get_u64("train.rng." + name + ".counter"));
        }
        return at;
    });
}

}  // namespace kiln
