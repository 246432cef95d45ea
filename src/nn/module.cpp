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

void check_on_device(const Tensor& t, Device device, const std::string& layer, const char* what) {
    const char* to = device == Device::CUDA ? "Device::CUDA" : "Device::CPU";
    KILN_CHECK(t.device() == device, layer, ": ", what, " is on ", device_name(t.device()), " but the input is on ",
               device_name(device), ": a layer reads all its tensors on one device; move the model with model.to(",
               to, ") and the data with .to(", to, ")");
}

int64_t Module::num_parameters() {
    int64_t n = 0;
    for (Parameter* p : parameters()) n += p->value.numel();
    return n;
}

}  // namespace kiln
