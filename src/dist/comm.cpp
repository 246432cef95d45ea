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

void check_pieces(const std::vector<int64_t>& offsets, int p, int64_t n, const std::string& op) {
    KILN_CHECK(int(offsets.size()) == p + 1 && offsets.front() == 0 && offsets.back() == n, op, ": ", offsets.size(),
               " offsets for a world of ", p, " ranks and ", n,
               " elements (want p + 1 offsets from 0 to n: even_pieces, dist/comm.h)");
    for (size_t r = 0; r + 1 < offsets.size(); r++)
        KILN_CHECK(offsets[r] <= offsets[r + 1], op, ": offsets[", r, "] = ", offsets[r], " > offsets[", r + 1,
                   "] = ", offsets[r + 1], " (the pieces must follow each other)");
}

std::string never_joined(const std::string& what, int rank, int p, double timeout_seconds) {
    return detail::concat(what, ": rank ", rank, " of ", p, " waited ", timeout_seconds,
                          " s and another rank never joined: it has stopped (an error, a crash, a kill) or runs "
                          "another number of steps (different flags or data). Read the other ranks' messages; every "
                          "rank must be started with the same flags");
}

}  // namespace kiln
