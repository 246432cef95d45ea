// fuzz/cifar.cpp — libFuzzer harness for the CIFAR-10 formats (src/data/cifar.h): the input is
// an archive's bytes (.tar or .tar.gz) holding the binary batches, image folders of JPEG/PNG, or
// the PNG sprites with their JSON labels; both splits are read. Anything but a result or a
// kiln::Error naming the file is a finding (make fuzz; see fuzz/safetensors.cpp).
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "data/cifar.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    for (bool train : {true, false}) {
        try {
            kiln::load_cifar10_archive(std::vector<uint8_t>(data, data + size), "fuzz.tar.gz", train);
        } catch (const kiln::Error&) {
        }
    }
    return 0;
}
