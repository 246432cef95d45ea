// idx.h — the IDX file format of MNIST (and Fashion-MNIST), plain or gzip-compressed.
//
// An IDX file is a big-endian header, then raw bytes:
//   images:  magic 2051 (0x00000803: u8 data, 3 dims) | N | H | W | N*H*W pixels, 0..255
//   labels:  magic 2049 (0x00000801: u8 data, 1 dim)  | N | N labels
// The readers check the magic number, the dimensions, and that the payload is exactly the
// size the header announces. Compressed or not is decided by the gzip magic bytes, not by
// the file name; a gzip stream is inflated no further than the size the header announces. Any problem throws kiln::Error naming the file, what was expected and what
// was found, and saying to run `make data` (which fetches the files again and verifies them).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/image_set.h"

namespace kiln {

// Pixels of an IDX image file: (N, H, W), row-major.
struct IdxImages {
    int64_t n = 0, h = 0, w = 0;
    std::vector<uint8_t> pixels;  // (N, H, W)
};

IdxImages read_idx_images(const std::string& path);             // magic 2051
std::vector<uint8_t> read_idx_labels(const std::string& path);  // magic 2049, N labels
// The same from a file's bytes (plain or gzip), `name` naming it in the errors (which do not say
// `make data`): for a reader fed from memory, as the fuzzers are (fuzz/).
IdxImages idx_images_from(std::vector<uint8_t> file, const std::string& name);
std::vector<uint8_t> idx_labels_from(std::vector<uint8_t> file, const std::string& name);

// MNIST from a folder holding train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz],
// t10k-images-idx3-ubyte[.gz], t10k-labels-idx1-ubyte[.gz] (as `make data` puts them in
// data/mnist/). train = true: the 60,000 training images, false: the 10,000 test images.
// Returns N×1×28×28 pixels, labels 0..9, classes "0".."9". Checks that the image and label
// files agree on N and that every label is a digit.
ImageSet load_mnist(const std::string& dir, bool train);

}  // namespace kiln
