// test_ring.cpp — lesson 12's exercise, the ring all-reduce (dist/ring.h), on 1 to 5 ranks
// simulated by threads in one process: for p > 2 the chunk arithmetic really turns (on 2 ranks a
// ring that runs one step too few, or sends the wrong chunk, can still come out right). On MPI
// ranks against MPI_Allreduce: tests/mpi/test_ring.cpp.
#include <catch2/catch.hpp>

#include <vector>

#include "dist/ring.h"

using namespace kiln;

namespace {

// Rank r's element i: a small integer in [−8, 8], so any sum over ranks is exact in f32.
float small_integer(int r, int64_t i) { return float((i * 7 + r * 13) % 17 - 8); }

}  // namespace

TEST_CASE("the ring all-reduce on p simulated ranks gives every rank the exact sums", "[lesson12][cpu][ring]") {
    for (int p = 1; p <= 5; p++) {
        for (int64_t n : {int64_t(0), int64_t(1), int64_t(2), int64_t(p - 1), int64_t(p), int64_t(p + 1), int64_t(1001)}) {
            if (n < 0) continue;
            INFO(p << " ranks, n = " << n);
            std::vector<std::vector<float>> x(static_cast<size_t>(p), std::vector<float>(static_cast<size_t>(n)));
            std::vector<float*> xs;
            for (int r = 0; r < p; r++) {
                for (int64_t i = 0; i < n; i++) x[size_t(r)][size_t(i)] = small_integer(r, i);
                xs.push_back(x[size_t(r)].data());
            }
            simulate_ring_all_reduce(xs, n);
            int64_t wrong = 0, first = -1;  // over every rank's every element
            for (int r = 0; r < p; r++)
                for (int64_t i = 0; i < n; i++) {
                    float sum = 0;
                    for (int q = 0; q < p; q++) sum += small_integer(q, i);
                    if (x[size_t(r)][size_t(i)] != sum && wrong++ == 0) first = r * n + i;
                }
            INFO("first wrong: rank " << (first < 0 ? -1 : first / std::max<int64_t>(n, 1)) << ", element "
                                      << (first < 0 ? -1 : first % std::max<int64_t>(n, 1)));
            REQUIRE(wrong == 0);
        }
    }
}

TEST_CASE("the ring all-reduce refuses a negative size", "[lesson12][cpu][ring]") {
    float x[1] = {1.0f};
    REQUIRE_THROWS_WITH(simulate_ring_all_reduce({x, x}, -1), Catch::Contains("want n ≥ 0"));
}
