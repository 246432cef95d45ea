// observer.cpp — the observers of chapter 11 (see observer.h), after PyTorch 2.x's
// torch/ao/quantization/observer.py.
#include "quant/observer.h"

// PyTorch computes min + c·(batch_min − min), min + w·first, linspace's start + step·i, ... as
// separate tensor operations, each rounded to float. With -march=native g++ would fuse a·b + c
// into one FMA, rounded once, and a clip range's end could differ from PyTorch's by an ulp; this
// keeps every product and sum in this file rounded on its own.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/error.h"

namespace kiln {

namespace {

// A symmetric range has zero point 0, so it needs negative integers: an unsigned one would clip
// every negative value to 0. (PyTorch puts a symmetric u8 range's zero point at 128 instead;
// kiln's u8 tensors are affine, so it asks for a signed range.)
void check_symmetric_range(const std::string& name, bool symmetric, int32_t qmin) {
    KILN_CHECK(!symmetric || qmin < 0, name, ": a symmetric range needs negative integers (zero point 0), but qmin is ",
               qmin, "; use [kWeightQmin, kWeightQmax], or symmetric = false for u8");
}

// A range's qparams, symmetric (weights) or affine (activations): qparams.h.
QParams choose_qparams(float lo, float hi, int32_t qmin, int32_t qmax, bool symmetric) {
    return symmetric ? choose_qparams_symmetric(lo, hi, qmin, qmax) : choose_qparams_affine(lo, hi, qmin, qmax);
}

constexpr float kInf = std::numeric_limits<float>::infinity();

// The smallest and largest value of a non-empty CPU f32 tensor.
std::pair<float, float> batch_range(const Tensor& x) {
    const float* v = x.data<float>();
    const auto [lo, hi] = std::minmax_element(v, v + x.numel());
    return {*lo, *hi};
}

// torch.histc's bin for v among `bins` equal bins over [lo, hi], lo < hi, in float as ATen
// computes it: floor((v − lo) · bins / (hi − lo)), with v = hi in the last bin.
int histc_bin(float v, float lo, float hi, int bins) {
    const int64_t b = int64_t((v - lo) * float(bins) / (hi - lo));
    return int(std::clamp<int64_t>(b, 0, bins - 1));
}

// The counts of n values in `bins` equal bins over [lo, hi] ⊇ their range (torch.histc). histc
// bins an empty range [c, c] as [c − 1, c + 1], which puts every value in bin bins/2.
std::vector<double> histc(const float* v, int64_t n, float lo, float hi, int bins) {
    std::vector<int64_t> counts(size_t(bins), 0);
    if (lo == hi) counts[size_t(bins / 2)] = n;
    else
        for (int64_t i = 0; i < n; i++) counts[size_t(histc_bin(v[i], lo, hi, bins))]++;
    return std::vector<double>(counts.begin(), counts.end());
}

// The i-th of `steps` evenly spaced floats from start to end (torch.linspace): from the start
// for the first half, from the end for the second, so both ends are exact.
float linspace_at(float start, float end, int64_t steps, int64_t i) {
    const float step = (end - start) / float(steps - 1);
    return i < steps / 2 ? start + step * float(i) : end - step * float(steps - 1 - i);
}

// ∫_a^b t² dt = (b³ − a³) / 3: the squared error of values spread with unit density from a to b
// around a level at 0 (PyTorch's _get_norm).
double square_integral(double a, double b) { return (b * b * b - a * a * a) / 3.0; }

}  // namespace

// ---- Observer ---------------------------------------------------------------------------------

Observer::Observer(const char* kind, int32_t qmin, int32_t qmax)
    : min_(kInf), max_(-kInf), name_(kind), qmin_(qmin), qmax_(qmax) {
    KILN_CHECK(qmin < qmax && qmin <= 0 && qmax >= 0, kind, ": the integer range [", qmin, ", ", qmax,
               "] must contain 0 and more than one value; use [kActQmin, kActQmax] (or kActQmaxReduced) for "
               "activations, [kWeightQmin, kWeightQmax] for weights");
}

void Observer::observe(const Tensor& x) {
    check_dtype(x, DType::F32, name_.c_str(), "x");
    if (x.numel() == 0) return;
    const Tensor cpu = x.to(Device::CPU);
    const float* v = cpu.data<float>();
    const float* bad = std::find_if(v, v + cpu.numel(), [](float f) { return !std::isfinite(f); });
    KILN_CHECK(bad == v + cpu.numel(), name_, ": element ", bad - v, " of the batch ", x.desc(), " is ", *bad,
               "; calibrate on batches the f32 model handles (a finite loss), and find the layer that first "
               "makes a NaN or an infinity");
    update(cpu);
}

void Observer::check_observed() const {
    KILN_CHECK(observed(), name_, ": nothing was observed, so there is no range to quantize; run calibration "
               "batches through the model (observe(x)) before asking for the scale and zero point");
}

// ---- MinMaxObserver ---------------------------------------------------------------------------

MinMaxObserver::MinMaxObserver(int32_t qmin, int32_t qmax, bool symmetric)
    : MinMaxObserver("MinMaxObserver", qmin, qmax, symmetric) {}

MinMaxObserver::MinMaxObserver(const char* kind, int32_t qmin, int32_t qmax, bool symmetric)
    : Observer(kind, qmin, qmax), symmetric_(symmetric) {
    check_symmetric_range(name(), symmetric, qmin);
}

// min = min(min, batch min), max = max(max, batch max)
void MinMaxObserver::update(const Tensor& x) {
    const auto [lo, hi] = batch_range(x);
    min_ = std::min(min_, lo);
    max_ = std::max(max_, hi);
}

QParams MinMaxObserver::qparams() const {
    check_observed();
    return choose_qparams(min_, max_, qmin(), qmax(), symmetric_);
}

// ---- MovingAverageMinMaxObserver --------------------------------------------------------------

MovingAverageMinMaxObserver::MovingAverageMinMaxObserver(float averaging_constant, int32_t qmin, int32_t qmax,
                                                         bool symmetric)
    : MinMaxObserver("MovingAverageMinMaxObserver", qmin, qmax, symmetric), c_(averaging_constant) {
    KILN_CHECK(c_ > 0.0f && c_ <= 1.0f, name(), ": the averaging constant ", c_,
               " must be in (0, 1]; PyTorch's default is 0.01 (1 keeps only the last batch)");
}

// first batch: min = batch min; then min += c · (batch min − min); the same for max
void MovingAverageMinMaxObserver::update(const Tensor& x) {
    const auto [lo, hi] = batch_range(x);
    if (!observed()) {
        min_ = lo;
        max_ = hi;
        return;
    }
    min_ = min_ + c_ * (lo - min_);
    max_ = max_ + c_ * (hi - max_);
}

// ---- PerChannelMinMaxObserver -----------------------------------------------------------------

PerChannelMinMaxObserver::PerChannelMinMaxObserver(int axis, int32_t qmin, int32_t qmax, bool symmetric)
    : Observer("PerChannelMinMaxObserver", qmin, qmax), axis_(axis), symmetric_(symmetric) {
    check_symmetric_range(name(), symmetric, qmin);
    KILN_CHECK(axis >= 0, name(), ": the channel axis ", axis,
               " must be 0 or more (0: a weight's output channels, 1: an [N, C, H, W] activation's channels)");
}

// x seen as [outer, C, inner] around the axis; channel c's values are x[o, c, i] for every o, i.
void PerChannelMinMaxObserver::update(const Tensor& x) {
    KILN_CHECK(axis_ < x.ndim(), name(), ": the channel axis ", axis_, " does not exist in the batch ", x.desc(),
               "; the axis counts from 0 (a weight's output channels are axis 0)");
    const int64_t C = x.size(axis_);
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < axis_; d++) outer *= x.size(d);
    for (int d = axis_ + 1; d < x.ndim(); d++) inner *= x.size(d);
    if (channel_min_.empty()) {
        channel_min_.assign(size_t(C), kInf);
        channel_max_.assign(size_t(C), -kInf);
    }
    KILN_CHECK(int64_t(channel_min_.size()) == C, name(), ": the batch ", x.desc(), " has ", C,
               " channels along axis ", axis_, " but the first batch had ", channel_min_.size(),
               "; use one observer per tensor");
    const float* v = x.data<float>();
    for (int64_t o = 0; o < outer; o++) {
        for (int64_t c = 0; c < C; c++) {
            const float* row = v + (o * C + c) * inner;
            const auto [lo, hi] = std::minmax_element(row, row + inner);
            channel_min_[size_t(c)] = std::min(channel_min_[size_t(c)], *lo);
            channel_max_[size_t(c)] = std::max(channel_max_[size_t(c)], *hi);
        }
    }
    min_ = *std::min_element(channel_min_.begin(), channel_min_.end());
    max_ = *std::max_element(channel_max_.begin(), channel_max_.end());
}

std::vector<QParams> PerChannelMinMaxObserver::qparams_per_channel() const {
    check_observed();
    std::vector<QParams> q;
    for (size_t c = 0; c < channel_min_.size(); c++)
        q.push_back(choose_qparams(channel_min_[c], channel_max_[c], qmin(), qmax(), symmetric_));
    return q;
}

QParams PerChannelMinMaxObserver::qparams() const {
    KILN_FAIL(name(), ": a per-channel observer has one scale per channel; call qparams_per_channel()");
}

// ---- HistogramObserver ------------------------------------------------------------------------

HistogramObserver::HistogramObserver(int bins, int upsample_rate, int32_t qmin, int32_t qmax)
    : Observer("HistogramObserver", qmin, qmax), bins_(bins), upsample_rate_(upsample_rate) {
    KILN_CHECK(bins >= 1 && upsample_rate >= 1, name(), ": bins (", bins, ") and upsample_rate (", upsample_rate,
               ") must be at least 1; PyTorch's defaults are 2048 and 128");
}

// The first batch is binned over its own range. A later one widens the range to
// [min(min, batch min), max(max, batch max)]; it is binned over that, and the old histogram is
// added as it is if the range did not change, re-binned onto it if it did.
void HistogramObserver::update(const Tensor& x) {
    const auto [batch_lo, batch_hi] = batch_range(x);
    if (!observed()) {
        min_ = batch_lo;
        max_ = batch_hi;
        hist_ = histc(x.data<float>(), x.numel(), min_, max_, bins_);
        return;
    }
    const float lo = std::min(min_, batch_lo), hi = std::max(max_, batch_hi);
    std::vector<double> h = histc(x.data<float>(), x.numel(), lo, hi, bins_);
    const std::vector<double> old = lo == min_ && hi == max_ ? hist_ : rebinned(lo, hi);
    for (int i = 0; i < bins_; i++) h[size_t(i)] += old[size_t(i)];
    hist_ = std::move(h);
    min_ = lo;
    max_ = hi;
}

// Each old bin is cut into upsample_rate parts of equal width, each carrying 1/upsample_rate of
// the bin's count; a part goes to the new bin that holds its midpoint (PyTorch's
// _upscale_histogram). If the old histogram held one value (min = max), its whole count goes
// to that value's new bin.
std::vector<double> HistogramObserver::rebinned(float lo, float hi) const {
    std::vector<double> out(size_t(bins_), 0.0);
    if (min_ == max_) {
        out[size_t(histc_bin(min_, lo, hi, bins_))] = std::accumulate(hist_.begin(), hist_.end(), 0.0);
        return out;
    }
    std::vector<float> edges(size_t(bins_) + 1);  // the new bins' edges: linspace(lo, hi, bins + 1)
    for (int64_t e = 0; e <= bins_; e++) edges[size_t(e)] = linspace_at(lo, hi, bins_ + 1, e);
    const int64_t parts = int64_t(bins_) * upsample_rate_;
    const float part_width = (max_ - min_) / float(parts);
    for (int64_t j = 0; j < parts; j++) {
        const float mid = linspace_at(min_, max_, parts + 1, j) + 0.5f * part_width;
        // the last edge ≤ mid (torch.bucketize(right=True) − 1), kept inside the bins
        const int64_t b = std::upper_bound(edges.begin(), edges.end(), mid) - edges.begin() - 1;
        out[size_t(std::clamp<int64_t>(b, 0, bins_ - 1))] += hist_[size_t(j / upsample_rate_)] / upsample_rate_;
    }
    return out;
}

// With the bins [first, last] as the range, the 256 levels are the centres of 256 equal
// destination bins of width d = w·(last − first + 1)/256 (w: a histogram bin's width). Histogram
// bin i covers [b, e] = [(i − first)·w, (i − first + 1)·w] measured from the range's start; its
// count, spread with density count/w, rounds to the level of the destination bin it falls in
// (clamped to the first and last: clipping). Its squared error is the integral of t² over
//   [b − c_b, d/2]                       the rest of b's destination bin, c_b its centre
//   + (k_e − k_b − 1) whole destination bins of [−d/2, d/2]
//   + [−d/2, e − c_e]                    the start of e's destination bin
// (k_b, k_e: the destination bins of b and e; when k_b = k_e the three add up to [b − c_b, e − c_b]).
double HistogramObserver::quantization_error(int first, int last) const {
    const double w = (double(max_) - double(min_)) / bins_;
    const double d = w * (last - first + 1) / kDstBins;
    if (d == 0.0) return 0.0;
    auto level = [&](double t) { return std::clamp(std::floor(t / d), 0.0, double(kDstBins - 1)); };
    double error = 0.0;
    for (int i = 0; i < bins_; i++) {
        const double count = hist_[size_t(i)];
        if (count == 0.0) continue;  // adds exactly 0
        const double b = (i - first) * w, e = b + w;
        const double kb = level(b), ke = level(e);
        const double cb = (kb + 0.5) * d, ce = (ke + 0.5) * d;
        error += count / w *
                 (square_integral(b - cb, d / 2) + (ke - kb - 1) * square_integral(-d / 2, d / 2) +
                  square_integral(-d / 2, e - ce));
    }
    return error;
}

// PyTorch's _non_linear_param_search. Each step takes a quantile step of 10^-5 from one end:
// l is the first bin whose cumulative count reaches alpha + 10^-5 of the total, r the last bin
// whose cumulative count is at most beta − 10^-5 of it. The end that would move more bins
// moves (the last bin on a tie); the move is kept while the error does not grow, and the search
// stops at the first move that makes it grow, or when the two quantiles meet.
std::pair<int, int> HistogramObserver::search_bins() const {
    std::vector<double> cumulative(hist_.size());
    std::partial_sum(hist_.begin(), hist_.end(), cumulative.begin());
    const double total = cumulative.back(), step = 1e-5;
    double alpha = 0.0, beta = 1.0, best = std::numeric_limits<double>::infinity();
    int first = 0, last = bins_ - 1;
    while (alpha < beta) {
        const double next_alpha = alpha + step, next_beta = beta - step;
        int l = first, r = last;
        while (l < last && cumulative[size_t(l)] < next_alpha * total) l++;
        while (r > first && cumulative[size_t(r)] > next_beta * total) r--;
        int next_first = first, next_last = last;
        if (l - first > last - r) {
            next_first = l;
            alpha = next_alpha;
        } else {
            next_last = r;
            beta = next_beta;
        }
        if (next_first == first && next_last == last) continue;
        const double error = quantization_error(next_first, next_last);
        if (error > best) break;
        best = error;
        first = next_first;
        last = next_last;
    }
    return {first, last};
}

// The clip range's ends are bin edges: lo = min + w·first, hi = min + w·(last + 1), in float as
// PyTorch computes them. A histogram of one value (min = max) has nothing to clip.
ClipRange HistogramObserver::clip_range() const {
    check_observed();
    if (min_ == max_) return {min_, max_};
    const auto [first, last] = search_bins();
    const float w = (max_ - min_) / float(bins_);
    return {min_ + w * float(first), min_ + w * float(last + 1)};
}

QParams HistogramObserver::qparams() const {
    const ClipRange r = clip_range();
    return choose_qparams_affine(r.lo, r.hi, qmin(), qmax());
}

}  // namespace kiln
