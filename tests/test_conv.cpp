// test_conv.cpp — Conv2d (chapter 03) against a direct 7-loop convolution, finite differences,
// the bounded workspace, thread-count determinism and error messages; the Winograd path
// (ops/cpu/winograd.cpp) against the same reference, and its choice of shapes; the CUDA
// convolution (chapter 05: every pass and strategy, the layer, finite differences, the direct
// depthwise kernels) against the CPU; f16 and bf16 against f32 within the bound of lowp_check.h,
// every strategy, CPU (AMX emulated too) and CUDA; on the tensor cores (chapter 09: the
// implicit GEMM's wmma variant, the engine's passes, conv2d's choice of them), f16 and bf16 against
// the f32 CPU within the bound of one rounding.
//
// Run: make build/tests/kiln_tests && build/tests/kiln_tests '[conv]'
//      make test T='[conv][cuda]'        make test T='[depthwise]'
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <omp.h>

#include "core/cuda_memory.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "fixtures.h"
#include "gemm_versions.h"
#include "gradcheck.h"
#include "lowp_check.h"
#include "nn/conv.h"
#include "ops/conv.h"
#include "ops/cpu/gemm.h"
#include "ops/cpu/short_rows.h"
#include "ops/cpu/winograd.h"
#include "ops/all.h"
#ifndef KILN_CUDA
#include "kiln_cuda.h"  // the emulator's counter of wmma operations
#endif

using namespace kiln;
using test::require_identical;
using test::same_bits;
using test::under_schedules;

namespace {

struct Case {
    const char* what;
    int64_t N, C, H, W, O, KH, KW;
    ConvOptions opt;
};

// ---- the reference: v1 of ops/cpu/conv.cpp, the direct 7-loop convolution ---------------------
// y[n, o, p, q] = b[o] + Σ_{c < Cg} Σ_{kh, kw} w[o, c, kh, kw] · x[n, g·Cg + c, ih, iw]  (g = o / Og)
void naive_forward(const Case& k, const float* x, const float* w, const float* b, float* y, int64_t P, int64_t Q) {
    const int64_t G = k.opt.groups, Cg = k.C / G, Og = k.O / G;
    for (int64_t n = 0; n < k.N; n++)
        for (int64_t o = 0; o < k.O; o++)
            for (int64_t p = 0; p < P; p++)
                for (int64_t q = 0; q < Q; q++) {
                    double s = b ? b[o] : 0.0;
                    for (int64_t c = 0; c < Cg; c++)
                        for (int64_t kh = 0; kh < k.KH; kh++)
                            for (int64_t kw = 0; kw < k.KW; kw++) {
                                int64_t ih = p * k.opt.stride - k.opt.padding + kh * k.opt.dilation;
                                int64_t iw = q * k.opt.stride - k.opt.padding + kw * k.opt.dilation;
                                if (ih < 0 || ih >= k.H || iw < 0 || iw >= k.W) continue;
                                int64_t ci = (o / Og) * Cg + c;
                                s += double(w[((o * Cg + c) * k.KH + kh) * k.KW + kw]) *
                                     x[((n * k.C + ci) * k.H + ih) * k.W + iw];
                            }
                    y[((n * k.O + o) * P + p) * Q + q] = float(s);
                }
}

// The same loops, each multiply-add sending dy back to where it came from:
//   dx[n, ci, ih, iw] += w · dy     dw[o, c, kh, kw] += x · dy     db[o] += dy
void naive_backward(const Case& k, const float* x, const float* w, const float* dy, float* dx, float* dw, float* db,
                    int64_t P, int64_t Q) {
    const int64_t G = k.opt.groups, Cg = k.C / G, Og = k.O / G;
    std::vector<double> dxd(size_t(k.N * k.C * k.H * k.W), 0.0), dwd(size_t(k.O * Cg * k.KH * k.KW), 0.0),
        dbd(size_t(k.O), 0.0);
    for (int64_t n = 0; n < k.N; n++)
        for (int64_t o = 0; o < k.O; o++)
            for (int64_t p = 0; p < P; p++)
                for (int64_t q = 0; q < Q; q++) {
                    const double g = dy[((n * k.O + o) * P + p) * Q + q];
                    dbd[size_t(o)] += g;
                    for (int64_t c = 0; c < Cg; c++)
                        for (int64_t kh = 0; kh < k.KH; kh++)
                            for (int64_t kw = 0; kw < k.KW; kw++) {
                                int64_t ih = p * k.opt.stride - k.opt.padding + kh * k.opt.dilation;
                                int64_t iw = q * k.opt.stride - k.opt.padding + kw * k.opt.dilation;
                                if (ih < 0 || ih >= k.H || iw < 0 || iw >= k.W) continue;
                                int64_t ci = (o / Og) * Cg + c;
                                int64_t xi = ((n * k.C + ci) * k.H + ih) * k.W + iw;
                                int64_t wi = ((o * Cg + c) * k.KH + kh) * k.KW + kw;
                                dxd[size_t(xi)] += double(w[wi]) * g;
                                dwd[size_t(wi)] += double(x[xi]) * g;
                            }
                }
    for (size_t i = 0; i < dxd.size(); i++) dx[i] = float(dxd[i]);
    for (size_t i = 0; i < dwd.size(); i++) dw[i] = float(dwd[i]);
    for (size_t i = 0; i < dbd.size(); i++) db[i] = float(dbd[i]);
}

// max |a − b| / max(1, max |b|)
double rel_diff(const float* a, const float* b, int64_t n) {
    double d = 0.0, m = 1.0;
    for (int64_t i = 0; i < n; i++) {
        d = std::max(d, std::fabs(double(a[i]) - double(b[i])));
        m = std::max(m, std::fabs(double(b[i])));
    }
    return d / m;
}

const Case kCases[] = {
    {"stride 2, padding 1", 2, 3, 9, 8, 4, 3, 3, {2, 1, 1, 1, true}},
    {"dilation 2, padding 2", 2, 2, 10, 11, 3, 3, 3, {1, 2, 2, 1, true}},
    {"groups 2", 2, 4, 7, 7, 6, 3, 3, {1, 1, 1, 2, true}},
    {"depthwise", 2, 3, 8, 9, 3, 3, 3, {1, 1, 1, 3, true}},
    {"depthwise, stride 2, dilation 2", 2, 4, 9, 10, 4, 3, 3, {2, 2, 2, 4, true}},
    {"1x1 (pointwise)", 3, 5, 6, 7, 4, 1, 1, {1, 0, 1, 1, true}},
    {"1x1, groups 2", 2, 4, 5, 5, 6, 1, 1, {1, 0, 1, 2, true}},
    {"1x1, stride 2 (im2col)", 2, 3, 7, 6, 4, 1, 1, {2, 0, 1, 1, true}},
    {"odd sizes, 3x5 kernel, stride 3", 2, 3, 5, 13, 2, 3, 5, {3, 2, 1, 1, true}},
    {"batch 1, no bias, 5x5", 1, 2, 6, 6, 3, 5, 5, {1, 0, 1, 1, false}},
    {"LeNet conv2 shape", 2, 10, 12, 12, 20, 5, 5, {1, 0, 1, 1, true}},
    // Batch ≥ 8: dw by slices of images (conv2d_backward_weight_slices), db 8 images side by side
    // and 3 more one by one (bias_grad)
    {"LeNet conv2 shape, batch 11", 11, 10, 12, 12, 20, 5, 5, {1, 0, 1, 1, true}},
    {"1x1 (pointwise), batch 9", 9, 5, 6, 7, 4, 1, 1, {1, 0, 1, 1, true}},
    // Stride 1 with Q == W: im2col and col2im copy and add one long run per (c, kh, kw)
    {"3x3, padding 1 (the CIFAR nets' convs)", 2, 3, 6, 7, 4, 3, 3, {1, 1, 1, 1, true}},
    {"5x5, padding 2, on a 2x3 image", 2, 2, 2, 3, 3, 5, 5, {1, 2, 1, 1, true}},
    {"1x3, padding 1 (P = H + 2)", 2, 2, 4, 5, 3, 1, 3, {1, 1, 1, 1, true}},
    // Big enough for the Winograd path (winograd_applies): even, and odd planes (a tile past the edge)
    {"3x3, padding 1, 64 -> 64 on 12x12 (Winograd)", 2, 64, 12, 12, 64, 3, 3, {1, 1, 1, 1, true}},
    {"3x3, padding 1, 64 -> 72 on 13x11 (Winograd, odd plane)", 2, 64, 13, 11, 72, 3, 3, {1, 1, 1, 1, false}},
};

}  // namespace

TEST_CASE("Conv2d matches the direct 7-loop convolution, forward and backward", "[conv][cpu][lesson03]") {
    for (const Case& k : kCases) {
        SECTION(k.what) {
            Rng rng(7);
            Conv2d conv(k.C, k.O, k.KH, k.KW, rng, k.opt, "conv");
            Tensor x = Tensor::normal({k.N, k.C, k.H, k.W}, 0.0f, 1.0f, rng);
            Tensor y = conv.forward(x);
            const int64_t P = y.size(2), Q = y.size(3);
            Tensor y_ref = Tensor::zeros(y.shape());
            naive_forward(k, x.data<float>(), conv.weight.value.data<float>(),
                          k.opt.bias ? conv.bias.value.data<float>() : nullptr, y_ref.data<float>(), P, Q);
            CHECK(rel_diff(y.data<float>(), y_ref.data<float>(), y.numel()) < 1e-5);

            Tensor dy = Tensor::normal(y.shape(), 0.0f, 1.0f, rng);
            Tensor dx = conv.backward(dy);
            Tensor dx_ref = Tensor::zeros(x.shape()), dw_ref = Tensor::zeros(conv.weight.value.shape()),
                   db_ref = Tensor::zeros({k.O});
            naive_backward(k, x.data<float>(), conv.weight.value.data<float>(), dy.data<float>(),
                           dx_ref.data<float>(), dw_ref.data<float>(), db_ref.data<float>(), P, Q);
            CHECK(rel_diff(dx.data<float>(), dx_ref.data<float>(), dx.numel()) < 1e-5);
            CHECK(rel_diff(conv.weight.grad.data<float>(), dw_ref.data<float>(), dw_ref.numel()) < 1e-5);
            if (k.opt.bias) CHECK(rel_diff(conv.bias.grad.data<float>(), db_ref.data<float>(), k.O) < 1e-5);
        }
    }
}

TEST_CASE("Conv2d accumulates dw and db over backward calls", "[conv][cpu][lesson03]") {
    Rng rng(3);
    Conv2d conv(2, 3, 3, rng, {1, 1, 1, 1, true});
    Tensor x = Tensor::normal({2, 2, 5, 5}, 0.0f, 1.0f, rng);
    Tensor dy = Tensor::normal({2, 3, 5, 5}, 0.0f, 1.0f, rng);
    conv.forward(x);
    conv.backward(dy);
    Tensor dw1 = conv.weight.grad.clone(), db1 = conv.bias.grad.clone();
    conv.forward(x);
    conv.backward(dy);
    for (int64_t i = 0; i < dw1.numel(); i++)
        CHECK(conv.weight.grad.data<float>()[i] == Approx(2.0 * dw1.data<float>()[i]).margin(1e-6));
    for (int64_t i = 0; i < db1.numel(); i++)
        CHECK(conv.bias.grad.data<float>()[i] == Approx(2.0 * db1.data<float>()[i]).margin(1e-6));
}

namespace {

// One finite-difference check of Conv2d on `device`: the layer's weights from seed 11, then x ~ N(0, 1).
struct GradCase {
    const char* what;
    int64_t N, C, H, W, O, K;
    ConvOptions opt;
};

void check_conv_gradients(const GradCase& g, Device device) {
    Rng rng(11);
    Conv2d conv(g.C, g.O, g.K, rng, g.opt, "conv");
    conv.to(device);
    check_module_gradients(conv, Tensor::normal({g.N, g.C, g.H, g.W}, 0.0f, 1.0f, rng).to(device), 5);
}

}  // namespace

TEST_CASE("Conv2d gradients match finite differences", "[conv][cpu][lesson03][gradcheck]") {
    const GradCase cases[] = {
        {"stride 2, padding 1", 2, 2, 6, 5, 3, 3, {2, 1, 1, 1, true}},
        {"dilation 2", 1, 2, 7, 7, 2, 3, {1, 1, 2, 1, true}},
        {"groups 2", 2, 4, 5, 5, 4, 3, {1, 1, 1, 2, true}},
        {"depthwise", 2, 3, 5, 6, 3, 3, {1, 1, 1, 3, true}},
        {"1x1", 2, 3, 4, 4, 2, 1, {1, 0, 1, 1, true}},
        {"no bias, 5x5", 1, 1, 7, 7, 2, 5, {1, 0, 1, 1, false}},
    };
    for (const GradCase& g : cases) {
        SECTION(g.what) { check_conv_gradients(g, Device::CPU); }
    }
}

TEST_CASE("Conv2d with a tiny workspace (one or two images per chunk) gives the same bits", "[conv][cpu][lesson03]") {
    const int64_t N = 5, C = 4, H = 8, W = 8, O = 6;
    Rng rng(5);
    Tensor x = Tensor::normal({N, C, H, W}, 0.0f, 1.0f, rng);
    Tensor dy = Tensor::normal({N, O, H, W}, 0.0f, 1.0f, rng);
    auto run = [&](int64_t limit, Tensor& y, Tensor& dx, Tensor& dw, Tensor& db) {
        Rng init(9);  // the same weights each time
        Conv2d conv(C, O, 3, init, {1, 1, 1, 1, true});
        conv.workspace_limit = limit;
        y = conv.forward(x);
        dx = conv.backward(dy);
        dw = conv.weight.grad.clone();
        db = conv.bias.grad.clone();
    };
    Tensor y0, dx0, dw0, db0, y1, dx1, dw1, db1, y2, dx2, dw2, db2;
    run(kDefaultConvWorkspace, y0, dx0, dw0, db0);
    run(1, y1, dx1, dw1, db1);  // below one image: one image per chunk
    const int64_t per_image = C * 9 * H * W * int64_t(sizeof(float));
    run(2 * per_image, y2, dx2, dw2, db2);  // chunks of 2, 2, 1
    CHECK(same_bits(y0, y1));
    CHECK(same_bits(dx0, dx1));
    CHECK(same_bits(dw0, dw1));
    CHECK(same_bits(db0, db1));
    CHECK(same_bits(y0, y2));
    CHECK(same_bits(dx0, dx2));
    CHECK(same_bits(dw0, dw2));
}

TEST_CASE("Conv2d gives the same bits on 1 and 2 threads", "[conv][cpu][lesson03][threads]") {
    struct T { const char* what; int64_t C, O, K; ConvOptions opt; };
    const T cases[] = {
        {"3x3 im2col", 16, 32, 3, {1, 1, 1, 1, true}},
        {"3x3 im2col, dw too big for slices: bands", 64, 512, 3, {1, 1, 1, 1, true}},
        {"1x1", 32, 32, 1, {1, 0, 1, 1, true}},
        {"depthwise", 16, 16, 3, {1, 1, 1, 16, true}},
        {"groups 2, stride 2", 16, 16, 3, {2, 1, 1, 2, true}},
    };
    const int saved = omp_get_max_threads();
    for (const T& t : cases) {
        SECTION(t.what) {
            Rng rng(2);
            Tensor x = Tensor::normal({8, t.C, 16, 16}, 0.0f, 1.0f, rng);
            Tensor y[2], dx[2], dw[2], db[2];
            for (int threads = 1; threads <= 2; threads++) {
                omp_set_num_threads(threads);
                Rng init(4);
                Conv2d conv(t.C, t.O, t.K, init, t.opt);
                conv.workspace_limit = 3 << 20;  // several chunks
                Tensor out = conv.forward(x);
                Rng grad_rng(8);
                Tensor g = Tensor::normal(out.shape(), 0.0f, 1.0f, grad_rng);
                y[threads - 1] = out;
                dx[threads - 1] = conv.backward(g);
                dw[threads - 1] = conv.weight.grad.clone();
                db[threads - 1] = conv.bias.grad.clone();
            }
            omp_set_num_threads(saved);
            CHECK(same_bits(y[0], y[1]));
            CHECK(same_bits(dx[0], dx[1]));
            CHECK(same_bits(dw[0], dw[1]));
            CHECK(same_bits(db[0], db[1]));
        }
    }
    omp_set_num_threads(saved);
}

TEST_CASE("Conv2d errors name the layer and the shapes", "[conv][cpu][lesson03]") {
    Rng rng(1);
    Conv2d conv(3, 4, 3, rng, {}, "conv1");
    using Catch::Matchers::Contains;
    REQUIRE_THROWS_AS(conv.forward(Tensor::zeros({2, 5, 8, 8})), Error);
    REQUIRE_THROWS_WITH(conv.forward(Tensor::zeros({2, 5, 8, 8})), Contains("conv1") && Contains("[2, 5, 8, 8]"));
    REQUIRE_THROWS_WITH(conv.forward(Tensor::zeros({3, 8, 8})), Contains("conv1") && Contains("[3, 8, 8]"));
    REQUIRE_THROWS_WITH(conv.forward(Tensor::zeros({1, 3, 2, 2})), Contains("conv1") && Contains("does not fit"));
    REQUIRE_THROWS_WITH(conv.backward(Tensor::zeros({2, 4, 6, 6})), Contains("conv1") && Contains("backward"));
    conv.forward(Tensor::zeros({2, 3, 8, 8}));
    REQUIRE_THROWS_WITH(conv.backward(Tensor::zeros({2, 4, 5, 5})), Contains("conv1") && Contains("[2, 4, 6, 6]"));
    REQUIRE_THROWS_WITH(Conv2d(4, 6, 3, rng, {1, 0, 1, 4, true}, "conv2"), Contains("conv2") && Contains("groups"));
}

// ---- Short rows (short_rows.h) ----------------------------------------------------------------
template <typename T>
void check_copy_short_rows() {
    for (int64_t n = 0; n <= 40; n++)
        for (int64_t rows : {1, 3}) {
            INFO("element size " << sizeof(T) << ", rows " << rows << ", n " << n);
            const int64_t ld_src = n + 5, ld_dst = n + 3;  // rows apart, with gaps between them
            std::vector<T> src(size_t(rows * ld_src)), dst(size_t(rows * ld_dst + 1));
            for (size_t i = 0; i < src.size(); i++) std::memset(&src[i], int(i % 251) + 1, sizeof(T));
            std::memset(dst.data(), 0, dst.size() * sizeof(T));
            cpu::copy_short_rows(dst.data(), ld_dst, src.data(), ld_src, rows, n);
            int64_t wrong = 0;  // each copied element equal, every other one of dst still 0
            for (int64_t r = 0; r < rows; r++)
                for (int64_t i = 0; i < ld_dst; i++) {
                    const T* d = &dst[size_t(r * ld_dst + i)];
                    if (i < n) wrong += std::memcmp(d, &src[size_t(r * ld_src + i)], sizeof(T)) != 0;
                    else wrong += std::memcmp(d, &dst.back(), sizeof(T)) != 0;
                }
            CHECK(wrong == 0);
        }
}

TEST_CASE("copy_short_rows copies each row exactly, at every width, and nothing else", "[conv][cpu][lesson03]") {
    check_copy_short_rows<uint8_t>();  // int8 im2col (chapter 11)
    check_copy_short_rows<f16>();
    check_copy_short_rows<float>();
    check_copy_short_rows<double>();
}

// ---- Winograd F(4x4, 3x3) and F(2x2, 3x3) ------------------------------------------------------
namespace {

Conv2dParams same_3x3(int64_t N, int64_t C, int64_t H, int64_t W, int64_t O) {
    Conv2dParams p;
    p.N = N, p.C = C, p.H = H, p.W = W, p.O = O, p.KH = p.KW = 3, p.padding = 1;
    return p;
}

}  // namespace

TEST_CASE("Winograd is chosen for big 3x3 stride-1 f32 convolutions only", "[conv][cpu][lesson03][winograd]") {
    cpu::set_winograd_choice(cpu::WinogradChoice::Auto);  // the default, whatever KILN_CONV says
    const Conv2dParams big = same_3x3(8, 64, 15, 15, 64);  // C·O·H·W = 921,600
    CHECK(cpu::winograd_applies(big));
    CHECK(cpu::conv2d_algo(big, DType::F32) == ConvAlgo::Winograd);
    CHECK(cpu::conv2d_algo(big, DType::BF16) == ConvAlgo::Im2col);  // f16 and bf16 keep im2col
    CHECK(std::string(conv_algo_name(ConvAlgo::Winograd)) == "winograd");
    CHECK(cpu::conv2d_col_elems_per_image(big, DType::F32) == cpu::winograd_elems_per_image(big));
    CHECK(cpu::winograd_tile() == 4);
    CHECK(cpu::winograd_elems_per_image(big) == 36 * (16 * (64 + 64) + 2 * 16));  // 4×4 tiles of 6×6, + the skew
    auto changed = [&](auto edit) {
        Conv2dParams p = big;
        edit(p);
        return cpu::winograd_applies(p);
    };
    CHECK_FALSE(changed([](Conv2dParams& p) { p.stride = 2; }));
    CHECK_FALSE(changed([](Conv2dParams& p) { p.padding = 0; }));
    CHECK_FALSE(changed([](Conv2dParams& p) { p.dilation = 2, p.padding = 2; }));
    CHECK_FALSE(changed([](Conv2dParams& p) { p.KH = p.KW = 5, p.padding = 2; }));
    CHECK_FALSE(changed([](Conv2dParams& p) { p.groups = 2; }));
    CHECK_FALSE(changed([](Conv2dParams& p) { p.C = 32; }));                  // too few channels
    CHECK_FALSE(changed([](Conv2dParams& p) { p.H = p.W = 7; }));             // 64·64·49: too little work
    CHECK(changed([](Conv2dParams& p) { p.C = p.O = 128, p.H = p.W = 7; }));  // 128·128·49 is enough
    CHECK_FALSE(changed([](Conv2dParams& p) { p.C = p.O = 256, p.H = p.W = 3; }));  // a plane of 4 tiles

    const Conv2dParams small = same_3x3(8, 16, 8, 8, 16);
    CHECK(cpu::conv2d_algo(small, DType::F32) == ConvAlgo::Im2col);
    cpu::set_winograd_choice(cpu::WinogradChoice::Never);  // as KILN_CONV=im2col
    CHECK(cpu::conv2d_algo(big, DType::F32) == ConvAlgo::Im2col);
    cpu::set_winograd_choice(cpu::WinogradChoice::Always2x2);  // as KILN_CONV=winograd2x2
    CHECK(cpu::conv2d_algo(small, DType::F32) == ConvAlgo::Winograd);
    CHECK(cpu::winograd_tile() == 2);
    CHECK(cpu::winograd_elems_per_image(big) == 16 * (64 * (64 + 64) + 2 * 16));  // 8×8 tiles of 4×4, + the skew
    cpu::set_winograd_choice(cpu::WinogradChoice::Always);  // as KILN_CONV=winograd
    CHECK(cpu::conv2d_algo(small, DType::F32) == ConvAlgo::Winograd);
    CHECK(cpu::winograd_tile() == 4);
    CHECK(cpu::conv2d_algo(same_3x3(8, 16, 8, 8, 16), DType::F16) == ConvAlgo::Im2col);
    Conv2dParams strided = small;
    strided.stride = 2;
    CHECK(cpu::conv2d_algo(strided, DType::F32) == ConvAlgo::Im2col);  // it cannot
    cpu::set_winograd_choice(cpu::WinogradChoice::Auto);

    CHECK(cpu::parse_winograd_choice("im2col", "KILN_CONV") == cpu::WinogradChoice::Never);
    CHECK(cpu::parse_winograd_choice("winograd", "KILN_CONV") == cpu::WinogradChoice::Always);
    CHECK(cpu::parse_winograd_choice("winograd2x2", "KILN_CONV") == cpu::WinogradChoice::Always2x2);
    CHECK(cpu::parse_winograd_choice("", "KILN_CONV") == cpu::WinogradChoice::Auto);
    using Catch::Matchers::Contains;
    CHECK_THROWS_WITH(cpu::parse_winograd_choice("fast", "KILN_CONV"),
                      Contains("KILN_CONV=fast") && Contains("auto") && Contains("im2col") && Contains("winograd") &&
                          Contains("winograd2x2"));
}

TEST_CASE("Winograd passes match the direct convolution on small and odd planes", "[conv][cpu][lesson03][winograd]") {
    // Called directly (below the speed bounds of winograd_applies, which only choose it), with
    // each tile size. The transforms round: F(2×2, 3×3)'s by a few units of f32's last place,
    // F(4×4, 3×3)'s by about 10 times more (its matrices multiply by up to 8 and divide by 24;
    // 1e-6 to 1.3e-5 of the largest output against im2col for 4 to 256 channels). With F(4×4)
    // the planes of a run of images are stacked when 4 does not divide H, else taken one by one.
    const Case cases[] = {
        {"4x4 (H = 4: F(4x4) one image at a time)", 3, 2, 4, 4, 3, 3, 3, {1, 1, 1, 1, true}},
        {"7x5 (odd: tiles past both edges)", 2, 3, 7, 5, 4, 3, 3, {1, 1, 1, 1, true}},
        {"1x1 plane", 2, 2, 1, 1, 2, 3, 3, {1, 1, 1, 1, false}},
        {"2x9, 17 images (groups of 8, 8, 1 with 2x2 tiles; stacked, 3 tiles each, with 4x4)", 17, 4, 2, 9, 5, 3, 3,
         {1, 1, 1, 1, true}},
        {"7x7, 40 images (4x4 tiles: 4 a plane, runs of 16 stacked images)", 40, 2, 7, 7, 3, 3, 3, {1, 1, 1, 1, true}},
        // Rows of tiles inside the plane copied in blocks of 8 (for_blocks): exactly one, and two that overlap
        {"5x19 (2x2 tiles: 8 a row inside, one block)", 1, 2, 5, 19, 3, 3, 3, {1, 1, 1, 1, false}},
        {"3x31 (2x2 tiles: 14 a row inside, two blocks, overlapping)", 2, 3, 3, 31, 4, 3, 3, {1, 1, 1, 1, true}},
        {"2x37 (4x4 tiles: 8 a row inside, one block)", 2, 2, 2, 37, 3, 3, 3, {1, 1, 1, 1, false}},
        {"6x63 (4x4 tiles: 14 a row inside, two blocks, overlapping)", 2, 3, 6, 63, 2, 3, 3, {1, 1, 1, 1, true}},
    };
    struct Tiles {
        cpu::WinogradChoice choice;
        double tolerance;
    };
    for (const Tiles tiles : {Tiles{cpu::WinogradChoice::Always2x2, 1e-5}, Tiles{cpu::WinogradChoice::Always, 5e-5}}) {
        cpu::set_winograd_choice(tiles.choice);
        const int64_t m = cpu::winograd_tile();
        for (const Case& k : cases) {
            SECTION(k.what + std::string(m == 2 ? ", F(2x2, 3x3)" : ", F(4x4, 3x3)")) {
                const Conv2dParams p = same_3x3(k.N, k.C, k.H, k.W, k.O);
                Rng rng(13);
                Tensor x = Tensor::normal({k.N, k.C, k.H, k.W}, 0, 1, rng), w = Tensor::normal({k.O, k.C, 3, 3}, 0, 1, rng);
                Tensor b = Tensor::normal({k.O}, 0, 1, rng), dy = Tensor::normal({k.N, k.O, k.H, k.W}, 0, 1, rng);
                Tensor y = Tensor::empty(dy.shape()), dx = Tensor::empty(x.shape());
                Tensor dw = Tensor::normal(w.shape(), 0, 1, rng);
                const Tensor dw0 = dw.clone();
                std::vector<float> ws(size_t(k.N * cpu::winograd_elems_per_image(p)));
                const float* bias = k.opt.bias ? b.data<float>() : nullptr;
                cpu::winograd_forward(x.data<float>(), w.data<float>(), bias, y.data<float>(), p, ws.data(), k.N);
                cpu::winograd_backward_data(dy.data<float>(), w.data<float>(), dx.data<float>(), p, ws.data(), k.N);
                cpu::winograd_backward_weight(x.data<float>(), dy.data<float>(), dw.data<float>(), p, ws.data(), k.N);

                Tensor y_ref = Tensor::zeros(y.shape()), dx_ref = Tensor::zeros(x.shape());
                Tensor dw_ref = Tensor::zeros(w.shape()), db_ref = Tensor::zeros({k.O});
                naive_forward(k, x.data<float>(), w.data<float>(), bias, y_ref.data<float>(), k.H, k.W);
                naive_backward(k, x.data<float>(), w.data<float>(), dy.data<float>(), dx_ref.data<float>(),
                               dw_ref.data<float>(), db_ref.data<float>(), k.H, k.W);
                for (int64_t i = 0; i < dw_ref.numel(); i++) dw_ref.data<float>()[i] += dw0.data<float>()[i];  // dw +=
                CHECK(rel_diff(y.data<float>(), y_ref.data<float>(), y.numel()) < tiles.tolerance);
                CHECK(rel_diff(dx.data<float>(), dx_ref.data<float>(), dx.numel()) < tiles.tolerance);
                CHECK(rel_diff(dw.data<float>(), dw_ref.data<float>(), dw.numel()) < tiles.tolerance);
            }
        }
    }
    cpu::set_winograd_choice(cpu::WinogradChoice::Auto);
}

TEST_CASE("Winograd gives the same bits whatever the workspace and the threads",
          "[conv][cpu][lesson03][winograd][threads]") {
    // 21×21 planes: 6×6 = 36 tiles of 4×4 outputs, so groups of ⌈256/36⌉ = 8 images; 20 images are
    // groups of 8, 8 and 4, each transformed in runs of 2 stacked images (72 tiles)
    const int64_t N = 20, C = 64, H = 21, O = 64;
    cpu::set_winograd_choice(cpu::WinogradChoice::Auto);  // whatever KILN_CONV says
    REQUIRE(cpu::conv2d_algo(same_3x3(N, C, H, H, O), DType::F32) == ConvAlgo::Winograd);
    Rng rng(6);
    Tensor x = Tensor::normal({N, C, H, H}, 0, 1, rng), dy = Tensor::normal({N, O, H, H}, 0, 1, rng);
    struct Run {
        Tensor y, dx, dw;
    };
    auto run = [&](int64_t limit, int threads) {
        const int saved = omp_get_max_threads();
        omp_set_num_threads(threads);
        Rng init(9);
        Conv2d conv(C, O, 3, init, {1, 1, 1, 1, false});
        conv.workspace_limit = limit;
        Run r;
        r.y = conv.forward(x);
        r.dx = conv.backward(dy);
        r.dw = conv.weight.grad.clone();
        omp_set_num_threads(saved);
        return r;
    };
    const int64_t per_image = cpu::winograd_elems_per_image(same_3x3(N, C, H, H, O)) * int64_t(sizeof(float));
    const Run whole = run(kDefaultConvWorkspace, 2);                     // the batch in one chunk
    const Run chunks = run(1, 2);                                        // below one group: chunks of one group
    const Run two_groups = run(19 * per_image, 2);                       // 19 images fit: chunks of 16 and 4
    const Run one_thread = run(19 * per_image, 1);
    for (const Run* r : {&chunks, &two_groups, &one_thread}) {
        CHECK(same_bits(r->y, whole.y));
        CHECK(same_bits(r->dx, whole.dx));
        CHECK(same_bits(r->dw, whole.dw));
    }
    // The chunks conv2d_workspace asks for: whole groups (or the batch)
    Conv2dParams p = same_3x3(N, C, H, H, O);
    CHECK(conv2d_workspace(p, Device::CPU, true, 1).images == 8);
    CHECK(conv2d_workspace(p, Device::CPU, true, 19 * per_image).images == 16);
    CHECK(conv2d_workspace(p, Device::CPU, true, kDefaultConvWorkspace).images == N);
}

TEST_CASE("Winograd and im2col agree, and KILN_CONV=im2col switches Winograd off", "[conv][cpu][lesson03][winograd]") {
    Rng rng(21);
    Tensor x = Tensor::normal({3, 64, 12, 12}, 0, 1, rng), dy = Tensor::normal({3, 64, 12, 12}, 0, 1, rng);  // F(4×4)
    Tensor y[2], dx[2], dw[2];
    for (int winograd = 0; winograd < 2; winograd++) {
        cpu::set_winograd_choice(winograd ? cpu::WinogradChoice::Auto : cpu::WinogradChoice::Never);
        Rng init(2);
        Conv2d conv(64, 64, 3, init, {1, 1, 1, 1, true});
        y[winograd] = conv.forward(x);
        dx[winograd] = conv.backward(dy);
        dw[winograd] = conv.weight.grad.clone();
    }
    cpu::set_winograd_choice(cpu::WinogradChoice::Auto);
    CHECK(rel_diff(y[1].data<float>(), y[0].data<float>(), y[0].numel()) < 5e-5);
    CHECK(rel_diff(dx[1].data<float>(), dx[0].data<float>(), dx[0].numel()) < 5e-5);
    CHECK(rel_diff(dw[1].data<float>(), dw[0].data<float>(), dw[0].numel()) < 5e-5);
    CHECK_FALSE(same_bits(y[0], y[1]));  // two different computations (so both really ran)
}

TEST_CASE("Winograd without a workspace is an error naming the pass", "[conv][cpu][lesson03][winograd]") {
    const Conv2dParams p = same_3x3(2, 64, 12, 12, 64);
    std::vector<float> x(size_t(2 * 64 * 144)), w(size_t(64 * 64 * 9)), y(x.size());
    using Catch::Matchers::Contains;
    REQUIRE_THROWS_WITH(cpu::conv2d_forward<float>(x.data(), w.data(), nullptr, y.data(), p, nullptr, 0),
                        Contains("winograd_forward") && Contains("workspace"));
}

TEST_CASE("depthwise conv2d gives the bits of the textbook loops, taps in (kh, kw) order", "[conv][cpu][depthwise][lesson13]") {
    // The kernels run stride 1 as one loop per tap over rows as wide as the padded plane (conv.cpp,
    // taps_flat), other strides row by row; either way each output must see the same operations in
    // the same order as these loops:
    //   y[p, q] = b; y += w[kh, kw] · x_padded[p·s + kh·d, q·s + kw·d]   for kh, then kw
    //   dx_padded[p·s + kh·d, q·s + kw·d] += w[kh, kw] · dy[p, q]   for kh, kw, then p, q; cropped
    // dy holds exact zeros of both signs, as after a ReLU6.
    struct S { int64_t N, C, H, W, K, stride, pad, dil; };
    const S shapes[] = {{2, 5, 8, 8, 3, 1, 1, 1}, {2, 4, 4, 4, 3, 1, 1, 1}, {1, 3, 7, 9, 5, 1, 2, 1},
                        {2, 3, 9, 9, 3, 1, 2, 2}, {2, 3, 8, 7, 3, 1, 0, 1}, {2, 4, 9, 8, 3, 2, 1, 1}};
    for (const S& sh : shapes) {
        Conv2dParams p;
        p.N = sh.N, p.C = p.O = p.groups = sh.C, p.H = sh.H, p.W = sh.W, p.KH = p.KW = sh.K;
        p.stride = sh.stride, p.padding = sh.pad, p.dilation = sh.dil;
        const int64_t P = p.P(), Q = p.Q(), Hp = p.H + 2 * p.padding, Wp = p.W + 2 * p.padding;
        INFO(p.H << "×" << p.W << " k" << p.KH << " stride " << p.stride << " pad " << p.padding << " dil " << p.dilation);
        Rng rng(3);
        const Tensor x = Tensor::normal({p.N, p.C, p.H, p.W}, 0.0f, 1.0f, rng);
        const Tensor w = Tensor::normal({p.C, 1, p.KH, p.KW}, 0.0f, 1.0f, rng);
        const Tensor b = Tensor::normal({p.C}, 0.0f, 1.0f, rng);
        Tensor dy = Tensor::normal({p.N, p.C, P, Q}, 0.0f, 1.0f, rng);
        for (int64_t i = 0; i < dy.numel(); i += 3) dy.data<float>()[i] = i % 2 ? 0.0f : -0.0f;
        Tensor y = Tensor::zeros({p.N, p.C, P, Q}), dx = Tensor::zeros({p.N, p.C, p.H, p.W});
        cpu::conv2d_forward<float>(x.data<float>(), w.data<float>(), b.data<float>(), y.data<float>(), p, nullptr, 0);
        cpu::conv2d_backward_data<float>(dy.data<float>(), w.data<float>(), dx.data<float>(), p, nullptr, 0);
        Tensor y_ref = Tensor::zeros(y.shape()), dx_ref = Tensor::zeros(dx.shape());
        for (int64_t nc = 0; nc < p.N * p.C; nc++) {
            const int64_t c = nc % p.C;
            const float* xp = x.data<float>() + nc * p.H * p.W;
            const float* wc = w.data<float>() + c * p.KH * p.KW;
            std::vector<float> xpad(size_t(Hp * Wp), 0.0f), dxpad(size_t(Hp * Wp), 0.0f);
            for (int64_t h = 0; h < p.H; h++)
                for (int64_t v = 0; v < p.W; v++) xpad[size_t((h + p.padding) * Wp + v + p.padding)] = xp[h * p.W + v];
            float* yr = y_ref.data<float>() + nc * P * Q;
            const float* dyr = dy.data<float>() + nc * P * Q;
            for (int64_t i = 0; i < P * Q; i++) yr[i] = b.data<float>()[c];
            for (int64_t kh = 0; kh < p.KH; kh++)
                for (int64_t kw = 0; kw < p.KW; kw++) {
                    const float wv = wc[kh * p.KW + kw];
                    for (int64_t op = 0; op < P; op++)
                        for (int64_t q = 0; q < Q; q++) {
                            const int64_t at = (op * p.stride + kh * p.dilation) * Wp + q * p.stride + kw * p.dilation;
                            yr[op * Q + q] += wv * xpad[size_t(at)];
                            dxpad[size_t(at)] += wv * dyr[op * Q + q];
                        }
                }
            for (int64_t h = 0; h < p.H; h++)
                for (int64_t v = 0; v < p.W; v++)
                    dx_ref.data<float>()[nc * p.H * p.W + h * p.W + v] = dxpad[size_t((h + p.padding) * Wp + v + p.padding)];
        }
        CHECK(same_bits(y, y_ref));
        CHECK(same_bits(dx, dx_ref));
    }
}

// The bias gradient's bits, pinned to the order its comment states (bias_grad, ops/cpu/conv.cpp):
// for each image, a float sum of its plane dy[n, o, :] in order; those added into a double in
// image order; db[o] = T(float(db[o]) + float(that)). Chapter 09's exercise 7 reads the f16 planes
// another way and must leave every bit as it was: so must any rewrite (an order of additions
// that differs anywhere changes some bit of some channel here).
TEST_CASE("conv2d_backward's db: the bits of its stated order, f32, f16 and bf16", "[conv][lowp][cpu][lesson03]") {
    const int64_t N = 11, C = 3, O = 5, H = 9, W = 9, K = 3;  // 8 images side by side, then 3 alone
    for (DType t : {DType::F32, DType::F16, DType::BF16}) {
        INFO(dtype_name(t));
        Rng rng(5);
        const Tensor x = Tensor::normal({N, C, H, W}, 0.0f, 1.0f, rng).to(t);
        const Tensor w = Tensor::normal({O, C, K, K}, 0.0f, 0.3f, rng).to(t);
        const Tensor dy = Tensor::normal({N, O, H - K + 1, W - K + 1}, 0.0f, 1.0f, rng).to(t);
        Tensor dw = Tensor::zeros(w.shape()).to(t), db = Tensor::zeros({O}).to(t);
        conv2d_backward(x, w, dy, dw, db, false, Conv2dArgs{});
        const Tensor dy32 = dy.to(DType::F32), got = db.to(DType::F32);
        const int64_t PQ = dy.numel() / (N * O);
        for (int64_t o = 0; o < O; o++) {
            double acc = 0.0;
            for (int64_t n = 0; n < N; n++) {
                float part = 0.0f;
                for (int64_t i = 0; i < PQ; i++) part += dy32.data<float>()[(n * O + o) * PQ + i];
                acc += part;
            }
            const Tensor want = Tensor::full({1}, double(float(acc))).to(t).to(DType::F32);  // T(0 + float(acc))
            INFO("channel " << o);
            CHECK(std::memcmp(got.data<float>() + o, want.data<float>(), sizeof(float)) == 0);
        }
    }
}

// ---- on CUDA (cuda/conv.cu, chapter 05) against the CPU -------------------------------------------
// Every pass and both forward strategies on small random shapes that cover each option, the layer
// on the cuda device, finite differences there, and the same-device error; then the direct
// depthwise kernels (groups == C == O) in f32, f16 and bf16, and on a hand-computed channel.
// Without a GPU the kernels run on kiln's emulator under three schedules (fixtures.h
// under_schedules), and their results must be bit-identical: nothing in cuda/conv.cu may depend on
// the order threads run in. Tolerance: the GPU adds the products of a sum in another order than the
// CPU (GEMM tiles, bias added last), so each value may be off by a few ulps of the largest partial
// sums: |got − want| ≤ 1e-5 · max |want| over the whole tensor.
namespace {

constexpr double kRelTol = 1e-5;  // relative to the largest |value| of the tensor (see above)

void require_close(const Tensor& got, const Tensor& want) { test::require_close(got, want, kRelTol); }

struct CudaCase {
    const char* what;
    int64_t N, C, H, W, O, KH, KW, stride, padding, dilation, groups;
    bool bias;
    int64_t col_images;  // images per workspace chunk on the GPU (< N: several chunks)
};

Conv2dParams params_of(const CudaCase& k) {
    Conv2dParams p;
    p.N = k.N, p.C = k.C, p.H = k.H, p.W = k.W, p.O = k.O, p.KH = k.KH, p.KW = k.KW;
    p.stride = k.stride, p.padding = k.padding, p.dilation = k.dilation, p.groups = k.groups;
    return p;
}

// The shapes: odd sizes everywhere; Kc = Cg·KH·KW below, at and above the kernels' 8-, 16- and
// 32-wide k steps; N·P·Q over one 64- or 128-column tile; products of at most 16 rows (the 16×128
// tiles), more (64×64), and enough 128×128 tiles for the big shape (two per SM: on the emulator
// an SM is one of its OpenMP threads, and these shapes assume at most 2); a dw sum long enough
// to be split into slices (N·P·Q ≥ 4·256 over one small tile).
const CudaCase kCudaCases[] = {
    // what                                  N  C   H   W   O KH KW  s  pad d  G  bias  col_images
    {"3x3, padding 1, 2 images per chunk", 3, 3, 7, 9, 5, 3, 3, 1, 1, 1, 1, true, 2},
    {"stride 2, groups 2, 3x2 kernel", 2, 4, 9, 8, 6, 3, 2, 2, 0, 1, 2, true, 1},
    {"batch 1, dilation 2, padding 2, no bias", 1, 3, 11, 10, 4, 3, 3, 1, 2, 2, 1, false, 1},
    {"depthwise 3x3", 2, 6, 6, 7, 6, 3, 3, 1, 1, 1, 6, true, 2},
    {"1x1, O = 70 (im2col by default)", 2, 5, 5, 5, 70, 1, 1, 1, 0, 1, 1, true, 2},
    {"5x5 stride 2, O = 20 (64x64 tiles)", 3, 2, 13, 12, 20, 5, 5, 2, 2, 1, 1, true, 3},
    {"stride 3, dilation 2, groups 3, 2x3 kernel", 2, 6, 10, 11, 9, 2, 3, 3, 1, 2, 3, true, 1},
    {"O = 130: the forward on 128x128 tiles", 2, 5, 12, 12, 130, 3, 3, 1, 1, 1, 1, true, 2},
    {"C = 130: dx on 128x128 tiles", 2, 130, 10, 10, 24, 3, 3, 1, 1, 1, 1, false, 1},
    {"a long dw sum, split in slices", 4, 3, 16, 16, 8, 3, 3, 1, 1, 1, 1, true, 4},
};

using ForwardFn = void (*)(const float*, const float*, const float*, float*, const Conv2dParams&, float*,
                           int64_t);
using DataFn = void (*)(const float*, const float*, float*, const Conv2dParams&, float*, int64_t);
using WeightFn = void (*)(const float*, const float*, float*, float*, const Conv2dParams&, float*, int64_t);

}  // namespace

TEST_CASE("cuda conv2d: every strategy of each pass matches the CPU", "[conv][cuda][lesson05]") {
    Rng rng(41);
    for (const CudaCase& k : kCudaCases) {
        SECTION(k.what) {
            const Conv2dParams p = params_of(k);
            const int64_t P = p.P(), Q = p.Q();
            Tensor x = Tensor::uniform({k.N, k.C, k.H, k.W}, -1, 1, rng);
            Tensor w = Tensor::uniform({k.O, k.C / k.groups, k.KH, k.KW}, -1, 1, rng);
            Tensor b = Tensor::uniform({k.O}, -1, 1, rng), dy = Tensor::uniform({k.N, k.O, P, Q}, -1, 1, rng);
            Tensor dw0 = Tensor::uniform(w.shape(), -1, 1, rng), db0 = Tensor::uniform({k.O}, -1, 1, rng);

            // The CPU: y, dx, and dw, db accumulated onto dw0, db0.
            Tensor cpu_col = Tensor::empty({std::max<int64_t>(1, k.N * cpu::conv2d_col_elems_per_image(p, DType::F32))});
            Tensor y = Tensor::empty({k.N, k.O, P, Q}), dx = Tensor::empty(x.shape());
            Tensor dw = dw0.clone(), db = db0.clone();
            const float* bias = k.bias ? b.data<float>() : nullptr;
            cpu::conv2d_forward(x.data<float>(), w.data<float>(), bias, y.data<float>(), p, cpu_col.data<float>(), k.N);
            cpu::conv2d_backward_data(dy.data<float>(), w.data<float>(), dx.data<float>(), p, cpu_col.data<float>(),
                                      k.N);
            cpu::conv2d_backward_weight(x.data<float>(), dy.data<float>(), dw.data<float>(),
                                        k.bias ? db.data<float>() : nullptr, p, cpu_col.data<float>(), k.N);

            // The GPU, with a workspace of col_images images.
            Tensor gx = x.to(Device::CUDA), gw = w.to(Device::CUDA), gb = b.to(Device::CUDA), gdy = dy.to(Device::CUDA);
            Tensor col = Tensor::empty({k.col_images * cuda::conv2d_col_elems_per_image(p)}, DType::F32, Device::CUDA);
            const float* gbias = k.bias ? gb.data<float>() : nullptr;
            const Tensor nan = Tensor::full(y.shape(), std::numeric_limits<double>::quiet_NaN());
            const Tensor nan_dx = Tensor::full(x.shape(), std::numeric_limits<double>::quiet_NaN());
            std::vector<Tensor> first;  // the first schedule's results: the second must give the same bits
            under_schedules([&] {
                std::vector<Tensor> got;
                const std::pair<const char*, ForwardFn> strategies[] = {
                    {"im2col", cuda::conv2d_forward_im2col<float>},
                    {"implicit GEMM", cuda::conv2d_forward_implicit_gemm<float>},
                    {"conv2d_forward (by conv2d_algo)", cuda::conv2d_forward<float>},
                };
                for (auto [name, forward] : strategies) {
                    INFO("forward: " << name);
                    Tensor gy = nan.to(Device::CUDA);  // every element must be written
                    forward(gx.data<float>(), gw.data<float>(), gbias, gy.data<float>(), p, col.data<float>(),
                            k.col_images);
                    require_close(gy, y);
                    got.push_back(gy);
                }
                // Each output adds its products in the order k = 0, 1, ... and then the bias in
                // all three (the engine's tile moves data differently, not arithmetic): one set of
                // bits. (A depthwise shape's engine forward is the direct kernel: bias first.)
                INFO("the forward strategies give the same bits");
                require_identical(got[1], got[0]);
                if (cuda::conv2d_algo(p) == ConvAlgo::ImplicitGemm) require_identical(got[2], got[0]);
                const std::pair<const char*, DataFn> data_passes[] = {
                    {"im2col", cuda::conv2d_backward_data_im2col<float>},
                    {"conv2d_backward_data (the engine's)", cuda::conv2d_backward_data<float>},
                };
                for (auto [name, backward_data] : data_passes) {
                    INFO("backward dx: " << name);
                    Tensor gdx = nan_dx.to(Device::CUDA);  // dx is overwritten, never read
                    backward_data(gdy.data<float>(), gw.data<float>(), gdx.data<float>(), p, col.data<float>(),
                                  k.col_images);
                    require_close(gdx, dx);
                    got.push_back(gdx);
                }
                const std::pair<const char*, WeightFn> weight_passes[] = {
                    {"im2col", cuda::conv2d_backward_weight_im2col<float>},
                    {"conv2d_backward_weight (the engine's)", cuda::conv2d_backward_weight<float>},
                };
                for (auto [name, backward_weight] : weight_passes) {
                    INFO("backward dw and db: " << name);
                    Tensor gdw = dw0.to(Device::CUDA), gdb = db0.to(Device::CUDA);  // dw and db accumulate
                    backward_weight(gx.data<float>(), gdy.data<float>(), gdw.data<float>(),
                                    k.bias ? gdb.data<float>() : nullptr, p, col.data<float>(), k.col_images);
                    require_close(gdw, dw);
                    require_close(gdb, db);  // without a bias, db0 untouched on both
                    got.insert(got.end(), {gdw, gdb});
                }
                if (first.empty()) first = got;
                for (size_t i = 0; i < got.size(); i++) require_identical(got[i], first[i]);
            });
        }
    }
}

TEST_CASE("cuda conv2d_algo: the implicit GEMMs for every shape but depthwise, which needs no workspace",
          "[conv][cuda][lesson05]") {
    Conv2dParams p;
    p.C = 10, p.O = 20, p.KH = p.KW = 5, p.H = p.W = 12;  // LeNet's second convolution
    REQUIRE(cuda::conv2d_algo(p) == ConvAlgo::ImplicitGemm);
    p.C = 64, p.O = 256, p.KH = p.KW = 3;  // the capstone's widths
    REQUIRE(cuda::conv2d_algo(p) == ConvAlgo::ImplicitGemm);
    p.groups = 2;
    REQUIRE(cuda::conv2d_algo(p) == ConvAlgo::ImplicitGemm);
    REQUIRE(std::string(conv_algo_name(ConvAlgo::ImplicitGemm)) == "implicit-gemm");
    // The engine's passes take no column workspace; the lab's im2col strategies still size theirs.
    REQUIRE(conv2d_workspace(p, Device::CUDA, true, kDefaultConvWorkspace).bytes() == 0);
    REQUIRE(conv2d_workspace(p, Device::CUDA, false, kDefaultConvWorkspace).bytes() == 0);
    REQUIRE(cuda::conv2d_col_elems_per_image(p) == (64 * 9 + 256) * 10 * 10);  // (C·K·K + O)·P·Q
    p.O = 64, p.groups = 64;  // one filter per channel: the direct kernels
    REQUIRE(cuda::conv2d_algo(p) == ConvAlgo::Depthwise);
}

TEST_CASE("cuda Conv2d layer matches the CPU layer, with a workspace of one image", "[conv][cuda][lesson05]") {
    // O = 8 (16×128 tiles) and O = 64 (64×64 tiles); a 1-image workspace limit, which the engine's
    // implicit GEMMs do not need.
    for (int64_t O : {int64_t(8), int64_t(64)}) {
        INFO("O = " << O);
        Rng rng(43), rng2(43);
        const ConvOptions opt{2, 1, 1, 1, true};
        Conv2d cpu_conv(3, O, 3, rng, opt, "conv"), gpu_conv(3, O, 3, rng2, opt, "conv");
        gpu_conv.to(Device::CUDA);
        gpu_conv.workspace_limit = 1;  // one image per chunk
        Tensor x = Tensor::uniform({3, 3, 9, 8}, -1, 1, rng);
        Tensor y = cpu_conv.forward(x);
        Tensor dy = Tensor::uniform(y.shape(), -1, 1, rng);
        Tensor dx = cpu_conv.backward(dy);
        Tensor gy = gpu_conv.forward(x.to(Device::CUDA));
        REQUIRE(gy.device() == Device::CUDA);
        require_close(gy, y);
        Tensor gdx = gpu_conv.backward(dy.to(Device::CUDA));
        REQUIRE(gdx.device() == Device::CUDA);
        require_close(gdx, dx);
        require_close(gpu_conv.weight.grad, cpu_conv.weight.grad);
        require_close(gpu_conv.bias.grad, cpu_conv.bias.grad);
    }
}

TEST_CASE("cuda Conv2d gradients match finite differences", "[conv][cuda][lesson05][gradcheck]") {
    const GradCase cases[] = {
        {"stride 2, padding 1", 2, 2, 6, 5, 3, 3, {2, 1, 1, 1, true}},
        {"dilation 2, groups 2, no bias", 1, 4, 7, 7, 2, 3, {1, 1, 2, 2, false}},
        {"depthwise, stride 2, dilation 2 (the direct kernels)", 2, 3, 7, 6, 3, 3, {2, 2, 2, 3, true}},
    };
    for (const GradCase& g : cases) {
        SECTION(g.what) { check_conv_gradients(g, Device::CUDA); }
    }
}

TEST_CASE("cuda Conv2d refuses tensors on another device, saying to move the model", "[conv][cuda][lesson05]") {
    using Catch::Matchers::Contains;
    Rng rng(1);
    Conv2d conv(3, 4, 3, rng, {}, "conv1");  // on the CPU
    Tensor x = Tensor::zeros({2, 3, 8, 8});
    REQUIRE_THROWS_WITH(conv.forward(x.to(Device::CUDA)),
                        Contains("conv1") && Contains("weight") && Contains("cpu") && Contains("cuda") &&
                            Contains("model.to("));
    conv.to(Device::CUDA);
    conv.forward(x.to(Device::CUDA));
    REQUIRE_THROWS_WITH(conv.backward(Tensor::zeros({2, 4, 6, 6})),
                        Contains("conv1") && Contains("dy") && Contains("model.to("));
}

// ==== depthwise: groups == C == O, the direct kernels ================================================
// cuda::conv2d_forward, _backward_data and _backward_weight take cuda/conv.cu's depthwise kernels
// for these shapes (and no workspace: col is null here), against cpu::conv2d_* (its own direct
// depthwise loops). In f32 the forward and dx add in the CPU's order (bias, then the taps in
// (kh, kw) order); dw sums in double on the GPU: within kRelTol. f16 and bf16 against the f32 CPU
// on the same values, within the rounding bound of lowp_check.h's header:
//   |got − want| ≤ (u + 2·n·2^-24)·S + tiny      S = Σ|terms| (the f32 op on absolute values),
// n the terms of the sum, u and tiny of T; each result is rounded to T once (r = 1, dx included).
namespace {

struct DepthwiseCase {
    const char* what;
    int64_t N, C, H, W, KH, KW, stride, padding, dilation;
    bool bias;
};

// N·P·Q over one block of 256 (the dw walk's carries), stride 2 and 3, 5×5, dilation 2, odd and
// non-square sizes, a tap that reads only padding (its dw gets nothing), one channel alone.
const DepthwiseCase kDepthwiseCases[] = {
    // what                                                     N  C   H   W KH KW  s pad d  bias
    {"3x3, stride 1, padding 1, N·P·Q = 468", 3, 4, 12, 13, 3, 3, 1, 1, 1, true},
    {"3x3, stride 2, padding 1", 2, 5, 9, 8, 3, 3, 2, 1, 1, false},
    {"5x5, padding 2", 2, 3, 10, 11, 5, 5, 1, 2, 1, true},
    {"3x3, dilation 2, padding 2, no bias", 2, 3, 9, 10, 3, 3, 1, 2, 2, false},
    {"odd 7x9 image, 3x2 kernel, stride 3, padding 1", 3, 2, 7, 9, 3, 2, 3, 1, 1, true},
    {"1x2 image, padding 2, stride 3: taps wholly on the padding", 2, 3, 1, 2, 3, 3, 3, 2, 1, true},
    {"one channel, batch 1, 2x3 kernel, no padding", 1, 1, 6, 5, 2, 3, 1, 0, 1, false},
};

Conv2dParams depthwise_params(const DepthwiseCase& k) {
    Conv2dParams p;
    p.N = k.N, p.C = k.C, p.H = k.H, p.W = k.W, p.O = k.C, p.KH = k.KH, p.KW = k.KW;
    p.stride = k.stride, p.padding = k.padding, p.dilation = k.dilation, p.groups = k.C;
    return p;
}

// The inputs of one case, f32 on the CPU (values of T when rounded by `as`): x, w, b, dy, and
// the dw and db the backward pass accumulates onto.
struct DepthwiseInputs {
    Tensor x, w, b, dy, dw0, db0;
};

DepthwiseInputs depthwise_inputs(const Conv2dParams& p, Rng& rng, DType as = DType::F32) {
    auto values = [&](const Shape& s) { return Tensor::uniform(s, -1, 1, rng).to(as).to(DType::F32); };
    return {values({p.N, p.C, p.H, p.W}), values({p.C, 1, p.KH, p.KW}), values({p.C}),
            values({p.N, p.C, p.P(), p.Q()}), values({p.C, 1, p.KH, p.KW}), values({p.C})};
}

// y, dx, dw (= dw0 + Σ) and db (= db0 + Σ, or db0 without a bias), as f32 on the CPU.
struct DepthwiseResults {
    Tensor y, dx, dw, db;
};

DepthwiseResults cpu_depthwise(const Conv2dParams& p, const DepthwiseInputs& in, bool bias) {
    REQUIRE(cpu::conv2d_algo(p, DType::F32) == ConvAlgo::Depthwise);
    DepthwiseResults r{Tensor::empty(in.dy.shape()), Tensor::empty(in.x.shape()), in.dw0.clone(), in.db0.clone()};
    const float* b = bias ? in.b.data<float>() : nullptr;
    cpu::conv2d_forward<float>(in.x.data<float>(), in.w.data<float>(), b, r.y.data<float>(), p, nullptr, 0);
    cpu::conv2d_backward_data<float>(in.dy.data<float>(), in.w.data<float>(), r.dx.data<float>(), p, nullptr, 0);
    cpu::conv2d_backward_weight<float>(in.x.data<float>(), in.dy.data<float>(), r.dw.data<float>(),
                                bias ? r.db.data<float>() : nullptr, p, nullptr, 0);
    return r;
}

// The same passes on CUDA in T, without a workspace; y and dx start as NaN, so an element the
// kernels never write fails. The results in T, on the device.
template <typename T>
DepthwiseResults cuda_depthwise(const Conv2dParams& p, const DepthwiseInputs& in, bool bias, DType dt) {
    auto dev = [&](const Tensor& t) { return t.to(dt).to(Device::CUDA); };
    const double nan = std::numeric_limits<double>::quiet_NaN();
    const Tensor x = dev(in.x), w = dev(in.w), b = dev(in.b), dy = dev(in.dy);
    DepthwiseResults r{Tensor::full(in.dy.shape(), nan, dt, Device::CUDA),
                       Tensor::full(in.x.shape(), nan, dt, Device::CUDA), dev(in.dw0), dev(in.db0)};
    cuda::conv2d_forward(x.data<T>(), w.data<T>(), bias ? b.data<T>() : nullptr, r.y.data<T>(), p,
                         static_cast<T*>(nullptr), 0);
    cuda::conv2d_backward_data(dy.data<T>(), w.data<T>(), r.dx.data<T>(), p, static_cast<T*>(nullptr), 0);
    cuda::conv2d_backward_weight(x.data<T>(), dy.data<T>(), r.dw.data<T>(), bias ? r.db.data<T>() : nullptr, p,
                                 static_cast<T*>(nullptr), 0);
    return r;
}

DepthwiseInputs abs_inputs(const DepthwiseInputs& in) {
    using test::lowp::abs_of;
    return {abs_of(in.x), abs_of(in.w), abs_of(in.b), abs_of(in.dy), abs_of(in.dw0), abs_of(in.db0)};
}

template <typename T>
void check_depthwise_low(const DepthwiseCase& k, const test::LowFormat& f, Rng& rng) {
    INFO(dtype_name(f.dtype));
    const Conv2dParams p = depthwise_params(k);
    const DepthwiseInputs in = depthwise_inputs(p, rng, f.dtype);
    const DepthwiseResults want = cpu_depthwise(p, in, k.bias), S = cpu_depthwise(p, abs_inputs(in), k.bias);
    const double taps = double(k.KH * k.KW), outputs = double(k.N * p.P() * p.Q());
    // |got − want| ≤ (u + 2·n·2^-24)·S + tiny for a sum of n terms
    auto require_within_rounding = [&](const Tensor& got, const Tensor& want, const Tensor& S, double n) {
        test::lowp::require_within(got, want, S, f.u + 2.0 * n * test::lowp::kF32Unit, f.tiny);
    };
    test::under_schedules([&] {
        const DepthwiseResults got = cuda_depthwise<T>(p, in, k.bias, f.dtype);
        INFO("forward");
        require_within_rounding(got.y, want.y, S.y, taps + 1);
        INFO("backward: dx");
        require_within_rounding(got.dx, want.dx, S.dx, taps);
        INFO("backward: dw and db");
        require_within_rounding(got.dw, want.dw, S.dw, outputs + 1);
        require_within_rounding(got.db, want.db, S.db, outputs + 1);
    });
}

}  // namespace

TEST_CASE("cuda depthwise conv2d: the direct kernels match the CPU in f32, the same bits under every schedule",
          "[conv][cuda][depthwise]") {
    Rng rng(61);
    for (const DepthwiseCase& k : kDepthwiseCases) {
        SECTION(k.what) {
            const Conv2dParams p = depthwise_params(k);
            const DepthwiseInputs in = depthwise_inputs(p, rng);
            const DepthwiseResults want = cpu_depthwise(p, in, k.bias);
            std::vector<Tensor> first;  // the first schedule's results: the others must give the same bits
            under_schedules([&] {
                const DepthwiseResults got = cuda_depthwise<float>(p, in, k.bias, DType::F32);
                INFO("forward");
                require_close(got.y, want.y);
                INFO("backward: dx");
                require_close(got.dx, want.dx);
                INFO("backward: dw and db (accumulated onto dw0, db0)");
                require_close(got.dw, want.dw);
                require_close(got.db, want.db);
                const std::vector<Tensor> all{got.y, got.dx, got.dw, got.db};
                if (first.empty()) first = all;
                for (size_t i = 0; i < all.size(); i++) require_identical(all[i], first[i]);
            });
        }
    }
}

TEST_CASE("cuda depthwise conv2d in f16 and bf16 matches the f32 CPU within one rounding",
          "[conv][cuda][depthwise][lowp]") {
    Rng rng(67);
    for (const DepthwiseCase& k : kDepthwiseCases) {
        SECTION(k.what) {
            check_depthwise_low<f16>(k, test::low_format(DType::F16), rng);
            check_depthwise_low<bf16>(k, test::low_format(DType::BF16), rng);
        }
    }
}

// One 3×3 channel, padding 1, with weights 2^(3·kh + kw): every tap adds a different amount, so
// a tap skipped (or read twice, or from the wrong place) changes every output it touches. All
// values are small integers: exact in f32, whatever the order of the sums.
//   x = 1 2 3     w =  1   2   4     dy = 1 3 2     b = 1000, dw0 = 100, db0 = 1
//       4 5 6          8  16  32          2 1 4
//       7 8 9         64 128 256          3 2 1
// e.g. y[0, 0] = 1000 + 16·1 + 32·2 + 128·4 + 256·5 (the taps kh, kw ≥ 1; the others are on the
// padding), dx[0, 0] = 1·dy[1, 1] + 2·dy[1, 0] + 8·dy[0, 1] + 16·dy[0, 0],
// dw[0, 0] = 100 + dy[1, 1]·x[0, 0] + dy[1, 2]·x[0, 1] + dy[2, 1]·x[1, 0] + dy[2, 2]·x[1, 1].
TEST_CASE("cuda depthwise conv2d: a hand-computed 3x3 channel, every tap counted once", "[conv][cuda][depthwise]") {
    using test::tensor_of;
    Conv2dParams p;
    p.N = 1, p.C = p.O = p.groups = 1, p.H = p.W = 3, p.KH = p.KW = 3, p.padding = 1;
    const Tensor x = tensor_of({1, 1, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9}, Device::CUDA);
    const Tensor w = tensor_of({1, 1, 3, 3}, {1, 2, 4, 8, 16, 32, 64, 128, 256}, Device::CUDA);
    const Tensor b = tensor_of({1}, {1000}, Device::CUDA);
    const Tensor dy = tensor_of({1, 1, 3, 3}, {1, 3, 2, 2, 1, 4, 3, 2, 1}, Device::CUDA);
    Tensor y = Tensor::empty({1, 1, 3, 3}, DType::F32, Device::CUDA);
    Tensor dx = Tensor::empty(x.shape(), DType::F32, Device::CUDA);
    Tensor dw = Tensor::full(w.shape(), 100, DType::F32, Device::CUDA);
    Tensor db = Tensor::full({1}, 1, DType::F32, Device::CUDA);
    under_schedules([&] {
        cuda::conv2d_forward<float>(x.data<float>(), w.data<float>(), b.data<float>(), y.data<float>(), p, nullptr, 0);
        require_identical(y, tensor_of({1, 1, 3, 3}, {2872, 3568, 2152, 4178, 5097, 2808, 1396, 1510, 1225}));
        cuda::conv2d_backward_data<float>(dy.data<float>(), w.data<float>(), dx.data<float>(), p, nullptr, 0);
        require_identical(dx, tensor_of({1, 1, 3, 3}, {45, 110, 140, 368, 897, 1130, 384, 1032, 848}));
    });
    // dw and db accumulate: once (under the default schedule), onto 100 and 1
    cuda::conv2d_backward_weight<float>(x.data<float>(), dy.data<float>(), dw.data<float>(), db.data<float>(), p,
                                        nullptr, 0);
    require_identical(dw, tensor_of({1, 1, 3, 3}, {122, 144, 134, 153, 196, 169, 161, 189, 148}));
    require_identical(db, tensor_of({1}, {20}));
}

// ---- f16 and bf16 (chapter 09): within the bound of f32 (lowp_check.h) ----------------------------
namespace {

using namespace test::lowp;

struct ConvCase {
    const char* what;
    int64_t N, C, H, W, O, K, stride, padding, groups;
    bool bias;
};

// Each forward strategy: CPU Im2col, Pointwise, Depthwise; CUDA implicit GEMM (Og < 64) and im2col
// (Og ≥ 64). Backward: the CPU's three paths and CUDA's one.
const ConvCase kConvCases[] = {
    // what                                         N  C  H  W   O  K  s  pad G  bias
    {"3x3 pad 1: CPU im2col, CUDA implicit GEMM", 2, 3, 6, 5, 5, 3, 1, 1, 1, true},
    {"3x3 stride 2, O = 64: im2col on both", 2, 2, 5, 6, 64, 3, 2, 1, 1, true},
    {"1x1: CPU pointwise", 3, 4, 3, 4, 6, 1, 1, 0, 1, false},
    {"depthwise 3x3: CPU direct loops", 2, 4, 5, 5, 4, 3, 1, 1, 4, true},
};

OpCheck conv_check(const ConvCase& k, const LowType& t) {
    Rng rng(5);
    const Tensor x = values_in(t, {k.N, k.C, k.H, k.W}, -1, 1, rng);
    const Tensor w = values_in(t, {k.O, k.C / k.groups, k.K, k.K}, -1, 1, rng);
    const Tensor b = k.bias ? values_in(t, {k.O}, -1, 1, rng) : Tensor();
    Conv2dArgs a;
    a.stride = k.stride, a.padding = k.padding, a.groups = k.groups;
    const Tensor y0 = conv2d(x, w, b, a);
    const Tensor dy = values_in(t, y0.shape(), -1, 1, rng);

    // y, dw, db, dx of the op in dtype on device
    auto run = [=](Device device, DType dt) {
        auto in = [&](const Tensor& v) { return v.defined() ? v.to(dt).to(device) : Tensor(); };
        const Tensor xd = in(x), wd = in(w), dyd = in(dy);
        Tensor dw = Tensor::zeros(w.shape(), dt, device), db = k.bias ? Tensor::zeros({k.O}, dt, device) : Tensor();
        const Tensor y = conv2d(xd, wd, in(b), a);
        const Tensor dx = conv2d_backward(xd, wd, dyd, dw, db, true, a);
        std::vector<Tensor> out{host_f32(y), host_f32(dw), host_f32(dx)};
        if (k.bias) out.push_back(host_f32(db));
        return out;
    };
    // Σ|terms|: the f32 op on absolute values
    Tensor S_dw = Tensor::zeros(w.shape()), S_db = k.bias ? Tensor::zeros({k.O}) : Tensor();
    const Tensor S_y = conv2d(abs_of(x), abs_of(w), k.bias ? abs_of(b) : Tensor(), a);
    const Tensor S_dx = conv2d_backward(abs_of(x), abs_of(w), abs_of(dy), S_dw, S_db, true, a);
    const double PQ = double(y0.size(2) * y0.size(3)), Kc = double(k.C / k.groups * k.K * k.K);
    const bool cpu_pointwise = k.K == 1 && k.groups == 1;
    std::vector<Bound> bounds{
        {S_y, Kc + 1, 1, 1},
        {S_dw, double(k.N) * PQ, cpu_pointwise ? double(k.N) : 1.0, 1},
        {S_dx, double(k.O / k.groups * k.K * k.K), 2, 2},
    };
    if (k.bias) bounds.push_back({S_db, double(k.N) * PQ, 1, 1});
    return {run, bounds};
}

void conv_checks(Device device) {
    for (const ConvCase& k : kConvCases) {
        SECTION(k.what) { check_op(device, [&](const LowType& t) { return conv_check(k, t); }); }
    }
}

}  // namespace

TEST_CASE("f16 and bf16 conv2d on the CPU, every strategy, forward and backward, within the bound of f32",
          "[lowp][lesson09][cpu][conv]") {
    conv_checks(Device::CPU);
}

TEST_CASE("f16 and bf16 conv2d on CUDA, both strategies, forward and backward, within the bound of f32 and the CPU",
          "[lowp][lesson09][cuda][conv]") {
    conv_checks(Device::CUDA);
}

TEST_CASE("bf16 conv2d on AMX tiles (emulated), every strategy, forward and backward, within the bound of f32",
          "[lowp][lesson09][cpu][conv][amx]") {
    const test::AmxEmulation emulated;
    REQUIRE(std::string(cpu::gemm_path<bf16>(cpu_level())) == "amx-bf16-emulated");
    for (const ConvCase& k : kConvCases) {
        SECTION(k.what) { check_against_f32(conv_check(k, kBF16), Device::CPU, kBF16); }
    }
}

TEST_CASE("lowp conv2d: a mixed pair names the tensor", "[lowp][lesson09][cpu][conv]") {
    using Catch::Matchers::Contains;
    const Tensor x = Tensor::zeros({2, 3, 6, 6}, DType::F16), w = Tensor::zeros({4, 3, 3, 3});
    REQUIRE_THROWS_WITH(conv2d(x, w, Tensor(), {}), Contains("conv2d") && Contains("'w' is f32") &&
                                                        Contains("'x' is f16") && Contains(".to(DType::"));
    Tensor dw = Tensor::zeros({4, 3, 3, 3}, DType::BF16), db;
    REQUIRE_THROWS_WITH(conv2d_backward(x, w.to(DType::F16), Tensor::zeros({2, 4, 4, 4}, DType::F16), dw, db, true, {}),
                        Contains("conv2d_backward") && Contains("'dw' is bf16"));
}

// ---- on the tensor cores (chapter 09): the implicit-GEMM convolution's wmma variant and the engine's
// conv2d passes (tensor cores where the product has 16 rows, columns and k) in f16 and bf16 against
// the CPU's f32 convolution on the same values, within the bound of one rounding (lowp_check.h's
// require_rounded_once, R = the terms of one output); and conv2d's choice of them (the emulator
// counts wmma operations: not in the GPU build) ------------------------------------------------------------
namespace {

using test::lowp::abs_of;
using test::lowp::kBF16;
using test::lowp::kF16;
using test::lowp::LowType;
using test::lowp::require_rounded_once;

Tensor random(const Shape& shape, Rng& rng, DType dtype) { return Tensor::uniform(shape, -1.0f, 1.0f, rng).to(dtype); }

// y = conv(x, w) + b (b: a bias, or none) by cuda::conv2d_forward_implicit_gemm_wmma in T,
// against the CPU's f32 convolution of the same values.
template <typename T>
void check_conv_wmma(const LowType& f, const Conv2dArgs& args, Shape x_shape, int64_t O, int64_t KK, bool bias,
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
    require_rounded_once(y, want, f, p.Cg() * KK * KK + (bias ? 1 : 0), S);
}

// The engine's conv2d and conv2d_backward on CUDA in T (the implicit GEMMs: on the tensor cores
// where the product has 16 rows, columns and k, else the CUDA cores), forward, dx, dw and db,
// against the CPU's f32 passes on the same values. dw and db accumulate onto random starting values.
template <typename T>
void check_conv_passes(const LowType& f, const Conv2dArgs& args, Shape x_shape, int64_t O, int64_t KK, Rng& rng) {
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
    require_rounded_once(y, y_want, f, Cg * KK * KK + 1, y_S);
    require_rounded_once(dx, dx_want, f, O / args.groups * KK * KK, dx_S);
    require_rounded_once(dw, dw_want, f, NPQ + 1, dw_S);
    require_rounded_once(db, db_want, f, NPQ + 1, db_S);
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

TEST_CASE("wmma implicit-GEMM convolution matches the CPU for f16 and bf16", "[conv][wmma][cuda][lesson09]") {
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
TEST_CASE("wmma: an f16 and bf16 conv2d on CUDA takes the tensor cores when the shapes allow",
          "[conv][wmma][cuda][lesson09]") {
    Rng rng(919);
    // The CIFAR net's block-1 shape, scaled down: 24 → 32 channels (Og = 32 < 64: the implicit
    // GEMM; ≥ 16 with Kc = 24·9 ≥ 16: its wmma variant), 3×3, padding 1.
    Conv2dArgs args;
    args.padding = 1;
    for (const LowType& f : {kF16, kBF16}) {
        INFO(dtype_name(f.dtype));
        const Tensor x = random({2, 24, 6, 6}, rng, f.dtype), w = random({32, 24, 3, 3}, rng, f.dtype);
        const Tensor b = random({32}, rng, f.dtype);
        const uint64_t before = kiln::emu::warp_calls_run();
        const Tensor y = conv2d(x.to(Device::CUDA), w.to(Device::CUDA), b.to(Device::CUDA), args);
        CHECK(kiln::emu::warp_calls_run() > before);  // the engine's conv2d reached the tensor cores
        const Tensor S = conv2d(abs_of(x), abs_of(w), abs_of(b), args);
        require_rounded_once(y, conv2d(x.to(DType::F32), w.to(DType::F32), b.to(DType::F32), args), f, 24 * 9 + 1, S);
    }
}
#endif  // KILN_CUDA

// ---- TF32 (cuda::set_tf32, the trainers' --tf32): the three passes on the tensor cores ---------------
// With TF32 on, each pass's GEMM operands are rounded to tf32 (cvt.rna: nearest, ties away from
// zero, 10 mantissa bits) and their products, exact in f32, summed in f32. The reference: the
// direct loops in double on the rounded operands (the bias and dy's sum for db are not GEMM
// operands: unrounded). Tolerance per element: K additions in f32 each rounded once, plus the
// bias, dw's accumulation onto dw0 and split-K's slices, at most (K + 8)·2⁻²⁴·S, S the same sum
// of |products| (test_tf32.cpp's argument). The un-rounded operands' result lies far outside it.
namespace {

float rna_tf32(float x) { return test::tf32_reference(x); }
std::vector<float> values_of(const Tensor& t, float (*f)(float)) {
    const Tensor c = t.to(Device::CPU);
    std::vector<float> v(c.data<float>(), c.data<float>() + c.numel());
    for (float& x : v) x = f(x);
    return v;
}
float same(float x) { return x; }
float magnitude(float x) { return std::fabs(rna_tf32(x)); }

// |got − want| ≤ (K + 8)·2⁻²⁴·S elementwise; returns how many elements of `plain` lie outside.
int64_t check_tf32_pass(const char* pass, const Tensor& got, const std::vector<float>& want,
                        const std::vector<float>& S, const std::vector<float>& plain, int64_t K) {
    const std::vector<float> g = values_of(got, same);
    REQUIRE(g.size() == want.size());
    int64_t plain_outside = 0;
    for (size_t i = 0; i < g.size(); i++) {
        const double tol = double(K + 8) * std::ldexp(double(S[i]), -24);
        INFO(pass << "[" << i << "] = " << g[i] << ", want " << want[i] << " ± " << tol);
        REQUIRE(std::fabs(double(g[i]) - want[i]) <= tol);
        plain_outside += std::fabs(double(plain[i]) - want[i]) > tol;
    }
    return plain_outside;
}

struct ScopedTf32 {
    ScopedTf32() { cuda::set_tf32(true); }
    ~ScopedTf32() { cuda::set_tf32(false); }
};

}  // namespace

TEST_CASE("cuda conv2d with TF32: forward, dx and dw from rna-rounded operands with f32 sums",
          "[conv][cuda][tf32][lesson09]") {
    const Case cases[] = {
        // what                                        N   C  H  W   O KH KW  stride pad dil groups bias
        {"3x3, padding 1: every pass on 64x64 tiles", 8, 16, 9, 8, 20, 3, 3, {1, 1, 1, 1, true}},
        {"stride 2, groups 2, 3x2 kernel", 2, 32, 9, 8, 34, 3, 2, {2, 0, 1, 2, true}},
        {"O = 130: the forward on 128x128 tiles", 2, 16, 12, 12, 130, 3, 3, {1, 1, 1, 1, false}},
    };
    Rng rng(71);
    for (const Case& k : cases) {
        SECTION(k.what) {
#ifndef KILN_CUDA
            // 8 SMs: the first case's dw sum is split in slices; 1: the last one's forward fills 128x128 tiles
            kiln::emu::ScopedMultiprocessors sms(k.N == 8 ? 8 : 1);
#endif
            Conv2dParams p;
            p.N = k.N, p.C = k.C, p.H = k.H, p.W = k.W, p.O = k.O, p.KH = k.KH, p.KW = k.KW;
            p.stride = k.opt.stride, p.padding = k.opt.padding, p.dilation = k.opt.dilation, p.groups = k.opt.groups;
            const int64_t P = p.P(), Q = p.Q(), Cg = k.C / p.groups, Og = k.O / p.groups;
            const Tensor x = Tensor::uniform({k.N, k.C, k.H, k.W}, -1, 1, rng);
            const Tensor w = Tensor::uniform({k.O, Cg, k.KH, k.KW}, -1, 1, rng);
            const Tensor b = Tensor::uniform({k.O}, -1, 1, rng), dy = Tensor::uniform({k.N, k.O, P, Q}, -1, 1, rng);
            const float* bias = k.opt.bias ? b.data<float>() : nullptr;

            // The references: rounded operands (want), |rounded| (S), the operands as they are (plain).
            const std::vector<float> xr = values_of(x, rna_tf32), wr = values_of(w, rna_tf32), dyr = values_of(dy, rna_tf32);
            const std::vector<float> xa = values_of(x, magnitude), wa = values_of(w, magnitude), dya = values_of(dy, magnitude);
            std::vector<float> y(size_t(k.N * k.O * P * Q)), y_s(y.size()), y_plain(y.size());
            std::vector<float> dx(size_t(x.numel())), dx_s(dx.size()), dx_plain(dx.size());
            std::vector<float> dw(size_t(w.numel())), dw_s(dw.size()), dw_plain(dw.size()), db(size_t(k.O));
            std::vector<float> b_abs(size_t(k.O));
            for (int64_t o = 0; o < k.O; o++) b_abs[size_t(o)] = std::fabs(b.data<float>()[o]);
            naive_forward(k, xr.data(), wr.data(), bias, y.data(), P, Q);
            naive_forward(k, xa.data(), wa.data(), bias ? b_abs.data() : nullptr, y_s.data(), P, Q);
            naive_forward(k, x.data<float>(), w.data<float>(), bias, y_plain.data(), P, Q);
            naive_backward(k, xr.data(), wr.data(), dyr.data(), dx.data(), dw.data(), db.data(), P, Q);
            naive_backward(k, xa.data(), wa.data(), dya.data(), dx_s.data(), dw_s.data(), db.data(), P, Q);
            naive_backward(k, x.data<float>(), w.data<float>(), dy.data<float>(), dx_plain.data(), dw_plain.data(),
                           db.data(), P, Q);

            const Tensor gx = x.to(Device::CUDA), gw = w.to(Device::CUDA), gb = b.to(Device::CUDA), gdy = dy.to(Device::CUDA);
            Tensor gy = Tensor::empty({k.N, k.O, P, Q}, DType::F32, Device::CUDA), gdx = Tensor::empty(x.shape(), DType::F32, Device::CUDA);
            Tensor gdw = Tensor::zeros(w.shape()).to(Device::CUDA);
            int64_t plain_outside = 0;
            {
                ScopedTf32 tf32;
#ifndef KILN_CUDA
                const uint64_t before = kiln::emu::warp_calls_run();
#endif
                cuda::conv2d_forward<float>(gx.data<float>(), gw.data<float>(), k.opt.bias ? gb.data<float>() : nullptr,
                                            gy.data<float>(), p, nullptr, 0);
                cuda::conv2d_backward_data<float>(gdy.data<float>(), gw.data<float>(), gdx.data<float>(), p, nullptr, 0);
                cuda::conv2d_backward_weight<float>(gx.data<float>(), gdy.data<float>(), gdw.data<float>(), nullptr, p,
                                                    nullptr, 0);
#ifndef KILN_CUDA
                CHECK(kiln::emu::warp_calls_run() > before);
#endif
            }
            plain_outside += check_tf32_pass("y", gy, y, y_s, y_plain, Cg * k.KH * k.KW);
            plain_outside += check_tf32_pass("dx", gdx, dx, dx_s, dx_plain, Og * k.KH * k.KW);
            plain_outside += check_tf32_pass("dw", gdw, dw, dw_s, dw_plain, k.N * P * Q);
            CHECK(plain_outside > 0);
            if (k.N == 8) CHECK(cuda::conv2d_backward_weight_scratch(p) > 0);  // dw's slices were exercised
        }
    }
}

TEST_CASE("cuda conv2d with TF32 off: the CUDA cores' bits, no tensor core at work", "[conv][cuda][tf32][lesson09]") {
    cuda::set_tf32(true);  // on, then off again: the switch must leave nothing behind
    cuda::set_tf32(false);
    Rng rng(73);
    Conv2dParams p;
    p.N = 2, p.C = 16, p.H = 9, p.W = 8, p.O = 20, p.KH = 3, p.KW = 3, p.padding = 1;
    const Tensor x = Tensor::uniform({p.N, p.C, p.H, p.W}, -1, 1, rng).to(Device::CUDA);
    const Tensor w = Tensor::uniform({p.O, p.C, 3, 3}, -1, 1, rng).to(Device::CUDA);
    Tensor y = Tensor::empty({p.N, p.O, p.P(), p.Q()}, DType::F32, Device::CUDA), y_im2col = y.clone();
    Tensor col = Tensor::empty({p.N * cuda::conv2d_col_elems_per_image(p)}, DType::F32, Device::CUDA);
#ifndef KILN_CUDA
    const uint64_t before = kiln::emu::warp_calls_run();
#endif
    cuda::conv2d_forward<float>(x.data<float>(), w.data<float>(), nullptr, y.data<float>(), p, nullptr, 0);
#ifndef KILN_CUDA
    CHECK(kiln::emu::warp_calls_run() == before);
#endif
    // the im2col strategy's GEMM (version 6) adds each output's products in the same k order
    cuda::conv2d_forward_im2col<float>(x.data<float>(), w.data<float>(), nullptr, y_im2col.data<float>(), p,
                                       col.data<float>(), p.N);
    require_identical(y, y_im2col);
}
