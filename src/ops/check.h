// check.h — the argument checks that every op in src/ops/ makes once, before it picks a kernel,
// and the one place that turns a tensor's dtype into the kernel's C++ type.
#pragma once
#include <initializer_list>
#include <utility>

#include "core/tensor.h"

namespace kiln {

// A tensor an op takes, with the name its error messages use.
struct Arg {
    const Tensor& t;
    const char* name;
};

// Each tensor is defined, f32, f16 or bf16 (the types every kernel of src/ops/ is instantiated
// for), of the first tensor's dtype, and on the first tensor's device. A failure names the op
// and the tensor and says what to do. Returns the device.
Device check_args(const char* op, std::initializer_list<Arg> args);

// Each tensor is defined, f32 whatever the dtype of `like`, and on like's device: the norms'
// parameters and statistics (gamma, beta, the running and saved statistics, their gradients),
// which stay f32 when the activations are f16 or bf16.
void check_f32_args(const char* op, const Arg& like, std::initializer_list<Arg> args);

// Runs f(T{}) for the dtype of t: T = float, f16 or bf16 (check_args has refused the others).
template <typename F> decltype(auto) for_dtype(const Tensor& t, F&& f) {
    return visit_dtype</*FloatsOnly=*/true>(t.dtype(), std::forward<F>(f));
}

}  // namespace kiln
