// cuda_memory.h — the few CUDA runtime calls the engine's C++ side needs: device memory and
// copies. Implemented in cuda/memory.cu, which nvcc compiles for a GPU or g++ compiles
// against the kernel emulator (cuda/emu/), so the engine links the same way in both builds.
#pragma once
#include <cstddef>
#include <cstdint>

namespace kiln::cuda {

void* malloc_device(size_t bytes);  // nullptr when the device is out of memory
void free_device(void* ptr);
void copy_to_device(void* dst, const void* src, size_t bytes);
void copy_to_host(void* dst, const void* src, size_t bytes);
void copy_device_to_device(void* dst, const void* src, size_t bytes);
void memset_device(void* dst, int value, size_t bytes);
// Free and total memory of the device (cudaMemGetInfo); the emulator reports the host's.
void memory_info(size_t* free_bytes, size_t* total_bytes);
bool is_emulated();  // true when kernels run on the CPU emulator
void synchronize();
// "note: no GPU build — CUDA kernels run on kiln's emulator (slow, exact)" on the emulator,
// nullptr on a GPU build; a trainer run with --device cuda prints it once (first call only).
const char* emulator_note();
void print_emulator_note_once();

}  // namespace kiln::cuda
