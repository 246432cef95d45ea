// zero2.h — ZeRO stage 2 (Rajbhandari et al., 2020): the gradients sharded over the ranks too.
//
// ZeRO-1 (zero.h) keeps the whole gradient slab on every rank until step() reduce-scatters it.
// ZeRO-2 reduce-scatters each bucket of gradients as backward completes it, keeps this rank's
// piece of the sum, and lets the bucket's buffer go before the layers below need theirs:
//
//   backward reaches a layer        its bucket gets a zeroed buffer; the layer's grads are views in it
//   the bucket's layers are done    reduce-scatter the buffer; rank r adds its part into its piece
//                                   of the gradient; the buffer goes back to the pool
//   step()                          as ZeRO-1: the piece ÷ p, the update, all-gather the parameters
//
//   memory per rank:   parameters 4·P     gradients 4·P / p (+ the buckets in flight)
//                      optimizer state 4·k·P / p
//
// The gradient slab is dropped (Module::drop_grad_slab): between backwards a parameter's grad is
// undefined, and no code may read the gradients between backward and step(): clipping is the
// optimizer's (ZeroOptimizer::clip_gradients, which train_step calls: the global norm from the
// pieces); a GradScaler's inf check cannot be used with it.
// At most two buckets are in flight in the usual case: the one backward is filling and the one of
// the parameters listed in options.written_early (below); the collective is blocking (the MPI
// communicator's reduce_scatter), so the communication is not overlapped with backward here.
//
// A parameter is normally written by its own layer's backward, so its bucket's buffer is made by
// a backward pre-hook on that layer. A tied weight is written earlier by another layer (the GPT's
// lm_head writes the token embedding's gradient first, the embedding last): list it in
// written_early, and its bucket's buffer is made when backward starts. A parameter written before
// its buffer exists fails in the op that writes it (an undefined gradient tensor).
//
// The result is the same bits as plain data parallel (DataParallel) with the same optimizer on
// the same shares of the batch: the same sums (on 2 ranks a + b either way), the same ÷ p, the
// same update. Checkpoints are ZeRO-1's (save_state gathers the whole state; a collective).
// Gradient accumulation (train_step's accumulate) adds each micro-batch's reduced piece.
#pragma once
#include <cstdint>
#include <vector>

#include "dist/data_parallel.h"
#include "dist/zero.h"

namespace kiln {

struct Zero2Options {
    int64_t bucket_bytes = 25 << 20;  // DDP's 25 MiB; a small model wants smaller buckets to save anything
    std::vector<const Parameter*> written_early;  // tied weights (above)
    std::vector<bool> starts_unit;  // per model parameter (when given): a bucket closes before it (ZeRO-3)
};

class Zero2Optimizer : public ZeroOptimizer {
public:
    // The model must be packed; its gradient slab is dropped (this rank's piece is kept here).
    Zero2Optimizer(Module& model, std::vector<ParamGroup> groups, Communicator& comm, const Factory& make,
                   Zero2Options options = {});
    ~Zero2Optimizer() override;  // takes its hooks off the model
    Zero2Optimizer(const Zero2Optimizer&) = delete;
    Zero2Optimizer& operator=(const Zero2Optimizer&) = delete;

    void step() override;
    const std::vector<GradBucket>& buckets() const { return buckets_; }

protected:
    void sum_gradients() override {}  // backward did it, bucket by bucket
    Tensor gradient_piece() const override { return piece_; }

    std::vector<int64_t> at_;            // per model parameter: its offset in the (dropped) slab
    std::vector<Parameter*> params_;     // the model's parameters, in slab order

private:
    Zero2Options opt_;
    Tensor piece_;                       // Σ_ranks g over this rank's slab elements [lo, hi)
    std::vector<GradBucket> buckets_;    // bucket 0 first in backward
    std::vector<Tensor> buffers_;        // per bucket: its buffer while backward fills it
    std::vector<int> waiting_;           // per bucket: parameters whose layer has not finished
    std::vector<size_t> bucket_of_;      // per model parameter: its bucket
    size_t reduced_ = 0;                 // buckets reduced this backward (in order 0, 1, …)
    bool accumulate_ = false;            // add to piece_ (a second micro-batch) rather than copy
    std::vector<HookHandle> hooks_;

    void give_buffer(size_t bucket);      // a zeroed buffer; its parameters' grads are views in it
    void reduce_ready_buckets();
    void reduce(size_t bucket);           // reduce-scatter, keep this rank's part, let the buffer go
    void finish_backward();
};

}  // namespace kiln
