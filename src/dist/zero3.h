// zero3.h — ZeRO stage 3 (Rajbhandari et al., 2020; PyTorch's FSDP): the parameters sharded too.
//
// ZeRO-2 (zero2.h) still keeps every parameter on every rank. ZeRO-3 keeps only this rank's piece
// of the parameter slab, and gathers a layer's whole weights just while it runs:
//
//   before a unit's forward      all-gather its parameters into a buffer; its weights are views in it
//   after its forward            let the buffer go (the weights are undefined again)
//   before its backward          all-gather them again
//   after its backward           let them go; its gradients were reduce-scattered as in ZeRO-2 (a
//                                unit is one bucket)
//   step()                       the piece ÷ p, the update of this rank's piece — nothing to gather
//
//   memory per rank:   parameters 4·P / p   gradients 4·P / p   optimizer state 4·k·P / p
//                      + one unit's gathered parameters (two around a unit's forward) and its gradients
//
// The units are layers given by the caller (the GPT's blocks: gpt_units). Parameters in no unit
// (the GPT's embeddings, whose token embedding lm_head also reads, and the final layer norm) are
// the root: kept gathered on every rank, all-gathered after each step as in ZeRO-1 — 4·(V + T + 2)·C
// bytes for the GPT. There is no prefetch (FSDP gathers the next unit while this one computes): the
// MPI communicator's collectives are blocking, so communication is not overlapped here.
//
// The same bits as plain data parallel: the gathered weights are the same floats, the gradients
// the same sums, the update the same. Anything that reads a unit's weights outside its forward
// and backward (a checkpoint of the model, an evaluation without the hooks) sees undefined
// tensors: checkpoints are sharded (ZeroOptimizer::save_shard: each rank writes its own piece).
#pragma once
#include <cstdint>
#include <vector>

#include "dist/zero2.h"
#include "train/gpt_recipe.h"

namespace kiln {

struct Zero3Options {
    std::vector<Module*> units;                    // each gathered only while it runs (the GPT's blocks)
    std::vector<const Parameter*> written_early;  // tied weights, as for ZeRO-2
};

// The GPT's blocks as units, its tied token embedding written early.
Zero3Options gpt_zero3_options(GPT& model);
// ZeRO-2 for the GPT: buckets of bucket_bytes (the baby GPT's slab is 3.3 MB: DDP's 25 MiB would
// make one bucket, the whole gradient at once), its tied token embedding written early.
Zero2Options gpt_zero2_options(GPT& model, int64_t bucket_bytes = 256 << 10);

class Zero3Optimizer : public Zero2Optimizer {
public:
    // The model must be packed; both its slabs are dropped (this rank's pieces are kept here).
    Zero3Optimizer(Module& model, std::vector<ParamGroup> groups, Communicator& comm, const Factory& make,
                   Zero3Options options);
    ~Zero3Optimizer() override;  // takes its hooks off the model
    Zero3Optimizer(const Zero3Optimizer&) = delete;
    Zero3Optimizer& operator=(const Zero3Optimizer&) = delete;

    void step() override;  // refused after gather_model()
    // The whole parameter slab, gathered from every rank's piece (a collective): for tests and
    // for writing a whole model. Laid out as Module::values_view was.
    Tensor gathered_values();
    // The end of training (a collective): every parameter whole on every rank, a view into the
    // gathered slab, and the units' hooks taken off — so that anything may read the model
    // (evaluation, sampling: forward_cached runs a block's layers without the block's hooks).
    // No step() after it.
    void gather_model();
    // The gathered state (ZeroOptimizer::save_state) is refused: it would need every unit's
    // weights at once. save_shard instead.
    void save_state(StateDict& state, const std::string& prefix) const override;
    std::vector<int64_t> state_elements(Module& model) const override;

protected:
    void gather_parameters() override;  // after a step: the root's parameters only
    Tensor values_piece() const override { return values_piece_; }

private:
    struct Unit {
        int64_t begin = 0, end = 0;    // its slab range
        std::vector<size_t> params;    // its parameters (indices into params_)
        Tensor buffer;                 // its gathered parameters while it runs
    };
    std::vector<Unit> units_;
    std::vector<size_t> root_;         // parameters in no unit: kept gathered
    std::vector<Shape> shapes_;        // per parameter
    int64_t slab_elements_ = 0;
    Tensor values_piece_;              // this rank's piece of the parameter slab
    Tensor whole_;                     // after gather_model(): the gathered slab
    std::vector<HookHandle> unit_hooks_;

    void gather(Unit& u);
    void release(Unit& u);
    // buffer := slab elements [begin, begin + buffer.numel()) from every rank's piece.
    void gather_into(Tensor buffer, int64_t begin) const;
};

// The recipe's AdamW (gpt_adamw) over decay_groups, sharded by ZeRO stage 1, 2 or 3 over comm's ranks,
// with the options above: what lesson-14 --zero and chapter 15's measurements run.
std::unique_ptr<ZeroOptimizer> gpt_zero_optimizer(GPT& model, const GPTRecipe& recipe, int stage, Communicator& comm);

// ---- lesson-14 --zero 3 --save and --resume: a sharded GPT checkpoint, one file a rank ----------
// The file of rank r of p for a checkpoint named `path`: "DIR/last.safetensors" ->
// "DIR/last.rank<r>-of-<p>.safetensors". The world is in the name, so a run of another size finds
// no file of its own and says which world wrote the folder.
std::string gpt_shard_path(const std::string& path, int rank, int world);
// Every rank writes save_dir/last.rank<r>-of-<p>.safetensors (the one before kept as
// prev.rank<r>-of-<p>.safetensors): its shard (ZeroOptimizer::save_shard: its piece of the
// parameter slab and of AdamW's moments, the step count and lrs, its rank and world), the run as
// every lesson-14 checkpoint records it (record_gpt_run: shape, batches' seed, vocabulary, dropout
// streams) and "train.step"; rank 0 also writes save_dir/vocab.json. Nothing is gathered.
void save_gpt_shard(const std::string& save_dir, GPT& model, ZeroOptimizer& optimizer, const CharTokenizer& vocabulary,
                    const GPTProgress& at, int rank, int world);
// --resume PATH under --zero 3: rank r of p reads gpt_shard_path(PATH, r, p) into a freshly built
// model and optimizer (a collective: load_shard gathers the root's parameters). A missing file is
// refused naming it and, when the folder holds rank 0's file of another world, that world ("resume
// with mpirun -np N"); the run's record is checked as resume_gpt checks it.
GPTProgress resume_gpt_shard(const std::string& path, GPT& model, ZeroOptimizer& optimizer, const CharTokenizer& corpus,
                             int rank, int world);

}  // namespace kiln
