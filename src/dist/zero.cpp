// zero.cpp — ZeRO-1: reduce-scatter, update this rank's piece, all-gather (zero.h).
#include "dist/zero.h"

#include <algorithm>
#include <cstdio>

#include "core/allocator.h"
#include "core/error.h"
#include "dist/data_parallel.h"
#include "ops/ops.h"

namespace kiln {

namespace {

Tensor flat(const Tensor& t) { return t.view(0, {t.numel()}); }

constexpr int64_t kPieceAlign = 16;  // each rank's piece of the slab starts at a multiple of 16 floats: 64 bytes

// Elements [at, at + n) of a slab, as a 1-D tensor.
Tensor range_of(const Tensor& slab, int64_t at, int64_t n) { return slab.view(size_t(at) * sizeof(float), {n}); }

}  // namespace

ZeroOptimizer::ZeroOptimizer(Module& model, std::vector<ParamGroup> groups, Communicator& comm, const Factory& make)
    : Optimizer(std::move(groups)), model_(model), comm_(comm) {
    KILN_CHECK(model.packed(), model.name(), ": ZeRO-1 shards the parameter and gradient slabs; pack() the model first");
    broadcast_model(model, comm);
    values_ = flat(model.values_view());
    grads_ = flat(model.grads_view());
    pieces_ = even_pieces(grads_.numel(), comm.size(), kPieceAlign);
    const int64_t lo = pieces_[size_t(comm.rank())], hi = pieces_[size_t(comm.rank()) + 1];
    KILN_CHECK(hi > lo, "ZeRO-1: ", grads_.numel(), " slab elements are too few for ", comm.size(),
               " ranks (rank ", comm.rank(), " would own nothing): use fewer ranks or no --zero");

    // This rank's piece of every parameter whose slab range meets [lo, hi).
    std::vector<ParamGroup> inner_groups;
    for (size_t g = 0; g < groups_.size(); g++) {
        ParamGroup inner{{}, groups_[g].lr, groups_[g].weight_decay};
        for (Parameter* p : groups_[g].params) {
            const int64_t at = offset_in_slab(p->grad, grads_), n = p->grad.numel();
            KILN_CHECK(at >= 0 && at + n <= grads_.numel() && offset_in_slab(p->value, values_) == at, "ZeRO-1: ",
                       p->name, " is not in the model's slabs (is it the model's parameter, and the model packed?)");
            const int64_t a = std::max(at, lo), b = std::min(at + n, hi);
            if (a >= b) {
                inner_of_.push_back(-1);
                continue;
            }
            Parameter& shard = shards_.emplace_back();
            shard.name = p->name;
            shard.value = range_of(values_, a, b - a);
            shard.grad = range_of(grads_, a, b - a);
            inner_of_.push_back(int(mine_.size()));
            mine_.push_back({p, inner_of_.size() - 1, a - at, &shard});
            inner.params.push_back(&shard);
        }
        if (inner.params.empty()) continue;
        inner_groups.push_back(std::move(inner));
        outer_group_.push_back(g);
    }
    inner_ = make(std::move(inner_groups));
}

// This rank's piece of a slab.
Tensor ZeroOptimizer::piece_of(const Tensor& slab) const {
    const int r = comm_.rank();
    return range_of(slab, pieces_[size_t(r)], pieces_[size_t(r) + 1] - pieces_[size_t(r)]);
}

void ZeroOptimizer::sum_gradients() { comm_.reduce_scatter(grads_, pieces_); }  // this rank's piece := Σ_ranks

void ZeroOptimizer::reduce_gradients() {
    sum_gradients();
    Tensor mine = gradient_piece();
    scale_(mine, 1.0f / float(comm_.size()));  // the mean over ranks
}

float ZeroOptimizer::clip_gradients(const std::vector<Parameter*>& params, float max_norm) {
    KILN_CHECK(params == model_.parameters(), "ZeRO clips the model's whole gradient: pass model.parameters() ",
               "(", params.size(), " parameters given, the model has ", model_.parameters().size(), ")");
    reduce_gradients();
    reduced_ = true;
    const double squares = comm_.sum(sum_squares(gradient_piece()));  // Σ over every rank's piece
    return clip_to_norm({gradient_piece()}, squares, max_norm);
}

void ZeroOptimizer::step() {
    if (!reduced_) reduce_gradients();  // 1. (done already if clip_gradients ran)
    reduced_ = false;
    auto& inner = inner_->param_groups();  // 2. the schedule's lr, then the update
    for (size_t g = 0; g < inner.size(); g++) {
        inner[g].lr = groups_[outer_group_[g]].lr;
        inner[g].weight_decay = groups_[outer_group_[g]].weight_decay;
    }
    inner_->step();
    steps_++;
    gather_parameters();  // 3. every piece to every rank
    broadcast_buffers(model_, comm_);
}

std::vector<int64_t> ZeroOptimizer::state_elements(Module& model) const {
    return zero_state_elements(model, comm_.rank(), comm_.size());
}

std::vector<int64_t> zero_state_elements(Module& model, int rank, int world) {
    KILN_CHECK(world >= 1 && rank >= 0 && rank < world, model.name(), ": ZeRO-1's pieces of rank ", rank, " of ",
               world, " need 0 <= rank < world");
    const Tensor values = flat(model.values_view());  // laid out as the gradient slab
    const std::vector<int64_t> pieces = even_pieces(values.numel(), world, kPieceAlign);
    const int64_t lo = pieces[size_t(rank)], hi = pieces[size_t(rank) + 1];
    std::vector<int64_t> elements;
    for (Parameter* p : model.parameters()) {
        const int64_t at = offset_in_slab(p->value, values), n = p->value.numel();
        elements.push_back(std::max<int64_t>(0, std::min(at + n, hi) - std::max(at, lo)));
    }
    return elements;
}

std::vector<Tensor> ZeroOptimizer::state_of(size_t i) const {
    return i < inner_of_.size() && inner_of_[i] >= 0 ? inner_->state_of(size_t(inner_of_[i])) : std::vector<Tensor>{};
}

// Each rank writes its pieces of a parameter's state into a zero tensor of the parameter's
// shape; the all-reduce's sum is then the whole state (x + 0 = x exactly).
void ZeroOptimizer::save_state(StateDict& state, const std::string& prefix) const {
    Optimizer::save_state(state, prefix);
    StateDict pieces;
    inner_->save_state(pieces, prefix);
    std::vector<std::string> kinds;  // "momentum_buffer", or "exp_avg", "exp_avg_sq": the same on every rank
    const std::string head = prefix + "." + mine_.front().shard->name + ".";
    for (auto& [key, t] : pieces.tensors)
        if (key.compare(0, head.size(), head) == 0) kinds.push_back(key.substr(head.size()));
    size_t i = 0;
    for (const ParamGroup& group : groups_)
        for (const Parameter* p : group.params) {
            for (const std::string& kind : kinds) {
                const std::string key = prefix + "." + p->name + "." + kind;
                Tensor whole = Tensor::zeros(p->value.shape(), DType::F32, p->value.device(), Category::OptimizerState);
                if (inner_of_[i] >= 0) {
                    const Piece& piece = mine_[size_t(inner_of_[i])];
                    range_of(flat(whole), piece.offset, piece.shard->value.numel()).copy_from(pieces.tensors.at(key));
                }
                comm_.all_reduce(flat(whole));
                state.put(key, whole);
            }
            i++;
        }
}

// Every rank reads the whole state and keeps its pieces.
void ZeroOptimizer::load_state(const StateDict& state, const std::string& prefix) {
    Optimizer::load_state(state, prefix);
    StateDict pieces;
    pieces.values = state.values;
    for (size_t g = 0; g < outer_group_.size(); g++)
        pieces.set(prefix + ".group" + std::to_string(g) + ".lr", double(groups_[outer_group_[g]].lr));
    for (const Piece& piece : mine_) {
        const Parameter& shard = *piece.shard;
        const std::string head = prefix + "." + shard.name + ".";
        for (auto it = state.tensors.lower_bound(head); it != state.tensors.end() && it->first.compare(0, head.size(), head) == 0; ++it) {
            const Tensor& whole = it->second;
            KILN_CHECK(whole.numel() >= piece.offset + shard.value.numel(), it->first, ": ", whole.numel(),
                       " elements in the checkpoint, but the parameter ", shard.name, " has more: a checkpoint of another model");
            pieces.tensors[it->first] = range_of(flat(whole), piece.offset, shard.value.numel());
        }
    }
    inner_->load_state(pieces, prefix);
}

// Each rank its own pieces as they are: the parameters' and the inner optimizer's state (under "<prefix>.shard").
void ZeroOptimizer::save_shard(StateDict& state, const std::string& prefix) const {
    Optimizer::save_state(state, prefix);
    state.set(prefix + ".shard.rank", int64_t(comm_.rank()));
    state.set(prefix + ".shard.world", int64_t(comm_.size()));
    state.put(prefix + ".shard.values", values_piece());
    inner_->save_state(state, prefix + ".shard");
}

void ZeroOptimizer::load_shard(const StateDict& state, const std::string& prefix) {
    const int64_t rank = state.get_int(prefix + ".shard.rank"), world = state.get_int(prefix + ".shard.world");
    KILN_CHECK(rank == comm_.rank() && world == comm_.size(), "ZeRO: this is rank ", rank, " of ", world,
               "'s shard, read by rank ", comm_.rank(), " of ", comm_.size(),
               ": each rank reads its own file, and the world must be the one that saved them");
    Optimizer::load_state(state, prefix);
    Tensor values = values_piece();
    state.get_into(prefix + ".shard.values", values);
    inner_->load_state(state, prefix + ".shard");
    gather_parameters();
}

std::string zero_memory_table(int64_t parameters, int state_slabs, const std::vector<int>& ranks) {
    KILN_CHECK(parameters >= 0 && state_slabs >= 0, "zero_memory_table: ", parameters, " parameters, ", state_slabs,
               " state slabs: want both ≥ 0");
    const int64_t P = 4 * parameters, state = P * state_slabs;
    std::string out = "memory per rank (f32, before activations): parameters " + format_bytes(P) + ", gradients " +
                      format_bytes(P) + ", optimizer state " + std::to_string(state_slabs) + " × parameters\n";
    char line[160];
    std::snprintf(line, sizeof line, "  %6s  %14s  %14s  %14s  %14s\n", "ranks", "state ZeRO-0", "state ZeRO-1",
                  "total ZeRO-0", "total ZeRO-1");
    out += line;
    for (int p : ranks) {
        KILN_CHECK(p >= 1, "zero_memory_table: a world of ", p, " ranks");
        const int64_t sharded = (state + p - 1) / p;
        std::snprintf(line, sizeof line, "  %6d  %14s  %14s  %14s  %14s\n", p, format_bytes(state).c_str(),
                      format_bytes(sharded).c_str(), format_bytes(2 * P + state).c_str(),
                      format_bytes(2 * P + sharded).c_str());
        out += line;
    }
    return out;
}

}  // namespace kiln
