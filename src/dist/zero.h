// zero.h — ZeRO stage 1 (Rajbhandari et al., 2020): the optimizer's state sharded over the ranks.
//
// In plain data parallel training every rank keeps the whole optimizer state — SGD's momentum
// (1 float per parameter), Adam's two moments (2 floats) — and makes the same update p times.
// ZeRO-1 gives each rank one piece of the parameter slab and only that piece's state:
//
//   1. reduce-scatter the gradient slab     rank r gets Σ_ranks g over its piece only, ÷ p
//   2. the optimizer updates piece r        with piece r's state: 1/p of the state per rank
//   3. all-gather the parameter slab        every rank has every updated piece again
//
// Reduce-scatter + all-gather move the same bytes as one all-reduce (the ring all-reduce is
// exactly these two), so the memory saving is free in communication:
//     optimizer state per rank   = k · 4 bytes · P / p      (k = 1 SGD with momentum, 2 Adam)
// Stage 2 shards the gradients too (dist/zero2.h: Zero2Optimizer, this class with the
// reduce-scatter moved into backward).
//
//   auto sgd = [&](std::vector<ParamGroup> g) { return std::make_unique<SGD>(std::move(g), options); };
//   ZeroOptimizer zero(model, decay_groups(model, lr, wd), comm, sgd);
//   train_step(model, zero, x, y, step_options);    // no DataParallel: ZeRO reduces the gradients
//
// Differences from plain data parallel: the reduction happens in the optimizer, not during
// backward (no overlap here), so anything that reads the gradients between backward and step
// sees one rank's gradients only. Gradient clipping is therefore the optimizer's own
// (clip_gradients below: the global norm from every rank's piece); a GradScaler's inf check is
// not, so the trainers refuse --amp f16 with --zero 1. After step() the gradient slab outside
// this rank's piece holds nothing meaningful (zero_grad clears it before the next backward). The
// buffers (batch norm's running statistics) are broadcast from rank 0 after every step.
//
// Checkpoints: save_state gathers the pieces into the full state, laid out and named exactly as
// the unsharded optimizer's (so a ZeRO-1 checkpoint resumes with or without ZeRO, on any number
// of ranks); it is a collective: every rank calls it, rank 0 writes the file.
#pragma once
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dist/comm.h"
#include "optim/optimizer.h"

namespace kiln {

class ZeroOptimizer : public Optimizer {
public:
    // Builds the real optimizer (SGD, Adam, …) over this rank's pieces of the groups' parameters.
    using Factory = std::function<std::unique_ptr<Optimizer>(std::vector<ParamGroup>)>;

    // The model must be packed; groups hold its parameters (decay_groups). Broadcasts rank 0's
    // parameters and buffers (broadcast_model).
    ZeroOptimizer(Module& model, std::vector<ParamGroup> groups, Communicator& comm, const Factory& make);

    void step() override;  // steps 1-3 above (1 unless clip_gradients did it), then the buffers from rank 0

    // Gradient clipping by the global norm (chapter 07's clip_grad_norm) of the gradients summed
    // over the ranks, which only the pieces hold (PyTorch's FSDP.clip_grad_norm_ does the same):
    //   step 1 above, now (the coming step() does not do it again)
    //   total² = Σ_ranks Σ_{i in piece r} g_i²     each rank its piece's squares, one all-reduce of a number
    //   this rank's piece ×= max_norm / (total + 1e-6), when that is < 1
    // Returns total, the same on every rank (so every rank clips alike, and skips alike a step
    // whose norm is inf or NaN). params must be the model's parameters: the slab is clipped whole.
    float clip_gradients(const std::vector<Parameter*>& params, float max_norm) override;
    // The state of this rank's piece of the i-th parameter (empty if the piece is elsewhere).
    std::vector<Tensor> state_of(size_t i) const override;
    void save_state(StateDict& state, const std::string& prefix) const override;  // collective
    void load_state(const StateDict& state, const std::string& prefix) override;
    // A sharded checkpoint, one file a rank and nothing gathered (ZeRO-3 keeps no whole parameter
    // to gather; stages 1 and 2 may use it too): this rank's piece of the parameter slab and its
    // optimizer state, with its rank and world. load_shard checks them, puts the pieces back and
    // gathers the parameters (step 3). The model's buffers are not in it (the GPT has none).
    void save_shard(StateDict& state, const std::string& prefix) const;
    void load_shard(const StateDict& state, const std::string& prefix);

    const std::vector<int64_t>& pieces() const { return pieces_; }  // p + 1 offsets into the slab
    // For each of the model's parameters, in order: how many of its elements this rank updates
    // and keeps state for (the memory model's ZeRO-1 prediction, train/memory_model.h).
    std::vector<int64_t> state_elements(Module& model) const override;
    const Optimizer& rule() const override { return *inner_; }  // the optimizer it runs on its piece

protected:
    // Step 1: this rank's piece of the gradient := the mean over the ranks (sum_gradients, then ÷ p).
    void reduce_gradients();
    // ZeRO-1 reduce-scatters the gradient slab; ZeRO-2 (zero2.h) summed its piece during backward.
    virtual void sum_gradients();
    // This rank's piece of the gradient (slab elements [lo, hi)): what step 1 leaves, the update reads.
    virtual Tensor gradient_piece() const { return piece_of(grads_); }
    // Step 3: every rank's updated piece to every rank (ZeRO-3 gathers each layer when it runs).
    virtual void gather_parameters() { comm_.all_gather(values_, pieces_); }
    // This rank's piece of the parameter slab (ZeRO-3 keeps it apart: the slab is gone).
    virtual Tensor values_piece() const { return piece_of(values_); }
    // clip_gradients has done step 1 for the coming step(). (A step skipped after it, for a
    // norm that is inf or NaN, leaves it set: the next clip_gradients reduces the next gradients.)
    bool reduced_ = false;
    Tensor piece_of(const Tensor& slab) const;  // this rank's elements of a slab

    // This rank's part of one parameter: elements [offset, offset + length) of it, as the
    // parameter `shard` (1-D views into the value and gradient slabs) the inner optimizer updates.
    struct Piece {
        const Parameter* param = nullptr;  // the model's parameter
        size_t outer = 0;     // the parameter's index over the groups, in order
        int64_t offset = 0;   // first element within the parameter
        Parameter* shard = nullptr;
    };
    Module& model_;
    Communicator& comm_;
    Tensor values_, grads_;           // the slabs, 1-D
    std::vector<int64_t> pieces_;     // rank r owns slab elements [pieces_[r], pieces_[r + 1])
    std::deque<Parameter> shards_;    // a deque: the inner optimizer keeps pointers to them
    std::vector<Piece> mine_;         // in the inner optimizer's order
    std::vector<int> inner_of_;       // outer parameter index → index in mine_, or −1
    std::vector<size_t> outer_group_; // inner group → the outer group it comes from
    std::unique_ptr<Optimizer> inner_;
};

// For each of the (packed) model's parameters, in order: how many of its elements rank `rank` of
// `world` updates and keeps optimizer state for under ZeRO-1 — what ZeroOptimizer::state_elements
// reports on that rank, computed without a communicator (the memory model's ZeRO-1 prediction
// for a world this machine cannot run). The slab is cut as the optimizer cuts it: even pieces
// of 64 bytes.
std::vector<int64_t> zero_state_elements(Module& model, int rank, int world);

// Memory per rank of the model's state in f32 — parameters, gradients, optimizer state (k slabs:
// state_slabs in train/memory_model.h) — for each world size in `ranks`, with and without ZeRO-1:
//   stage 0: 4·P + 4·P + 4·k·P        stage 1: 4·P + 4·P + 4·k·P / p
// (activations come on top, the same in both: they depend on each rank's batch).
std::string zero_memory_table(int64_t parameters, int state_slabs, const std::vector<int>& ranks);

}  // namespace kiln
