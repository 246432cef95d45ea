// quant.cu — the CUDA twins of src/ops/cpu/quant.cpp (chapter 11): quantize and dequantize, the
// int8 matrix product on __dp4a, requantization, the int8 Linear and convolution (groups 1 and
// depthwise), u8 max and global average pooling, table lookups, the sum of two u8 tensors, and
// fake quantization for quantization-aware training. Same names and arguments as the CPU's
// (declared once for both in ops/quant.h); every pointer is device memory, QOutput's too.
//
// Every result is the CPU's, bit for bit:
//   - the integer kernels add exact int32 products, and integer addition gives the same sum in
//     any order (no overflow while K < 65793, ops/quant.h's bound), so no tiling changes a bit;
//   - quantize, dequantize, fake quantization, requantization and qadd call the CPU's own
//     arithmetic (ops/qparams.h, ops/quant.h's qadd_value, KILN_HOST_DEVICE): one correctly
//     rounded float division (1/scale, as the CPU takes it per channel; nvcc divides exactly
//     unless -use_fast_math), one multiply, rintf, integer shifts — operations that round the
//     same way on both.
//
// ---- __dp4a, and u8 read as s8 ------------------------------------------------------------------
// __dp4a(a, b, c) (sm_61 and later) treats two 32-bit words as 4 bytes each and returns
//   c + a0·b0 + a1·b1 + a2·b2 + a3·b3      (int32; byte i = bits 8i .. 8i + 7)
// four multiply-adds in one instruction, both operands signed (or both unsigned). Activations are
// u8 and weights s8, a mix it does not have, so each activation is read as s8 by flipping its top
// bit, a ^ 0x80 = a − 128 (0 → −128, 128 → 0, 255 → 127), and the sum is corrected exactly:
//   Σ_k a_k·b_k = Σ_k (a_k − 128)·b_k + 128·Σ_k b_k
// The correction needs only the weights' sums (one int32 per output column or filter). A term of
// the first sum is at most 128·128 in size, so it is exact in int32 for K < 2^17.
// Padding (K not a multiple of 4, the edges of tiles) is byte 0 on both sides after the flip:
// its products are 0 and it adds 0 to Σ b.
//
// Thread/block mapping:
//   quantize, dequantize, fake_quantize_*, requantize_rows, qmaxpool2d, lookup_u8, qadd, and
//        qconv2d when depthwise   one thread per output element, 1-D grid-stride, block 256, the
//        CPU's formula for that element (a depthwise output: its KH·KW taps in an int32 sum).
//   qglobal_avgpool   one thread per plane (n, c), 1-D grid-stride: its H·W values in an int64 sum.
//   qgemm_u8s8   qgemm_dp4a_kernel: a 64×64 tile of C per block of 128 threads, 8×4 of it per
//        thread in registers (GEMM version 3, lab/versions/gemm_versions.cu, with words of 4 values
//        in place of floats). K in steps of 32 values: both tiles are packed into words in shared
//        memory, a barrier, then each thread runs 8 words × (8·4 dp4a for its products + 4 for its
//        columns' Σ b), a barrier. grid (ceil(N/64), min(ceil(M/64), 65535)); blocks loop over row tiles beyond.
//   qconv2d, groups 1   two kernels, no im2col: pack_filters_kernel (one thread per filter) packs
//        each filter's C·KH·KW weights into words and sums them; qconv2d_kernel gives each thread one
//        output pixel (n, p, q) and kOT = 8 consecutive output channels: dp4a_conv_dot walks the
//        pixel's receptive field 4 values at a time, one dp4a per filter, then the 8 results are
//        corrected and requantized. grid (ceil(N·P·Q/128), ceil(O/8)), block 128; a warp's 32
//        pixels read neighbouring bytes of x and the same filter word (one broadcast load).
//
// Build and run: part of the engine (make, or make CUDA=1); tested against the CPU by
//   make test T='[quant][cuda]'
#include "common.cuh"
#include "ops/quant.h"

namespace kiln::cuda {

using detail::blocks_for;
using detail::kBlock;

namespace {

// ---- words for __dp4a -------------------------------------------------------------------------------
// row[k .. k + 3] as one word, byte i = row[k + i] ^ flip (flip 0x80: u8 as s8; 0: s8 as is);
// values at k + i ≥ K are byte 0.
template <typename T>
__device__ __forceinline__ int pack4(const T* row, int64_t k, int64_t K, uint32_t flip) {
    uint32_t word = 0;
    KILN_UNROLL
    for (int i = 0; i < 4; i++)
        if (k + i < K) word |= ((uint32_t(uint8_t(row[k + i])) ^ flip) & 0xffu) << (8 * i);
    return int(word);
}

constexpr uint32_t kFlip = 0x80;     // u8 a → s8 a − 128
constexpr int kOnes = 0x01010101;    // __dp4a(b, kOnes, s) = s + the sum of b's 4 bytes

// ---- per channel, or one value for all -----------------------------------------------------------
// Channel c's scale and zero point: from device arrays [C] (per channel) or, when they are null,
// the one pair passed by value (per tensor).
struct ChannelQ {
    const float* scale;
    const int32_t* zero_point;
    float scale0;
    int32_t zero_point0;
    __device__ float scale_of(int64_t c) const { return scale ? scale[c] : scale0; }
    __device__ int32_t zero_point_of(int64_t c) const { return zero_point ? zero_point[c] : zero_point0; }
};

}  // namespace

// ==== quantize / dequantize (x viewed as [outer, C, inner]; c = i / inner % C) =======================
// q[i] = clamp(rint(x[i] · (1/s_c)) + z_c, qmin, qmax)
template <typename Q>
__global__ void quantize_kernel(const float* x, Q* q, int64_t n, int64_t C, int64_t inner, ChannelQ cq,
                                int32_t qmin, int32_t qmax) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t c = i / inner % C;
        q[i] = Q(quantize_value(x[i], 1.0f / cq.scale_of(c), cq.zero_point_of(c), qmin, qmax));
    }
}

// x[i] = s_c · (q[i] − z_c)
template <typename Q>
__global__ void dequantize_kernel(const Q* q, float* x, int64_t n, int64_t C, int64_t inner, ChannelQ cq) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t c = i / inner % C;
        x[i] = dequantize_value(q[i], cq.scale_of(c), cq.zero_point_of(c));
    }
}

template <typename Q>
static void launch_quantize(const float* x, Q* q, int64_t n, int64_t C, int64_t inner, ChannelQ cq, int32_t qmin,
                            int32_t qmax) {
    if (n == 0) return;
    const dim3 grid(blocks_for(n)), block(kBlock);
    KILN_LAUNCH(quantize_kernel<Q>, grid, block, 0)(x, q, n, C, inner, cq, qmin, qmax);
    KILN_CHECK_LAUNCH(quantize_kernel<Q>, grid, block);
}

template <typename Q>
static void launch_dequantize(const Q* q, float* x, int64_t n, int64_t C, int64_t inner, ChannelQ cq) {
    if (n == 0) return;
    const dim3 grid(blocks_for(n)), block(kBlock);
    KILN_LAUNCH(dequantize_kernel<Q>, grid, block, 0)(q, x, n, C, inner, cq);
    KILN_CHECK_LAUNCH(dequantize_kernel<Q>, grid, block);
}

template <typename Q>
void quantize(const float* x, Q* q, int64_t n, float scale, int32_t zero_point, int32_t qmin, int32_t qmax) {
    launch_quantize(x, q, n, 1, n, ChannelQ{nullptr, nullptr, scale, zero_point}, qmin, qmax);
}

template <typename Q>
void dequantize(const Q* q, float* x, int64_t n, float scale, int32_t zero_point) {
    launch_dequantize(q, x, n, 1, n, ChannelQ{nullptr, nullptr, scale, zero_point});
}

template <typename Q>
void quantize_per_channel(const float* x, Q* q, int64_t outer, int64_t C, int64_t inner, const float* scale,
                          const int32_t* zero_point, int32_t qmin, int32_t qmax) {
    launch_quantize(x, q, outer * C * inner, C, inner, ChannelQ{scale, zero_point, 0.0f, 0}, qmin, qmax);
}

template <typename Q>
void dequantize_per_channel(const Q* q, float* x, int64_t outer, int64_t C, int64_t inner, const float* scale,
                            const int32_t* zero_point) {
    launch_dequantize(q, x, outer * C * inner, C, inner, ChannelQ{scale, zero_point, 0.0f, 0});
}

KILN_QUANTIZE_KERNELS(KILN_INSTANTIATE_INT8);

// ==== the int8 matrix product ===========================================================================
//   C[m, n] = Σ_k A[m, k]·B[n, k] = Σ_k (A[m, k] − 128)·B[n, k] + 128·Σ_k B[n, k]
//   for each k0 = 0, 32, 64, ...:
//       As[r][w] = A[row0 + r, k0 + 4w .. +3] as s8 (a ^ 0x80),  Bs[r][w] = B[col0 + r, k0 + 4w .. +3]
//                  (one word each; 0 outside the matrix)                                     barrier
//       thread (tx, ty), rows ty + 8i (i < 8), columns tx + 16j (j < 4), each word w < 8:
//           acc[i][j] = dp4a(As[ty + 8i][w], Bs[tx + 16j][w], acc[i][j])
//           bsum[j]   = dp4a(Bs[tx + 16j][w], 1 1 1 1, bsum[j])                              barrier
//   C[m, n] = acc + 128·bsum   (masked to the matrix)
// Each thread sums its own columns of B (the 8 threads of a column do it alike): no pre-pass and
// no workspace, for 4 more dp4a per 32.
namespace qgemm_tile {
constexpr int kBM = 64, kBN = 64, kBKW = 8;  // a 64×64 tile of C; k in steps of 8 words (32 values)
constexpr int kTM = 8, kTN = 4;              // per thread: 8 rows × 4 columns
constexpr int kThreadsX = kBN / kTN, kThreadsY = kBM / kTM, kThreads = kThreadsX * kThreadsY;  // 16 × 8
}  // namespace qgemm_tile

__global__ void __launch_bounds__(qgemm_tile::kThreads)
    qgemm_dp4a_kernel(int64_t M, int64_t N, int64_t K, const uint8_t* A, int64_t lda, const int8_t* B,
                      int64_t ldb, int32_t* C, int64_t ldc) {
    using namespace qgemm_tile;
    // One word of padding per row: the 16 threads of a half-warp read Bs[tx + 16j][w] at word
    // (tx + 16j)·9 + w, 16 different banks (9 and 32 share no factor).
    __shared__ int As[kBM][kBKW + 1];
    __shared__ int Bs[kBN][kBKW + 1];
    const int tx = int(threadIdx.x) % kThreadsX, ty = int(threadIdx.x) / kThreadsX;
    const int64_t col0 = int64_t(blockIdx.x) * kBN;
    const int64_t tiles_m = (M + kBM - 1) / kBM;
    for (int64_t tile = blockIdx.y; tile < tiles_m; tile += gridDim.y) {
        const int64_t row0 = tile * kBM;
        int acc[kTM][kTN] = {}, bsum[kTN] = {};
        for (int64_t k0 = 0; k0 < K; k0 += 4 * kBKW) {
            for (int e = threadIdx.x; e < kBM * kBKW; e += kThreads) {  // kBM == kBN: one loop for both
                const int r = e / kBKW, w = e % kBKW;
                const int64_t m = row0 + r, n = col0 + r, k = k0 + 4 * w;
                As[r][w] = m < M ? pack4(A + m * lda, k, K, kFlip) : 0;
                Bs[r][w] = n < N ? pack4(B + n * ldb, k, K, 0) : 0;
            }
            __syncthreads();
            KILN_UNROLL
            for (int w = 0; w < kBKW; w++) {
                int a[kTM], b[kTN];
                KILN_UNROLL
                for (int i = 0; i < kTM; i++) a[i] = As[ty + i * kThreadsY][w];
                KILN_UNROLL
                for (int j = 0; j < kTN; j++) {
                    b[j] = Bs[tx + j * kThreadsX][w];
                    bsum[j] = __dp4a(b[j], kOnes, bsum[j]);
                }
                KILN_UNROLL
                for (int i = 0; i < kTM; i++) {
                    KILN_UNROLL
                    for (int j = 0; j < kTN; j++) acc[i][j] = __dp4a(a[i], b[j], acc[i][j]);
                }
            }
            __syncthreads();
        }
        KILN_UNROLL
        for (int i = 0; i < kTM; i++) {
            const int64_t m = row0 + ty + i * kThreadsY;
            KILN_UNROLL
            for (int j = 0; j < kTN; j++) {
                const int64_t n = col0 + tx + j * kThreadsX;
                if (m < M && n < N) C[m * ldc + n] = acc[i][j] + 128 * bsum[j];
            }
        }
    }
}

// a_max does not matter here: dp4a sums its products in 32 bits, with no 16-bit step to saturate.
void qgemm_u8s8(int64_t M, int64_t N, int64_t K, const uint8_t* A, int64_t lda, const int8_t* B, int64_t ldb,
                int32_t* C, int64_t ldc, int32_t /*a_max*/) {
    using namespace qgemm_tile;
    if (M == 0 || N == 0) return;
    const dim3 grid(unsigned((N + kBN - 1) / kBN), unsigned(std::min<int64_t>((M + kBM - 1) / kBM, 65535)));
    const dim3 block(kThreads);
    KILN_LAUNCH(qgemm_dp4a_kernel, grid, block, 0)(M, N, K, A, lda, B, ldb, C, ldc);
    KILN_CHECK_LAUNCH(qgemm_dp4a_kernel, grid, block);
}

const char* qgemm_path_for(int32_t /*a_max*/) { return "dp4a"; }

// ==== requantization and the int8 Linear ==================================================================
// y[m, o] = clamp(z_y + round((acc[m, o] + bias[o]) · M_o), lo, hi)
__global__ void requantize_rows_kernel(const int32_t* acc, uint8_t* y, int64_t M, int64_t O, QOutput out) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < M * O; i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t o = i % O;
        y[i] = requantize_value(acc[i] + out.bias[o], out.requant[o], out.zero_point, out.lo, out.hi);
    }
}

void requantize_rows(const int32_t* acc, uint8_t* y, int64_t M, int64_t O, const QOutput& out) {
    if (M * O == 0) return;
    const dim3 grid(blocks_for(M * O)), block(kBlock);
    KILN_LAUNCH(requantize_rows_kernel, grid, block, 0)(acc, y, M, O, out);
    KILN_CHECK_LAUNCH(requantize_rows_kernel, grid, block);
}

void qlinear(const uint8_t* x, const int8_t* w, uint8_t* y, int64_t N, int64_t K, int64_t O, int32_t x_max,
             const QOutput& out, int32_t* work) {
    qgemm_u8s8(N, O, K, x, K, w, K, work, O, x_max);
    requantize_rows(work, y, N, O, out);
}

// ==== the int8 convolution (groups = 1; depthwise below) ===================================================
// The sizes the kernels need, worked out on the host (Conv2dParams' methods are host code).
struct QConvDims {
    int64_t N, C, H, W, O, KH, KW, stride, padding, dilation, P, Q;
    int64_t Kw;    // words per packed filter: ceil(C·KH·KW / 4)
    uint32_t pad;  // what the padding reads as: x's zero point
};

constexpr int kOT = 8;  // output channels per thread of qconv2d_kernel

// The filters, padded to a multiple of kOT (extra filters are all zero), in the workspace:
//   words [Opad, Kw] int32      filter o's weights 4 to a word, zero-padded (pack4)
//   sums  [Opad]     int32      Σ_k w[o, k], for the correction of the u8 → s8 flip
static int64_t padded_filters(int64_t O) { return (O + kOT - 1) / kOT * kOT; }

__global__ void pack_filters_kernel(const int8_t* w, QConvDims d, int64_t Opad, int32_t* words, int32_t* sums) {
    const int64_t K = d.C * d.KH * d.KW;
    for (int64_t o = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; o < Opad; o += int64_t(gridDim.x) * blockDim.x) {
        int sum = 0;
        for (int64_t k4 = 0; k4 < d.Kw; k4++) {
            const int word = o < d.O ? pack4(w + o * K, 4 * k4, K, 0) : 0;
            words[o * d.Kw + k4] = word;
            sum = __dp4a(word, kOnes, sum);
        }
        sums[o] = sum;
    }
}

// acc[j] = __dp4a(values, filter j's word k4, acc[j]) for the kOT filters of one thread
__device__ __forceinline__ void dp4a_filters(int values, const int32_t* filter_words, int64_t Kw, int64_t k4,
                                             int32_t (&acc)[kOT]) {
    KILN_UNROLL
    for (int j = 0; j < kOT; j++) acc[j] = __dp4a(values, filter_words[j * Kw + k4], acc[j]);
}

}  // namespace kiln::cuda

// Lesson 11's exercise, the dp4a inner loop of one output pixel: dp4a_conv_dot.
#include "qconv_dot.cuh"

namespace kiln::cuda {

// One thread per output pixel (n, p, q) and channels o0 = blockIdx.y·kOT .. o0 + kOT − 1:
//   y[n, o, p, q] = requantize(acc[o − o0] + 128·sums[o] + bias[o])
__global__ void qconv2d_kernel(const uint8_t* x, const int32_t* words, const int32_t* sums, uint8_t* y,
                               QConvDims d, QOutput out) {
    const int64_t pixel = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (pixel >= d.N * d.P * d.Q) return;
    const int64_t n = pixel / (d.P * d.Q), p = pixel / d.Q % d.P, q = pixel % d.Q;
    const int64_t o0 = int64_t(blockIdx.y) * kOT;
    int32_t acc[kOT] = {};
    dp4a_conv_dot(x + n * d.C * d.H * d.W, d, p * d.stride - d.padding, q * d.stride - d.padding,
                  words + o0 * d.Kw, acc);
    KILN_UNROLL
    for (int j = 0; j < kOT; j++) {
        const int64_t o = o0 + j;
        if (o < d.O)
            y[((n * d.O + o) * d.P + p) * d.Q + q] =
                requantize_value(acc[j] + 128 * sums[o] + out.bias[o], out.requant[o], out.zero_point, out.lo, out.hi);
    }
}

// ---- depthwise: G = C = O, w [C, 1, KH, KW] -----------------------------------------------------------
// thread e → y[e], e = (plane·P + p)·Q + q with plane = n·C + c:
//   y[e] = requantize(Σ_{kh, kw} w[c, kh, kw] · x[n, c, ih, iw] + bias[c])      (z_x outside the image)
// The sum is exact in int32 (KH·KW·255·128 is far below 2^31): the CPU's integers, in any order.
__global__ void qconv2d_depthwise_kernel(const uint8_t* x, const int8_t* w, uint8_t* y, QConvDims d, QOutput out) {
    const int64_t total = d.N * d.C * d.P * d.Q;
    for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
        const int64_t plane = e / (d.P * d.Q), p = e / d.Q % d.P, q = e % d.Q, c = plane % d.C;
        const uint8_t* xp = x + plane * d.H * d.W;  // x[n, c]   [H, W]
        const int8_t* wc = w + c * d.KH * d.KW;     // w[c, 0]   [KH, KW]
        int32_t acc = 0;
        for (int64_t kh = 0; kh < d.KH; kh++)
            for (int64_t kw = 0; kw < d.KW; kw++) {
                const int64_t ih = p * d.stride - d.padding + kh * d.dilation;
                const int64_t iw = q * d.stride - d.padding + kw * d.dilation;
                const bool inside = ih >= 0 && ih < d.H && iw >= 0 && iw < d.W;
                acc += int32_t(wc[kh * d.KW + kw]) * int32_t(inside ? uint32_t(xp[ih * d.W + iw]) : d.pad);
            }
        y[e] = requantize_value(acc + out.bias[c], out.requant[c], out.zero_point, out.lo, out.hi);
    }
}

int64_t qconv2d_work_bytes(const Conv2dParams& p) {
    if (qconv2d_is_depthwise(p)) return 0;
    const int64_t Kw = (p.C * p.KH * p.KW + 3) / 4;
    return padded_filters(p.O) * (Kw + 1) * int64_t(sizeof(int32_t));
}

// x_max does not matter here either (see qgemm_u8s8).
void qconv2d(const uint8_t* x, const int8_t* w, uint8_t* y, const Conv2dParams& p, int32_t x_zero_point,
             int32_t /*x_max*/, const QOutput& out, uint8_t* work) {
    check_conv2d_params(p, "cuda::qconv2d");
    KILN_CHECK(p.groups == 1 || qconv2d_is_depthwise(p), "cuda::qconv2d: groups=", p.groups,
               " is not supported; int8 convolutions take groups=1 or depthwise groups=C=O");
    KILN_CHECK(x_zero_point >= 0 && x_zero_point <= 255, "cuda::qconv2d: x_zero_point=", x_zero_point,
               " is not a u8; take it from the input's QParams (choose_qparams_affine)");
    const QConvDims d{p.N,        p.C,   p.H,   p.W, p.O, p.KH, p.KW, p.stride, p.padding,
                      p.dilation, p.P(), p.Q(), (p.C * p.KH * p.KW + 3) / 4, uint32_t(x_zero_point)};
    const int64_t pixels = d.N * d.P * d.Q, Opad = padded_filters(p.O);
    if (pixels == 0) return;
    if (qconv2d_is_depthwise(p)) {
        const dim3 dw_grid(blocks_for(pixels * d.C)), dw_block(kBlock);
        KILN_LAUNCH(qconv2d_depthwise_kernel, dw_grid, dw_block, 0)(x, w, y, d, out);
        KILN_CHECK_LAUNCH(qconv2d_depthwise_kernel, dw_grid, dw_block);
        return;
    }
    int32_t* words = reinterpret_cast<int32_t*>(work);
    int32_t* sums = words + Opad * d.Kw;

    const dim3 pack_grid(blocks_for(Opad)), pack_block(kBlock);
    KILN_LAUNCH(pack_filters_kernel, pack_grid, pack_block, 0)(w, d, Opad, words, sums);
    KILN_CHECK_LAUNCH(pack_filters_kernel, pack_grid, pack_block);

    const int threads = 128;
    const dim3 grid(unsigned((pixels + threads - 1) / threads), unsigned(Opad / kOT)), block(threads);
    KILN_LAUNCH(qconv2d_kernel, grid, block, 0)(x, words, sums, y, d, out);
    KILN_CHECK_LAUNCH(qconv2d_kernel, grid, block);
}

// ==== pooling and tables ==================================================================================
// y[n, c, p, q] = max of x over the window's cells inside the image (0 if none)
__global__ void qmaxpool2d_kernel(const uint8_t* x, uint8_t* y, Pool2dParams p, int64_t P, int64_t Q) {
    const int64_t total = p.N * p.C * P * Q;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t plane = i / (P * Q), op = i / Q % P, oq = i % Q;
        const uint8_t* xp = x + plane * p.H * p.W;
        uint8_t m = 0;
        for (int64_t kh = 0; kh < p.KH; kh++)
            for (int64_t kw = 0; kw < p.KW; kw++) {
                const int64_t ih = op * p.stride - p.padding + kh, iw = oq * p.stride - p.padding + kw;
                if (ih >= 0 && ih < p.H && iw >= 0 && iw < p.W && xp[ih * p.W + iw] > m) m = xp[ih * p.W + iw];
            }
        y[i] = m;
    }
}

void qmaxpool2d(const uint8_t* x, uint8_t* y, const Pool2dParams& p) {
    const int64_t P = p.P(), Q = p.Q(), total = p.N * p.C * P * Q;
    if (total <= 0) return;
    const dim3 grid(blocks_for(total)), block(kBlock);
    KILN_LAUNCH(qmaxpool2d_kernel, grid, block, 0)(x, y, p, P, Q);
    KILN_CHECK_LAUNCH(qmaxpool2d_kernel, grid, block);
}

// y[i] = (Σ_s x[i, s] + ⌊S/2⌋) / S      one thread per plane i < NC, x [NC, S]
__global__ void qglobal_avgpool_kernel(const uint8_t* x, uint8_t* y, int64_t NC, int64_t S) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < NC; i += int64_t(gridDim.x) * blockDim.x) {
        int64_t sum = 0;
        for (int64_t s = 0; s < S; s++) sum += x[i * S + s];
        y[i] = uint8_t((sum + S / 2) / S);
    }
}

void qglobal_avgpool(const uint8_t* x, uint8_t* y, int64_t NC, int64_t S) {
    if (NC == 0) return;
    const dim3 grid(blocks_for(NC)), block(kBlock);
    KILN_LAUNCH(qglobal_avgpool_kernel, grid, block, 0)(x, y, NC, S);
    KILN_CHECK_LAUNCH(qglobal_avgpool_kernel, grid, block);
}

// y[i] = table[c][x[i]], x viewed as [outer, C, inner]
__global__ void lookup_u8_kernel(const uint8_t* x, uint8_t* y, int64_t n, int64_t C, int64_t inner,
                                 const uint8_t* table) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        y[i] = table[(i / inner % C) * 256 + x[i]];
}

void lookup_u8(const uint8_t* x, uint8_t* y, int64_t outer, int64_t C, int64_t inner, const uint8_t* table) {
    const int64_t n = outer * C * inner;
    if (n == 0) return;
    const dim3 grid(blocks_for(n)), block(kBlock);
    KILN_LAUNCH(lookup_u8_kernel, grid, block, 0)(x, y, n, C, inner, table);
    KILN_CHECK_LAUNCH(lookup_u8_kernel, grid, block);
}

// ==== the sum of two u8 tensors ==============================================================================
// y[i] = qadd_value(a[i], b[i], q)   (ops/quant.h: the fixed-point formula, shared with the CPU)
__global__ void qadd_kernel(const uint8_t* a, const uint8_t* b, uint8_t* y, int64_t n, QAddParams q) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        y[i] = qadd_value(a[i], b[i], q);
}

void qadd(const uint8_t* a, const uint8_t* b, uint8_t* y, int64_t n, const QAddParams& q) {
    if (n == 0) return;
    const dim3 grid(blocks_for(n)), block(kBlock);
    KILN_LAUNCH(qadd_kernel, grid, block, 0)(a, b, y, n, q);
    KILN_CHECK_LAUNCH(qadd_kernel, grid, block);
}

// ==== fake quantization ======================================================================================
// y = (clamp(rint(x / s_c) + z_c, qmin, qmax) − z_c) · s_c
__global__ void fake_quantize_forward_kernel(const float* x, float* y, int64_t n, int64_t C, int64_t inner,
                                             const float* scale, const int32_t* zero_point, int32_t qmin,
                                             int32_t qmax) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t c = i / inner % C;
        const int32_t q = quantize_value(x[i], 1.0f / scale[c], zero_point[c], qmin, qmax);
        y[i] = dequantize_value(q, scale[c], zero_point[c]);
    }
}

// dx = dy where qmin ≤ rint(x / s_c) + z_c ≤ qmax (in float, as the CPU), else 0
__global__ void fake_quantize_backward_kernel(const float* x, const float* dy, float* dx, int64_t n, int64_t C,
                                              int64_t inner, const float* scale, const int32_t* zero_point,
                                              int32_t qmin, int32_t qmax) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t c = i / inner % C;
        const float q = rintf(x[i] * (1.0f / scale[c])) + float(zero_point[c]);
        dx[i] = q >= float(qmin) && q <= float(qmax) ? dy[i] : 0.0f;
    }
}

void fake_quantize_forward(const float* x, float* y, int64_t outer, int64_t C, int64_t inner, const float* scale,
                           const int32_t* zero_point, int32_t qmin, int32_t qmax) {
    const int64_t n = outer * C * inner;
    if (n == 0) return;
    const dim3 grid(blocks_for(n)), block(kBlock);
    KILN_LAUNCH(fake_quantize_forward_kernel, grid, block, 0)(x, y, n, C, inner, scale, zero_point, qmin, qmax);
    KILN_CHECK_LAUNCH(fake_quantize_forward_kernel, grid, block);
}

void fake_quantize_backward(const float* x, const float* dy, float* dx, int64_t outer, int64_t C, int64_t inner,
                            const float* scale, const int32_t* zero_point, int32_t qmin, int32_t qmax) {
    const int64_t n = outer * C * inner;
    if (n == 0) return;
    const dim3 grid(blocks_for(n)), block(kBlock);
    KILN_LAUNCH(fake_quantize_backward_kernel, grid, block, 0)(x, dy, dx, n, C, inner, scale, zero_point, qmin,
                                                              qmax);
    KILN_CHECK_LAUNCH(fake_quantize_backward_kernel, grid, block);
}

}  // namespace kiln::cuda
