// comm.cpp — splitting a buffer into one piece per rank (comm.h).
#include "dist/comm.h"

#include <algorithm>

#include "core/error.h"

namespace kiln {

std::vector<int64_t> even_pieces(int64_t n, int p, int64_t align) {
    KILN_CHECK(n >= 0 && p >= 1 && align >= 1, "even_pieces(n = ", n, ", p = ", p, ", align = ", align,
               "): want n ≥ 0, p ≥ 1, align ≥ 1");
    const int64_t c = (n + p * align - 1) / (p * align) * align;
    std::vector<int64_t> offsets(size_t(p) + 1);
    for (int r = 0; r <= p; r++) offsets[size_t(r)] = std::min(int64_t(r) * c, n);
    return offsets;
}

}  // namespace kiln
