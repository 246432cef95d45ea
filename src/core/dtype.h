// dtype.h — element types of a tensor and the conversions between them.
//
//   f32  IEEE 754 single: 1 sign, 8 exponent, 23 mantissa bits   (kiln's default)
//   f16  IEEE 754 half:   1 sign, 5 exponent, 10 mantissa bits   (max 65504, mixed precision)
//   bf16 "brain float":   1 sign, 8 exponent,  7 mantissa bits   (f32's range, less precision)
//   i8, i32, u8           integers (quantized weights, labels, raw pixels)
//
// f16 and bf16 are stored as uint16_t bit patterns; the conversions round to nearest, ties to
// even, and keep inf, NaN and subnormals what they are.
#pragma once
#include <cstddef>
#include <cstdint>

namespace kiln {

enum class DType : uint8_t { F32, F16, BF16, I8, I32, U8 };

size_t dtype_size(DType t);       // bytes per element: 4, 2, 2, 1, 4, 1
const char* dtype_name(DType t);  // "f32", "f16", ...
bool dtype_is_float(DType t);

// Bit-exact conversions (round to nearest even).
uint16_t f32_to_f16(float x);
float f16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float x);
float bf16_to_f32(uint16_t b);

// The C++ type that stores each dtype, for Tensor::data<T>() checks.
template <typename T> struct dtype_of;
template <> struct dtype_of<float>   { static constexpr DType value = DType::F32; };
template <> struct dtype_of<int8_t>  { static constexpr DType value = DType::I8; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::I32; };
template <> struct dtype_of<uint8_t> { static constexpr DType value = DType::U8; };
// f16 and bf16 are both uint16_t bit patterns; data<uint16_t>() accepts either.

}  // namespace kiln
