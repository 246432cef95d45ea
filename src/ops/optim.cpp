// optim.cpp — the optimizer update ops (optim.h): the group's checks, then one kernel call per
// segment on the segments' device.
#include "ops/optim.h"

#include "core/tensor.h"

namespace kiln {

// Every list has params.size() tensors (or is empty when `optional`), each f32 with params[i]'s
// shape on params[0]'s device. Returns that device.
static Device check_group(const char* op, const std::vector<Tensor>& params,
                          std::initializer_list<std::pair<const std::vector<Tensor>*, bool>> lists) {
    KILN_CHECK(!params.empty(), op, ": an empty group");
    const Device device = params[0].device();
    for (auto [list, optional] : lists) {
        KILN_CHECK(list->size() == params.size() || (optional && list->empty()), op, ": ", params.size(),
                   " parameters but ", list->size(), " tensors beside them");
    }
    for (size_t i = 0; i < params.size(); i++) {
        check_dtype(params[i], DType::F32, op, "parameter");
        KILN_CHECK(params[i].device() == device, op, ": the group's parameters are on more than one device (",
                   params[0].desc(), " and ", params[i].desc(), ")");
        for (auto [list, optional] : lists) {
            if (list->empty()) continue;
            check_shape((*list)[i], params[i].shape(), op, "state or gradient");
            check_dtype((*list)[i], DType::F32, op, "state or gradient");
            check_same_device(params[i], (*list)[i], op);
        }
    }
    return device;
}

static float* data_or_null(const std::vector<Tensor>& list, size_t i) {
    return list.empty() ? nullptr : const_cast<Tensor&>(list[i]).data<float>();
}

void sgd_update(const std::vector<Tensor>& params, const std::vector<Tensor>& grads, const std::vector<Tensor>& bufs,
                const SgdParams& s) {
    const Device device = check_group("sgd_update", params, {{&grads, false}, {&bufs, s.momentum == 0.0f}});
    KILN_CHECK(s.momentum == 0.0f || !bufs.empty(), "sgd_update: momentum ", s.momentum, " needs its buffers");
    on_backend(device, [&](auto be) {
        for (size_t i = 0; i < params.size(); i++)
            kernel::sgd_update(be, data_or_null(params, i), grads[i].data<float>(), data_or_null(bufs, i),
                               params[i].numel(), s);
    });
}

void adam_update(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                 const std::vector<Tensor>& exp_avg, const std::vector<Tensor>& exp_avg_sq,
                 const std::vector<Tensor>& max_exp_avg_sq, const AdamParams& a) {
    const Device device = check_group("adam_update", params,
                                      {{&grads, false}, {&exp_avg, false}, {&exp_avg_sq, false}, {&max_exp_avg_sq, true}});
    on_backend(device, [&](auto be) {
        for (size_t i = 0; i < params.size(); i++)
            kernel::adam_update(be, data_or_null(params, i), grads[i].data<float>(), data_or_null(exp_avg, i),
                                data_or_null(exp_avg_sq, i), data_or_null(max_exp_avg_sq, i), params[i].numel(), a);
    });
}

bool unscale_and_check_(const std::vector<Tensor>& grads, float inv_scale) {
    const Device device = check_group("unscale_and_check_", grads, {});
    std::vector<float*> data;
    std::vector<int64_t> sizes;
    for (const Tensor& g : grads) {
        data.push_back(const_cast<Tensor&>(g).data<float>());
        sizes.push_back(g.numel());
    }
    return on_backend(device, [&](auto be) {
        return kernel::unscale_and_check(be, data.data(), sizes.data(), int64_t(grads.size()), inv_scale);
    });
}

}  // namespace kiln
