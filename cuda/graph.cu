// graph.cu — cuda::Graph (core/cuda_memory.h): a sequence of kiln's launches recorded once by
// stream capture and launched again in one call.
//
// Capture needs a stream of its own: the legacy default stream, where kiln launches everything
// else, cannot capture. While it captures, KILN_LAUNCH and memory.cu's device-side copies and
// fills go to it (cuda_detail::launch_stream); nothing runs on it, so its order with other work
// does not matter — the graph is launched on the legacy stream, after the work queued there.
// It is created non-blocking (cudaStreamNonBlocking): the legacy stream does not wait for it, so
// the data loader's thread may go on copying batches on the legacy stream during a capture. The
// mode is cudaStreamCaptureModeThreadLocal: on the capturing thread a call that cannot be
// captured (an allocation, a synchronous copy, a wait) fails and invalidates the capture instead
// of silently running outside the graph; the loader's thread is not affected.
#include "core/cuda_memory.h"
#include "kiln_cuda.h"

#include <exception>

namespace kiln::cuda {
namespace {
std::atomic<int64_t> graphs_launched{0};
}  // namespace

Graph::~Graph() {
    reset();
    if (stream_) (void)cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

void Graph::reset() {
    if (exec_) (void)cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
    if (graph_) (void)cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
    exec_ = graph_ = nullptr;
}

void Graph::capture(const std::function<void()>& work) {
    reset();
    KILN_CHECK(!capturing(), "cuda::Graph::capture: another capture is running (captures do not nest)");
    if (!stream_) {
        cudaStream_t s = nullptr;
        KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        stream_ = s;
    }
    cudaStream_t s = static_cast<cudaStream_t>(stream_);
    KILN_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    cuda_detail::launch_stream_slot().store(s);
    std::exception_ptr failed;
    try {
        work();
    } catch (...) {
        failed = std::current_exception();
    }
    cuda_detail::launch_stream_slot().store(nullptr);
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(s, &graph);
    if (failed) {  // the work's own error says what happened; the capture's end only confirms it
        if (graph) (void)cudaGraphDestroy(graph);
        (void)cudaGetLastError();
        std::rethrow_exception(failed);
    }
    KILN_CUDA_CHECK(ended);
    graph_ = graph;
    cudaGraphExec_t exec = nullptr;
    KILN_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    exec_ = exec;
}

void Graph::launch() {
    KILN_CHECK(exec_, "cuda::Graph::launch: nothing was captured");
    KILN_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), nullptr));
    graphs_launched++;
}

int64_t graph_launches() { return graphs_launched.load(); }

}  // namespace kiln::cuda
