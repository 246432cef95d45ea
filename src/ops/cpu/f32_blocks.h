// f32_blocks.h — an f32 loop run over f16/bf16 tensors a block at a time (chapter 09).
//
// An elementwise kernel templated on the element type T reads
//     y[i] = T(float(a[i]) + float(b[i]));
// For T = float the casts vanish and g++ vectorizes the loop. For T = f16 or bf16 each cast is
// dtype.h's integer code, one element at a time, and g++ leaves the whole loop scalar. So the
// conversions are taken out of the loop, and done a block at a time by the CPU's vector kernels:
//
//   for each block of kSimdBlock elements (whole blocks shared among the threads):
//       a, b → float buffers on the stack     convert_simd.h: F16C vcvtph2ps, AVX2 shifts
//       y = a + b                             the f32 loop, exactly what T = float runs
//       y → T                                 convert_simd.h again: vcvtps2ph, AVX2 rounding
//
// For T = float nothing is copied: the loop gets the tensors' own pointers. The kernels give
// dtype.h's bits and the loop is the f32 one, so the result is the element-by-element loop's,
// bit for bit (but for which of two NaNs a + b returns, which IEEE 754 leaves to the machine).
// The blocks depend on n only, not on the thread count, and inside a block the compiler's vector
// loop starts at the block's first element: every element goes through the same instructions
// (vector body or scalar tail) on any thread count.
//
//   parallel_f32_blocks(n, a, b, y, [](const float* a, const float* b, float* y, int64_t m, int64_t) {
//       for (int64_t i = 0; i < m; i++) y[i] = a[i] + b[i];
//   });
//
// The body gets one block: m elements of each input as floats, then the f32 output to fill,
// then m and i0, the block's first index in [0, n) (for what lies outside the block: a mask, a
// per-column γ, a counter). The output may be one of the inputs (y = a · b into a): for f16 and
// bf16 the inputs are widened before the output is stored; for T = float the body gets the same
// pointer twice, which an elementwise loop (element i read, then written) allows.
// f32_blocks is the same on the calling thread, for a run inside a loop that is already parallel
// (a row of layer norm).
//
// Why: element by element, the scalar conversions cost more than the arithmetic they surround;
// in blocks they are a few vector instructions per 8 or 16 elements, and the loop between them
// runs at the f32 loop's speed.
#pragma once
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/parallel.h"
#include "ops/cpu/convert_simd.h"

namespace kiln::cpu {

constexpr int64_t kSimdBlock = 4096;  // elements: GELU's backward holds 3 blocks, 48 KiB of stack
constexpr int64_t kSimdBlocksParallelMin = 1 << 15;  // elements; below this one thread is faster
constexpr int64_t kShortRun = 16;  // elements; a shorter run goes element by element (f32_run)

// A block's input x[0, m) as floats: widened into a buffer on the stack, or for T = float the
// data itself.
template <typename T>
class F32In {
public:
    F32In(const T* x, int64_t m) { widened(x, m, buf_); }
    const float* data() const { return buf_; }

private:
    float buf_[kSimdBlock];
};

template <>
class F32In<float> {
public:
    F32In(const float* x, int64_t) : x_(x) {}
    const float* data() const { return x_; }

private:
    const float* x_;
};

// A block's output y[0, m) as floats: the loop writes data(), store() rounds it into y. For
// T = float data() is y itself and store() does nothing.
template <typename T>
class F32Out {
public:
    F32Out(T* y, int64_t m) : y_(y), m_(m) {}
    float* data() { return buf_; }
    void store() { narrow_into(buf_, m_, y_); }

private:
    T* y_;
    int64_t m_;
    float buf_[kSimdBlock];
};

template <>
class F32Out<float> {
public:
    F32Out(float* y, int64_t) : y_(y) {}
    float* data() { return y_; }
    void store() {}

private:
    float* y_;
};

// Runs block(i0, m) for the blocks of [0, n), kSimdBlock elements each (the last one shorter),
// whole blocks shared among the threads.
template <typename Block>
void parallel_blocks(int64_t n, const Block& block) {
    const int64_t blocks = (n + kSimdBlock - 1) / kSimdBlock;
    parallel_for(blocks, grain_of(kSimdBlocksParallelMin, kSimdBlock), [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; b++) block(b * kSimdBlock, std::min(kSimdBlock, n - b * kSimdBlock));
    });
}

// One block: body(x[i0, i0 + m) as floats..., the output's floats, m, i0), stored into y.
template <typename T, typename Body, typename... In>
void f32_block(int64_t i0, int64_t m, const Body& body, T* y, const In*... x) {
    F32Out<T> out(y + i0, m);
    body(F32In<In>(x + i0, m).data()..., out.data(), m, i0);
    out.store();
}

// One element i of each input as a float, for body(..., 1, i).
template <typename T>
struct F32One {
    explicit F32One(T x) : value(float(x)) {}
    const float* data() const { return &value; }
    float value;
};

// The run [0, n) on this thread:
//   T = float        body over the whole run at once: nothing to convert, nothing to cut
//   n < kShortRun    element by element through body(..., 1, i) with dtype.h's casts, all
//                    inlined: for a short run the kernels' calls and the buffers' round trip
//                    cost more than the arithmetic (a batch norm over [N, C], rows of one
//                    element, ran its backward 1.7× slower in bf16 through them)
//   otherwise        block after block
template <typename T, typename Body, typename... In>
void f32_run(int64_t n, const Body& body, T* y, const In*... x) {
    if constexpr (std::is_same_v<T, float>) {
        body(x..., y, n, int64_t(0));
    } else if (n < kShortRun) {
        for (int64_t i = 0; i < n; i++) {
            float out;
            body(F32One<In>(x[i]).data()..., &out, 1, i);
            y[i] = T(out);
        }
    } else {
        for (int64_t i0 = 0; i0 < n; i0 += kSimdBlock) f32_block(i0, std::min(kSimdBlock, n - i0), body, y, x...);
    }
}

// body over [0, n) on this thread: one input x, or two a and b.
template <typename T, typename Body>
void f32_blocks(int64_t n, const T* x, T* y, const Body& body) {
    f32_run(n, body, y, x);
}

template <typename T, typename Body>
void f32_blocks(int64_t n, const T* a, const T* b, T* y, const Body& body) {
    f32_run(n, body, y, a, b);
}

// The same with the blocks shared among the threads.
template <typename T, typename Body>
void parallel_f32_blocks(int64_t n, const T* x, T* y, const Body& body) {
    parallel_blocks(n, [&](int64_t i0, int64_t m) { f32_block(i0, m, body, y, x); });
}

template <typename T, typename Body>
void parallel_f32_blocks(int64_t n, const T* a, const T* b, T* y, const Body& body) {
    parallel_blocks(n, [&](int64_t i0, int64_t m) { f32_block(i0, m, body, y, a, b); });
}

// ---- a scatter's sums in f32 ----------------------------------------------------------------------
// A pass that scatters (col2im, the pooling backwards, the depthwise convolution) adds several
// terms into one output element with +=. In f16 or bf16 each += would round; instead the plane
// is summed in a float scratch and rounded into the output once, at the end:
//     F32Plane<T> acc(out, n, init);   float* a = acc.data();   a[i] += term; ...   acc.store();
// a[0 .. n) starts at init. store() rounds the plane with the CPU's vector kernel
// (convert_simd.h). For T = float the scratch is the output itself: the f32 kernels add into it
// exactly as they would without it, and store() does nothing.
template <typename T>
class F32Plane {
public:
    F32Plane(T* out, int64_t n, float init = 0.0f) : out_(out), sum_(size_t(n), init) {}
    float* data() { return sum_.data(); }
    void store() { narrow_into(sum_.data(), int64_t(sum_.size()), out_); }

private:
    T* out_;
    std::vector<float> sum_;
};

template <>
class F32Plane<float> {
public:
    F32Plane(float* out, int64_t n, float init = 0.0f) : out_(out) {
        std::fill(out, out + n, init);
    }
    float* data() { return out_; }
    void store() {}

private:
    float* out_;
};

}  // namespace kiln::cpu
