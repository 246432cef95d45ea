// test_qgemm.cpp — the int8 kernels (chapter 11), CPU and CUDA: every qgemm_u8s8 path this CPU can run
// against the triple loop qgemm_u8s8_reference, and qconv2d (groups 1 and depthwise) / qlinear
// against a direct integer convolution written here. Integer sums are exact, so every comparison
// is equality: no tolerance. Then the other kernels of a MobileNetV2's int8 form: depthwise
// qconv2d also by hand, qglobal_avgpool against its definition, and qadd within 1 of its formula
// in double (the one tolerance: both round once). Beside each kernel's CPU cases, its CUDA
// kernel (cuda/quant.cu: dp4a qgemm_u8s8, requantize_rows and qlinear, qconv2d and its depthwise
// form, qmaxpool2d and lookup_u8, qglobal_avgpool, qadd) against the CPU's bit for bit, on random
// data and on the edges: odd sizes, K not a multiple of 4 (the dp4a words' padding), row strides
// wider than the rows, padding, stride and dilation, the extreme values (A = 255, B = −128, up to
// the largest K of the contract), per-channel requantization with a fused ReLU (lo = z_y). Without
// a GPU they run on the emulator under each thread schedule (quant_check.h). The Tensor-level ops,
// quantize and fake quantization: test_quant_model.cpp.
//
//   make test T='[qgemm]'   make test T='[qconv]'   make test T='[qpool]'   make test T='[qadd]'
//   (each op: CPU and CUDA)   make test T='[quant][cpu]'   make test T='[quant][cuda]'
//
// The paths this CPU lacks are named in a WARN: on an AVX2-only CPU the VNNI paths are
// compiled but not run here; on a CPU with AVX-VNNI or AVX512-VNNI the same cases run them.
#include <omp.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/cpu_features.h"
#include "core/error.h"
#include "fixtures.h"
#include "ops/cpu/qgemm.h"
#include "ops/all.h"
#include "quant_check.h"

using namespace kiln;
using namespace kiln::cpu;
using namespace kiln::test::quant;  // quant_check.h
using test::under_schedules;

namespace {

std::vector<uint8_t> random_u8(int64_t n, int32_t max, std::mt19937& rng) {
    std::uniform_int_distribution<int32_t> d(0, max);
    std::vector<uint8_t> v(static_cast<size_t>(n));
    for (auto& x : v) x = uint8_t(d(rng));
    return v;
}

std::vector<int8_t> random_i8(int64_t n, std::mt19937& rng) {
    std::uniform_int_distribution<int32_t> d(-128, 127);
    std::vector<int8_t> v(static_cast<size_t>(n));
    for (auto& x : v) x = int8_t(d(rng));
    return v;
}

// Runs `fn` with OpenMP limited to `threads`, then restores the previous limit.
template <typename F>
void with_threads(int threads, F&& fn) {
    const int before = omp_get_max_threads();
    omp_set_num_threads(threads);
    fn();
    omp_set_num_threads(before);
}

// The paths this CPU can run; those it cannot are skipped checks (test::skip).
std::vector<QgemmPath> paths_here() {
    std::string missing;
    for (QgemmPath p : {QgemmPath::Portable, QgemmPath::Avx2Madd, QgemmPath::Avx2Maddubs, QgemmPath::AvxVnni,
                        QgemmPath::Avx512Vnni})
        if (!qgemm_path_available(p)) missing += std::string(" ") + qgemm_path_name(p);
    if (!missing.empty()) test::skip(cpu_features_line() + ": cannot run the int8 GEMM path(s)" + missing);
    return qgemm_available_paths();
}

// The largest A value a path may be given: avx2-maddubs only takes reduce_range's [0, 127].
int32_t a_max_of(QgemmPath p) { return p == QgemmPath::Avx2Maddubs ? kActQmaxReduced : kActQmax; }

struct GemmShape {
    int64_t M, N, K;
};

// C = A · Bᵀ on `path`, A and B filled by the caller, with every leading dimension larger than
// needed; the padding of C must come back untouched.
void check_against_reference(QgemmPath path, const GemmShape& s, const std::vector<uint8_t>& A,
                             const std::vector<int8_t>& B, int64_t lda, int64_t ldb) {
    const int64_t ldc = s.N + 3;
    constexpr int32_t kUntouched = 0x5eed;
    std::vector<int32_t> C(size_t(s.M * ldc), kUntouched), R(size_t(s.M * ldc), kUntouched);
    qgemm_u8s8_on(path, s.M, s.N, s.K, A.data(), lda, B.data(), ldb, C.data(), ldc, a_max_of(path));
    qgemm_u8s8_reference(s.M, s.N, s.K, A.data(), lda, B.data(), ldb, R.data(), ldc);
    INFO(qgemm_path_name(path) << " M=" << s.M << " N=" << s.N << " K=" << s.K);
    CHECK(C == R);
}

}  // namespace

TEST_CASE("qgemm_u8s8: every path equals the reference exactly, on any shape and stride",
          "[lesson11][cpu][qgemm][quant]") {
    // 1×1×1; odd sizes; K not a multiple of 4, 16, 32 or 64; more columns than one panel; K past
    // one KC-block (1024 k for u8, 512 for i16); large enough to split over threads.
    const GemmShape shapes[] = {{1, 1, 1},   {1, 1, 5},    {3, 5, 7},     {7, 17, 33},    {13, 31, 67},
                            {9, 33, 130}, {64, 20, 250}, {100, 50, 320}, {37, 45, 1027}, {257, 70, 300},
                            {6, 40, 2100}};
    std::mt19937 rng(11);
    for (QgemmPath path : paths_here())
        for (const GemmShape& s : shapes) {
            const int64_t lda = s.K + 3, ldb = s.K + 5;
            const auto A = random_u8(s.M * lda, a_max_of(path), rng);
            const auto B = random_i8(s.N * ldb, rng);
            check_against_reference(path, s, A, B, lda, ldb);
        }
}

TEST_CASE("qgemm_u8s8: the extreme values, where a 16-bit pair sum would saturate",
          "[lesson11][cpu][qgemm][quant]") {
    // A = a_max and B = −128 or 127 everywhere: C = K·a·b exactly. On avx2-maddubs a_max = 127:
    // pair sums 2·127·(−128) = −32512 and 2·127·127 = 32258, both inside int16.
    const GemmShape s{11, 19, 1031};  // K·255·128 = 33 652 | 480 < 2^31
    for (QgemmPath path : paths_here())
        for (int8_t b : {int8_t(-128), int8_t(127)}) {
            const std::vector<uint8_t> A(size_t(s.M * s.K), uint8_t(a_max_of(path)));
            const std::vector<int8_t> B(size_t(s.N * s.K), b);
            std::vector<int32_t> C(size_t(s.M * s.N));
            qgemm_u8s8_on(path, s.M, s.N, s.K, A.data(), s.K, B.data(), s.K, C.data(), s.N, a_max_of(path));
            INFO(qgemm_path_name(path) << " b=" << int(b));
            CHECK(C == std::vector<int32_t>(C.size(), int32_t(s.K) * a_max_of(path) * b));
            check_against_reference(path, s, A, B, s.K, s.K);
        }
}

TEST_CASE("qgemm_u8s8: one to two threads give the same integers", "[lesson11][cpu][qgemm][quant]") {
    const GemmShape s{300, 40, 200};  // 2.4 M multiply-adds: the rows are split over the threads
    std::mt19937 rng(12);
    const auto A = random_u8(s.M * s.K, kActQmax, rng);
    const auto B = random_i8(s.N * s.K, rng);
    for (QgemmPath path : paths_here()) {
        if (path == QgemmPath::Avx2Maddubs) continue;  // A has values above 127
        std::vector<int32_t> one(size_t(s.M * s.N)), two(one.size());
        with_threads(1, [&] { qgemm_u8s8_on(path, s.M, s.N, s.K, A.data(), s.K, B.data(), s.K, one.data(), s.N, 255); });
        with_threads(2, [&] { qgemm_u8s8_on(path, s.M, s.N, s.K, A.data(), s.K, B.data(), s.K, two.data(), s.N, 255); });
        INFO(qgemm_path_name(path));
        CHECK(one == two);
    }
}

TEST_CASE("qgemm_s8u8: the weight first, B [K, N], every path equals the reference exactly",
          "[lesson11][cpu][qgemm][quant]") {
    // As qgemm_u8s8's shapes, with M the output channels (few: 1 to 257 of them) and N the pixels
    // (e.g. 1×1 convs: M = 144, K = 24, N = 1024), and the largest values at both ends.
    const GemmShape shapes[] = {{1, 1, 1},    {1, 1, 5},     {3, 5, 7},      {17, 7, 33},     {31, 13, 67},
                            {33, 9, 130}, {20, 64, 250}, {144, 1024, 24}, {24, 300, 144}, {45, 37, 1027},
                            {6, 40, 2100}};
    std::mt19937 rng(15);
    for (QgemmPath path : paths_here())
        for (const GemmShape& s : shapes) {
            const int64_t lda = s.K + 3, ldb = s.N + 5, ldc = s.N + 2;
            auto A = random_i8(s.M * lda, rng);
            auto B = random_u8(s.K * ldb, a_max_of(path), rng);
            A[0] = -128, B[0] = uint8_t(a_max_of(path));
            constexpr int32_t kUntouched = 0x5eed;
            std::vector<int32_t> C(size_t(s.M * ldc), kUntouched), R(C);
            for (int64_t m = 0; m < s.M; ++m)  // the reference: C[m, n] = Σ_k A[m, k] · B[k, n]
                for (int64_t n = 0; n < s.N; ++n) {
                    int32_t sum = 0;
                    for (int64_t k = 0; k < s.K; ++k) sum += int32_t(A[size_t(m * lda + k)]) * B[size_t(k * ldb + n)];
                    R[size_t(m * ldc + n)] = sum;
                }
            std::vector<int32_t> one(C), two(C);
            with_threads(1, [&] {
                qgemm_s8u8_on(path, s.M, s.N, s.K, A.data(), lda, B.data(), ldb, one.data(), ldc, a_max_of(path));
            });
            with_threads(2, [&] {
                qgemm_s8u8_on(path, s.M, s.N, s.K, A.data(), lda, B.data(), ldb, two.data(), ldc, a_max_of(path));
            });
            INFO(qgemm_path_name(path) << " M=" << s.M << " N=" << s.N << " K=" << s.K);
            CHECK(one == R);
            CHECK(two == R);
        }
}

TEST_CASE("qgemm_s8u8 refuses bad sizes and paths with a message naming B", "[lesson11][cpu][qgemm][quant]") {
    std::vector<int8_t> A(64, 1);
    std::vector<uint8_t> B(64, 1);
    std::vector<int32_t> C(64);
    CHECK_THROWS_WITH(qgemm_s8u8(2, 8, 4, A.data(), 4, B.data(), 7, C.data(), 8, 255),
                      Catch::Contains("qgemm_s8u8: ldb=7 < N=8 (B is [K, N], a row per k)"));
    CHECK_THROWS_WITH(qgemm_s8u8(2, 8, 4, A.data(), 4, B.data(), 8, C.data(), 8, 300),
                      Catch::Contains("B's largest value 300 is not a u8 value"));
    if (qgemm_path_available(QgemmPath::Avx2Maddubs))
        CHECK_THROWS_WITH(qgemm_s8u8_on(QgemmPath::Avx2Maddubs, 2, 8, 4, A.data(), 4, B.data(), 8, C.data(), 8, 255),
                          Catch::Contains("the avx2-maddubs path needs B ≤ 127"));
}

TEST_CASE("qgemm_path: VNNI where the CPU has it, maddubs only for a_max ≤ 127, KILN_CPU caps it",
          "[lesson11][cpu][qgemm][quant]") {
    const CpuFeatures& f = cpu_features();
    const CpuLevel level = cpu_level();  // capped by KILN_CPU
    INFO(cpu_features_line() << ": " << qgemm_path_name(qgemm_path(255)) << " for u8, "
                             << qgemm_path_name(qgemm_path(127)) << " for reduce_range");
    if (level >= CpuLevel::Avx512 && f.avx512_vnni) {
        CHECK(qgemm_path(255) == QgemmPath::Avx512Vnni);
    } else if (level >= CpuLevel::Avx2 && f.avx_vnni) {
        CHECK(qgemm_path(255) == QgemmPath::AvxVnni);
    } else if (level >= CpuLevel::Avx2) {
        CHECK(qgemm_path(255) == QgemmPath::Avx2Madd);
        CHECK(qgemm_path(128) == QgemmPath::Avx2Madd);
        CHECK(qgemm_path(127) == QgemmPath::Avx2Maddubs);
    }
    const CpuLevel before = set_cpu_level_cap(CpuLevel::Portable);
    CHECK(qgemm_path(255) == QgemmPath::Portable);
    CHECK(qgemm_path(127) == QgemmPath::Portable);
    set_cpu_level_cap(before);
    CHECK(qgemm_available_paths().front() == QgemmPath::Portable);
}

TEST_CASE("qgemm_u8s8: bad arguments are explained", "[lesson11][cpu][qgemm][quant]") {
    const std::vector<uint8_t> A(12, 1);
    const std::vector<int8_t> B(12, 1);
    std::vector<int32_t> C(16);
    CHECK_THROWS_WITH(qgemm_u8s8(3, 3, 4, A.data(), 3, B.data(), 4, C.data(), 3, 255),
                      Catch::Contains("lda=3") && Catch::Contains("K=4"));
    CHECK_THROWS_WITH(qgemm_u8s8(3, 3, 4, A.data(), 4, B.data(), 4, C.data(), 2, 255), Catch::Contains("ldc=2"));
    CHECK_THROWS_WITH(qgemm_u8s8(3, 3, 4, A.data(), 4, B.data(), 4, C.data(), 3, 256),
                      Catch::Contains("A's largest value 256") && Catch::Contains("reduce_range"));
    CHECK_THROWS_WITH(qgemm_u8s8(1, 1, 70000, A.data(), 70000, B.data(), 70000, C.data(), 1, 255),
                      Catch::Contains("K=70000") && Catch::Contains("overflow"));
    if (qgemm_path_available(QgemmPath::Avx2Maddubs))
        CHECK_THROWS_WITH(
            qgemm_u8s8_on(QgemmPath::Avx2Maddubs, 3, 3, 4, A.data(), 4, B.data(), 4, C.data(), 3, 255),
            Catch::Contains("needs A ≤ 127") && Catch::Contains("largest value is 255"));
    for (QgemmPath p : {QgemmPath::AvxVnni, QgemmPath::Avx512Vnni})
        if (!qgemm_path_available(p))
            CHECK_THROWS_WITH(qgemm_u8s8_on(p, 3, 3, 4, A.data(), 4, B.data(), 4, C.data(), 3, 255),
                              Catch::Contains(std::string("cannot run the ") + qgemm_path_name(p)));
}

// ---- on CUDA (the dp4a kernels of cuda/quant.cu; on the emulator without a GPU, under each schedule)
namespace {

// C = A·Bᵀ on both devices, A u8 [M, K] (row stride lda), B i8 [N, K] (ldb), C int32 [M, N] (ldc);
// C's padding columns must stay as they were.
void check_qgemm(int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc,
                 const std::vector<uint8_t>& A, const std::vector<int8_t>& B) {
    INFO("M=" << M << " N=" << N << " K=" << K << " lda=" << lda << " ldb=" << ldb << " ldc=" << ldc);
    std::vector<int32_t> want(static_cast<size_t>(M * ldc), -7);
    cpu::qgemm_u8s8(M, N, K, A.data(), lda, B.data(), ldb, want.data(), ldc, 255);
    DeviceArray<uint8_t> A_d(A);
    DeviceArray<int8_t> B_d(B);
    under_every_schedule([&] {
        DeviceArray<int32_t> C_d(std::vector<int32_t>(static_cast<size_t>(M * ldc), -7));
        cuda::qgemm_u8s8(M, N, K, A_d.get(), lda, B_d.get(), ldb, C_d.get(), ldc, 255);
        require_same_bits(C_d.host(), want);
    });
}

}  // namespace

TEST_CASE("cuda qgemm_u8s8 (dp4a) matches the CPU exactly", "[lesson11][cuda][quant][qgemm]") {
    Rng rng(7);
    struct Shape3 {
        int64_t M, N, K;
    };
    // Partial tiles (1, 63, 65, 130 against 64×64), K from 0 to past two 32-value steps and not a
    // multiple of 4 (1, 3, 5, 31, 33, 67), and one case per stride wider than its row.
    for (Shape3 s : {Shape3{1, 1, 1}, Shape3{7, 5, 3}, Shape3{65, 63, 67}, Shape3{130, 70, 33},
                     Shape3{64, 64, 32}, Shape3{3, 129, 31}, Shape3{20, 10, 0}, Shape3{33, 17, 5}}) {
        for (int64_t extra : {int64_t(0), int64_t(3)}) {
            const int64_t lda = s.K + extra, ldb = s.K + 2 * extra, ldc = s.N + extra;
            check_qgemm(s.M, s.N, s.K, lda, ldb, ldc, random_ints<uint8_t>(s.M * lda, 0, 255, rng),
                        random_ints<int8_t>(s.N * ldb, -128, 127, rng));
        }
    }
}

TEST_CASE("cuda qgemm_u8s8 is exact at the extremes, up to the contract's largest K", "[lesson11][cuda][quant][qgemm]") {
    // A = 255, B = −128 everywhere: every product is −32640, and the flip's two sums are at their
    // largest: Σ (a − 128)·b = −16256·K and 128·Σ b = −16384·K. K = 65792 is the largest K for which
    // K·255·128 < 2^31 (ops/quant.h): C = −2,147,450,880, 32,768 from int32's minimum.
    for (int64_t K : {int64_t(5), int64_t(1001), int64_t(65792)}) {
        const int64_t M = 3, N = 2;
        check_qgemm(M, N, K, K, K, N, std::vector<uint8_t>(static_cast<size_t>(M * K), 255),
                    std::vector<int8_t>(static_cast<size_t>(N * K), -128));
    }
    // And the other corners: a = 0 (−128 after the flip) against b = 127 and b = −128.
    Rng rng(8);
    std::vector<uint8_t> A = random_ints<uint8_t>(9 * 13, 0, 1, rng);
    for (uint8_t& a : A) a = a ? 255 : 0;
    std::vector<int8_t> B = random_ints<int8_t>(11 * 13, 0, 1, rng);
    for (int8_t& b : B) b = b ? 127 : -128;
    check_qgemm(9, 11, 13, 13, 13, 11, A, B);
}

// ==== the int8 layers ===============================================================================
namespace {

// A layer's requantization, random but valid: bias[o], multipliers M_o in [2^-12, 2^-6], z_y and
// a clamp range. Random sums of K products of ±128·[0, 255] are ~10^3 to 10^5: some land inside
// the u8 range, some are clamped, so both branches of requantize_value run.
struct RandomOutput {
    std::vector<int32_t> bias;
    std::vector<Requant> requant;
    QOutput out;
    RandomOutput(int64_t O, std::mt19937& rng, bool relu) {
        std::uniform_int_distribution<int32_t> b(-20000, 20000);
        std::uniform_real_distribution<double> e(-12.0, -6.0);
        for (int64_t o = 0; o < O; ++o) {
            bias.push_back(b(rng));
            requant.push_back(make_requant(std::exp2(e(rng))));
        }
        out.bias = bias.data();
        out.requant = requant.data();
        out.zero_point = 97;
        out.lo = relu ? out.zero_point : 0;  // a fused ReLU clamps at z_y
        out.hi = 255;
    }
};

// The convolution written out: acc = Σ w·x over the window and the Cg channels of o's group
// (those from (o / Og)·Cg: all C for groups 1, channel o alone for depthwise), x read as z_x
// outside the image, then y = requantize_value(acc + bias[o]).
std::vector<uint8_t> direct_qconv2d(const std::vector<uint8_t>& x, const std::vector<int8_t>& w,
                                    const Conv2dParams& p, int32_t z_x, const QOutput& out) {
    const int64_t P = p.P(), Q = p.Q(), Cg = p.Cg();
    std::vector<uint8_t> y(size_t(p.N * p.O * P * Q));
    for (int64_t n = 0; n < p.N; ++n)
        for (int64_t o = 0; o < p.O; ++o)
            for (int64_t op = 0; op < P; ++op)
                for (int64_t oq = 0; oq < Q; ++oq) {
                    int32_t acc = 0;
                    for (int64_t c = 0; c < Cg; ++c)
                        for (int64_t kh = 0; kh < p.KH; ++kh)
                            for (int64_t kw = 0; kw < p.KW; ++kw) {
                                const int64_t xc = o / p.Og() * Cg + c;  // x's channel
                                const int64_t ih = op * p.stride - p.padding + kh * p.dilation;
                                const int64_t iw = oq * p.stride - p.padding + kw * p.dilation;
                                const bool inside = ih >= 0 && ih < p.H && iw >= 0 && iw < p.W;
                                const int32_t xv = inside ? x[size_t(((n * p.C + xc) * p.H + ih) * p.W + iw)] : z_x;
                                acc += int32_t(w[size_t(((o * Cg + c) * p.KH + kh) * p.KW + kw)]) * xv;
                            }
                    y[size_t(((n * p.O + o) * P + op) * Q + oq)] =
                        requantize_value(acc + out.bias[o], out.requant[o], out.zero_point, out.lo, out.hi);
                }
    return y;
}

Conv2dParams conv(int64_t N, int64_t C, int64_t H, int64_t W, int64_t O, int64_t KH, int64_t KW, int64_t stride,
                  int64_t padding, int64_t dilation) {
    Conv2dParams p;
    p.N = N, p.C = C, p.H = H, p.W = W, p.O = O, p.KH = KH, p.KW = KW;
    p.stride = stride, p.padding = padding, p.dilation = dilation;
    return p;
}

// A depthwise convolution: groups = O = C, w [C, 1, KH, KW].
Conv2dParams depthwise(int64_t N, int64_t C, int64_t H, int64_t W, int64_t K, int64_t stride, int64_t padding,
                       int64_t dilation) {
    Conv2dParams p = conv(N, C, H, W, C, K, K, stride, padding, dilation);
    p.groups = C;
    return p;
}

std::vector<uint8_t> run_qconv2d(const std::vector<uint8_t>& x, const std::vector<int8_t>& w, const Conv2dParams& p,
                                 int32_t z_x, int32_t x_max, const QOutput& out) {
    std::vector<uint8_t> y(size_t(p.N * p.O * p.P() * p.Q())), work(size_t(qconv2d_work_bytes(p)));
    qconv2d(x.data(), w.data(), y.data(), p, z_x, x_max, out, work.data());
    return y;
}

}  // namespace

TEST_CASE("qconv2d equals the direct integer convolution, with padding, stride and dilation",
          "[lesson11][cpu][qgemm][quant][qconv]") {
    // LeNet's two convolutions, the CIFAR net's 2×2 stem and a padded 3×3, stride 2,
    // dilation 2, 1×1 (the image itself as B on a 16×16 plane; on 7×7 planes, and with stride 2,
    // through im2col), a 2×9 window; N = 5 > 2 threads (images spread), N = 1 (the product split);
    // small planes in groups of images side by side (LeNet's conv2 at N = 9: groups of 4, 4, 1).
    const Conv2dParams shapes[] = {conv(5, 1, 28, 28, 10, 5, 5, 1, 0, 1), conv(3, 10, 12, 12, 20, 5, 5, 1, 0, 1),
                                   conv(9, 10, 12, 12, 20, 5, 5, 1, 0, 1),
                                   conv(2, 3, 32, 32, 24, 2, 2, 1, 0, 1),  conv(5, 24, 15, 15, 32, 3, 3, 1, 1, 1),
                                   conv(3, 6, 11, 13, 7, 3, 3, 2, 1, 1),   conv(3, 5, 14, 12, 9, 3, 3, 1, 2, 2),
                                   conv(4, 17, 7, 7, 33, 1, 1, 1, 0, 1),   conv(1, 32, 16, 16, 64, 3, 3, 1, 1, 1),
                                   conv(3, 3, 10, 14, 4, 2, 9, 1, 1, 1),   conv(1, 40, 16, 16, 24, 1, 1, 1, 0, 1),
                                   conv(2, 8, 9, 9, 16, 1, 1, 2, 0, 1)};
    std::mt19937 rng(13);
    for (const Conv2dParams& p : shapes)
        for (int32_t x_max : {kActQmax, kActQmaxReduced}) {
            const int32_t z_x = x_max / 3;
            const auto x = random_u8(p.N * p.C * p.H * p.W, x_max, rng);
            const auto w = random_i8(p.O * p.C * p.KH * p.KW, rng);
            const RandomOutput r(p.O, rng, /*relu=*/x_max == kActQmax);
            const auto expected = direct_qconv2d(x, w, p, z_x, r.out);
            INFO("N=" << p.N << " C=" << p.C << " " << p.H << "×" << p.W << " O=" << p.O << " k" << p.KH << "×"
                      << p.KW << " stride " << p.stride << " pad " << p.padding << " dil " << p.dilation
                      << " x_max " << x_max << ", path " << qgemm_path_name(qgemm_path(x_max)));
            std::vector<uint8_t> one, two;
            with_threads(1, [&] { one = run_qconv2d(x, w, p, z_x, x_max, r.out); });
            with_threads(2, [&] { two = run_qconv2d(x, w, p, z_x, x_max, r.out); });
            CHECK(one == expected);
            CHECK(two == expected);
        }
}

TEST_CASE("qconv2d's workspace depends on the sizes only, and groups are refused", "[lesson11][cpu][qgemm][quant][qconv]") {
    const Conv2dParams p = conv(40, 3, 8, 8, 4, 3, 3, 1, 0, 1);
    int64_t one = 0, two = 0;
    with_threads(1, [&] { one = qconv2d_work_bytes(p); });
    with_threads(2, [&] { two = qconv2d_work_bytes(p); });
    CHECK(one == two);
    Conv2dParams g = conv(1, 4, 8, 8, 4, 3, 3, 1, 0, 1);
    g.groups = 2;
    std::vector<uint8_t> x(4 * 64), y(4 * 36), work(size_t(qconv2d_work_bytes(g)));
    std::vector<int8_t> w(4 * 2 * 9);
    CHECK_THROWS_WITH(qconv2d(x.data(), w.data(), y.data(), g, 0, 255, QOutput{}, work.data()),
                      Catch::Contains("groups=2"));
}

// If you rewrote dp4a_conv_dot in cuda/quant.cu, this is the test that tells you whether it is right:
//   make test T='[qconv]'
TEST_CASE("cuda qconv2d (dp4a_conv_dot) matches the CPU exactly", "[lesson11][cuda][quant][qconv]") {
    Rng rng(11);
    auto params = [](int64_t N, int64_t C, int64_t H, int64_t W, int64_t O, int64_t KH, int64_t KW, int64_t stride,
                     int64_t padding, int64_t dilation) {
        Conv2dParams p;
        p.N = N, p.C = C, p.H = H, p.W = W, p.O = O, p.KH = KH, p.KW = KW;
        p.stride = stride, p.padding = padding, p.dilation = dilation;
        return p;
    };
    // LeNet's first layer (K = 25, O = 6 < 8 filters a thread); odd sizes, O = 17 (a partial group
    // of 8), K = 4 (1×1), stride 2 and 3, padding past the kernel's reach, dilation 2.
    for (const Conv2dParams& p : {params(2, 1, 28, 28, 6, 5, 5, 1, 2, 1), params(2, 3, 9, 11, 17, 3, 3, 2, 1, 1),
                                  params(1, 5, 7, 6, 9, 3, 2, 1, 2, 2), params(3, 4, 5, 5, 16, 1, 1, 1, 0, 1),
                                  params(1, 2, 8, 7, 3, 3, 3, 3, 0, 1), params(2, 6, 6, 6, 8, 3, 3, 1, 1, 1)}) {
        const int64_t K = p.C * p.KH * p.KW, ny = p.N * p.O * p.P() * p.Q();
        INFO("N=" << p.N << " C=" << p.C << " H=" << p.H << " W=" << p.W << " O=" << p.O << " K=" << p.KH << "x"
                  << p.KW << " stride=" << p.stride << " padding=" << p.padding << " dilation=" << p.dilation);
        const std::vector<uint8_t> x = random_ints<uint8_t>(p.N * p.C * p.H * p.W, 0, 255, rng);
        const std::vector<int8_t> w = random_ints<int8_t>(p.O * K, -128, 127, rng);
        DeviceArray<uint8_t> x_d(x);
        DeviceArray<int8_t> w_d(w);
        for (int32_t z_x : {0, 255, int32_t(rng.next_below(256))}) {
            const bool relu = z_x != 0;
            INFO("z_x = " << z_x << ", relu fused: " << relu);
            Output out(p.O, acc_spread(K), relu, rng, w);
            std::vector<uint8_t> want(static_cast<size_t>(ny)), work(static_cast<size_t>(cpu::qconv2d_work_bytes(p)));
            cpu::qconv2d(x.data(), w.data(), want.data(), p, z_x, 255, out.on_host(), work.data());
            under_every_schedule([&] {
                DeviceArray<uint8_t> got(ny), work_d(cuda::qconv2d_work_bytes(p));
                cuda::qconv2d(x_d.get(), w_d.get(), got.get(), p, z_x, 255, out.on_device(), work_d.get());
                require_same_bits(got.host(), want);
            });
            require_varied(want);
        }
    }
}

TEST_CASE("cuda qconv2d is exact at the extremes: x = 255, w = -128, padding at 0 and 255", "[lesson11][cuda][quant][qconv]") {
    Conv2dParams p;
    p.N = 1, p.C = 7, p.H = 5, p.W = 6, p.O = 9, p.KH = 3, p.KW = 3, p.padding = 1;
    const int64_t K = p.C * p.KH * p.KW, ny = p.N * p.O * p.P() * p.Q();
    const std::vector<uint8_t> x(static_cast<size_t>(p.N * p.C * p.H * p.W), 255);
    const std::vector<int8_t> w(static_cast<size_t>(p.O * K), -128);
    DeviceArray<uint8_t> x_d(x);
    DeviceArray<int8_t> w_d(w);
    Rng rng(12);
    // The padding reads 0 (border pixels see fewer 255s) or 255 (every pixel sees the same sum).
    for (int32_t z_x : {0, 255}) {
        INFO("z_x = " << z_x);
        Output out(p.O, 32640.0 * double(K), false, rng);
        std::vector<uint8_t> want(static_cast<size_t>(ny)), work(static_cast<size_t>(cpu::qconv2d_work_bytes(p)));
        cpu::qconv2d(x.data(), w.data(), want.data(), p, z_x, 255, out.on_host(), work.data());
        DeviceArray<uint8_t> got(ny), work_d(cuda::qconv2d_work_bytes(p));
        cuda::qconv2d(x_d.get(), w_d.get(), got.get(), p, z_x, 255, out.on_device(), work_d.get());
        require_same_bits(got.host(), want);
        require_varied(want);  // the channels' biases differ
    }
}

TEST_CASE("cuda qconv2d names what it does not take", "[lesson11][cuda][quant][qconv]") {
    Conv2dParams p;
    p.C = 4, p.H = 5, p.W = 5, p.O = 4, p.KH = 3, p.KW = 3;
    p.groups = 2;
    const QOutput out;
    REQUIRE_THROWS_WITH(cuda::qconv2d(nullptr, nullptr, nullptr, p, 0, 255, out, nullptr),
                        Catch::Contains("cuda::qconv2d: groups=2") && Catch::Contains("groups=1"));
    p.groups = 1;
    REQUIRE_THROWS_WITH(cuda::qconv2d(nullptr, nullptr, nullptr, p, 300, 255, out, nullptr),
                        Catch::Contains("x_zero_point=300") && Catch::Contains("QParams"));
}

TEST_CASE("qlinear equals Σ w·x requantized, at the chapter's sizes", "[lesson11][cpu][qgemm][quant]") {
    const GemmShape shapes[] = {{64, 50, 320}, {1000, 10, 50}, {3, 7, 1}, {129, 33, 513}};  // {N, O, K}
    std::mt19937 rng(14);
    for (const GemmShape& s : shapes)
        for (int32_t x_max : {kActQmax, kActQmaxReduced}) {
            const auto x = random_u8(s.M * s.K, x_max, rng);
            const auto w = random_i8(s.N * s.K, rng);
            const RandomOutput r(s.N, rng, /*relu=*/false);
            std::vector<uint8_t> expected(size_t(s.M * s.N)), y(expected.size());
            for (int64_t n = 0; n < s.M; ++n)
                for (int64_t o = 0; o < s.N; ++o) {
                    int32_t acc = 0;
                    for (int64_t k = 0; k < s.K; ++k) acc += int32_t(w[size_t(o * s.K + k)]) * x[size_t(n * s.K + k)];
                    expected[size_t(n * s.N + o)] =
                        requantize_value(acc + r.bias[size_t(o)], r.requant[size_t(o)], r.out.zero_point, r.out.lo, r.out.hi);
                }
            std::vector<int32_t> work(size_t(s.M * s.N));
            qlinear(x.data(), w.data(), y.data(), s.M, s.K, s.N, x_max, r.out, work.data());
            INFO("N=" << s.M << " O=" << s.N << " K=" << s.K << " x_max " << x_max);
            CHECK(y == expected);
        }
}

TEST_CASE("cuda requantize_rows and qlinear match the CPU, ReLU fused or not", "[lesson11][cuda][quant][qgemm]") {
    Rng rng(9);
    for (bool relu : {false, true}) {
        INFO("relu fused: " << relu);
        {  // requantize_rows on accumulators of every size, multipliers above 1 and tiny
            const int64_t M = 13, O = 11;
            const std::vector<int32_t> acc = random_ints<int32_t>(M * O, -(1 << 24), 1 << 24, rng);
            Output out(O, double(1 << 22), relu, rng);
            out.requant[0] = make_requant(1.75);  // M ≥ 1: a negative shift
            out.requant[1] = make_requant(3e-9);
            out.requant_d = DeviceArray<Requant>(out.requant);
            std::vector<uint8_t> want(static_cast<size_t>(M * O));
            cpu::requantize_rows(acc.data(), want.data(), M, O, out.on_host());
            DeviceArray<int32_t> acc_d(acc);
            under_schedules([&] {
                DeviceArray<uint8_t> got(M * O);
                cuda::requantize_rows(acc_d.get(), got.get(), M, O, out.on_device());
                require_same_bits(got.host(), want);
            });
            require_varied(want);
        }
        {  // qlinear: the accumulators (work) and y
            const int64_t N = 17, K = 150, O = 10;
            const std::vector<uint8_t> x = random_ints<uint8_t>(N * K, 0, 255, rng);
            const std::vector<int8_t> w = random_ints<int8_t>(O * K, -128, 127, rng);
            Output out(O, acc_spread(K), relu, rng, w);
            std::vector<uint8_t> want(static_cast<size_t>(N * O));
            std::vector<int32_t> work(static_cast<size_t>(N * O));
            cpu::qlinear(x.data(), w.data(), want.data(), N, K, O, 255, out.on_host(), work.data());
            DeviceArray<uint8_t> x_d(x);
            DeviceArray<int8_t> w_d(w);
            under_every_schedule([&] {
                DeviceArray<uint8_t> got(N * O);
                DeviceArray<int32_t> work_d(N * O);
                cuda::qlinear(x_d.get(), w_d.get(), got.get(), N, K, O, 255, out.on_device(), work_d.get());
                require_same_bits(work_d.host(), work);
                require_same_bits(got.host(), want);
            });
            require_varied(want);
        }
    }
}

// ==== depthwise convolution, global average pooling, the sum of two u8 tensors ========================
TEST_CASE("qconv2d depthwise by hand: a box filter and a two-tap one, padding read as z_x, stride 1 and 2",
          "[lesson11][cpu][quant][depthwise][qconv]") {
    // x [1, 2, 3, 3]: channel 0 holds 1..9, channel 1 holds 9..1; padding 1 reads z_x = 10.
    // w [2, 1, 3, 3]: channel 0 all ones (y = its window's sum: a corner sees five 10s, an edge
    // three), channel 1 is 2 at the centre and −1 at the top left (y = 2·x[p, q] − x[p − 1, q − 1]).
    // Bias 0 and multiplier 1 (make_requant(1.0) = 2^30 · 2^-30, exact), z_y = 20: y = 20 + acc.
    const std::vector<uint8_t> x = {1, 2, 3, 4, 5, 6, 7, 8, 9, 9, 8, 7, 6, 5, 4, 3, 2, 1};
    std::vector<int8_t> w(18, 0);
    std::fill(w.begin(), w.begin() + 9, int8_t(1));
    w[9] = -1, w[9 + 4] = 2;
    const std::vector<int32_t> bias(2, 0);
    const std::vector<Requant> requant(2, make_requant(1.0));
    const QOutput out{bias.data(), requant.data(), 20, 0, 255};
    const Conv2dParams s1 = depthwise(1, 2, 3, 3, 3, 1, 1, 1), s2 = depthwise(1, 2, 3, 3, 3, 2, 1, 1);
    const std::vector<uint8_t> y1 = {82, 71, 86, 77, 65, 83, 94, 89, 98, 28, 26, 24, 22, 21, 20, 16, 18, 17};
    const std::vector<uint8_t> y2 = {82, 86, 94, 98, 28, 24, 16, 17};  // the corners of y1's planes
    CHECK(run_qconv2d(x, w, s1, 10, 255, out) == y1);
    CHECK(run_qconv2d(x, w, s2, 10, 255, out) == y2);
    CHECK(direct_qconv2d(x, w, s1, 10, out) == y1);
    CHECK(direct_qconv2d(x, w, s2, 10, out) == y2);
}

TEST_CASE("qconv2d depthwise equals the direct integer convolution, stride 1 and 2, padding, dilation",
          "[lesson11][cpu][quant][depthwise][qconv]") {
    // MobileNetV2's 3×3 at stride 1 and 2 with padding 1, a 5×5, dilation 2, no padding at an odd
    // size, 96 small planes (spread over the threads); no workspace.
    const Conv2dParams shapes[] = {depthwise(2, 5, 7, 9, 3, 1, 1, 1), depthwise(3, 8, 10, 10, 3, 2, 1, 1),
                                   depthwise(1, 3, 6, 5, 5, 1, 2, 1), depthwise(2, 4, 9, 9, 3, 1, 2, 2),
                                   depthwise(2, 6, 8, 7, 3, 2, 0, 1), depthwise(4, 24, 4, 4, 3, 1, 1, 1)};
    std::mt19937 rng(16);
    for (const Conv2dParams& p : shapes)
        for (int32_t z_x : {0, 255, 77}) {
            const auto x = random_u8(p.N * p.C * p.H * p.W, kActQmax, rng);
            const auto w = random_i8(p.C * p.KH * p.KW, rng);
            const RandomOutput r(p.O, rng, /*relu=*/z_x == 77);
            const auto expected = direct_qconv2d(x, w, p, z_x, r.out);
            INFO("N=" << p.N << " C=" << p.C << " " << p.H << "×" << p.W << " k" << p.KH << " stride " << p.stride
                      << " pad " << p.padding << " dil " << p.dilation << " z_x " << z_x);
            CHECK(qconv2d_work_bytes(p) == 0);
            std::vector<uint8_t> one, two;
            with_threads(1, [&] { one = run_qconv2d(x, w, p, z_x, kActQmax, r.out); });
            with_threads(2, [&] { two = run_qconv2d(x, w, p, z_x, kActQmax, r.out); });
            CHECK(one == expected);
            CHECK(two == expected);
        }
}

namespace {

// A depthwise convolution: groups = O = C, w [C, 1, K, K].
Conv2dParams depthwise_params(int64_t N, int64_t C, int64_t H, int64_t W, int64_t K, int64_t stride, int64_t padding,
                              int64_t dilation) {
    Conv2dParams p;
    p.N = N, p.C = C, p.H = H, p.W = W, p.O = C, p.KH = K, p.KW = K;
    p.stride = stride, p.padding = padding, p.dilation = dilation, p.groups = C;
    return p;
}

}  // namespace

TEST_CASE("cuda qconv2d depthwise matches the CPU exactly", "[lesson11][cuda][quant][qconv][depthwise]") {
    Rng rng(14);
    // MobileNetV2's 3×3 at stride 1 and 2 with padding 1, a 5×5, dilation 2, no padding at an odd size.
    for (const Conv2dParams& p : {depthwise_params(2, 5, 7, 9, 3, 1, 1, 1), depthwise_params(3, 8, 10, 10, 3, 2, 1, 1),
                                  depthwise_params(1, 3, 6, 5, 5, 1, 2, 1), depthwise_params(2, 4, 9, 9, 3, 1, 2, 2),
                                  depthwise_params(2, 6, 8, 7, 3, 2, 0, 1)}) {
        const int64_t K = p.KH * p.KW, ny = p.N * p.O * p.P() * p.Q();
        INFO("N=" << p.N << " C=" << p.C << " H=" << p.H << " W=" << p.W << " K=" << p.KH << "x" << p.KW
                  << " stride=" << p.stride << " padding=" << p.padding << " dilation=" << p.dilation);
        const std::vector<uint8_t> x = random_ints<uint8_t>(p.N * p.C * p.H * p.W, 0, 255, rng);
        const std::vector<int8_t> w = random_ints<int8_t>(p.C * K, -128, 127, rng);
        DeviceArray<uint8_t> x_d(x);
        DeviceArray<int8_t> w_d(w);
        REQUIRE(cpu::qconv2d_work_bytes(p) == 0);
        REQUIRE(cuda::qconv2d_work_bytes(p) == 0);
        for (int32_t z_x : {0, 255, int32_t(rng.next_below(256))}) {
            const bool relu = z_x != 0;
            INFO("z_x = " << z_x << ", relu fused: " << relu);
            Output out(p.O, acc_spread(K), relu, rng, w);
            std::vector<uint8_t> want(static_cast<size_t>(ny));
            cpu::qconv2d(x.data(), w.data(), want.data(), p, z_x, 255, out.on_host(), nullptr);
            under_schedules([&] {
                DeviceArray<uint8_t> got(ny);
                cuda::qconv2d(x_d.get(), w_d.get(), got.get(), p, z_x, 255, out.on_device(), nullptr);
                require_same_bits(got.host(), want);
            });
            require_varied(want);
        }
    }
}

// Every window's max against the definition: the 2×2 stride-2 planes (their own loop) with even
// and odd sides, and windows with padding and overlap (the general loop).
TEST_CASE("qmaxpool2d: each window's largest value, 2×2 and the general windows", "[lesson11][cpu][quant][qpool]") {
    std::mt19937 rng(21);
    struct Window {
        int64_t k, stride, padding, H, W;
    };
    for (Window win : {Window{2, 2, 0, 24, 24}, Window{2, 2, 0, 9, 7}, Window{2, 2, 0, 2, 41}, Window{3, 2, 1, 9, 7},
                       Window{3, 1, 1, 5, 6}}) {
        Pool2dParams p;
        p.N = 2, p.C = 3, p.H = win.H, p.W = win.W, p.KH = p.KW = win.k, p.stride = win.stride, p.padding = win.padding;
        INFO("kernel " << win.k << " stride " << win.stride << " padding " << win.padding << " on " << p.H << "x" << p.W);
        const auto x = random_u8(p.N * p.C * p.H * p.W, 255, rng);
        std::vector<uint8_t> got(static_cast<size_t>(p.N * p.C * p.P() * p.Q())), want(got.size());
        for (int64_t plane = 0; plane < p.N * p.C; plane++)
            for (int64_t op = 0; op < p.P(); op++)
                for (int64_t oq = 0; oq < p.Q(); oq++) {
                    int m = 0;  // padding is never the max: it is left out, as PyTorch's
                    for (int64_t kh = 0; kh < p.KH; kh++)
                        for (int64_t kw = 0; kw < p.KW; kw++) {
                            const int64_t ih = op * p.stride - p.padding + kh, iw = oq * p.stride - p.padding + kw;
                            if (ih >= 0 && ih < p.H && iw >= 0 && iw < p.W)
                                m = std::max<int>(m, x[size_t((plane * p.H + ih) * p.W + iw)]);
                        }
                    want[size_t((plane * p.P() + op) * p.Q() + oq)] = uint8_t(m);
                }
        qmaxpool2d(x.data(), got.data(), p);
        CHECK(got == want);
    }
}

TEST_CASE("cuda qmaxpool2d and lookup_u8 match the CPU", "[lesson11][cuda][quant][qpool]") {
    Rng rng(13);
    Pool2dParams p;
    p.N = 2, p.C = 3, p.H = 9, p.W = 7;
    struct Window {
        int64_t k, stride, padding;
    };
    for (Window win : {Window{2, 2, 0}, Window{3, 2, 1}, Window{3, 1, 1}}) {
        p.KH = p.KW = win.k, p.stride = win.stride, p.padding = win.padding;
        INFO("kernel " << win.k << " stride " << win.stride << " padding " << win.padding);
        const std::vector<uint8_t> x = random_ints<uint8_t>(p.N * p.C * p.H * p.W, 0, 255, rng);
        std::vector<uint8_t> want(static_cast<size_t>(p.N * p.C * p.P() * p.Q()));
        cpu::qmaxpool2d(x.data(), want.data(), p);
        DeviceArray<uint8_t> x_d(x), got(int64_t(want.size()));
        under_schedules([&] {
            cuda::qmaxpool2d(x_d.get(), got.get(), p);
            require_same_bits(got.host(), want);
        });
    }
    for (int64_t C : {int64_t(1), int64_t(5)}) {  // one table, or one per channel
        const int64_t outer = 3, inner = 41, n = outer * C * inner;
        const std::vector<uint8_t> x = random_ints<uint8_t>(n, 0, 255, rng), table = random_ints<uint8_t>(C * 256, 0, 255, rng);
        std::vector<uint8_t> want(static_cast<size_t>(n));
        cpu::lookup_u8(x.data(), want.data(), outer, C, inner, table.data());
        DeviceArray<uint8_t> x_d(x), table_d(table), got(n);
        under_schedules([&] {
            cuda::lookup_u8(x_d.get(), got.get(), outer, C, inner, table_d.get());
            require_same_bits(got.host(), want);
        });
        require_varied(want);
    }
}

TEST_CASE("qglobal_avgpool: the mean rounded half up, by hand and against the definition", "[lesson11][cpu][quant][qpool]") {
    // [1, 3, 2, 2]: 10/4 = 2.5 → 3, 1019/4 = 254.75 → 255, 2/4 = 0.5 → 1 (ties go up);
    // [1, 2, 1, 3]: 4/3 → 1, 5/3 → 2 (an odd plane has no ties).
    std::vector<uint8_t> y(3);
    const std::vector<uint8_t> even = {1, 2, 3, 4, 255, 255, 255, 254, 0, 0, 1, 1}, odd = {1, 1, 2, 2, 2, 1};
    qglobal_avgpool(even.data(), y.data(), 3, 4);
    CHECK(y == std::vector<uint8_t>{3, 255, 1});
    qglobal_avgpool(odd.data(), y.data(), 2, 3);
    CHECK(std::vector<uint8_t>(y.begin(), y.begin() + 2) == std::vector<uint8_t>{1, 2});
    // Random planes of 1, 16 (4×4), 49 (7×7) and 1000 values: floor(mean + 1/2) in double is exact
    // here (a tie is k + 1/2 exactly; any other mean is at least 1/(2S) away from one).
    std::mt19937 rng(18);
    for (int64_t S : {int64_t(1), int64_t(16), int64_t(49), int64_t(1000)}) {
        const int64_t NC = 37;
        const auto x = random_u8(NC * S, kActQmax, rng);
        std::vector<uint8_t> got(static_cast<size_t>(NC)), want(static_cast<size_t>(NC));
        for (int64_t i = 0; i < NC; i++) {
            int64_t sum = 0;
            for (int64_t s = 0; s < S; s++) sum += x[size_t(i * S + s)];
            want[size_t(i)] = uint8_t(std::floor(double(sum) / double(S) + 0.5));
        }
        qglobal_avgpool(x.data(), got.data(), NC, S);
        INFO("S=" << S);
        CHECK(got == want);
    }
}

TEST_CASE("cuda qglobal_avgpool matches the CPU", "[lesson11][cuda][quant][qpool]") {
    Rng rng(15);
    // Planes of 1, 16 (4×4), 49 (7×7) and 1000 values, and the largest sums (all 255).
    for (int64_t S : {int64_t(1), int64_t(16), int64_t(49), int64_t(1000)}) {
        for (bool full : {false, true}) {
            const int64_t NC = 2 * 37;
            INFO("S=" << S << (full ? ", all 255" : ""));
            const std::vector<uint8_t> x = full ? std::vector<uint8_t>(static_cast<size_t>(NC * S), 255)
                                                : random_ints<uint8_t>(NC * S, 0, 255, rng);
            std::vector<uint8_t> want(static_cast<size_t>(NC));
            cpu::qglobal_avgpool(x.data(), want.data(), NC, S);
            DeviceArray<uint8_t> x_d(x);
            under_schedules([&] {
                DeviceArray<uint8_t> got(NC);
                cuda::qglobal_avgpool(x_d.get(), got.get(), NC, S);
                require_same_bits(got.host(), want);
            });
        }
    }
}

TEST_CASE("qadd is within 1 of its formula in double on every pair of u8 values, for scale ratios 1, 10, 1/10",
          "[lesson11][cpu][quant][qadd]") {
    struct Ranges {
        QParams a, b, y;
    };
    const Ranges cases[] = {
        {{0.05f, 128}, {0.05f, 100}, {0.1f, 110}},                          // s_a = s_b
        {{0.5f, 0}, {0.05f, 200}, {0.6f, 40}},                              // s_a = 10·s_b
        {{0.02f, 30}, {0.2f, 128}, {0.25f, 128}},                           // s_b = 10·s_a
        {{0.0123f, 17}, {0.0456f, 250}, {0.0321f, 90}},                     // s_y between theirs: clamps
        {{0.1f, 10}, {0.1f, 10}, {0.2f, 30, 30, 255}},                      // a fused ReLU: qmin = z_y
        {{0.03f, 64, 0, 127}, {0.07f, 3, 0, 127}, {0.09f, 20, 0, 127}},     // reduce_range's [0, 127]
        {{1.0f, 5}, {1.0f / 4096, 128}, {1.0f, 0}},                         // the largest ratio allowed
    };
    std::vector<uint8_t> a(65536), b(65536), y(65536);  // every pair once: a = i mod 256, b = i / 256
    for (size_t i = 0; i < a.size(); i++) a[i] = uint8_t(i % 256), b[i] = uint8_t(i / 256);
    for (const Ranges& r : cases) {
        INFO("s_a " << r.a.scale << " z_a " << r.a.zero_point << ", s_b " << r.b.scale << " z_b " << r.b.zero_point
                    << ", s_y " << r.y.scale << " z_y " << r.y.zero_point << " [" << r.y.qmin << ", " << r.y.qmax
                    << "]");
        qadd(a.data(), b.data(), y.data(), int64_t(a.size()), qadd_params(r.a, r.b, r.y));
        int64_t off = 0, equal = 0;
        for (size_t i = 0; i < a.size(); i++) {
            const double sum = double(r.a.scale) * (a[i] - r.a.zero_point) + double(r.b.scale) * (b[i] - r.b.zero_point);
            const double v = sum / double(r.y.scale);
            const double want = std::clamp(r.y.zero_point + std::floor(v + 0.5), double(r.y.qmin), double(r.y.qmax));
            const double d = std::abs(double(y[i]) - want);
            off += d > 1, equal += d == 0;
        }
        INFO(equal << " of 65536 equal");
        CHECK(off == 0);
    }
}

TEST_CASE("cuda qadd matches the CPU bit for bit on every pair of u8 values", "[lesson11][cuda][quant][qadd]") {
    // s_a = s_b, s_a = 10·s_b, s_b = 10·s_a, a fused ReLU's range, the largest scale ratio allowed.
    struct Ranges {
        QParams a, b, y;
    };
    const Ranges cases[] = {{{0.05f, 128}, {0.05f, 100}, {0.1f, 110}},
                            {{0.5f, 0}, {0.05f, 200}, {0.6f, 40}},
                            {{0.02f, 30}, {0.2f, 128}, {0.25f, 128}},
                            {{0.1f, 10}, {0.1f, 10}, {0.2f, 30, 30, 255}},
                            {{1.0f, 5}, {1.0f / 4096, 128}, {1.0f, 0}}};
    std::vector<uint8_t> a(65536), b(65536);  // every pair once: a = i mod 256, b = i / 256
    for (size_t i = 0; i < a.size(); i++) a[i] = uint8_t(i % 256), b[i] = uint8_t(i / 256);
    DeviceArray<uint8_t> a_d(a), b_d(b);
    for (const Ranges& r : cases) {
        INFO("s_a " << r.a.scale << ", s_b " << r.b.scale << ", s_y " << r.y.scale);
        const QAddParams q = qadd_params(r.a, r.b, r.y);
        std::vector<uint8_t> want(a.size());
        cpu::qadd(a.data(), b.data(), want.data(), int64_t(a.size()), q);
        under_schedules([&] {
            DeviceArray<uint8_t> got(int64_t(a.size()));
            cuda::qadd(a_d.get(), b_d.get(), got.get(), int64_t(a.size()), q);
            require_same_bits(got.host(), want);
        });
        require_varied(want);
    }
}
