// main.cpp — the Catch2 entry point of the MPI tests (tests/mpi/*.cpp), run as several ranks:
//   mpirun -np 2 build/tests/kiln_mpi_tests          (make test does it, tests/run.sh)
// Every rank runs every test case (a collective needs all of them); rank 0 reports as usual,
// the others with Catch2's compact reporter (their failures only, and a one-line summary) on
// stderr, their stdout (the trainers' progress lines) silenced.
// A test case that fails on any rank makes mpirun's exit status non-zero.
#define CATCH_CONFIG_RUNNER
#include <mpi.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <string>
#include <vector>

int main(int argc, char** argv) {
    int provided = 0, rank = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::vector<char*> args(argv, argv + argc);
    std::string reporter = "--reporter", compact = "compact", colour = "--use-colour", no = "no", out = "--out",
                err = "/dev/stderr";
    args.push_back(colour.data());  // plain text: tests/run.sh reads the summary line
    args.push_back(no.data());
    if (rank != 0) {
        args.push_back(reporter.data());
        args.push_back(compact.data());
        args.push_back(out.data());
        args.push_back(err.data());
        std::freopen("/dev/null", "w", stdout);
    }
    const int failed = Catch::Session().run(int(args.size()), args.data());
    MPI_Finalize();
    return failed;
}
