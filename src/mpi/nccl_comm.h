// nccl_comm.h — the Communicator (dist/comm.h) on NCCL, NVIDIA's collective library: one GPU per
// rank, the collectives run as NCCL kernels on the GPUs, over NVLink or PCIe inside a machine and
// InfiniBand or sockets between machines. Built only by `make CUDA=1` (NCCL ships with the CUDA
// toolkit: nccl.h, libnccl.so.2).
//
//   MpiCommunicator mpi(&argc, &argv);                   // mpirun starts the ranks
//   auto comm = make_nccl_communicator(mpi, local_gpu);  // binds the GPU, joins NCCL's world
//   comm->all_reduce(model.grads_view());                // GPU memory, summed by NCCL
//
// MPI starts the processes and NCCL does the collectives: rank 0 asks NCCL for a unique id
// (ncclGetUniqueId: 128 bytes naming a socket on rank 0 where the ranks meet), MPI broadcasts it,
// and every rank joins with ncclCommInitRank(id, rank, size). NCCL then finds the fastest paths
// between the GPUs itself. The host numbers (sum, gather_all) still go through MPI.
//
// Streams (llm.c's design). kiln's kernels run on the default stream, "compute". NCCL runs on a
// stream of its own, so that backward goes on while a bucket's all-reduce runs; two events keep
// the order:
//
//   compute stream   backward of layer k ─●─ backward of layers k−1 … 1 ───────── optimizer step
//                                   ready │                                     ▲
//   NCCL stream                           └─► all-reduce of bucket 0 ─● done      │
//   host             queues backward …………… wait(): polls done until it happens ─┘ queues the step
//
// all_reduce_start records `ready` on the compute stream (the gradients are written), makes the
// NCCL stream wait for it, queues the all-reduce and records `done` behind it. wait() polls
// `done` from the host. (llm.c instead makes the compute stream wait for `done` and lets the host
// run on; kiln's host waits, because a wait that never blocks has no place for a timeout: a dead
// rank's all-reduce would never end, and the next read of a loss would hang in cudaMemcpy without
// a word; PyTorch's ProcessGroupNCCL keeps the host free and runs a watchdog thread for the
// timeout instead. The host waits only at the end of backward, when every backward kernel and every
// bucket's all-reduce are already queued, so the overlap is the same; it also makes DataParallel's
// CommStats::wait_seconds the communication time not hidden, as on MPI.)
//
// Timeouts: while it waits, the host also asks NCCL for errors (ncclCommGetAsyncError: a peer's
// connection lost). On an error, or after timeout_seconds(), the communicator is aborted
// (ncclCommAbort: its kernels stop spinning on the GPU) and a kiln::Error is thrown; unlike the
// MPI communicator's, nothing can be waited for after that. End every rank then (mpi.abort()).
//
// Every tensor must be on the GPU (Device::CUDA); reduce_scatter and all_gather accept any
// pieces (dist/comm.h's offsets), not only equal ones.
#pragma once
#include <memory>

#include "mpi/mpi_comm.h"

namespace kiln {

// A communicator over the ranks of `mpi`'s world, this rank on GPU `device` (its index among the
// machine's GPUs: with one GPU per rank, the rank's index on its machine, Open MPI's
// OMPI_COMM_WORLD_LOCAL_RANK). mpi must outlive the communicator. A collective: every rank calls it.
std::unique_ptr<Communicator> make_nccl_communicator(MpiCommunicator& mpi, int device);

}  // namespace kiln
