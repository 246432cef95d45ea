// check.h — the argument check that every op in src/ops/ makes once, before it picks a kernel.
#pragma once
#include <initializer_list>

#include "core/tensor.h"

namespace kiln {

// A tensor an op takes, with the name its error messages use.
struct Arg {
    const Tensor& t;
    const char* name;
};

// The element types an op's kernels are instantiated for.
enum class KernelTypes {
    Floats,   // f32, f16 and bf16 (GEMM, elementwise, reductions, the loss)
    F32Only,  // f32 (the CNN kernels; chapter 09 instantiates f16 and bf16)
};

// Each tensor is defined, of a dtype in `types`, of the first tensor's dtype, and on the first
// tensor's device. A failure names the op and the tensor and says what to do. Returns the device.
Device check_args(const char* op, std::initializer_list<Arg> args, KernelTypes types = KernelTypes::Floats);

}  // namespace kiln
