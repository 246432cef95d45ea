// conv.cu — the kernel lab's convolution forward: three versions side by side, each validated
// against the CPU (cpu::conv2d_forward) on every shape, then timed against cuDNN on a GPU.
//
// Letters as in ops/params.h: x [N, C, H, W], w [O, C/G, KH, KW], b [O], y [N, O, P, Q],
// G groups, Cg = C/G and Og = O/G per group.
//   y[n, o, p, q] = b[o] + Σ_{c < Cg} Σ_{kh, kw} w[o, c, kh, kw] · x[n, g·Cg + c, ih, iw]
//   g = o / Og,  ih = p·stride − padding + kh·dilation,  iw likewise  (0 outside the image)
//
//   version 1  naive          direct: one thread per element of y, the formula above as it
//              stands. Every thread reads its Cg·KH·KW weights and inputs from global memory;
//              neighbouring threads share most of them, but only the caches notice.
//   version 2  conv2d_forward_im2col          (cuda/conv.cu) unfold the images into the column
//              matrix X [Cg·KH·KW, N·P·Q] in a workspace, then y = w · X with the engine's
//              tiled GEMM (cuda/gemm.cu). Costs (C·KH·KW + O)·P·Q floats per image of
//              workspace, bounded to 32 MiB as in nn/conv.cpp.
//   version 3  conv2d_forward_implicit_gemm   (cuda/conv.cu) the same product, its tiles of X
//              gathered from x straight into shared memory: no workspace, one kernel.
//   version 4  conv2d_forward  (cuda/conv.cu, the engine's) version 3's gather on the engine's
//              block tile (cuda/gemm_tiles.cuh): warp tiling, 128×128 tiles for big layers, the
//              next step's tiles loaded during this step's multiply-adds
// The backward passes, each against cuDNN's:
//   dx version 1  conv2d_backward_data_im2col   dy to rows, a GEMM into column form, col2im
//   dx version 2  conv2d_backward_data          (the engine's) an implicit GEMM: dy gathered
//                 through the transposed filter, each dx element one thread's sum
//   dw version 1  conv2d_backward_weight_im2col im2col, then a split-K GEMM per chunk of images
//   dw version 2  conv2d_backward_weight        (the engine's) an implicit GEMM over N·P·Q,
//                 split into slices added in order
//   cuDNN      cudnnConvolutionForward with the fastest algorithm cudnnFindConvolutionForward-
//              Algorithm reports, FP32 only (CUDNN_FMA_MATH: no TF32 tensor cores), plus
//              cudnnAddTensor for the bias; the reference on a GPU, validated like the others.
// The engine runs version 4 (and dx, dw version 2) for every shape but a depthwise one
// (cuda::conv2d_algo; each shape's first line says it).
//
// Build and run (from the repository root; `make lab` builds and runs every lab file):
//   make lab                   the emulator: validates every version on small shapes with
//                              every option (stride, padding, dilation, groups, bias; batch 1)
//   make CUDA=1 lab            a GPU: validates on the layers of LeNet and of the CIFAR net
//                              (widths 32/64/128 and 64/256/256) at batch 256, then prints per
//                              version and layer "bench conv_lenet_conv2_v3_...: ... GFLOP/s
//                              (..% of cudnn)"
//   build-cuda/lab/conv 2      version 2 of every pass that has one (forward, dx and dw; the
//                              forward has versions 1 to 4, the backward passes 1 and 2;
//                              build/lab/conv on the emulator)
#include <algorithm>
#include <cstdint>
#include <string>

#include "common.h"
#include "nn/conv.h"
#include "ops/all.h"

namespace kiln::lab {

// ---- version 1: one thread per output ----------------------------------------------------------
//   thread i → y[n, o, p, q] with i = ((n·O + o)·P + p)·Q + q   (consecutive threads along q)
__global__ void conv2d_naive_kernel(const float* x, const float* w, const float* b, float* y, Conv2dParams d,
                                    int64_t P, int64_t Q) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= d.N * d.O * P * Q) return;
    const int64_t q = i % Q, p = i / Q % P, o = i / (P * Q) % d.O, n = i / (P * Q * d.O);
    const int64_t Cg = d.C / d.groups, c0 = o / (d.O / d.groups) * Cg;  // the group's first channel
    float acc = b ? b[o] : 0.0f;
    for (int64_t c = 0; c < Cg; c++)
        for (int64_t kh = 0; kh < d.KH; kh++) {
            const int64_t ih = p * d.stride - d.padding + kh * d.dilation;
            if (ih < 0 || ih >= d.H) continue;
            for (int64_t kw = 0; kw < d.KW; kw++) {
                const int64_t iw = q * d.stride - d.padding + kw * d.dilation;
                if (iw < 0 || iw >= d.W) continue;
                acc += w[((o * Cg + c) * d.KH + kh) * d.KW + kw] * x[((n * d.C + c0 + c) * d.H + ih) * d.W + iw];
            }
        }
    y[i] = acc;
}

void conv2d1(const float* x, const float* w, const float* b, float* y, const Conv2dParams& p, int block_size) {
    const int64_t P = p.P(), Q = p.Q();
    const dim3 grid(unsigned((p.N * p.O * P * Q + block_size - 1) / block_size)), block(block_size);
    KILN_LAUNCH(conv2d_naive_kernel, grid, block, 0)(x, w, b, y, p, P, Q);
    KILN_CHECK_LAUNCH(conv2d_naive_kernel, grid, block);
}

const std::vector<Version> kVersions = {{1, "naive", {64, 128, 256}},
                                        {2, "conv2d_forward_im2col", {0}},
                                        {3, "conv2d_forward_implicit_gemm", {0}},
                                        {4, "conv2d_forward", {0}}};
const std::vector<Version> kDataVersions = {{1, "im2col", {0}}, {2, "conv2d_backward_data", {0}}};
const std::vector<Version> kWeightVersions = {{1, "im2col", {0}}, {2, "conv2d_backward_weight", {0}}};

// Images per chunk of a workspace of at most `limit` bytes, as nn/conv.cpp's column_workspace.
int64_t images_within(int64_t floats_per_image, int64_t N, int64_t limit) {
    return std::clamp<int64_t>(limit / (floats_per_image * int64_t(sizeof(float))), 1, N);
}

struct Layer {
    std::string name;
    Conv2dParams p;
    bool bias;
};

// The layer's backward passes: dx and dw (from zero) by each version, validated against the CPU's,
// then on a GPU timed beside cuDNN's backward data and backward filter. The same flop count as
// the forward each (2·N·O·P·Q·Cg·KH·KW).
bool run_backward(int chosen, const Layer& layer, const std::vector<float>& x, const std::vector<float>& w,
                  DeviceArray<float>& col, int64_t images) {
    const Conv2dParams& p = layer.p;
    const size_t y_count = size_t(p.N * p.O * p.P() * p.Q());
    const std::vector<float> dy = random_floats(y_count, 4);
    std::vector<float> want_dx(x.size()), want_dw(w.size(), 0.0f);
    const int64_t cpu_per_image = cpu::conv2d_col_elems_per_image(p, DType::F32);
    const int64_t cpu_images = cpu_per_image ? images_within(cpu_per_image, p.N, kDefaultConvWorkspace) : 0;
    std::vector<float> cpu_col(size_t(cpu_images * cpu_per_image));
    cpu::conv2d_backward_data(dy.data(), w.data(), want_dx.data(), p, cpu_col.data(), cpu_images);
    cpu::conv2d_backward_weight<float>(x.data(), dy.data(), want_dw.data(), nullptr, p, cpu_col.data(), cpu_images);

    DeviceArray<float> d_x(x), d_w(w), d_dy(dy), d_dx(x.size()), d_dw(w.size());
    const auto run_dx = [&](int version, int) {
        if (version == 1) return cuda::conv2d_backward_data_im2col(d_dy.get(), d_w.get(), d_dx.get(), p, col.get(), images);
        cuda::conv2d_backward_data<float>(d_dy.get(), d_w.get(), d_dx.get(), p, nullptr, 0);
    };
    const auto run_dw = [&](int version, int) {
        KILN_CUDA_CHECK(cudaMemset(d_dw.get(), 0, w.size() * sizeof(float)));  // dw accumulates
        if (version == 1)
            return cuda::conv2d_backward_weight_im2col<float>(d_x.get(), d_dy.get(), d_dw.get(), nullptr, p, col.get(),
                                                            images);
        cuda::conv2d_backward_weight<float>(d_x.get(), d_dy.get(), d_dw.get(), nullptr, p, nullptr, 0);
    };
    // dx sums O/G·KH·KW products, dw N·P·Q: a few ulps of the sum of their magnitudes each.
    const double atol_dx = 2e-6 * double(p.Og() * p.KH * p.KW + 1), atol_dw = 2e-6 * double(p.N * p.P() * p.Q() + 1);
    const auto check_dx = [&](const std::string& label) { return validate_result(d_dx.get(), want_dx, label, atol_dx, 1e-5); };
    const auto check_dw = [&](const std::string& label) { return validate_result(d_dw.get(), want_dw, label, atol_dw, 1e-5); };
    bool ok = validate_versions(kDataVersions, chosen, [&](int v, int b) { d_dx.poison(), run_dx(v, b); }, check_dx);
    ok = validate_versions(kWeightVersions, chosen, run_dw, check_dw) && ok;
    if (!ok || !kTiming) return ok;
#ifdef KILN_CUDA
    const std::string problem = "conv_" + layer.name;
    const double gflop = 2.0 * double(y_count) * double(p.Cg() * p.KH * p.KW) / 1e9;
    CudnnConv cudnn(p);
    d_dx.poison();
    const double dx_ms = cudnn.backward_data(d_dy.get(), d_w.get(), d_dx.get(), problem + "_dx", check_dx, ok);
    time_versions(kDataVersions, chosen, run_dx, problem + "_dx", gflop, "GFLOP/s", dx_ms, "cudnn");
    d_dw.poison();
    const double dw_ms = cudnn.backward_filter(d_x.get(), d_dy.get(), d_dw.get(), problem + "_dw", check_dw, ok);
    time_versions(kWeightVersions, chosen, run_dw, problem + "_dw", gflop, "GFLOP/s", dw_ms, "cudnn");
#endif
    return ok;
}

// One layer: the CPU reference, every version validated, then (on a GPU) timed against cuDNN.
bool run_layer(int chosen, const Layer& layer) {
    const Conv2dParams& p = layer.p;
    const int64_t P = p.P(), Q = p.Q();
    const size_t x_count = size_t(p.N * p.C * p.H * p.W), w_count = size_t(p.O * p.Cg() * p.KH * p.KW),
                 y_count = size_t(p.N * p.O * P * Q);
    const std::string problem = "conv_" + layer.name;
    std::printf("%s: N %lld, C %lld, %lldx%lld -> O %lld, %lldx%lld; kernel %lldx%lld, stride %lld, padding %lld, "
                "dilation %lld, groups %lld%s; the engine picks %s\n",
                problem.c_str(), (long long)p.N, (long long)p.C, (long long)p.H, (long long)p.W, (long long)p.O,
                (long long)P, (long long)Q, (long long)p.KH, (long long)p.KW, (long long)p.stride,
                (long long)p.padding, (long long)p.dilation, (long long)p.groups, layer.bias ? ", bias" : "",
                conv_algo_name(cuda::conv2d_algo(p)));
    const std::vector<float> x = random_floats(x_count, 1), w = random_floats(w_count, 2), b = random_floats(size_t(p.O), 3);
    std::vector<float> want(y_count);
    const int64_t cpu_per_image = cpu::conv2d_col_elems_per_image(p, DType::F32);
    const int64_t cpu_images = cpu_per_image ? images_within(cpu_per_image, p.N, kDefaultConvWorkspace) : 0;
    std::vector<float> cpu_col(size_t(cpu_images * cpu_per_image));
    cpu::conv2d_forward(x.data(), w.data(), layer.bias ? b.data() : nullptr, want.data(), p, cpu_col.data(), cpu_images);

    DeviceArray<float> dx(x), dw(w), db(b), dy(y_count);
    const int64_t per_image = cuda::conv2d_col_elems_per_image(p);
    const int64_t images = images_within(per_image, p.N, kDefaultConvWorkspace);
    DeviceArray<float> col(size_t(images * per_image));
    const float* bias = layer.bias ? db.get() : nullptr;
    const auto launch = [&](int version, int block) {
        switch (version) {
        case 1: return conv2d1(dx.get(), dw.get(), bias, dy.get(), p, block);
        case 2: return cuda::conv2d_forward_im2col(dx.get(), dw.get(), bias, dy.get(), p, col.get(), images);
        case 3: return cuda::conv2d_forward_implicit_gemm<float>(dx.get(), dw.get(), bias, dy.get(), p, nullptr, 0);
        default: return cuda::conv2d_forward<float>(dx.get(), dw.get(), bias, dy.get(), p, nullptr, 0);
        }
    };
    // Sums of Cg·KH·KW products of values in [-1, 1], added in another order than the CPU:
    // a few ulps of Σ|w·x| ≤ Cg·KH·KW + 1, as for the GEMM.
    const double atol = 2e-6 * double(p.Cg() * p.KH * p.KW + 1);
    const double gflop = 2.0 * double(y_count) * double(p.Cg() * p.KH * p.KW) / 1e9;
    const bool forward_ok = validate_and_time_conv(kVersions, chosen, launch,
                                                   {problem, p, dx.get(), dw.get(), bias, dy, want, atol}, gflop,
                                                   "GFLOP/s");
    return run_backward(chosen, layer, x, w, col, images) && forward_ok;
}

// The layers of the CIFAR net (src/nn/models.cpp, cifar_net) for widths w1, w2, w3 at batch N
// on 32×32 images: the 2×2 stem, then per block a 3×3 conv (padding 1) before a 2×2 max pool
// and one after it. Batch norm follows each 3×3 conv, so only the stem has a bias.
std::vector<Layer> cifar_net_layers(int64_t N, int64_t w1, int64_t w2, int64_t w3) {
    const std::string net = "cifar" + std::to_string(w1) + "_" + std::to_string(w2) + "_" + std::to_string(w3);
    std::vector<Layer> layers;
    int64_t in = 24, size = 31, block = 1;  // the stem's output: 24 channels of 31×31
    for (int64_t width : {w1, w2, w3}) {
        const std::string name = net + "_block" + std::to_string(block++);
        layers.push_back({name + "a", {N, in, size, size, width, 3, 3, 1, 1}, false});
        size /= 2;
        layers.push_back({name + "b", {N, width, size, size, width, 3, 3, 1, 1}, false});
        in = width;
    }
    return layers;
}

bool run_lab(int chosen) {
    std::vector<Layer> layers;
    if (kTiming) {
        // LeNet (src/nn/models.cpp, lenet), the stem, and the CIFAR net of lesson 06 and of the bench.
        layers = {{"lenet_conv1", {256, 1, 28, 28, 10, 5, 5}, true},
                  {"lenet_conv2", {256, 10, 12, 12, 20, 5, 5}, true},
                  {"cifar_stem", {256, 3, 32, 32, 24, 2, 2}, true}};
        for (const auto& more : {cifar_net_layers(256, 32, 64, 128), cifar_net_layers(256, 64, 256, 256)})
            layers.insert(layers.end(), more.begin(), more.end());
    } else {
        // {N, C, H, W, O, KH, KW, stride, padding, dilation, groups}
        layers = {{"same", {2, 3, 11, 9, 5, 3, 3, 1, 1, 1, 1}, true},
                  {"strided_dilated_groups", {1, 4, 10, 7, 6, 3, 2, 2, 2, 2, 2}, true},
                  {"wide", {2, 8, 6, 5, 70, 3, 3, 1, 1, 1, 1}, false},
                  {"lenet_conv1", {2, 1, 28, 28, 10, 5, 5}, true}};
    }
    bool ok = true;
    for (const Layer& layer : layers) ok = run_layer(chosen, layer) && ok;
    return ok;
}

}  // namespace kiln::lab

int main(int argc, char** argv) {
    using namespace kiln::lab;
    return lab_main("conv", [&] { return run_lab(chosen_version(argc, argv, kVersions)); });
}
