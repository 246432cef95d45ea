// test_cost_model.cpp — the α–β model of all-reduce (dist/cost_model.h) against costs worked out
// by hand, the properties the model must have (ring = reduce-scatter + all-gather, the tree wins
// small messages and the ring large ones, overlap between its bounds), the table and the figure.
//
// The hand cases use powers of two for α, B and n, so that every product and quotient is exact
// in double and the costs compare with ==.
//
// The figure lessons/12-data-parallel/figures/scaling.svg is written by a hidden case; from the
// repository root:   build/tests/kiln_tests '[scaling-figure]'
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <iostream>

#include "dist/cost_model.h"

using namespace kiln;

namespace {

const double kAlpha = std::ldexp(1, -20);  // about 1 µs
const double kB = std::ldexp(1, 30);       // about 1 GB/s
const Link kLink{"test link", kAlpha, kB};

// The examples of the lesson. Compute per step is an assumption the caller makes (the lesson-12
// trainer passes what it measured):
// - ResNet-50, batch 256 per GPU, 100 ms a step (2,560 images/s per GPU: the order NVIDIA
//   publishes for ResNet-50 training in mixed precision on one A100/H100), backward taking twice
//   forward (it computes two products per layer, dL/dx and dL/dW, forward one);
// - LeNet, batch 64, 0.3 ms a step: on a GPU so small a net is bound by its some 60 kernel
//   launches of a few µs each, not by arithmetic.
Workload resnet50_example() { return {"ResNet-50-sized", 0.1 / 3, 0.2 / 3, 256, kResnet50GradientBytes}; }
Workload lenet_example() { return {"LeNet-sized", 0.0001, 0.0002, 64, kLenetGradientBytes}; }

}  // namespace

TEST_CASE("ring, tree, reduce-scatter and all-gather by hand", "[lesson12][cpu][cost]") {
    const double n = std::ldexp(1, 20);  // 1 MiB: n/B = 2^-10 s
    // p = 2: one step of n/2 each way, twice: 2α + n/B
    REQUIRE(ring_allreduce_s(n, 2, kLink) == 2 * kAlpha + n / kB);
    // p = 4: 6 steps of n/4: 6α + 2·(3/4)·n/B
    REQUIRE(ring_allreduce_s(n, 4, kLink) == 6 * kAlpha + 1.5 * n / kB);
    REQUIRE(reduce_scatter_s(n, 4, kLink) == 3 * kAlpha + 0.75 * n / kB);
    REQUIRE(all_gather_s(n, 4, kLink) == 3 * kAlpha + 0.75 * n / kB);
    // tree: 2⌈log2 p⌉ α + 2n/B; ⌈log2 4⌉ = 2, ⌈log2 5⌉ = 3
    REQUIRE(tree_allreduce_s(n, 4, kLink) == 4 * kAlpha + 2 * n / kB);
    REQUIRE(tree_allreduce_s(n, 5, kLink) == 6 * kAlpha + 2 * n / kB);
    // one rank has nothing to exchange
    for (Algorithm a : {Algorithm::Ring, Algorithm::Tree, Algorithm::Faster}) REQUIRE(allreduce_s(n, 1, a, kLink) == 0);
    REQUIRE(reduce_scatter_s(n, 1, kLink) == 0);
    REQUIRE(all_gather_s(n, 1, kLink) == 0);
    REQUIRE(hierarchical_allreduce_s(n, 1, Algorithm::Ring, dgx_h100_cluster()) == 0);
}

TEST_CASE("a ring all-reduce is a reduce-scatter and an all-gather", "[lesson12][cpu][cost]") {
    for (int p : {1, 2, 3, 8, 100, 512})
        for (double n : {0.0, 1000.0, kResnet50GradientBytes}) {
            CAPTURE(p, n);
            REQUIRE(ring_allreduce_s(n, p, kLink) == reduce_scatter_s(n, p, kLink) + all_gather_s(n, p, kLink));
        }
}

TEST_CASE("small messages favour the tree, large ones the ring", "[lesson12][cpu][cost]") {
    // p = 8: tree − ring = 2n/(8B) − 2·(7 − 3)·α, zero at n = 32·α·B = 32 KiB here
    const double crossover = 32 * kAlpha * kB;
    REQUIRE(crossover == 32768);
    const double small = 4096, large = std::ldexp(1, 20);
    REQUIRE(tree_allreduce_s(small, 8, kLink) == 14 * kAlpha);  // 6α + 2·4 KiB/B = 6α + 8α
    REQUIRE(ring_allreduce_s(small, 8, kLink) == 21 * kAlpha);  // 14α + 2·(7/8)·4 KiB/B = 14α + 7α
    REQUIRE(tree_allreduce_s(crossover, 8, kLink) == ring_allreduce_s(crossover, 8, kLink));  // 70α each
    REQUIRE(tree_allreduce_s(large, 8, kLink) == 2054 * kAlpha);
    REQUIRE(ring_allreduce_s(large, 8, kLink) == 1806 * kAlpha);
    // Faster picks whichever wins
    REQUIRE(allreduce_s(small, 8, Algorithm::Faster, kLink) == tree_allreduce_s(small, 8, kLink));
    REQUIRE(allreduce_s(large, 8, Algorithm::Faster, kLink) == ring_allreduce_s(large, 8, kLink));
    // on 2 ranks both have one step each way, and the ring sends half as much: it always wins
    REQUIRE(ring_allreduce_s(small, 2, kLink) < tree_allreduce_s(small, 2, kLink));
}

TEST_CASE("hierarchical all-reduce: the flat ring on one node, three stages beyond", "[lesson12][cpu][cost]") {
    const Cluster dgx = dgx_h100_cluster();
    REQUIRE(dgx.gpus_per_node == 8);
    REQUIRE(dgx.intra.bytes_per_s == 450e9);  // 900 GB/s bidirectional
    REQUIRE(dgx.inter.bytes_per_s == 50e9);   // 400 Gb/s
    for (int p = 1; p <= 8; p++)
        for (double n : {1e3, kResnet50GradientBytes}) {
            CAPTURE(p, n);
            REQUIRE(hierarchical_allreduce_s(n, p, Algorithm::Ring, dgx) == ring_allreduce_s(n, p, dgx.intra));
            REQUIRE(hierarchical_allreduce_s(n, p, Algorithm::Tree, dgx) == tree_allreduce_s(n, p, dgx.intra));
        }
    // 16 GPUs = 2 nodes of 8, n = 8 MiB: reduce-scatter on the fast link (7α + (7/8)·n/B), a ring
    // of 2 nodes over n/8 = 1 MiB on the slow one (2α' + (n/8)/B'), all-gather (as the scatter)
    const Link slow{"slow link", std::ldexp(1, -17), std::ldexp(1, 27)};
    const Cluster two_level{kLink, slow, 8};
    const double n = std::ldexp(1, 23);
    const double by_hand = 2 * (7 * kAlpha + 0.875 * n / kB) + 2 * slow.alpha_s + n / 8 / slow.bytes_per_s;
    REQUIRE(hierarchical_allreduce_s(n, 16, Algorithm::Ring, two_level) == by_hand);
    // only n/8 crosses the slow link: far cheaper than a flat ring of 16 on it
    REQUIRE(hierarchical_allreduce_s(n, 16, Algorithm::Ring, two_level) < ring_allreduce_s(n, 16, slow) / 4);
}

TEST_CASE("bad input to the cost model names the argument", "[lesson12][cpu][cost]") {
    REQUIRE_THROWS_WITH(ring_allreduce_s(1e6, 0, kLink), Catch::Contains("p, the number of ranks, must be at least 1"));
    REQUIRE_THROWS_WITH(tree_allreduce_s(-1, 4, kLink), Catch::Contains("bytes must be a finite size >= 0, got -1"));
    REQUIRE_THROWS_WITH(reduce_scatter_s(NAN, 4, kLink), Catch::Contains("bytes must be"));
    const Link dead{"dead link", 1e-6, 0};
    REQUIRE_THROWS_WITH(all_gather_s(1e6, 4, dead),
                        Catch::Contains("bandwidth bytes_per_s of the link 'dead link' must be > 0"));
    const Link backwards{"odd link", -1e-6, 1e9};
    REQUIRE_THROWS_WITH(ring_allreduce_s(1e6, 4, backwards), Catch::Contains("latency alpha_s of the link 'odd link'"));
    REQUIRE_THROWS_WITH(hierarchical_allreduce_s(1e6, 12, Algorithm::Ring, dgx_h100_cluster()),
                        Catch::Contains("p = 12 GPUs is not a whole number of nodes of 8"));
    REQUIRE_THROWS_WITH(bucket_sizes(1e6, 0), Catch::Contains("bucket_bytes must be > 0"));
    Workload w = resnet50_example();
    w.backward_s = -1;
    REQUIRE_THROWS_WITH(predict_step(w, 8, true, Algorithm::Ring, dgx_h100_cluster()),
                        Catch::Contains("'ResNet-50-sized': forward_s and backward_s must be >= 0"));
    w = resnet50_example();
    w.batch_per_rank = 0;
    REQUIRE_THROWS_WITH(predict_step(w, 8, true, Algorithm::Ring, dgx_h100_cluster()),
                        Catch::Contains("batch_per_rank must be at least 1"));
}

TEST_CASE("buckets: full ones in the order backward fills them, then the rest", "[lesson12][cpu][cost]") {
    REQUIRE(bucket_sizes(10, 4) == std::vector<double>{4, 4, 2});
    REQUIRE(bucket_sizes(8, 4) == std::vector<double>{4, 4});
    REQUIRE(bucket_sizes(3, 4) == std::vector<double>{3});
    REQUIRE(bucket_sizes(0, 4).empty());
    // ResNet-50's 102.2 MB in 25 MiB buckets: 3 full and 23.6 MB
    const std::vector<double> resnet = bucket_sizes(kResnet50GradientBytes, kDefaultBucketBytes);
    REQUIRE(resnet.size() == 4);
    REQUIRE(resnet.back() == kResnet50GradientBytes - 3 * kDefaultBucketBytes);
}

TEST_CASE("the overlapped step's timeline by hand", "[lesson12][cpu][cost]") {
    // 2 GPUs on one link with α = 1/4 s and B = 1 MiB/s: a 1 MiB bucket's all-reduce takes
    // 2α + 1 s = 1.5 s. Three buckets, ready at 1, 2 and 3 s into a 3 s backward:
    //   e1 = 1 + 1.5 = 2.5,  e2 = max(2, 2.5) + 1.5 = 4,  e3 = max(3, 4) + 1.5 = 5.5
    const double mib = std::ldexp(1, 20);
    const Cluster one_link{{"slow", 0.25, mib}, {"unused", 0.25, mib}, 8};
    Workload w{"by hand", 1.0, 3.0, 32, 3 * mib, mib};
    const StepPrediction overlapped = predict_step(w, 2, true, Algorithm::Ring, one_link);
    REQUIRE(overlapped.step_s == 1.0 + 5.5);
    // one all-reduce of 3 MiB after backward: 1 + 3 + (2α + 3 s)
    const StepPrediction plain = predict_step(w, 2, false, Algorithm::Ring, one_link);
    REQUIRE(plain.allreduce_s == 3.5);
    REQUIRE(plain.step_s == 7.5);
    REQUIRE(plain.efficiency == 4.0 / 7.5);
    REQUIRE(plain.images_per_s == 2 * 32 / 7.5);
    // With nothing to hide under (backward takes no time), the three buckets pay 2α each where
    // one all-reduce pays it once: overlap is slower by 2 × 2α = 1 s.
    w.backward_s = 0;
    REQUIRE(predict_step(w, 2, true, Algorithm::Ring, one_link).step_s == 1.0 + 4.5);
    REQUIRE(predict_step(w, 2, false, Algorithm::Ring, one_link).step_s == 1.0 + 3.5);
}

TEST_CASE("overlap lies between its bounds; one GPU scales perfectly", "[lesson12][cpu][cost]") {
    // Bounds, for any gradients, compute, p and algorithm:
    //   upper: the same buckets all-reduced one after another after backward, fwd + bwd + Σ T(b_i)
    //          (summed here in the timeline's order, so that rounding keeps the ≤ exact);
    //   lower: fwd + max(bwd, T(n)) — backward must end, and all bytes must cross.
    // The lower bound and the timeline add different terms: a slack of 16 roundings of double
    // (u = 2^-53) relative covers it.
    const double slack = 1 - 16 * std::ldexp(1, -53);
    const Cluster dgx = dgx_h100_cluster();
    for (double n : {kLenetGradientBytes, 1e6, kResnet50GradientBytes, 3e8})
        for (double backward : {0.0, 1e-4, 1e-2, 0.1})
            for (int p : {1, 2, 4, 8, 16, 64, 512})
                for (Algorithm a : {Algorithm::Ring, Algorithm::Tree, Algorithm::Faster}) {
                    const Workload w{"grid", 0.01, backward, 32, n};
                    CAPTURE(n, backward, p, algorithm_name(a));
                    const double overlapped = predict_step(w, p, true, a, dgx).step_s;
                    double upper = w.backward_s;
                    for (double b : bucket_sizes(n, w.bucket_bytes)) upper += hierarchical_allreduce_s(b, p, a, dgx);
                    REQUIRE(overlapped <= w.forward_s + upper);
                    const double lower = w.forward_s + std::max(w.backward_s, hierarchical_allreduce_s(n, p, a, dgx));
                    REQUIRE(overlapped >= slack * lower);
                    if (p == 1) REQUIRE(predict_step(w, p, true, a, dgx).efficiency == 1);
                }
}

TEST_CASE("overlap pays off for ResNet-50 on up to 512 GPUs", "[lesson12][cpu][cost]") {
    // 4 buckets of ≤ 26.2 MB; each all-reduce (≤ 2 ms at 512 GPUs) is far shorter than the
    // 67 ms backward, so all but the last hide under it.
    const Cluster dgx = dgx_h100_cluster();
    const Workload w = resnet50_example();
    for (int p : {2, 8, 64, 512})
        for (Algorithm a : {Algorithm::Ring, Algorithm::Tree, Algorithm::Faster}) {
            CAPTURE(p, algorithm_name(a));
            const StepPrediction plain = predict_step(w, p, false, a, dgx), overlapped = predict_step(w, p, true, a, dgx);
            REQUIRE(overlapped.step_s < plain.step_s);
            // the stream keeps up: the step is compute plus the last bucket's all-reduce (added in
            // the timeline's order, fwd + (bwd + last), so that the doubles agree exactly)
            const double last = hierarchical_allreduce_s(bucket_sizes(w.gradient_bytes, w.bucket_bytes).back(), p, a, dgx);
            REQUIRE(overlapped.step_s == w.forward_s + (w.backward_s + last));
        }
}

TEST_CASE("scaling_table prints one row per GPU count", "[lesson12][cpu][cost]") {
    const Workload w = resnet50_example();
    const std::string table = scaling_table(w, dgx_h100_cluster());
    INFO(table);
    REQUIRE(table.find("ResNet-50-sized: 102.2 MB of gradients, 100.0 ms of compute per step") != std::string::npos);
    REQUIRE(table.find("4 bucket(s) of at most 26.2 MB") != std::string::npos);
    REQUIRE(table.find("NVLink 4 (α 3.4 µs, 450 GB/s)") != std::string::npos);
    // p = 1: nothing to all-reduce, the step is the compute, 256 images in 0.1 s
    REQUIRE(table.find("     1     0.000     0.000               100.000            100.000       100.0%       2560\n") !=
            std::string::npos);
    for (const char* row : {"\n     2 ", "\n     8 ", "\n    64 ", "\n   512 "}) REQUIRE(table.find(row) != std::string::npos);
}

TEST_CASE("scaling_svg draws four curves per workload", "[lesson12][cpu][cost]") {
    const std::string svg = scaling_svg({resnet50_example(), lenet_example()}, dgx_h100_cluster());
    size_t polylines = 0;
    for (size_t at = svg.find("<polyline"); at != std::string::npos; at = svg.find("<polyline", at + 1)) polylines++;
    REQUIRE(polylines == 2 * (4 + 1));  // per panel: 4 curves and the axes' frame
    REQUIRE(svg.find("ResNet-50-sized") != std::string::npos);
    REQUIRE(svg.find("LeNet-sized") != std::string::npos);
    REQUIRE(svg.find("tree, one all-reduce after backward") != std::string::npos);
    REQUIRE_THROWS_WITH(scaling_svg({}, dgx_h100_cluster()), Catch::Contains("no workload to draw"));
}

TEST_CASE("write lessons/12-data-parallel/figures/scaling.svg", "[.][figure][scaling-figure]") {
    const Workload resnet = resnet50_example(), lenet = lenet_example();
    std::ofstream out("lessons/12-data-parallel/figures/scaling.svg");
    REQUIRE(out);  // run from the repository root
    out << scaling_svg({resnet, lenet}, dgx_h100_cluster());
    std::cout << scaling_table(resnet, dgx_h100_cluster()) << "\n" << scaling_table(lenet, dgx_h100_cluster());
}
