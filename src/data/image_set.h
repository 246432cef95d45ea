// image_set.h — a labelled image data set as the file readers return it (bytes, not floats).
//
// Readers that fill it: load_mnist (idx.h), load_cifar10 (cifar.h). Turning the bytes into
// a float tensor (scaling, normalisation, augmentation) is the loader's job, not the reader's.
//
//   N = number of images, C = channels (1 for MNIST, 3 for CIFAR-10), H, W = height, width
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kiln {

// A labelled image data set held as bytes: N images of C×H×W, row-major NCHW, values 0..255.
struct ImageSet {
    int64_t n = 0, c = 0, h = 0, w = 0;
    std::vector<uint8_t> pixels;       // (N, C, H, W)
    std::vector<int32_t> labels;       // (N), each in [0, classes.size())
    std::vector<std::string> classes;  // class names, index = label
};

}  // namespace kiln
