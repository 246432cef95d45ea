// symbols.h — where a kernel's static __shared__ arrays live, read from the program's symbols.
//
// On the emulator `__shared__ float As[16][17];` in a kernel is a `static thread_local` array:
// one copy per OS thread, i.e. per running block. To poison and race-check it like dynamic
// shared memory, the emulator must know its address and size without a change to the kernel.
// The compiler names such an array after its function (the C++ ABI's local-entity name):
//   kernel        _ZN4kiln4cuda10gemm_smemEPKf...      (mangled)
//   its array     _ZZN4kiln4cuda10gemm_smemEPKf...E2As  ("_ZZ" + kernel without "_Z" + "E" + name)
// and the executable's symbol table (.symtab) gives each thread-local variable's offset in the
// thread-local block and its size. Every OS thread's block has the same layout, so the array
// lies at a fixed distance from any other thread-local variable of the program: from threadIdx.
//
// Arrays declared in a __device__ function (or at namespace scope) are not named after a kernel:
// emu.h's __shared__ and __global__ tag the names they declare (an ABI tag, `B11kiln_shared`,
// `B11kiln_kernel`), so an array without a kernel's tag belongs to every launch.
//
// What this cannot see (the arrays are then neither poisoned nor race-checked): a stripped
// program (no .symtab), and an emulator linked as a shared library (its thread-local block is
// not the executable's).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace kiln::emu {

struct StaticShared {
    std::ptrdiff_t from_thread_idx;  // its address minus &threadIdx, the same on every OS thread
    std::size_t bytes;
    std::string name;                // as declared: "As"
};

// The static __shared__ arrays declared in the kernel at `kernel` (its address), then those
// declared outside kernels; read from the symbol table once per program, then cached. Empty when
// there are none or they cannot be found (above).
const std::vector<StaticShared>& static_shared_arrays(const void* kernel);

}  // namespace kiln::emu
