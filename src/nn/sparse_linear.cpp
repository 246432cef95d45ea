// sparse_linear.cpp — SparseLinear (a Linear with its weight in CSR, inference only) and
// sparsify_linears.
#include "nn/sparse_linear.h"

#include <string>
#include <vector>

namespace kiln {

SparseLinear::SparseLinear(const Linear& dense)
    : Module(dense.name()),
      in_features(dense.in_features),
      out_features(dense.out_features),
      weight(to_csr(dense.weight.value)) {
    add_buffer("weight_values", weight.values);
    add_buffer("weight_col_index", weight.col_index);
    add_buffer("weight_row_start", weight.row_start);
    if (dense.bias.value.defined()) {
        bias = dense.bias.value.clone();
        add_buffer("bias", bias);
    }
}

Tensor SparseLinear::forward(const Tensor& x) {
    KILN_CHECK(x.ndim() == 2 && x.size(1) == in_features, name(), ": expected input [N, ", in_features, "], got ",
               x.desc(), " (a Flatten before it turns [N, C, H, W] into [N, C·H·W])");
    check_on_device(weight.values, x.device(), name(), "weight");
    if (bias.defined()) check_on_device(bias, x.device(), name(), "bias");
    return csr_linear(x, weight, bias);
}

Tensor SparseLinear::backward(const Tensor&) {
    KILN_FAIL(name(), ": a SparseLinear is for inference and has no backward; train (or fine-tune) the masked dense "
              "Linear with chapter 10's pruning, bake the mask in, then convert it (SparseLinear::from, "
              "sparsify_linears)");
}

// x [N, in] -> y [N, out]; buffers values [nnz], col_index [nnz], row_start [out + 1], bias [out].
LayerMemory SparseLinear::memory(const Shape& in, Device) const {
    KILN_CHECK(in.ndim == 2 && in[1] == in_features, name(), ": expected input [N, ", in_features, "], got ",
               in.str(), " (a Flatten before it turns [N, C, H, W] into [N, C·H·W])");
    LayerMemory m;
    m.output = Shape{in[0], out_features};
    m.buffers = {Shape{weight.nnz}, Shape{weight.nnz}, Shape{out_features + 1}};
    if (bias.defined()) m.buffers.push_back(Shape{out_features});
    return m;
}

int64_t sparsify_linears(Module& model) {
    std::vector<std::string> paths;  // collected first: replace_child destroys the old module
    for (auto& [path, m] : model.named_modules()) {
        const auto* linear = dynamic_cast<const Linear*>(m);
        if (!path.empty() && linear) paths.push_back(path);
    }
    int64_t replaced = 0;
    for (const std::string& path : paths) {
        auto sparse = SparseLinear::from(static_cast<const Linear&>(model.module_at(path)));
        if (sparse->weight.nnz == sparse->out_features * sparse->in_features) continue;  // no zero: keep it dense
        model.replace_child(path, std::move(sparse));
        replaced++;
    }
    return replaced;
}

}  // namespace kiln
