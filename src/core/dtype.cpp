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
