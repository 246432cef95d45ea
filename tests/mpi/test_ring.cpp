// test_ring.cpp — lesson 12's exercise, the ring all-reduce on MPI point-to-point messages
// (src/mpi/ring_all_reduce.h), checked against MPI_Allreduce. Any number of ranks:
//   mpirun -np 3 build/tests/kiln_mpi_tests '[ring]'     (make test runs 2; as root add
//   --allow-run-as-root --oversubscribe)
#include <mpi.h>

#include <cmath>
#include <vector>

#include <catch2/catch.hpp>

#include "core/error.h"
#include "core/rng.h"
#include "mpi/ring_all_reduce.h"

using namespace kiln;
using Catch::Matchers::Contains;

namespace {

int world_rank() {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}

int world_size() {
    int p = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &p);
    return p;
}

// Rank r's element i: a small integer in [−8, 8], so any sum over ranks (|sum| ≤ 8p < 2^24) is
// exact in f32 whatever the order of the additions.
float small_integer(int r, int64_t i) { return float((i * 7 + r * 13) % 17 - 8); }

std::vector<float> small_integers(int r, int64_t n) {
    std::vector<float> x(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; i++) x[size_t(i)] = small_integer(r, i);
    return x;
}

std::vector<float> mpi_sum(std::vector<float> x) {
    MPI_Allreduce(MPI_IN_PLACE, x.data(), int(x.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    return x;
}

// The first index where a and b differ, or −1 (a whole vector in a failure message would be
// megabytes).
int64_t first_difference(const std::vector<float>& a, const std::vector<float>& b) {
    for (size_t i = 0; i < a.size(); i++)
        if (a[i] != b[i]) return int64_t(i);
    return -1;
}

}  // namespace

TEST_CASE("the ring all-reduce gives MPI_Allreduce's sums of small integers exactly", "[lesson12][cpu][mpi][ring]") {
    const int r = world_rank(), p = world_size();
    // n = 0 and n < p leave some ranks' chunks empty; 1001 and 2^20 + 3 do not divide evenly.
    for (int64_t n : {int64_t(0), int64_t(1), int64_t(3), int64_t(1000), int64_t(1001), int64_t((1 << 20) + 3)}) {
        INFO("n = " << n << ", " << p << " ranks");
        std::vector<float> ring = small_integers(r, n);
        ring_all_reduce(ring.data(), n, MPI_COMM_WORLD);
        const std::vector<float> reference = mpi_sum(small_integers(r, n));
        REQUIRE(first_difference(ring, reference) == -1);
        // and the sums themselves, element by element (an all-reduce that did nothing would
        // still agree with itself on one rank)
        std::vector<float> exact(size_t(n), 0.0f);
        for (int q = 0; q < p; q++)
            for (int64_t i = 0; i < n; i++) exact[size_t(i)] += small_integer(q, i);
        REQUIRE(first_difference(ring, exact) == -1);
    }
}

TEST_CASE("the ring all-reduce of random floats is within the rounding of MPI_Allreduce's", "[lesson12][cpu][mpi][ring]") {
    const int r = world_rank(), p = world_size();
    const int64_t n = 100003;
    Rng rng(100 + uint64_t(r));  // each rank its own values in [−1, 1)
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = 2 * Rng::to_unit(rng.next_u64()) - 1;

    std::vector<float> ring = x;
    ring_all_reduce(ring.data(), n, MPI_COMM_WORLD);
    const std::vector<float> reference = mpi_sum(x);
    std::vector<double> magnitude(x.begin(), x.end());  // Σ_r |x_r[i]|, in double
    for (double& m : magnitude) m = std::abs(m);
    MPI_Allreduce(MPI_IN_PLACE, magnitude.data(), int(n), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);

    // Both add p numbers with p − 1 roundings, in different orders (the ring's order follows the
    // chunk's place on the ring; MPI's depends on its algorithm). Any order of summation is within
    // γ_{p−1} Σ_r |x_r[i]| of the exact sum (Higham, Accuracy and Stability, §4.2), with
    // γ_k = k·u / (1 − k·u) and u = 2^-24 for f32; so the two differ by at most twice that.
    // (With 2 ranks both add the same two numbers, a + b = b + a: they agree exactly.)
    const double u = std::ldexp(1.0, -24), gamma = (p - 1) * u / (1 - (p - 1) * u);
    int64_t outside = 0;
    for (int64_t i = 0; i < n; i++)
        if (std::abs(double(ring[size_t(i)]) - double(reference[size_t(i)])) > 2 * gamma * magnitude[size_t(i)])
            outside++;
    REQUIRE(outside == 0);
    if (p == 2) REQUIRE(first_difference(ring, reference) == -1);
}

TEST_CASE("the ring all-reduce on one rank leaves x as it is, and refuses a negative size", "[lesson12][cpu][mpi][ring]") {
    std::vector<float> x = small_integers(world_rank(), 10);
    const std::vector<float> before = x;
    ring_all_reduce(x.data(), 10, MPI_COMM_SELF);  // a ring of one: no step
    REQUIRE(x == before);
    REQUIRE_THROWS_WITH(ring_all_reduce(x.data(), -1, MPI_COMM_WORLD), Contains("want n ≥ 0"));
}
