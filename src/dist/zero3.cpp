// zero3.cpp — ZeRO-3: each unit's parameters all-gathered while it runs, let go after (zero3.h).
#include "dist/zero3.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "core/allocator.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "nn/gpt.h"
#include "train/gpt_recipe.h"

namespace kiln {

namespace {

// Elements [at, at + n) of a 1-D f32 tensor.
Tensor floats(const Tensor& t, int64_t at, int64_t n) { return t.view(size_t(at) * sizeof(float), {n}); }

// Which unit each of the model's parameters belongs to (−1: the root), in parameter order.
std::vector<int> unit_of_params(Module& model, const std::vector<Module*>& units) {
    std::vector<int> unit_of;
    for (Parameter* p : model.parameters()) {
        int u = -1;
        for (size_t k = 0; k < units.size() && u < 0; k++) {
            const auto own = units[k]->parameters();
            if (std::find(own.begin(), own.end(), p) != own.end()) u = int(k);
        }
        unit_of.push_back(u);
    }
    return unit_of;
}

// ZeRO-2's options for ZeRO-3: one bucket per unit, and one per run of root parameters.
Zero2Options unit_buckets(Module& model, const Zero3Options& o) {
    KILN_CHECK(!o.units.empty(), model.name(), ": ZeRO-3 needs units, the layers gathered one at a time (gpt_zero3_options)");
    const std::vector<int> unit_of = unit_of_params(model, o.units);
    Zero2Options z;
    z.bucket_bytes = int64_t(1) << 60;  // no cut by size: a unit's gradients are reduced together
    z.written_early = o.written_early;
    for (size_t i = 0; i < unit_of.size(); i++) z.starts_unit.push_back(i == 0 || unit_of[i] != unit_of[i - 1]);
    return z;
}

}  // namespace

Zero3Options gpt_zero3_options(GPT& model) {
    Zero3Options o;
    Sequential& blocks = model.transformer().h();
    for (const Module::Child& c : blocks.children()) o.units.push_back(c.module.get());
    o.written_early = {&model.transformer().wte().weight};
    return o;
}

Zero2Options gpt_zero2_options(GPT& model, int64_t bucket_bytes) {
    Zero2Options o;
    o.bucket_bytes = bucket_bytes;
    o.written_early = {&model.transformer().wte().weight};
    return o;
}

std::unique_ptr<ZeroOptimizer> gpt_zero_optimizer(GPT& model, const GPTRecipe& recipe, int stage, Communicator& comm) {
    std::vector<ParamGroup> groups = decay_groups(model, recipe.lr, recipe.weight_decay);
    if (stage == 1) return std::make_unique<ZeroOptimizer>(model, std::move(groups), comm, gpt_adamw);
    if (stage == 2) return std::make_unique<Zero2Optimizer>(model, std::move(groups), comm, gpt_adamw, gpt_zero2_options(model));
    KILN_CHECK(stage == 3, "gpt_zero_optimizer: ZeRO stage ", stage, ": want 1, 2 or 3 (stage 0 is DataParallel)");
    return std::make_unique<Zero3Optimizer>(model, std::move(groups), comm, gpt_adamw, gpt_zero3_options(model));
}

Zero3Optimizer::Zero3Optimizer(Module& model, std::vector<ParamGroup> groups, Communicator& comm, const Factory& make,
                               Zero3Options options)
    : Zero2Optimizer(model, std::move(groups), comm, make, unit_buckets(model, options)) {
    const Device device = values_.device();
    const int64_t lo = pieces_[size_t(comm.rank())], hi = pieces_[size_t(comm.rank()) + 1];
    slab_elements_ = values_.numel();

    // The units' slab ranges: each unit's parameters must lie together in the slab.
    const std::vector<int> unit_of = unit_of_params(model, options.units);
    units_.resize(options.units.size());
    for (size_t i = 0; i < params_.size(); i++) {
        shapes_.push_back(params_[i]->value.shape());
        if (unit_of[i] < 0) {
            root_.push_back(i);
            continue;
        }
        Unit& u = units_[size_t(unit_of[i])];
        KILN_CHECK(u.params.empty() || u.params.back() == i - 1, "ZeRO-3: the unit ", options.units[size_t(unit_of[i])]->name(),
                   "'s parameters are not together in the model's parameter order (", params_[i]->name, ")");
        if (u.params.empty()) u.begin = at_[i];
        u.params.push_back(i);
        u.end = at_[i] + params_[i]->value.numel();
    }
    for (size_t k = 0; k < units_.size(); k++)
        KILN_CHECK(!units_[k].params.empty(), "ZeRO-3: the unit ", options.units[k]->name(), " has no parameters");

    // This rank's piece of the values; the root's parameters in their own tensors. The gradient
    // slab ZeRO-2 let go goes back to the system first: the pool would hand its block, up to twice
    // the size asked for (PoolAllocator::take_cached), to the piece.
    pool_allocator(device).empty_cache();
    values_piece_ = floats(values_, lo, hi - lo).clone();
    for (Piece& piece : mine_)
        piece.shard->value = floats(values_piece_, offset_in_slab(piece.shard->value, values_) - lo, piece.shard->value.numel());
    std::vector<Tensor> root_values;
    for (size_t i : root_) {
        root_values.push_back(Tensor::empty(shapes_[i], DType::F32, device, Category::Parameter));
        root_values.back().copy_from(params_[i]->value);
    }
    values_ = Tensor();
    model.drop_value_slab();
    for (size_t k = 0; k < root_.size(); k++) params_[root_[k]]->value = root_values[k];

    for (size_t k = 0; k < units_.size(); k++) {
        Module& m = *options.units[k];
        unit_hooks_.push_back(m.register_forward_pre_hook([this, k](Module&, const Tensor&) { gather(units_[k]); }));
        unit_hooks_.push_back(m.register_forward_hook([this, k](Module&, const Tensor&, Tensor&) { release(units_[k]); }));
        unit_hooks_.push_back(m.register_backward_pre_hook([this, k](Module&, const Tensor&) { gather(units_[k]); }));
        unit_hooks_.push_back(m.register_backward_hook([this, k](Module&, const Tensor&, Tensor&) { release(units_[k]); }));
    }
}

Zero3Optimizer::~Zero3Optimizer() {
    for (HookHandle& h : unit_hooks_) h.remove();
}

// Each rank copies its own part in; the all-gather brings the others' (every slab element,
// padding included, is in some rank's piece).
void Zero3Optimizer::gather_into(Tensor buffer, int64_t begin) const {
    const int r = comm_.rank();
    const int64_t end = begin + buffer.numel();
    std::vector<int64_t> offsets;
    for (int64_t at : pieces_) offsets.push_back(std::clamp(at, begin, end) - begin);
    const int64_t first = offsets[size_t(r)], n = offsets[size_t(r) + 1] - first;
    if (n > 0) floats(buffer, first, n).copy_from(floats(values_piece_, begin + first - pieces_[size_t(r)], n));
    comm_.all_gather(buffer, offsets);
}

// From the pool, not a step's arena: the buffer goes back before the step ends.
void Zero3Optimizer::gather(Unit& u) {
    AllocatorScope pool(pool_allocator(values_piece_.device()));
    u.buffer = Tensor::empty({u.end - u.begin}, DType::F32, values_piece_.device(), Category::Parameter);
    gather_into(u.buffer, u.begin);
    for (size_t i : u.params) params_[i]->value = u.buffer.view(size_t(at_[i] - u.begin) * sizeof(float), shapes_[i]);
}

void Zero3Optimizer::release(Unit& u) {
    for (size_t i : u.params) params_[i]->value = Tensor();
    u.buffer = Tensor();
}

void Zero3Optimizer::gather_parameters() {
    for (size_t i : root_) gather_into(params_[i]->value.view(0, {params_[i]->value.numel()}), at_[i]);
}

void Zero3Optimizer::step() {
    KILN_CHECK(!whole_.defined(), "ZeRO-3: a step after gather_model(), which ends training (its hooks are gone)");
    Zero2Optimizer::step();
}

void Zero3Optimizer::gather_model() {
    whole_ = gathered_values();
    for (size_t i = 0; i < params_.size(); i++) params_[i]->value = whole_.view(size_t(at_[i]) * sizeof(float), shapes_[i]);
    for (HookHandle& h : unit_hooks_) h.remove();
    unit_hooks_.clear();
}

Tensor Zero3Optimizer::gathered_values() {
    Tensor all = Tensor::zeros({slab_elements_}, DType::F32, values_piece_.device(), Category::Parameter);
    gather_into(all, 0);
    return all;
}

void Zero3Optimizer::save_state(StateDict&, const std::string&) const {
    KILN_FAIL("ZeRO-3 keeps no whole parameter, so it saves no gathered optimizer state: use save_shard, one file a rank");
}

std::vector<int64_t> Zero3Optimizer::state_elements(Module&) const {
    const int64_t lo = pieces_[size_t(comm_.rank())], hi = pieces_[size_t(comm_.rank()) + 1];
    std::vector<int64_t> elements;
    for (size_t i = 0; i < params_.size(); i++)
        elements.push_back(std::max<int64_t>(0, std::min(at_[i] + shapes_[i].numel(), hi) - std::max(at_[i], lo)));
    return elements;
}

// ---- sharded GPT checkpoints ------------------------------------------------------------------
std::string gpt_shard_path(const std::string& path, int rank, int world) {
    const std::filesystem::path p(path);
    const std::string name = p.stem().string() + ".rank" + std::to_string(rank) + "-of-" + std::to_string(world) +
                             p.extension().string();
    return (p.parent_path() / name).string();
}

void save_gpt_shard(const std::string& save_dir, GPT& model, ZeroOptimizer& optimizer, const CharTokenizer& vocabulary,
                    const GPTProgress& at, int rank, int world) {
    StateDict state;
    state.share_cpu_tensors = true;  // written before anything changes
    record_gpt_run(state, model, vocabulary, at.seed);
    state.set("train.step", at.step);
    optimizer.save_shard(state, "optimizer");
    std::error_code error;
    std::filesystem::create_directories(save_dir, error);
    KILN_CHECK(!error, "--save ", save_dir, ": cannot create the folder (", error.message(), ")");
    if (rank == 0) vocabulary.save(save_dir + "/vocab.json");
    const std::string last = gpt_shard_path(save_dir + "/last.safetensors", rank, world);
    write_safetensors(last, state, gpt_shard_path(save_dir + "/prev.safetensors", rank, world));
    if (rank == 0) std::printf("saved %s (one file a rank, %d ranks)\n", last.c_str(), world);
}

namespace {

// The world of a sharded checkpoint beside `path` (its rank 0's file "<stem>.rank0-of-<p>..."),
// 0 when there is none.
int shard_world_beside(const std::string& path) {
    const std::filesystem::path p(path);
    const std::string head = p.stem().string() + ".rank0-of-";
    std::error_code error;
    const std::filesystem::path dir = p.parent_path().empty() ? "." : p.parent_path();
    for (std::filesystem::directory_iterator it(dir, error), end; !error && it != end; it.increment(error)) {
        const std::string name = it->path().filename().string();
        if (name.compare(0, head.size(), head) == 0) return std::atoi(name.c_str() + head.size());
    }
    return 0;
}

}  // namespace

GPTProgress resume_gpt_shard(const std::string& path, GPT& model, ZeroOptimizer& optimizer, const CharTokenizer& corpus,
                             int rank, int world) {
    const std::string mine = gpt_shard_path(path, rank, world);
    if (!std::filesystem::exists(mine)) {
        const int saved = shard_world_beside(path);
        KILN_CHECK(saved == 0, "--resume ", path, " with --zero 3 on ", world, " rank(s): rank ", rank, " reads ", mine,
                   ", which does not exist; the folder holds a checkpoint of ", saved, " ranks (",
                   gpt_shard_path(path, 0, saved), "): resume with mpirun -np ", saved);
        KILN_FAIL("--resume ", path, " with --zero 3: rank ", rank, " reads its shard ", mine, ", which does not exist ",
                  "(--zero 3 --save writes one file a rank; a whole checkpoint resumes with --zero 0, 1 or 2)");
    }
    const StateDict state = read_safetensors(mine);
    const uint64_t seed = resume_gpt_run(mine, state, model, corpus);
    optimizer.load_shard(state, "optimizer");
    return GPTProgress{state.get_int("train.step", 0, INT64_MAX), seed};
}

}  // namespace kiln
