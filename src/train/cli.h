// cli.h — command-line flags for the trainers, and the flags every trainer shares.
//
//   CommonFlags f;                      // defaults a trainer may change before parsing
//   f.epochs = 5;
//   Cli cli("lesson-02", "Trains an MLP on MNIST.");
//   f.add_to(cli);                       // the shared flags (CommonFlags below)
//   cli.add("--hidden", &hidden, "hidden units", Cli::at_least(1));   // the trainer's own
//   cli.refuse("--device", "it trains on the CPU only");              // a shared one it cannot honour
//   cli.parse(argc, argv);               // --help prints the usage and exits
//   Device d = f.apply();                // sets the thread count, picks the device
//   ... build the model and optimizer ...
//   f.apply_memory_limit(d);             // --mem-limit, checked against what the model takes
//   ... train (fit, train/fit.h, uses the rest) ...
//   report(f, d, acc, start);            // the result line; fails if a flag given was never used
//
// Every shared flag is either honoured or refused by name. Honoured: the code that acts on a flag
// marks it (CommonFlags::use), and the run's end (report, only_measure) fails naming any flag the
// command line gave that nothing used — so a trainer cannot drift into ignoring one silently
// (tests/test_trainer_flags.cpp runs every trainer with every flag its --help lists). Refused:
// Cli::refuse, with the reason, which --help prints too.
//
// A value that is not meant is refused, naming the flag: a number out of its range (--limit -5,
// --seed -1), a word not among the choices (--device gpu), a size that cannot be read
// (--mem-limit 1e30GiB). These are kiln::UsageError: a message without a source line, since the
// fix is on the command line.
#pragma once
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"

namespace kiln {

// The values a number flag accepts: min ≤ v ≤ max, or min < v with above_min (a learning
// rate). A value outside is refused naming the flag and the range.
struct FlagRange {
    double min = -HUGE_VAL, max = HUGE_VAL;
    bool above_min = false;
};

class Cli {
public:
    using Range = FlagRange;
    static Range at_least(double min) { return {min, HUGE_VAL, false}; }
    static Range positive() { return {0.0, HUGE_VAL, true}; }
    static Range between(double min, double max) { return {min, max, false}; }

    Cli(std::string program, std::string description);
    // Numbers: all of the value must be one; an integer flag takes digits (and a sign where the
    // type has one: "--seed -1" is refused, not wrapped to 2^64 − 1); a float must be finite.
    void add(const std::string& flag, int* target, const std::string& help, Range range = {});
    void add(const std::string& flag, int64_t* target, const std::string& help, Range range = {});
    void add(const std::string& flag, uint64_t* target, const std::string& help, Range range = {});
    void add(const std::string& flag, float* target, const std::string& help, Range range = {});
    void add(const std::string& flag, std::string* target, const std::string& help);  // any text
    // One of `choices`; another word is an error listing them.
    void add(const std::string& flag, std::string* target, const std::string& help, std::vector<std::string> choices);
    // A memory size as parse_bytes reads it (64MiB, 2GiB; "0": none), kept as typed.
    void add_size(const std::string& flag, std::string* target, const std::string& help);
    void add(const std::string& flag, bool* target, const std::string& help);  // a switch, no value
    // An element type named as dtype_name writes it ("f16"); one not in `choices` is an error
    // listing them.
    void add(const std::string& flag, DType* target, const std::string& help, std::vector<DType> choices);
    // Takes back a flag added before (a shared one this program cannot honour), saying why:
    // --help lists it under "not taken", and the command line gets an error naming it with `why`.
    void refuse(const std::string& flag, const std::string& why);
    // Unknown or refused flags and bad values throw kiln::UsageError; --help prints the usage and exits.
    void parse(int argc, char** argv);
    std::string usage() const;
    const std::string& program() const { return program_; }          // "lesson-03"
    const std::vector<std::string>& arguments() const { return arguments_; }  // what parse read
    bool given(const std::string& flag) const { return given_.count(flag) > 0; }  // by the command line
    std::vector<std::string> flag_names() const;  // the flags it takes, in --help's order

private:
    struct Flag {
        std::string name, help, default_text;
        bool takes_value;
        std::function<void(const std::string&)> set;
    };
    struct Refused {
        std::string name, why;
    };
    void add_flag(const std::string& flag, const std::string& help, std::string default_text, bool takes_value,
                  std::function<void(const std::string&)> set);
    template <typename T> void add_number(const std::string& flag, T* target, const std::string& help, Range range);
    const Flag* find(const std::string& flag) const;
    std::string program_, description_;
    std::vector<Flag> flags_;
    std::vector<Refused> refused_;
    std::vector<std::string> arguments_;
    std::set<std::string> given_;
};

// Whether the command line sets `flag` to `value` ("--model cifar" or "--model=cifar"), looked
// up before Cli::parse: for a trainer whose defaults depend on one flag (lesson-10's and
// lesson-11's --model cifar take chapter 06's batch size and data).
bool command_line_has(int argc, char** argv, const std::string& flag, const std::string& value);

struct CommonFlags {
    int epochs = 1;
    int64_t batch_size = 64;
    float lr = 0.01f;
    uint64_t seed = 1;
    int threads = 0;               // 0: OpenMP's default (all cores)
    std::string data = "data/mnist";
    int64_t limit = 0;             // train on the first N images only (quick runs); 0 = all
    std::string device = "cpu";    // cpu | cuda
    std::string mem_limit;         // e.g. 64MiB; empty or 0 = none
    bool find_batch_size = false;  // print the largest batch that fits in --mem-limit, and stop
    std::string save;              // a folder: a checkpoint after every epoch (empty = none)
    std::string resume;            // a checkpoint file to continue from (empty = start afresh)
    bool overwrite = false;        // --save may replace the checkpoints of another run in its folder
    int accumulate = 1;            // micro-batches per optimizer step (train/loop.h); divides batch_size
    const Cli* cli = nullptr;      // set by add_to: the trainer's name and command line (run.json)
    bool mem_report = false;       // print the memory of the first step per module
    std::string mem_trace;         // FILE.json: every allocation of the first steps, and FILE.svg
    int mem_trace_steps = 2;       // steps that --mem-trace records
    DType amp = DType::F32;        // --amp f16|bf16: mixed precision (F32: off); f16 adds a GradScaler
    bool grad_hist = false;        // print the first step's gradient exponents against f16's range
    int time_report = 0;           // > 0: time this many steps (after the first two) by layer, print, stop
    std::string time_svg;          // with time_report: its figure, to this file
    bool cuda_graph = false;       // --cuda-graph (lessons 04 and 05 add it): TrainOptions::cuda_graph
    bool tf32 = false;             // --tf32: f32 products on the tensor cores as TF32 (cuda::set_tf32; --device cuda)
    // Data parallel training (lesson 12; set by the trainer, not flags): this process is rank
    // `rank` of world_size. --batch-size stays the whole batch: each rank's training loader takes
    // batch_size / world_size images of its share of the epoch; only rank 0 writes files.
    int rank = 0, world_size = 1;

    void add_to(Cli& cli);
    // --find-batch-size or --time-report: the trainer measures a step instead of training
    bool measures() const { return find_batch_size || time_report > 0; }
    // Sets the OpenMP thread count, checks the flags against each other; returns the chosen device.
    Device apply() const;
    // Sets --mem-limit on the device, once the model and its optimizer are built: fails, saying
    // what the model alone takes, if the limit is below that. The limit counts the memory
    // reserved from the system, as a GPU's size would: the pool's cached blocks and the arena's
    // slab included.
    void apply_memory_limit(Device device) const;
    int64_t memory_limit_bytes() const;  // --mem-limit in bytes, 0: none
    // What an out-of-memory error suggests (set_out_of_memory_hints, core/allocator.h): the ways to
    // cut a step's memory this trainer takes (--accumulate, --recompute, --workspace-limit, --amp).
    std::vector<std::string> memory_hints() const;

    // The code that acts on a shared flag marks it ("--save"), whether or not it was given.
    void use(const std::string& flag) const { used_.insert(flag); }
    // Throws kiln::UsageError naming each shared flag the command line gave that nothing marked:
    // the trainer took it and did nothing with it. The ends of a run call it (report, only_measure).
    void check_used() const;
    // Refuses, naming the first one given and `why`, the flags that shape training (--epochs,
    // --lr, --accumulate, --amp, --grad-hist, --resume, --mem-report, --mem-trace,
    // --mem-trace-steps, --find-batch-size, --time-report, --time-svg) but those in `still_used`:
    // for a run that trains nothing (lesson-11 --from: the f32 model is loaded).
    void refuse_training_flags(const std::string& why, const std::vector<std::string>& still_used = {}) const;

    // The shared flags add_to added.
    const std::vector<std::string>& shared_flags() const { return shared_; }

private:
    void apply_tf32(Device d) const;
    std::vector<std::string> shared_;
    mutable std::set<std::string> used_;
};

}  // namespace kiln
