// test_parallel.cpp — core/parallel.h: every index once, chunks no shorter than the grain, the
// calling thread working too, nesting, and an exception in a chunk reaching the caller; and
// ops/cpu/conv_tasks.h's groups of work in scratch slots.
//
//   ./kiln_tests '[parallel]'
#include <omp.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/parallel.h"
#include "ops/cpu/conv_tasks.h"

using namespace kiln;

namespace {

// Sets the thread count for one scope (what OMP_NUM_THREADS or --threads set).
struct Threads {
    explicit Threads(int n) : saved(omp_get_max_threads()) { omp_set_num_threads(n); }
    ~Threads() { omp_set_num_threads(saved); }
    int saved;
};

}  // namespace

TEST_CASE("parallel_for visits every index exactly once, in chunks of at least the grain",
          "[parallel][cpu][lesson03]") {
    for (int threads : {1, 2, 3, 8}) {
        Threads t(threads);
        for (int64_t n : {0, 1, 7, 1000, 100003})
            for (int64_t grain : {1, 64, 5000}) {
                INFO("threads " << threads << " n " << n << " grain " << grain);
                std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
                std::atomic<int64_t> short_chunks{0}, chunks{0};
                parallel_for(n, grain, [&](int64_t begin, int64_t end) {
                    ++chunks;
                    if (end - begin < grain && end != n) ++short_chunks;  // only the last may be short
                    for (int64_t i = begin; i < end; i++) seen[size_t(i)]++;
                });
                int64_t wrong = 0;
                for (auto& s : seen) wrong += s.load() != 1;
                CHECK(wrong == 0);
                CHECK(short_chunks == 0);
                CHECK(chunks <= std::max<int64_t>(1, 8 * threads));  // about 8 a thread, at most
            }
    }
}

TEST_CASE("parallel_chunks runs each chunk once, the calling thread among the workers",
          "[parallel][cpu][lesson03]") {
    Threads t(2);
    const std::thread::id caller = std::this_thread::get_id();
    std::mutex m;
    std::multiset<int64_t> done;
    bool caller_worked = false;
    // Each chunk sleeps a little, so the caller always finds chunks left to take.
    parallel_chunks(40, [&](int64_t c) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        std::lock_guard<std::mutex> lock(m);
        done.insert(c);
        if (std::this_thread::get_id() == caller) caller_worked = true;
    });
    CHECK(done.size() == 40);
    for (int64_t c = 0; c < 40; c++) CHECK(done.count(c) == 1);
    CHECK(caller_worked);
}

TEST_CASE("for_groups_in_slots runs each group once, never two at once in one slot", "[parallel][cpu][lesson03]") {
    for (int threads : {1, 2, 3, 8})
        for (int64_t groups : {0, 1, 5, 40})
            for (int64_t slots : {1, 2, 3, 16})
                for (bool parallel : {false, true}) {
                    INFO("threads " << threads << " groups " << groups << " slots " << slots << " parallel " << parallel);
                    Threads t(threads);
                    std::vector<std::atomic<int>> seen(static_cast<size_t>(groups)), busy(static_cast<size_t>(slots));
                    std::atomic<int64_t> outside{0}, shared{0};
                    std::mutex m;
                    std::set<int64_t> used;
                    cpu::for_groups_in_slots(groups, slots, parallel, [&](int64_t j, int64_t slot) {
                        if (slot < 0 || slot >= slots) {
                            ++outside;
                            return;
                        }
                        if (busy[size_t(slot)].exchange(1) != 0) ++shared;  // another group is in this slot now
                        std::this_thread::sleep_for(std::chrono::microseconds(50));
                        busy[size_t(slot)] = 0;
                        seen[size_t(j)]++;
                        std::lock_guard<std::mutex> lock(m);
                        used.insert(slot);
                    });
                    int64_t wrong = 0;
                    for (auto& s : seen) wrong += s.load() != 1;
                    CHECK(wrong == 0);
                    CHECK(outside == 0);
                    CHECK(shared == 0);
                    // slots 0 .. tasks − 1, tasks = min(groups, slots, threads); one slot when not parallel
                    const int64_t tasks = parallel ? std::min<int64_t>({groups, slots, threads}) : 1;
                    CHECK(int64_t(used.size()) <= tasks);
                    if (!used.empty()) CHECK(*used.rbegin() < tasks);
                }
}

TEST_CASE("a parallel_for inside a chunk runs on that chunk's thread", "[parallel][cpu][lesson03]") {
    Threads t(3);
    CHECK_FALSE(in_parallel());
    std::atomic<int64_t> inner_total{0}, wrong_thread{0};
    parallel_chunks(6, [&](int64_t) {
        CHECK(in_parallel());
        const std::thread::id me = std::this_thread::get_id();
        parallel_for(10000, 1, [&](int64_t begin, int64_t end) {
            if (std::this_thread::get_id() != me) ++wrong_thread;
            inner_total += end - begin;
        });
    });
    CHECK(inner_total == 6 * 10000);
    CHECK(wrong_thread == 0);
    CHECK_FALSE(in_parallel());
}

TEST_CASE("an exception in a chunk reaches the caller, and the pool works on", "[parallel][cpu][lesson03]") {
    Threads t(2);
    for (int64_t bad : {0, 17, 39}) {
        INFO("chunk " << bad << " throws");
        CHECK_THROWS_WITH(parallel_chunks(40,
                                          [&](int64_t c) {
                                              if (c == bad) throw std::runtime_error("chunk failed");
                                          }),
                          "chunk failed");
        std::atomic<int64_t> sum{0};
        parallel_for(1000, 1, [&](int64_t begin, int64_t end) {
            for (int64_t i = begin; i < end; i++) sum += i;
        });
        CHECK(sum == 999 * 1000 / 2);
    }
}

TEST_CASE("two threads calling parallel_for at once both finish", "[parallel][cpu][lesson03]") {
    Threads t(2);
    std::atomic<int64_t> a{0}, b{0};
    const auto count_into = [](std::atomic<int64_t>& total) {
        for (int rep = 0; rep < 200; rep++)
            parallel_for(5000, 10, [&](int64_t begin, int64_t end) { total += end - begin; });
    };
    std::thread other([&] { count_into(b); });  // its own ICV: omp_get_max_threads() there
    count_into(a);
    other.join();
    CHECK(a == 200 * 5000);
    CHECK(b == 200 * 5000);
}
