// layout.cu — the kernel lab's channels-last page: the layout conversion NCHW → NHWC, and a
// convolution forward that reads NHWC, each version validated against the CPU, then timed on a
// GPU against cuDNN doing the same thing (cudnnTransformTensor; cudnnConvolutionForward on NHWC
// tensors).
//
// Why a layout. kiln keeps activations NCHW (x[n, c, h, w]: one channel's image contiguous). An
// implicit-GEMM convolution reduces over k = (c, kh, kw) and gathers, for each output pixel, the
// inputs x[n, c, ih, iw] along k: in NCHW consecutive k are single floats H·W apart (or a few
// pixels of one row), so every element is its own load. In NHWC (x[n, h, w, c]: a pixel's
// channels contiguous) with k ordered (kh, kw, c), consecutive k are consecutive channels of one
// input pixel: four of them are one 16-byte load (float4), and the weights, stored [O, KH, KW, C]
// (cuDNN's "KRSC"), run along k too. This is why cuDNN's fastest kernels, and its tensor-core
// kernels, want NHWC. The price: every tensor kept NHWC, or one conversion each way around
// the layers that run in it — a transpose that reads and writes every byte once.
//
//   transpose, per image a [C, S] matrix (S = H·W) to [S, C]:
//   version 1  naive          one thread per output element: the writes run along c (coalesced),
//              the reads jump S floats from one thread to the next (a sector per float).
//   version 2  tiled          a 32×32 tile through shared memory: read along s, written along c,
//              both coalesced; but the tile is read back down a column, and the 32 floats of a
//              column of a [32][32] array sit in one bank: a 32-way bank conflict.
//   version 3  tiled_padded   the same tile declared [32][33]: each row starts one bank further,
//              a column touches 32 different banks, no conflict (the emulator counts both).
//   cuDNN      cudnnTransformTensor, NCHW → NHWC.
//   convolution forward on NHWC (x [N, H, W, C], w [O, KH, KW, C], y [N, P, Q, O]), groups 1:
//   version 4  nhwc_scalar    an implicit GEMM Y[M, O] = A[M, K] · B[K, O], M = N·P·Q output
//              pixels, K = KH·KW·C, on 64×64 block tiles (a 4×4 register tile per thread), each
//              element of A and B loaded on its own, k decomposed into (kh, kw, c) per element.
//   version 5  nhwc_vector    the same with A and B loaded four channels at a time (float4),
//              k decomposed once per four (C must be a multiple of 4; the layers here are, but
//              the stem's 3 channels and LeNet's 1 and 10 are not: version 4 only).
//   cuDNN      cudnnConvolutionForward on NHWC descriptors, FMA math (no TF32).
// The engine's NCHW forward (version 4 of the conv page) is timed there, on the same layers.
//
// Build and run (from the repository root):
//   make lab                  the emulator: validates every version on small shapes; prints the
//                             memory traffic (sectors per request, bank conflicts) under each
//   make CUDA=1 lab           a GPU: the CIFAR net's layers at batch 256, timed against cuDNN
//   build-cuda/lab/layout 3   version 3 only (build/lab/layout on the emulator)
#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "common.h"
#include "nn/conv.h"
#include "ops/all.h"

namespace kiln::lab {

// ---- the layout conversion ----------------------------------------------------------------------
// y[n, s, c] = x[n, c, s]: image n's [C, S] matrix transposed.

// version 1: thread i → y[i], i = (n·S + s)·C + c
__global__ void nchw_to_nhwc_naive_kernel(const float* x, float* y, int64_t N, int64_t C, int64_t S) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= N * C * S) return;
    const int64_t c = i % C, s = i / C % S, n = i / (C * S);
    y[i] = x[(n * C + c) * S + s];
}

// versions 2 and 3: block (32, 8) → the 32 channels × 32 pixels tile (blockIdx.y, blockIdx.x) of
// image blockIdx.z; each thread moves 4 of its floats in, then 4 out. Pad = 0 or 1 (above).
constexpr int kTile = 32, kTileRows = 8;
template <int Pad>
__global__ void nchw_to_nhwc_tiled_kernel(const float* x, float* y, int64_t C, int64_t S) {
    __shared__ float tile[kTile][kTile + Pad];  // tile[c − c0][s − s0]
    const int64_t n = blockIdx.z, c0 = int64_t(blockIdx.y) * kTile, s0 = int64_t(blockIdx.x) * kTile;
    for (int j = threadIdx.y; j < kTile; j += kTileRows) {  // in: lanes along s (coalesced)
        const int64_t c = c0 + j, s = s0 + threadIdx.x;
        if (c < C && s < S) tile[j][threadIdx.x] = x[(n * C + c) * S + s];
    }
    __syncthreads();
    for (int j = threadIdx.y; j < kTile; j += kTileRows) {  // out: lanes along c (coalesced)
        const int64_t s = s0 + j, c = c0 + threadIdx.x;
        if (c < C && s < S) y[(n * S + s) * C + c] = tile[threadIdx.x][j];  // down a column of the tile
    }
}

void nchw_to_nhwc(int version, const float* x, float* y, int64_t N, int64_t C, int64_t S, int block_size) {
    if (version == 1) {
        const dim3 grid(unsigned((N * C * S + block_size - 1) / block_size)), block(block_size);
        KILN_LAUNCH(nchw_to_nhwc_naive_kernel, grid, block, 0)(x, y, N, C, S);
        KILN_CHECK_LAUNCH(nchw_to_nhwc_naive_kernel, grid, block);
        return;
    }
    const dim3 grid(unsigned((S + kTile - 1) / kTile), unsigned((C + kTile - 1) / kTile), unsigned(N)),
        block(kTile, kTileRows);
    if (version == 2) {
        KILN_LAUNCH(nchw_to_nhwc_tiled_kernel<0>, grid, block, 0)(x, y, C, S);
        KILN_CHECK_LAUNCH(nchw_to_nhwc_tiled_kernel<0>, grid, block);
    } else {
        KILN_LAUNCH(nchw_to_nhwc_tiled_kernel<1>, grid, block, 0)(x, y, C, S);
        KILN_CHECK_LAUNCH(nchw_to_nhwc_tiled_kernel<1>, grid, block);
    }
}

// ---- the convolution on NHWC --------------------------------------------------------------------
//   y[n, p, q, o] = b[o] + Σ_{kh, kw, c} w[o, kh, kw, c] · x[n, ih, iw, c]
//   ih = p·stride − padding + kh·dilation, iw likewise (0 outside the image)
// Block (blockIdx.x, blockIdx.y) computes rows m0 .. m0 + 63 (output pixels) and columns
// o0 .. o0 + 63 (output channels) of Y; thread t owns the 4×4 outputs of rows m0 + (t / 16)·4 + i
// and columns o0 + (t % 16)·4 + j. Per step of 16 k, thread t loads 4 consecutive k of A's row
// m0 + t / 4 and of B's column o0 + t / 4, stores them k-major into shared memory, and after the
// barrier every thread takes its 4 + 4 values per k from there.
constexpr int kConvM = 64, kConvO = 64, kConvK = 16, kConvThreads = 256;

// Where A's row m starts: its image and the input corner of its window (−1 row: past the end).
struct OutputPixel {
    int64_t n, ih0, iw0;
    bool valid;
};
__device__ __forceinline__ OutputPixel output_pixel(int64_t m, const Conv2dParams& p, int64_t P, int64_t Q) {
    const int64_t q = m % Q, r = m / Q;
    return {r / P, r % P * p.stride - p.padding, q * p.stride - p.padding, m < p.N * P * Q};
}

// A[m, k] for k = (kh, kw, c): x at the window's tap (kh, kw), channel c; 0 outside the image.
// With Vector, the four k from k (c a multiple of 4, C too) in one 16-byte load.
template <bool Vector>
__device__ __forceinline__ void load_a(const float* x, const OutputPixel& px, int64_t k, const Conv2dParams& p,
                                       float (&a)[4]) {
    const int64_t K = p.KH * p.KW * p.C;
    for (int i = 0; i < 4; i++) a[i] = 0.0f;
    for (int i = 0; i < (Vector ? 1 : 4); i++) {
        const int64_t kk = k + i;
        if (!px.valid || kk >= K) return;
        const int64_t c = kk % p.C, tap = kk / p.C, kw = tap % p.KW, kh = tap / p.KW;
        const int64_t ih = px.ih0 + kh * p.dilation, iw = px.iw0 + kw * p.dilation;
        if (ih < 0 || ih >= p.H || iw < 0 || iw >= p.W) continue;
        const float* at = x + ((px.n * p.H + ih) * p.W + iw) * p.C + c;
        if constexpr (Vector) {
            const float4 v = *reinterpret_cast<const float4*>(at);
            a[0] = v.x, a[1] = v.y, a[2] = v.z, a[3] = v.w;
        } else {
            a[i] = *at;
        }
    }
}

// B[k, o] = w[o, k] (w is [O, K]): four consecutive k of output channel o.
template <bool Vector>
__device__ __forceinline__ void load_b(const float* w, int64_t o, int64_t k, const Conv2dParams& p, float (&b)[4]) {
    const int64_t K = p.KH * p.KW * p.C;
    for (int i = 0; i < 4; i++) b[i] = 0.0f;
    if (o >= p.O) return;
    if constexpr (Vector) {
        if (k >= K) return;
        const float4 v = *reinterpret_cast<const float4*>(w + o * K + k);
        b[0] = v.x, b[1] = v.y, b[2] = v.z, b[3] = v.w;
    } else {
        for (int i = 0; i < 4; i++)
            if (k + i < K) b[i] = w[o * K + k + i];
    }
}

template <bool Vector>
__global__ void __launch_bounds__(kConvThreads)
    conv2d_nhwc_kernel(const float* x, const float* w, const float* bias, float* y, Conv2dParams p, int64_t P,
                       int64_t Q) {
    __shared__ __align__(16) float As[kConvK][kConvM + 4];  // [k][row]
    __shared__ __align__(16) float Bs[kConvK][kConvO + 4];  // [k][column]
    const int t = threadIdx.x, tx = t % 16, ty = t / 16;
    const int load_row = t / 4, load_k = (t % 4) * 4;
    const int64_t m0 = int64_t(blockIdx.x) * kConvM, o0 = int64_t(blockIdx.y) * kConvO;
    const int64_t K = p.KH * p.KW * p.C, M = p.N * P * Q;
    const OutputPixel px = output_pixel(m0 + load_row, p, P, Q);  // the row this thread loads, once
    float acc[4][4] = {};
    for (int64_t k0 = 0; k0 < K; k0 += kConvK) {
        float a[4], b[4];
        load_a<Vector>(x, px, k0 + load_k, p, a);
        load_b<Vector>(w, o0 + load_row, k0 + load_k, p, b);
        __syncthreads();  // the last step's reads of the tiles are done
        for (int i = 0; i < 4; i++) As[load_k + i][load_row] = a[i], Bs[load_k + i][load_row] = b[i];
        __syncthreads();
        for (int kk = 0; kk < kConvK; kk++) {  // 16-byte shared loads: rows of 68 floats keep them aligned
            const float4 a4 = *reinterpret_cast<const float4*>(&As[kk][ty * 4]);
            const float4 b4 = *reinterpret_cast<const float4*>(&Bs[kk][tx * 4]);
            const float av[4] = {a4.x, a4.y, a4.z, a4.w}, bv[4] = {b4.x, b4.y, b4.z, b4.w};
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 4; j++) acc[i][j] += av[i] * bv[j];
        }
    }
    for (int i = 0; i < 4; i++) {  // y[m, o]: a thread's 4 columns are consecutive floats
        const int64_t m = m0 + ty * 4 + i;
        if (m >= M) continue;
        for (int j = 0; j < 4; j++) {
            const int64_t o = o0 + tx * 4 + j;
            if (o < p.O) y[m * p.O + o] = acc[i][j] + (bias ? bias[o] : 0.0f);
        }
    }
}

void conv2d_nhwc(int version, const float* x, const float* w, const float* b, float* y, const Conv2dParams& p) {
    KILN_CHECK(p.groups == 1, "conv2d_nhwc: groups = 1 only, got ", p.groups);
    KILN_CHECK(version == 4 || p.C % 4 == 0, "conv2d_nhwc version 5 loads 4 channels at a time: C = ", p.C,
               " is not a multiple of 4; use version 4");
    const int64_t P = p.P(), Q = p.Q();
    const dim3 grid(unsigned((p.N * P * Q + kConvM - 1) / kConvM), unsigned((p.O + kConvO - 1) / kConvO)),
        block(kConvThreads);
    if (version == 4) {
        KILN_LAUNCH(conv2d_nhwc_kernel<false>, grid, block, 0)(x, w, b, y, p, P, Q);
        KILN_CHECK_LAUNCH(conv2d_nhwc_kernel<false>, grid, block);
    } else {
        KILN_LAUNCH(conv2d_nhwc_kernel<true>, grid, block, 0)(x, w, b, y, p, P, Q);
        KILN_CHECK_LAUNCH(conv2d_nhwc_kernel<true>, grid, block);
    }
}

const std::vector<Version> kTransposeVersions = {
    {1, "naive", {128, 256}}, {2, "tiled", {0}}, {3, "tiled_padded", {0}}};
const std::vector<Version> kConvVersions = {{4, "nhwc_scalar", {0}}, {5, "nhwc_vector", {0}}};

// v's [rows, cols] blocks (count of them) transposed on the host: the CPU's layout conversion.
std::vector<float> transposed(const std::vector<float>& v, int64_t count, int64_t rows, int64_t cols) {
    std::vector<float> t(v.size());
    for (int64_t b = 0; b < count; b++)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++) t[size_t((b * cols + c) * rows + r)] = v[size_t((b * rows + r) * cols + c)];
    return t;
}

// One activation shape [N, C, H, W]: every transpose validated against the host's, then (on a
// GPU) timed beside cudnnTransformTensor. Work: every float read once and written once.
bool run_transpose(int chosen, int64_t N, int64_t C, int64_t H, int64_t W) {
    const int64_t S = H * W;
    const std::string problem = "nchw_to_nhwc_" + std::to_string(N) + "x" + std::to_string(C) + "x" +
                                std::to_string(H) + "x" + std::to_string(W);
    std::printf("%s\n", problem.c_str());
    const std::vector<float> x = random_floats(size_t(N * C * S), 7);
    const std::vector<float> want = transposed(x, N, C, S);
    DeviceArray<float> dx(x), dy(x.size());
    const auto run = [&](int version, int block) { nchw_to_nhwc(version, dx.get(), dy.get(), N, C, S, block); };
    const bool ok = validate_versions(
        kTransposeVersions, chosen,
        [&](int version, int block) {
            dy.poison();
            run(version, block);
        },
        [&](const std::string& label) { return validate_result(dy.get(), want, label, 0.0, 0.0); });
    if (!ok || !kTiming) return ok;
#ifdef KILN_CUDA
    cudnnHandle_t handle;
    CUDNN_CHECK(cudnnCreate(&handle));
    cudnnTensorDescriptor_t from, to;
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&from));
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&to));
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(from, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, int(N), int(C), int(H), int(W)));
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(to, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, int(N), int(C), int(H), int(W)));
    const float one = 1.0f, zero = 0.0f;
    const auto cudnn = [&] { CUDNN_CHECK(cudnnTransformTensor(handle, &one, from, dx.get(), &zero, to, dy.get())); };
    dy.poison();
    cudnn();
    const bool cudnn_ok = validate_result(dy.get(), want, "cudnn_transform", 0.0, 0.0);
    const double cudnn_ms = time_ms(cudnn);
    CUDNN_CHECK(cudnnDestroyTensorDescriptor(from));
    CUDNN_CHECK(cudnnDestroyTensorDescriptor(to));
    CUDNN_CHECK(cudnnDestroy(handle));
    time_versions(kTransposeVersions, chosen, run, problem, 2.0 * double(x.size()) * sizeof(float) / 1e9, "GB/s",
                  cudnn_ms, "cudnn");
    return cudnn_ok;
#else
    return ok;
#endif
}

// One layer (groups 1): the CPU's NCHW forward, its inputs and output converted to NHWC on the
// host, then every version validated, and (on a GPU) timed beside cuDNN's NHWC forward.
bool run_conv(int chosen, const std::string& name, const Conv2dParams& p, bool with_bias) {
    const int64_t P = p.P(), Q = p.Q(), taps = p.KH * p.KW;
    const std::string problem = "conv_nhwc_" + name;
    std::printf("%s: N %lld, C %lld, %lldx%lld -> O %lld, %lldx%lld; kernel %lldx%lld, stride %lld, padding %lld, "
                "dilation %lld%s\n",
                problem.c_str(), (long long)p.N, (long long)p.C, (long long)p.H, (long long)p.W, (long long)p.O,
                (long long)P, (long long)Q, (long long)p.KH, (long long)p.KW, (long long)p.stride,
                (long long)p.padding, (long long)p.dilation, with_bias ? ", bias" : "");
    const std::vector<float> x = random_floats(size_t(p.N * p.C * p.H * p.W), 1), w = random_floats(size_t(p.O * p.C * taps), 2);
    const std::vector<float> b = random_floats(size_t(p.O), 3);
    std::vector<float> y(size_t(p.N * p.O * P * Q));
    const int64_t per_image = cpu::conv2d_col_elems_per_image(p, DType::F32);  // 0: no columns
    const int64_t images = per_image ? std::clamp<int64_t>(kDefaultConvWorkspace / (per_image * 4), 1, p.N) : 0;
    std::vector<float> col(size_t(per_image * images));
    cpu::conv2d_forward(x.data(), w.data(), with_bias ? b.data() : nullptr, y.data(), p, col.data(), images);
    // NCHW → NHWC: x [N, C, H·W] → [N, H·W, C]; w [O, C, KH·KW] → [O, KH·KW, C]; y likewise
    const std::vector<float> want = transposed(y, p.N, p.O, P * Q);
    DeviceArray<float> dx(transposed(x, p.N, p.C, p.H * p.W)), dw(transposed(w, p.O, p.C, taps)), db(b), dy(want.size());
    const float* bias = with_bias ? db.get() : nullptr;
    std::vector<Version> versions = {kConvVersions[0]};
    if (p.C % 4 == 0) versions.push_back(kConvVersions[1]);
    const auto launch = [&](int version, int) { conv2d_nhwc(version, dx.get(), dw.get(), bias, dy.get(), p); };
    const double atol = 2e-6 * double(p.C * taps + 1);  // as the conv page: a few ulps of Σ|w·x|
    const auto check = [&](const std::string& label) { return validate_result(dy.get(), want, label, atol, 1e-5); };
    bool ok = validate_versions(versions, chosen, [&](int v, int bs) { dy.poison(), launch(v, bs); }, check);
    if (!ok || !kTiming) return ok;
#ifdef KILN_CUDA
    const double gflop = 2.0 * double(want.size()) * double(p.C * taps) / 1e9;
    dy.poison();
    const double cudnn_ms =
        CudnnConv(p, CUDNN_TENSOR_NHWC).forward(dx.get(), dw.get(), bias, dy.get(), problem, check, ok);
    time_versions(versions, chosen, launch, problem, gflop, "GFLOP/s", cudnn_ms, "cudnn");
#endif
    return ok;
}

bool run_lab(int chosen) {
    bool ok = true;
    if (kTiming) {
        // The CIFAR net of widths 64/256/256 at batch 256 (src/nn/models.cpp cifar_net; the conv
        // page's layers): the activations each block's first conv reads, and its six 3×3 convs.
        for (const auto& s : std::vector<std::array<int64_t, 4>>{{256, 24, 31, 31}, {256, 64, 15, 15},
                                                                  {256, 256, 7, 7}, {256, 256, 3, 3}})
            ok = run_transpose(chosen, s[0], s[1], s[2], s[3]) && ok;
        const Conv2dParams layers[] = {{256, 24, 31, 31, 64, 3, 3, 1, 1},   {256, 64, 15, 15, 64, 3, 3, 1, 1},
                                       {256, 64, 15, 15, 256, 3, 3, 1, 1},  {256, 256, 7, 7, 256, 3, 3, 1, 1},
                                       {256, 256, 7, 7, 256, 3, 3, 1, 1},   {256, 256, 3, 3, 256, 3, 3, 1, 1}};
        const char* names[] = {"block1a", "block1b", "block2a", "block2b", "block3a", "block3b"};
        for (size_t i = 0; i < 6; i++) ok = run_conv(chosen, std::string("cifar64_256_256_") + names[i], layers[i], false) && ok;
        return ok;
    }
    // Ragged shapes: partial tiles on every side.
    ok = run_transpose(chosen, 2, 5, 7, 9) && ok;
    ok = run_transpose(chosen, 1, 40, 3, 35) && ok;
    // {N, C, H, W, O, KH, KW, stride, padding, dilation, groups}
    ok = run_conv(chosen, "same", {2, 8, 6, 5, 12, 3, 3, 1, 1}, true) && ok;
    ok = run_conv(chosen, "strided_dilated", {1, 4, 10, 7, 6, 3, 2, 2, 2, 2}, true) && ok;
    ok = run_conv(chosen, "three_channels", {2, 3, 7, 7, 5, 3, 3, 1, 1}, false) && ok;
    ok = run_conv(chosen, "wide", {2, 8, 9, 9, 70, 1, 1, 1, 0}, false) && ok;
    return ok;
}

}  // namespace kiln::lab

int main(int argc, char** argv) {
    using namespace kiln::lab;
    std::vector<Version> all = kTransposeVersions;
    all.insert(all.end(), kConvVersions.begin(), kConvVersions.end());
    return lab_main("layout", [&] { return run_lab(chosen_version(argc, argv, all)); });
}
