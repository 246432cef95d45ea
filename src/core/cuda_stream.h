// cuda_stream.h — a second stream, and events: what chapter 15's overlapped offload
// (optim/offload.h) orders its copies with. Implemented in cuda/memory.cu, beside the copies
// (core/cuda_memory.h).
//
// kiln launches every kernel on one stream (the legacy default stream; a Graph's while it
// captures). A CopyStream is a second one, made with cudaStreamNonBlocking so that it has no
// implicit order with the first: its copies run beside the kernels, on the GPU's copy engines.
// What orders the two is an Event: recorded at a point of one stream's work, it is waited for by
// the host (Event::synchronize), by the copy stream (CopyStream::wait) or by the kernels
// (launch_stream_wait). On kiln's emulator a CopyStream's copies run only when something waits for
// them (cuda/emu/README.md), the latest a GPU could run them: a missing wait reads stale bytes.
#pragma once
#include <cstddef>

namespace kiln::cuda {

class Event {
public:
    Event();
    ~Event();
    Event(const Event&) = delete;
    Event& operator=(const Event&) = delete;
    void record();             // after the kernels launched so far (on the launch stream)
    void synchronize() const;  // the host waits until the work before the latest record has run
    void* handle() const { return event_; }  // cudaEvent_t

private:
    void* event_ = nullptr;
};

class CopyStream {
public:
    CopyStream();
    ~CopyStream();  // waits for its copies, then destroys the stream
    CopyStream(const CopyStream&) = delete;
    CopyStream& operator=(const CopyStream&) = delete;
    void wait(const Event& e);  // the copies queued from now on run after e
    void record(Event& e);      // e: after the copies queued so far
    // cudaMemcpyAsync on this stream: from or to pinned host memory it returns at once; the host
    // bytes must not be read (copy_to_host) or changed (copy_to_device) until an event recorded
    // after it has happened.
    void copy_to_host(void* dst, const void* src, size_t bytes);
    void copy_to_device(void* dst, const void* src, size_t bytes);
    void synchronize();

private:
    void* stream_ = nullptr;  // cudaStream_t
};

// The kernels (and the copies and fills kiln queues like them) launched from now on run after `e`.
void launch_stream_wait(const Event& e);

}  // namespace kiln::cuda
