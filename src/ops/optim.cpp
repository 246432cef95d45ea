// optim.cpp — the optimizer update ops (optim.h): the group's checks, then one kernel call for the
// whole group on its device (one parallel region on the CPU, one launch on CUDA).
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

// The kernels' view of a list: each tensor's data, or nothing for an empty (optional) list.
static std::vector<float*> pointers(const std::vector<Tensor>& list) {
    std::vector<float*> out;
    for (const Tensor& t : list) out.push_back(const_cast<Tensor&>(t).data<float>());
    return out;
}

static float* const* data_or_null(const std::vector<float*>& pointers) {
    return pointers.empty() ? nullptr : pointers.data();
}

static std::vector<int64_t> sizes(const std::vector<Tensor>& list) {
    std::vector<int64_t> out;
    for (const Tensor& t : list) out.push_back(t.numel());
    return out;
}

void sgd_update(const std::vector<Tensor>& params, const std::vector<Tensor>& grads, const std::vector<Tensor>& bufs,
                const SgdParams& s) {
    const Device device = check_group("sgd_update", params, {{&grads, false}, {&bufs, s.momentum == 0.0f}});
    KILN_CHECK(s.momentum == 0.0f || !bufs.empty(), "sgd_update: momentum ", s.momentum, " needs its buffers");
    const std::vector<float*> p = pointers(params), g = pointers(grads), buf = pointers(bufs);
    const std::vector<int64_t> n = sizes(params);
    on_backend(device, [&](auto be) {
        kernel::sgd_update(be, p.data(), g.data(), data_or_null(buf), n.data(), int64_t(n.size()), s);
    });
}

void adam_update(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                 const std::vector<Tensor>& exp_avg, const std::vector<Tensor>& exp_avg_sq,
                 const std::vector<Tensor>& max_exp_avg_sq, const AdamParams& a) {
    const Device device = check_group("adam_update", params,
                                      {{&grads, false}, {&exp_avg, false}, {&exp_avg_sq, false}, {&max_exp_avg_sq, true}});
    const std::vector<float*> p = pointers(params), g = pointers(grads), m = pointers(exp_avg),
                              v = pointers(exp_avg_sq), v_max = pointers(max_exp_avg_sq);
    const std::vector<int64_t> n = sizes(params);
    on_backend(device, [&](auto be) {
        kernel::adam_update(be, p.data(), g.data(), m.data(), v.data(), data_or_null(v_max), n.data(),
                            int64_t(n.size()), a);
    });
}

bool unscale_and_check_(const std::vector<Tensor>& grads, float inv_scale) {
    const Device device = check_group("unscale_and_check_", grads, {});
    const std::vector<float*> g = pointers(grads);
    const std::vector<int64_t> n = sizes(grads);
    return on_backend(device, [&](auto be) {
        return kernel::unscale_and_check(be, g.data(), n.data(), int64_t(n.size()), inv_scale);
    });
}

}  // namespace kiln
