// mpi_comm.cpp — the Communicator on MPI's non-blocking collectives, each waited for with a
// timeout (mpi_comm.h).
#include "mpi/mpi_comm.h"

#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstring>
#include <map>
#include <thread>

#include "core/error.h"

namespace kiln {

struct MpiCommunicator::Pending {
    struct Started {
        MPI_Request request;
        std::string what;  // "all-reduce of 61706 floats", for a timeout's message
    };
    std::map<CommRequest, Started> started;
    CommRequest next = 0;
    bool initialized_here = false;  // this object called MPI_Init, so it calls MPI_Finalize
};

namespace {

// MPI counts are int: one collective moves at most 2^31 − 1 elements.
int count_of(int64_t n, const char* op) {
    KILN_CHECK(n >= 0 && n <= INT_MAX, "MPI ", op, " of ", n, " elements: MPI counts are int, at most ", INT_MAX,
               "; split the tensor");
    return int(n);
}

// A contiguous f32 tensor in host memory: MPI here reads and writes CPU memory (the emulator's
// device memory is host memory too; on a real GPU, the NCCL communicator is the one to use).
float* host_floats(Tensor& x, const char* op) {
    check_dtype(x, DType::F32, op, "x");
#ifdef KILN_CUDA
    KILN_CHECK(x.device() == Device::CPU, op, ": the MPI communicator reads CPU memory and x is on ",
               device_name(x.device()), "; train on GPUs with the NCCL communicator (make CUDA=1, --device cuda)");
#endif
    return x.data<float>();
}

// Polls request until it completes. MPI_Test also moves every other started collective on.
// Polls back to back for the first thousand tries (a partner that is almost there), then sleeps
// 20 µs between tries, so a rank waiting for a slow partner leaves the CPU to others.
void wait_for(MPI_Request& request, const std::string& what, double timeout, int rank, int size) {
    const auto start = std::chrono::steady_clock::now();
    for (int64_t tries = 0;; tries++) {
        int done = 0;
        MPI_Test(&request, &done, MPI_STATUS_IGNORE);
        if (done) return;
        const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        KILN_CHECK(waited < timeout, never_joined("MPI " + what, rank, size, timeout));
        if (tries > 1000) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
}

}  // namespace

MpiCommunicator::MpiCommunicator(int* argc, char*** argv) : pending_(std::make_unique<Pending>()) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
        int provided = 0;  // only the thread that made the communicator calls MPI (FUNNELED)
        KILN_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) == MPI_SUCCESS,
                   "MPI_Init_thread failed: is Open MPI installed (scripts/setup.sh) and was the program started "
                   "by mpirun or on its own?");
        pending_->initialized_here = true;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
}

MpiCommunicator::~MpiCommunicator() {
    for (auto& [id, c] : pending_->started) MPI_Wait(&c.request, MPI_STATUS_IGNORE);
    if (pending_->initialized_here) MPI_Finalize();
}

void MpiCommunicator::abort(int code) { MPI_Abort(MPI_COMM_WORLD, code); std::abort(); }

// x := Σ_ranks x, in place (MPI_IN_PLACE), started now, finished by wait().
CommRequest MpiCommunicator::all_reduce_start(Tensor x) {
    float* p = host_floats(x, "all_reduce");
    const int n = count_of(x.numel(), "all-reduce");
    MPI_Request request;
    MPI_Iallreduce(MPI_IN_PLACE, p, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &request);
    const CommRequest id = pending_->next++;
    pending_->started[id] = {request, "all-reduce of " + std::to_string(n) + " floats"};
    return id;
}

// A collective that times out stays pending: a later wait() may still finish it.
void MpiCommunicator::wait(CommRequest id) {
    auto it = pending_->started.find(id);
    KILN_CHECK(it != pending_->started.end(), "MpiCommunicator::wait(", id, "): no such collective running");
    wait_for(it->second.request, it->second.what, timeout_seconds(), rank_, size_);
    pending_->started.erase(it);
}

void MpiCommunicator::progress() {
    for (auto& [id, c] : pending_->started) {
        int done = 0;
        MPI_Test(&c.request, &done, MPI_STATUS_IGNORE);  // a finished request becomes MPI_REQUEST_NULL
    }
}

// MPI_Ireduce_scatter with MPI_IN_PLACE leaves this rank's summed piece at the start of x;
// it is moved to its own place, offsets[rank].
void MpiCommunicator::reduce_scatter(Tensor x, const std::vector<int64_t>& offsets) {
    float* p = host_floats(x, "reduce_scatter");
    check_pieces(offsets, size_, x.numel(), "MPI reduce_scatter");
    std::vector<int> counts(static_cast<size_t>(size_), 0);
    for (int r = 0; r < size_; r++) counts[size_t(r)] = count_of(offsets[size_t(r) + 1] - offsets[size_t(r)], "reduce-scatter");
    MPI_Request request;
    MPI_Ireduce_scatter(MPI_IN_PLACE, p, counts.data(), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &request);
    wait_for(request, "reduce-scatter of " + std::to_string(x.numel()) + " floats", timeout_seconds(), rank_, size_);
    std::memmove(p + offsets[size_t(rank_)], p, sizeof(float) * size_t(counts[size_t(rank_)]));
}

// Each rank's piece is already at its place in x (MPI_IN_PLACE): only the others' arrive.
void MpiCommunicator::all_gather(Tensor x, const std::vector<int64_t>& offsets) {
    float* p = host_floats(x, "all_gather");
    check_pieces(offsets, size_, x.numel(), "MPI all_gather");
    std::vector<int> counts(static_cast<size_t>(size_)), displs(static_cast<size_t>(size_));
    for (int r = 0; r < size_; r++) {
        counts[size_t(r)] = count_of(offsets[size_t(r) + 1] - offsets[size_t(r)], "all-gather");
        displs[size_t(r)] = count_of(offsets[size_t(r)], "all-gather");
    }
    MPI_Request request;
    MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, p, counts.data(), displs.data(), MPI_FLOAT, MPI_COMM_WORLD,
                    &request);
    wait_for(request, "all-gather of " + std::to_string(x.numel()) + " floats", timeout_seconds(), rank_, size_);
}

void MpiCommunicator::broadcast(Tensor x, int root) {
    KILN_CHECK(root >= 0 && root < size_, "broadcast from rank ", root, " in a world of ", size_, " ranks");
    const int n = count_of(int64_t(x.nbytes()), "broadcast");
    MPI_Request request;
    MPI_Ibcast(x.raw(), n, MPI_BYTE, root, MPI_COMM_WORLD, &request);
    wait_for(request, "broadcast of " + std::to_string(n) + " bytes", timeout_seconds(), rank_, size_);
}

double MpiCommunicator::sum(double v) {
    double total = 0;
    MPI_Request request;
    MPI_Iallreduce(&v, &total, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD, &request);
    wait_for(request, "sum of one number", timeout_seconds(), rank_, size_);
    return total;
}

std::vector<int64_t> MpiCommunicator::gather_all(int64_t v) {
    std::vector<int64_t> all(static_cast<size_t>(size_));
    MPI_Request request;
    MPI_Iallgather(&v, 1, MPI_INT64_T, all.data(), 1, MPI_INT64_T, MPI_COMM_WORLD, &request);
    wait_for(request, "all-gather of one number", timeout_seconds(), rank_, size_);
    return all;
}

}  // namespace kiln
