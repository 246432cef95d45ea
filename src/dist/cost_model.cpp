// cost_model.cpp — the α–β model of all-reduce and the step-time prediction (see cost_model.h).
#include "dist/cost_model.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>

#include "core/error.h"
#include "io/svg.h"

namespace kiln {

namespace {

void check_collective(const char* what, double bytes, int p, const Link& link) {
    KILN_CHECK(p >= 1, what, ": p, the number of ranks, must be at least 1, got ", p);
    KILN_CHECK(std::isfinite(bytes) && bytes >= 0, what, ": bytes must be a finite size >= 0, got ", bytes);
    KILN_CHECK(std::isfinite(link.alpha_s) && link.alpha_s >= 0, what, ": the latency alpha_s of the link '",
               link.name, "' must be >= 0 seconds, got ", link.alpha_s);
    KILN_CHECK(std::isfinite(link.bytes_per_s) && link.bytes_per_s > 0, what, ": the bandwidth bytes_per_s of the link '",
               link.name, "' must be > 0, got ", link.bytes_per_s,
               " (bytes per second per direction per GPU, e.g. kNvlink4BytesPerS)");
}

// Half a ring: p−1 steps, in each of which every rank sends one of its p slices (n/p bytes) to
// its right neighbour and receives one from its left, all links busy at once:
//     T = (p−1)·α + (p−1)·(n/p)/B
// As a reduce-scatter each rank adds the slice it receives to its own; after p−1 steps it holds
// one slice summed over all ranks. As an all-gather it passes the finished slices on.
double half_ring_s(double bytes, int p, const Link& link) {
    if (p == 1) return 0;
    return (p - 1) * link.alpha_s + double(p - 1) / p * bytes / link.bytes_per_s;
}

// ⌈log2 p⌉, the depth of a binary tree of p ranks.
int tree_depth(int p) {
    int depth = 0;
    while ((int64_t(1) << depth) < p) depth++;
    return depth;
}

}  // namespace

Link nvlink4() { return {"NVLink 4", kNvlinkAlphaS, kNvlink4BytesPerS}; }
Link infiniband_ndr() { return {"InfiniBand NDR", kInfinibandAlphaS, kInfinibandNdrBytesPerS}; }
Cluster dgx_h100_cluster() { return {nvlink4(), infiniband_ndr(), 8}; }

double reduce_scatter_s(double bytes, int p, const Link& link) {
    check_collective("reduce_scatter_s", bytes, p, link);
    return half_ring_s(bytes, p, link);
}

double all_gather_s(double bytes, int p, const Link& link) {
    check_collective("all_gather_s", bytes, p, link);
    return half_ring_s(bytes, p, link);
}

// Ring all-reduce = reduce-scatter, then all-gather of the summed slices:
//     T = 2(p−1)·α + 2·(p−1)/p · n/B
// Each rank sends 2(p−1)/p·n bytes in all — less than 2n, whatever p: the ring is bandwidth-optimal.
double ring_allreduce_s(double bytes, int p, const Link& link) {
    check_collective("ring_allreduce_s", bytes, p, link);
    return 2 * half_ring_s(bytes, p, link);
}

// Tree all-reduce: reduce up a binary tree to the root, then broadcast down it. The buffer is
// cut into small chunks that stream through the tree, so the depth costs latency only — one α
// per level each way — and the bandwidth term is that of one rank's traffic. NCCL's double
// binary tree runs two trees, each with half the buffer, in which every rank is an inner node
// of at most one: a rank receives and sends about n bytes going up and n going down. Hence
//     T ≈ 2·⌈log2 p⌉·α + 2·n/B
// (an approximation: it ignores the pipeline's fill and drain, a few chunk times).
double tree_allreduce_s(double bytes, int p, const Link& link) {
    check_collective("tree_allreduce_s", bytes, p, link);
    if (p == 1) return 0;
    return 2 * tree_depth(p) * link.alpha_s + 2 * bytes / link.bytes_per_s;
}

const char* algorithm_name(Algorithm a) {
    switch (a) {
        case Algorithm::Ring: return "ring";
        case Algorithm::Tree: return "tree";
        case Algorithm::Faster: return "faster";
    }
    return "ring";
}

double allreduce_s(double bytes, int p, Algorithm a, const Link& link) {
    switch (a) {
        case Algorithm::Ring: return ring_allreduce_s(bytes, p, link);
        case Algorithm::Tree: return tree_allreduce_s(bytes, p, link);
        case Algorithm::Faster: return std::min(ring_allreduce_s(bytes, p, link), tree_allreduce_s(bytes, p, link));
    }
    KILN_FAIL("allreduce_s: unknown algorithm ", int(a));
}

// Two levels, g = gpus_per_node GPUs on NVLink in each of m = p/g nodes, the nodes on InfiniBand:
//   1. reduce-scatter inside every node (NVLink): each GPU holds the node's sum of one slice of
//      n/g bytes;
//   2. the m GPUs that hold the same slice, one per node, all-reduce it over InfiniBand: g
//      all-reduces of n/g bytes at the same time, each on its own GPU's adapter;
//   3. all-gather inside every node (NVLink): every GPU has the whole sum.
//     T = RS(n, g, NVLink) + AR(n/g, m, InfiniBand) + AG(n, g, NVLink)
// Only n/g bytes per GPU cross the slow links. With one node (m = 1) this is RS + AG, the ring;
// up to g GPUs the all-reduce is the one-level algorithm on NVLink.
double hierarchical_allreduce_s(double bytes, int p, Algorithm a, const Cluster& cluster) {
    const int g = cluster.gpus_per_node;
    KILN_CHECK(g >= 1, "hierarchical_allreduce_s: gpus_per_node must be at least 1, got ", g);
    if (p <= g) return allreduce_s(bytes, p, a, cluster.intra);
    KILN_CHECK(p % g == 0, "hierarchical_allreduce_s: p = ", p, " GPUs is not a whole number of nodes of ", g,
               " GPUs; use p <= ", g, " or a multiple of ", g);
    return reduce_scatter_s(bytes, g, cluster.intra) + allreduce_s(bytes / g, p / g, a, cluster.inter) +
           all_gather_s(bytes, g, cluster.intra);
}

std::vector<double> bucket_sizes(double gradient_bytes, double bucket_bytes) {
    KILN_CHECK(std::isfinite(gradient_bytes) && gradient_bytes >= 0,
               "bucket_sizes: gradient_bytes must be a finite size >= 0, got ", gradient_bytes);
    KILN_CHECK(std::isfinite(bucket_bytes) && bucket_bytes > 0, "bucket_sizes: bucket_bytes must be > 0, got ",
               bucket_bytes, " (DDP's default is kDefaultBucketBytes, 25 MiB)");
    const double full = std::floor(gradient_bytes / bucket_bytes);
    std::vector<double> sizes(size_t(full), bucket_bytes);
    const double rest = gradient_bytes - full * bucket_bytes;
    if (rest > 0) sizes.push_back(rest);
    return sizes;
}

// Overlap, as a timeline of two resources: the GPU computing backward, and one communication
// stream (NCCL's) all-reducing the buckets in turn. Assumptions: gradients appear at a steady
// rate in bytes during backward, so bucket i (sizes b_1…b_k in the order they fill, Σ b = n) is
// ready at
//     r_i = bwd · (b_1 + … + b_i) / n
// and is all-reduced as soon as it is ready and the stream is free:
//     e_0 = 0,   e_i = max(r_i, e_{i−1}) + T_AR(b_i)
//     T_overlap    = fwd + max(bwd, e_k)          (≥ fwd + bwd + T_AR(b_k): the last bucket waits)
//     T_no_overlap = fwd + bwd + T_AR(n)          (one all-reduce after backward)
// Overlap hides the buckets' all-reduces under backward but pays α-terms k times instead of
// once: it never beats fwd + max(bwd, T_AR(n)), and with nothing to hide under (bwd → 0) it is
// slower than one all-reduce of everything.
StepPrediction predict_step(const Workload& w, int p, bool overlap, Algorithm a, const Cluster& cluster) {
    KILN_CHECK(std::isfinite(w.forward_s) && std::isfinite(w.backward_s) && w.forward_s >= 0 && w.backward_s >= 0 &&
                   w.forward_s + w.backward_s > 0,
               "predict_step: workload '", w.name, "': forward_s and backward_s must be >= 0 seconds and not both 0, got ",
               w.forward_s, " and ", w.backward_s);
    KILN_CHECK(w.batch_per_rank >= 1, "predict_step: workload '", w.name, "': batch_per_rank must be at least 1, got ",
               w.batch_per_rank);
    const double n = w.gradient_bytes;
    StepPrediction r{};
    r.allreduce_s = hierarchical_allreduce_s(n, p, a, cluster);
    if (!overlap) {
        r.step_s = w.forward_s + w.backward_s + r.allreduce_s;
    } else {
        double filled = 0, stream_free = 0;
        for (double b : bucket_sizes(n, w.bucket_bytes)) {
            filled += b;
            const double ready = w.backward_s * (filled / n);  // the last bucket: exactly backward_s
            stream_free = std::max(ready, stream_free) + hierarchical_allreduce_s(b, p, a, cluster);
        }
        r.step_s = w.forward_s + std::max(w.backward_s, stream_free);
    }
    r.efficiency = (w.forward_s + w.backward_s) / r.step_s;  // on one GPU there is nothing to all-reduce
    r.images_per_s = double(p) * w.batch_per_rank / r.step_s;
    return r;
}

namespace {

// printf into a std::string (the table's lines are well under 256 characters).
template <typename... Args>
std::string format(const char* fmt, Args... args) {
    char buf[256];
    std::snprintf(buf, sizeof buf, fmt, args...);
    return buf;
}

// "102.2 MB", "87.4 kB": sizes in decimal units, as link bandwidths are quoted.
std::string bytes_str(double bytes) {
    return bytes >= 1e6 ? format("%.1f MB", bytes / 1e6) : format("%.1f kB", bytes / 1e3);
}

// "NVLink 4 (α 3.4 µs, 450 GB/s)"
std::string link_str(const Link& link) {
    return link.name + format(" (α %.1f µs, %.0f GB/s)", link.alpha_s * 1e6, link.bytes_per_s / 1e9);
}

// "102.2 MB of gradients, 100.0 ms of compute per step"
std::string workload_str(const Workload& w) {
    return bytes_str(w.gradient_bytes) + " of gradients, " +
           format("%.1f ms of compute per step", (w.forward_s + w.backward_s) * 1e3);
}

// "8 GPUs a node on NVLink 4 (α 3.4 µs, 450 GB/s), nodes on InfiniBand NDR (α 9.6 µs, 50 GB/s)"
std::string cluster_str(const Cluster& c) {
    return format("%d GPUs a node on ", c.gpus_per_node) + link_str(c.intra) + ", nodes on " + link_str(c.inter);
}

}  // namespace

std::string scaling_table(const Workload& w, const Cluster& cluster) {
    const size_t buckets = bucket_sizes(w.gradient_bytes, w.bucket_bytes).size();
    std::string s = w.name + ": " + workload_str(w) +
                    format(" (%.2f forward + %.2f backward), batch %d per GPU\n", w.forward_s * 1e3,
                           w.backward_s * 1e3, w.batch_per_rank);
    s += format("%zu bucket(s) of at most ", buckets) + bytes_str(w.bucket_bytes) + "; " + cluster_str(cluster) + "\n";
    s += "step, efficiency and images/s: the faster of ring and tree for each all-reduce; efficiency = T(1)/T(p)\n";
    s += "  GPUs   all-reduce ms        step ms, no overlap   step ms, overlap   efficiency   images/s\n";
    s += "           ring      tree\n";
    for (int p : {1, 2, 8, 64, 512}) {
        const StepPrediction plain = predict_step(w, p, false, Algorithm::Faster, cluster);
        const StepPrediction overlapped = predict_step(w, p, true, Algorithm::Faster, cluster);
        s += format("  %4d %9.3f %9.3f %21.3f %18.3f %11.1f%% %10.0f\n", p,
                    hierarchical_allreduce_s(w.gradient_bytes, p, Algorithm::Ring, cluster) * 1e3,
                    hierarchical_allreduce_s(w.gradient_bytes, p, Algorithm::Tree, cluster) * 1e3, plain.step_s * 1e3,
                    overlapped.step_s * 1e3, overlapped.efficiency * 100, overlapped.images_per_s);
    }
    return s;
}

namespace {

struct Curve {
    Algorithm algorithm;
    bool overlap;
    const char* label;
    const char* colour;
};
// Drawn in this order: the wide light lines first, so that where overlap changes nothing the
// dark line shows on top of its light twin.
const Curve kCurves[] = {
    {Algorithm::Ring, false, "ring, one all-reduce after backward", "#9ecae1"},
    {Algorithm::Tree, false, "tree, one all-reduce after backward", "#fcae91"},
    {Algorithm::Ring, true, "ring, buckets overlapped with backward", "#1f77b4"},
    {Algorithm::Tree, true, "tree, buckets overlapped with backward", "#d62728"},
};
constexpr int kMaxLog2Gpus = 9;  // up to 512 GPUs

// One workload's panel: efficiency against log2 p for p = 1, 2, 4, …, 512. The y axis starts
// a little below the lowest efficiency (at a multiple of 0.1), so that a workload that scales
// well does not show as four lines on top of each other at 1.
void scaling_panel(Svg& svg, Box area, const Workload& w, const Cluster& cluster, bool with_legend) {
    std::vector<double> xs;
    for (int e = 0; e <= kMaxLog2Gpus; e++) xs.push_back(e);
    std::vector<std::vector<double>> curves;
    double lowest = 1;
    for (const Curve& c : kCurves) {
        std::vector<double> ys;
        for (double e : xs) ys.push_back(predict_step(w, 1 << int(e), c.overlap, c.algorithm, cluster).efficiency);
        lowest = std::min(lowest, *std::min_element(ys.begin(), ys.end()));
        curves.push_back(ys);
    }
    const double lo = std::max(0.0, std::floor((lowest - 0.02) * 10) / 10), hi = 1 + (1 - lo) * 0.05;
    Plot plot(svg, area, {0, kMaxLog2Gpus}, {lo, hi});
    plot.axes("log2 p   (p GPUs: 0 = 1, 3 = 8, 6 = 64, 9 = 512)", "efficiency T(1) / T(p)");
    svg.text({area.x + area.w / 2, area.y - 26}, w.name, 14, Anchor::Middle);
    svg.text({area.x + area.w / 2, area.y - 10}, workload_str(w), 11, Anchor::Middle, "#444444");
    const double node = std::log2(cluster.gpus_per_node);
    svg.line(plot.at(node, lo), plot.at(node, hi), "#888888", 1, true);
    svg.text({plot.at(node, lo).x + 4, area.y + area.h - 8}, "one node", 11, Anchor::Start, "#666666");
    for (size_t i = 0; i < curves.size(); i++)
        svg.polyline(plot.points(xs, curves[i]), kCurves[i].colour, kCurves[i].overlap ? 2 : 5);
    if (bucket_sizes(w.gradient_bytes, w.bucket_bytes).size() == 1)
        svg.text({area.x + area.w - 8, area.y + 16}, "one bucket: overlap hides nothing", 11, Anchor::End, "#444444");
    if (!with_legend) return;
    std::vector<std::pair<std::string, std::string>> entries;
    for (const Curve& c : kCurves) entries.emplace_back(c.label, c.colour);
    svg.legend({area.x + 12, area.y + area.h - 74}, entries);
}

}  // namespace

std::string scaling_svg(const std::vector<Workload>& workloads, const Cluster& cluster) {
    KILN_CHECK(!workloads.empty(), "scaling_svg: no workload to draw; pass at least one");
    const double panel_w = 470, height = 420;
    Svg svg(panel_w * double(workloads.size()), height);
    const double middle = panel_w * double(workloads.size()) / 2;
    svg.text({middle, 22}, "Data parallel weak scaling, predicted by the α–β model", 15, Anchor::Middle);
    svg.text({middle, 40}, cluster_str(cluster), 11, Anchor::Middle, "#444444");
    for (size_t i = 0; i < workloads.size(); i++)
        scaling_panel(svg, {panel_w * double(i) + 75, 95, panel_w - 105, height - 160}, workloads[i], cluster, i == 0);
    return svg.str();
}

}  // namespace kiln
