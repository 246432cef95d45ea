// convert.h — n elements from one element type to another: the kernel Tensor::to(DType) runs,
// declared once for both backends (core/backend.h) and defined with the other elementwise
// kernels, in src/ops/cpu/elementwise.cpp ↔ cuda/elementwise.cu.
#pragma once
#include <cstdint>

#include "core/backend.h"

namespace kiln {

// y[i] = cast<To>(x[i]) (dtype.h: floats round to nearest even, integers also saturate), for
// every pair of the six element types (instantiated with KILN_FOR_EACH_TYPE_PAIR(KILN_CONVERT)).
KILN_KERNEL(convert, template <typename From, typename To> void convert(const From* x, To* y, int64_t n));
#define KILN_CONVERT(From, To) KILN_INSTANTIATE(convert, From, To);

}  // namespace kiln
