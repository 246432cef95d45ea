// fuzz/safetensors.cpp — libFuzzer harness for the safetensors reader (src/io/safetensors.h),
// which reads every checkpoint: the input is a file's bytes. Anything but a StateDict or a
// kiln::Error naming the file — a crash, a sanitizer report, an allocation past libFuzzer's
// limit — is a finding.
//
//   make fuzz FUZZ_SECONDS=60          # every harness, from the seeds the tests write
//   build-fuzz/fuzz_safetensors build-fuzz/corpus/safetensors    # this one, until stopped
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    try {
        kiln::parse_safetensors(std::vector<uint8_t>(data, data + size), "fuzz.safetensors");
    } catch (const kiln::Error&) {
        // a clear error is the right answer to a bad file
    }
    return 0;
}
