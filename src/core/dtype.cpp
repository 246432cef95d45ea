// dtype.cpp — sizes, names, and the f16/bf16 bit conversions.
#include "core/dtype.h"

#include <cstring>

#include "core/error.h"

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

bool dtype_is_float(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

static uint32_t bits_of(float x) { uint32_t u; std::memcpy(&u, &x, 4); return u; }
static float float_of(uint32_t u) { float x; std::memcpy(&x, &u, 4); return x; }

// f32 -> f16. f32 = (-1)^s · 1.m · 2^(e-127); f16 = (-1)^s · 1.m · 2^(e-15), 10 mantissa bits.
//   |x| ≥ 65520            -> inf (65504 is the largest f16; halfway to 65536 rounds up)
//   2^-14 ≤ |x| < 65520    -> normal: drop 13 mantissa bits, round to nearest even
//   |x| < 2^-14            -> subnormal: m · 2^-24, rounded to nearest even (may become 0)
//   NaN stays NaN (quiet, top mantissa bit set); inf stays inf.
uint16_t f32_to_f16(float x) {
    uint32_t u = bits_of(x);
    uint16_t sign = uint16_t((u >> 16) & 0x8000u);
    uint32_t abs = u & 0x7fffffffu;
    if (abs >= 0x7f800000u)                                   // inf or NaN
        return sign | (abs > 0x7f800000u ? 0x7e00u : 0x7c00u);
    if (abs >= 0x477ff000u) return sign | 0x7c00u;            // ≥ 65520: overflow to inf
    if (abs >= 0x38800000u) {                                 // normal f16 range (≥ 2^-14)
        uint32_t mant_round = abs + 0xfffu + ((abs >> 13) & 1u);  // round to nearest even
        return sign | uint16_t((mant_round - 0x38000000u) >> 13);  // rebias exponent 127 -> 15
    }
    // Subnormal f16: value = abs_f32 / 2^-24 rounded to an integer (ties to even).
    float scaled = float_of(abs) * 16777216.0f;               // × 2^24, exact (power of two)
    uint32_t whole = uint32_t(scaled);
    float frac = scaled - float(whole);
    if (frac > 0.5f || (frac == 0.5f && (whole & 1u))) whole++;
    return sign | uint16_t(whole);                            // whole = 1024 becomes the smallest normal
}

float f16_to_f32(uint16_t h) {
    uint32_t sign = uint32_t(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0x1f) return float_of(sign | 0x7f800000u | (mant << 13));  // inf / NaN
    if (exp == 0) {                                                     // zero / subnormal
        float v = float(mant) * (1.0f / 16777216.0f);                   // m · 2^-24, exact
        return sign ? -v : v;
    }
    return float_of(sign | ((exp + 112u) << 23) | (mant << 13));        // rebias 15 -> 127
}

// f32 -> bf16: keep the top 16 bits, rounding the dropped 16 to nearest even. Same exponent
// range as f32, so subnormals stay subnormal and only values near FLT_MAX round up to inf.
uint16_t f32_to_bf16(float x) {
    uint32_t u = bits_of(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x0040u);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return uint16_t(u >> 16);
}

float bf16_to_f32(uint16_t b) { return float_of(uint32_t(b) << 16); }

}  // namespace kiln
