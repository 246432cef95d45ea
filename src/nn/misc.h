// misc.h — small layers of chapter 06 onwards: Dropout, GELU, Residual, Identity.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "core/rng.h"
#include "nn/module.h"

namespace kiln {

// Inverted dropout: in training each element is zeroed with probability p and the others
// are scaled by 1/(1 − p), so the expected output equals the input and eval needs no
// rescaling; in eval it is the identity (returns x itself, no copy).
//   y = x · mask / (1 − p)        dx = dy · mask / (1 − p)        mask[i] ∈ {0, 1}
// The mask comes from a counter-based Rng (core/rng.h): element i of a forward pass uses the
// stream's value at(first + i), so it is the same on any thread count. It is kept (u8, one
// byte per element) for backward.
class Dropout : public Module {
public:
    explicit Dropout(float p = 0.5f, uint64_t seed = 0, std::string name = "dropout");
    Tensor forward(const Tensor& x) override;
    Tensor backward(const Tensor& dy) override;
    // In training with p > 0: y [in], 4 bytes an element, and the mask kept, 1 byte an element;
    // dx [in]. With p = 0 the identity: nothing allocated.
    LayerMemory memory(const Shape& in, Device device) const override;
    Rng* random_stream() override { return &rng; }

    float p;
    Rng rng;
    // When true every forward draws the same mask (the stream restarts at counter 0): for
    // gradient checks, which call forward many times and need one fixed function.
    bool fixed_mask = false;

private:
    Tensor mask_;  // u8, the shape of x
    bool identity_ = false;  // the last forward was the identity (eval or p = 0)
};

// GELU, exact form (PyTorch's default):  y = x · Φ(x) = x/2 · (1 + erf(x/√2))
//   dx = dy · (Φ(x) + x · φ(x)),   φ(x) = exp(−x²/2)/√(2π).   Keeps x for backward.
// Memory: Module::memory's default (y [in], x kept, dx [in]).
class GELU : public Module {
public:
    explicit GELU(std::string name = "gelu") : Module(std::move(name)) {}
    Tensor forward(const Tensor& x) override;
    Tensor backward(const Tensor& dy) override;

private:
    Tensor x_;
};

// y = x, dx = dy: what a layer becomes when its work has moved into another one (a batch norm
// folded into the convolution before it, chapter 11). Returns its input itself: nothing allocated.
class Identity : public Module {
public:
    explicit Identity(std::string name = "identity") : Module(std::move(name)) {}
    Tensor forward(const Tensor& x) override { return x; }
    Tensor backward(const Tensor& dy) override { return dy; }
    LayerMemory memory(const Shape& in, Device device) const override;
};

// y = s · x,  dx = s · dy: a fixed factor, e.g. airbench's 1/9 on the logits (chapter 13), which
// makes the softmax softer at the start than the head's initialization alone would.
// Memory: Module::memory's default (y [in], dx [in]; keeps nothing).
class Scale : public Module {
public:
    explicit Scale(float s, std::string name = "scale") : Module(std::move(name)), s_(s) {}
    Tensor forward(const Tensor& x) override;
    Tensor backward(const Tensor& dy) override;
    float factor() const { return s_; }

private:
    float s_;
};

// y = f(x) + shortcut(x)   (shortcut = identity when null; then f must keep x's shape)
// backward: dx = f.backward(dy) + shortcut.backward(dy)   (+ dy for the identity)
// Its children: f named "body", then the shortcut (if any) named "shortcut".
class Residual : public Module {
public:
    explicit Residual(std::unique_ptr<Module> f, std::unique_ptr<Module> shortcut = nullptr,
                      std::string name = "residual");
    Tensor forward(const Tensor& x) override;
    Tensor backward(const Tensor& dy) override;

    Module& body() { return child(0); }
    Module* shortcut() { return children().size() > 1 ? &child(1) : nullptr; }
};

}  // namespace kiln
