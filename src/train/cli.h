// cli.h — command-line flags for the trainers, and the flags every trainer shares.
//
//   CommonFlags f;                      // defaults a trainer may change before parsing
//   f.epochs = 5;
//   Cli cli("lesson-02", "Trains an MLP on MNIST.");
//   f.add_to(cli);                       // --epochs --batch-size --lr --seed --threads --data
//   cli.add("--hidden", &hidden, "hidden units");   //   --limit --device --mem-limit --save --resume
//                                                   //   --mem-report --mem-trace --mem-trace-steps
//   cli.parse(argc, argv);               // --help prints the usage and exits
//   f.apply();                           // sets the thread count and memory limit
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/device.h"

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
    // Unknown flags and bad values throw kiln::Error with the usage; --help prints it and exits.
    void parse(int argc, char** argv);
    std::string usage() const;

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
};

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
    std::string save;              // a folder: a checkpoint after every epoch (empty = none)
    std::string resume;            // a checkpoint file to continue from (empty = start afresh)
    bool mem_report = false;       // print the memory of the first step per module
    std::string mem_trace;         // FILE.json: every allocation of the first steps, and FILE.svg
    int mem_trace_steps = 2;       // steps that --mem-trace records

    void add_to(Cli& cli);
    // Sets the OpenMP thread count and the memory limit; returns the chosen device.
    Device apply() const;
};

}  // namespace kiln
