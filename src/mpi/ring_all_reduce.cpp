// ring_all_reduce.cpp — the ring all-reduce on MPI_Sendrecv: reduce-scatter then all-gather
// around the ring (ring_all_reduce.h draws it).
#include "mpi/ring_all_reduce.h"

#include <climits>
#include <vector>

#include "core/error.h"
#include "dist/comm.h"

namespace kiln {

namespace {

// Chunk k of x is x[offsets[k], offsets[k + 1]).
struct Chunks {
    std::vector<int64_t> offsets;
    float* begin(float* x, int k) const { return x + offsets[size_t(k)]; }
    int count(int k) const { return int(offsets[size_t(k) + 1] - offsets[size_t(k)]); }
};

// a mod p in [0, p), also for negative a (C++'s % keeps the sign of a).
int ring_index(int a, int p) { return (a % p + p) % p; }

// One step around the ring: send chunk `out` to the right neighbour while chunk `in` arrives from
// the left into `received` (the left neighbour sends its chunk `in` in the same step, so both
// sides agree on the count).
void pass_right(float* x, const Chunks& c, int out, int in, float* received, int rank, int p, MPI_Comm comm) {
    const int right = (rank + 1) % p, left = ring_index(rank - 1, p);
    const int tag = 12;  // any tag both ends agree on; the steps are ordered by the ring itself
    MPI_Sendrecv(c.begin(x, out), c.count(out), MPI_FLOAT, right, tag, received, c.count(in), MPI_FLOAT, left, tag,
                 comm, MPI_STATUS_IGNORE);
}

}  // namespace

void ring_all_reduce(float* x, int64_t n, MPI_Comm comm) {
    int rank = 0, p = 1;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &p);
    KILN_CHECK(n >= 0, "ring_all_reduce of ", n, " floats: want n ≥ 0");
    const Chunks c{even_pieces(n, p)};
    KILN_CHECK(c.offsets[1] <= INT_MAX, "ring_all_reduce of ", n, " floats over ", p, " ranks: a chunk of ",
               c.offsets[1], " floats is more than an MPI count (int) holds; split x");
    std::vector<float> received(size_t(c.offsets[1]));  // the largest chunk: chunk 0

    // Reduce-scatter: after step s, the chunk received holds the sum of s + 2 ranks' copies.
    for (int s = 0; s < p - 1; s++) {
        const int out = ring_index(rank - s, p), in = ring_index(rank - s - 1, p);
        pass_right(x, c, out, in, received.data(), rank, p, comm);
        float* mine = c.begin(x, in);
        for (int i = 0; i < c.count(in); i++) mine[i] += received[size_t(i)];
    }
    // All-gather: rank r starts with the whole sum of chunk (r + 1) mod p and passes sums on.
    for (int s = 0; s < p - 1; s++) {
        const int out = ring_index(rank + 1 - s, p), in = ring_index(rank - s, p);
        pass_right(x, c, out, in, c.begin(x, in), rank, p, comm);
    }
}

}  // namespace kiln
