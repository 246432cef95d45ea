// fuzz/image.cpp — libFuzzer harness for the JPEG and PNG decoder (stb_image behind
// src/data/image_decode.h), which every CIFAR-10 image folder goes through: the input is an
// image file's bytes. Pixels or a reason are the answers; a crash or a sanitizer report (stb's
// own overflow, nothings/stb#1533, included — image_decode.cpp is built to survive it) is a
// finding (make fuzz; see fuzz/safetensors.cpp).
#include <cstdint>
#include <string>

#include "data/image_decode.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    int w = 0, h = 0;
    std::string why;
    kiln::decode_rgb_image(data, size, w, h, why);
    return 0;
}
