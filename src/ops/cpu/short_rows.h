// short_rows.h — loops over the short rows of small planes (3 to 32 values: a 7×7 plane, a
// 31-wide row, LeNet's 8-wide rows), where a vectorized loop of 16 lanes (AVX-512) never fills a
// vector and its scalar remainder does all the work. Two ways round it, both exact:
//   copy_short_rows rows copied by fixed-size moves, the last overlapping the one before (as
//                   memcpy does small sizes), inline;
//   for_blocks      a loop body run on blocks of 8 (or 4) values, the last block moved back so
//                   that it ends at the row's end, overlapping the one before: for bodies that
//                   write what they read from elsewhere, so that writing a value twice is harmless.
// Used by im2col (conv.cpp), Winograd's transforms (winograd.cpp) and 2×2 max pooling (pool.cpp).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>

namespace kiln::cpu {

// A short row of bytes d[0 .. bytes) = s[0 .. bytes), bytes ≥ kBytes, as memcpy does small sizes:
// moves of kBytes, the last one overlapping the one before (12 bytes by 8: bytes 0–7, then 4–11).
// An inline copy beats a call to memcpy, and a vectorized loop did worse on the 8-value rows of
// LeNet's conv2: in int8 (chapter 11) its 64-byte vectors never filled and it copied a byte at a
// time (two thirds of that layer's time went to im2col); in f32 a 32-byte remainder step and the
// loop's tests around it took 1.4× the time of one 32-byte move.
template <int kBytes>
inline void copy_overlapping(unsigned char* d, const unsigned char* s, int64_t bytes) {
    for (int64_t i = 0; i + kBytes < bytes; i += kBytes) std::memcpy(d + i, s + i, kBytes);
    std::memcpy(d + bytes - kBytes, s + bytes - kBytes, kBytes);
}

// dst[r·ld_dst + i] = src[r·ld_src + i] for r < rows, i < n (a block of im2col's output rows):
// each row by moves of 32, 16, 8 or 4 bytes (copy_overlapping), their size chosen once for all
// the rows. Chosen again for every row, with the row's own loop and padding tests around it,
// im2col took 2.2× as long on LeNet's layers (8 values a row in conv2, 24 in conv1).
template <typename T>
inline void copy_short_rows(T* dst, int64_t ld_dst, const T* src, int64_t ld_src, int64_t rows, int64_t n) {
    const int64_t bytes = n * int64_t(sizeof(T));
    auto each_row = [&](auto copy) {
        for (int64_t r = 0; r < rows; r++)
            copy(reinterpret_cast<unsigned char*>(dst + r * ld_dst), reinterpret_cast<const unsigned char*>(src + r * ld_src));
    };
    if (bytes >= 32) each_row([&](unsigned char* d, const unsigned char* s) { copy_overlapping<32>(d, s, bytes); });
    else if (bytes >= 16) each_row([&](unsigned char* d, const unsigned char* s) { copy_overlapping<16>(d, s, bytes); });
    else if (bytes >= 8) each_row([&](unsigned char* d, const unsigned char* s) { copy_overlapping<8>(d, s, bytes); });
    else if (bytes >= 4) each_row([&](unsigned char* d, const unsigned char* s) { copy_overlapping<4>(d, s, bytes); });
    else each_row([&](unsigned char* d, const unsigned char* s) { for (int64_t i = 0; i < bytes; i++) d[i] = s[i]; });
}

// Calls body(j0, kWidth) for blocks j0 .. j0 + kWidth − 1 that cover [begin, end), the last one
// moved back to end inside it (the blocks overlap there: a body that only copies writes the same
// values twice); a range shorter than 8 goes by blocks of 4 the same way, one shorter than 4 by
// body(j, 1) for each j. On the 14 tiles inside a 31-wide row (Winograd) or the 12 outputs of a
// 24-wide row pooled 2×2 (LeNet), a loop of 16-lane vectors never ran and its scalar remainder
// did all the work; two blocks of 8 do it, and the 7 outputs of a 15-wide row two blocks of 4.
template <int64_t kWidth = 8, typename Body>
void for_blocks(int64_t begin, int64_t end, Body body) {
    if (end - begin >= kWidth) {
        for (int64_t j = begin; j < end; j += kWidth) body(std::min(j, end - kWidth), kWidth);
    } else if constexpr (kWidth > 4) {
        for_blocks<kWidth / 2>(begin, end, body);
    } else {
        for (int64_t j = begin; j < end; j++) body(j, int64_t(1));
    }
}

}  // namespace kiln::cpu
