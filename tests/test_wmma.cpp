// test_wmma.cpp — tensor cores (chapter 09): the nvcuda::wmma fragment API on the kernel
// emulator (cuda/emu/wmma.h), the f16/bf16 GEMM built on it (cuda/lab/versions/gemm_versions.cu, version 5) and
// the implicit-GEMM convolution's wmma variant (cuda/conv.cu), each against the CPU.
//
//   make test T='[wmma]'
//
// The fragment tests multiply small integers: every product and sum is an integer far below
// 2^11, exact in f16, bf16 and f32, so the result must equal the integer product exactly,
// whatever order the sums take. The misuse tests check that the emulator fails a launch
// where a GPU would compute garbage or fault, with a message naming the call. Those, and the
// check that matmul takes the tensor cores (the emulator counts wmma operations), test the
// emulator and are left out of the GPU build (KILN_CUDA).
//
// The GEMM and convolution tests draw inputs in f32 and round them to T (f16 or bf16); the
// rounded values are exact in f32, so the reference is the f32 CPU op on the same values. The
// tensor cores multiply exactly in f32 and sum in f32 in another order, and the result is
// rounded to T once, so (as in lowp_check.h)
//
//     |got − want| ≤ u_T·|want| + tiny_T  +  2(R + 2)·eps_f32·S
//
// u_T the unit roundoff (f16 2^-11, bf16 2^-8), tiny_T half the smallest subnormal (f16 2^-25,
// bf16 2^-134), R the number of terms of one output (K, or C/G·KH·KW + 1 with the bias), S the
// sum of their absolute values: any two f32 summation orders of R terms differ by at most
// 2R·eps_f32·S, plus two roundings for alpha and beta.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "fixtures.h"
#include "gemm_versions.h"
#include "ops/cnn.h"
#include "ops/cpu/gemm.h"
#include "ops/kernels/all.h"
#include "ops/ops.h"
#ifndef KILN_CUDA
#include "kiln_cuda.h"  // the emulator: its wmma, launches and counters
#else
#include <cuda_runtime.h>
#endif

using namespace kiln;
using test::under_schedules;

namespace {

// ---- tolerance -------------------------------------------------------------------------------------
using Format = test::LowFormat;  // unit roundoff, half the smallest subnormal
const Format kF16 = test::low_format(DType::F16);
const Format kBF16 = test::low_format(DType::BF16);

Tensor abs_of(const Tensor& x) {
    Tensor a = x.to(Device::CPU).to(DType::F32).clone();
    for (int64_t i = 0; i < a.numel(); i++) a.data<float>()[i] = std::fabs(a.data<float>()[i]);
    return a;
}

// got (T, any device) against want (f32, CPU): the bound of the header, element by element.
void require_within(const Tensor& got_t, const Tensor& want, const Format& f, int64_t R, const Tensor& S) {
    const Tensor got = got_t.to(Device::CPU).to(DType::F32);
    REQUIRE(got.shape() == want.shape());
    const double eps = std::numeric_limits<float>::epsilon();
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < want.numel(); i++) {
        const double g = got.data<float>()[i], w = want.data<float>()[i];
        const double tol = f.u * std::fabs(w) + f.tiny + 2.0 * double(R + 2) * eps * S.data<float>()[i];
        if (!(std::fabs(g - w) <= tol) && bad++ == 0) first = i;
    }
    std::ostringstream msg;
    if (bad) msg << bad << " values out of tolerance; the first at " << first << ": got " << got.data<float>()[first]
                 << ", want " << want.data<float>()[first];
    INFO(msg.str());
    REQUIRE(bad == 0);
}

Tensor random(const Shape& shape, Rng& rng, DType dtype) { return Tensor::uniform(shape, -1.0f, 1.0f, rng).to(dtype); }

// The device's multiprocessors (on the emulator: its OpenMP threads), which decide the GEMM's tiles.
int64_t multiprocessors() {
    cudaDeviceProp prop{};
    int device = 0;
    REQUIRE(cudaGetDevice(&device) == cudaSuccess);
    REQUIRE(cudaGetDeviceProperties(&prop, device) == cudaSuccess);
    return prop.multiProcessorCount;
}

// ---- GEMM ------------------------------------------------------------------------------------------------
// c = alpha·op(a)·op(b) + beta·c by `gemm` (a cuda GEMM in T) against cpu::gemm in f32. The
// leading dimensions are padded: by 3, 1 and 2 (so that a size used as a stride fails, and rows
// are not 16-byte aligned: the one-by-one loads), or, with `aligned`, up to the next multiple of
// 8 (rows 16-byte aligned: the vector loads where the dimension allows them).
template <typename T>
using GemmFn = void (*)(bool, bool, int64_t, int64_t, int64_t, float, const T*, int64_t, const T*, int64_t, float, T*,
                        int64_t);

template <typename T>
void check_gemm_16bit(GemmFn<T> gemm, const Format& f, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                      float beta, Rng& rng, bool aligned = false) {
    INFO(dtype_name(f.dtype) << ": M = " << M << ", N = " << N << ", K = " << K << ", trans_a = " << ta
                             << ", trans_b = " << tb << ", beta = " << beta << (aligned ? ", aligned rows" : ""));
    const auto pad = [&](int64_t cols, int64_t by) { return aligned ? (cols + 7) / 8 * 8 : cols + by; };
    const int64_t a_cols = ta ? M : K, b_cols = tb ? K : N, lda = pad(a_cols, 3), ldb = pad(b_cols, 1),
                  ldc = pad(N, 2);
    const Tensor a = random({ta ? K : M, lda}, rng, f.dtype), b = random({tb ? N : K, ldb}, rng, f.dtype);
    const Tensor c = random({M, ldc}, rng, f.dtype);
    Tensor got = c.to(Device::CUDA);
    const Tensor da = a.to(Device::CUDA), db = b.to(Device::CUDA);
    gemm(ta, tb, M, N, K, alpha, da.data<T>(), lda, db.data<T>(), ldb, beta, got.data<T>(), ldc);

    const Tensor a32 = a.to(DType::F32), b32 = b.to(DType::F32);
    Tensor want = c.to(DType::F32).clone(), S = abs_of(c);
    cpu::gemm(ta, tb, M, N, K, alpha, a32.data<float>(), lda, b32.data<float>(), ldb, beta, want.data<float>(), ldc);
    const Tensor a_abs = abs_of(a32), b_abs = abs_of(b32);
    cpu::gemm(ta, tb, M, N, K, std::fabs(alpha), a_abs.data<float>(), lda, b_abs.data<float>(), ldb,
              std::fabs(beta), S.data<float>(), ldc);
    require_within(got, want, f, K, S);  // the padding columns too: beta·c there, as the CPU
}

// Version 8 with a fixed number of stages, as a GemmFn.
template <int kStages, typename T>
void gemm_async(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const T* A, int64_t lda, const T* B,
                int64_t ldb, float beta, T* C, int64_t ldc) {
    cuda::lab::gemm_tensor_cores_async(kStages, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

template <typename T>
void check_gemm_wmma(const Format& f, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, float beta,
                     Rng& rng) {
    check_gemm_16bit<T>(cuda::lab::gemm_wmma<T>, f, ta, tb, M, N, K, alpha, beta, rng);
}

// ---- convolution --------------------------------------------------------------------------------------
// y = conv(x, w) + b (b: a bias, or none) by cuda::conv2d_forward_implicit_gemm_wmma in T,
// against the CPU's f32 convolution of the same values.
template <typename T>
void check_conv_wmma(const Format& f, const Conv2dArgs& args, Shape x_shape, int64_t O, int64_t KK, bool bias,
                     Rng& rng) {
    INFO(dtype_name(f.dtype) << ": x " << x_shape[0] << "×" << x_shape[1] << "×" << x_shape[2] << "×" << x_shape[3]
                             << ", O = " << O << ", K = " << KK << ", stride " << args.stride << ", padding "
                             << args.padding << ", dilation " << args.dilation << ", groups " << args.groups
                             << (bias ? ", bias" : ", no bias"));
    const Tensor x = random(x_shape, rng, f.dtype), w = random({O, x_shape[1] / args.groups, KK, KK}, rng, f.dtype);
    const Tensor b = bias ? random({O}, rng, f.dtype) : Tensor();
    const Tensor want = conv2d(x.to(DType::F32), w.to(DType::F32), bias ? b.to(DType::F32) : Tensor(), args);
    const Tensor S = conv2d(abs_of(x), abs_of(w), bias ? abs_of(b) : Tensor(), args);
    Conv2dParams p;
    p.N = x_shape[0], p.C = x_shape[1], p.H = x_shape[2], p.W = x_shape[3], p.O = O, p.KH = p.KW = KK;
    p.stride = args.stride, p.padding = args.padding, p.dilation = args.dilation, p.groups = args.groups;
    const Tensor dx = x.to(Device::CUDA), dw = w.to(Device::CUDA), db = bias ? b.to(Device::CUDA) : Tensor();
    Tensor y = Tensor::empty(want.shape(), f.dtype, Device::CUDA);
    cuda::conv2d_forward_implicit_gemm_wmma(dx.data<T>(), dw.data<T>(), bias ? db.data<T>() : nullptr, y.data<T>(), p);
    require_within(y, want, f, p.Cg() * KK * KK + (bias ? 1 : 0), S);
}

// The engine's conv2d and conv2d_backward on CUDA in T (the implicit GEMMs: on the tensor cores
// where the product has 16 rows, columns and k, else the CUDA cores), forward, dx, dw and db,
// against the CPU's f32 passes on the same values. dw and db accumulate onto random starting values.
template <typename T>
void check_conv_passes(const Format& f, const Conv2dArgs& args, Shape x_shape, int64_t O, int64_t KK, Rng& rng) {
    INFO(dtype_name(f.dtype) << ": x " << x_shape[0] << "×" << x_shape[1] << "×" << x_shape[2] << "×" << x_shape[3]
                             << ", O = " << O << ", K = " << KK << ", stride " << args.stride << ", groups "
                             << args.groups);
    const int64_t Cg = x_shape[1] / args.groups;
    const Tensor x = random(x_shape, rng, f.dtype), w = random({O, Cg, KK, KK}, rng, f.dtype);
    const Tensor b = random({O}, rng, f.dtype);
    const Tensor y_want = conv2d(x.to(DType::F32), w.to(DType::F32), b.to(DType::F32), args);
    const Tensor dy = random(y_want.shape(), rng, f.dtype), dw0 = random(w.shape(), rng, f.dtype);
    const Tensor db0 = random({O}, rng, f.dtype);
    const int64_t NPQ = y_want.size(0) * y_want.size(2) * y_want.size(3);

    Tensor dw = dw0.to(Device::CUDA).clone(), db = db0.to(Device::CUDA).clone();
    const Tensor y = conv2d(x.to(Device::CUDA), w.to(Device::CUDA), b.to(Device::CUDA), args);
    const Tensor dx = conv2d_backward(x.to(Device::CUDA), w.to(Device::CUDA), dy.to(Device::CUDA), dw, db, true, args);

    Tensor dw_want = dw0.to(DType::F32).clone(), db_want = db0.to(DType::F32).clone();
    const Tensor dx_want = conv2d_backward(x.to(DType::F32), w.to(DType::F32), dy.to(DType::F32), dw_want, db_want,
                                           true, args);
    Tensor dw_S = abs_of(dw0), db_S = abs_of(db0);  // Σ|terms| of each result, the same passes on |values|
    const Tensor y_S = conv2d(abs_of(x), abs_of(w), abs_of(b), args);
    const Tensor dx_S = conv2d_backward(abs_of(x), abs_of(w), abs_of(dy), dw_S, db_S, true, args);
    require_within(y, y_want, f, Cg * KK * KK + 1, y_S);
    require_within(dx, dx_want, f, O / args.groups * KK * KK, dx_S);
    require_within(dw, dw_want, f, NPQ + 1, dw_S);
    require_within(db, db_want, f, NPQ + 1, db_S);
}

}  // namespace

TEST_CASE("the engine's conv2d passes in f16 and bf16 (tensor cores where they fit) match the CPU",
          "[wmma][mma][conv][cuda][lesson09]") {
    Rng rng(929);
    Conv2dArgs plain;  // 3×3, padding 1
    plain.padding = 1;
    Conv2dArgs strided;  // stride 2, dilation 2, two groups
    strided.stride = 2, strided.dilation = 2, strided.padding = 1, strided.groups = 2;
    under_schedules([&] {
        // forward 20×84×72 and dw 20×72×84 on the tensor cores; dx (8 rows) on the CUDA cores
        check_conv_passes<f16>(kF16, plain, {2, 8, 6, 7}, 20, 3, rng);
        check_conv_passes<bf16>(kBF16, plain, {2, 8, 6, 7}, 20, 3, rng);
        // every pass on the tensor cores: forward 16×128×288, dx 32×128×144, dw 16×288×128
        check_conv_passes<bf16>(kBF16, plain, {2, 32, 8, 8}, 16, 3, rng);
        check_conv_passes<f16>(kF16, strided, {3, 40, 9, 9}, 36, 3, rng);
    });
}

TEST_CASE("wmma gemm (version 5) matches the CPU for f16 and bf16", "[wmma][cuda][lesson09]") {
    Rng rng(911);
    // A single element (one fragment, almost all padding), edges of no tile with K < 16 and
    // K = 33 (a partial 32-wide step), and two full 64×64 tiles with three K steps.
    const int64_t shapes[][3] = {{1, 1, 1}, {17, 33, 5}, {65, 31, 33}, {64, 128, 96}};
    under_schedules([&] {
        for (auto [M, N, K] : shapes)
            for (bool ta : {false, true})
                for (bool tb : {false, true})
                    for (float beta : {0.0f, 0.5f}) {
                        check_gemm_wmma<f16>(kF16, ta, tb, M, N, K, 1.25f, beta, rng);
                        check_gemm_wmma<bf16>(kBF16, ta, tb, M, N, K, -0.75f, beta, rng);
                    }
    });
}

TEST_CASE("mma.sync gemm (version 7, the engine's) matches the CPU for f16 and bf16", "[wmma][mma][cuda][lesson09]") {
    Rng rng(923);
    // The smallest product the engine sends to the tensor cores (16³), edges of no tile with a
    // partial 32-wide k step, several 64×64 tiles, and a product big enough for the 128×128 tiles
    // (at least two per SM: the emulator counts its OpenMP threads as SMs).
    const int64_t shapes[][3] = {{16, 16, 16}, {17, 33, 40}, {65, 31, 33}, {64, 128, 96}, {130, 70, 100}};
    const int64_t big = 128 * int64_t(std::ceil(std::sqrt(2.0 * multiprocessors())));
    under_schedules([&] {
        for (auto [M, N, K] : shapes)
            for (bool ta : {false, true})
                for (bool tb : {false, true})
                    for (bool aligned : {false, true}) {
                        check_gemm_16bit<f16>(cuda::gemm<f16>, kF16, ta, tb, M, N, K, 1.25f, aligned ? 0.0f : 0.5f,
                                              rng, aligned);
                        check_gemm_16bit<bf16>(cuda::gemm<bf16>, kBF16, ta, tb, M, N, K, -0.75f,
                                               aligned ? 0.5f : 0.0f, rng, aligned);
                    }
    });
    for (bool ta : {false, true})
        for (bool tb : {false, true})
            check_gemm_16bit<bf16>(cuda::gemm<bf16>, kBF16, ta, tb, big, big + 8, 40, 1.0f, 0.0f, rng, true);
}

TEST_CASE("cp.async gemm (version 8, 3 and 4 stages) matches the CPU for f16 and bf16", "[wmma][mma][cuda][lesson09]") {
    Rng rng(931);
    // K of 1 to 5 steps of 32 (fewer steps than stages, and more), edges of the 128×128 tile;
    // unaligned rows fall back to version 7 (the `aligned` false runs).
    const int64_t shapes[][3] = {{16, 16, 16}, {130, 136, 72}, {64, 200, 160}};
    under_schedules([&] {
        for (auto [M, N, K] : shapes)
            for (bool ta : {false, true})
                for (bool tb : {false, true})
                    for (bool aligned : {false, true}) {
                        check_gemm_16bit<f16>(gemm_async<3, f16>, kF16, ta, tb, M, N, K, 1.25f, 0.5f, rng, aligned);
                        check_gemm_16bit<bf16>(gemm_async<4, bf16>, kBF16, ta, tb, M, N, K, -0.75f, 0.0f, rng, aligned);
                    }
    });
}

TEST_CASE("wmma implicit-GEMM convolution matches the CPU for f16 and bf16", "[wmma][cuda][lesson09]") {
    Rng rng(917);
    Conv2dArgs plain;  // 3×3, padding 1: Kc = 8·9 = 72 (three K steps, the last partial), O = 20
    plain.padding = 1;
    Conv2dArgs strided;  // stride 2, dilation 2, two groups of 16 output channels and Kc = 4·9 = 36
    strided.stride = 2, strided.dilation = 2, strided.groups = 2;
    under_schedules([&] {
        check_conv_wmma<f16>(kF16, plain, {2, 8, 6, 7}, 20, 3, true, rng);
        check_conv_wmma<bf16>(kBF16, plain, {2, 8, 6, 7}, 20, 3, true, rng);
        check_conv_wmma<f16>(kF16, strided, {3, 8, 9, 9}, 32, 3, false, rng);
        check_conv_wmma<bf16>(kBF16, strided, {3, 8, 9, 9}, 32, 3, true, rng);
    });
}

#ifndef KILN_CUDA
// ---- the fragment API on the emulator ----------------------------------------------------------------------
namespace wmma = nvcuda::wmma;

namespace {

// One warp: d = a·b + c for one M×N×K tile, a and b read with layouts LA and LB (ldm = their
// column count when row-major, row count when column-major), c read with layout lc (or, when
// c is null, every element 0.5 by fill_fragment), d stored with layout ld; every element of
// the accumulator is then doubled through x[] (elementwise, whatever the lane mapping).
template <int M, int N, int K, typename T, typename LA, typename LB>
__global__ void mma_tile(const T* a, const T* b, const float* c, float* d, wmma::layout_t lc, wmma::layout_t ld) {
    constexpr bool a_row = std::is_same_v<LA, wmma::row_major>, b_row = std::is_same_v<LB, wmma::row_major>;
    wmma::fragment<wmma::matrix_a, M, N, K, T, LA> fa;
    wmma::fragment<wmma::matrix_b, M, N, K, T, LB> fb;
    wmma::fragment<wmma::accumulator, M, N, K, float> acc;
    wmma::load_matrix_sync(fa, a, a_row ? K : M);
    wmma::load_matrix_sync(fb, b, b_row ? N : K);
    if (c) wmma::load_matrix_sync(acc, c, lc == wmma::mem_row_major ? N : M, lc);
    else wmma::fill_fragment(acc, 0.5f);
    wmma::mma_sync(acc, fa, fb, acc);
    for (int e = 0; e < acc.num_elements; e++) acc.x[e] *= 2.0f;
    wmma::store_matrix_sync(d, acc, ld == wmma::mem_row_major ? N : M, ld);
}

// Small integers: a[i][k] = (i + 2k) mod 7 − 3, b[k][j] = (3k + j) mod 5 − 2, c[i][j] = i − j.
// Stored row- or column-major as asked, in T (exact), on the device.
template <typename T>
struct Tile {
    int rows, cols;
    std::vector<float> logical;  // row-major
    T* device = nullptr;
    Tile(int r, int c, int (*value)(int, int), bool row_major) : rows(r), cols(c), logical(size_t(r * c)) {
        std::vector<T> stored(logical.size());
        for (int i = 0; i < r; i++)
            for (int j = 0; j < c; j++) {
                logical[size_t(i * c + j)] = float(value(i, j));
                stored[size_t(row_major ? i * c + j : j * r + i)] = T(float(value(i, j)));
            }
        KILN_CUDA_CHECK(cudaMalloc(&device, stored.size() * sizeof(T)));
        KILN_CUDA_CHECK(cudaMemcpy(device, stored.data(), stored.size() * sizeof(T), cudaMemcpyHostToDevice));
    }
    ~Tile() { cudaFree(device); }
    Tile(const Tile&) = delete;
    Tile& operator=(const Tile&) = delete;
    float at(int i, int j) const { return logical[size_t(i * cols + j)]; }
};

int a_value(int i, int k) { return (i + 2 * k) % 7 - 3; }
int b_value(int k, int j) { return (3 * k + j) % 5 - 2; }
int c_value(int i, int j) { return i - j; }

// Runs mma_tile for one shape and layout combination and checks every element of d exactly.
template <int M, int N, int K, typename T, typename LA, typename LB>
void check_mma_tile(bool with_c, wmma::layout_t lc, wmma::layout_t ld) {
    constexpr bool a_row = std::is_same_v<LA, wmma::row_major>, b_row = std::is_same_v<LB, wmma::row_major>;
    INFO(M << "×" << N << "×" << K << ", a " << (a_row ? "row" : "col") << "-major, b " << (b_row ? "row" : "col")
           << "-major, c " << (with_c ? (lc == wmma::mem_row_major ? "row-major" : "col-major") : "filled")
           << ", d " << (ld == wmma::mem_row_major ? "row" : "col") << "-major");
    const Tile<T> a(M, K, a_value, a_row), b(K, N, b_value, b_row);
    const Tile<float> c(M, N, c_value, lc == wmma::mem_row_major);
    float* d = nullptr;
    KILN_CUDA_CHECK(cudaMalloc(&d, M * N * sizeof(float)));
    constexpr auto kernel = mma_tile<M, N, K, T, LA, LB>;
    KILN_LAUNCH(kernel, 1, 32, 0)(a.device, b.device, with_c ? c.device : nullptr, d, lc, ld);
    KILN_CHECK_LAUNCH(kernel, 1, 32);
    std::vector<float> got(M * N);
    KILN_CUDA_CHECK(cudaMemcpy(got.data(), d, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
    cudaFree(d);
    int bad = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float want = with_c ? c.at(i, j) : 0.5f;
            for (int k = 0; k < K; k++) want += a.at(i, k) * b.at(k, j);
            want *= 2.0f;
            const float g = got[size_t(ld == wmma::mem_row_major ? i * N + j : j * M + i)];
            if (g != want && bad++ == 0) FAIL_CHECK("d[" << i << "][" << j << "] = " << g << ", want " << want);
        }
    REQUIRE(bad == 0);
}

template <typename T, typename LA, typename LB>
void check_layouts() {
    for (auto lc : {wmma::mem_row_major, wmma::mem_col_major})
        for (auto ld : {wmma::mem_row_major, wmma::mem_col_major}) check_mma_tile<16, 16, 16, T, LA, LB>(true, lc, ld);
    check_mma_tile<16, 16, 16, T, LA, LB>(false, wmma::mem_row_major, wmma::mem_row_major);
    check_mma_tile<32, 8, 16, T, LA, LB>(true, wmma::mem_col_major, wmma::mem_row_major);
    check_mma_tile<8, 32, 16, T, LA, LB>(true, wmma::mem_row_major, wmma::mem_col_major);
}

// Misuse, one kernel with a switch: which lane skips the load of a (-1: none), and an offset
// (elements) and ldm for a.
__global__ void misused(const __half* a, const __half* b, float* d, int skipping_lane, int offset, unsigned lda,
                        unsigned ldd) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    if (int(threadIdx.x) != skipping_lane) wmma::load_matrix_sync(fa, a + offset, lda);
    wmma::load_matrix_sync(fb, b, 16);
    wmma::mma_sync(acc, fa, fb, acc);
    wmma::store_matrix_sync(d, acc, ldd, wmma::mem_row_major);
}

// Lane 3 returns before the load the others wait in.
__global__ void lane_returns_early(const __half* a) {
    if (threadIdx.x == 3) return;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
    wmma::load_matrix_sync(fa, a, 16);
}

// Each lane passes its own pointer: lanes disagree on the arguments.
__global__ void lanes_disagree(const __half* a) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
    wmma::load_matrix_sync(fa, a + 16 * (threadIdx.x % 2), 16);
}

std::string failure_of_misused(unsigned threads, int skipping_lane, int offset, unsigned lda, unsigned ldd) {
    __half *a = nullptr, *b = nullptr;
    float* d = nullptr;
    KILN_CUDA_CHECK(cudaMalloc(&a, 512 * sizeof(__half)));
    KILN_CUDA_CHECK(cudaMalloc(&b, 256 * sizeof(__half)));
    KILN_CUDA_CHECK(cudaMalloc(&d, 512 * sizeof(float)));
    KILN_LAUNCH(misused, 1, threads, 0)(a, b, d, skipping_lane, offset, lda, ldd);
    std::string message;
    try {
        KILN_CHECK_LAUNCH(misused, 1, threads);
    } catch (const Error& e) {
        message = e.what();
    }
    cudaFree(a), cudaFree(b), cudaFree(d);
    return message;
}

}  // namespace

TEST_CASE("wmma fragments on the emulator: one mma with every layout, exact", "[wmma][cuda][lesson09]") {
    using wmma::col_major;
    using wmma::row_major;
    check_layouts<__half, row_major, row_major>();
    check_layouts<__half, col_major, row_major>();
    check_layouts<__half, row_major, col_major>();
    check_layouts<__nv_bfloat16, col_major, col_major>();
    check_layouts<__nv_bfloat16, row_major, col_major>();
    // x[] spreads the tile over the lanes: 256 elements of a 16×16 fragment, 8 per lane.
    CHECK(wmma::fragment<wmma::accumulator, 16, 16, 16, float>::num_elements * 32 == 256);
    CHECK(wmma::fragment<wmma::matrix_a, 32, 8, 16, __half, row_major>::num_elements * 32 == 32 * 16);
}

TEST_CASE("wmma misuse fails the launch with a message naming the call", "[wmma][cuda][lesson09]") {
    using Catch::Contains;
    // The well-formed launch works (and so the failures below come from the misuse alone).
    CHECK(failure_of_misused(32, -1, 0, 16, 16).empty());
    // Lane 5 skips load_matrix_sync: it reaches the next call while the others wait in this one.
    CHECK_THAT(failure_of_misused(32, 5, 0, 16, 16),
               Contains("kernel misused") && Contains("wmma::load_matrix_sync") && Contains("thread (5, 0, 0)") &&
                   Contains("disagree"));
    // Pointers off the 32-byte grid: 1 element, and 8 elements (16 bytes).
    for (int offset : {1, 8})
        CHECK_THAT(failure_of_misused(32, -1, offset, 16, 16),
                   Contains("wmma::load_matrix_sync") && Contains("256-bit (32-byte) aligned"));
    // ldm not a multiple of 16 bytes: 12 halves, 6 floats.
    CHECK_THAT(failure_of_misused(32, -1, 0, 12, 16),
               Contains("wmma::load_matrix_sync") && Contains("ldm = 12 must be a multiple of 8"));
    CHECK_THAT(failure_of_misused(32, -1, 0, 16, 6),
               Contains("wmma::store_matrix_sync") && Contains("ldm = 6 must be a multiple of 4"));
    // A warp of 16 threads.
    CHECK_THAT(failure_of_misused(16, -1, 0, 16, 16), Contains("wmma::") && Contains("all 32 lanes"));
    // A lane that has returned, and lanes passing different pointers.
    __half* a = nullptr;
    KILN_CUDA_CHECK(cudaMalloc(&a, 512 * sizeof(__half)));
    KILN_LAUNCH(lane_returns_early, 1, 32, 0)(a);
    CHECK_THROWS_WITH([&] { KILN_CHECK_LAUNCH(lane_returns_early, 1, 32); }(),
                      Contains("wmma::load_matrix_sync") && Contains("thread (3, 0, 0) has already exited"));
    KILN_LAUNCH(lanes_disagree, 1, 32, 0)(a);
    CHECK_THROWS_WITH([&] { KILN_CHECK_LAUNCH(lanes_disagree, 1, 32); }(),
                      Contains("wmma::load_matrix_sync") && Contains("disagree") && Contains("same fragment type"));
    cudaFree(a);
}

TEST_CASE("wmma: f16 and bf16 matmul on CUDA take the tensor cores when the shapes allow", "[wmma][cuda][lesson09]") {
    Rng rng(913);
    // Linear's product y = x·wᵀ, 40×24 from K = 48: every dimension ≥ 16, the wmma rule.
    for (const Format& f : {kF16, kBF16}) {
        INFO(dtype_name(f.dtype));
        const Tensor x = random({40, 48}, rng, f.dtype), w = random({24, 48}, rng, f.dtype);
        const Tensor dx = x.to(Device::CUDA), dw = w.to(Device::CUDA);
        under_schedules([&] {
            const uint64_t before = kiln::emu::warp_calls_run();
            const Tensor y = matmul(dx, dw, false, true);
            CHECK(kiln::emu::warp_calls_run() > before);  // wmma operations ran
            Tensor S = Tensor::zeros({40, 24});
            const Tensor x_abs = abs_of(x), w_abs = abs_of(w);
            cpu::gemm(false, true, 40, 24, 48, 1.0f, x_abs.data<float>(), 48, w_abs.data<float>(), 48, 0.0f,
                      S.data<float>(), 24);
            require_within(y, matmul(x.to(DType::F32), w.to(DType::F32), false, true), f, 48, S);

            // Below the rule (K = 8), and in f32, cuda::gemm stays on gemm_tiled: no wmma at all.
            // (The generator runs on the host; its tensors are copied to the device.)
            const uint64_t after = kiln::emu::warp_calls_run();
            matmul(random({40, 8}, rng, f.dtype).to(Device::CUDA), random({24, 8}, rng, f.dtype).to(Device::CUDA),
                   false, true);
            matmul(dx.to(DType::F32), dw.to(DType::F32), false, true);
            CHECK(kiln::emu::warp_calls_run() == after);
        });
    }
}

TEST_CASE("wmma: an f16 and bf16 conv2d on CUDA takes the tensor cores when the shapes allow", "[wmma][cuda][lesson09]") {
    Rng rng(919);
    // The CIFAR net's block-1 shape, scaled down: 24 → 32 channels (Og = 32 < 64: the implicit
    // GEMM; ≥ 16 with Kc = 24·9 ≥ 16: its wmma variant), 3×3, padding 1.
    Conv2dArgs args;
    args.padding = 1;
    for (const Format& f : {kF16, kBF16}) {
        INFO(dtype_name(f.dtype));
        const Tensor x = random({2, 24, 6, 6}, rng, f.dtype), w = random({32, 24, 3, 3}, rng, f.dtype);
        const Tensor b = random({32}, rng, f.dtype);
        const uint64_t before = kiln::emu::warp_calls_run();
        const Tensor y = conv2d(x.to(Device::CUDA), w.to(Device::CUDA), b.to(Device::CUDA), args);
        CHECK(kiln::emu::warp_calls_run() > before);  // the engine's conv2d reached the tensor cores
        const Tensor S = conv2d(abs_of(x), abs_of(w), abs_of(b), args);
        require_within(y, conv2d(x.to(DType::F32), w.to(DType::F32), b.to(DType::F32), args), f, 24 * 9 + 1, S);
    }
}
#endif  // KILN_CUDA
