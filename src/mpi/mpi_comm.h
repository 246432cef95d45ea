// mpi_comm.h — the Communicator (dist/comm.h) on MPI: processes started by mpirun, on one
// machine or many, exchanging CPU memory. Open MPI is Debian's (libopenmpi-dev openmpi-bin).
//
//   mpirun -np 2 build/bin/lesson-12 ...           # two processes, ranks 0 and 1
//   MpiCommunicator comm(&argc, &argv);            // MPI_Init; comm.rank(), comm.size()
//   comm.all_reduce(model.grads_view());           // the sum of both ranks' gradients
//
// Started without mpirun the program is a world of one rank (MPI's "singleton" mode).
//
// Every collective is MPI's non-blocking version (MPI_Iallreduce, …) followed by a wait that
// polls MPI_Test: a collective another rank never joins throws a kiln::Error after the
// timeout instead of hanging. The caller should then end every rank with abort(): the world is
// out of step and cannot go on. (A started all-reduce whose wait() timed out stays pending, and
// a later wait() can still finish it: the tests use that.)
//
// Only this file and its .cpp include <mpi.h>; they are built into build/libkiln_mpi.a, which
// only the programs that use MPI link (lesson 12, tests/mpi).
#pragma once
#include <memory>

#include "dist/comm.h"

namespace kiln {

class MpiCommunicator : public Communicator {
public:
    // Initializes MPI (once per process) on MPI_COMM_WORLD.
    MpiCommunicator(int* argc, char*** argv);
    ~MpiCommunicator() override;  // MPI_Finalize, after any collective still running
    MpiCommunicator(const MpiCommunicator&) = delete;
    MpiCommunicator& operator=(const MpiCommunicator&) = delete;

    int rank() const override { return rank_; }
    int size() const override { return size_; }
    std::string backend() const override { return "mpi"; }

    CommRequest all_reduce_start(Tensor x) override;
    void wait(CommRequest request) override;
    void progress() override;
    void reduce_scatter(Tensor x, const std::vector<int64_t>& offsets) override;
    void all_gather(Tensor x, const std::vector<int64_t>& offsets) override;
    void broadcast(Tensor x, int root) override;
    double sum(double v) override;
    std::vector<int64_t> gather_all(int64_t v) override;

    // Ends every rank of the world now (MPI_Abort): after an error on one rank, so that the
    // others do not wait for it. Does not return.
    [[noreturn]] void abort(int code);

private:
    struct Pending;  // the MPI requests started and not yet waited for
    int rank_ = 0, size_ = 1;
    std::unique_ptr<Pending> pending_;
};

}  // namespace kiln
