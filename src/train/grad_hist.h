// grad_hist.h — --grad-hist: where a step's gradient values fall against f16's range, and
// what a loss scale does to them (chapter 09).
//
// Every f32 value g ≠ 0 is m · 2^e with 1 ≤ m < 2 and e = floor(log2 |g|), its binary exponent.
// f16 holds, for |x|:
//
//   |x| < 2^-24             underflow: below f16's smallest subnormal, rounds to 0 (or to 2^-24)
//   2^-24 ≤ |x| < 2^-14     subnormal: kept with fewer significant bits (down to 1 at 2^-24)
//   2^-14 ≤ |x| < 65520     normal: 11 significant bits
//   |x| ≥ 65520             overflow: rounds to inf (65504 is the largest f16)
//
// A backward pass in f16 computes S·g instead of g (S the loss scale): the histogram counts the
// exponents of the true gradients g and how many land in each zone as g (no scaling) and as S·g.
//
//   GradHistogram h = grad_histogram(grads, scaler.loss_scale());
//   std::printf("%s", grad_hist_text(h).c_str());
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/svg.h"

namespace kiln {

struct GradHistogram {
    static constexpr int kMinExponent = -149;  // f32's smallest subnormal is 2^-149
    static constexpr int kMaxExponent = 127;   // its largest finite values are below 2^128
    // counts[e - kMinExponent]: the values with floor(log2 |g|) = e
    std::vector<int64_t> counts = std::vector<int64_t>(kMaxExponent - kMinExponent + 1, 0);
    int64_t values = 0, zeros = 0, non_finite = 0;  // all of them; exact zeros; inf and NaN
    float scale = 1;                                // the loss scale S
    int64_t underflow = 0, subnormal = 0;           // g itself in f16 (no scaling)
    int64_t underflow_scaled = 0, subnormal_scaled = 0, overflow_scaled = 0;  // S·g in f16

    int64_t count(int exponent) const { return counts[size_t(exponent - kMinExponent)]; }
};

// The histogram of every value of the f32 tensors (any device; a GPU's are copied to the CPU),
// zones taken for g and for scale·g (computed in double, so S·g never overflows here).
GradHistogram grad_histogram(const std::vector<Tensor>& grads, float scale);

// The histogram as text: one line per exponent from the smallest to the largest present, with
// its count, a bar, and its zone as g and as S·g (the zone of the binade's lower end, 2^e); then
// the zeros and inf/NaN, and the zones' exact counts with their share of the values.
std::string grad_hist_text(const GradHistogram& h);

// Which layers' gradients fall where: the histogram of each named tensor (a model's
// named_parameters' grads), in the model's order, and as text one line per tensor with its
// values and how many of them underflow or are subnormal in f16 as g and as S·g, and overflow
// as S·g.
struct NamedGradHistogram {
    std::string name;
    GradHistogram h;
};
std::vector<NamedGradHistogram> grad_histograms(const std::vector<std::pair<std::string, Tensor>>& grads, float scale);
std::string grad_zones_text(const std::vector<NamedGradHistogram>& layers);

// The histogram as a figure (io/svg.h): the count of each binade [2^e, 2^(e+1)) as a bar
// (on a log scale, log10(1 + count), so that the tails show), for g and, shifted by log2 S, for
// S·g, over f16's zones shaded (underflow, subnormal, normal, overflow). Titled `title`.
Svg grad_hist_svg(const GradHistogram& h, const std::string& title);

}  // namespace kiln
