// archive.h — whole-file reading, gzip decompression and a minimal tar reader.
//
// Data sets arrive as .gz files (MNIST) and .tar.gz archives (CIFAR-10). These helpers read
// them into memory and never trust the bytes: every size is checked before it is used, so
// a truncated or corrupt file gives a kiln::Error naming the file, never a crash.
//
//   auto bytes   = read_file("data/cifar10/cifar10-jpg.tar.gz");
//   auto tarball = gunzip(bytes, "data/cifar10/cifar10-jpg.tar.gz");
//   for (const TarEntry& e : read_tar(tarball, "cifar10-jpg.tar.gz")) use(e.path, e.data);
//
// The messages say what is wrong and with which file; callers that know where the file
// came from (the data set readers) add the hint ("run `make data`").
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"

namespace kiln {

// The whole file as bytes. Throws kiln::Error naming the path if it cannot be opened or read,
// if it is a device rather than a file (/dev/zero never ends), or if memory runs out.
std::vector<uint8_t> read_file(const std::string& path);

// Writes `text` to the file at `path` (created or replaced). Returns 0, or the errno of what
// failed (no such folder, permission, disk full): the caller's message names the reason with
// std::strerror, which a std::ofstream loses.
int write_file(const std::string& path, const std::string& text);

// True when bytes start with the gzip magic number 1f 8b.
bool is_gzip(const std::vector<uint8_t>& bytes);

// Inflates a gzip stream (RFC 1952; several members one after another are concatenated, as
// gzip itself does). `name` is used in error messages: corrupt data, bad CRC, truncation. At
// most max_out bytes come out: a stream that holds more is an error, which says `limit` (why
// no more can be right: "the size its IDX header announces"). The output buffer grows as the
// data arrives, so memory follows what the stream really holds, never what its trailer claims.
std::vector<uint8_t> gunzip(const std::vector<uint8_t>& bytes, const std::string& name, size_t max_out = SIZE_MAX,
                            const std::string& limit = "");

// The first n bytes of the decompressed stream (fewer if it is shorter): a header that says how
// long the rest may be, before anything else is decompressed.
std::vector<uint8_t> gunzip_head(const std::vector<uint8_t>& bytes, const std::string& name, size_t n);

// gunzip(bytes, ...) when bytes start with the gzip magic, otherwise bytes unchanged (moved).
std::vector<uint8_t> maybe_gunzip(std::vector<uint8_t> bytes, const std::string& name, size_t max_out = SIZE_MAX,
                                  const std::string& limit = "");

// One regular file inside a tar archive.
struct TarEntry {
    std::string path;           // as stored, e.g. "cifar-10-batches-bin/data_batch_1.bin"
    std::vector<uint8_t> data;  // its contents
};

// Reads a tar archive (POSIX ustar / GNU / pax): 512-byte headers with octal sizes and a
// checksum, contents padded to 512 bytes, two zero blocks at the end. Long names from GNU
// `././@LongLink` entries, pax `path=` records and the ustar prefix field are honoured.
// Only regular files are returned (directories, links, pax headers are skipped), in archive
// order. Throws kiln::Error naming `name` on a bad checksum or a truncated archive.
std::vector<TarEntry> read_tar(const std::vector<uint8_t>& bytes, const std::string& name);

// The same walk without copying: where each regular file's contents lie in `bytes`
// ([offset, offset + size)), valid as long as `bytes` is. For big archives (CIFAR-10 as
// 60,000 JPEGs) this saves a copy of every file.
struct TarMember {
    std::string path;
    size_t offset = 0, size = 0;
};
std::vector<TarMember> list_tar(const std::vector<uint8_t>& bytes, const std::string& name);

// Runs f(); a kiln::Error escaping it gets `hint` (what to run to fix the data) appended.
// Out-of-memory errors pass unchanged: re-fetching would not help them.
template <typename F>
auto with_hint(const char* hint, F f) -> decltype(f()) {
    try {
        return f();
    } catch (const OutOfMemory&) {
        throw;
    } catch (const Error& e) {
        throw Error(std::string(e.what()) + hint);
    }
}

}  // namespace kiln
