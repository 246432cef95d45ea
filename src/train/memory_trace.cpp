// memory_trace.cpp — the allocation recorder, the per-module report of a step, and the trainers'
// side of --mem-report and --mem-trace (see memory_trace.h); the trace's files, its JSON and its
// timeline, are memory_timeline.cpp's.
#include "train/memory_trace.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <numeric>
#include <sstream>

#include "core/error.h"
#include "train/memory_model.h"

namespace kiln {

// ---- recording -----------------------------------------------------------------------------
std::pair<size_t, size_t> MemoryTrace::step_events(int s) const {
    KILN_CHECK(s >= 0 && s < steps(), "memory trace: step ", s, " was not recorded (", steps(), " steps ended)");
    return {s == 0 ? 0 : step_ends[size_t(s - 1)], step_ends[size_t(s)]};
}

MemoryRecorder::MemoryRecorder(Module& model) : start_(std::chrono::steady_clock::now()) {
    for (Device d : {Device::CPU, Device::CUDA}) trace_.in_use_at_start[int(d)] = device_memory_stats(d).requested;
    hook_ = model.register_forward_hook([this](Module&, const Tensor&, Tensor& y) { forward_ended(y); });
    set_allocation_observer([this](const AllocationEvent& e) { record(e); });
}

MemoryRecorder::~MemoryRecorder() { stop(); }

void MemoryRecorder::stop() {
    if (!hook_) return;
    set_allocation_observer(nullptr);
    hook_->remove();
    hook_.reset();
}

void MemoryRecorder::end_step() {
    std::lock_guard<std::mutex> g(mu_);
    trace_.step_ends.push_back(trace_.events.size());
}

MemoryTrace MemoryRecorder::trace() const {
    std::lock_guard<std::mutex> g(mu_);
    return trace_;
}

void MemoryRecorder::record(const AllocationEvent& e) {
    const double t = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start_).count();
    std::lock_guard<std::mutex> g(mu_);
    int64_t id = -1;
    if (!e.freed) {
        id = next_id_++;
        live_ids_[e.ptr] = id;
    } else if (auto it = live_ids_.find(e.ptr); it != live_ids_.end()) {
        id = it->second;
        live_ids_.erase(it);
    }
    const AllocationContext c = current_context();  // the allocating thread's: this runs on it
    trace_.events.push_back(MemoryEvent{t, e.freed ? -e.bytes : e.bytes, e.category, c.phase, e.device,
                                        c.module ? c.module->name() : std::string(),
                                        trace_.steps(), id});
}

// The forward hook of the model: the step's forward is over, `output` is what it returns.
void MemoryRecorder::forward_ended(const Tensor& output) {
    std::lock_guard<std::mutex> g(mu_);
    if (trace_.forward_ends.size() != size_t(trace_.steps())) return;  // not the step's first forward
    const void* storage = static_cast<const char*>(output.raw()) - output.offset();
    auto it = live_ids_.find(storage);
    trace_.forward_ends.push_back({trace_.events.size(), it == live_ids_.end() ? -1 : it->second});
}

// ---- levels and the peak -------------------------------------------------------------------
Levels::Levels(const MemoryTrace& trace, Device d, size_t upto) : device(d), in_use(trace.in_use_at_start[int(d)]) {
    for (size_t i = 0; i < upto; i++) apply(trace.events[i]);
}

bool Levels::apply(const MemoryEvent& e) {
    if (e.device != device) return false;
    in_use[int(e.category)] += e.bytes;
    return true;
}

int64_t Levels::total() const { return std::accumulate(in_use.begin(), in_use.end(), int64_t(0)); }

MemoryPeak find_peak(const MemoryTrace& trace, Device device, size_t first, size_t last) {
    Levels levels(trace, device, first);
    MemoryPeak peak;
    peak.bytes = levels.total();
    peak.by_category = levels.in_use;
    for (size_t i = first; i < last; i++) {
        const MemoryEvent& e = trace.events[i];
        if (!levels.apply(e) || e.freed() || levels.total() <= peak.bytes) continue;
        peak = MemoryPeak{levels.total(), levels.in_use, e.module, e.phase, e.time_us};
    }
    return peak;
}

std::string shown_name(const std::string& module) { return module.empty() ? kOutsideModules : module; }

namespace {

// ---- the report's rows -----------------------------------------------------------------------
// One row per module of the tree, in order, found by full name; any other name (kOutsideModules)
// gets a row appended when first asked for.
class Rows {
public:
    explicit Rows(Module& model) {
        for (auto& [path, m] : model.named_modules()) row(m->name());
    }
    ModuleMemory& row(const std::string& name) {
        const std::string shown = shown_name(name);
        auto [it, added] = index_.emplace(shown, rows_.size());
        if (added) rows_.push_back(ModuleMemory{shown});
        return rows_[it->second];
    }
    std::vector<ModuleMemory> take() { return std::move(rows_); }

private:
    std::vector<ModuleMemory> rows_;
    std::map<std::string, size_t> index_;
};

// Each parameter's owner: the module whose full name its own name extends by one local name
// ("block1a.conv.weight" -> "block1a.conv"; the root's own: the root).
std::map<const Parameter*, std::string> parameter_owners(Module& model) {
    std::map<std::string, std::string> full_name;  // path below the model -> Module::name
    for (auto& [path, m] : model.named_modules()) full_name[path] = m->name();
    std::map<const Parameter*, std::string> owner;
    for (auto& [path, p] : model.named_parameters()) {
        const size_t dot = path.rfind('.');
        owner[p] = full_name[dot == std::string::npos ? "" : path.substr(0, dot)];
    }
    return owner;
}

void add_parameters(Rows& rows, Module& model, const Optimizer& optimizer) {
    const std::map<const Parameter*, std::string> owner = parameter_owners(model);
    for (auto& [p, name] : owner) {
        rows.row(name).parameters += int64_t(p->value.nbytes());
        rows.row(name).gradients += int64_t(p->grad.nbytes());
    }
    size_t i = 0;  // the parameter's index over all groups (Optimizer::state_of)
    for (const ParamGroup& group : optimizer.param_groups())
        for (const Parameter* p : group.params) {
            auto it = owner.find(p);
            ModuleMemory& row = rows.row(it == owner.end() ? "" : it->second);
            for (const Tensor& t : optimizer.state_of(i)) row.optimizer_state += int64_t(t.nbytes());
            i++;
        }
}

// Kept for backward: allocated in the forward phase of step s and still alive when the model's
// forward ended, less the model's output (the loss reads it, no layer keeps it).
void add_kept_activations(Rows& rows, const MemoryTrace& trace, int s, Device device) {
    if (size_t(s) >= trace.forward_ends.size()) return;  // the step had no forward
    const MemoryTrace::ForwardEnd end = trace.forward_ends[size_t(s)];
    std::map<int64_t, const MemoryEvent*> alive;  // id -> its allocation
    for (size_t i = trace.step_events(s).first; i < end.event; i++) {
        const MemoryEvent& e = trace.events[i];
        if (e.device != device) continue;
        if (e.freed()) alive.erase(e.id);
        else if (e.phase == Phase::Forward) alive[e.id] = &e;
    }
    alive.erase(end.output_id);
    for (auto& [id, e] : alive) rows.row(e->module).activations_kept += e->bytes;
}

// Each module's workspace peak, and the step's (returned).
int64_t add_workspace_peaks(Rows& rows, const MemoryTrace& trace, int s, Device device) {
    const auto [first, last] = trace.step_events(s);
    Levels levels(trace, device, first);
    const int ws = int(Category::Workspace);
    int64_t step_peak = levels.in_use[ws];
    for (size_t i = first; i < last; i++) {
        const MemoryEvent& e = trace.events[i];
        if (!levels.apply(e) || e.freed() || e.category != Category::Workspace) continue;
        ModuleMemory& row = rows.row(e.module);
        row.workspace_peak = std::max(row.workspace_peak, levels.in_use[ws]);
        step_peak = std::max(step_peak, levels.in_use[ws]);
    }
    return step_peak;
}

PoolMemory pool_memory(Device device, const BumpAllocator* arena) {
    PoolAllocator& pool = pool_allocator(device);
    const MemoryStats s = pool.stats();
    PoolMemory m;
    m.pool_name = pool.name();
    m.reserved = s.reserved;
    m.allocated = s.allocated;
    m.requested = std::accumulate(s.requested.begin(), s.requested.end(), int64_t(0));
    m.cached = pool.cached_bytes();
    m.peak_reserved = s.peak_reserved;
    m.peak_allocated = s.peak_allocated;
    if (arena) {
        m.arena_name = arena->name();
        m.arena_capacity = int64_t(arena->capacity());
        m.arena_high_water = int64_t(arena->high_water());
    }
    return m;
}

}  // namespace

// ---- the report ------------------------------------------------------------------------------
StepMemory measure_step(const MemoryTrace& trace, int step, Module& model, const Optimizer& optimizer,
                        Device device, const BumpAllocator* arena) {
    StepMemory m;
    m.device = device;
    m.step = step;
    Rows rows(model);
    add_parameters(rows, model, optimizer);
    add_kept_activations(rows, trace, step, device);
    m.total.name = "total";
    m.total.workspace_peak = add_workspace_peaks(rows, trace, step, device);
    m.modules = rows.take();
    const ModuleMemory& outside = m.modules.back();
    if (outside.name == kOutsideModules && outside.parameters + outside.gradients + outside.optimizer_state +
                                                   outside.activations_kept + outside.workspace_peak == 0)
        m.modules.pop_back();
    for (const ModuleMemory& r : m.modules) {
        m.total.parameters += r.parameters;
        m.total.gradients += r.gradients;
        m.total.optimizer_state += r.optimizer_state;
        m.total.activations_kept += r.activations_kept;
    }
    const auto [first, last] = trace.step_events(step);
    m.peak = find_peak(trace, device, first, last);
    m.pool = pool_memory(device, arena);
    return m;
}

namespace {

std::string bytes_or_dash(int64_t b) { return b == 0 ? "-" : format_bytes(b); }

std::string table_row(const std::string& name, size_t width, const std::vector<std::string>& cells) {
    std::string line = name + std::string(width > name.size() ? width - name.size() : 0, ' ');
    for (const std::string& c : cells) line += std::string(c.size() < 18 ? 18 - c.size() : 1, ' ') + c;
    return line + "\n";
}

std::string module_row(const ModuleMemory& r, size_t width) {
    return table_row(r.name, width,
                     {bytes_or_dash(r.parameters), bytes_or_dash(r.gradients), bytes_or_dash(r.optimizer_state),
                      bytes_or_dash(r.activations_kept), bytes_or_dash(r.workspace_peak)});
}

}  // namespace

std::string format_step_memory(const StepMemory& m) {
    std::ostringstream os;
    os << "memory of training step " << m.step + 1 << " on " << device_name(m.device)
       << " (tensor bytes, before the allocator's rounding)\n";
    size_t width = 8;
    for (const ModuleMemory& r : m.modules) width = std::max(width, r.name.size() + 2);
    os << table_row("module", width, {"parameters", "gradients", "optimizer state", "kept for backward",
                                      "workspace peak"});
    for (const ModuleMemory& r : m.modules) os << module_row(r, width);
    os << module_row(m.total, width);
    char line[256];
    std::snprintf(line, sizeof line, "peak of the step: %s in use at %s (%s), %.2f ms into the recording\n",
                  format_bytes(m.peak.bytes).c_str(), shown_name(m.peak.module).c_str(), phase_name(m.peak.phase),
                  m.peak.time_us / 1000.0);
    os << line << "  of which";
    for (int c = 0; c < kNumCategories; c++)
        if (m.peak.by_category[size_t(c)] != 0)
            os << " " << category_name(Category(c)) << " " << format_bytes(m.peak.by_category[size_t(c)]) << ";";
    const PoolMemory& p = m.pool;
    os << "\npool '" << p.pool_name << "': " << format_bytes(p.reserved) << " reserved = " << format_bytes(p.allocated)
       << " in live blocks + " << format_bytes(p.fragmentation())
       << " reserved but unused (fragmentation: cached free blocks, " << format_bytes(p.cached) << ")\n"
       << "  the live blocks' tensors asked for " << format_bytes(p.requested) << ": rounding costs "
       << format_bytes(p.rounding()) << "; peaks so far: " << format_bytes(p.peak_reserved) << " reserved, "
       << format_bytes(p.peak_allocated) << " in blocks\n";
    if (!p.arena_name.empty()) {
        std::snprintf(line, sizeof line, "arena '%s': high-water mark %s of %s (%.0f%%)\n", p.arena_name.c_str(),
                      format_bytes(p.arena_high_water).c_str(), format_bytes(p.arena_capacity).c_str(),
                      p.arena_capacity ? 100.0 * double(p.arena_high_water) / double(p.arena_capacity) : 0.0);
        os << line;
    }
    return os.str();
}

// ---- the trainers' side ------------------------------------------------------------------------
MemoryRecording::MemoryRecording(MemoryTraceOptions options, Module& model, const Optimizer& optimizer, Device device,
                                 const BumpAllocator* arena)
    : options_(std::move(options)), model_(model), optimizer_(optimizer), device_(device), arena_(arena) {
    KILN_CHECK(options_.trace_steps >= 1, "--mem-trace-steps must be ≥ 1, got ", options_.trace_steps);
    if (!options_.trace.empty()) check_trace_path(options_.trace);
}

int MemoryRecording::steps_wanted() const {
    return std::max(options_.report ? 1 : 0, options_.trace.empty() ? 0 : options_.trace_steps);
}

void MemoryRecording::step_begins() {
    if (finished_ || recorder_ || steps_wanted() == 0) return;
    recorder_.emplace(model_);
    // The first step's peak, in the allocators' rounded bytes. (fit measures the epoch's peak
    // the same way; restarting it here drops only the loading of the first batch from that.)
    reset_phase_peak(device_);
}

// The prediction from shapes alone (memory_model.h) and how far the measured peak is from it.
// The prediction counts what the allocators hand out (rounded), as device_peaks does.
std::string MemoryRecording::predicted_beside(int64_t measured_peak) const {
    if (options_.input.ndim == 0) return "";
    try {
        const MemoryPrediction p =
            predict_memory(model_, memory_model_options(model_, optimizer_, options_.input, device_, arena_ != nullptr,
                                                        options_.amp));
        char line[200];
        std::snprintf(line, sizeof line, "peak of the step, in the allocators' rounded blocks: predicted %s, measured %s (%+.1f%%)\n",
                      format_bytes(p.peak).c_str(), format_bytes(measured_peak).c_str(),
                      100.0 * double(measured_peak - p.peak) / double(p.peak));
        return "predicted from the shapes alone (train/memory_model.h):\n" + memory_prediction_table(p) + line;
    } catch (const Error& e) {
        return std::string("no prediction for this model: ") + e.what() + "\n";
    }
}

void MemoryRecording::step_ends() {
    if (!recorder_ || !recorder_->recording()) return;
    recorder_->end_step();
    steps_done_++;
    if (options_.report && steps_done_ == 1) {
        const StepMemory m = measure_step(recorder_->trace(), 0, model_, optimizer_, device_, arena_);
        std::printf("%s%s", format_step_memory(m).c_str(), predicted_beside(device_peaks(device_).phase_peak).c_str());
        std::fflush(stdout);
    }
    if (steps_done_ >= steps_wanted()) finish();
}

void MemoryRecording::finish() {
    if (finished_) return;
    finished_ = true;
    if (!recorder_) return;  // no step ran
    recorder_->stop();
    if (options_.trace.empty()) return;
    MemoryTrace trace = recorder_->trace();
    // training ended before trace_steps steps: what followed the last step (evaluation) is left out
    trace.events.resize(trace.steps() ? trace.step_ends.back() : 0);
    write_memory_trace(trace, device_, options_.trace, model_.name());
    std::printf("memory trace: %zu events of %d step(s) in %s, the timeline in %s\n", trace.events.size(),
                trace.steps(), options_.trace.c_str(), timeline_path(options_.trace).c_str());
    std::fflush(stdout);
}

std::unique_ptr<MemoryRecording> memory_recording(const CommonFlags& flags, Module& model, const Optimizer& optimizer,
                                                  const BumpAllocator* arena, const DataLoader& train) {
    for (const char* flag : {"--mem-report", "--mem-trace", "--mem-trace-steps"}) flags.use(flag);
    if (!flags.mem_report && flags.mem_trace.empty()) return nullptr;
    const ImageShape image = train.image_shape();
    // one micro-batch of the loader's batches (of this rank's share, under data parallel training)
    const Shape input{train.options().batch_size / flags.accumulate, image.c, image.h, image.w};
    return std::make_unique<MemoryRecording>(MemoryTraceOptions{flags.mem_report, flags.mem_trace, flags.mem_trace_steps, input, flags.amp},
                                             model, optimizer,
                                             optimizer.param_groups().front().params.front()->value.device(), arena);
}

}  // namespace kiln
