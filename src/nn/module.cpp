// module.cpp — what every module shares: zeroing grads, moving between devices, counting.
#include "nn/module.h"

#include "ops/ops.h"

namespace kiln {

Parameter Module::make_parameter(std::string name, Tensor value) {
    Parameter p;
    p.name = std::move(name);
    p.value = value;
    p.grad = Tensor::zeros(value.shape(), DType::F32, value.device(), Category::Gradient);
    return p;
}

void Module::zero_grad() {
    for (Parameter* p : parameters()) fill_(p->grad, 0.0f);
}

void Module::to(Device device) {
    for (Parameter* p : parameters()) {
        p->value = p->value.to(device);
        p->grad = p->grad.to(device);
    }
    for (auto& [name, t] : buffers()) *t = t->to(device);
}

int64_t Module::num_parameters() {
    int64_t n = 0;
    for (Parameter* p : parameters()) n += p->value.numel();
    return n;
}

}  // namespace kiln
