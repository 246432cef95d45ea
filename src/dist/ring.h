// ring.h — lesson 12's exercise: the ring all-reduce, the algorithm NCCL and MPI_Allreduce use
// for large buffers, written on one operation — send a chunk to the right neighbour while
// receiving one from the left — so that it runs on MPI (mpi/ring_all_reduce.h: MPI_Sendrecv) and,
// for the tests, on p ranks simulated by threads in one process (any p, on any machine).
//
//   ring_all_reduce(x, n, rank, p, pass);   // x[0, n) := Σ_ranks x[0, n), on every rank
//
// The p ranks stand in a ring: rank r sends to its right neighbour (r + 1) mod p and receives
// from its left neighbour (r − 1) mod p. x is cut into p chunks (even_pieces(n, p), dist/comm.h:
// all equal but the last, which may be shorter or empty). Three ranks, chunks A B C:
//
//            ┌──────────► rank 1 ───────────┐
//            │                              ▼
//         rank 0 ◄───────────────────────── rank 2
//
//   reduce-scatter, step s = 0 … p − 2: rank r sends chunk (r − s) mod p to the right, receives
//   chunk (r − s − 1) mod p from the left and adds it to its own copy:
//
//              rank 0          rank 1          rank 2
//     start    A0 B0 C0        A1 B1 C1        A2 B2 C2
//     s = 0    A0 B0 C02       A01 B1 C1       A2 B12 C2        (0 sends A, 1 sends B, 2 sends C)
//     s = 1    A0 B012 C02     A01 B1 C012     A012 B12 C2      (0 sends C, 1 sends A, 2 sends B)
//
//   rank r now holds the whole sum of chunk (r + 1) mod p (A012 = A0 + A1 + A2).
//
//   all-gather, step s = 0 … p − 2: rank r sends chunk (r + 1 − s) mod p, whole, to the right
//   and receives chunk (r − s) mod p from the left, copying it over its own: after p − 1 steps
//   every rank holds every summed chunk.
//
// Cost: 2(p − 1) steps, each sending one chunk of n/p floats, so every rank sends
//     2 (p − 1)/p · n floats      (< 2n, whatever p: the bandwidth term does not grow with p)
// and with α the latency of a message and β the time per byte, the α–β model's time is
//     T = 2 (p − 1) · (α + 4 (n/p) β).
// The latency term does grow with p: for small buffers a tree (log p steps) is faster.
//
// Every rank must call it with the same n. The sum is taken in ring order, so it can differ from
// MPI_Allreduce's in the last bits (f32 addition is not associative); small integers sum exactly.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

namespace kiln {

// One step around the ring, on rank r of p: send `send_count` floats from `send` to the right
// neighbour (r + 1) mod p while `receive_count` floats arrive from the left neighbour (r − 1) mod p
// into `receive`; returns once both are done (MPI_Sendrecv's contract). The left neighbour sends
// exactly receive_count floats in the same step.
using RingPass = std::function<void(const float* send, int send_count, float* receive, int receive_count)>;

// x[0, n) := Σ_ranks x[0, n), in place, on rank `rank` of p; every rank calls it with the same n
// and its own `pass`. Throws kiln::Error for n < 0 or a chunk larger than an int counts.
void ring_all_reduce(float* x, int64_t n, int rank, int p, const RingPass& pass);

// p ranks in one process, one thread each, each with its own x: xs[r] is rank r's buffer of n
// floats. Each rank's pass hands its chunk to the right neighbour through memory, every rank
// stepping together (a barrier before and after each exchange). For tests of the ring on any p.
void simulate_ring_all_reduce(const std::vector<float*>& xs, int64_t n);

}  // namespace kiln
