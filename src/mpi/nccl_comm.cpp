// nccl_comm.cpp — the Communicator on NCCL: collectives queued on a stream of their own after the
// compute stream's work, waited for by polling an event with a timeout (nccl_comm.h).
// Compiled only with make CUDA=1.
#include "mpi/nccl_comm.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <map>
#include <thread>

#include "core/error.h"

// Any NCCL or CUDA runtime call: a kiln::Error naming the call and the library's message.
#define NCCL_CHECK(call)                                                                    \
    do {                                                                                    \
        const ncclResult_t nccl_result_ = (call);                                           \
        if (nccl_result_ != ncclSuccess)                                                    \
            KILN_FAIL(#call, " failed: ", ncclGetErrorString(nccl_result_), " (",           \
                      ncclGetLastError(nullptr), "). Run with NCCL_DEBUG=WARN (or INFO) "   \
                      "to read NCCL's own account");                                        \
    } while (0)
#define CUDA_CHECK(call)                                                                    \
    do {                                                                                    \
        const cudaError_t cuda_error_ = (call);                                             \
        if (cuda_error_ != cudaSuccess)                                                     \
            KILN_FAIL(#call, " failed: ", cudaGetErrorString(cuda_error_), " (",            \
                      cudaGetErrorName(cuda_error_), ")");                                  \
    } while (0)

namespace kiln {

namespace {

// kiln's kernels are launched without a stream (KILN_LAUNCH), and nvcc builds them without
// --default-stream per-thread: they run on the legacy default stream.
const cudaStream_t compute_stream = cudaStreamLegacy;

// The first element of x, a contiguous tensor that must be in GPU memory.
void* device_bytes(Tensor& x, const char* op) {
    KILN_CHECK(x.device() == Device::CUDA, "NCCL ", op, ": x is ", x.desc(),
               "; the NCCL communicator moves GPU memory: put the model on the GPU (--device cuda), or train "
               "on CPUs with the MPI communicator (--backend mpi)");
    return x.raw();
}

float* device_floats(Tensor& x, const char* op) {
    check_dtype(x, DType::F32, op, "x");
    return static_cast<float*>(device_bytes(x, op));
}

class NcclCommunicator : public Communicator {
public:
    NcclCommunicator(MpiCommunicator& mpi, int device);
    ~NcclCommunicator() override;
    NcclCommunicator(const NcclCommunicator&) = delete;
    NcclCommunicator& operator=(const NcclCommunicator&) = delete;

    int rank() const override { return mpi_.rank(); }
    int size() const override { return mpi_.size(); }
    std::string backend() const override { return "nccl"; }

    CommRequest all_reduce_start(Tensor x) override;
    void wait(CommRequest request) override;
    void reduce_scatter(Tensor x, const std::vector<int64_t>& offsets) override;
    void all_gather(Tensor x, const std::vector<int64_t>& offsets) override;
    void broadcast(Tensor x, int root) override;
    double sum(double v) override;
    std::vector<int64_t> gather_all(int64_t v) override;

private:
    struct Pending {
        cudaEvent_t done;  // recorded on the NCCL stream behind the collective
        std::string what;  // "all-reduce of 61706 floats", for a timeout's message
    };
    MpiCommunicator& mpi_;
    ncclComm_t comm_ = nullptr;  // null once aborted
    cudaStream_t stream_ = nullptr;
    cudaEvent_t ready_ = nullptr;  // recorded on the compute stream before each collective
    std::map<CommRequest, Pending> pending_;
    CommRequest next_ = 0;

    template <typename Collective> CommRequest launch(std::string what, Collective&& collective);
    void wait_for(cudaEvent_t done, const std::string& what);
    void require_alive(const std::string& what) const;
    template <typename... Parts> [[noreturn]] void abort_and_fail(const Parts&... parts);
    template <typename PerPiece>
    void for_each_piece(Tensor& x, const std::vector<int64_t>& offsets, const char* op, const std::string& what,
                        PerPiece&& call);
};

// Joining: rank 0's unique id reaches every rank through MPI (a CPU tensor of its 128 bytes).
// The MPI broadcast has a timeout (the MPI communicator's, which this one starts with): once it
// is through, every rank is there, and ncclCommInitRank, which waits for all without one, returns.
NcclCommunicator::NcclCommunicator(MpiCommunicator& mpi, int device) : mpi_(mpi) {
    set_timeout(mpi.timeout_seconds());
    int devices = 0;
    const cudaError_t found = cudaGetDeviceCount(&devices);
    KILN_CHECK(found == cudaSuccess, "NCCL communicator: rank ", rank(), " finds no GPU it can use (",
               cudaGetErrorString(found), "): run on a machine with one GPU per rank (nvidia-smi lists them), "
               "or train on CPUs with the MPI communicator (--backend mpi)");
    KILN_CHECK(device >= 0 && device < devices, "NCCL communicator: rank ", rank(), " asked for GPU ", device,
               " and this machine has ", devices, "; start at most one rank per GPU (mpirun -np N with N ≤ ",
               devices, " per machine)");
    CUDA_CHECK(cudaSetDevice(device));

    ncclUniqueId id;
    Tensor bytes = Tensor::zeros({int64_t(sizeof id)}, DType::U8);
    if (rank() == 0) {
        NCCL_CHECK(ncclGetUniqueId(&id));
        std::memcpy(bytes.raw(), &id, sizeof id);
    }
    mpi_.broadcast(bytes, 0);
    std::memcpy(&id, bytes.raw(), sizeof id);
    NCCL_CHECK(ncclCommInitRank(&comm_, size(), id, rank()));

    // A non-blocking stream: it does not wait for the legacy default stream on its own, only for
    // the events it is told to wait for.
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
}

// Collectives started and never waited for (an error unwound the training): abort them rather
// than wait at the exit for ranks that may be gone.
NcclCommunicator::~NcclCommunicator() {
    if (comm_) (void)(pending_.empty() ? ncclCommDestroy(comm_) : ncclCommAbort(comm_));
    for (auto& [id, p] : pending_) (void)cudaEventDestroy(p.done);
    (void)cudaEventDestroy(ready_);
    (void)cudaStreamDestroy(stream_);
}

// Queues `collective` (NCCL calls on stream_) behind everything queued so far on the compute
// stream, and records its end.
template <typename Collective>
CommRequest NcclCommunicator::launch(std::string what, Collective&& collective) {
    require_alive(what);
    CUDA_CHECK(cudaEventRecord(ready_, compute_stream));
    CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
    collective();
    cudaEvent_t done;
    CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(done, stream_));
    const CommRequest id = next_++;
    pending_[id] = Pending{done, std::move(what)};
    return id;
}

// x := Σ_ranks x, in place.
CommRequest NcclCommunicator::all_reduce_start(Tensor x) {
    float* p = device_floats(x, "all_reduce");
    const size_t n = size_t(x.numel());
    return launch("all-reduce of " + std::to_string(n) + " floats", [&] {
        NCCL_CHECK(ncclAllReduce(p, p, n, ncclFloat, ncclSum, comm_, stream_));
    });
}

void NcclCommunicator::wait(CommRequest id) {
    auto it = pending_.find(id);
    KILN_CHECK(it != pending_.end(), "NcclCommunicator::wait(", id, "): no such collective running");
    require_alive(it->second.what);  // an aborted collective's event has happened, its data is not there
    wait_for(it->second.done, it->second.what);
    CUDA_CHECK(cudaEventDestroy(it->second.done));
    pending_.erase(it);
}

// Polls `done` until NCCL's kernels before it have finished on this GPU. Polls back to back for
// the first thousand tries, then sleeps 20 µs between tries, as the MPI communicator does.
void NcclCommunicator::wait_for(cudaEvent_t done, const std::string& what) {
    const auto start = std::chrono::steady_clock::now();
    for (int64_t tries = 0;; tries++) {
        const cudaError_t state = cudaEventQuery(done);
        if (state == cudaSuccess) return;
        if (state != cudaErrorNotReady)
            abort_and_fail("NCCL ", what, ": the GPU reports ", cudaGetErrorString(state),
                           " (a kernel before it failed; run the CUDA tests under compute-sanitizer)");
        ncclResult_t error = ncclSuccess;
        NCCL_CHECK(ncclCommGetAsyncError(comm_, &error));
        if (error != ncclSuccess && error != ncclInProgress)
            abort_and_fail("NCCL ", what, ": rank ", rank(), " of ", size(), ": NCCL reports ", ncclGetErrorString(error),
                           " (", ncclGetLastError(comm_), "): another rank has likely stopped; read its messages, "
                           "and run with NCCL_DEBUG=WARN for NCCL's own account");
        const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (waited >= timeout_seconds())
            abort_and_fail(never_joined("NCCL " + what, rank(), size(), timeout_seconds()));
        if (tries > 1000) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
}

// Stops this rank's NCCL kernels (they would spin for ever waiting for a peer) and throws.
template <typename... Parts> void NcclCommunicator::abort_and_fail(const Parts&... parts) {
    (void)ncclCommAbort(comm_);
    comm_ = nullptr;
    KILN_FAIL(parts...);
}

void NcclCommunicator::require_alive(const std::string& what) const {
    KILN_CHECK(comm_, "NCCL ", what, ": the communicator was aborted after an earlier error (read it above); end "
               "every rank and start again");
}

// One NCCL call per rank's piece of x, call(piece, count, r), all in one group: NCCL runs them
// together as one operation. Waits for it.
template <typename PerPiece>
void NcclCommunicator::for_each_piece(Tensor& x, const std::vector<int64_t>& offsets, const char* op,
                                      const std::string& what, PerPiece&& call) {
    float* p = device_floats(x, op);
    check_pieces(offsets, size(), x.numel(), std::string("NCCL ") + op);
    wait(launch(what + " of " + std::to_string(x.numel()) + " floats", [&] {
        NCCL_CHECK(ncclGroupStart());
        for (int r = 0; r < size(); r++)
            call(p + offsets[size_t(r)], size_t(offsets[size_t(r) + 1] - offsets[size_t(r)]), r);
        NCCL_CHECK(ncclGroupEnd());
    }));
}

// Rank r's piece := Σ_ranks of piece r. NCCL's own ncclReduceScatter wants equal pieces (rank r's
// at r·count), and the last piece of even_pieces may be shorter: padding would need a copy of x
// one piece longer. Instead, p reduces, piece r to root r, in one group, and every rank sends
// each other rank's piece once, as in a reduce-scatter.
void NcclCommunicator::reduce_scatter(Tensor x, const std::vector<int64_t>& offsets) {
    for_each_piece(x, offsets, "reduce_scatter", "reduce-scatter", [&](float* piece, size_t n, int r) {
        NCCL_CHECK(ncclReduce(piece, piece, n, ncclFloat, ncclSum, r, comm_, stream_));
    });
}

// Every piece from its rank to all: p broadcasts in one group (ncclAllGather wants equal pieces,
// as above).
void NcclCommunicator::all_gather(Tensor x, const std::vector<int64_t>& offsets) {
    for_each_piece(x, offsets, "all_gather", "all-gather", [&](float* piece, size_t n, int r) {
        NCCL_CHECK(ncclBroadcast(piece, piece, n, ncclFloat, r, comm_, stream_));
    });
}

// x := rank root's x, as raw bytes (every dtype).
void NcclCommunicator::broadcast(Tensor x, int root) {
    KILN_CHECK(root >= 0 && root < size(), "broadcast from rank ", root, " in a world of ", size(), " ranks");
    void* bytes = device_bytes(x, "broadcast");
    const size_t n = x.nbytes();
    wait(launch("broadcast of " + std::to_string(n) + " bytes", [&] {
        NCCL_CHECK(ncclBroadcast(bytes, bytes, n, ncclUint8, root, comm_, stream_));
    }));
}

// Host numbers go through MPI, with this communicator's timeout.
double NcclCommunicator::sum(double v) {
    mpi_.set_timeout(timeout_seconds());
    return mpi_.sum(v);
}

std::vector<int64_t> NcclCommunicator::gather_all(int64_t v) {
    mpi_.set_timeout(timeout_seconds());
    return mpi_.gather_all(v);
}

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(MpiCommunicator& mpi, int device) {
    return std::make_unique<NcclCommunicator>(mpi, device);
}

}  // namespace kiln
