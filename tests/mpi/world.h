// world.h — the MPI tests' communicator: every rank of mpirun's world (MPI is initialized by
// tests/mpi/main.cpp). A collective a test leaves unmatched fails after 60 s instead of hanging.
#pragma once
#include "mpi/mpi_comm.h"

namespace kiln {

inline MpiCommunicator& world() {
    static MpiCommunicator comm(nullptr, nullptr);
    comm.set_timeout(60);
    return comm;
}

}  // namespace kiln
