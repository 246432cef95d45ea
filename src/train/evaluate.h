// evaluate.h — accuracy of a model over a whole data set, in evaluation mode.
#pragma once
#include "data/loader.h"
#include "nn/module.h"

namespace kiln {

// Number of rows of logits[N, C] whose largest entry is at the label's index.
int64_t count_correct(const Tensor& logits, const Tensor& labels);

// Fraction of the loader's images the model classifies correctly (model.eval() during it,
// restored after). The loader runs one epoch in its order.
double evaluate(Module& model, DataLoader& loader);

}  // namespace kiln
