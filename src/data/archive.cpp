// archive.cpp — read_file, gunzip (zlib) and a tar reader. See archive.h.
#include "data/archive.h"

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

std::vector<uint8_t> read_file(const std::string& path) {
    std::error_code ec;
    KILN_CHECK(!std::filesystem::is_directory(path, ec), "cannot read '", path,
               "': it is a directory, a file was expected");
    std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
    KILN_CHECK(f != nullptr, "cannot open '", path, "': ", std::strerror(errno));
    std::vector<uint8_t> bytes;
    // Read in chunks rather than trusting a size from stat(): the file may be a pipe, or may
    // change under us; what we get is what we parse (and every parser checks sizes).
    constexpr size_t kChunk = size_t(1) << 20;
    const uintmax_t hint = std::filesystem::file_size(path, ec);
    if (!ec) bytes.reserve(size_t(hint));
    size_t got = 0;
    for (;;) {
        bytes.resize(got + kChunk);
        const size_t n = std::fread(bytes.data() + got, 1, kChunk, f.get());
        got += n;
        if (n < kChunk) break;
    }
    KILN_CHECK(!std::ferror(f.get()), "error while reading '", path, "' after ", got,
               " bytes: ", std::strerror(errno));
    bytes.resize(got);
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

std::vector<uint8_t> gunzip(const std::vector<uint8_t>& in, const std::string& name) {
    KILN_CHECK(is_gzip(in), "'", name, "' is not a gzip file: it is ", in.size(),
               " bytes long and does not start with the gzip magic bytes 1f 8b");

    z_stream zs{};
    // 16 + MAX_WBITS: expect a gzip header and trailer (zlib then checks the CRC-32 and length).
    KILN_CHECK(inflateInit2(&zs, 16 + MAX_WBITS) == Z_OK, "gunzip '", name,
               "': zlib could not start (out of memory?)");
    struct End {
        z_stream* zs;
        ~End() { inflateEnd(zs); }
    } end{&zs};

    // The gzip trailer stores the uncompressed size mod 2^32 (of the last member): a good
    // first guess for the output buffer. Capped, and grown by doubling when wrong.
    size_t guess = in.size() * 4;
    if (in.size() >= 18) {
        const uint8_t* t = in.data() + in.size() - 4;
        const size_t isize = size_t(t[0]) | size_t(t[1]) << 8 | size_t(t[2]) << 16 | size_t(t[3]) << 24;
        if (isize >= in.size() / 2 && isize <= in.size() * 1100) guess = isize + 1;
    }
    std::vector<uint8_t> out(std::max<size_t>(guess, 4096));

    size_t consumed = 0, produced = 0;
    int members = 1;
    for (;;) {
        if (produced == out.size()) out.resize(out.size() * 2);
        const size_t in_left = in.size() - consumed, out_left = out.size() - produced;
        zs.next_in = const_cast<Bytef*>(in.data() + consumed);
        zs.avail_in = uInt(std::min<size_t>(in_left, UINT_MAX));
        zs.next_out = out.data() + produced;
        zs.avail_out = uInt(std::min<size_t>(out_left, UINT_MAX));
        const uInt avail_in0 = zs.avail_in, avail_out0 = zs.avail_out;
        const int rc = inflate(&zs, Z_NO_FLUSH);
        consumed += avail_in0 - zs.avail_in;
        produced += avail_out0 - zs.avail_out;

        if (rc == Z_STREAM_END) {
            // One gzip member done. Another may follow (`cat a.gz b.gz`); zero padding is
            // tolerated (some tape-era tools add it); anything else is an error.
            const uint8_t* rest = in.data() + consumed;
            const size_t rest_n = in.size() - consumed;
            if (rest_n == 0 || std::all_of(rest, rest + rest_n, [](uint8_t b) { return b == 0; })) break;
            KILN_CHECK(rest_n >= 2 && rest[0] == 0x1f && rest[1] == 0x8b, "'", name, "': ", rest_n,
                       " bytes of unexpected data after the end of gzip member ", members,
                       " (at byte ", consumed, " of ", in.size(), "): the file is corrupt");
            KILN_CHECK(inflateReset(&zs) == Z_OK, "gunzip '", name, "': zlib reset failed");
            ++members;
            continue;
        }
        if (rc == Z_DATA_ERROR || rc == Z_NEED_DICT || rc == Z_STREAM_ERROR) {
            KILN_FAIL("'", name, "' is a corrupt gzip file: zlib says \"", zs.msg ? zs.msg : "invalid data",
                      "\" near compressed byte ", consumed, " of ", in.size(), " (", produced,
                      " bytes decompressed so far)");
        }
        if (rc == Z_MEM_ERROR) KILN_FAIL("gunzip '", name, "': out of memory after ", produced, " bytes");
        // Z_OK or Z_BUF_ERROR: inflate stopped because it ran out of input or of output space.
        // Out of input with the stream not ended means the file was cut short.
        if (zs.avail_out > 0 && consumed == in.size()) {
            KILN_FAIL("'", name, "' is a truncated gzip file: the compressed stream stops after ", in.size(),
                      " bytes (", produced, " bytes decompressed) before its end marker and checksum");
        }
    }
    out.resize(produced);
    out.shrink_to_fit();
    return out;
}

std::vector<uint8_t> maybe_gunzip(std::vector<uint8_t> bytes, const std::string& name) {
    if (is_gzip(bytes)) return gunzip(bytes, name);
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
