// comm.h — a group of processes that train one model together (chapter 12), and the four
// collective operations data parallel training needs from it.
//
// Each process ("rank" r of a "world" of p ranks) holds a full copy of the model and trains on
// its own share of every batch. The ranks stay in step because, after every backward, they all
// call the same collectives in the same order:
//
//   all-reduce      every rank ends with the sum of everyone's data     x_r  ->  Σ_r x_r
//   reduce-scatter  rank r ends with the sum of piece r only            x_r  ->  (Σ_r x_r)[piece r]
//   all-gather      every rank ends with everyone's piece               piece_r -> [piece_0 … piece_p−1]
//   broadcast       every rank ends with rank root's data               x_root
//
// (all-reduce = reduce-scatter followed by all-gather: that is how the ring algorithm does it,
// lessons/12-data-parallel/README.md draws it.)
//
// Two implementations: MpiCommunicator (src/mpi/mpi_comm.h: processes on CPUs, started by
// mpirun) and NcclCommunicator (src/mpi/nccl_comm.h, `make CUDA=1`: one GPU per rank). The
// training code (dist/data_parallel.h, dist/zero.h) sees only this interface.
//
// Every collective must be called by every rank, in the same order, with the same sizes. A rank
// that never arrives (it died, or took another path) would make the others wait for ever: every
// wait gives up after timeout_seconds() and throws a kiln::Error naming the operation.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace kiln {

// A collective started and not yet finished (an all-reduce running while backward goes on).
using CommRequest = int64_t;

class Communicator {
public:
    virtual ~Communicator() = default;
    virtual int rank() const = 0;
    virtual int size() const = 0;
    virtual std::string backend() const = 0;  // "mpi", "nccl"

    // x := Σ_ranks x, in place, x a contiguous f32 tensor on this communicator's device.
    // start returns at once; the sum is there after wait(request).
    virtual CommRequest all_reduce_start(Tensor x) = 0;
    virtual void wait(CommRequest request) = 0;
    // Lets started collectives move on (MPI advances them only inside its own calls; NCCL does
    // not need it). Cheap: backward calls it between layers.
    virtual void progress() {}
    void all_reduce(Tensor x) { wait(all_reduce_start(std::move(x))); }

    // Rank r's piece of x is x[offsets[r], offsets[r + 1]) (offsets: p + 1 values, from 0 to
    // x.numel()). reduce_scatter: that piece := Σ_ranks of the piece; the rest of x is left as
    // it was, not meaningful. all_gather: every piece is copied from its rank to everyone.
    virtual void reduce_scatter(Tensor x, const std::vector<int64_t>& offsets) = 0;
    virtual void all_gather(Tensor x, const std::vector<int64_t>& offsets) = 0;

    // x := rank root's x (every dtype: raw bytes).
    virtual void broadcast(Tensor x, int root) = 0;
    // The sum over ranks of one number (losses, correct counts; in double).
    virtual double sum(double v) = 0;
    // Every rank's v, in rank order (small integers: a configuration check).
    virtual std::vector<int64_t> gather_all(int64_t v) = 0;

    double timeout_seconds() const { return timeout_; }
    void set_timeout(double seconds) { timeout_ = seconds; }

private:
    double timeout_ = 300;  // long enough for a slow rank's evaluation, short enough to notice a dead one
};

// Pieces for reduce-scatter and all-gather: n elements over p ranks, every piece but the last
// c = ⌈n / (p·align)⌉·align long (a multiple of `align`: aligned pieces keep the optimizers'
// vector loops on whole cache lines), the last what remains (it may be shorter, or empty when
// n is small). Returns the p + 1 offsets min(r·c, n), r = 0 … p.
std::vector<int64_t> even_pieces(int64_t n, int p, int64_t align = 1);

// Throws a kiln::Error naming op unless offsets are p + 1 non-decreasing offsets from 0 to n
// (what reduce_scatter and all_gather take; even_pieces makes them).
void check_pieces(const std::vector<int64_t>& offsets, int p, int64_t n, const std::string& op);

// The message of a collective that timed out: "<what>: rank r of p waited T s and another rank
// never joined: ..." with what to look at. Both communicators' waits end with it.
std::string never_joined(const std::string& what, int rank, int p, double timeout_seconds);

}  // namespace kiln
