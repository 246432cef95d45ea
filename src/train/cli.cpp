// cli.cpp — a small flag parser: "--name value" or "--name=value", switches without a value.
#include "train/cli.h"

#include <omp.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <type_traits>

#include "core/allocator.h"
#include "core/cuda_memory.h"
#include "core/error.h"
#include "train/memory_trace.h"

namespace kiln {

Cli::Cli(std::string program, std::string description)
    : program_(std::move(program)), description_(std::move(description)) {}

void Cli::add_flag(const std::string& flag, const std::string& help, std::string default_text, bool takes_value,
                   std::function<void(const std::string&)> set) {
    KILN_CHECK(!find(flag), program_, ": flag ", flag, " is added twice");
    flags_.push_back({flag, help, std::move(default_text), takes_value, std::move(set)});
}

const Cli::Flag* Cli::find(const std::string& flag) const {
    for (const Flag& f : flags_)
        if (f.name == flag) return &f;
    return nullptr;
}

namespace {

template <typename T> std::string to_text(T v) {
    std::ostringstream os;
    os << v;
    return os.str();
}

// All of `text` as a T, or a UsageError naming the flag: integers as decimal digits, with a
// leading '-' only for a signed T, within T's range; floats finite.
template <typename T> T parse_number(const std::string& flag, const std::string& text) {
    const char* begin = text.c_str();
    char* end = nullptr;
    errno = 0;
    T v{};
    const bool sign_ok = std::is_signed<T>::value || (!text.empty() && text[0] != '-');
    if constexpr (std::is_floating_point<T>::value) {
        v = T(std::strtod(begin, &end));
        KILN_USAGE_CHECK(end != begin && *end == '\0' && std::isfinite(v), "flag ", flag, ": '", text,
                         "' is not a finite number");
    } else {
        const bool digits = !text.empty() && text.find_first_not_of("-0123456789") == std::string::npos;
        if (std::is_signed<T>::value) {
            const long long x = std::strtoll(begin, &end, 10);
            KILN_USAGE_CHECK(digits && end != begin && *end == '\0', "flag ", flag, ": '", text, "' is not a whole number");
            KILN_USAGE_CHECK(errno != ERANGE && x >= std::numeric_limits<T>::min() && x <= std::numeric_limits<T>::max(),
                             "flag ", flag, ": ", text, " is out of range");
            v = T(x);
        } else {
            KILN_USAGE_CHECK(sign_ok, "flag ", flag, ": ", text, " is negative; it takes 0 or more");
            const unsigned long long x = std::strtoull(begin, &end, 10);
            KILN_USAGE_CHECK(digits && end != begin && *end == '\0', "flag ", flag, ": '", text, "' is not a whole number");
            KILN_USAGE_CHECK(errno != ERANGE && x <= std::numeric_limits<T>::max(), "flag ", flag, ": ", text,
                             " is out of range");
            v = T(x);
        }
    }
    return v;
}

// "at least 0", "more than 0", "between 0 and 2"
std::string describe(const Cli::Range& r) {
    if (r.max < HUGE_VAL) return "between " + to_text(r.min) + " and " + to_text(r.max);
    return (r.above_min ? "more than " : "at least ") + to_text(r.min);
}

bool within(const Cli::Range& r, double v) { return (r.above_min ? v > r.min : v >= r.min) && v <= r.max; }

}  // namespace

template <typename T> void Cli::add_number(const std::string& flag, T* t, const std::string& help, Range range) {
    add_flag(flag, help, to_text(*t), true, [t, flag, range](const std::string& s) {
        const T v = parse_number<T>(flag, s);
        KILN_USAGE_CHECK(within(range, double(v)), "flag ", flag, ": ", s, " is not allowed; it takes a value ",
                         describe(range));
        *t = v;
    });
}

void Cli::add(const std::string& flag, int* t, const std::string& help, Range r) { add_number(flag, t, help, r); }
void Cli::add(const std::string& flag, int64_t* t, const std::string& help, Range r) { add_number(flag, t, help, r); }
void Cli::add(const std::string& flag, uint64_t* t, const std::string& help, Range r) { add_number(flag, t, help, r); }
void Cli::add(const std::string& flag, float* t, const std::string& help, Range r) { add_number(flag, t, help, r); }

void Cli::add(const std::string& flag, std::string* t, const std::string& help) {
    add_flag(flag, help, t->empty() ? "none" : *t, true, [t](const std::string& s) { *t = s; });
}

void Cli::add(const std::string& flag, std::string* t, const std::string& help, std::vector<std::string> choices) {
    add_flag(flag, help, *t, true, [t, flag, choices](const std::string& s) {
        if (std::find(choices.begin(), choices.end(), s) != choices.end()) {
            *t = s;
            return;
        }
        std::string names;
        for (const std::string& c : choices) names += (names.empty() ? "" : ", ") + c;
        throw UsageError("flag " + flag + ": '" + s + "' is not one of " + names);
    });
}

void Cli::add_size(const std::string& flag, std::string* t, const std::string& help) {
    add_flag(flag, help, t->empty() ? "none" : *t, true, [t, flag](const std::string& s) {
        try {
            parse_bytes(s);
        } catch (const UsageError& e) {
            throw UsageError("flag " + flag + ": " + e.what());
        }
        *t = s;
    });
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
        throw UsageError("flag " + flag + ": '" + s + "' is not one of " + names);
    });
}

std::string Cli::usage() const {
    std::ostringstream os;
    os << "usage: " << program_ << " [flags]\n" << description_ << "\n\nflags:\n";
    char line[640];
    for (const Flag& f : flags_) {
        std::string left = f.name + (f.takes_value ? " V" : "");
        std::snprintf(line, sizeof line, "  %-18s %s (default: %s)\n", left.c_str(), f.help.c_str(),
                      f.default_text.c_str());
        os << line;
    }
    os << "  --help             print this and exit\n";
    if (!refused_.empty()) {
        os << "\nshared flags " << program_ << " does not take:\n";
        for (const Refused& r : refused_) {
            std::snprintf(line, sizeof line, "  %-18s %s\n", r.name.c_str(), r.why.c_str());
            os << line;
        }
    }
    return os.str();
}

std::vector<std::string> Cli::flag_names() const {
    std::vector<std::string> names;
    for (const Flag& f : flags_) names.push_back(f.name);
    return names;
}

void Cli::refuse(const std::string& flag, const std::string& why) {
    KILN_CHECK(find(flag), program_, ": cannot refuse flag ", flag, ", which was never added");
    flags_.erase(std::remove_if(flags_.begin(), flags_.end(), [&](const Flag& f) { return f.name == flag; }),
                 flags_.end());
    refused_.push_back({flag, why});
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
        for (const Refused& r : refused_)
            KILN_USAGE_CHECK(r.name != arg, program_, " does not take ", arg, ": ", r.why);
        const Flag* flag = find(arg);
        KILN_USAGE_CHECK(flag, "unknown flag '", arg, "'\n", usage());
        if (flag->takes_value && !inline_value) {
            KILN_USAGE_CHECK(i + 1 < argc, "flag ", arg, " needs a value\n", usage());
            value = argv[++i];
        }
        KILN_USAGE_CHECK(flag->takes_value || !inline_value, "flag ", arg, " is a switch: it takes no value (", arg,
                         ", not ", argv[i], ")");
        flag->set(value);
        given_.insert(arg);
    }
}

void CommonFlags::add_to(Cli& cli) {
    this->cli = &cli;
    const std::vector<std::string> before = cli.flag_names();
    cli.add("--epochs", &epochs, "passes over the training set", Cli::at_least(1));
    cli.add("--batch-size", &batch_size, "images per step", Cli::at_least(1));
    cli.add("--lr", &lr, "learning rate", Cli::positive());
    cli.add("--seed", &seed, "seed of the weights and the data order (0 or more)");
    cli.add("--threads", &threads, "CPU threads, 0 = all cores", Cli::at_least(0));
    cli.add("--data", &data, "folder of the data set (make data puts it there)");
    cli.add("--limit", &limit, "train on the first N images only, for a quick look (0 = all)", Cli::at_least(0));
    cli.add("--device", &device, "cpu, or cuda (a GPU, or the kernel emulator without one)", {"cpu", "cuda"});
    cli.add_size("--mem-limit", &mem_limit, "fail past this much memory reserved per device, e.g. 64MiB (0: no limit)");
    cli.add("--find-batch-size", &find_batch_size, "print the largest --batch-size whose step fits in --mem-limit (found with real steps), and stop");
    cli.add("--save", &save, "folder for a checkpoint after every epoch (DIR/last.safetensors; the one before: DIR/prev.safetensors), and for the run's log DIR/run.json and DIR/curves.svg (without --save: runs/<trainer>/)");
    cli.add("--accumulate", &accumulate, "K micro-batches of batch-size/K images per optimizer step (K divides --batch-size): the same update, batch norm aside, with K times fewer activations", Cli::at_least(1));
    cli.add("--mem-report", &mem_report, "print where the first training step's memory goes, per module");
    cli.add("--mem-trace", &mem_trace, "write every allocation of the first steps to FILE.json and their timeline to FILE.svg");
    cli.add("--mem-trace-steps", &mem_trace_steps, "training steps that --mem-trace records", Cli::at_least(1));
    cli.add("--amp", &amp, "mixed precision: f16 (with a GradScaler: loss scaling) or bf16; f32 is off",
            {DType::F16, DType::BF16, DType::F32});
    cli.add("--tf32", &tf32, "f32 matrix products (linear, conv) on a GPU's tensor cores, operands rounded to tf32 (10 mantissa bits, f32 sums); refused on the CPU; off: true f32. With --amp only what stays f32 changes");
    cli.add("--grad-hist", &grad_hist, "print the first step's gradient values by binary exponent against f16's range (what underflows without loss scaling, what overflows at the scale)");
    cli.add("--time-report", &time_report, "time N training steps after the first two, layer by layer, print an epoch's time budget, and stop", Cli::at_least(0));
    cli.add("--time-svg", &time_svg, "with --time-report: also draw it, to this .svg file");
    cli.add("--resume", &resume, "continue from this checkpoint (same flags as the run that wrote it: a different --epochs, --lr, --limit or --batch-size is refused; the data order goes on with the checkpoint's seed)");
    cli.add("--overwrite", &overwrite, "let this run replace the checkpoints another run left in the folder it saves to (refused without it)");
    for (const std::string& name : cli.flag_names())
        if (std::find(before.begin(), before.end(), name) == before.end()) shared_.push_back(name);
}

// --tf32 sets cuda::set_tf32 for the run (and clears it without the flag, so that one process's
// runs do not inherit it). It changes only f32 products: with --amp the 16-bit ones are unaffected.
void CommonFlags::apply_tf32(Device d) const {
    use("--tf32");
    KILN_USAGE_CHECK(!tf32 || d == Device::CUDA, "--tf32 runs f32 matrix products on a GPU's tensor cores: use it "
                     "with --device cuda (the CPU computes in true f32)");
    cuda::set_tf32(tf32);
    if (!tf32) return;
    std::printf("tf32: f32 matrix products (linear, conv) on the tensor cores, operands rounded to 10 mantissa bits%s\n",
                amp == DType::F32 ? "" : amp == DType::BF16 ? " (--amp bf16: the bf16 products are unaffected)"
                                                             : " (--amp f16: the f16 products are unaffected)");
}

Device CommonFlags::apply() const {
    use("--threads");
    use("--device");
    // (the command line's ranges refuse these; a trainer's own defaults are checked here)
    KILN_USAGE_CHECK(epochs > 0 && batch_size > 0, "--epochs and --batch-size must be positive");
    KILN_USAGE_CHECK(accumulate >= 1 && batch_size % accumulate == 0, "--accumulate ", accumulate, " must be at least 1 "
                     "and divide --batch-size ", batch_size, " (micro-batches of batch-size/K images)");
    KILN_USAGE_CHECK(batch_size % (int64_t(world_size) * accumulate) == 0, "--batch-size ", batch_size,
                     " must split into ", world_size, " equal shares, one per rank",
                     accumulate > 1 ? " (each cut into --accumulate micro-batches)" : "", ": try a multiple of ",
                     world_size * accumulate);
    if (threads > 0) omp_set_num_threads(threads);
    set_out_of_memory_hints(memory_hints());
    Device d = device == "cuda" ? Device::CUDA : Device::CPU;
    if (d == Device::CUDA) cuda::print_emulator_note_once();  // says so when there is no GPU build
    apply_tf32(d);
    if (!mem_trace.empty()) check_trace_path(mem_trace);  // fail now, not after loading the data
    const bool given_steps = cli && cli->given("--mem-trace-steps");
    KILN_USAGE_CHECK(!given_steps || !mem_trace.empty(), "--mem-trace-steps counts the steps --mem-trace records; "
                     "add --mem-trace FILE.json");
    KILN_USAGE_CHECK(time_svg.empty() || time_report > 0, "--time-svg draws --time-report's table; add --time-report N");
    KILN_USAGE_CHECK(!(find_batch_size && time_report > 0), "--find-batch-size and --time-report each stop the trainer; "
                     "ask for one at a time");
    if (measures()) {  // no training follows: what shapes only training is refused
        const std::string measuring = find_batch_size ? "--find-batch-size" : "--time-report";
        KILN_USAGE_CHECK(save.empty(), measuring, " measures a step and stops before training: drop --save");
        refuse_training_flags(measuring + " measures a step and stops before training",
                              {"--lr", "--accumulate", "--amp", "--find-batch-size", "--time-report", "--time-svg"});
    }
    return d;
}

std::vector<std::string> CommonFlags::memory_hints() const {
    std::vector<std::string> hints;
    if (!cli) return hints;
    const std::vector<std::string> taken = cli->flag_names();
    const auto takes = [&](const char* flag) { return std::find(taken.begin(), taken.end(), flag) != taken.end(); };
    if (takes("--plain") && cli->given("--plain"))  // lesson-08's chapter 06 way
        hints.push_back("drop --plain (recomputation, 4 micro-batches and a 4 MiB workspace: about a third of the memory)");
    if (takes("--accumulate"))
        hints.push_back("--accumulate " + std::to_string(2 * accumulate) + " (" + std::to_string(2 * accumulate) +
                        " micro-batches a step: 1/" + std::to_string(2 * accumulate) + " of the activations, the same update)");
    if (takes("--recompute") && !cli->given("--recompute"))
        hints.push_back("--recompute (each block keeps only its input and recomputes the rest in backward)");
    if (takes("--workspace-limit") && !cli->given("--plain"))  // lesson-08's --plain keeps chapter 06's workspace
        hints.push_back("a smaller --workspace-limit (im2col's columns for fewer images at a time)");
    if (takes("--amp") && amp == DType::F32)
        hints.push_back("--amp bf16 (the convolutions' activations in 16 bits)");
    return hints;
}

int64_t CommonFlags::memory_limit_bytes() const { return mem_limit.empty() ? 0 : parse_bytes(mem_limit); }

void CommonFlags::apply_memory_limit(Device device) const {
    use("--mem-limit");
    const int64_t limit = memory_limit_bytes();
    if (limit == 0) return;  // none
    pool_allocator(device).empty_cache();  // building the model left temporaries in the cache
    const MemoryStats s = device_memory_stats(device);
    const int64_t model_state = s.in_use[int(Category::Parameter)] + s.in_use[int(Category::Gradient)] +
                                s.in_use[int(Category::OptimizerState)];
    KILN_USAGE_CHECK(limit > s.reserved, "--mem-limit ", mem_limit, " is below what the model needs before its first step: ",
                     format_bytes(s.reserved), " reserved on ", device_name(device), ", of which its parameters, gradients ",
                     "and optimizer state take ", format_bytes(model_state), ". The minimum is that plus one training ",
                     "step's activations and workspace; try --mem-limit ", format_bytes(2 * s.reserved),
                     " and lower it until the step no longer fits");
    set_memory_limit(device, limit);
}

void CommonFlags::check_used() const {
    if (!cli) return;
    std::string unused;
    for (const std::string& flag : shared_)
        if (cli->given(flag) && !used_.count(flag)) unused += (unused.empty() ? "" : ", ") + flag;
    KILN_USAGE_CHECK(unused.empty(), cli->program(), " took ", unused, " but this run never used ",
                     unused.find(',') == std::string::npos ? "it" : "them", ": a trainer honours each shared flag or ",
                     "refuses it by name (Cli::refuse), and this one did neither — a bug in the trainer; leave ",
                     unused.find(',') == std::string::npos ? "the flag" : "them", " out");
}

void CommonFlags::refuse_training_flags(const std::string& why, const std::vector<std::string>& still_used) const {
    if (!cli) return;
    for (const char* flag : {"--epochs", "--lr", "--accumulate", "--amp", "--grad-hist", "--resume", "--mem-report",
                             "--mem-trace", "--mem-trace-steps", "--find-batch-size", "--time-report", "--time-svg"}) {
        const bool kept = std::find(still_used.begin(), still_used.end(), flag) != still_used.end();
        KILN_USAGE_CHECK(kept || !cli->given(flag), flag, " shapes the training that this run does not do: ", why);
    }
}

bool command_line_has(int argc, char** argv, const std::string& flag, const std::string& value) {
    for (int i = 1; i < argc; i++) {
        const std::string arg = argv[i];
        if (arg == flag + "=" + value || (arg == flag && i + 1 < argc && argv[i + 1] == value)) return true;
    }
    return false;
}

}  // namespace kiln
