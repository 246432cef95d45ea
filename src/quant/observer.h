// observer.h — observers (chapter 11): during calibration they watch the f32 tensors that flow
// through a layer, batch after batch, and then choose the scale and zero point that tensor gets
// in the int8 model. They follow PyTorch 2.x's (torch/ao/quantization/observer.py), rule for rule:
//
//   MinMaxObserver               the running min and max of everything seen
//   MovingAverageMinMaxObserver  min += c·(batch min − min), the same for max (QAT's choice:
//                                early batches of a changing model count less)
//   PerChannelMinMaxObserver     one min and max per channel (weights: per output channel)
//   HistogramObserver            a 2048-bin histogram of everything seen, then the clip range
//                                [lo, hi] ⊆ [min, max] whose 8-bit quantization has the smallest
//                                L2 error: a few outliers no longer stretch the scale for everyone
//
// The range becomes qparams as qparams.h says (choose_qparams_affine or _symmetric). A reduced
// range is just the qmin/qmax an observer is given (kActQmaxReduced).
//
//   HistogramObserver obs;                 // u8 activations, [0, 255]
//   for (batch ...) obs.observe(conv_out);
//   QParams q = obs.qparams();             // scale and zero point of the clipped range
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "ops/qparams.h"

namespace kiln {

// A range of real values [lo, hi].
struct ClipRange {
    float lo, hi;
};

class Observer {
public:
    virtual ~Observer() = default;

    // One batch: x is f32, on the CPU or a GPU (copied to the CPU to be read). An empty tensor
    // changes nothing; a NaN or an infinity is refused with a kiln::Error naming the observer.
    void observe(const Tensor& x);
    // The scale and zero point for everything observed; an error before the first batch.
    virtual QParams qparams() const = 0;

    // The observed range: +inf and −inf before the first batch (PyTorch's starting values).
    float min() const { return min_; }
    float max() const { return max_; }
    bool observed() const { return min_ <= max_; }
    int32_t qmin() const { return qmin_; }
    int32_t qmax() const { return qmax_; }

    // The name errors use: the kind ("HistogramObserver") until the calibration names it after
    // the tensor it watches ("features.0 output").
    const std::string& name() const { return name_; }
    void set_name(const std::string& name) { name_ = name; }

protected:
    // qmin < qmax and qmin ≤ 0 ≤ qmax (0 must be representable), as PyTorch checks.
    Observer(const char* kind, int32_t qmin, int32_t qmax);
    // One batch, on the CPU, f32, not empty, every value finite.
    virtual void update(const Tensor& x) = 0;
    // The error that qparams() raises before the first batch.
    void check_observed() const;

    float min_, max_;

private:
    std::string name_;
    int32_t qmin_, qmax_;
};

// The running min and max over all batches. symmetric: zero point 0 and a range of ±max|x|, for
// a signed integer range (weights: [−128, 127]); otherwise affine (activations).
class MinMaxObserver : public Observer {
public:
    explicit MinMaxObserver(int32_t qmin = kActQmin, int32_t qmax = kActQmax, bool symmetric = false);
    QParams qparams() const override;
    bool symmetric() const { return symmetric_; }

protected:
    MinMaxObserver(const char* kind, int32_t qmin, int32_t qmax, bool symmetric);
    void update(const Tensor& x) override;

private:
    bool symmetric_;
};

// The first batch sets min and max; each later one moves them a fraction c of the way to its own:
//   min ← min + c·(batch_min − min),  max ← max + c·(batch_max − max)        (0 < c ≤ 1)
class MovingAverageMinMaxObserver : public MinMaxObserver {
public:
    explicit MovingAverageMinMaxObserver(float averaging_constant = 0.01f, int32_t qmin = kActQmin,
                                         int32_t qmax = kActQmax, bool symmetric = false);
    float averaging_constant() const { return c_; }

protected:
    void update(const Tensor& x) override;

private:
    float c_;
};

// A running min and max per channel along `axis` (0: a conv's or linear layer's output channels;
// 1: the channels of an [N, C, H, W] activation). The channel count is fixed by the first batch.
class PerChannelMinMaxObserver : public Observer {
public:
    explicit PerChannelMinMaxObserver(int axis = 0, int32_t qmin = kWeightQmin, int32_t qmax = kWeightQmax,
                                      bool symmetric = true);
    // One QParams per channel.
    std::vector<QParams> qparams_per_channel() const;
    // A per-channel observer has no single scale: this refuses, naming qparams_per_channel().
    QParams qparams() const override;

    const std::vector<float>& channel_min() const { return channel_min_; }
    const std::vector<float>& channel_max() const { return channel_max_; }
    int axis() const { return axis_; }

protected:
    void update(const Tensor& x) override;

private:
    int axis_;
    bool symmetric_;
    std::vector<float> channel_min_, channel_max_;
};

// PyTorch 2.x's HistogramObserver (affine, per tensor). PyTorch 1.13 (the torch Debian 12 ships)
// differs in two rules: its histogram spans [int(min), int(max)], the range truncated to whole
// numbers, and a first batch of one value (min = max) is thrown away at the next batch.
//  - the first batch makes a histogram of `bins` equal bins over its [min, max] (torch.histc);
//  - a later batch that widens the range re-bins the old histogram onto the new range: each old
//    bin is cut into upsample_rate equal parts, each part carrying 1/upsample_rate of its count
//    to the new bin holding the part's midpoint; the batch itself is binned on the new range;
//  - qparams() searches the clip range (see clip_range) and quantizes it as MinMaxObserver does.
// Where kiln differs from PyTorch (never in the rules, only in arithmetic):
//  - counts are kept in double, not float: a float count stops growing at 2^24 (a ReLU's zeros
//    over a long calibration pass that), a double one is exact up to 2^53;
//  - the search's error estimate and cumulative sums are computed in double (PyTorch: float32),
//    so on the same histogram the range can differ only where two error estimates tie to float
//    precision;
//  - an infinity is refused like a NaN (PyTorch drops infinities with a warning: here they mean
//    a model gone wrong, and calibration should not go on quietly).
class HistogramObserver : public Observer {
public:
    // dst_nbins: the search measures the error of 2^8 = 256 levels whatever qmin/qmax are, as
    // PyTorch does (its dst_nbins comes from the 8-bit dtype, not from a reduced range).
    static constexpr int kDstBins = 256;

    explicit HistogramObserver(int bins = 2048, int upsample_rate = 128, int32_t qmin = kActQmin,
                               int32_t qmax = kActQmax);
    QParams qparams() const override;

    // The clip range [lo, hi] ⊆ [min, max] of smallest estimated L2 error
    // (_non_linear_param_search): start from all the bins and move the first or the last bin
    // inwards, one quantile step (10^-5 of the count) at a time, keeping the side that moves
    // more bins, as long as the error does not grow. As in PyTorch the first move is always
    // kept (the best error so far starts at infinity): at least one bin is clipped.
    ClipRange clip_range() const;
    // The L2 error of quantizing with the bins [first, last] as the range: Σ over the observed
    // values of (x − the level x rounds or clips to)², estimated from the histogram with each
    // bin's values spread evenly over the bin (_compute_quantization_error).
    double quantization_error(int first, int last) const;

    // The histogram over [min(), max()]: `bins` bins of width (max − min)/bins.
    const std::vector<double>& histogram() const { return hist_; }
    int bins() const { return bins_; }
    int upsample_rate() const { return upsample_rate_; }

protected:
    void update(const Tensor& x) override;

private:
    // The old histogram over [min_, max_] moved onto [lo, hi] ⊇ [min_, max_] (_combine_histograms).
    std::vector<double> rebinned(float lo, float hi) const;
    // The first and last bin of the clip range.
    std::pair<int, int> search_bins() const;

    int bins_, upsample_rate_;
    std::vector<double> hist_;
};

}  // namespace kiln
