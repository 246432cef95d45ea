// qat.h — quantization-aware training (chapter 11): fine-tune the f32 model while its forward
// pass rounds the way the int8 network will, so that the weights learn to live with the rounding.
//
//   QuantizedNet ptq = convert(model, cal);              // post-training quantization first:
//   QuantAwareTraining qat(model, ptq);                  // its steps say where the ranges are:
//   SGD sgd(model.parameters(), 1e-3f, ...);             // fake quantization in, model packed
//   fit(model, sgd, ...);
//   qat.finish();                                        // fake quantization out again
//   QuantizedNet q = convert(model, qat.range_of());     // the ranges it was fine-tuned with
//
// Fake quantization (ops/quant.h fake_quantize) is y = dequantize(quantize(x)) in f32: the value
// the int8 network would see, as a float. Two kinds, as PyTorch's prepare_qat puts them:
//   weights      every Conv2d and Linear computes with its weight rounded to 8 bits per output
//                channel (symmetric, the scale from the channel's current max |w|): the weight's
//                "fake_quant" transform (Parameter::add_transform, nn/module.h), remade before
//                each forward, which the layer reads through used(); the f32 weight stays the
//                one the optimizer updates. After pruning's transform it rounds value ⊙ mask.
//   activations  a FakeQuantize after every layer whose output gets a range of its own in the
//                int8 network (QStep::range_layer), and one before the first layer for the input:
//                the layer at that path becomes a Sequential {"layer", "fake_quant"}
// The gradient of round() is 0 almost everywhere, which would stop all learning; the
// straight-through estimator (Bengio et al. 2013) passes dy through where x fell inside the
// range and 0 where it was clipped (fake_quantize_backward). For the weights nothing is clipped
// (the range is their own max), so their gradient passes as it is.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "nn/module.h"
#include "quant/observer.h"
#include "quant/qmodel.h"

namespace kiln {

// Rounds what passes through it as a u8 tensor would be: in training it first widens its range
// with the batch (a moving average of min and max, constant 0.01: PyTorch's
// MovingAverageMinMaxObserver in its FakeQuantize), in eval mode it keeps the range it has.
//   y = fake_quantize(x)      dx = dy · [x inside the range]
class FakeQuantize : public Module {
public:
    explicit FakeQuantize(int32_t qmax = kActQmax, std::string name = "fake_quant");
    Tensor forward(const Tensor& x) override;
    Tensor backward(const Tensor& dy) override;
    QParams qparams() const { return observer_.qparams(); }
    bool observed() const { return observer_.observed(); }  // has seen a training batch

private:
    MovingAverageMinMaxObserver observer_;
    Tensor x_, scale_, zero_point_;  // the cache for backward: x and the qparams it was rounded with
};

// Puts fake quantization into `model` where `plan` (the model's int8 network, from convert) has
// its ranges, packs the model for training, and takes it all out again when it goes (or at
// finish()). The model must stay alive while this does. A pruned weight trains pruned and
// rounded: fake_quantize(weight_orig ⊙ mask).
class QuantAwareTraining {
public:
    QuantAwareTraining(Module& model, const QuantizedNet& plan, QuantConfig config = {});
    ~QuantAwareTraining();
    QuantAwareTraining(const QuantAwareTraining&) = delete;
    QuantAwareTraining& operator=(const QuantAwareTraining&) = delete;
    void finish();  // the model as it was, with the fine-tuned weights

    // The ranges the FakeQuantize modules settled on, by the layer whose output each rounded
    // ("" for the input): what the network was fine-tuned to, so what convert() should use
    // (convert(model, qat.range_of()), as PyTorch's convert takes its fake quantizers' ranges).
    // Recorded by finish(); an error before.
    RangeOf range_of() const;

private:
    Module& model_;
    std::map<std::string, QParams> ranges_;  // by finish()
    std::vector<std::string> wrapped_;  // paths now holding {"layer", "fake_quant"} (or the reverse)
    std::vector<std::string> range_layers_;  // the layer each wrapped path's fake quantizer stands for
    std::vector<FakeQuantize*> quantizers_;  // and the fake quantizer (owned by the model until finish)
    std::vector<Parameter*> weights_;  // each with a "fake_quant" transform until finish()
    bool finished_ = false;
};

}  // namespace kiln
