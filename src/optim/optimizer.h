// optimizer.h — updates parameters from their gradients. Chapter 02 uses SGD with momentum;
// chapter 07 adds the rest (Adam, AdamW, schedulers).
#pragma once
#include <vector>

#include "nn/module.h"

namespace kiln {

class Optimizer {
public:
    Optimizer(std::vector<Parameter*> params, float lr);
    virtual ~Optimizer() = default;
    virtual void step() = 0;  // one update of every parameter from its grad
    void zero_grad();         // every grad := 0
    float lr;                 // read and set by learning-rate schedulers
    int64_t steps() const { return steps_; }

protected:
    std::vector<Parameter*> params_;
    int64_t steps_ = 0;
};

// Stochastic gradient descent with PyTorch's semantics (torch.optim.SGD):
//   g   = grad + weight_decay · p                       (L2 penalty)
//   buf = g                                  on the first step
//   buf = momentum · buf + (1 − dampening) · g          after that
//   g   = nesterov ? g + momentum · buf : buf            (when momentum ≠ 0)
//   p   = p − lr · g
// Memory: one buffer per parameter when momentum ≠ 0 (Category::OptimizerState), else none.
class SGD : public Optimizer {
public:
    struct Options {
        float momentum = 0.0f, dampening = 0.0f, weight_decay = 0.0f;
        bool nesterov = false;
    };
    SGD(std::vector<Parameter*> params, float lr, Options options);
    SGD(std::vector<Parameter*> params, float lr) : SGD(std::move(params), lr, Options{}) {}
    void step() override;
    const Options& options() const { return opt_; }
    std::vector<Tensor>& momentum_buffers() { return buf_; }

private:
    Options opt_;
    std::vector<Tensor> buf_;  // one per parameter, created on the first step
};

}  // namespace kiln
