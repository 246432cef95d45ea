// dtype.cpp — sizes and names of the dtypes (the conversions are inline in dtype.h, so that
// CUDA kernels can use them too).
#include "core/dtype.h"

namespace kiln {

size_t dtype_size(DType t) {
    switch (t) {
        case DType::F32: case DType::I32: return 4;
        case DType::F16: case DType::BF16: return 2;
        case DType::I8: case DType::U8: return 1;
    }
    KILN_FAIL("unknown dtype ", int(t));
}

FloatFormat float_format(DType t) {
    KILN_CHECK(t == DType::F32 || t == DType::F16 || t == DType::BF16, "float_format: ", dtype_name(t),
               " is not a floating-point type");
    const int E = t == DType::F16 ? 5 : 8, M = t == DType::F32 ? 23 : t == DType::F16 ? 10 : 7;
    const auto value = [t](uint32_t bits) -> double {  // the number these bits stand for
        if (t == DType::F16) return f16_to_f32(uint16_t(bits));
        if (t == DType::BF16) return bf16_to_f32(uint16_t(bits));
        return float_of(bits);
    };
    const uint32_t bias = (1u << (E - 1)) - 1, mantissa_ones = (1u << M) - 1;
    FloatFormat f{E, M, 0, 0, 0, 0};
    f.max = value((((1u << E) - 2) << M) | mantissa_ones);
    f.min_normal = value(1u << M);
    f.min_subnormal = value(1u);
    f.epsilon = value((bias << M) | 1u) - 1.0;
    return f;
}

const char* dtype_name(DType t) {
    switch (t) {
        case DType::F32: return "f32";
        case DType::F16: return "f16";
        case DType::BF16: return "bf16";
        case DType::I8: return "i8";
        case DType::I32: return "i32";
        case DType::U8: return "u8";
    }
    return "?";
}

}  // namespace kiln
