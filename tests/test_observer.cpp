// test_observer.cpp — chapter 11's observers against PyTorch 2.x's rules: scales and zero points
// worked out by hand for tiny tensors (min/max, moving average, per channel), the histogram
// binned and re-binned as torch.histc and _combine_histograms do, the histogram's clip range on
// data that fills its range and on data with far outliers (judged by really quantizing it), the
// figure, bad input, and a batch on the GPU.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "core/rng.h"
#include "fixtures.h"
#include "quant/histogram_svg.h"
#include "quant/observer.h"

using namespace kiln;
using Catch::Contains;
using kiln::test::tensor_of;

namespace {

Tensor vec(const std::vector<float>& v) { return tensor_of({int64_t(v.size())}, v); }

void require_qparams(const QParams& q, float scale, int32_t zero_point) {
    REQUIRE(q.scale == scale);
    REQUIRE(q.zero_point == zero_point);
}

// Σ (x − dequantize(quantize(x)))² over the values of x: the error the int8 model really makes.
double l2_error(const Tensor& x, const QParams& q) {
    const float* v = x.data<float>();
    double sum = 0;
    for (int64_t i = 0; i < x.numel(); i++) {
        const int32_t k = quantize_value(v[i], 1.0f / q.scale, q.zero_point, q.qmin, q.qmax);
        const double e = double(v[i]) - double(dequantize_value(k, q.scale, q.zero_point));
        sum += e * e;
    }
    return sum;
}

}  // namespace

// The scales below are (max' − min')/(qmax − qmin) in float, the same one division
// choose_qparams_* makes, so they compare exactly; zero points are integers.
TEST_CASE("MinMaxObserver keeps the running min and max: affine and symmetric qparams by hand",
          "[lesson11][cpu][observer]") {
    MinMaxObserver affine;
    MinMaxObserver symmetric(kWeightQmin, kWeightQmax, true);
    REQUIRE_FALSE(affine.observed());
    for (const Tensor& x : {vec({-1.0f, 0.5f, 2.0f}), vec({3.0f, -0.5f})}) {
        affine.observe(x);
        symmetric.observe(x);
    }
    REQUIRE(affine.min() == -1.0f);
    REQUIRE(affine.max() == 3.0f);
    // [−1, 3] over 255 steps: scale 4/255; zero point 0 − round(−1/scale) = round(63.75) = 64
    require_qparams(affine.qparams(), 4.0f / 255, 64);
    // max|x| = 3 over 255/2 steps each side of 0: scale 3/127.5, zero point 0
    require_qparams(symmetric.qparams(), 3.0f / 127.5f, 0);
    REQUIRE(symmetric.qparams().qmin == -128);
}

TEST_CASE("MinMaxObserver: a reduced range, all-positive, all-negative and all-zero tensors",
          "[lesson11][cpu][observer]") {
    auto qparams = [](const std::vector<float>& v, int32_t qmax) {
        MinMaxObserver obs(kActQmin, qmax);
        obs.observe(vec(v));
        return obs.qparams();
    };
    // [−1, 3] over 127 steps: scale 4/127, zero point round(1/(4/127)) = round(31.75) = 32
    require_qparams(qparams({-1.0f, 3.0f}, kActQmaxReduced), 4.0f / 127, 32);
    // all positive: the range is widened to [0, 2], zero point 0
    require_qparams(qparams({0.5f, 2.0f}, kActQmax), 2.0f / 255, 0);
    // all negative: [−2, 0], zero point 0 − round(−2/(2/255)) = 255, the top of the range
    require_qparams(qparams({-2.0f, -0.5f}, kActQmax), 2.0f / 255, 255);
    // all zero: a scale of 0 becomes float32's epsilon 2^-23 (PyTorch's eps), zero point 0
    require_qparams(qparams({0.0f, 0.0f}, kActQmax), std::ldexp(1.0f, -23), 0);
}

TEST_CASE("MovingAverageMinMaxObserver over three batches by hand", "[lesson11][cpu][observer]") {
    REQUIRE(MovingAverageMinMaxObserver().averaging_constant() == 0.01f);  // PyTorch's default
    // c = 1/4 keeps every step exact in float:
    //   batch 1 [−1, 1]:  min = −1,                          max = 1
    //   batch 2 [−3, 5]:  min = −1 + (−3 + 1)/4 = −1.5,      max = 1 + (5 − 1)/4 = 2
    //   batch 3 [ 1, 2]:  min = −1.5 + (1 + 1.5)/4 = −0.875, max = 2 + (2 − 2)/4 = 2
    MovingAverageMinMaxObserver obs(0.25f);
    obs.observe(vec({-1.0f, 0.0f, 1.0f}));
    obs.observe(vec({5.0f, -3.0f}));
    obs.observe(vec({1.0f, 2.0f, 1.5f}));
    REQUIRE(obs.min() == -0.875f);
    REQUIRE(obs.max() == 2.0f);
    // [−0.875, 2]: scale 2.875/255; zero point round(0.875 · 255/2.875) = round(77.6) = 78
    require_qparams(obs.qparams(), 2.875f / 255, 78);
}

TEST_CASE("PerChannelMinMaxObserver along axis 0 and axis 1", "[lesson11][cpu][observer]") {
    // A [2, 3] weight: rows are output channels (axis 0), columns input channels (axis 1).
    const Tensor w = tensor_of({2, 3}, {-1.0f, 0.5f, 0.25f,  //
                                        0.1f, 2.0f, -4.0f});
    PerChannelMinMaxObserver rows;  // axis 0, symmetric, [−128, 127]
    rows.observe(w);
    REQUIRE(rows.channel_min() == std::vector<float>{-1.0f, -4.0f});
    REQUIRE(rows.channel_max() == std::vector<float>{0.5f, 2.0f});
    REQUIRE(rows.min() == -4.0f);
    REQUIRE(rows.max() == 2.0f);
    // max|w| per row: 1 and 4, each over 127.5 steps
    std::vector<QParams> q = rows.qparams_per_channel();
    REQUIRE(q.size() == 2);
    require_qparams(q[0], 1.0f / 127.5f, 0);
    require_qparams(q[1], 4.0f / 127.5f, 0);
    // a second batch widens channel 0 only
    rows.observe(tensor_of({2, 3}, {3.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f}));
    require_qparams(rows.qparams_per_channel()[0], 3.0f / 127.5f, 0);
    require_qparams(rows.qparams_per_channel()[1], 4.0f / 127.5f, 0);

    // axis 1 of the same weight: columns [−1, 0.1], [0.5, 2], [0.25, −4] → max| | 1, 2, 4
    PerChannelMinMaxObserver columns(1);
    columns.observe(w);
    q = columns.qparams_per_channel();
    REQUIRE(q.size() == 3);
    require_qparams(q[0], 1.0f / 127.5f, 0);
    require_qparams(q[1], 2.0f / 127.5f, 0);
    require_qparams(q[2], 4.0f / 127.5f, 0);

    // axis 1 of an [N, C, H, W] activation, affine u8: channel c holds x[n, c, h, w] for all n, h, w
    PerChannelMinMaxObserver activation(1, kActQmin, kActQmax, false);
    activation.observe(tensor_of({2, 2, 1, 2}, {0.0f, 1.0f,  -2.0f, 0.5f,    // n = 0: c = 0, c = 1
                                                3.0f, 0.25f, 0.75f, 1.0f}));  // n = 1
    REQUIRE(activation.channel_min() == std::vector<float>{0.0f, -2.0f});
    REQUIRE(activation.channel_max() == std::vector<float>{3.0f, 1.0f});
    q = activation.qparams_per_channel();
    require_qparams(q[0], 3.0f / 255, 0);
    require_qparams(q[1], 3.0f / 255, 170);  // round(2/(3/255)) = round(170) = 170
}

TEST_CASE("HistogramObserver bins like torch.histc and re-bins the old histogram when the range widens",
          "[lesson11][cpu][observer]") {
    // 4 bins, each cut into 4 parts when re-binned. Every number below is exact in float.
    HistogramObserver obs(4, 4);
    // batch 1 over its own range [0, 2], bins of 0.5: 0 → 0, 0.5 → 1, 1 and 1 → 2, 2 → 3 (the
    // last bin holds its right edge)
    obs.observe(vec({0.0f, 0.5f, 1.0f, 1.0f, 2.0f}));
    REQUIRE(obs.histogram() == std::vector<double>{1, 1, 2, 1});
    // batch 2 widens the range to [−0.5, 2.5]: new edges −0.5, 0.25, 1, 1.75, 2.5. The old bins'
    // parts are 0.125 wide with midpoints 0.0625 + 0.125·k:
    //   old bin 0 (count 1): parts at 0.0625, 0.1875 → new bin 0; 0.3125, 0.4375 → new bin 1
    //   old bin 1 (count 1): all four parts (0.5625 … 0.9375) → new bin 1
    //   old bin 2 (count 2): all four (1.0625 … 1.4375) → new bin 2
    //   old bin 3 (count 1): 1.5625, 1.6875 → new bin 2; 1.8125, 1.9375 → new bin 3
    // = {0.5, 1.5, 2.5, 0.5}, plus batch 2 itself: −0.5 → bin 0, 2.5 → bin 3
    obs.observe(vec({-0.5f, 2.5f}));
    REQUIRE(obs.min() == -0.5f);
    REQUIRE(obs.max() == 2.5f);
    REQUIRE(obs.histogram() == std::vector<double>{1.5, 1.5, 2.5, 1.5});
    // batch 3 inside the range: added as it is, (0.3 + 0.5)·4/3 = 1.07 → bin 1
    obs.observe(vec({0.3f}));
    REQUIRE(obs.histogram() == std::vector<double>{1.5, 2.5, 2.5, 1.5});

    // A first batch of one value has the empty range [1, 1]: histc bins it over [0, 2], in the
    // middle; when the range widens to [1, 3], its whole count goes to 1's new bin, 0.
    HistogramObserver single(4, 4);
    single.observe(vec({1.0f, 1.0f, 1.0f}));
    REQUIRE(single.histogram() == std::vector<double>{0, 0, 3, 0});
    single.observe(vec({3.0f}));
    REQUIRE(single.histogram() == std::vector<double>{3, 0, 0, 1});

    // Many widening batches: re-binning moves counts in parts of count/128, dyadic fractions that
    // double adds exactly, so the total stays the number of values observed, exactly.
    HistogramObserver wide;
    Rng rng(7);
    int64_t n = 0;
    for (int b = 0; b < 6; b++) {
        const Tensor x = Tensor::normal({1000 + 37 * b}, 0.5f * b, 1.0f + b, rng);
        wide.observe(x);
        n += x.numel();
    }
    REQUIRE(std::accumulate(wide.histogram().begin(), wide.histogram().end(), 0.0) == double(n));
}

// Values k/2^17, k = 0 … 2^17 (exact in float), fill [0, 1] evenly: 64 per bin of w = 1/2048 (65
// in the last, which holds 1). For such data clipping never pays: cutting a length t off an end
// sends those values to the last level, half a step d/2 inside, at a cost of about n·t·(d/2)²,
// and saves only n·t·d²/6 of rounding error (n·d²/12 per unit, with d shrinking by t). But
// PyTorch's search keeps its first move whatever it costs (the best error so far starts at
// infinity), so exactly one bin goes, from the end that moves first: the quantile steps
// (10^-5 of the count, less than a bin's 64/131073) reach the last bin first (l − first = 0 <
// last − r = 1), which becomes bin 2046; the next move, whichever end, raises the error, and the
// search stops. The clip range is [0, 2047/2048].
TEST_CASE("HistogramObserver keeps the range of data that fills it evenly", "[lesson11][cpu][observer]") {
    std::vector<float> v(size_t(1 << 17) + 1);
    for (size_t k = 0; k < v.size(); k++) v[k] = std::ldexp(float(k), -17);
    HistogramObserver obs;
    obs.observe(vec(v));
    REQUIRE(obs.histogram().front() == 64);
    REQUIRE(obs.histogram().back() == 65);
    const ClipRange r = obs.clip_range();
    REQUIRE(r.lo == 0.0f);
    REQUIRE(r.hi == 2047.0f / 2048);
    REQUIRE(obs.quantization_error(0, 2046) > obs.quantization_error(0, 2047));  // the first move cost
    REQUIRE(obs.qparams().zero_point == 0);
}

// 2^22 standard normal values in four batches, and four outliers at 30 in the last (which widens
// the range from about [−5, 5] to [−5, 30] and re-bins). With min/max the step is 35/255 ≈ 0.14
// for everyone: rounding error n·step²/12 ≈ 6600. Clipping near the normal's tail, at about ±4.2,
// costs the four outliers about 4·(30 − 4.2)² ≈ 2700 and shrinks the step to about 8.4/255
// (rounding error ≈ 380). The search must find such a range, and the error measured by
// quantizing the data must be smaller.
TEST_CASE("HistogramObserver clips far outliers and the real L2 error drops", "[lesson11][cpu][observer]") {
    HistogramObserver obs;
    MinMaxObserver minmax;
    Rng rng(11);
    std::vector<Tensor> batches;
    for (int b = 0; b < 4; b++) batches.push_back(Tensor::normal({1 << 20}, 0.0f, 1.0f, rng));
    batches[3].data<float>()[0] = batches[3].data<float>()[1] = 30.0f;
    batches[3].data<float>()[2] = batches[3].data<float>()[3] = 30.0f;
    for (const Tensor& x : batches) {
        obs.observe(x);
        minmax.observe(x);
    }
    REQUIRE(obs.max() == 30.0f);
    const ClipRange r = obs.clip_range();
    INFO("clip range [" << r.lo << ", " << r.hi << "]");
    REQUIRE(r.hi < 10.0f);   // the outliers are clipped
    REQUIRE(r.hi > 3.0f);    // the normal's bulk is not
    REQUIRE(r.lo < -3.0f);
    // The clip range's end is a bin edge, min + w·k (w = (max − min)/2048, k an integer), with the
    // product and the sum each rounded to float, as PyTorch's tensor operations round them (one
    // fused multiply-add, rounded once, misses by an ulp). In double the product of w and k ≤ 2048
    // and the sum of two floats of like size are exact, so float() rounds each once.
    const float w = (obs.max() - obs.min()) / 2048;
    const double k = std::round((double(r.hi) - double(obs.min())) / double(w));
    REQUIRE(r.hi == float(double(obs.min()) + double(float(double(w) * k))));
    double clipped = 0, full = 0;
    for (const Tensor& x : batches) {
        clipped += l2_error(x, obs.qparams());
        full += l2_error(x, minmax.qparams());
    }
    INFO("L2 error: clipped " << clipped << ", min/max " << full);
    REQUIRE(clipped < full);
}

TEST_CASE("The histogram figure draws the histogram, both ranges and both scales", "[lesson11][cpu][observer]") {
    HistogramObserver obs;
    Rng rng(3);
    Tensor x = Tensor::normal({1 << 16}, 0.0f, 1.0f, rng);
    x.data<float>()[0] = 25.0f;  // one outlier, which the clip range leaves out
    obs.observe(x);
    const ClipRange clip = obs.clip_range();
    REQUIRE(clip.hi < 25.0f);
    const std::string svg = histogram_svg(obs, "conv1 <output>").str();
    REQUIRE(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0) == 0);
    REQUIRE(svg.substr(svg.size() - 7) == "</svg>\n");
    REQUIRE_THAT(svg, Contains(">conv1 &lt;output&gt;</text>"));
    REQUIRE_THAT(svg, Contains("<polygon points=\""));  // the histogram
    // the scales: both printed as describe() writes them
    char full[160], clipped[160];
    const QParams fq = choose_qparams_affine(obs.min(), obs.max(), kActQmin, kActQmax), cq = obs.qparams();
    std::snprintf(full, sizeof full, "min/max [%.4g, %.4g]: scale %.4g, zero point %d", double(obs.min()),
                  double(obs.max()), double(fq.scale), int(fq.zero_point));
    std::snprintf(clipped, sizeof clipped, "clip [%.4g, %.4g]: scale %.4g, zero point %d", double(clip.lo),
                  double(clip.hi), double(cq.scale), int(cq.zero_point));
    REQUIRE_THAT(svg, Contains(full) && Contains(clipped));
    // two vertical red lines (the clip range) strictly inside two dashed grey ones (min and max)
    auto vertical_lines = [&](const std::string& stroke) {
        std::vector<double> xs;
        const std::string mark = "\" stroke=\"" + stroke + "\"";
        for (size_t at = svg.find(mark); at != std::string::npos; at = svg.find(mark, at + 1)) {
            const char* element = svg.c_str() + svg.rfind('<', at);
            double x1 = 0, y1 = 0, x2 = 0, y2 = 0;
            REQUIRE(std::sscanf(element, "<line x1=\"%lf\" y1=\"%lf\" x2=\"%lf\" y2=\"%lf\"", &x1, &y1, &x2, &y2) == 4);
            REQUIRE(x1 == x2);
            xs.push_back(x1);
        }
        return xs;
    };
    const std::vector<double> range = vertical_lines("#7f7f7f"), cut = vertical_lines("#d62728");
    REQUIRE(range.size() == 2);
    REQUIRE(cut.size() == 2);
    REQUIRE(range[0] <= cut[0]);  // the normal's left tail may be kept whole
    REQUIRE(cut[0] < cut[1]);
    REQUIRE(cut[1] < range[1]);
    REQUIRE_THROWS_WITH(histogram_svg(HistogramObserver(), "empty"), Contains("nothing was observed"));
}

TEST_CASE("Observers refuse bad input with a message that names them", "[lesson11][cpu][observer]") {
    MinMaxObserver minmax;
    REQUIRE_THROWS_WITH(minmax.qparams(), Contains("MinMaxObserver: nothing was observed"));
    REQUIRE_THROWS_WITH(HistogramObserver().qparams(), Contains("HistogramObserver: nothing was observed"));
    minmax.observe(Tensor::zeros({0, 3}));  // an empty batch changes nothing
    REQUIRE_FALSE(minmax.observed());

    minmax.set_name("conv1 output");
    REQUIRE_THROWS_WITH(minmax.observe(vec({1.0f, NAN})),
                        Contains("conv1 output: element 1 of the batch f32[2] on cpu is nan") && Contains("NaN"));
    HistogramObserver hist;
    REQUIRE_THROWS_WITH(hist.observe(vec({INFINITY})), Contains("HistogramObserver: element 0") &&
                                                           Contains("is inf"));
    REQUIRE_FALSE(hist.observed());  // the refused batch left nothing behind
    REQUIRE_THROWS_WITH(minmax.observe(Tensor::zeros({2}, DType::F16)), Contains("should be f32"));

    PerChannelMinMaxObserver per_channel(2);
    REQUIRE_THROWS_WITH(per_channel.observe(Tensor::zeros({4, 3})), Contains("axis 2 does not exist"));
    REQUIRE_THROWS_WITH(PerChannelMinMaxObserver(-1), Contains("must be 0 or more"));
    PerChannelMinMaxObserver rows;
    rows.observe(Tensor::zeros({4, 3}));
    REQUIRE_THROWS_WITH(rows.observe(Tensor::zeros({5, 3})), Contains("has 5 channels along axis 0 but the first "
                                                                      "batch had 4"));
    REQUIRE_THROWS_WITH(rows.qparams(), Contains("qparams_per_channel()"));

    REQUIRE_THROWS_WITH(MinMaxObserver(kActQmin, kActQmax, true), Contains("a symmetric range needs negative"));
    REQUIRE_THROWS_WITH(PerChannelMinMaxObserver(0, kActQmin, kActQmax), Contains("a symmetric range needs negative"));
    REQUIRE_THROWS_WITH(MinMaxObserver(1, 255), Contains("[1, 255] must contain 0"));
    REQUIRE_THROWS_WITH(MinMaxObserver(0, 0), Contains("more than one value"));
    REQUIRE_THROWS_WITH(MovingAverageMinMaxObserver(0.0f), Contains("must be in (0, 1]"));
    REQUIRE_THROWS_WITH(HistogramObserver(0), Contains("must be at least 1"));
}

TEST_CASE("Observers read a batch on the GPU as they read it on the CPU", "[lesson11][cuda][observer]") {
    Rng rng(5);
    const Tensor x = Tensor::normal({4, 3, 5}, 0.5f, 2.0f, rng);
    HistogramObserver cpu_hist, gpu_hist;
    PerChannelMinMaxObserver cpu_channels(1), gpu_channels(1);
    cpu_hist.observe(x);
    cpu_channels.observe(x);
    gpu_hist.observe(x.to(Device::CUDA));
    gpu_channels.observe(x.to(Device::CUDA));
    REQUIRE(gpu_hist.histogram() == cpu_hist.histogram());
    REQUIRE(gpu_hist.qparams().scale == cpu_hist.qparams().scale);
    REQUIRE(gpu_hist.qparams().zero_point == cpu_hist.qparams().zero_point);
    REQUIRE(gpu_channels.channel_min() == cpu_channels.channel_min());
    REQUIRE(gpu_channels.channel_max() == cpu_channels.channel_max());
}
