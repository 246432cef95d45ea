// test_sparse.cpp — the CSR weight format and csr_linear (ops/sparse.h, ops/cpu/sparse.cpp,
// cuda/sparse.cu) and SparseLinear (nn/sparse_linear.h), chapter 10: a 3×4 matrix whose arrays
// are written out by hand, round trips, csr_linear against the dense x · Wᵀ + b from 0% to
// 100% sparsity, the CUDA kernel (on the emulator) against the CPU's, a pruned MLP against its
// sparse twin, and the errors.
//
// Tolerance of csr_linear against the dense product (matmul + add_bias_): both compute
// y[n, o] = Σ_c W[o, c]·x[n, c] + b[o] in f32, in different orders (CSR skips the zeros and adds
// in column order; the GEMM blocks the sum). Each is a sum of at most in + 1 terms, so each is
// within γ_{in+1}·S of the exact value, with S = Σ_c |W[o, c]·x[n, c]| + |b[o]| and
// γ_n = n·u/(1 − n·u), u = 2^-24 (Higham, Accuracy and Stability, §3.1); the two differ by at
// most twice that. The test computes S per element (in double) and checks that bound.
//
//   make test T='[sparse]'
#include <catch2/catch.hpp>

#include <omp.h>

#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/rng.h"
#include "fixtures.h"
#include "nn/models.h"
#include "nn/sparse_linear.h"
#include "train/checkpoint.h"
#include "ops/ops.h"
#include "ops/sparse.h"

using namespace kiln;
using Catch::Contains;
using test::require_identical;
using test::under_schedules;

namespace {

// A uniform [rows, cols] matrix with a `sparsity` fraction of its entries set to 0 (each
// entry by a coin of that weight), and its row `zero_row` all 0 when it is ≥ 0.
Tensor pruned_matrix(int64_t rows, int64_t cols, double sparsity, Rng& rng, int64_t zero_row = -1) {
    Tensor w = Tensor::uniform({rows, cols}, -1.0f, 1.0f, rng);
    float* a = w.data<float>();
    for (int64_t i = 0; i < w.numel(); i++)
        if (double(rng.next_below(1 << 20)) < sparsity * (1 << 20) || i / cols == zero_row) a[i] = 0.0f;
    return w;
}

// The dense layer: x · Wᵀ + b, through the GEMM the trainers use.
Tensor dense_linear(const Tensor& x, const Tensor& w, const Tensor& b) {
    Tensor y = matmul(x, w, false, true);
    add_bias_(y, b);
    return y;
}

// |got − want| ≤ 2·γ_{in+1}·(Σ_c |W[o,c]·x[n,c]| + |b[o]|) for every element (the file's header).
void require_within_sum_bound(const Tensor& got, const Tensor& want, const Tensor& x, const Tensor& w,
                              const Tensor& b) {
    const int64_t N = x.size(0), in = x.size(1), out = w.size(0);
    const double u = std::ldexp(1.0, -24), n = double(in + 1), gamma = n * u / (1 - n * u);
    int64_t bad = 0;
    for (int64_t i = 0; i < N; i++)
        for (int64_t o = 0; o < out; o++) {
            double S = std::fabs(b.get({o}));
            for (int64_t c = 0; c < in; c++) S += std::fabs(w.get({o, c}) * x.get({i, c}));
            if (std::fabs(got.get({i, o}) - want.get({i, o})) > 2 * gamma * S) bad++;
        }
    REQUIRE(bad == 0);
}

}  // namespace

// The example of ops/sparse.h, written out:
// W = [ 0  2  0  0 ]    values    = [2, 1, 3, 4]     x = [ 1  2  3  4 ]   b = [0.5, −1, 2]
//     [ 0  0  0  0 ]    col_index = [1, 0, 2, 3]         [−1  0  1  2 ]
//     [ 1  0  3  4 ]    row_start = [0, 1, 1, 4]
//   y = x · Wᵀ + b = [ 2·2 + 0.5    0 − 1    1 + 9 + 16 + 2 ]  = [ 4.5  −1  28 ]
//                    [ 2·0 + 0.5    0 − 1   −1 + 3 +  8 + 2 ]    [ 0.5  −1  12 ]
// bytes: 4·4 (values) + 4·4 (col_index) + 4·4 (row_start) = 48, against 4·12 = 48 dense: at
// 67% sparsity a 3×4 matrix is break-even, the row_start term weighing on so small a matrix.
TEST_CASE("to_csr of a 3x4 matrix gives the arrays written out by hand", "[lesson10][sparse][cpu]") {
    Tensor w = Tensor::zeros({3, 4});
    w.set({0, 1}, 2);
    w.set({2, 0}, 1);
    w.set({2, 2}, 3);
    w.set({2, 3}, 4);
    const CsrMatrix m = to_csr(w);
    REQUIRE((m.rows == 3 && m.cols == 4 && m.nnz == 4));
    const std::vector<float> values{2, 1, 3, 4};
    const std::vector<int32_t> col_index{1, 0, 2, 3}, row_start{0, 1, 1, 4};
    for (int64_t k = 0; k < 4; k++) {
        CHECK(m.values.data<float>()[k] == values[size_t(k)]);
        CHECK(m.col_index.data<int32_t>()[k] == col_index[size_t(k)]);
    }
    for (int64_t r = 0; r < 4; r++) CHECK(m.row_start.data<int32_t>()[r] == row_start[size_t(r)]);
    REQUIRE(m.bytes() == 48);
    require_identical(to_dense(m), w);

    Tensor x = Tensor::zeros({2, 4}), b = Tensor::zeros({3});
    for (int64_t c = 0; c < 4; c++) {
        x.set({0, c}, double(c + 1));
        x.set({1, c}, double(c - 1));
    }
    b.set({0}, 0.5);
    b.set({1}, -1);
    b.set({2}, 2);
    const Tensor y = csr_linear(x, m, b);
    const std::vector<double> want{4.5, -1, 28, 0.5, -1, 12};
    for (int64_t i = 0; i < 6; i++) CHECK(y.data<float>()[i] == want[size_t(i)]);
    const Tensor y_no_bias = csr_linear(x, m);
    CHECK((y_no_bias.get({0, 0}) == 4 && y_no_bias.get({1, 1}) == 0 && y_no_bias.get({1, 2}) == 10));
}

TEST_CASE("to_csr keeps every nonzero and drops exact zeros; to_dense undoes it", "[lesson10][sparse][cpu]") {
    Rng rng(3);
    for (double sparsity : {0.0, 0.5, 0.9, 1.0}) {
        CAPTURE(sparsity);
        const Tensor w = pruned_matrix(13, 29, sparsity, rng, 4);
        const CsrMatrix m = to_csr(w);
        int64_t nonzeros = 0;
        for (int64_t i = 0; i < w.numel(); i++) nonzeros += w.data<float>()[i] != 0.0f;
        REQUIRE(m.nnz == nonzeros);
        REQUIRE(m.bytes() == 8 * nonzeros + 4 * (13 + 1));
        REQUIRE(m.row_start.data<int32_t>()[5] == m.row_start.data<int32_t>()[4]);  // the all-zero row 4
        require_identical(to_dense(m), w);
    }
    // −0 is a zero (left out); NaN and the smallest subnormal are not.
    Tensor w = Tensor::zeros({1, 4});
    w.set({0, 0}, -0.0);
    w.set({0, 1}, std::nan(""));
    w.set({0, 2}, std::ldexp(1.0, -149));
    REQUIRE(to_csr(w).nnz == 2);
}

TEST_CASE("csr_linear matches the dense x·Wᵀ + b from 0% to 100% sparsity", "[lesson10][sparse][cpu]") {
    Rng rng(7);
    // N = 1 (one panel, mostly padding), 35 (two panels of 16 and a tail of 3), 64; out = 70
    // spans three blocks of 32 output rows, the last one short.
    for (int64_t N : {1, 35, 64})
        for (double sparsity : {0.0, 0.5, 0.9, 0.99, 1.0}) {
            CAPTURE(N, sparsity);
            const Tensor w = pruned_matrix(70, 53, sparsity, rng, 2);
            const Tensor x = Tensor::uniform({N, 53}, -1.0f, 1.0f, rng);
            const Tensor b = Tensor::uniform({70}, -1.0f, 1.0f, rng);
            const Tensor y = csr_linear(x, to_csr(w), b);
            REQUIRE(y.shape() == Shape{N, 70});
            require_within_sum_bound(y, dense_linear(x, w, b), x, w, b);
            for (int64_t n = 0; n < N; n++) REQUIRE(y.get({n, 2}) == b.get({2}));  // the all-zero row: b alone
        }
}

TEST_CASE("csr_linear gives the same bits on 1 and 2 threads", "[lesson10][sparse][cpu]") {
    Rng rng(11);
    const Tensor w = pruned_matrix(300, 784, 0.9, rng);
    const Tensor x = Tensor::uniform({64, 784}, -1.0f, 1.0f, rng);
    const CsrMatrix m = to_csr(w);
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    const Tensor one = csr_linear(x, m);
    omp_set_num_threads(2);
    const Tensor two = csr_linear(x, m);
    omp_set_num_threads(saved);
    require_identical(one, two);
}

TEST_CASE("csr_linear on CUDA matches the CPU", "[lesson10][sparse][cuda]") {
    Rng rng(13);
    for (double sparsity : {0.0, 0.7, 1.0}) {
        CAPTURE(sparsity);
        const Tensor w = pruned_matrix(37, 300, sparsity, rng, 5);
        const Tensor x = Tensor::uniform({19, 300}, -1.0f, 1.0f, rng);
        const Tensor b = Tensor::uniform({37}, -1.0f, 1.0f, rng);
        const CsrMatrix m = to_csr(w);
        const Tensor want = csr_linear(x, m, b);
        const CsrMatrix md = to_csr(w.to(Device::CUDA));
        REQUIRE(md.device() == Device::CUDA);
        require_identical(to_dense(md), w);
        under_schedules([&] {
            // The same terms in the same order, but a term's product and sum may be one FMA on
            // one side and two roundings on the other (cuda/sparse.cu): the bound of the header.
            const Tensor got = csr_linear(x.to(Device::CUDA), md, b.to(Device::CUDA)).to(Device::CPU);
            require_within_sum_bound(got, want, x, w, b);
            for (int64_t n = 0; n < 19; n++) REQUIRE(got.get({n, 5}) == b.get({5}));  // the all-zero row
        });
    }
}

TEST_CASE("csr_linear and to_csr name the bad argument", "[lesson10][sparse][cpu][cuda]") {
    Rng rng(17);
    const Tensor w = pruned_matrix(4, 6, 0.5, rng);
    const CsrMatrix m = to_csr(w);
    const Tensor x = Tensor::ones({2, 6});
    REQUIRE_THROWS_WITH(csr_linear(Tensor::ones({2, 5}), m), Contains("csr_linear") && Contains("[N, 6]"));
    REQUIRE_THROWS_WITH(csr_linear(Tensor::ones({2, 6}, DType::F16), m), Contains("'x' should be f32"));
    REQUIRE_THROWS_WITH(csr_linear(x, m, Tensor::ones({5})), Contains("'bias' should have shape [4]"));
    REQUIRE_THROWS_WITH(csr_linear(x.to(Device::CUDA), m),
                        Contains("csr_linear: 'w.values' is on cpu but 'x' is on cuda") && Contains("model.to"));
    REQUIRE_THROWS_WITH(csr_linear(x, m, Tensor::ones({4}).to(Device::CUDA)), Contains("different devices"));
    CsrMatrix broken = m;
    broken.nnz += 1;
    REQUIRE_THROWS_WITH(csr_linear(x, broken), Contains("'w.values' should have shape"));
    REQUIRE_THROWS_WITH(to_csr(Tensor::ones({6})), Contains("to_csr") && Contains("matrix"));
    REQUIRE_THROWS_WITH(to_csr(Tensor::ones({2, 2}, DType::I32)), Contains("to_csr: 'dense' should be f32"));
}

TEST_CASE("a pruned MLP with SparseLinear layers predicts what the dense one does", "[lesson10][sparse][cpu]") {
    Rng rng(19);
    auto model = mlp(rng, 300, 100);  // 784-300-100-10
    // Magnitude pruning by hand: every weight below 0.9 of its layer's bound set to 0 — about 90%.
    int64_t linears = 0;
    for (auto& [name, p] : model->named_parameters()) {
        if (p->value.ndim() != 2) continue;
        const float bound = 1.0f / std::sqrt(float(p->value.size(1)));  // Linear's U(−bound, bound)
        float* a = p->value.data<float>();
        for (int64_t i = 0; i < p->value.numel(); i++)
            if (std::fabs(a[i]) < 0.9f * bound) a[i] = 0.0f;
        linears++;
    }
    REQUIRE(linears == 3);
    model->eval();
    // Each Linear's input and output in the dense model, by its path.
    std::map<std::string, std::pair<Tensor, Tensor>> seen;
    for (auto& [path, m] : model->named_modules())
        if (dynamic_cast<Linear*>(m))
            m->register_forward_hook([&seen, path = path](Module&, const Tensor& in, Tensor& out) {
                seen[path] = {in.clone(), out.clone()};
            });
    const Tensor x = Tensor::uniform({32, 1, 28, 28}, 0.0f, 1.0f, rng);
    const Tensor dense_logits = model->call(x);
    REQUIRE(seen.size() == 3);

    REQUIRE(sparsify_linears(*model) == 3);
    // Layer by layer, on the dense layer's own input: within the bound of the file's header.
    for (auto& [path, in_out] : seen) {
        auto& fc = dynamic_cast<SparseLinear&>(model->module_at(path));
        CAPTURE(path);
        CHECK(fc.weight.nnz < fc.in_features * fc.out_features / 5);
        require_within_sum_bound(fc.call(in_out.first), in_out.second, in_out.first, to_dense(fc.weight), fc.bias);
    }
    // The whole model: the same predictions (a prediction would change only where two logits are
    // closer than the layers' rounding differences, ~1e-5 here).
    const Tensor sparse_logits = model->call(x);
    REQUIRE(sparse_logits.shape() == dense_logits.shape());
    require_identical(argmax_rows(sparse_logits), argmax_rows(dense_logits));
    auto* fc = dynamic_cast<SparseLinear*>(&model->module_at(seen.begin()->first));

    // Moved with the model (its buffers), on the emulator too.
    model->to(Device::CUDA);
    const Tensor cuda_logits = model->call(x.to(Device::CUDA));
    require_identical(argmax_rows(cuda_logits).to(Device::CPU), argmax_rows(dense_logits));

    // Inference only; a second sparsify finds nothing left to replace.
    REQUIRE_THROWS_WITH(fc->backward(Tensor::ones({32, fc->out_features})),
                        Contains(fc->name()) && Contains("inference") && Contains("masked dense"));
    REQUIRE(sparsify_linears(*model) == 0);
}

namespace {

// fc1 6→4 (no zero in its weight), fc2 4→3 without bias, its W[1, 2] set to 0; seed picks W.
std::unique_ptr<Sequential> two_linears(uint64_t seed) {
    Rng rng(seed);
    auto model = std::make_unique<Sequential>("net");
    model->add("fc1", std::make_unique<Linear>(6, 4, rng));
    model->add("fc2", std::make_unique<Linear>(4, 3, rng, false));
    model->module_at("fc2").named_parameters()[0].second->value.set({1, 2}, 0.0);
    return model;
}

}  // namespace

TEST_CASE("SparseLinear leaves a Linear without zeros dense and says what a step allocates",
          "[lesson10][sparse][cpu]") {
    auto net = two_linears(23);
    Sequential& model = *net;
    REQUIRE(sparsify_linears(model) == 1);
    REQUIRE(dynamic_cast<Linear*>(&model.module_at("fc1")) != nullptr);
    auto& fc2 = dynamic_cast<SparseLinear&>(model.module_at("fc2"));
    REQUIRE(fc2.name() == "fc2");
    REQUIRE(fc2.weight.nnz == 11);
    REQUIRE(!fc2.bias.defined());
    // Its buffers are the checkpoint's keys.
    std::vector<std::string> names;
    for (auto& [name, t] : model.named_buffers()) names.push_back(name);
    REQUIRE(names == std::vector<std::string>{"fc2.weight_values", "fc2.weight_col_index", "fc2.weight_row_start"});

    const LayerMemory mem = fc2.memory(Shape{8, 4}, Device::CPU);
    REQUIRE(mem.output == Shape({8, 3}));
    REQUIRE(mem.parameters.empty());
    REQUIRE(mem.buffers == std::vector<Shape>{Shape{11}, Shape{11}, Shape{4}});
    REQUIRE(!mem.keeps_input);
    REQUIRE_THROWS_WITH(fc2.forward(Tensor::ones({2, 5})), Contains("fc2: expected input [N, 4]"));

    // A checkpoint of the sparse model (safetensors, i32 index arrays included) loads into a
    // model sparsified from other weights with the same zeros, and makes it compute the same.
    test::TempDir dir;
    StateDict saved;
    save_model(saved, model);
    write_safetensors(dir.file("sparse.safetensors"), saved);
    auto other = two_linears(29);
    REQUIRE(sparsify_linears(*other) == 1);
    const Tensor x = Tensor::ones({2, 6});
    load_model(read_safetensors(dir.file("sparse.safetensors")), *other);
    require_identical(other->call(x), model.call(x));

    model.to(Device::CUDA);
    REQUIRE_THROWS_WITH(fc2.forward(Tensor::ones({2, 4})), Contains("fc2") && Contains("model.to"));
}
