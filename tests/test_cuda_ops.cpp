// test_cuda_ops.cpp — every CUDA kernel of chapter 04 against its CPU twin (a test
// against a reference implementation), on random shapes chosen to hit the edges: n = 1, odd
// sizes, sizes that are not multiples of the block or the tile, n large enough for the
// grid-stride loops, all four GEMM transposes, beta 0 and 1.
//
// Without a GPU (make) the kernels run on kiln's emulator, and each comparison runs twice:
// with the threads of a block in order and in reverse between barriers. A missing
// __syncthreads() reads shared memory before (or after) another thread writes it, which one
// of the two orders exposes. With make CUDA=1 they run once, on the GPU.
//
//   make test T='[cuda]'        all of them      make test T='[cuda][gemm]'   one kernel family
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <sstream>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "fixtures.h"
#include "gemm_versions.h"
#include "ops/kernels/all.h"
#include "ops/cpu/gemm.h"
#include "ops/ops.h"

using namespace kiln;
using test::under_schedules;

namespace {

Tensor random(const Shape& shape, Rng& rng, float low = -1.0f, float high = 1.0f) {
    return Tensor::uniform(shape, low, high, rng);
}

Tensor cuda_copy(const Tensor& t) { return t.to(Device::CUDA); }
Tensor host(const Tensor& t) { return t.to(Device::CPU); }

// |got − want| ≤ abs + rel·|want| for every element (rel = abs = 0: bit-identical).
void require_close(const Tensor& got_any, const Tensor& want, double rel = 0.0, double abs = 0.0) {
    Tensor got = host(got_any);
    REQUIRE(got.shape() == want.shape());
    const float* g = got.data<float>();
    const float* w = want.data<float>();
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < want.numel(); i++) {
        const bool ok = (std::isnan(w[i]) && std::isnan(g[i])) ||
                        std::fabs(double(g[i]) - double(w[i])) <= abs + rel * std::fabs(double(w[i]));
        if (!ok && bad++ == 0) first = i;
    }
    std::ostringstream msg;
    if (bad) msg << bad << " mismatches; the first at " << first << ": got " << g[first] << ", want " << w[first];
    INFO(msg.str());
    REQUIRE(bad == 0);
}

}  // namespace

// ---- elementwise ---------------------------------------------------------------------------------
TEST_CASE("cuda elementwise kernels match the CPU", "[cuda][lesson04][elementwise]") {
    Rng rng(7);
    // 0 launches nothing; 1, 255, 257: partial blocks; 300,007 > 1024·256: the grid-stride loop.
    for (int64_t n : {int64_t(0), int64_t(1), int64_t(255), int64_t(256), int64_t(257), int64_t(300007)}) {
        INFO("n = " << n);
        Tensor a = random({n}, rng), b = random({n}, rng);
        Tensor da = cuda_copy(a), db = cuda_copy(b);
        under_schedules([&] {
            require_close(add(da, db), add(a, b));
            require_close(relu(da), relu(a));
            Tensor dy = random({n}, rng);
            Tensor r = relu(a);
            require_close(relu_backward(cuda_copy(r), cuda_copy(dy)), relu_backward(r, dy));

            Tensor y = b.clone(), dy2 = cuda_copy(b);
            axpy_(y, 0.37f, a);
            axpy_(dy2, 0.37f, da);
            require_close(dy2, y, 1e-6, 1e-7);  // a·x + y may be one fused multiply-add on the GPU

            Tensor s = a.clone(), ds = cuda_copy(a);
            scale_(s, -2.5f);
            scale_(ds, -2.5f);
            require_close(ds, s);

            Tensor f = Tensor::empty({n}, DType::F32, Device::CUDA);
            fill_(f, 3.25f);
            require_close(f, Tensor::full({n}, 3.25));
        });
    }
}

// ---- reductions ----------------------------------------------------------------------------------
TEST_CASE("cuda sum and max match the CPU and are deterministic", "[cuda][lesson04][reduce]") {
    Rng rng(11);
    // 262,145 > 1024 blocks · 256 threads: pass 1's grid-stride loop gives threads several elements.
    for (int64_t n : {int64_t(1), int64_t(31), int64_t(256), int64_t(257), int64_t(1000), int64_t(262145)}) {
        INFO("n = " << n);
        Tensor x = random({n}, rng, -3.0f, 2.0f);
        Tensor dx = cuda_copy(x);
        const double want = sum(x);
        double first = 0;
        under_schedules([&] {
            const double got = sum(dx);
            REQUIRE(got == Approx(want).epsilon(1e-12).margin(1e-12));  // both add floats in double
            if (first == 0) first = got;
            REQUIRE(got == first);  // bit-identical, whatever the schedule
            REQUIRE(sum(dx) == got);
            REQUIRE(max(dx) == max(x));  // max is exact
        });
    }
}

TEST_CASE("cuda sum of 1..n is exact; max finds the one large value", "[cuda][lesson04][reduce]") {
    //   x = [1 2 3 ... 1000]  ->  sum = 500500,  max = 1000; then x[777] = 1e6 -> max = 1e6
    Tensor x = Tensor::empty({1000});
    for (int64_t i = 0; i < 1000; i++) x.set({i}, double(i + 1));
    Tensor dx = cuda_copy(x);
    under_schedules([&] {
        REQUIRE(sum(dx) == 500500.0);
        REQUIRE(max(dx) == 1000.0f);
    });
    x.set({777}, 1e6);
    REQUIRE(max(cuda_copy(x)) == 1e6f);
    REQUIRE(sum(Tensor::empty({0}, DType::F32, Device::CUDA)) == 0.0);
}

TEST_CASE("cuda sum_rows, add_bias and argmax_rows match the CPU", "[cuda][lesson04][reduce]") {
    Rng rng(13);
    const int64_t shapes[][2] = {{1, 1}, {64, 10}, {37, 33}, {1000, 3}, {5, 70}, {3, 257}};
    for (auto [N, C] : shapes) {
        INFO("N = " << N << ", C = " << C);
        Tensor dy = random({N, C}, rng), db0 = random({C}, rng), bias = random({C}, rng);
        // Rounded to quarters: rows with ties, where the first maximum must win on both.
        Tensor xq = random({N, C}, rng, -2.0f, 2.0f);
        for (int64_t i = 0; i < xq.numel(); i++) xq.data<float>()[i] = std::round(xq.data<float>()[i] * 4) / 4;
        under_schedules([&] {
            for (float beta : {0.0f, 1.0f}) {
                INFO("beta = " << beta);
                Tensor want = db0.clone();
                sum_rows_into(dy, want, beta);
                // beta = 0 must not read db: start it as NaN on the device.
                Tensor got = beta == 0.0f ? Tensor::full({C}, std::nan("")).to(Device::CUDA) : cuda_copy(db0);
                sum_rows_into(cuda_copy(dy), got, beta);
                require_close(got, want, 1e-5, 1e-5);  // 8 partial sums per column, then added: another order
            }
            Tensor y = dy.clone(), dyc = cuda_copy(dy);
            add_bias_(y, bias);
            add_bias_(dyc, cuda_copy(bias));
            require_close(dyc, y);

            Tensor want = argmax_rows(xq), got = host(argmax_rows(cuda_copy(xq)));
            REQUIRE(got.dtype() == DType::I32);
            for (int64_t n = 0; n < N; n++) REQUIRE(got.data<int32_t>()[n] == want.data<int32_t>()[n]);
        });
    }
}

// ---- GEMM ------------------------------------------------------------------------------------------
namespace {

using GemmFn = void (*)(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*, int64_t,
                        float, float*, int64_t);

// One GEMM on device copies, compared with cpu::gemm on the same inputs. The leading
// dimensions are padded (lda = K + 3, ...) so that a kernel mixing up a size and a stride fails.
void check_gemm(GemmFn gpu_gemm, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, float beta,
                Rng& rng) {
    INFO("M = " << M << ", N = " << N << ", K = " << K << ", trans_a = " << ta << ", trans_b = " << tb
                << ", alpha = " << alpha << ", beta = " << beta);
    const int64_t a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
    const int64_t lda = a_cols + 3, ldb = b_cols + 1, ldc = N + 2;
    Tensor A = random({a_rows, lda}, rng), B = random({b_rows, ldb}, rng), C = random({M, ldc}, rng);
    if (beta == 0.0f)  // beta = 0 must not read C
        for (int64_t i = 0; i < C.numel(); i++) C.data<float>()[i] = std::numeric_limits<float>::quiet_NaN();
    Tensor dA = cuda_copy(A), dB = cuda_copy(B), dC = cuda_copy(C);
    cpu::gemm(ta, tb, M, N, K, alpha, A.data<float>(), lda, B.data<float>(), ldb, beta, C.data<float>(), ldc);
    gpu_gemm(ta, tb, M, N, K, alpha, dA.data<float>(), lda, dB.data<float>(), ldb, beta, dC.data<float>(), ldc);
    Tensor got = host(dC);
    // Padding columns stay untouched (NaN for beta = 0): compare everything, NaN matching NaN.
    // Tolerance: the GPU adds the K products in another order than the CPU (tiles, fma), so each
    // element may differ by a few ulps of Σ|a·b| ≤ K for values in [-1, 1].
    require_close(got, C, 1e-5, 2e-6 * double(K + 1));
}

}  // namespace

TEST_CASE("cuda gemm (version 6, the engine's) matches the CPU", "[cuda][lesson04][gemm]") {
    Rng rng(17);
    // Edges of the 64×64 tile, K not a multiple of BK = 16, a single element, a tall thin matrix;
    // K a multiple of 4 (A's rows as float4s) and not (one by one).
    const int64_t shapes[][3] = {{1, 1, 1}, {3, 5, 7}, {17, 33, 65}, {64, 64, 16}, {65, 63, 17}, {130, 129, 20},
                                 {64, 512, 100}, {300, 2, 3}};
    under_schedules([&] {
        for (auto [M, N, K] : shapes)
            for (bool ta : {false, true})
                for (bool tb : {false, true})
                    for (float beta : {0.0f, 1.0f}) check_gemm(cuda::gemm, ta, tb, M, N, K, 0.75f, beta, rng);
    });
}

TEST_CASE("cuda gemm's 128×128 tiles (big matrices) match the CPU", "[cuda][lesson04][gemm]") {
    Rng rng(19);
    // Two 128×128 tiles per SM select the big configuration (289 tiles here: the emulator's SMs
    // are its OpenMP threads); 2049 and 2050 leave partial tiles.
    under_schedules([&] {
        for (bool ta : {false, true})
            for (bool tb : {false, true}) check_gemm(cuda::gemm, ta, tb, 2049, 2050, 9, 1.0f, ta ? 1.0f : 0.0f, rng);
    });
}

TEST_CASE("cuda gemm split along K (convolution weight gradients) matches the CPU", "[cuda][lesson05][gemm]") {
    Rng rng(21);
    // One 64×64 tile of C and a long K, as LeNet's weight gradients (Og × Kc = 6 × 25, 16 × 150,
    // K = L the chunk's output pixels): fewer tiles than two per SM, so K is split (S ≥ 2 on the
    // emulator too, whose SMs are its OpenMP threads). K not a multiple of the 32-wide slices
    // leaves a short last slice. Tolerance (check_gemm's): each slice sums K/S products, then S
    // partials are added: an error bound of (K/S + S)·u·Σ|a·b| ≤ K·u·Σ|a·b|, as for one sum.
    const int64_t shapes[][3] = {{6, 25, 3000}, {16, 64, 1000}, {33, 50, 777}};
    for (auto [M, N, K] : shapes) {
        INFO("M = " << M << ", N = " << N << ", K = " << K);
        REQUIRE(cuda::gemm_split_k_slices(M, N, K) >= 2);
        under_schedules([&] {
            for (bool ta : {false, true})
                for (bool tb : {false, true})
                    for (float beta : {0.0f, 1.0f}) check_gemm(cuda::gemm_split_k<float>, ta, tb, M, N, K, 0.75f, beta, rng);
        });
    }
    // Enough tiles to fill the device already: no split.
    REQUIRE(cuda::gemm_split_k_slices(64 * 100, 64 * 100, 100000) == 1);
    // The same bytes on every run: the partials are added in a fixed order, without atomics.
    Tensor A = random({6, 3000}, rng), B = random({25, 3000}, rng);
    Tensor C1 = Tensor::zeros({6, 25}).to(Device::CUDA), C2 = Tensor::zeros({6, 25}).to(Device::CUDA);
    const Tensor dA = cuda_copy(A), dB = cuda_copy(B);
    for (Tensor* C : {&C1, &C2})
        cuda::gemm_split_k(false, true, 6, 25, 3000, 1.0f, dA.data<float>(), 3000, dB.data<float>(), 3000, 0.0f,
                           C->data<float>(), 25);
    test::require_identical(C1, C2);
}

TEST_CASE("cuda gemm versions 1 to 3 (naive, shared-memory tiles, register tiles) match the CPU",
          "[cuda][lesson04][gemm]") {
    Rng rng(23);
    const int64_t shapes[][3] = {{1, 1, 1}, {16, 16, 16}, {17, 33, 65}, {40, 7, 31}, {130, 129, 20}};
    under_schedules([&] {
        for (GemmFn f : {cuda::lab::gemm_naive<float>, cuda::lab::gemm_smem<float>,
                         cuda::lab::gemm_register_tiled<float>})
            for (auto [M, N, K] : shapes)
                for (bool ta : {false, true})
                    for (bool tb : {false, true})
                        for (float beta : {0.0f, 1.0f}) check_gemm(f, ta, tb, M, N, K, 1.5f, beta, rng);
    });
}

TEST_CASE("cuda gemm version 6 gives version 3's bits: each C value sums its products in k order",
          "[cuda][lesson04][gemm]") {
    // Warp tiling and double buffering move data, not arithmetic: both add op(A)[m, k]·op(B)[k, n]
    // to one float accumulator for k = 0, 1, ..., K − 1, so switching the engine changed no bit.
    Rng rng(29);
    const int64_t shapes[][3] = {{17, 33, 65}, {64, 512, 100}, {300, 260, 48}};
    for (auto [M, N, K] : shapes)
        for (bool ta : {false, true})
            for (bool tb : {false, true}) {
                INFO("M = " << M << ", N = " << N << ", K = " << K << ", trans_a " << ta << ", trans_b " << tb);
                const Tensor A = cuda_copy(random({ta ? K : M, ta ? M : K}, rng));
                const Tensor B = cuda_copy(random({tb ? N : K, tb ? K : N}, rng));
                Tensor C6 = Tensor::zeros({M, N}).to(Device::CUDA), C3 = Tensor::zeros({M, N}).to(Device::CUDA);
                cuda::gemm(ta, tb, M, N, K, 1.0f, A.data<float>(), ta ? M : K, B.data<float>(), tb ? K : N, 0.0f,
                           C6.data<float>(), N);
                cuda::lab::gemm_register_tiled(ta, tb, M, N, K, 1.0f, A.data<float>(), ta ? M : K, B.data<float>(),
                                               tb ? K : N, 0.0f, C3.data<float>(), N);
                test::require_identical(C6, C3);
            }
}

TEST_CASE("cuda gemm: alpha = 0 or K = 0 gives beta·C and reads neither A nor B", "[cuda][lesson04][gemm]") {
    //   C = [1 2 3],  beta = 2  ->  [2 4 6];   beta = 0  ->  [0 0 0] even where C was NaN
    Tensor C = Tensor::zeros({1, 3});
    for (int i = 0; i < 3; i++) C.set({0, i}, i + 1);
    Tensor nan = Tensor::full({1, 1}, std::nan("")).to(Device::CUDA);  // A and B: NaN if read
    for (int64_t K : {int64_t(0), int64_t(1)}) {
        Tensor dC = cuda_copy(C);
        const float alpha = K == 0 ? 1.0f : 0.0f;
        cuda::gemm(false, false, 1, 3, K, alpha, nan.data<float>(), 1, nan.data<float>(), 3, 2.0f, dC.data<float>(), 3);
        Tensor got = host(dC);
        for (int i = 0; i < 3; i++) REQUIRE(got.get({0, i}) == 2.0 * (i + 1));
        Tensor dn = Tensor::full({1, 3}, std::nan("")).to(Device::CUDA);
        cuda::gemm(false, false, 1, 3, K, alpha, nan.data<float>(), 1, nan.data<float>(), 3, 0.0f, dn.data<float>(), 3);
        for (int i = 0; i < 3; i++) REQUIRE(host(dn).get({0, i}) == 0.0);
    }
    cuda::gemm<float>(false, false, 0, 5, 5, 1.0f, nullptr, 5, nullptr, 5, 0.0f, nullptr, 5);  // M = 0: no launch
}

TEST_CASE("cuda matmul through the ops layer, as Linear uses it", "[cuda][lesson04][gemm]") {
    Rng rng(29);
    Tensor x = random({64, 784}, rng), w = random({10, 784}, rng);
    Tensor want = matmul(x, w, false, true);
    under_schedules([&] { require_close(matmul(cuda_copy(x), cuda_copy(w), false, true), want, 1e-5, 2e-6 * 785); });
}

// ---- loss --------------------------------------------------------------------------------------------
TEST_CASE("cuda softmax cross-entropy matches the CPU", "[cuda][lesson04][loss]") {
    Rng rng(31);
    // C = 300 > 128 threads: each thread takes several classes of its row.
    const int64_t shapes[][2] = {{1, 1}, {1, 10}, {64, 10}, {3, 300}, {200, 7}};
    for (auto [N, C] : shapes)
    for (float smoothing : {0.0f, 0.2f}) {  // 0.2: label smoothing (chapter 13)
        INFO("N = " << N << ", C = " << C << ", label smoothing " << smoothing);
        for (float range : {3.0f, 1e4f}) {  // ±1e4: exp would overflow without subtracting the max
            INFO("logits in ±" << range);
            Tensor z = random({N, C}, rng, -range, range);
            Tensor y = Tensor::empty({N}, DType::I32);
            for (int64_t n = 0; n < N; n++) y.data<int32_t>()[n] = int32_t(rng.next_below(uint64_t(C)));
            Tensor dz;
            const float want = softmax_cross_entropy(z, y, &dz, nullptr, smoothing);
            Tensor dz_cuda;
            const Tensor zc = cuda_copy(z), yc = cuda_copy(y);
            under_schedules([&] {
                const float got = softmax_cross_entropy(zc, yc, &dz_cuda, nullptr, smoothing);
                REQUIRE(std::isfinite(got));
                REQUIRE(got == Approx(want).epsilon(1e-5).margin(1e-6));
                require_close(dz_cuda, dz, 1e-5, 1e-7);
                REQUIRE(softmax_cross_entropy(zc, yc, nullptr, nullptr, smoothing) == got);  // without the gradient, the same loss
            });
        }
    }
}

// The training step's one read-back: the loss, the rows predicted right and the labels' check.
TEST_CASE("cuda softmax cross-entropy counts the correct rows and checks the labels on the device",
          "[cuda][lesson04][loss]") {
    Rng rng(33);
    const int64_t N = 300, C = 7;  // N > 65535 is not needed: the grid-stride loop is the same code
    Tensor z = random({N, C}, rng, -1.0f, 1.0f);
    Tensor y = Tensor::empty({N}, DType::I32);
    for (int64_t n = 0; n < N; n++) y.data<int32_t>()[n] = int32_t(rng.next_below(uint64_t(C)));
    // Ties: the first maximum is the prediction (argmax_rows), so row 0 is right and row 1 wrong.
    for (int64_t n : {0, 1}) {
        z.set({n, 2}, 5.0);
        z.set({n, 4}, 5.0);
    }
    y.set({0}, 2);
    y.set({1}, 4);
    const int64_t want = count_equal(argmax_rows(z), y);
    REQUIRE(want > 1);  // some rows right, some wrong: the count is not trivially 0 or N
    REQUIRE(want < N);
    int64_t cpu_correct = -1;
    softmax_cross_entropy(z, y, nullptr, &cpu_correct);
    REQUIRE(cpu_correct == want);
    const Tensor zc = cuda_copy(z), yc = cuda_copy(y);
    under_schedules([&] {
        int64_t correct = -1;
        Tensor dz;
        softmax_cross_entropy(zc, yc, &dz, &correct);
        REQUIRE(correct == want);
    });
    // A label outside [0, C): the first such row is named, as on the CPU.
    y.set({150}, -1);
    y.set({40}, int(C));
    for (Device device : {Device::CPU, Device::CUDA})
        REQUIRE_THROWS_WITH(softmax_cross_entropy(z.to(device), y.to(device)), Catch::Contains("label 7 at row 40"));
}

// ---- optimizer -------------------------------------------------------------------------------------
TEST_CASE("cuda sgd_update matches the CPU", "[cuda][lesson04][optim]") {
    Rng rng(37);
    // One group of segments of 1000, 0, 1 and 5000 elements: each call updates them all.
    const std::vector<int64_t> sizes = {1000, 0, 1, 5000};
    const int64_t count = int64_t(sizes.size());
    const auto data_of = [](std::vector<Tensor>& ts) {
        std::vector<float*> out;
        for (Tensor& t : ts) out.push_back(t.defined() ? t.data<float>() : nullptr);
        return out;
    };
    const auto make = [&](bool zero) {
        std::vector<Tensor> out;
        for (int64_t n : sizes) out.push_back(n == 0 ? Tensor() : zero ? Tensor::zeros({n}) : random({n}, rng));
        return out;
    };
    const auto copy = [](const std::vector<Tensor>& ts, bool to_cuda) {
        std::vector<Tensor> out;
        for (const Tensor& t : ts) out.push_back(!t.defined() ? Tensor() : to_cuda ? cuda_copy(t) : t.clone());
        return out;
    };
    struct Case { float momentum, dampening, wd; bool nesterov; };
    for (Case k : {Case{0, 0, 0, false}, Case{0.9f, 0, 0, false}, Case{0.9f, 0.1f, 1e-4f, false},
                   Case{0.9f, 0, 5e-4f, true}}) {
        INFO("momentum " << k.momentum << ", dampening " << k.dampening << ", wd " << k.wd << ", nesterov "
                         << k.nesterov);
        const std::vector<Tensor> p = make(false), g1 = make(false), g2 = make(false), buf = make(true);
        under_schedules([&] {
            std::vector<Tensor> hp = copy(p, false), hbuf = copy(buf, false), cp = copy(p, true), cbuf = copy(buf, true);
            int step = 0;
            for (const std::vector<Tensor>* g : {&g1, &g2}) {  // the first step, then one with a momentum buffer
                const SgdParams s{0.05f, k.momentum, k.dampening, k.wd, k.nesterov, step == 0};
                std::vector<Tensor> hg = copy(*g, false), dg = copy(*g, true);
                cpu::sgd_update(data_of(hp).data(), data_of(hg).data(), data_of(hbuf).data(), sizes.data(), count, s);
                cuda::sgd_update(data_of(cp).data(), data_of(dg).data(), data_of(cbuf).data(), sizes.data(), count, s);
                step++;
            }
            for (size_t t = 0; t < sizes.size(); t++) {
                if (sizes[t] == 0) continue;
                require_close(cp[t], hp[t], 1e-6, 1e-7);
                require_close(cbuf[t], hbuf[t], 1e-6, 1e-7);
            }
        });
    }
}
