// cli.cpp — a small flag parser: "--name value" or "--name=value", switches without a value.
#include "train/cli.h"

#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "core/allocator.h"
#include "core/cuda_memory.h"
#include "core/error.h"
#include "train/memory_trace.h"

namespace kiln {

Cli::Cli(std::string program, std::string description)
    : program_(std::move(program)), description_(std::move(description)) {}

void Cli::add_flag(const std::string& flag, const std::string& help, std::string default_text, bool takes_value,
                   std::function<void(const std::string&)> set) {
    flags_.push_back({flag, help, std::move(default_text), takes_value, std::move(set)});
}

// Parses all of `text` as a number, or throws naming the flag.
template <typename T> static T parse_number(const std::string& flag, const std::string& text) {
    std::istringstream in(text);
    T v{};
    in >> v;
    KILN_CHECK(!in.fail() && in.eof(), "flag ", flag, ": '", text, "' is not a valid number");
    return v;
}

template <typename T> static std::string to_text(T v) {
    std::ostringstream os;
    os << v;
    return os.str();
}

void Cli::add(const std::string& flag, int* t, const std::string& help) {
    add_flag(flag, help, to_text(*t), true, [t, flag](const std::string& s) { *t = parse_number<int>(flag, s); });
}
void Cli::add(const std::string& flag, int64_t* t, const std::string& help) {
    add_flag(flag, help, to_text(*t), true, [t, flag](const std::string& s) { *t = parse_number<int64_t>(flag, s); });
}
void Cli::add(const std::string& flag, uint64_t* t, const std::string& help) {
    add_flag(flag, help, to_text(*t), true, [t, flag](const std::string& s) { *t = parse_number<uint64_t>(flag, s); });
}
void Cli::add(const std::string& flag, float* t, const std::string& help) {
    add_flag(flag, help, to_text(*t), true, [t, flag](const std::string& s) { *t = parse_number<float>(flag, s); });
}
void Cli::add(const std::string& flag, std::string* t, const std::string& help) {
    add_flag(flag, help, t->empty() ? "none" : *t, true, [t](const std::string& s) { *t = s; });
}
void Cli::add(const std::string& flag, bool* t, const std::string& help) {
    add_flag(flag, help, *t ? "on" : "off", false, [t](const std::string&) { *t = true; });
}

void Cli::add(const std::string& flag, DType* t, const std::string& help, std::vector<DType> choices) {
    add_flag(flag, help, dtype_name(*t), true, [t, flag, choices](const std::string& s) {
        auto named = std::find_if(choices.begin(), choices.end(), [&](DType c) { return s == dtype_name(c); });
        if (named != choices.end()) {
            *t = *named;
            return;
        }
        std::string names;
        for (DType c : choices) names += std::string(names.empty() ? "" : ", ") + dtype_name(c);
        KILN_FAIL("flag ", flag, ": '", s, "' is not one of ", names);
    });
}

std::string Cli::usage() const {
    std::ostringstream os;
    os << "usage: " << program_ << " [flags]\n" << description_ << "\n\nflags:\n";
    for (const Flag& f : flags_) {
        std::string left = f.name + (f.takes_value ? " V" : "");
        char line[256];
        std::snprintf(line, sizeof line, "  %-18s %s (default: %s)\n", left.c_str(), f.help.c_str(),
                      f.default_text.c_str());
        os << line;
    }
    os << "  --help             print this and exit\n";
    return os.str();
}

void Cli::remove(const std::string& flag) {
    const auto named = [&](const Flag& f) { return f.name == flag; };
    KILN_CHECK(std::any_of(flags_.begin(), flags_.end(), named), program_, ": cannot remove flag ", flag,
               ", which was never added");
    flags_.erase(std::remove_if(flags_.begin(), flags_.end(), named), flags_.end());
}

void Cli::parse(int argc, char** argv) {
    arguments_.assign(argv + 1, argv + argc);
    for (int i = 1; i < argc; i++) {
        std::string arg = argv[i], value;
        if (arg == "--help" || arg == "-h") {
            std::fputs(usage().c_str(), stdout);
            std::exit(0);
        }
        size_t eq = arg.find('=');
        bool inline_value = eq != std::string::npos;
        if (inline_value) {
            value = arg.substr(eq + 1);
            arg = arg.substr(0, eq);
        }
        const Flag* flag = nullptr;
        for (const Flag& f : flags_)
            if (f.name == arg) flag = &f;
        KILN_CHECK(flag, "unknown flag '", arg, "'\n", usage());
        if (flag->takes_value && !inline_value) {
            KILN_CHECK(i + 1 < argc, "flag ", arg, " needs a value\n", usage());
            value = argv[++i];
        }
        flag->set(value);
    }
}

void CommonFlags::add_to(Cli& cli) {
    this->cli = &cli;
    cli.add("--epochs", &epochs, "passes over the training set");
    cli.add("--batch-size", &batch_size, "images per step");
    cli.add("--lr", &lr, "learning rate");
    cli.add("--seed", &seed, "seed of the weights and the data order");
    cli.add("--threads", &threads, "CPU threads, 0 = all cores");
    cli.add("--data", &data, "folder of the data set (make data puts it there)");
    cli.add("--limit", &limit, "train on the first N images only, for a quick look (0 = all)");
    cli.add("--device", &device, "cpu, or cuda (a GPU, or the kernel emulator without one)");
    cli.add("--mem-limit", &mem_limit, "fail past this much memory per device, e.g. 64MiB (0: no limit)");
    cli.add("--find-batch-size", &find_batch_size, "print the largest --batch-size whose step fits in --mem-limit (found with real steps), and stop");
    cli.add("--save", &save, "folder for a checkpoint after every epoch (DIR/last.safetensors; the one before: DIR/prev.safetensors), and for the run's log DIR/run.json and DIR/curves.svg (without --save: runs/<trainer>/)");
    cli.add("--accumulate", &accumulate, "K micro-batches of batch-size/K images per optimizer step (K divides --batch-size): the same update, batch norm aside, with K times fewer activations");
    cli.add("--mem-report", &mem_report, "print where the first training step's memory goes, per module");
    cli.add("--mem-trace", &mem_trace, "write every allocation of the first steps to FILE.json and their timeline to FILE.svg");
    cli.add("--mem-trace-steps", &mem_trace_steps, "training steps that --mem-trace records");
    cli.add("--amp", &amp, "mixed precision: f16 (with a GradScaler: loss scaling) or bf16; f32 is off",
            {DType::F16, DType::BF16, DType::F32});
    cli.add("--grad-hist", &grad_hist, "print the first step's gradient values by binary exponent against f16's range (what underflows without loss scaling, what overflows at the scale)");
    cli.add("--time-report", &time_report, "time N training steps after the first two, layer by layer, print an epoch's time budget, and stop");
    cli.add("--time-svg", &time_svg, "with --time-report: also draw it, to this .svg file");
    cli.add("--resume", &resume, "continue from this checkpoint (same flags as the run that wrote it: a different --epochs, --lr, --limit or --batch-size is refused; the data order goes on with the checkpoint's seed)");
    cli.add("--overwrite", &overwrite, "let this run replace the checkpoints another run left in the folder it saves to (refused without it)");
}

Device CommonFlags::apply() const {
    KILN_CHECK(epochs > 0 && batch_size > 0, "--epochs and --batch-size must be positive");
    KILN_CHECK(threads >= 0, "--threads must be ≥ 0");
    KILN_CHECK(accumulate >= 1 && batch_size % accumulate == 0, "--accumulate ", accumulate,
               " must be at least 1 and divide --batch-size ", batch_size, " (micro-batches of batch-size/K images)");
    KILN_CHECK(batch_size % (int64_t(world_size) * accumulate) == 0, "--batch-size ", batch_size, " must split into ",
               world_size, " equal shares, one per rank", accumulate > 1 ? " (each cut into --accumulate micro-batches)" : "",
               ": try a multiple of ", world_size * accumulate);
    if (threads > 0) omp_set_num_threads(threads);
    KILN_CHECK(device == "cpu" || device == "cuda", "--device must be cpu or cuda, got '", device, "'");
    Device d = device == "cuda" ? Device::CUDA : Device::CPU;
    if (d == Device::CUDA) cuda::print_emulator_note_once();  // says so when there is no GPU build
    if (!mem_limit.empty()) parse_bytes(mem_limit);  // a malformed size fails now, not after loading
    if (!mem_trace.empty()) check_trace_path(mem_trace);  // fail now, not after loading the data
    KILN_CHECK(time_report >= 0, "--time-report ", time_report, " must count steps: 1 or more (0: off)");
    KILN_CHECK(time_svg.empty() || time_report > 0, "--time-svg draws --time-report's table; add --time-report N");
    KILN_CHECK(!(find_batch_size && time_report > 0), "--find-batch-size and --time-report each stop the trainer; "
               "ask for one at a time");
    return d;
}

void CommonFlags::apply_memory_limit(Device device) const {
    const int64_t limit = mem_limit.empty() ? 0 : parse_bytes(mem_limit);
    if (limit == 0) return;  // none
    pool_allocator(device).empty_cache();  // building the model left temporaries in the cache
    const MemoryStats s = device_memory_stats(device);
    const int64_t model_state = s.in_use[int(Category::Parameter)] + s.in_use[int(Category::Gradient)] +
                                s.in_use[int(Category::OptimizerState)];
    KILN_CHECK(limit > s.reserved, "--mem-limit ", mem_limit, " is below what the model needs before its first step: ",
               format_bytes(s.reserved), " reserved on ", device_name(device), ", of which its parameters, gradients ",
               "and optimizer state take ", format_bytes(model_state), ". The minimum is that plus one training ",
               "step's activations and workspace; try --mem-limit ", format_bytes(2 * s.reserved),
               " and lower it until the step no longer fits");
    set_memory_limit(device, limit);
}

bool command_line_has(int argc, char** argv, const std::string& flag, const std::string& value) {
    for (int i = 1; i < argc; i++) {
        const std::string arg = argv[i];
        if (arg == flag + "=" + value || (arg == flag && i + 1 < argc && argv[i + 1] == value)) return true;
    }
    return false;
}

}  // namespace kiln
