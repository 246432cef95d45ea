// module.h — the building block of a network: explicit forward and backward.
//
//   y  = m.forward(x)     computes the output and keeps what backward will need (the cache)
//   dx = m.backward(dy)   given dL/dy, adds dL/dW to each parameter's grad and returns dL/dx
//
// There is no tape: each module knows its own derivative, and Sequential calls backward in
// reverse order. A module's cache is a set of ordinary tensors from the allocator, so the
// memory report can count them; backward releases them.
#pragma once
#include <string>
#include <vector>

#include "core/tensor.h"

namespace kiln {

// A learnable tensor and the gradient of the loss with respect to it (same shape).
struct Parameter {
    std::string name;  // "fc1.weight" once the module is inside a Sequential
    Tensor value;      // Category::Parameter
    Tensor grad;       // Category::Gradient, accumulated by backward, cleared by zero_grad
};

class Module {
public:
    explicit Module(std::string name) : name_(std::move(name)) {}
    virtual ~Module() = default;
    Module(const Module&) = delete;
    Module& operator=(const Module&) = delete;

    virtual Tensor forward(const Tensor& x) = 0;
    virtual Tensor backward(const Tensor& dy) = 0;

    // Does anyone need dL/dx from backward? Not for the network's first layer: its input is
    // the data, not something computed. When false, backward still accumulates the parameter
    // grads but may skip dx (for LeNet's first convolution, the GEMM and col2im of a dx that
    // would be thrown away) and then returns an undefined Tensor. Sequential hands its own
    // flag to its first child; train_epoch sets it to false on the model it trains.
    bool input_needs_grad = true;

    // The module's learnable tensors (a container gathers its children's).
    virtual std::vector<Parameter*> parameters() { return {}; }
    // Non-learned state that a checkpoint must keep (e.g. batch norm's running mean).
    virtual std::vector<std::pair<std::string, Tensor*>> buffers() { return {}; }

    virtual void train(bool on = true) { training_ = on; }
    void eval() { train(false); }
    bool training() const { return training_; }

    void zero_grad();               // every grad := 0
    void to(Device device);         // moves parameters, grads and buffers
    int64_t num_parameters();       // total elements of all parameters
    const std::string& name() const { return name_; }
    void set_name(std::string n) { name_ = std::move(n); }

protected:
    // A parameter with a zero grad of the same shape.
    static Parameter make_parameter(std::string name, Tensor value);

private:
    std::string name_;
    bool training_ = true;
};

// A layer runs its kernels on its input's device: every other tensor it reads (its parameters
// and buffers, dy, its cache) must be there too. Fails naming the layer, the tensor (`what`) and
// both devices, and says to move the model: model.to(device).
void check_on_device(const Tensor& t, Device device, const std::string& layer, const char* what);

}  // namespace kiln
