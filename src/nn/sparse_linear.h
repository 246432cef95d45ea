// sparse_linear.h — SparseLinear: a pruned Linear with its weight in compressed sparse rows
// (ops/sparse.h), for inference (chapter 10), and sparsify_linears, which puts one in place of
// every pruned Linear of a model.
//
// Masks alone save nothing: a Linear pruned to 90% still stores and multiplies all of W. The
// way to real savings is to train (and fine-tune) the masked dense Linear as chapter 10's
// pruning does, bake the mask in, and then convert:
//
//   Linear fc (W [out, in] mostly 0, b [out])  →  SparseLinear: W in CSR, b as it was
//   y = x · Wᵀ + b, computed by csr_linear: the same function, from 8·nnz + 4·(out + 1) bytes
//   of weight instead of 4·out·in (smaller past 50% sparsity), and faster past the crossover
//   that bench/bench_sparse.cpp measures.
//
// It is for inference: its backward throws. It holds no Parameter — the CSR arrays and the
// bias are buffers ("weight_values", "weight_col_index", "weight_row_start", "bias"), so
// model.to(device) moves them and save_model/load_model (train/checkpoint.h) save and load
// them; loading checks each array's shape, so a checkpoint loads into a model sparsified from
// weights with the same number of nonzeros in each layer.
#pragma once
#include <memory>

#include "nn/layers.h"
#include "ops/sparse.h"

namespace kiln {

class SparseLinear : public Module {
public:
    // W = to_csr(dense.weight) (exact zeros left out) and a copy of dense.bias, on the device
    // dense's weight is on; the name is dense's.
    explicit SparseLinear(const Linear& dense);
    static std::unique_ptr<SparseLinear> from(const Linear& dense) { return std::make_unique<SparseLinear>(dense); }

    Tensor forward(const Tensor& x) override;  // x [N, in] -> y [N, out]
    Tensor backward(const Tensor& dy) override;  // throws: train the masked dense Linear instead
    // x [N, in] -> y [N, out]: 4·N·out bytes allocated; buffers the CSR arrays [nnz], [nnz],
    // [out + 1] (f32, i32, i32: 4 bytes an element each) and b [out], no parameter, nothing
    // kept. (The CPU kernel packs x into panels of its own — in·16·⌈N/16⌉ floats for the call —
    // outside kiln's allocators, as the GEMM's packing buffers are.)
    LayerMemory memory(const Shape& in, Device device) const override;

    int64_t in_features, out_features;
    CsrMatrix weight;
    Tensor bias;  // f32 [out], undefined when the Linear had none
};

// Replaces every Linear of `model` whose weight has at least one exact zero by a SparseLinear
// (Module::replace_child: same name, same place), and returns how many it replaced. The model
// is unpacked by it (replace_child's rule); it is for inference from then on. The root itself
// is not replaced, only modules below it.
int64_t sparsify_linears(Module& model);

}  // namespace kiln
