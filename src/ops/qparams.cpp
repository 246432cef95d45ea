// qparams.cpp — choosing a scale and a zero point from an observed range, as PyTorch's
// observers do (_calculate_qparams in torch/ao/quantization/observer.py); qparams.h has the
// formulas.
#include "ops/qparams.h"

#include <algorithm>
#include <limits>

namespace kiln {

namespace {
// PyTorch's eps: a scale never goes below float32's epsilon (an all-zero tensor still gets a
// valid, tiny scale rather than 0, which would divide by zero).
constexpr float kEps = std::numeric_limits<float>::epsilon();
}  // namespace

QParams choose_qparams_affine(float min, float max, int32_t qmin, int32_t qmax) {
    KILN_CHECK(min <= max, "choose_qparams_affine: min ", min, " > max ", max,
               "; observe some data first (an observer that saw nothing has min = +inf, max = −inf)");
    const float lo = std::min(min, 0.0f), hi = std::max(max, 0.0f);
    const float scale = std::max((hi - lo) / float(qmax - qmin), kEps);
    const int32_t zp = qmin - int32_t(std::nearbyint(lo / scale));
    return QParams{scale, std::clamp(zp, qmin, qmax), qmin, qmax};
}

QParams choose_qparams_symmetric(float min, float max, int32_t qmin, int32_t qmax) {
    KILN_CHECK(min <= max, "choose_qparams_symmetric: min ", min, " > max ", max,
               "; observe some data first (an observer that saw nothing has min = +inf, max = −inf)");
    const float amax = std::max(-std::min(min, 0.0f), std::max(max, 0.0f));
    const float scale = std::max(amax / (float(qmax - qmin) / 2.0f), kEps);
    return QParams{scale, 0, qmin, qmax};
}

}  // namespace kiln
