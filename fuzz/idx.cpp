// fuzz/idx.cpp — libFuzzer harness for the MNIST readers (src/data/idx.h): the input is an IDX
// file's bytes, plain or gzip, read as an image file and as a label file. Anything but a result
// or a kiln::Error naming the file is a finding (make fuzz; see fuzz/safetensors.cpp).
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "data/idx.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::vector<uint8_t> file(data, data + size);
    try {
        kiln::idx_images_from(file, "fuzz-images-idx3-ubyte");
    } catch (const kiln::Error&) {
    }
    try {
        kiln::idx_labels_from(file, "fuzz-labels-idx1-ubyte");
    } catch (const kiln::Error&) {
    }
    return 0;
}
