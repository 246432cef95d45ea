// lowp_check.h — an op in f16 and bf16 (chapter 09) checked against the same op in f32, within a
// bound derived from the arithmetic, on the CPU and on the CUDA kernels (the emulator without a
// GPU); and the CPU against CUDA in f16. Each op's cases live in its own test file, tagged [lowp]
// (or [dtype]) and with the op's tag: test_conv.cpp, test_pool.cpp, test_norm.cpp, test_gelu.cpp,
// test_dropout.cpp, and with the sharper bound of a kernel that rounds once (require_rounded_once
// below) test_gemm.cpp, test_ops.cpp and test_conv.cpp's tensor-core cases.
//
// ---- The inputs -----------------------------------------------------------------------------
// Random f32 values rounded to T first, so that the f16 (or bf16) op and the f32 op start from
// exactly the same numbers: every difference comes from the arithmetic, none from the inputs.
//
// ---- The bound, derived ----------------------------------------------------------------------
// Let y be an output element and S = Σ|terms| the sum of the absolute values of what it adds
// (for a convolution Σ|w·x| + |b|: the same op run in f32 on |x|, |w|, |b|; for an op that is
// not a sum — GELU, a norm's normalized value — S = |y|). Each side's error against exact
// arithmetic is:
//   f32 accumulation of n terms          ≤ n·2^-24 · S   (each of the n additions rounds to f32)
//   rounding the result to T, r times    ≤ r·u · S       (u = 2^-11 for f16, 2^-8 for bf16; |y| ≤ S)
// The T op pays both, the f32 reference the first only, in another order perhaps, so
//   |y_T − y_f32| ≤ (r·u + 2·n·2^-24) · S + tiny
// with tiny = half the smallest subnormal of T (2^-25 for f16; 2^-134 for bf16), the absolute
// error of rounding a result that falls below T's normal range. r is 1 for every result except:
//   conv dx                  2   the GEMM's dcol is stored in T, then col2im adds (cpu/conv.cpp)
//   conv dw, CPU pointwise   N   added image by image into dw of T (cpu/conv.cpp)
// and 0 for the norms' f32 statistics and parameter gradients (never rounded to T).
// CPU against CUDA, both in f16: each is within its bound of the exact value, so the two are
// within (r_cpu + r_cuda)·u·S + 2·n·2^-24·S of each other, plus, for the ops whose f32 results
// already differ between the devices beyond summation order (the device's erff and expf in GELU,
// double sums in another order in the norms), the tolerance their f32 CUDA cases allow them.
//
#pragma once
#include <omp.h>

#include <catch2/catch.hpp>
#include <functional>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "fixtures.h"

namespace kiln::test::lowp {

constexpr double kF32Unit = 0x1p-24;  // f32's unit roundoff

using LowType = LowFormat;  // unit roundoff u, half the smallest subnormal
extern const LowType kF16, kBF16;

// Uniform values in [lo, hi), rounded to T and held as f32 on the CPU.
Tensor values_in(const LowType& t, const Shape& shape, float lo, float hi, Rng& rng);
Tensor host_f32(const Tensor& t);
Tensor abs_of(const Tensor& t);
// The largest |value| of a tensor: the scale of a relative tolerance over the whole tensor.
double max_abs(const Tensor& t);

// One result of an op: how to bound it (see the header).
struct Bound {
    Tensor S;        // Σ|terms| per element, f32 on the CPU
    double n;        // terms summed in f32
    double r_cpu;    // roundings to T on the CPU
    double r_cuda;   // and on CUDA
    double gap = 0;  // CPU against CUDA: how far their f32 results may differ besides (absolute)
};

// An op to check: run(device, dtype) converts the inputs (f32 values representable in T) to
// dtype on device, runs the op and returns its results as f32 tensors on the CPU.
struct OpCheck {
    std::function<std::vector<Tensor>(Device, DType)> run;
    std::vector<Bound> bounds;
};

// Every element: |got − want| ≤ rel·S + tiny.
void require_within(const Tensor& got, const Tensor& want, const Tensor& S, double rel, double tiny);

// ---- A kernel that sums in f32 and rounds once -------------------------------------------------
// got, a T result (any device), against want, the f32 op on the same values (CPU). When the T
// kernel sums its R terms in f32, in another order than the reference perhaps (tiles, blocks),
// and rounds the result to T once, the bound above sharpens to
//   |got − want| ≤ u·|want| + tiny + 2(R + 2)·eps_f32·S
// (eps_f32 = 2^-23): the one rounding of the output relative to the result itself, and two f32
// sums of R terms in any order, each within R·eps_f32·S of the exact one, plus the roundings of
// alpha and beta. R = 0 with S undefined: an elementwise op, no sums. Also REQUIREs got's dtype.
void require_rounded_once(const Tensor& got, const Tensor& want, const LowType& t, int64_t R, const Tensor& S);
void check_against_f32(const OpCheck& op, Device device, const LowType& t);
void check_cpu_against_cuda(const OpCheck& op);
// The op built by make(t) for each type against f32 on the device; on CUDA (under each of the
// emulator's schedules) also against the CPU in f16.
void check_op(Device device, const std::function<OpCheck(const LowType&)>& make);

// ---- The CPU kernels that run their f32 loop in blocks (ops/cpu/f32_blocks.h) -----------------
// Such a kernel widens a block of T to f32, runs the f32 loop, and rounds each result to T once:
// its T result must be, bit for bit, the f32 kernel's result on the widened inputs, rounded. The
// cases: test_ops.cpp (elementwise), test_norm.cpp (batch and layer norm), test_pool.cpp
// (pooling backward).
template <typename T>
std::vector<float> widen_each(const std::vector<T>& v) {
    std::vector<float> w(v.size());
    for (size_t i = 0; i < v.size(); ++i) w[i] = float(v[i]);
    return w;
}

// op(a, b, y) run on T and on float: y in T must hold, bit for bit, the float y rounded element
// by element with dtype.h's T(float).
template <typename T, typename Op>
void check_bits_rounded_once(const char* name, const std::vector<T>& a, const std::vector<T>& b, Op op) {
    INFO(name << " on " << a.size() << " elements");
    std::vector<T> y(a.size());
    std::vector<float> y32(a.size());
    op(a, b, y);
    op(widen_each(a), widen_each(b), y32);
    REQUIRE(y.size() == y32.size());
    size_t wrong = 0, first = 0;
    for (size_t i = 0; i < y.size(); ++i)
        if (y[i].bits != T(y32[i]).bits && wrong++ == 0) first = i;
    INFO(wrong << " wrong results, the first at index " << first);
    CHECK(wrong == 0);
}

// Each check at every runnable level (the portable and the vector conversions) on 1 and 2 threads.
template <typename F>
void on_each_level_and_thread_count(F check) {
    const int saved = omp_get_max_threads();
    for (int threads : {1, 2}) {
        omp_set_num_threads(threads);
        INFO(threads << " thread(s)");
        under_each_level([&] {
            INFO("level " << cpu_level_name(cpu_level()));
            check();
            return 0;
        });
    }
    omp_set_num_threads(saved);
}

}  // namespace kiln::test::lowp
