// text.h — text as tokens, for chapter 14's GPT: a UTF-8 file read and checked, a character-level
// tokenizer, the training/validation split and batches of random windows.
//
//   TextData d = load_text("data/moby-dick/moby-dick.txt");     // 1,190,317 characters, 83 distinct
//   TextWindows train(d.train, 64, 12, seed, "the training split");
//   Tensor x, y;
//   train.batch(k, x, y);        // batch k: x, y i32 [12, 64], y = x shifted left by one token
//   d.tokenizer.decode(...)      // ids back to UTF-8
//
// The tokenizer is nanoGPT's for shakespeare_char: the vocabulary is the set of characters (Unicode
// code points) the text holds, sorted by code point, and a character's id is its rank — Moby-Dick
// has 83 ('\n' is 0, ' ' is 1, ...; the curly quotes and the em dash, beyond ASCII, come last).
// A character-level model has no unknown words and a vocabulary small enough that the embedding
// table is a footnote; the price is that a sequence of T tokens spans only T characters.
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"

namespace kiln {

// The code points of UTF-8 bytes, checked (RFC 3629): a byte that starts no sequence, a sequence
// cut short, an overlong form, a surrogate or a value above U+10FFFF is an error naming `name`,
// the byte offset, the line and column, and the bytes found.
std::u32string decode_utf8(const std::vector<uint8_t>& bytes, const std::string& name);
// The UTF-8 bytes of code points (each a valid scalar value).
std::string encode_utf8(const std::u32string& text);

class CharTokenizer {
public:
    // The characters of `text`, sorted by code point (sorted(set(text)) in Python).
    static CharTokenizer from_text(const std::u32string& text);
    // A vocabulary as save() writes it: {"tokenizer": "char", "code_points": [10, 32, ...]}.
    // A file that cannot be read, or is not one, is an error naming it.
    static CharTokenizer load(const std::string& path);
    // Writes the vocabulary to `path` (to a temporary name, then renamed): a checkpoint's
    // folder keeps it beside the weights, since the ids mean nothing without it.
    void save(const std::string& path) const;
    // The same JSON text as a string, and back (`what` names where it came from in errors).
    std::string to_json() const;
    static CharTokenizer from_json(const std::string& json, const std::string& what);
    // "" if o is the same vocabulary, else where the two first differ, said with their names:
    // "id 17 is 'a' (U+61) in the text, 'b' (U+62) in the checkpoint", or "83 characters in the
    // text, 65 in the checkpoint".
    std::string difference(const CharTokenizer& o, const std::string& name, const std::string& other_name) const;

    int64_t size() const { return int64_t(chars_.size()); }
    const std::u32string& characters() const { return chars_; }
    bool operator==(const CharTokenizer& o) const { return chars_ == o.chars_; }
    bool operator!=(const CharTokenizer& o) const { return !(*this == o); }

    // The id of every character; one that is not in the vocabulary is an error naming it, its
    // position and `what` (a prompt, a file).
    std::vector<int32_t> encode(const std::u32string& text, const std::string& what) const;
    // The characters of ids, as UTF-8; an id outside [0, size()) is an error.
    std::string decode(const int32_t* ids, int64_t n) const;
    std::string decode(const std::vector<int32_t>& ids) const { return decode(ids.data(), int64_t(ids.size())); }

private:
    std::u32string chars_;                         // id -> character, by code point
    std::unordered_map<char32_t, int32_t> ids_;    // character -> id
    explicit CharTokenizer(std::u32string sorted_unique);
};

// A text file as tokens: the tokenizer of its characters, then the first 90% of the tokens for
// training and the last 10% for validation (nanoGPT's split: `n = len(data); train = data[:int(n*0.9)]`).
// limit > 0: only the first `limit` characters of the file (quick runs; the tokenizer is that
// part's). A missing file, an empty one or one that is not UTF-8 is an error naming the file;
// `hint` is appended to a missing file's (what fetches it).
struct TextData {
    CharTokenizer tokenizer;
    std::vector<int32_t> train, val;
    int64_t characters = 0;  // in the part read
};
TextData load_text(const std::string& path, int64_t limit = 0, double val_fraction = 0.1, const std::string& hint = "");

// Batches of random windows of a token sequence (nanoGPT's get_batch): batch k holds B windows of
// T + 1 consecutive tokens, window b starting at
//   offset(k, b) = rng.at(k·B + b) mod (n − T)             n = the sequence's length
// (uniform over [0, n − T − 1], as torch.randint(len(data) − T, (B,)) draws them), and gives
//   x[b, t] = tokens[offset + t]        y[b, t] = tokens[offset + t + 1]       t < T
// so every position of every window is a prediction of the next character. Batch k is a pure
// function of (seed, k): a run resumed at step k draws what it would have drawn. Under data
// parallel training (chapter 12) rank r of p takes windows [r·B/p, (r+1)·B/p) of it: the ranks'
// shares together are the batch one process would draw.
class TextWindows {
public:
    // `tokens` is read, not copied: it must outlive the windows (a TextData's split).
    // A sequence shorter than T + 1 tokens holds no window: an error naming `what` and its length.
    TextWindows(const std::vector<int32_t>& tokens, int64_t block_size, int64_t batch_size, uint64_t seed,
                const std::string& what);
    // x, y: i32 [B, T] (Category::Data) on `device`; or, of a world of several ranks, rank's
    // share [B/world, T] (world must divide B).
    void batch(int64_t k, Tensor& x, Tensor& y, Device device = Device::CPU, int rank = 0, int world = 1) const;
    int64_t offset(int64_t k, int64_t b) const;
    int64_t block_size() const { return T_; }
    int64_t batch_size() const { return B_; }

private:
    const std::vector<int32_t>& tokens_;
    int64_t T_, B_;
    Rng rng_;
};

// The windows of x and y at offsets 0, T, 2T, ... (each T + 1 tokens; the last that fits): the
// whole validation split, in order, for a validation loss that depends on nothing random.
// ordered_window_count gives their number, (n − 1) / T; ordered_windows fills x, y i32 [count, T]
// with windows first .. first + count − 1.
int64_t ordered_window_count(const std::vector<int32_t>& tokens, int64_t block_size);
void ordered_windows(const std::vector<int32_t>& tokens, int64_t block_size, int64_t first, int64_t count, Tensor& x,
                     Tensor& y, Device device = Device::CPU);

}  // namespace kiln
