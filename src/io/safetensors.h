// safetensors.h — a StateDict (core/state.h) as a file, in the safetensors layout, which Hugging
// Face's `safetensors` package reads (https://github.com/huggingface/safetensors). A checkpoint
// (train/checkpoint.h) is one such file.
//
//   byte 0        8                          8 + L                                      end
//        ┌────────┬──────────────────────────┬──────────────────────────────────────────┐
//        │   L    │ header: L bytes of JSON, │ data: every tensor's bytes back to back, │
//        │ u64 LE │ padded with spaces to a  │ little-endian, row-major; F32 tensors    │
//        │        │ multiple of 8            │ first, then I32, BF16, F16, I8, U8 (each │
//        │        │                          │ dtype in name order), so each is aligned │
//        └────────┴──────────────────────────┴──────────────────────────────────────────┘
//   {"__metadata__":{"kiln.crc32":"9ae0daaf","kiln.metadata_crc32":"5c1d07e2","optimizer.steps":"120",
//                    "train.epoch":"3",...},
//    "conv1.bias":{"dtype":"F32","shape":[10],"data_offsets":[0,40]},
//    "conv1.weight":{"dtype":"F32","shape":[10,1,5,5],"data_offsets":[40,1040]}, ...}
//
// data_offsets are [begin, end) in bytes from the start of the data section. "__metadata__"
// holds StateDict::values (safetensors allows only strings there) and two checksums in hex,
// checked on load: "kiln.crc32", the zlib CRC-32 of the data section, and "kiln.metadata_crc32",
// that of the values (each key and value, in key order, followed by a zero byte; the two
// checksums left out). A flipped bit or an edited value is an error, not a run that silently
// trains worse or not at all. Files written by other tools have no CRC and are read as they
// are (and older kiln files only the data's).
//
// In Python:
//
//   from safetensors.numpy import load_file           # or safetensors.torch: torch tensors
//   tensors = load_file("runs/epoch-3.safetensors")   # {"conv1.weight": array(...), ...}
//   from safetensors import safe_open
//   with safe_open("runs/epoch-3.safetensors", "np") as f: print(f.metadata())  # the values
//
// Saving never leaves half a file: the bytes go to "<path>.tmp", which is flushed, synced to
// the disk, and renamed over <path> (a rename is atomic), then the folder is synced. A crash
// or a full disk leaves the previous checkpoint as it was. Keeping the previous one too (a
// trainer's --save DIR: DIR/prev.safetensors) happens after the new bytes are on the disk and
// by a hard link, so DIR/last.safetensors exists, whole, at every moment.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/state.h"

namespace kiln {

// Writes s in the layout above (atomically: temporary file, fsync, rename). With `previous`
// given, the file `path` held before (if any) becomes `previous` once the new bytes are on the
// disk (a hard link renamed over it, or a copy where links cannot be made): `path` is never
// missing. Throws kiln::Error naming the path and the system's reason (no such folder, disk
// full) and leaves nothing behind: `path` and `previous` as they were.
void write_safetensors(const std::string& path, const StateDict& s, const std::string& previous = "");

// For tests of what a crash leaves behind: write_safetensors calls `hook` (null: none) after
// each of its steps — "temporary file written", "previous kept", "renamed" — and a test's hook
// may end the process there.
using SaveStepHook = void (*)(const char* step);
void set_save_step_hook(SaveStepHook hook);

// Appends s to out as a JSON string, as serde_json writes it: quote, backslash and control
// characters escaped (the header's names; run.json's text too, train/run_log.h).
void append_json_string(std::string& out, const std::string& s);

// Reads a safetensors file into a StateDict of CPU tensors. Nothing in the file is trusted: a
// short file, a header length past the end, bad JSON, an unknown dtype, offsets that overlap,
// leave gaps or disagree with the shape, a CRC mismatch — each throws kiln::Error naming the
// file, the tensor if there is one, and what was wrong. Never a crash, never an allocation
// larger than the file.
StateDict read_safetensors(const std::string& path);
// The same, from the file's bytes; `name` (the file) is what the errors name.
StateDict parse_safetensors(const std::vector<uint8_t>& bytes, const std::string& name);

}  // namespace kiln
