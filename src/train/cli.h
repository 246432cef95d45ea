// cli.h — command-line flags for the trainers, and the flags every trainer shares.
//
//   CommonFlags f;                      // defaults a trainer may change before parsing
//   f.epochs = 5;
//   Cli cli("lesson-02", "Trains an MLP on MNIST.");
//   f.add_to(cli);                       // --epochs --batch-size --lr --seed --threads --data
//   cli.add("--hidden", &hidden, "hidden units");   //   --limit --device --mem-limit --save --resume --overwrite
//                                                   //   --mem-report --mem-trace --mem-trace-steps
//                                                   //   --amp --grad-hist --time-report --time-svg
//   cli.parse(argc, argv);               // --help prints the usage and exits
//   Device d = f.apply();                // sets the thread count, picks the device
//   ... build the model and optimizer ...
//   f.apply_memory_limit(d);             // --mem-limit, checked against what the model takes
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"

namespace kiln {

class Cli {
public:
    Cli(std::string program, std::string description);
    void add(const std::string& flag, int* target, const std::string& help);
    void add(const std::string& flag, int64_t* target, const std::string& help);
    void add(const std::string& flag, uint64_t* target, const std::string& help);
    void add(const std::string& flag, float* target, const std::string& help);
    void add(const std::string& flag, std::string* target, const std::string& help);
    void add(const std::string& flag, bool* target, const std::string& help);  // a switch, no value
    // An element type named as dtype_name writes it ("f16"); one not in `choices` is an error
    // listing them.
    void add(const std::string& flag, DType* target, const std::string& help, std::vector<DType> choices);
    // Takes back a flag added before (CommonFlags' shared ones, for a trainer that cannot honour
    // one): --help no longer lists it, and the command line gets "unknown flag" for it.
    void remove(const std::string& flag);
    // Unknown flags and bad values throw kiln::Error with the usage; --help prints it and exits.
    void parse(int argc, char** argv);
    std::string usage() const;
    const std::string& program() const { return program_; }          // "lesson-03"
    const std::vector<std::string>& arguments() const { return arguments_; }  // what parse read

private:
    struct Flag {
        std::string name, help, default_text;
        bool takes_value;
        std::function<void(const std::string&)> set;
    };
    void add_flag(const std::string& flag, const std::string& help, std::string default_text, bool takes_value,
                  std::function<void(const std::string&)> set);
    std::string program_, description_;
    std::vector<Flag> flags_;
    std::vector<std::string> arguments_;
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
    std::string mem_limit;         // e.g. 64MiB; empty = none
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
    // Data parallel training (lesson 12; set by the trainer, not flags): this process is rank
    // `rank` of world_size. --batch-size stays the whole batch: each rank's training loader takes
    // batch_size / world_size images of its share of the epoch; only rank 0 writes files.
    int rank = 0, world_size = 1;

    void add_to(Cli& cli);
    // --find-batch-size or --time-report: the trainer measures a step instead of training
    bool measures() const { return find_batch_size || time_report > 0; }
    // Sets the OpenMP thread count and checks the flags; returns the chosen device.
    Device apply() const;
    // Sets --mem-limit on the device, once the model and its optimizer are built: fails, saying
    // what the model alone takes, if the limit is below that. The limit counts the memory
    // reserved from the system, as a GPU's size would: the pool's cached blocks and the arena's
    // slab included.
    void apply_memory_limit(Device device) const;
};

}  // namespace kiln
