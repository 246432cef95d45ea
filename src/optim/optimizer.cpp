// optimizer.cpp — the optimizer base and SGD (formulas in optimizer.h).
#include "optim/optimizer.h"

#include "ops/cpu/cpu_ops.h"
#include "ops/cuda_ops.h"
#include "ops/ops.h"

namespace kiln {

Optimizer::Optimizer(std::vector<Parameter*> params, float learning_rate)
    : lr(learning_rate), params_(std::move(params)) {
    KILN_CHECK(!params_.empty(), "optimizer: no parameters to optimize");
    KILN_CHECK(lr >= 0.0f, "optimizer: learning rate must be ≥ 0, got ", lr);
}

void Optimizer::zero_grad() {
    for (Parameter* p : params_) fill_(p->grad, 0.0f);
}

SGD::SGD(std::vector<Parameter*> params, float learning_rate, Options options)
    : Optimizer(std::move(params), learning_rate), opt_(options) {
    KILN_CHECK(opt_.momentum >= 0.0f && opt_.weight_decay >= 0.0f, "SGD: momentum and weight_decay must be ≥ 0");
    KILN_CHECK(!opt_.nesterov || (opt_.momentum > 0.0f && opt_.dampening == 0.0f),
               "SGD: Nesterov momentum needs momentum > 0 and dampening = 0 (as in PyTorch)");
}

void SGD::step() {
    bool first = buf_.empty();
    if (first && opt_.momentum != 0.0f)
        for (Parameter* p : params_)
            buf_.push_back(Tensor::zeros(p->value.shape(), DType::F32, p->value.device(), Category::OptimizerState));
    for (size_t i = 0; i < params_.size(); i++) {
        Tensor& w = params_[i]->value;
        const Tensor& g = params_[i]->grad;
        check_same_device(w, g, "SGD::step");
        float* buf = opt_.momentum != 0.0f ? buf_[i].data<float>() : nullptr;
        auto update = w.device() == Device::CUDA ? cuda::sgd_update : cpu::sgd_update;
        update(w.data<float>(), g.data<float>(), buf, w.numel(), lr, opt_.momentum, opt_.dampening,
               opt_.weight_decay, opt_.nesterov, first);
    }
    steps_++;
}

}  // namespace kiln
