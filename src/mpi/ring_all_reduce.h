// ring_all_reduce.h — lesson 12's exercise (dist/ring.h: the algorithm, drawn) on MPI: each step
// around the ring is one MPI_Sendrecv, to the right neighbour and from the left.
//
//   ring_all_reduce(x, n, MPI_COMM_WORLD);   // x[0, n) := Σ_ranks x[0, n), on every rank
//
// Every rank must call it with the same n. The sum is taken in ring order, so it can differ from
// MPI_Allreduce's in the last bits (f32 addition is not associative); small integers sum exactly.
#pragma once
#include <mpi.h>

#include <cstdint>

namespace kiln {

// x[0, n) := Σ_ranks of comm x[0, n), in place, on every rank of comm.
void ring_all_reduce(float* x, int64_t n, MPI_Comm comm);

}  // namespace kiln
