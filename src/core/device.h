// device.h — where a tensor's memory lives. Moving between devices is always an explicit
// Tensor::to(device): kiln makes no hidden copies.
#pragma once
#include <cstdint>

namespace kiln {

enum class Device : uint8_t { CPU, CUDA };

inline const char* device_name(Device d) { return d == Device::CPU ? "cpu" : "cuda"; }

}  // namespace kiln
