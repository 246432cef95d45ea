// archive.cpp — read_file, gunzip (zlib) and a tar reader. See archive.h.
#include "io/archive.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "core/error.h"

namespace kiln {

// --- read_file ---------------------------------------------------------------------------

// What a path that is not a regular file (nor a pipe) is, for the error: "/dev/zero" is a
// character device, whose "contents" never end.
static const char* special_kind(const std::filesystem::file_status& st) {
    namespace fs = std::filesystem;
    switch (st.type()) {
        case fs::file_type::character: return "a character device";
        case fs::file_type::block: return "a block device";
        case fs::file_type::socket: return "a socket";
        default: return nullptr;
    }
}

std::vector<uint8_t> read_file(const std::string& path) {
    std::error_code ec;
    const std::filesystem::file_status st = std::filesystem::status(path, ec);
    KILN_CHECK(!std::filesystem::is_directory(st), "cannot read '", path, "': it is a directory, a file was expected");
    const char* kind = special_kind(st);
    KILN_CHECK(!kind, "cannot read '", path, "': it is ", kind, ", not a file");
    std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
    KILN_CHECK(f != nullptr, "cannot open '", path, "': ", std::strerror(errno));
    // Read in chunks rather than trusting a size from stat(): the file may be a pipe, or may
    // change under us; what we get is what we parse (and every parser checks sizes). Each chunk
    // lands in a buffer that is never zero-filled, and only the bytes read are appended.
    constexpr size_t kChunk = size_t(1) << 16;
    const std::unique_ptr<uint8_t[]> chunk(new uint8_t[kChunk]);
    std::vector<uint8_t> bytes;
    try {
        const uintmax_t size = std::filesystem::is_regular_file(st) ? std::filesystem::file_size(path, ec) : 0;
        if (!ec && size > 0) bytes.reserve(size_t(size));
        for (size_t n; (n = std::fread(chunk.get(), 1, kChunk, f.get())) > 0;) bytes.insert(bytes.end(), chunk.get(), chunk.get() + n);
    } catch (const std::bad_alloc&) {
        KILN_FAIL("cannot read '", path, "': not enough memory for it (", bytes.size(), " bytes read so far)");
    }
    KILN_CHECK(!std::ferror(f.get()), "error while reading '", path, "' after ", bytes.size(),
               " bytes: ", std::strerror(errno));
    return bytes;
}

int write_file(const std::string& path, const std::string& text) {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) return errno;
    int err = std::fwrite(text.data(), 1, text.size(), f) == text.size() && std::fflush(f) == 0 ? 0 : errno;
    if (std::fclose(f) != 0 && err == 0) err = errno;
    return err;
}

// --- gzip --------------------------------------------------------------------------------

bool is_gzip(const std::vector<uint8_t>& bytes) {
    return bytes.size() >= 2 && bytes[0] == 0x1f && bytes[1] == 0x8b;
}

namespace {

// A gzip stream read piece by piece (RFC 1952; several members one after another are one
// stream, as gzip itself reads them). Every failure is a kiln::Error naming the file.
class Inflater {
public:
    Inflater(const std::vector<uint8_t>& in, const std::string& name) : in_(in), name_(name) {
        KILN_CHECK(is_gzip(in), "'", name, "' is not a gzip file: it is ", in.size(),
                   " bytes long and does not start with the gzip magic bytes 1f 8b");
        // 16 + MAX_WBITS: expect a gzip header and trailer (zlib then checks the CRC-32 and length).
        KILN_CHECK(inflateInit2(&zs_, 16 + MAX_WBITS) == Z_OK, "gunzip '", name, "': zlib could not start (out of memory?)");
    }
    ~Inflater() { inflateEnd(&zs_); }
    Inflater(const Inflater&) = delete;
    Inflater& operator=(const Inflater&) = delete;

    // Up to n decompressed bytes into out; fewer only at the end of the stream (0: ended).
    size_t read(uint8_t* out, size_t n) {
        size_t got = 0;
        while (got < n && !ended_) {
            zs_.next_in = const_cast<Bytef*>(in_.data() + consumed_);
            zs_.avail_in = uInt(std::min<size_t>(in_.size() - consumed_, UINT_MAX));
            zs_.next_out = out + got;
            zs_.avail_out = uInt(std::min<size_t>(n - got, UINT_MAX));
            const uInt avail_in0 = zs_.avail_in, avail_out0 = zs_.avail_out;
            const int rc = inflate(&zs_, Z_NO_FLUSH);
            consumed_ += avail_in0 - zs_.avail_in;
            got += avail_out0 - zs_.avail_out;
            produced_ += avail_out0 - zs_.avail_out;
            if (rc == Z_STREAM_END) {
                next_member();
                continue;
            }
            if (rc == Z_DATA_ERROR || rc == Z_NEED_DICT || rc == Z_STREAM_ERROR) {
                KILN_FAIL("'", name_, "' is a corrupt gzip file: zlib says \"", zs_.msg ? zs_.msg : "invalid data",
                          "\" near compressed byte ", consumed_, " of ", in_.size(), " (", produced_,
                          " bytes decompressed so far)");
            }
            if (rc == Z_MEM_ERROR) KILN_FAIL("gunzip '", name_, "': out of memory after ", produced_, " bytes");
            // Z_OK or Z_BUF_ERROR: inflate stopped because it ran out of input or of output space.
            // Out of input with the stream not ended means the file was cut short.
            if (zs_.avail_out > 0 && consumed_ == in_.size()) {
                KILN_FAIL("'", name_, "' is a truncated gzip file: the compressed stream stops after ", in_.size(),
                          " bytes (", produced_, " bytes decompressed) before its end marker and checksum");
            }
        }
        return got;
    }
    size_t produced() const { return produced_; }

private:
    // One gzip member done. Another may follow (`cat a.gz b.gz`); zero padding is tolerated
    // (some tape-era tools add it); anything else is an error.
    void next_member() {
        const uint8_t* rest = in_.data() + consumed_;
        const size_t rest_n = in_.size() - consumed_;
        if (rest_n == 0 || std::all_of(rest, rest + rest_n, [](uint8_t b) { return b == 0; })) {
            ended_ = true;
            return;
        }
        KILN_CHECK(rest_n >= 2 && rest[0] == 0x1f && rest[1] == 0x8b, "'", name_, "': ", rest_n,
                   " bytes of unexpected data after the end of gzip member ", members_, " (at byte ", consumed_,
                   " of ", in_.size(), "): the file is corrupt");
        KILN_CHECK(inflateReset(&zs_) == Z_OK, "gunzip '", name_, "': zlib reset failed");
        ++members_;
    }

    const std::vector<uint8_t>& in_;
    const std::string& name_;
    z_stream zs_{};
    size_t consumed_ = 0, produced_ = 0;
    int members_ = 1;
    bool ended_ = false;
};

}  // namespace

// The output grows as data arrives (doubling from a few times the input), never past max_out + 1
// bytes: the size in the gzip trailer is not trusted (a truncated file's last four bytes are any
// four bytes, and a small stream can claim or hold gigabytes).
std::vector<uint8_t> gunzip(const std::vector<uint8_t>& in, const std::string& name, size_t max_out,
                            const std::string& limit) {
    Inflater z(in, name);
    const size_t cap = max_out == SIZE_MAX ? max_out : max_out + 1;  // one byte more tells "too long"
    std::vector<uint8_t> out;
    size_t produced = 0;
    try {
        for (;;) {
            if (produced == out.size()) {
                if (out.size() == cap) break;
                const size_t grown = out.empty() ? std::max<size_t>(in.size() * 4, 1 << 16) : out.size() * 2;
                out.resize(std::min(grown < out.size() ? cap : grown, cap));
            }
            const size_t n = z.read(out.data() + produced, out.size() - produced);
            if (n == 0) break;
            produced += n;
        }
    } catch (const std::bad_alloc&) {
        KILN_FAIL("gunzip '", name, "': not enough memory for its data (", produced, " bytes decompressed so far)");
    }
    KILN_CHECK(produced <= max_out, "'", name, "' decompresses to more than ", max_out, " bytes, ", limit,
               ": the file is corrupt, or not the one expected");
    out.resize(produced);
    out.shrink_to_fit();
    return out;
}

std::vector<uint8_t> gunzip_head(const std::vector<uint8_t>& in, const std::string& name, size_t n) {
    Inflater z(in, name);
    std::vector<uint8_t> head(n);
    head.resize(z.read(head.data(), n));
    return head;
}

std::vector<uint8_t> maybe_gunzip(std::vector<uint8_t> bytes, const std::string& name, size_t max_out,
                                  const std::string& limit) {
    if (is_gzip(bytes)) return gunzip(bytes, name, max_out, limit);
    return bytes;
}

// --- tar ---------------------------------------------------------------------------------
//
// A tar archive is a sequence of 512-byte blocks: a header block, then the entry's contents
// padded up to a multiple of 512, then the next header ... and two all-zero blocks at the end.
// Header fields used here (offset, length), numbers are ASCII octal:
//   name (0,100)  size (124,12)  chksum (148,8)  typeflag (156,1)  magic (257,6) "ustar"
//   prefix (345,155) — ustar: the full path is prefix + "/" + name
namespace {

constexpr size_t kBlock = 512;

// A NUL-terminated (or full-length) text field.
std::string field_str(const uint8_t* h, size_t off, size_t len) {
    const char* p = reinterpret_cast<const char*>(h + off);
    return std::string(p, strnlen(p, len));
}

// An octal number field: optional leading spaces, octal digits, then NUL or space. GNU tar
// stores sizes >= 8 GiB in base-256 (high bit of the first byte set); accepted too.
bool field_num(const uint8_t* h, size_t off, size_t len, uint64_t* value) {
    const uint8_t* p = h + off;
    uint64_t v = 0;
    if (p[0] & 0x80) {
        for (size_t i = 1; i < len; ++i) {
            if (v >> 55) return false;  // would overflow
            v = (v << 8) | p[i];
        }
        *value = v;
        return (p[0] & 0x7f) == 0;
    }
    size_t i = 0;
    while (i < len && p[i] == ' ') ++i;
    size_t digits = 0;
    for (; i < len && p[i] >= '0' && p[i] <= '7'; ++i, ++digits) v = (v << 3) | uint64_t(p[i] - '0');
    for (; i < len; ++i)
        if (p[i] != ' ' && p[i] != 0) return false;
    *value = v;
    return digits > 0;
}

// The header checksum: the sum of all 512 bytes with the chksum field counted as 8 spaces.
// Historic tars summed signed chars; either sum is accepted, as GNU tar does.
bool checksum_ok(const uint8_t* h, uint64_t stored) {
    uint64_t u = 0;
    int64_t s = 0;
    for (size_t i = 0; i < kBlock; ++i) {
        const bool in_field = i >= 148 && i < 156;
        u += in_field ? uint8_t(' ') : h[i];
        s += in_field ? int8_t(' ') : int8_t(h[i]);
    }
    return stored == u || int64_t(stored) == s;
}

// Pax extended header records: "<len> <key>=<value>\n", <len> counting the whole record.
// Returns the value of `path`, or "" when there is none.
std::string pax_path(const uint8_t* p, size_t n, const std::string& name, size_t at) {
    std::string path;
    size_t i = 0;
    while (i < n) {
        if (p[i] == 0) break;  // padding
        size_t len = 0, j = i;
        while (j < n && j - i < 12 && p[j] >= '0' && p[j] <= '9') len = len * 10 + size_t(p[j++] - '0');
        KILN_CHECK(j < n && p[j] == ' ' && len > j - i && len <= n - i, "'", name,
                   "': malformed pax extended header at byte ", at, " (bad record length)");
        const std::string rec(reinterpret_cast<const char*>(p + j + 1), len - (j + 1 - i));
        const size_t eq = rec.find('=');
        KILN_CHECK(eq != std::string::npos && !rec.empty() && rec.back() == '\n', "'", name,
                   "': malformed pax extended header at byte ", at, " (record without key=value)");
        if (rec.compare(0, eq, "path") == 0 && eq == 4) path = rec.substr(eq + 1, rec.size() - eq - 2);
        i += len;
    }
    return path;
}

}  // namespace

std::vector<TarMember> list_tar(const std::vector<uint8_t>& bytes, const std::string& name) {
    std::vector<TarMember> entries;
    std::string long_name;  // from a GNU 'L' entry or a pax 'x' header, for the next entry
    size_t pos = 0;
    for (;;) {
        KILN_CHECK(pos + kBlock <= bytes.size(), "'", name, "' is a truncated tar archive: it stops at byte ",
                   bytes.size(), " where a ", kBlock, "-byte header (or the end-of-archive marker) was expected at byte ",
                   pos, " (", entries.size(), " files read so far)");
        const uint8_t* h = bytes.data() + pos;
        if (std::all_of(h, h + kBlock, [](uint8_t b) { return b == 0; })) break;  // end of archive

        uint64_t size = 0, chksum = 0;
        std::string path = field_str(h, 0, 100);
        KILN_CHECK(field_num(h, 148, 8, &chksum) && checksum_ok(h, chksum), "'", name,
                   "' is not a valid tar archive or is corrupt: the header block at byte ", pos, " (after ",
                   entries.size(), " files) has a wrong checksum");
        KILN_CHECK(field_num(h, 124, 12, &size), "'", name, "': the header at byte ", pos, " (entry '", path,
                   "') has an unreadable size field");
        const size_t data_at = pos + kBlock;
        KILN_CHECK(size <= bytes.size() - data_at, "'", name, "' is a truncated tar archive: entry '", path,
                   "' at byte ", pos, " needs ", size, " bytes but only ", bytes.size() - data_at, " remain");
        const uint8_t* data = bytes.data() + data_at;
        const char type = char(h[156]);

        if (std::memcmp(h + 257, "ustar", 5) == 0) {
            const std::string prefix = field_str(h, 345, 155);
            if (!prefix.empty()) path = prefix + "/" + path;
        }
        if (type == 'L') {  // GNU long name: the contents are the next entry's path
            long_name = std::string(reinterpret_cast<const char*>(data), strnlen(reinterpret_cast<const char*>(data), size));
        } else if (type == 'x') {  // pax extended header for the next entry
            std::string p = pax_path(data, size_t(size), name, pos);
            if (!p.empty()) long_name = std::move(p);
        } else if (type == 'g' || type == 'K') {
            // pax global header, GNU long link name: nothing a data set reader needs.
        } else {
            if (!long_name.empty()) path = std::move(long_name);
            long_name.clear();
            if (type == '0' || type == '\0' || type == '7') {  // regular file (7: contiguous)
                entries.push_back({path, data_at, size_t(size)});
            }
            // Anything else (directories '5', links '1'/'2', devices, FIFOs) has no contents
            // a data set reader could use: skipped.
        }
        const size_t padded = (size_t(size) + kBlock - 1) / kBlock * kBlock;
        pos = data_at + std::min(padded, bytes.size() - data_at);
    }
    return entries;
}

std::vector<TarEntry> read_tar(const std::vector<uint8_t>& bytes, const std::string& name) {
    std::vector<TarEntry> entries;
    for (const TarMember& m : list_tar(bytes, name)) {
        const auto from = bytes.begin() + ptrdiff_t(m.offset);
        entries.push_back({m.path, std::vector<uint8_t>(from, from + ptrdiff_t(m.size))});
    }
    return entries;
}

}  // namespace kiln
