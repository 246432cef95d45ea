// fixtures.h — helpers for tests that need small files on disk: a temporary folder removed
// at the end of the test, gzip compression, and a tar writer (so the readers in src/data/
// are tested against archives whose every byte the test controls).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kiln::test {

// A fresh folder under $TMPDIR (or /tmp), deleted with everything in it on destruction.
struct TempDir {
    TempDir();
    ~TempDir();
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
    std::string file(const std::string& name) const;  // path + "/" + name
    std::string path;
};

// Writes bytes to path, creating parent folders.
void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes);

// gzip (RFC 1952) of raw, as `gzip -c` would write it.
std::vector<uint8_t> gzip_bytes(const std::vector<uint8_t>& raw);

// One tar entry to write. type: '0' file, '5' directory, 'x' pax header (data = records).
struct TarFile {
    std::string path;
    std::vector<uint8_t> data;
    char type = '0';
};

// A ustar archive of files, with the two zero blocks at the end. A path longer than 99
// bytes is written the GNU way: a `././@LongLink` entry holding it, then the entry.
std::vector<uint8_t> make_tar(const std::vector<TarFile>& files);

// Bytes of a string (for text files in archives).
std::vector<uint8_t> bytes_of(const std::string& s);

}  // namespace kiln::test
