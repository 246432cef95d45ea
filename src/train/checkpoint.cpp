// checkpoint.cpp — the model and run state around a safetensors file (io/safetensors.h).
#include "train/checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <set>

#include "core/error.h"
#include "io/archive.h"
#include "nn/prune.h"  // is_mask_name: a pruned model's checkpoint

namespace kiln {

namespace {

// ---- the run ----------------------------------------------------------------------------------
// The prefixes of a checkpoint's non-model state (load_model leaves them alone).
const char* const kRunPrefixes[] = {"optimizer.", "scheduler.", "plateau.", "lookahead.", "train."};

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// The tensors a model saves and loads, by their names in its tree (PyTorch's state_dict keys).
std::vector<std::pair<std::string, Tensor*>> model_tensors(Module& model) {
    std::vector<std::pair<std::string, Tensor*>> all;
    for (auto& [name, p] : model.named_parameters()) all.emplace_back(name, &p->value);
    for (auto& b : model.named_buffers()) all.push_back(b);
    return all;
}

// The schedule record as saved: "train.schedule.epochs" and "train.schedule.epoch_start_lrs",
// the lrs as text ("%.9g": a float reads back exactly), separated by commas.
const char* const kScheduleEpochs = "train.schedule.epochs";
const char* const kScheduleLrs = "train.schedule.epoch_start_lrs";
// The number of data parallel ranks that shared each epoch, saved only when it is above 1.
const char* const kWorldSize = "train.loader.world_size";
// The training loader's seed: resuming takes it, so that the data order goes on as it was.
const char* const kLoaderSeed = "train.loader.seed";

std::vector<std::string> lr_texts(const std::vector<float>& lrs) {
    std::vector<std::string> texts;
    for (float lr : lrs) {
        char text[32];
        std::snprintf(text, sizeof text, "%.9g", double(lr));
        texts.push_back(text);
    }
    return texts;
}

std::string join(const std::vector<std::string>& parts) {
    std::string s;
    for (const std::string& p : parts) s += (s.empty() ? "" : ",") + p;
    return s;
}

std::vector<std::string> split(const std::string& s) {
    std::vector<std::string> parts;
    size_t begin = 0;
    for (size_t comma; (comma = s.find(',', begin)) != std::string::npos; begin = comma + 1)
        parts.push_back(s.substr(begin, comma - begin));
    parts.push_back(s.substr(begin));
    return parts;
}

// Refuses a resume whose schedule is not the one the checkpoint was trained with, naming the
// first difference: the number of epochs (--epochs), then the lr at an epoch's start (--lr and
// the schedule's flags).
void check_schedule(const StateDict& s, const ScheduleRecord& run) {
    const int64_t epochs = s.get_int(kScheduleEpochs, 1, INT32_MAX);
    KILN_CHECK(epochs == run.epochs, "the checkpoint's run was laid out over ", epochs, " epochs; this one over ",
               run.epochs, ". Resume with the same --epochs (the learning-rate schedule depends on it)");
    const std::vector<std::string> saved = split(s.get_string(kScheduleLrs)), now = lr_texts(run.epoch_start_lrs);
    KILN_CHECK(saved.size() == now.size(), "\"", kScheduleLrs, "\" holds ", saved.size(), " lrs for ", epochs,
               " epochs (the checkpoint is corrupt?)");
    for (size_t e = 0; e < saved.size(); e++)
        KILN_CHECK(saved[e] == now[e], "the checkpoint's schedule starts epoch ", e + 1, " at lr ",
                   std::strtof(saved[e].c_str(), nullptr), "; this run's at lr ", run.epoch_start_lrs[e],
                   ". Resume with the same --lr and schedule flags");
}

}  // namespace

ScheduleRecord record_schedule(const Optimizer& optimizer, const LRScheduler* scheduler, int64_t epochs,
                               int64_t steps_per_epoch) {
    // A scheduler schedules each group from its initial_lr, rounding to the f32 lr as it sets it.
    const ParamGroup& group = optimizer.param_groups().front();
    ScheduleRecord record{epochs, {}};
    for (int64_t e = 0; e < epochs; e++)
        record.epoch_start_lrs.push_back(scheduler ? float(scheduler->lr_at(e * steps_per_epoch, group.initial_lr))
                                                   : group.lr);
    return record;
}

void save_model(StateDict& state, Module& model) {
    for (auto& [name, t] : model_tensors(model)) {
        KILN_CHECK(!state.tensors.count(name), "save_model: two of the model's tensors are named \"", name,
                   "\"; give the layers distinct names");
        state.put(name, *t);
    }
}

void load_model(const StateDict& state, Module& model) {
    const std::vector<std::pair<std::string, Tensor*>> tensors = model_tensors(model);
    std::set<std::string> names;
    for (auto& [name, t] : tensors) names.insert(name);
    for (const auto& [name, t] : state.tensors)
        KILN_CHECK(names.count(name) || !prune::is_mask_name(name),
                   "load_model: the checkpoint holds a pruned model (it has \"", name, "\") and this model is not "
                   "pruned there: call prune::prune_like(state, model) first (nn/prune.h) to prune it the same way");
    for (auto& [name, t] : tensors) state.get_into(name, *t);
    for (const auto& entry : state.tensors) {
        const std::string& name = entry.first;  // a plain reference: C++17 lambdas cannot capture a structured binding
        bool run_state = std::any_of(std::begin(kRunPrefixes), std::end(kRunPrefixes),
                                     [&name](const char* prefix) { return starts_with(name, prefix); });
        KILN_CHECK(run_state || names.count(name), "load_model: the checkpoint has a tensor \"", name, "\" (",
                   entry.second.desc(), ") that the model does not (a checkpoint of another model?)");
    }
}

void save_checkpoint(const std::string& path, TrainingRun& run, const ResumePoint& at) {
    write_safetensors(path, checkpoint_state(run, at));
}

void save_streams(StateDict& state, const std::vector<std::pair<std::string, Rng*>>& rngs) {
    for (const auto& [name, rng] : rngs) {
        state.set_u64("train.rng." + name + ".seed", rng->seed_hash());
        state.set_u64("train.rng." + name + ".counter", rng->counter());
    }
}

void load_streams(const StateDict& state, const std::vector<std::pair<std::string, Rng*>>& rngs) {
    for (const auto& [name, rng] : rngs) {
        const uint64_t seed = state.get_u64("train.rng." + name + ".seed");
        rng->set_state(seed, state.get_u64("train.rng." + name + ".counter"));
    }
}

StateDict checkpoint_state(TrainingRun& run, const ResumePoint& at) {
    // Written out before anything changes, so CPU tensors are shared, not copied; a model on a
    // GPU is copied to host memory, never to device memory.
    StateDict s;
    s.share_cpu_tensors = true;
    run.optimizer.synchronize();  // the last step's weights are all in place (an offloaded step may still run)
    save_model(s, run.model);
    run.optimizer.save_state(s, "optimizer");
    if (run.scheduler) run.scheduler->save_state(s, "scheduler");
    if (run.plateau) run.plateau->save_state(s, "plateau");
    if (run.scaler) run.scaler->save_state(s, "scaler");
    if (run.lookahead) run.lookahead->save_state(s, "lookahead");
    s.set("train.epoch", at.epoch);
    s.set("train.position", at.position);
    s.set("train.step", at.step);
    if (run.loader) {
        s.set("train.loader.images", run.loader->set().n);
        s.set("train.loader.batches", run.loader->num_batches());
        s.set_u64(kLoaderSeed, run.loader->options().seed);  // the data order and augmentations
        // a share of each epoch per rank (chapter 12): only when there are several
        if (run.loader->options().world_size > 1) s.set(kWorldSize, int64_t(run.loader->options().world_size));
    }
    save_streams(s, run.rngs);
    if (run.schedule.epochs > 0) {
        s.set(kScheduleEpochs, run.schedule.epochs);
        s.set(kScheduleLrs, join(lr_texts(run.schedule.epoch_start_lrs)));
    }
    return s;
}

namespace {

// Where the run stopped, every value checked against what this run can mean by it: an epoch of
// the schedule (of at most INT32_MAX without one: the trainers count epochs in an int), a
// position inside the loader's epoch, a count of steps. (Steps are not bounded by the epochs:
// an optimizer may have stepped before, as chapter 10's fine-tuning rounds reuse the dense
// training's.)
ResumePoint resume_point(const StateDict& s, const TrainingRun& run) {
    ResumePoint at;
    at.epoch = s.get_int("train.epoch", 0, run.schedule.epochs > 0 ? run.schedule.epochs : INT32_MAX);
    at.position = s.get_int("train.position", 0, run.loader ? run.loader->size() : INT64_MAX);
    at.step = s.get_int("train.step", 0, INT64_MAX);
    return at;
}

// The loader's set and shares must be this run's; then it takes the checkpoint's seed and goes
// to where the run stopped.
void restore_loader(const StateDict& s, DataLoader& loader, const ResumePoint& at) {
    KILN_CHECK(s.get_int("train.loader.images") == loader.set().n &&
                   s.get_int("train.loader.batches") == loader.num_batches(),
               "the checkpoint was trained on ", s.get_string("train.loader.images"), " images in ",
               s.get_string("train.loader.batches"), " batches an epoch; this run has ", loader.set().n, " in ",
               loader.num_batches(), ". Resume with the same --limit and --batch-size");
    const int64_t ranks = s.has(kWorldSize) ? s.get_int(kWorldSize) : 1;
    KILN_CHECK(ranks == loader.options().world_size, "the checkpoint was written by a run of ", ranks,
               " data parallel rank(s); this run has ", loader.options().world_size, ". Resume with mpirun -np ",
               ranks, ": each rank's share of the data depends on it");
    if (s.has(kLoaderSeed)) loader.reseed(s.get_u64(kLoaderSeed));  // (older checkpoints: the flag's)
    loader.start_epoch(at.epoch);
    loader.seek(at.position);
}

}  // namespace

ResumePoint load_checkpoint(const std::string& path, TrainingRun& run) {
    const StateDict s = read_safetensors(path);
    // StateDict's errors name the tensor or value; these add the file.
    return with_hint((" (in checkpoint '" + path + "')").c_str(), [&] {
        load_model(s, run.model);
        if (run.schedule.epochs > 0) check_schedule(s, run.schedule);
        run.optimizer.load_state(s, "optimizer");
        if (run.scheduler) run.scheduler->load_state(s, "scheduler");
        if (run.plateau) run.plateau->load_state(s, "plateau");
        if (run.scaler) run.scaler->load_state(s, "scaler");  // refuses a checkpoint without its state
        if (run.lookahead) run.lookahead->load_state(s, "lookahead");
        KILN_CHECK((run.scaler && run.scaler->enabled()) || !s.has("scaler.scale"), "the checkpoint was trained with loss scaling (a ",
                   "GradScaler, --amp f16) and this run has none. Resume with the --amp it was trained with");
        const ResumePoint at = resume_point(s, run);
        if (run.loader) restore_loader(s, *run.loader, at);
        load_streams(s, run.rngs);
        return at;
    });
}

}  // namespace kiln
