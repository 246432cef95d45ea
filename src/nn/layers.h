// layers.h — the layers of chapters 01–02: Linear, ReLU, Flatten, and the Sequential container.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/rng.h"
#include "nn/module.h"

namespace kiln {

struct LossTotals;  // ops/loss.h

// y = x · Wᵀ + b          x: [N, in]   W: [out, in]   b: [out]   y: [N, out]
// backward:  dW += dyᵀ · x     db += Σ_n dy[n, :]     dx = dy · W
// Like PyTorch's, x may be [..., in] (a transformer's [B, T, C]): its rows are every dimension
// but the last, and y is [..., out]. Initialized like PyTorch: W, b ~ U(−1/√in, 1/√in).
class Linear : public Module {
public:
    Linear(int64_t in, int64_t out, Rng& rng, bool bias = true, std::string name = "linear");
    Tensor forward(const Tensor& x) override;
    Tensor backward(const Tensor& dy) override;
    // x [N, in] -> y [N, out]: 4·N·out bytes; parameters 4·(out·in + out) bytes (+ as much
    // gradient); keeps x; backward lets x go, then allocates dx [N, in]: 4·N·in bytes.
    LayerMemory memory(const Shape& in, Device device) const override;

    Parameter weight, bias;  // "weight", "bias"; bias undefined when built without one
    int64_t in_features, out_features;

private:
    Tensor x_;        // the input as the op read it (ops/gemm.h linear), [rows, in], kept for dW
    Shape in_shape_;  // the input's own shape: dx goes back in it
};

// The ReLU family: y = min(max(x, 0), cap);  dx = dy · [0 < y < cap]   (an undefined dy, when no
// one needs dx, gives an undefined dx). ReLU is cap = +∞ (then dx = dy · [y > 0]), ReLU6 cap = 6.
// Both are this class with their cap; the ops are relu, relu_ and relu_backward with that cap
// (ops/elementwise.h). They are two types, not one, so that code asking "is this a ReLU?" (quantization
// fusing a ReLU into the conv before it, model surgery) is not told yes for a ReLU6.
//
// In place (ReLU::InPlace, PyTorch's nn.ReLU(inplace=True)): y is written over x's bytes, so
// the layer allocates nothing — x and y are never both alive (one activation fewer at the
// peak), and a step arena, which frees nothing before its reset, holds one activation fewer per
// ReLU. Backward needs only where y lies, and y is what the layer keeps: 0 < y < cap exactly when
// 0 < x < cap. The rule: in place is allowed when no one else
// reads x afterwards — not the layer before for its backward, not anyone in the forward:
//   after BatchNorm     yes: BN keeps its input and statistics, not its output
//   after MaxPool2d     yes: it keeps the argmax indices
//   after Linear, Conv  yes: they keep their input (for dW), not their output
//   after GELU          yes: GELU keeps its input
//   after a Residual    yes: the sum it returns is kept by no one (a ResNet block's last ReLU)
//   after a layer whose backward reads its own output (sigmoid, tanh, softmax, a ReLU): no
//   first in a network, a Residual's body or a Checkpoint: no — x is the data, the input the
//                       shortcut adds, or the input the Checkpoint recomputes from
// The model builder decides (models.cpp); the values computed are the same either way.
class CappedReLU : public Module {
public:
    enum Mode { OutOfPlace, InPlace };
    Tensor forward(const Tensor& x) override;
    Tensor backward(const Tensor& dy) override;
    // y [in] allocated and kept (not x: backward needs only y); dx [in] in backward.
    LayerMemory memory(const Shape& in, Device device) const override;
    float cap() const { return cap_; }

    Mode mode;

protected:
    CappedReLU(Mode mode, float cap, std::string name);

private:
    float cap_;
    Tensor y_;  // the output: where it lies in [0, cap] is all backward needs
};

// y = max(x, 0);  dx = dy · [y > 0]
class ReLU : public CappedReLU {
public:
    explicit ReLU(Mode mode = OutOfPlace, std::string name = "relu");
};

// y = min(max(x, 0), 6);  dx = dy · [0 < x < 6], strict at both ends as PyTorch's nn.ReLU6
// (hardtanh(x, 0, 6), whose backward passes dy only where min_val < x < max_val). MobileNetV2's
// activation (chapter 13): bounded, so it keeps its range in low precision.
class ReLU6 : public CappedReLU {
public:
    explicit ReLU6(Mode mode = OutOfPlace, std::string name = "relu6");
};

// [N, C, H, W] -> [N, C·H·W]: a view, no copy; backward reshapes dy back (an undefined dy, when
// no one needs dx, gives an undefined dx).
class Flatten : public Module {
public:
    explicit Flatten(std::string name = "flatten") : Module(std::move(name)) {}
    Tensor forward(const Tensor& x) override;
    Tensor backward(const Tensor& dy) override;
    // [N, ...] -> [N, rest]: views, 0 bytes in forward and in backward.
    LayerMemory memory(const Shape& in, Device device) const override;

private:
    Shape in_shape_;
};

// Runs its children in order through call(); backward runs them in reverse through
// call_backward(). Children are named "0", "1", ... by position, unless added with a name:
//   seq.emplace<ReLU>();                                      // "1" if it is the second
//   seq.add("fc1", std::make_unique<Linear>(784, 512, rng));  // "fc1"
// Its input_needs_grad goes to the leading children without parameters and the first one with
// (an MLP's Flatten and its first Linear, which then skips a dx no one reads).
class Sequential : public Module {
public:
    explicit Sequential(std::string name = "sequential") : Module(std::move(name)) {}
    template <typename M> M& add(std::string name, std::unique_ptr<M> m) {
        return static_cast<M&>(add_child(std::move(name), std::move(m)));
    }
    template <typename M> M& add(std::unique_ptr<M> m) { return add(std::to_string(size()), std::move(m)); }
    template <typename M, typename... Args> M& emplace(Args&&... args) {
        return add(std::make_unique<M>(std::forward<Args>(args)...));
    }
    Tensor forward(const Tensor& x) override;
    Tensor backward(const Tensor& dy) override;
    size_t size() const { return children().size(); }
    Module& operator[](size_t i) { return child(i); }
};

// Softmax cross-entropy, averaged over the batch.
//   loss = 1/N Σ_n [ log Σ_c exp(z[n,c]) − z[n, y_n] ]      dz = (softmax(z) − onehot(y)) / N
// With label_smoothing ε the target is (1 − ε)·onehot(y) + ε/C (ops/loss.h, softmax_cross_entropy).
// Labels [N], or [B, T] for logits [B·T, C] (a GPT's targets, one per position: flattened as
// nanoGPT's targets.view(-1), the order of the logits' rows).
class CrossEntropyLoss {
public:
    explicit CrossEntropyLoss(float label_smoothing = 0.0f) : label_smoothing_(label_smoothing) {}
    // The loss is computed in the type autocast gives it (f32 under autocast, chapter 09: the op
    // casts); correct (if not null): the rows predicted right (softmax_cross_entropy, ops/loss.h).
    float forward(const Tensor& logits, const Tensor& labels, int64_t* correct = nullptr);  // keeps dz for backward
    // The same, its loss and count left in `totals` on the logits' device, not read (ops/loss.h:
    // softmax_cross_entropy_into; train/loss_log.h).
    void forward_into(const Tensor& logits, const Tensor& labels, LossTotals* totals);
    // scale · dL/dlogits, in the logits' type (and releases it). scale: a micro-batch's share of
    // the batch (train/loop.h) times a GradScaler's loss scale (optim/grad_scaler.h); applied in
    // f32, before the gradient is rounded to an f16 logits' type.
    Tensor backward(float scale = 1.0f);

private:
    float label_smoothing_;
    Tensor dz_;                        // in the type the loss was computed in
    DType logits_dtype_ = DType::F32;  // the gradient's type: the logits'
};

}  // namespace kiln
