// histogram_svg.h — the figure of a HistogramObserver (chapter 11): what one layer produced
// during calibration, as a histogram with counts on a log scale (so that the few outliers in the
// tails show), the observed range [min, max] dashed in grey, the clip range the observer chose
// shaded and edged in red, and the two scales printed: min/max's and the clipped one's.
//
//   HistogramObserver obs;  ... obs.observe(x) over the calibration batches ...
//   histogram_svg(obs, "conv1 output").save("conv1.svg");
#pragma once
#include <string>

#include "io/svg.h"
#include "quant/observer.h"

namespace kiln {

// The figure of an observer that has seen at least one batch (a kiln::Error otherwise).
Svg histogram_svg(const HistogramObserver& obs, const std::string& title);

}  // namespace kiln
