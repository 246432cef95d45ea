// depthwise.cu — the kernel lab's depthwise convolution forward (groups == C == O): three versions
// side by side, each validated against the CPU (cpu::conv2d_forward, its direct depthwise loops)
// on every shape, then timed against cuDNN on a GPU.
//
// Letters as in ops/params.h: x [N, C, H, W], w [C, 1, K, K], b [C], y [N, C, P, Q]; a plane is
// one (n, c), plane = n·C + c.
//   y[n, c, p, q] = b[c] + Σ_{kh, kw} w[c, kh, kw] · x[n, c, p·stride − padding + kh·dilation,
//                                                        q·stride − padding + kw·dilation]
// K·K multiply-adds per output (9 for MobileNet's 3×3) against one read of x and one write of
// y at the least: the layer is bound by memory, so the lab reports GB/s of that minimum traffic.
//
//   version 1  conv2d_forward_implicit_gemm   (cuda/conv.cu) the way depthwise ran before it had
//              its own kernel: G = C groups of one channel through the implicit GEMM, each group
//              a product y[1, N·P·Q] = w[1, K·K] · X[K·K, N·P·Q]. The 16×128 tiles are 15/16 rows
//              of padding, and the x values gathered into shared memory serve one weight each.
//   version 2  conv2d_forward                 (cuda/conv.cu, depthwise_forward_kernel) the direct
//              kernel the engine takes for these shapes: one thread per element of y, the formula
//              as it stands, its K·K reads of x mostly hits in L1/L2.
//   version 3  staged (this file)  each block stages whole input planes, padding included, in
//              shared memory (coalesced reads of x, once), then each thread computes kV = 4
//              consecutive outputs of a row from registers: its channel's K·K weights loaded once
//              for the 4, and for stride 1 one row segment of 4 + K − 1 values per kh slid past
//              the K taps (K·(4 + K − 1) shared reads for 4·K·K multiply-adds instead of 4·K·K).
//              Small planes (8×8, 4×4) are packed several to a block so that its threads have
//              work. Planes up to 48 KiB (110×110 floats staged); K = 3 or 5.
//   cuDNN      cudnnConvolutionForward with cudnnSetConvolutionGroupCount(C), the fastest
//              algorithm cudnnFindConvolutionForwardAlgorithm reports, FP32 only (CUDNN_FMA_MATH),
//              plus cudnnAddTensor for a bias; the reference on a GPU, validated like the others.
// Each version adds b[c], then the taps in (kh, kw) order, in float: the CPU's order.
//
// Build and run (from the repository root; `make lab` builds and runs every lab file):
//   make lab                   the emulator: validates every version on the MobileNetV2 layers
//                              below at batch 2, and on odd shapes (5×5 dilated, 3×3 stride 3)
//   make CUDA=1 lab            a GPU: validates on the depthwise layers of MobileNetV2 for CIFAR
//                              at batch 128, then prints per version and layer
//                              "bench depthwise_mbv2_c96_32x32_s1_v3_staged_b256: ... GB/s (..% of cudnn)"
//   build-cuda/lab/depthwise 3 version 3 only (build/lab/depthwise on the emulator)
#include <algorithm>
#include <cstdint>
#include <string>

#include "common.cuh"  // KILN_UNROLL
#include "common.h"
#include "ops/all.h"

namespace kiln::lab {

// ---- version 3: planes staged in shared memory, 4 outputs per thread --------------------------------
constexpr int kV = 4;                   // consecutive outputs along q per thread
constexpr int kSharedBytes = 48 << 10;  // dynamic shared memory a launch may take without opting in

// The block's share of the work, worked out on the host.
struct Staging {
    int P, Q, QV;  // output plane P×Q; QV = ⌈Q / kV⌉ groups of kV outputs per row
    int Hs, Ws;    // the staged window of one plane: input rows −padding .. Hs − padding − 1, columns likewise
    int planes;    // planes per block
};

// Block j takes the planes first = j·planes .. first + planes − 1:
//   stage    xs[k][r][col] = x[first + k, r − padding, col − padding]   (0 outside the image)
//            thread t → elements t, t + B, ...: consecutive threads, consecutive columns
//   barrier
//   compute  item i = (k, p, g) → y[first + k, p, g·kV .. g·kV + kV − 1], from xs:
//            acc[v] = b[c] + Σ_{kh, kw} w[c, kh, kw] · xs[k][p·stride + kh·dilation]
//                                                         [(g·kV + v)·stride + kw·dilation]
template <int K>
__global__ void depthwise_staged_kernel(const float* x, const float* w, const float* b, float* y, Conv2dParams d,
                                        Staging s) {
    KILN_DYNAMIC_SHARED(float, xs);  // [planes][Hs][Ws]
    const int64_t first = int64_t(blockIdx.x) * s.planes;
    const int planes = int(d.N * d.C - first < s.planes ? d.N * d.C - first : s.planes);  // the last block: fewer
    const int H = int(d.H), W = int(d.W), pad = int(d.padding), stride = int(d.stride), dil = int(d.dilation);
    const int window = s.Hs * s.Ws;
    const float* xb = x + first * H * W;
    for (int i = int(threadIdx.x); i < planes * window; i += int(blockDim.x)) {
        const int k = i / window, r = i % window / s.Ws - pad, col = i % s.Ws - pad;
        xs[i] = r >= 0 && r < H && col >= 0 && col < W ? xb[(int64_t(k) * H + r) * W + col] : 0.0f;
    }
    __syncthreads();  // every plane is staged before anyone reads a neighbour's element

    const int items = planes * s.P * s.QV;
    for (int i = int(threadIdx.x); i < items; i += int(blockDim.x)) {
        const int k = i / (s.P * s.QV), p = i / s.QV % s.P, q0 = i % s.QV * kV;
        const int64_t plane = first + k, c = plane % d.C;
        float wr[K][K];
        KILN_UNROLL
        for (int kh = 0; kh < K; kh++) {
            KILN_UNROLL
            for (int kw = 0; kw < K; kw++) wr[kh][kw] = w[(c * K + kh) * K + kw];
        }
        float acc[kV];
        const float bias = b ? b[c] : 0.0f;
        KILN_UNROLL
        for (int v = 0; v < kV; v++) acc[v] = bias;
        const float* corner = xs + k * window + p * stride * s.Ws + q0 * stride;  // input of tap (0, 0) at (p, q0)
        if (stride == 1 && dil == 1) {  // one row segment per kh, slid past the K taps in registers
            KILN_UNROLL
            for (int kh = 0; kh < K; kh++) {
                float seg[kV + K - 1];
                KILN_UNROLL
                for (int j = 0; j < kV + K - 1; j++) seg[j] = corner[kh * s.Ws + j];
                KILN_UNROLL
                for (int kw = 0; kw < K; kw++) {
                    KILN_UNROLL
                    for (int v = 0; v < kV; v++) acc[v] += wr[kh][kw] * seg[v + kw];
                }
            }
        } else {
            KILN_UNROLL
            for (int kh = 0; kh < K; kh++) {
                const float* row = corner + kh * dil * s.Ws;
                KILN_UNROLL
                for (int kw = 0; kw < K; kw++) {
                    KILN_UNROLL
                    for (int v = 0; v < kV; v++) acc[v] += wr[kh][kw] * row[v * stride + kw * dil];
                }
            }
        }
        float* yrow = y + (plane * s.P + p) * s.Q;
        KILN_UNROLL
        for (int v = 0; v < kV; v++)
            if (q0 + v < s.Q) yrow[q0 + v] = acc[v];
    }
}

// How many planes a block of block_size threads takes: enough that its threads have an item each
// (one plane of 32×32 outputs is 32·8 items; one of 4×4 is 4), as many as shared memory holds.
Staging staging_of(const Conv2dParams& p, int block_size) {
    Staging s;
    s.P = int(p.P()), s.Q = int(p.Q()), s.QV = (s.Q + kV - 1) / kV;
    s.Hs = (s.P - 1) * int(p.stride) + (int(p.KH) - 1) * int(p.dilation) + 1;
    s.Ws = (s.QV * kV - 1) * int(p.stride) + (int(p.KW) - 1) * int(p.dilation) + 1;
    const int64_t plane_bytes = int64_t(s.Hs) * s.Ws * int64_t(sizeof(float));
    KILN_CHECK(plane_bytes <= kSharedBytes, "depthwise version 3 stages whole planes: a window of ", s.Hs, "x", s.Ws,
               " floats is over ", kSharedBytes, " bytes");
    const int64_t by_threads = std::max(1, block_size / (s.P * s.QV)), by_memory = kSharedBytes / plane_bytes;
    s.planes = int(std::min({by_threads, by_memory, p.N * p.C}));
    return s;
}

void depthwise3(const float* x, const float* w, const float* b, float* y, const Conv2dParams& p, int block_size) {
    KILN_CHECK(p.KH == p.KW && (p.KH == 3 || p.KH == 5), "depthwise version 3 is built for 3×3 and 5×5 kernels, not ",
               p.KH, "x", p.KW);
    const Staging s = staging_of(p, block_size);
    const size_t shared = size_t(s.planes) * size_t(s.Hs * s.Ws) * sizeof(float);
    const dim3 grid(unsigned((p.N * p.C + s.planes - 1) / s.planes)), block(block_size);
    if (p.KH == 3) {
        KILN_LAUNCH(depthwise_staged_kernel<3>, grid, block, shared)(x, w, b, y, p, s);
        KILN_CHECK_LAUNCH(depthwise_staged_kernel<3>, grid, block);
    } else {
        KILN_LAUNCH(depthwise_staged_kernel<5>, grid, block, shared)(x, w, b, y, p, s);
        KILN_CHECK_LAUNCH(depthwise_staged_kernel<5>, grid, block);
    }
}

const std::vector<Version> kVersions = {
    {1, "conv2d_forward_implicit_gemm", {0}}, {2, "conv2d_forward", {0}}, {3, "staged", {128, 256}}};

struct Layer {
    std::string name;
    Conv2dParams p;
    bool bias;
};

// A depthwise layer: C channels of H×W, a K×K kernel (padding K/2 unless given), groups = O = C.
Layer depthwise_layer(const std::string& name, int64_t N, int64_t C, int64_t H, int64_t W, int64_t K, int64_t stride,
                      bool bias, int64_t dilation = 1, int64_t padding = -1) {
    Conv2dParams p;
    p.N = N, p.C = p.O = p.groups = C, p.H = H, p.W = W, p.KH = p.KW = K;
    p.stride = stride, p.dilation = dilation, p.padding = padding >= 0 ? padding : K / 2;
    return {name, p, bias};
}

// One layer: the CPU reference, every version validated, then (on a GPU) timed against cuDNN.
bool run_layer(int chosen, const Layer& layer) {
    const Conv2dParams& p = layer.p;
    const int64_t P = p.P(), Q = p.Q();
    const size_t x_count = size_t(p.N * p.C * p.H * p.W), w_count = size_t(p.C * p.KH * p.KW),
                 y_count = size_t(p.N * p.C * P * Q);
    const std::string problem = "depthwise_" + layer.name;
    std::printf("%s: N %lld, C %lld, %lldx%lld -> %lldx%lld; kernel %lldx%lld, stride %lld, padding %lld, "
                "dilation %lld%s\n",
                problem.c_str(), (long long)p.N, (long long)p.C, (long long)p.H, (long long)p.W, (long long)P,
                (long long)Q, (long long)p.KH, (long long)p.KW, (long long)p.stride, (long long)p.padding,
                (long long)p.dilation, layer.bias ? ", bias" : "");
    const std::vector<float> x = random_floats(x_count, 1), w = random_floats(w_count, 2),
                             b = random_floats(size_t(p.C), 3);
    std::vector<float> want(y_count);
    KILN_CHECK(cpu::conv2d_algo(p, DType::F32) == ConvAlgo::Depthwise, problem, " is not depthwise");
    cpu::conv2d_forward<float>(x.data(), w.data(), layer.bias ? b.data() : nullptr, want.data(), p, nullptr, 0);

    DeviceArray<float> dx(x), dw(w), db(b), dy(y_count);
    const float* bias = layer.bias ? db.get() : nullptr;
    const auto launch = [&](int version, int block) {
        switch (version) {
        case 1: return cuda::conv2d_forward_implicit_gemm<float>(dx.get(), dw.get(), bias, dy.get(), p, nullptr, 0);
        case 2: return cuda::conv2d_forward<float>(dx.get(), dw.get(), bias, dy.get(), p, nullptr, 0);
        default: return depthwise3(dx.get(), dw.get(), bias, dy.get(), p, block);
        }
    };
    // Sums of K·K + 1 products of values in [-1, 1]; versions 2 and 3 add in the CPU's order,
    // the implicit GEMM (and cuDNN) perhaps not: a few ulps of Σ|w·x| ≤ K·K + 1.
    const double atol = 2e-6 * double(p.KH * p.KW + 1);
    // the least traffic: x and w read once, y written once (and b)
    const double gb = double(x_count + w_count + y_count + (layer.bias ? size_t(p.C) : 0)) * sizeof(float) / 1e9;
    return validate_and_time_conv(kVersions, chosen, launch, {problem, p, dx.get(), dw.get(), bias, dy, want, atol},
                                  gb, "GB/s");
}

// The 3×3 depthwise layers of MobileNetV2 for CIFAR (32×32 inputs; expansion 6, so C = 6 × the
// block's input width), at batch N: its first layers at 32×32, the stride-2 ones that halve the
// image, and the narrow planes of the last stages. MobileNet has batch norm after each, so no
// bias, except on one layer (the bias path is validated and timed too).
std::vector<Layer> mobilenet_v2_layers(int64_t N) {
    return {depthwise_layer("mbv2_c96_32x32_s1", N, 96, 32, 32, 3, 1, false),
            depthwise_layer("mbv2_c96_32x32_s2", N, 96, 32, 32, 3, 2, false),
            depthwise_layer("mbv2_c144_16x16_s1", N, 144, 16, 16, 3, 1, true),
            depthwise_layer("mbv2_c192_8x8_s1", N, 192, 8, 8, 3, 1, false),
            depthwise_layer("mbv2_c384_8x8_s2", N, 384, 8, 8, 3, 2, false),
            depthwise_layer("mbv2_c960_4x4_s1", N, 960, 4, 4, 3, 1, false)};
}

bool run_lab(int chosen) {
    std::vector<Layer> layers;
    if (kTiming) {
        layers = mobilenet_v2_layers(128);
    } else {
        // The same layers at batch 2, and odd shapes: 5×5 with dilation 2, a 3×3 at stride 3 on
        // a 7×9 image (planes packed several to a block, a last row group of 3 outputs).
        layers = mobilenet_v2_layers(2);
        layers.push_back(depthwise_layer("odd_5x5_dilation2", 2, 3, 11, 9, 5, 1, true, 2, 4));
        layers.push_back(depthwise_layer("odd_7x9_stride3", 3, 2, 7, 9, 3, 3, true));
    }
    bool ok = true;
    for (const Layer& layer : layers) ok = run_layer(chosen, layer) && ok;
    return ok;
}

}  // namespace kiln::lab

int main(int argc, char** argv) {
    using namespace kiln::lab;
    return lab_main("depthwise", [&] { return run_lab(chosen_version(argc, argv, kVersions)); });
}
