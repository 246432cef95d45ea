// launch.h — what a trainer that runs as several MPI ranks does around its training (lesson-12,
// lesson-14): start MPI, agree on the flags, share the cores, let rank 0 speak, end together.
//
//   int main(int argc, char** argv) {
//       return run_ranks("lesson-14", argc, argv, [](int argc, char** argv, MpiCommunicator& mpi) {
//           ... cli.parse(argc, argv); start_ranks(mpi, cli, flags); ... train ...
//       });
//   }
//
// Started without mpirun, the program is a world of one rank (mpi_comm.h) and runs as usual.
#pragma once
#include <functional>
#include <string>

#include "mpi/mpi_comm.h"
#include "train/cli.h"

namespace kiln {

// MPI first (it takes its own arguments out of argv), then run(argc, argv, mpi). Errors:
//   a kiln::UsageError (a command line that cannot run: the same on every rank, since every rank
//     has the same flags) is printed once, by rank 0, and every rank ends normally with status 1;
//   any other error is printed with its rank ("lesson-14 (rank 1 of 2): ..."), and with several
//     ranks ends them all (MPI_Abort): the others would wait for this one at the next collective.
int run_ranks(const std::string& program, int argc, char** argv,
              const std::function<int(int, char**, MpiCommunicator&)>& run);

// After parsing the flags, on every rank:
//   - checks that every rank was started with the same command line (compared by hash): a
//     different --batch-size on one rank would make the ranks call different collectives;
//   - sets flags.rank and flags.world_size (the loaders' share, and rank 0 as the main process);
//   - unless --threads was given, OpenMP threads per rank: the machine's cores shared out among
//     the ranks on it (mpirun tells each rank how many run here), and no more than the cores this
//     rank may run on (mpirun binds each of 1 or 2 ranks to one core unless told --bind-to
//     none); at least one. Two ranks × two threads on two cores would make each rank's threads
//     wait at every barrier for a partner that is not running.
//   - silences stdout on every rank but 0: rank 0 speaks for all (errors still go to stderr).
void start_ranks(Communicator& comm, const Cli& cli, CommonFlags& flags);

}  // namespace kiln
