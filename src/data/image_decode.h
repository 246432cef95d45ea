// image_decode.h — JPEG and PNG bytes to RGB pixels, with stb_image (Debian's libstb-dev, 2.27).
//
//   int w, h; std::string why;
//   ImagePixels px = decode_rgb_image(bytes, size, w, h, why);   // H×W×3, or null and why
//
// stb_image is compiled into image_decode.cpp alone, with flags of its own (Makefile), because
// five of its faults are known and the file works around them:
//   - its JPEG decoder trusts a Huffman table's code counts: a table of more than 256 codes
//     makes it write past its tables. Such a table is invalid JPEG, so decode_rgb_image walks
//     the file's markers first and refuses it.
//   - it decodes a scan whose Huffman or quantization table the file never defined with what
//     its memory held (a symbol index out of its table). Also invalid JPEG: refused the same way.
//   - its PNG decoder trusts a chunk's length: it allocates what the chunk claims before it
//     reads, gigabytes for a file of a few bytes. decode_rgb_image walks the chunks first and
//     refuses one longer than the file.
//   - an empty IDAT chunk before the image data has it copy 0 bytes to a null pointer. Such a
//     chunk is valid and empty: decode_rgb_image hands stb the file without it.
//   - a crafted JPEG overflows a signed int in stbi__jpeg_decode_block (dc · dequant[0];
//     nothings/stb#1533, still open), undefined behaviour that the sanitizer build (make
//     test SAN=1) and the fuzzers stop on. image_decode.cpp is compiled with -fwrapv (the
//     product wraps, the decoder goes on and gives wrong pixels or an error, never a crash),
//     and without UBSan's signed-overflow check, for stb's code only.
// A damaged image is an error the caller names ("cannot decode image ..."), in any build.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace kiln {

// stb's pixels, freed by stb's own free.
using ImagePixels = std::unique_ptr<uint8_t, void (*)(void*)>;

// Decodes a JPEG or PNG file's bytes into interleaved RGB (H×W×3, 3 channels whatever the
// file has), its size into w and h. On failure the pixels are null and `why` says what was
// wrong ("a Huffman table has more than 256 codes", stb's reason), for the caller's message.
// An image of more than 2^24 pixels (a CIFAR-10 sprite has 1024 × 10,000) is refused before
// stb allocates anything for it.
ImagePixels decode_rgb_image(const uint8_t* bytes, size_t size, int& w, int& h, std::string& why);

}  // namespace kiln
