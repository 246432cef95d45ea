// fixtures.h — helpers for tests that need small files on disk: a temporary folder removed
// at the end of the test, gzip compression, and a tar writer (so the readers in src/data/
// are tested against archives whose every byte the test controls); for the CUDA kernel
// tests, a run under each schedule of the kernel emulator; and for the CPU kernels, a run on
// each path the CPU can take.
#pragma once
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/cpu_features.h"
#include "core/tensor.h"
#include "data/image_set.h"
#include "nn/module.h"
#include "ops/autocast.h"

namespace kiln::test {

// A fresh folder under $TMPDIR (or /tmp), deleted with everything in it on destruction.
struct TempDir {
    TempDir();
    ~TempDir();
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
    std::string file(const std::string& name) const;  // path + "/" + name
    std::string path;
};

// The gradient pass of a training step as train_step runs it: zero_grad, forward, the
// cross-entropy loss against `labels`, backward (no gradient for the input). Returns the loss.
float forward_backward(Module& m, const Tensor& x, const Tensor& labels);

// Writes bytes to path, creating parent folders.
void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes);

// gzip (RFC 1952) of raw, as `gzip -c` would write it.
std::vector<uint8_t> gzip_bytes(const std::vector<uint8_t>& raw);

// One tar entry to write. type: '0' file, '5' directory, 'x' pax header (data = records).
struct TarFile {
    std::string path;
    std::vector<uint8_t> data;
    char type = '0';
};

// A ustar archive of files, with the two zero blocks at the end. A path longer than 99
// bytes is written the GNU way: a `././@LongLink` entry holding it, then the entry.
std::vector<uint8_t> make_tar(const std::vector<TarFile>& files);

// An IDX image file (MNIST's format): magic | N | H | W | pixels, the numbers big-endian u32.
std::vector<uint8_t> idx_images(uint32_t n, uint32_t h, uint32_t w, const std::vector<uint8_t>& px,
                                uint32_t magic = 2051);
// An IDX label file: magic | N | labels.
std::vector<uint8_t> idx_labels(const std::vector<uint8_t>& labels, uint32_t magic = 2049);

// Bytes of a string (for text files in archives).
std::vector<uint8_t> bytes_of(const std::string& s);

// A CPU f32 tensor of `shape` holding `values` (row-major), moved to `device`.
Tensor tensor_of(const Shape& shape, const std::vector<float>& values, Device device = Device::CPU);

// A copy of t on the cuda device (the emulator's memory without a GPU), for comparing a device
// result with the CPU's.
Tensor cuda_copy(const Tensor& t);
// cvt.rna.tf32.f32's value computed another way than core/dtype.h's f32_to_tf32, for normal x:
// x = f·2^e with |f| in [0.5, 1); f·2^11 rounded half away from zero (std::round) keeps 11
// significant bits (tf32's 10 and the implicit one).
float tf32_reference(float x);

// Runs f under each schedule the kernel emulator offers for a test: the threads of a block in
// order, in reverse, then shuffled (a seeded random order, new at every barrier) between
// barriers. A kernel missing a __syncthreads() reads shared memory before or after another
// thread writes it; in order hides reads of lower threads' words, reversed hides reads of higher
// ones, shuffled mixes both within one block. The schedule's name is the Catch2 context. With
// make CUDA=1, once, on the GPU.
void under_schedules(const std::function<void()>& f);

// A device result against the CPU's (both any device; compared on the CPU), REQUIREd, with the
// number of mismatches and the first one in the failure message:
//   require_close      f32, |got − want| ≤ tol · max |want| + abs for every element (a sum taken
//                      in another order is off by a few ulps of its largest terms; abs for
//                      functions accurate to an absolute error); NaN matches NaN
//   require_identical  the same bytes (any dtype): for kernels that must match bit for bit
//   require_identical_values  the same bytes (f32, f16, bf16), except that where want is a NaN
//                      got must be a NaN, any NaN: PyTorch propagates NaN but leaves its bits
//                      unspecified, and a GPU's arithmetic returns its own canonical NaN
//                      (gpu_nans below) where the CPU passes its operand's along
void require_close(const Tensor& got, const Tensor& want, double tol, double abs = 0.0);
// require_near       f32, |got − want| ≤ abs + rel · |want| element by element (rel = abs = 0: the
//                    same values); NaN matches NaN. For results whose error scales with each value.
void require_near(const Tensor& got, const Tensor& want, double rel = 0.0, double abs = 0.0);
void require_identical(const Tensor& got, const Tensor& want);
void require_identical_values(const Tensor& got, const Tensor& want);
// What require_identical_values found wrong ("" when nothing): the number of mismatches and the
// first one, with both bit patterns.
std::string identical_values_mismatch(const Tensor& got, const Tensor& want);
// Whether two CPU tensors hold the same bytes in the same shape and type (for CHECK and CHECK_FALSE;
// require_identical when a mismatch should stop the test and say where).
bool same_bits(const Tensor& a, const Tensor& b);

// Token ids i32 [B, T] on the CPU, uniform over a vocabulary of V (chapter 14's GPT's inputs).
Tensor random_ids(int64_t B, int64_t T, int64_t V, uint64_t seed);

// n random 1×28×28 images (bytes uniform over 0..255) with labels uniform over 10 classes named
// "0".."9": an MNIST-shaped set for training-loop tests.
ImageSet random_images(int64_t n, uint32_t seed);

// A copy of t (f32, f16 or bf16) with every NaN replaced by the NaN an NVIDIA GPU's arithmetic
// makes (f32 0x7fffffff, f16 and bf16 0x7fff): the emulator keeps the x86 CPU's NaN bits, so a
// test that compares with gpu_nans(result) checks on the emulator the contract a GPU run needs.
Tensor gpu_nans(const Tensor& t);

// What a tolerance needs from a 16-bit format (chapter 09's tests), read off float_format
// (core/dtype.h): u the unit roundoff, half the distance from 1 to the next value (f16 2^-11,
// bf16 2^-8); tiny half the smallest subnormal (f16 2^-25, bf16 2^-134).
struct LowFormat {
    DType dtype;
    double u;
    double tiny;
};
LowFormat low_format(DType t);

// The types an op's output and its dx come out in, run forward and backward on an input of type
// `in` (chapter 09's autocast checks).
struct AmpRun {
    DType y, dx;
};

// An op runs in its autocast class's type (ops/autocast.h), under an f16 scope: on f32 and f16
// inputs, the class's type; with the class overridden to F32, f32 on f16 inputs; overridden to
// LowPrecision, f16 on f32 inputs. An op that named another class, or none, fails here. Each op's
// own test file checks it (the autocast tests check each class through some of its ops).
void check_autocast_class(CastPolicy op_class, const std::function<AmpRun(DType in)>& run);

// A check this machine cannot run (a CPU without the instructions it needs): printed as
// "SKIPPED: <why>" and counted, so that the run's last line says "N skipped" (tests/main.cpp,
// tests/run.sh) instead of passing a check that never ran. The caller then returns or goes on
// without it.
void skip(const std::string& why);
int skipped_checks();  // how many skip() calls this run made

// The CPU levels (core/cpu_features.h) this CPU can run, lowest first: portable, then avx2
// and avx512 where it has them.
std::vector<CpuLevel> runnable_levels();

// The runnable levels whose GEMM micro-kernel fuses each multiply-add (ops/cpu/gemm_tile.h): they
// give the same bits. A portable kernel compiled without FMA (make SAN=1) rounds twice.
std::vector<CpuLevel> fused_gemm_levels();

// Runs f once with each of `levels` as the cap (what KILN_CPU sets), and returns the results.
template <typename F>
auto under_levels(const std::vector<CpuLevel>& levels, F f) {
    std::vector<decltype(f())> results;
    for (CpuLevel level : levels) {
        const CpuLevel before = set_cpu_level_cap(level);
        results.push_back(f());
        set_cpu_level_cap(before);
    }
    return results;
}

template <typename F>
auto under_each_level(F f) {
    return under_levels(runnable_levels(), f);
}

// bf16 GEMMs on the model of AMX's tiles (ops/cpu/gemm_tile.h) while this lives, even when a check
// fails, then as before.
class AmxEmulation {
public:
    AmxEmulation();
    ~AmxEmulation();
    AmxEmulation(const AmxEmulation&) = delete;
    AmxEmulation& operator=(const AmxEmulation&) = delete;

private:
    bool before_;
};

// n values of T (f16, bf16, float), uniform in [-2, 2] before rounding to T.
template <typename T>
std::vector<T> random_lowp(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
    std::vector<T> v(n);
    for (T& x : v) x = T(dist(rng));
    return v;
}

}  // namespace kiln::test
