// idx.cpp — IDX readers and load_mnist. See idx.h for the format.
#include "data/idx.h"

#include <cstdint>
#include <filesystem>

#include "core/error.h"
#include "io/archive.h"

namespace kiln {

namespace {

constexpr const char* kHint = ". Run `make data` to fetch the data again and verify it (checksums).";

uint32_t be32(const uint8_t* p) {
    return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | uint32_t(p[3]);
}

const char* describe_magic(uint32_t magic) {
    if (magic == 2051) return " (an IDX image file)";
    if (magic == 2049) return " (an IDX label file)";
    if ((magic >> 16) == 0x1f8b) return " (gzip data inside gzip data?)";
    return " (not an IDX file)";
}

// The header's checks: the magic number, and the header's size.
void check_header(const std::string& path, const std::vector<uint8_t>& bytes, uint32_t magic, uint32_t dims,
                  const char* what) {
    const size_t header = 4 + 4 * size_t(dims);
    KILN_CHECK(bytes.size() >= 4, "'", path, "' is too short to be an IDX ", what, " file: ", bytes.size(),
               " bytes, expected at least ", header);
    const uint32_t found = be32(bytes.data());
    KILN_CHECK(found == magic, "'", path, "' is not an IDX ", what, " file: expected the magic number ", magic,
               " (big-endian 0x0000080", dims, "), found ", found, describe_magic(found));
    KILN_CHECK(bytes.size() >= header, "'", path, "' is truncated: ", bytes.size(), " bytes, the IDX ", what,
               " header alone needs ", header);
}

// The size of the file the header announces: the header, then one byte per entry (the product
// of the dims, each < 2^32; saturated at SIZE_MAX, which no file reaches).
size_t announced_size(const std::vector<uint8_t>& header, uint32_t dims) {
    size_t size = 1;
    for (uint32_t d = 0; d < dims; d++) {
        const size_t n = be32(&header[4 + 4 * size_t(d)]);
        size = n != 0 && size > SIZE_MAX / n ? SIZE_MAX : size * n;
    }
    const size_t header_size = 4 + 4 * size_t(dims);
    return size > SIZE_MAX - header_size ? SIZE_MAX : size + header_size;
}

// The file's bytes, inflated if gzip, with its header checked. A gzip stream is inflated no
// further than the size its header announces: a damaged stream (or a trailer that lies) costs no
// more memory than the data set it claims to be.
std::vector<uint8_t> idx_bytes(std::vector<uint8_t> bytes, const std::string& path, uint32_t magic, uint32_t dims,
                               const char* what) {
    if (is_gzip(bytes)) {
        const std::vector<uint8_t> head = gunzip_head(bytes, path, 4 + 4 * size_t(dims));
        check_header(path, head, magic, dims, what);
        bytes = gunzip(bytes, path, announced_size(head, dims), "the size its IDX header announces (extra data)");
    }
    check_header(path, bytes, magic, dims, what);
    return bytes;
}

IdxImages parse_images(std::vector<uint8_t> file, const std::string& path) {
    const std::vector<uint8_t> bytes = idx_bytes(std::move(file), path, 2051, 3, "image");
    const uint64_t n = be32(&bytes[4]), h = be32(&bytes[8]), w = be32(&bytes[12]);
    KILN_CHECK(h > 0 && w > 0 && h <= 65536 && w <= 65536, "'", path, "': the IDX header gives an image size of ",
               h, "x", w, ", expected a positive size such as 28x28");
    const uint64_t have = bytes.size() - 16, want = n * h * w;  // n < 2^32, h*w <= 2^32: no overflow
    KILN_CHECK(have == want, "'", path, "': the IDX header announces ", n, " images of ", h, "x", w, " = ", want,
               " bytes of pixels, but the file holds ", have, have < want ? " (truncated)" : " (extra data)");
    IdxImages img;
    img.n = int64_t(n);
    img.h = int64_t(h);
    img.w = int64_t(w);
    img.pixels.assign(bytes.begin() + 16, bytes.end());
    return img;
}

std::vector<uint8_t> parse_labels(std::vector<uint8_t> file, const std::string& path) {
    const std::vector<uint8_t> bytes = idx_bytes(std::move(file), path, 2049, 1, "label");
    const uint64_t n = be32(&bytes[4]), have = bytes.size() - 8;
    KILN_CHECK(have == n, "'", path, "': the IDX header announces ", n, " labels, but the file holds ", have,
               have < n ? " (truncated)" : " (extra data)");
    return std::vector<uint8_t>(bytes.begin() + 8, bytes.end());
}

// dir/base.gz, else dir/base, else the dotted spelling some mirrors use (train-images.idx3-ubyte).
std::string find_idx_file(const std::string& dir, const std::string& base) {
    std::string dotted = base;
    dotted[dotted.rfind("-idx")] = '.';
    const std::filesystem::path d(dir);
    std::string tried;
    for (const std::string& name : {base + ".gz", base, dotted + ".gz", dotted}) {
        const std::string p = (d / name).string();
        std::error_code ec;
        if (std::filesystem::is_regular_file(p, ec)) return p;
        tried += (tried.empty() ? "'" : ", '") + p + "'";
    }
    std::error_code ec;
    KILN_CHECK(std::filesystem::is_directory(dir, ec), "MNIST folder '", dir, "' does not exist (looking for '",
               base, ".gz')");
    KILN_FAIL("MNIST file not found: looked for ", tried);
}

}  // namespace

IdxImages read_idx_images(const std::string& path) {
    return with_hint(kHint, [&] { return parse_images(read_file(path), path); });
}

std::vector<uint8_t> read_idx_labels(const std::string& path) {
    return with_hint(kHint, [&] { return parse_labels(read_file(path), path); });
}

IdxImages idx_images_from(std::vector<uint8_t> file, const std::string& name) {
    return parse_images(std::move(file), name);
}

std::vector<uint8_t> idx_labels_from(std::vector<uint8_t> file, const std::string& name) {
    return parse_labels(std::move(file), name);
}

ImageSet load_mnist(const std::string& dir, bool train) {
    return with_hint(kHint, [&] {
        const std::string split = train ? "train" : "t10k";
        const std::string images_path = find_idx_file(dir, split + "-images-idx3-ubyte");
        const std::string labels_path = find_idx_file(dir, split + "-labels-idx1-ubyte");
        IdxImages img = parse_images(read_file(images_path), images_path);
        std::vector<uint8_t> lab = parse_labels(read_file(labels_path), labels_path);
        KILN_CHECK(int64_t(lab.size()) == img.n, "MNIST ", train ? "training" : "test", " files disagree: '",
                   images_path, "' holds ", img.n, " images but '", labels_path, "' holds ", lab.size(),
                   " labels");
        ImageSet set;
        set.n = img.n;
        set.c = 1;
        set.h = img.h;
        set.w = img.w;
        set.pixels = std::move(img.pixels);
        set.labels.resize(lab.size());
        for (size_t i = 0; i < lab.size(); ++i) {
            KILN_CHECK(lab[i] <= 9, "'", labels_path, "': label ", int(lab[i]), " of image ", i,
                       " is not a digit 0..9");
            set.labels[i] = lab[i];
        }
        for (int d = 0; d < 10; ++d) set.classes.push_back(std::to_string(d));
        return set;
    });
}

}  // namespace kiln
