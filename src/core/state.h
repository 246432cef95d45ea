// state.h — what a component keeps so that training can stop and resume exactly.
//
// An optimizer's momentum buffers, a scheduler's step count, a loader's position, an RNG's
// counter: each component writes its state into a StateDict under its own prefix and reads it
// back. A checkpoint (train/checkpoint.h) is one StateDict in a file (io/safetensors.h): the
// tensors go into the safetensors data, the values into its "__metadata__" (strings, as
// safetensors requires).
//
//   StateDict s;
//   s.set("optimizer.step", int64_t(120));          s.tensors["optimizer.fc1.weight.momentum"] = buf;
//   int64_t step = s.get_int("optimizer.step");     // throws, naming the key, if it is missing
//
// Numbers are written so they read back bit for bit: integers in decimal, floats as C99 hex
// floats ("0x1.99999ap-4"), which round-trip exactly.
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "core/tensor.h"

namespace kiln {

struct StateDict {
    std::map<std::string, Tensor> tensors;      // CPU tensors
    std::map<std::string, std::string> values;  // numbers and short strings
    // false: put() stores copies, a snapshot that later training does not change. true: put()
    // stores a CPU tensor itself, sharing its bytes — for a StateDict written out at once
    // (save_checkpoint), so that saving a checkpoint doubles no memory.
    bool share_cpu_tensors = false;

    void set(const std::string& key, int64_t v);
    void set_u64(const std::string& key, uint64_t v);
    void set(const std::string& key, double v);
    void set(const std::string& key, const std::string& v);

    // Each throws kiln::Error naming the key (and the text found) when it is missing or malformed.
    int64_t get_int(const std::string& key) const;
    uint64_t get_u64(const std::string& key) const;
    double get_double(const std::string& key) const;
    const std::string& get_string(const std::string& key) const;
    // The same, and the value must lie in [lo, hi] (NaN lies in none): a value read from a file
    // is checked before it is used. The error names the key, the value and the range.
    int64_t get_int(const std::string& key, int64_t lo, int64_t hi) const;
    double get_double(const std::string& key, double lo, double hi) const;
    bool has(const std::string& key) const { return values.count(key) || tensors.count(key); }

    // Stores a CPU copy of t (t may live on any device), or t itself if share_cpu_tensors is set
    // and t is on the CPU.
    void put(const std::string& key, const Tensor& t);
    // Copies the stored tensor into `into` (any device), after checking that it exists and has
    // into's shape and dtype; the error names the key and both shapes.
    void get_into(const std::string& key, Tensor& into) const;
};

}  // namespace kiln
