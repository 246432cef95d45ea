// launch.cpp — starting and ending a trainer's MPI ranks (launch.h).
#include "mpi/launch.h"

#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "core/error.h"

namespace kiln {

namespace {

void check_same_command_line(Communicator& comm, const Cli& cli) {
    std::string line;
    for (const std::string& a : cli.arguments()) line += a + '\n';
    const auto hashes = comm.gather_all(int64_t(std::hash<std::string>{}(line) >> 1));
    for (int r = 1; r < comm.size(); r++)
        KILN_CHECK(hashes[size_t(r)] == hashes[0], "rank ", r, " was started with other flags than rank 0: start every ",
                   "rank with the same command line (mpirun -np N ", cli.program(), " FLAGS)");
}

int threads_per_rank(int world_size) {
    const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    const int here = local ? std::max(1, std::atoi(local)) : world_size;
    cpu_set_t mine;
    const int allowed = sched_getaffinity(0, sizeof mine, &mine) == 0 ? CPU_COUNT(&mine) : 1;
    return std::max(1, std::min(allowed, int(std::thread::hardware_concurrency()) / here));
}

}  // namespace

void start_ranks(Communicator& comm, const Cli& cli, CommonFlags& flags) {
    check_same_command_line(comm, cli);
    flags.rank = comm.rank();
    flags.world_size = comm.size();
    if (flags.threads == 0) flags.threads = threads_per_rank(comm.size());
    if (comm.rank() != 0) std::freopen("/dev/null", "w", stdout);  // rank 0 speaks for all
}

int run_ranks(const std::string& program, int argc, char** argv,
              const std::function<int(int, char**, MpiCommunicator&)>& run) {
    MpiCommunicator mpi(&argc, &argv);  // first: MPI takes its own arguments out of argv
    try {
        return run(argc, argv, mpi);
    } catch (const UsageError& e) {
        if (mpi.rank() == 0) std::fprintf(stderr, "%s: %s\n", program.c_str(), e.what());
        return 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s (rank %d of %d): %s\n", program.c_str(), mpi.rank(), mpi.size(), e.what());
        if (mpi.size() > 1) mpi.abort(1);  // the other ranks would wait for this one
        return 1;
    }
}

}  // namespace kiln
