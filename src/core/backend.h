// backend.h — kiln's two backends, the CPU and CUDA, and the two things every kernel shares:
// how it is declared (once, for both backends) and how an op reaches it (dispatch, the one place
// in the engine that chooses a device and an element type).
//
// ---- Declaring a kernel once -------------------------------------------------------------------
// Every kernel has a CPU version (src/ops/cpu/F.cpp) and a CUDA twin (cuda/F.cu) with the same
// name and arguments. Its signature is written once, in its family's header (src/ops/<family>.h),
// with the formula above it:
//
//     // y = x · Φ(x)
//     KILN_KERNEL(gelu_forward, template <typename T> void gelu_forward(const T* x, T* y, int64_t n));
//
// which declares kiln::cpu::gelu_forward and kiln::cuda::gelu_forward, and the call
// kernel::gelu_forward(backend, x, y, n) that reaches one of them by the backend's type. A kernel
// only one backend has is KILN_CPU_KERNEL(declaration) or KILN_CUDA_KERNEL(declaration). Each
// kernel file instantiates its templates from the declaration, without writing it again:
//
//     KILN_INSTANTIATE_FLOAT(gelu_forward);   // for T = float, f16, bf16 (inside namespace cpu or cuda)
//
// ---- Dispatch ------------------------------------------------------------------------------------
//     dispatch(device, dtype, [&](auto be, auto tag) {
//         using T = decltype(tag);                     // float, f16 or bf16
//         kernel::gelu_forward(be, x.data<T>(), y.data<T>(), n);
//     });
// runs the lambda once, with be = Cpu{} or Cuda{} and T the element type: the kernel call is
// written once, and the `if` on the device is here alone. The lambda is compiled for both
// backends and all three types; the choice costs one branch per call, none per element.
#pragma once
#include <utility>

#include "core/device.h"
#include "core/dtype.h"

namespace kiln {

// The backends as types: the first argument of every kernel::f.
struct Cpu {
    static constexpr Device device = Device::CPU;
};
struct Cuda {
    static constexpr Device device = Device::CUDA;
};

// Runs f(Cpu{}) or f(Cuda{}), by d.
template <typename F> decltype(auto) on_backend(Device d, F&& f) {
    if (d == Device::CUDA) return f(Cuda{});
    return f(Cpu{});
}

// Runs f(backend, T{}) for device d and T the C++ type of the float dtype t (float, f16, bf16).
// Callers check dtypes first (ops/check.h), so that a wrong one fails with a message naming the
// tensor; an integer t fails here.
template <typename F> decltype(auto) dispatch(Device d, DType t, F&& f) {
    return on_backend(d, [&](auto be) -> decltype(auto) {
        return visit_dtype</*FloatsOnly=*/true>(t, [&](auto tag) -> decltype(auto) { return f(be, tag); });
    });
}

}  // namespace kiln

// KILN_KERNEL(name, declaration): the declaration in namespaces kiln::cpu and kiln::cuda, and
// kiln::kernel::name(Cpu or Cuda, args...) calling the one of that backend. Used inside namespace
// kiln.
#define KILN_KERNEL(name, ...)                                                       \
    namespace cpu {                                                                  \
    __VA_ARGS__;                                                                     \
    }                                                                                \
    namespace cuda {                                                                 \
    __VA_ARGS__;                                                                     \
    }                                                                                \
    namespace kernel {                                                               \
    template <typename... A> decltype(auto) name(Cpu, A&&... a) {                    \
        return ::kiln::cpu::name(std::forward<A>(a)...);                             \
    }                                                                                \
    template <typename... A> decltype(auto) name(Cuda, A&&... a) {                   \
        return ::kiln::cuda::name(std::forward<A>(a)...);                            \
    }                                                                                \
    }                                                                                \
    static_assert(true, "")

// A kernel one backend has: declared in its namespace only.
#define KILN_CPU_KERNEL(...)  \
    namespace cpu {           \
    __VA_ARGS__;              \
    }                         \
    static_assert(true, "")
#define KILN_CUDA_KERNEL(...) \
    namespace cuda {          \
    __VA_ARGS__;              \
    }                         \
    static_assert(true, "")

// The explicit instantiations of a kernel template, its signature taken from its declaration
// (decltype of the specialization): for the three float types, for the two 8-bit integer types
// (quantization), or for one type.
#define KILN_INSTANTIATE(name, ...) template decltype(name<__VA_ARGS__>) name<__VA_ARGS__>
#define KILN_INSTANTIATE_FLOAT(name) \
    KILN_INSTANTIATE(name, float);   \
    KILN_INSTANTIATE(name, ::kiln::f16); \
    KILN_INSTANTIATE(name, ::kiln::bf16)
#define KILN_INSTANTIATE_INT8(name) \
    KILN_INSTANTIATE(name, uint8_t); \
    KILN_INSTANTIATE(name, int8_t)
