// cost_model.h — how long data parallel training's collectives take on p GPUs, and what that
// does to a training step: the α–β (latency–bandwidth, Hockney) model.
//
// Sending a message of m bytes to a neighbour costs α + m / B: a fixed latency α (start-up,
// synchronisation, the switch) and the bytes over the link's bandwidth B. A collective is a
// sequence of such steps, so its time is (number of steps)·α + (bytes each GPU sends)/B:
//
//   ring all-reduce     2(p−1)·α + 2·(p−1)/p · n/B     latency grows with p, bandwidth does not
//   tree all-reduce     2·⌈log2 p⌉·α + 2·n/B           latency grows with log p only
//   reduce-scatter      (p−1)·α + (p−1)/p · n/B        each half of the ring (ZeRO-1 uses them)
//   all-gather          (p−1)·α + (p−1)/p · n/B
//
// so small messages (latency-bound) favour the tree and large ones (bandwidth-bound) the ring.
// Beyond one node the GPUs are on two kinds of link (NVLink inside a node, InfiniBand between
// nodes): hierarchical_allreduce_s. predict_step turns these into the time of one training step
// (weak scaling: a fixed batch per GPU) with and without overlapping the gradient buckets'
// all-reduces with backward; scaling_table prints the prediction for 1…512 GPUs and
// scaling_svg draws it.
//
//   Workload w{"ResNet-50-sized", 0.033, 0.067, 256, kResnet50GradientBytes};
//   std::cout << scaling_table(w, dgx_h100_cluster());
//
// The model assumes that communication does not slow compute down (NCCL's kernels do take SMs
// and memory bandwidth) and that no link is shared with another job. Times are in seconds,
// sizes in bytes, bandwidths in bytes per second per direction per GPU.
#pragma once
#include <string>
#include <vector>

namespace kiln {

// One kind of link: a step sending m bytes to a neighbour takes alpha_s + m / bytes_per_s.
struct Link {
    std::string name;
    double alpha_s;      // latency of one step (one message, one hop), seconds
    double bytes_per_s;  // bandwidth B per direction per GPU
};

// Published bandwidths (per GPU, per direction):
// - NVLink 4 (H100 SXM5): 18 links, 900 GB/s bidirectional per GPU → 450 GB/s each way (NVIDIA's
//   H100 data sheet; the NVSwitches of a DGX/HGX H100 give every pair of the 8 GPUs that rate).
// - InfiniBand NDR: 400 Gb/s per port = 50 GB/s each way; a DGX H100 has one ConnectX-7 NDR
//   adapter per GPU (8 compute ports), so each GPU has its own 50 GB/s to the other nodes.
constexpr double kNvlink4BytesPerS = 450e9;
constexpr double kInfinibandNdrBytesPerS = 50e9;
// The latencies α are an assumption, not a specification: NCCL's own cost model (its
// src/graph/tuning.cc, the 2021 releases, table hwLat) charges a ring step of its Simple
// protocol 3.4 µs over NVLink and 9.6 µs over the network. The real figure depends on the NCCL
// version, the protocol (its LL protocol trades bandwidth for a latency several times lower)
// and the switches; measured small-message all-reduce latencies are of this order (µs per hop).
constexpr double kNvlinkAlphaS = 3.4e-6;
constexpr double kInfinibandAlphaS = 9.6e-6;

Link nvlink4();         // NVLink 4: α = 3.4 µs, B = 450 GB/s
Link infiniband_ndr();  // InfiniBand NDR, one adapter per GPU: α = 9.6 µs, B = 50 GB/s

// Nodes of gpus_per_node GPUs joined by `intra`; the nodes joined by `inter`.
struct Cluster {
    Link intra, inter;
    int gpus_per_node;
};
Cluster dgx_h100_cluster();  // 8 H100 per node on NVLink 4, nodes on InfiniBand NDR

// One level: p ranks on one kind of link, n bytes (the whole buffer, as each rank holds it for
// an all-reduce; the whole result for an all-gather). p = 1 costs 0. Bad input (p < 1, n < 0
// or not finite, α < 0, B ≤ 0) throws kiln::Error naming the argument.
double ring_allreduce_s(double bytes, int p, const Link& link);
double tree_allreduce_s(double bytes, int p, const Link& link);
double reduce_scatter_s(double bytes, int p, const Link& link);
double all_gather_s(double bytes, int p, const Link& link);

// Faster: the quicker of ring and tree for each call, as NCCL picks one by its own cost model.
enum class Algorithm { Ring, Tree, Faster };
const char* algorithm_name(Algorithm a);  // "ring", "tree", "faster"
double allreduce_s(double bytes, int p, Algorithm a, const Link& link);

// Two levels: up to gpus_per_node GPUs it is allreduce_s on cluster.intra; beyond, p must be a
// whole number of nodes (the formula is in cost_model.cpp).
double hierarchical_allreduce_s(double bytes, int p, Algorithm a, const Cluster& cluster);

// PyTorch DistributedDataParallel's default bucket: 25 MiB.
constexpr double kDefaultBucketBytes = 25.0 * 1024 * 1024;
// Gradient sizes (f32, 4 bytes a parameter): ResNet-50 has 25,557,032 parameters (torchvision),
// kiln's LeNet (lesson 03) 21,840.
constexpr double kResnet50GradientBytes = 25557032.0 * 4;  // 102.2 MB
constexpr double kLenetGradientBytes = 21840.0 * 4;        // 87.4 kB

// What one training step does on one GPU, measured (or assumed) by the caller. Weak scaling:
// each of the p GPUs runs batch_per_rank samples, so forward and backward do not change with p.
struct Workload {
    std::string name;
    double forward_s, backward_s;  // compute of one step on one GPU
    int batch_per_rank;
    double gradient_bytes;
    double bucket_bytes = kDefaultBucketBytes;
};

struct StepPrediction {
    double allreduce_s;   // one all-reduce of all the gradients
    double step_s;        // the whole step
    double efficiency;    // step time on 1 GPU / step time on p GPUs (1 = perfect weak scaling)
    double images_per_s;  // p · batch_per_rank / step_s
};

// The buckets' sizes in the order backward fills them (reverse layer order): full buckets, then
// what is left (the first layers' gradients, ready last).
std::vector<double> bucket_sizes(double gradient_bytes, double bucket_bytes);

// One step on p GPUs of `cluster`. overlap = false: one all-reduce of all the gradients after
// backward; true: each bucket all-reduced as soon as it is ready, under the rest of backward
// (the timeline is in cost_model.cpp).
StepPrediction predict_step(const Workload& w, int p, bool overlap, Algorithm a, const Cluster& cluster);

// A text table for p = 1, 2, 8, 64, 512: the all-reduce time (ring, tree), the step time
// without and with overlap, and the efficiency and images/s with overlap (the step columns use
// the faster algorithm for each all-reduce).
std::string scaling_table(const Workload& w, const Cluster& cluster);

// An SVG document: efficiency against log2 p (1…512 GPUs), ring and tree, with and without
// overlap, one panel per workload. lessons/12-data-parallel/figures/scaling.svg is this drawing
// of a ResNet-50-sized and a LeNet-sized workload (tests/test_cost_model.cpp writes it).
std::string scaling_svg(const std::vector<Workload>& workloads, const Cluster& cluster);

}  // namespace kiln
