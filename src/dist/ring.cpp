// ring.cpp — the ring all-reduce: reduce-scatter then all-gather around the ring (ring.h draws
// it), and p ranks simulated by threads to run it on.
#include "dist/ring.h"

#include <climits>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "dist/comm.h"

namespace kiln {

namespace {

// Chunk k of x is x[offsets[k], offsets[k + 1]).
struct Chunks {
    std::vector<int64_t> offsets;
    float* begin(float* x, int k) const { return x + offsets[size_t(k)]; }
    int count(int k) const { return int(offsets[size_t(k) + 1] - offsets[size_t(k)]); }
};

// a mod p in [0, p), also for negative a (C++'s % keeps the sign of a).
int ring_index(int a, int p) { return (a % p + p) % p; }

}  // namespace

void ring_all_reduce(float* x, int64_t n, int rank, int p, const RingPass& pass) {
    KILN_CHECK(n >= 0, "ring_all_reduce of ", n, " floats: want n ≥ 0");
    const Chunks c{even_pieces(n, p)};
    KILN_CHECK(c.offsets[1] <= INT_MAX, "ring_all_reduce of ", n, " floats over ", p, " ranks: a chunk of ",
               c.offsets[1], " floats is more than an MPI count (int) holds; split x");
    std::vector<float> received(size_t(c.offsets[1]));  // the largest chunk: chunk 0
    // One step: send chunk `out` to the right while chunk `in` arrives from the left (the left
    // neighbour sends its chunk `in` in the same step, so both sides agree on the count).
    const auto step = [&](int out, int in, float* into) { pass(c.begin(x, out), c.count(out), into, c.count(in)); };

    // Reduce-scatter: after step s, the chunk received holds the sum of s + 2 ranks' copies.
    for (int s = 0; s < p - 1; s++) {
        const int out = ring_index(rank - s, p), in = ring_index(rank - s - 1, p);
        step(out, in, received.data());
        float* mine = c.begin(x, in);
        for (int i = 0; i < c.count(in); i++) mine[i] += received[size_t(i)];
    }
    // All-gather: rank r starts with the whole sum of chunk (r + 1) mod p and passes sums on.
    for (int s = 0; s < p - 1; s++) {
        const int out = ring_index(rank + 1 - s, p), in = ring_index(rank - s, p);
        step(out, in, c.begin(x, in));
    }
}

namespace {

// The threads' meeting point: every rank waits until all p have arrived (a reusable barrier).
class Barrier {
public:
    explicit Barrier(int p) : p_(p) {}
    void wait() {
        std::unique_lock<std::mutex> lock(mu_);
        const int64_t generation = generation_;
        if (++arrived_ == p_) {
            arrived_ = 0, generation_++;
            cv_.notify_all();
            return;
        }
        cv_.wait(lock, [&] { return generation_ != generation; });
    }

private:
    std::mutex mu_;
    std::condition_variable cv_;
    int p_, arrived_ = 0;
    int64_t generation_ = 0;
};

}  // namespace

void simulate_ring_all_reduce(const std::vector<float*>& xs, int64_t n) {
    const int p = int(xs.size());
    struct Outbox {
        const float* data = nullptr;
        int count = 0;
    };
    std::vector<Outbox> outbox(static_cast<size_t>(p));  // what each rank sends this step
    Barrier barrier(p);
    std::vector<std::string> errors(static_cast<size_t>(p));
    std::vector<std::thread> ranks;
    for (int r = 0; r < p; r++) {
        ranks.emplace_back([&, r] {
            // post the chunk; once all have posted, take the left neighbour's; once all have
            // taken theirs, the step is over and the senders may change their buffers again
            const RingPass pass = [&](const float* send, int send_count, float* receive, int receive_count) {
                outbox[size_t(r)] = {send, send_count};
                barrier.wait();
                const Outbox& left = outbox[size_t((r + p - 1) % p)];
                KILN_CHECK(left.count == receive_count, "simulated ring: rank ", r, " expects ", receive_count,
                           " floats from its left neighbour, which sends ", left.count);
                if (receive_count > 0) std::memcpy(receive, left.data, size_t(receive_count) * sizeof(float));
                barrier.wait();
            };
            try {
                ring_all_reduce(xs[size_t(r)], n, r, p, pass);
            } catch (const std::exception& e) {
                errors[size_t(r)] = e.what();  // (a rank that fails mid-ring leaves the others waiting:
                                               // the checks above come before any step)
            }
        });
    }
    for (std::thread& t : ranks) t.join();
    for (const std::string& e : errors) KILN_CHECK(e.empty(), e);
}

}  // namespace kiln
