// fixtures.h — helpers for tests that need small files on disk: a temporary folder removed
// at the end of the test, gzip compression, and a tar writer (so the readers in src/data/
// are tested against archives whose every byte the test controls); and, for the CUDA kernel
// tests, a run under each schedule of the kernel emulator.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"

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

// A CPU f32 tensor of `shape` holding `values` (row-major), moved to `device`.
Tensor tensor_of(const Shape& shape, const std::vector<float>& values, Device device = Device::CPU);

// Runs f under each schedule the kernel emulator offers for a test: the threads of a block in
// order, in reverse, then shuffled (a seeded random order, new at every barrier) between
// barriers. A kernel missing a __syncthreads() reads shared memory before or after another
// thread writes it; in order hides reads of lower threads' words, reversed hides reads of higher
// ones, shuffled mixes both within one block. The schedule's name is the Catch2 context. With
// make CUDA=1, once, on the GPU.
void under_schedules(const std::function<void()>& f);

// A device result against the CPU's (both any device; compared on the CPU), REQUIREd, with the
// number of mismatches and the first one in the failure message:
//   require_close      f32, |got − want| ≤ tol · max |want| + abs for every element (a sum taken
//                      in another order is off by a few ulps of its largest terms; abs for
//                      functions accurate to an absolute error); NaN matches NaN
//   require_identical  the same bytes (any dtype): for kernels that must match bit for bit
void require_close(const Tensor& got, const Tensor& want, double tol, double abs = 0.0);
void require_identical(const Tensor& got, const Tensor& want);

// What a tolerance needs from a 16-bit format (chapter 09's tests), read off float_format
// (core/dtype.h): u the unit roundoff, half the distance from 1 to the next value (f16 2^-11,
// bf16 2^-8); tiny half the smallest subnormal (f16 2^-25, bf16 2^-134).
struct LowFormat {
    DType dtype;
    double u;
    double tiny;
};
LowFormat low_format(DType t);

}  // namespace kiln::test
