// qmodel.h — a trained f32 network turned into an int8 one (chapter 11): calibration, conversion,
// integer-only inference, and the int8 file.
//
//   auto model = cifar_net(rng, {32, 64, 128});  load_model(...);  model->eval();
//   fold_batchnorm(*model);                         // quant/fold.h
//   Calibrator cal(*model, {});                     // observers on every layer's output
//   for (a few training batches) cal.run(x);        // f32 forward passes, ranges recorded
//   QuantizedNet q = convert(*model, cal);          // int8 weights, u8 activations
//   Tensor logits = q.forward(images);              // f32 in, f32 out, integers in between
//   q.save("lenet-int8.safetensors");  QuantizedNet r = QuantizedNet::load(...);   // exact
//
// The int8 network is a list of steps, each reading the u8 tensor the previous one wrote:
//   input       quantize the f32 images with the input's (scale, zero point)
//   conv        qconv2d (groups 1 or depthwise): i8 weights (one scale per output channel),
//               int32 sums, requantized to u8 with the output's (scale, zero point); a ReLU right
//               after it is fused as a clamp at the zero point (lo = z_y), a ReLU6 as a clamp to
//               [z_y, q(6)]; a ReLU after a max-pool too, since pool(relu(v)) = relu(pool(v))
//               (both are increasing)
//   linear      qlinear, the same for a Linear
//   maxpool     qmaxpool2d on u8: the max of the integers is the integer of the max
//   avgpool     qglobal_avgpool: the rounded mean of the integers (the scale is unchanged)
//   table       lookup_u8: GELU, ReLU, ReLU6, a batch norm that could not be folded (per
//               channel), or a batch norm and the activation after it — any function of one
//               value, 256 entries
//   residual    a Residual, body(x) + x or body(x) + shortcut(x): its body's steps and its
//               shortcut's (none: the identity) read the same u8 x, and qadd sums their two u8
//               results into the range observed on the Residual's output
//   flatten     [N, C, H, W] → [N, C·H·W], a view
//   output      dequantize the last u8 tensor: the logits, f32
// Dropout and Identity (a folded batch norm) are the identity in eval mode and become nothing.
//
// What a learner can read off it: the weights take one byte instead of four; every activation
// too; the only float arithmetic left is the input's quantize and the logits' dequantize.
//
// The code, one idea per file: calibrate.cpp (the observers), qsteps.h (the steps), convert.cpp
// (an f32 model made into steps), qmodel.cpp (running them), qfile.cpp (the int8 file).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/state.h"
#include "nn/module.h"
#include "quant/observer.h"
#include "ops/qparams.h"

namespace kiln {

// ---- calibration ----------------------------------------------------------------------------------
struct QuantConfig {
    // How an activation's range is chosen (quant/observer.h): the min and max seen, their moving
    // average over batches, or the histogram's L2-optimal clip range (PyTorch's default for x86).
    enum class Observer { MinMax, MovingAverage, Histogram };
    Observer activations = Observer::Histogram;
    // Activations in [0, 127] instead of [0, 255]: one bit of resolution less, for CPUs whose
    // int8 products are summed in pairs into 16 bits (AVX2's vpmaddubsw): 2·255·127 overflows
    // them, 2·127·127 does not (ops/quant.h). PyTorch's fbgemm does the same.
    bool reduce_range = false;
    int32_t act_qmax() const { return reduce_range ? kActQmaxReduced : kActQmax; }
};
const char* observer_name(QuantConfig::Observer o);              // "minmax", "moving", "histogram"
QuantConfig::Observer parse_observer(const std::string& name);   // kiln::Error naming the choices

// Observers on the model's input, on every layer's output and on every Residual's (its sum)
// (forward hooks, removed when the Calibrator goes). run(x) is one f32 forward pass in eval mode, without caches.
class Calibrator {
public:
    Calibrator(Module& model, QuantConfig config);
    ~Calibrator();
    Calibrator(const Calibrator&) = delete;
    Calibrator& operator=(const Calibrator&) = delete;

    void run(const Tensor& x);
    int64_t batches() const { return batches_; }
    const QuantConfig& config() const { return config_; }
    // The observer of the model's input ("") or of a layer's output (its full name).
    const Observer& observer(const std::string& layer) const;

private:
    Module& model_;
    QuantConfig config_;
    int64_t batches_ = 0;
    std::vector<std::pair<std::string, std::unique_ptr<Observer>>> observers_;
    std::vector<HookHandle> hooks_;
};

// ---- the int8 network -----------------------------------------------------------------------------
// One step of it (the list above). forward reads and writes u8 tensors, except the input step
// (f32 in) and the output step (f32 out).
class QStep {
public:
    QStep(std::string name, std::string kind) : name(std::move(name)), kind(std::move(kind)) {}
    virtual ~QStep() = default;
    virtual Tensor forward(const Tensor& x) const = 0;
    virtual void save(StateDict& s) const = 0;  // its tensors and numbers, under "name."
    virtual void to(Device device) = 0;
    virtual int64_t bytes() const { return 0; }  // what its weights, tables and scales take
    virtual std::string describe() const = 0;    // one line: shapes, scales, zero points

    std::string name;  // the f32 layer it came from ("block1a.conv"), "input" or "output"
    std::string kind;  // "input", "conv", "linear", "maxpool", "avgpool", "table", "residual",
                       // "flatten", "output"
    // Steps whose output has a range of its own (input, conv, linear, table) took it from the
    // observer of `range_layer`'s output ("" for the model's input; a fused ReLU's name for a
    // conv with a ReLU after it): the points where quantization-aware training rounds
    // activations (quant/qat.h). The others keep their input's range.
    bool new_range = false;
    std::string range_layer;
};

using QSteps = std::vector<std::unique_ptr<QStep>>;

class QuantizedNet {
public:
    Tensor forward(const Tensor& x) const;  // f32 [N, ...] → f32 logits
    void to(Device device);
    Device device() const { return device_; }

    // The int8 file: safetensors (io/safetensors.h), i8 weights, i32 biases, f32 scales, u8
    // tables, every step's numbers in the metadata. load gives back exactly the same network.
    void save(const std::string& path) const;
    static QuantizedNet load(const std::string& path);
    int64_t bytes() const;  // the steps' bytes(): what the file holds, less its header

    std::string summary() const;  // one line per step (describe())

    QSteps steps;  // a "residual" step holds its body's and shortcut's steps

private:
    Device device_ = Device::CPU;
};

// The int8 network as a Module, for what takes one (evaluate(), a trainer's scoring): forward
// runs it; backward is an error — it has no gradients (fine-tune the f32 model, then convert).
// It must not outlive `net`.
class QuantizedModule : public Module {
public:
    explicit QuantizedModule(const QuantizedNet& net) : Module("int8"), net_(net) {}
    Tensor forward(const Tensor& x) override { return net_.forward(x); }
    Tensor backward(const Tensor& dy) override;

private:
    const QuantizedNet& net_;
};

// The int8 network of `model` (eval mode, batch norms folded where they can be), its activation
// ranges from `cal` (run on at least one batch). Layers it has no int8 step for (anything but
// Conv2d with groups 1 or depthwise, Linear, MaxPool2d, GlobalAvgPool, BatchNorm2d, ReLU, ReLU6,
// GELU, Flatten, Dropout, Identity, inside Sequentials and Residuals) are an error naming the
// layer.
QuantizedNet convert(Module& model, const Calibrator& cal);
// The same with the ranges from elsewhere: range_of(layer) is the u8 range of that layer's
// output ("" for the model's input); quantization-aware training's own ranges (quant/qat.h).
using RangeOf = std::function<QParams(const std::string& layer)>;
QuantizedNet convert(Module& model, const RangeOf& range_of);

}  // namespace kiln
