// fuzz/archive.cpp — libFuzzer harness for gzip and tar (src/io/archive.h): the input is a
// .tar or .tar.gz file's bytes, inflated (at most 64 MiB) and walked entry by entry. Anything
// but a result or a kiln::Error naming the file is a finding (make fuzz; see fuzz/safetensors.cpp).
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "io/archive.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    try {
        const std::vector<uint8_t> tar =
            kiln::maybe_gunzip(std::vector<uint8_t>(data, data + size), "fuzz.tar.gz", size_t(64) << 20, "64 MiB");
        kiln::read_tar(tar, "fuzz.tar.gz");
    } catch (const kiln::Error&) {
    }
    return 0;
}
