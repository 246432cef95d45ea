// rng.h — a counter-based random number generator.
//
// The n-th number of a stream is a pure function of (seed, n): hash(seed, n). So a tensor of
// N random values can be filled by any number of threads in any order and come out the same:
// kiln's results depend on the seed, never on the thread count.
// The hash is SplitMix64 (Steele, Lea, Flood 2014), which passes BigCrush.
#pragma once
#include <cmath>
#include <cstdint>

// The hash and to_unit are also called from CUDA kernels (cuda/norm.cu: dropout draws the
// CPU's mask bit for bit), so nvcc compiles them for both sides. g++ — the CPU build and the
// kernel emulator — sees plain inline functions.
#if defined(__CUDACC__)
#define KILN_HOST_DEVICE __host__ __device__
#else
#define KILN_HOST_DEVICE
#endif

namespace kiln {

KILN_HOST_DEVICE inline uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

class Rng {
public:
    explicit Rng(uint64_t seed = 0) : seed_(splitmix64(seed)) {}

    // The i-th value of this stream, without consuming anything.
    uint64_t at(uint64_t i) const { return splitmix64(seed_ ^ splitmix64(i)); }
    // uniform in [0, 1) with 24 random bits (every value exactly representable in f32)
    KILN_HOST_DEVICE static float to_unit(uint64_t bits) { return float(bits >> 40) * (1.0f / 16777216.0f); }

    uint64_t next_u64() { return at(counter_++); }
    uint64_t next_below(uint64_t n) { return next_u64() % n; }  // bias < n / 2^64, negligible

    // Reserves n consecutive counters and returns the first: values at(first + k), k < n.
    uint64_t take(uint64_t n) { uint64_t first = counter_; counter_ += n; return first; }

    uint64_t counter() const { return counter_; }
    void set_counter(uint64_t c) { counter_ = c; }
    uint64_t seed_hash() const { return seed_; }
    // For checkpoints: the stream continues exactly where (seed_hash, counter) left it.
    void set_state(uint64_t seed_hash, uint64_t counter) {
        seed_ = seed_hash;
        counter_ = counter;
    }

private:
    uint64_t seed_;
    uint64_t counter_ = 0;
};

// Box–Muller: two independent uniforms u1, u2 in (0, 1] give a standard normal
//   z = sqrt(-2 ln u1) · cos(2π u2)
inline float normal_from(uint64_t bits1, uint64_t bits2) {
    float u1 = 1.0f - Rng::to_unit(bits1);  // (0, 1]: log is finite
    float u2 = Rng::to_unit(bits2);
    return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.283185307179586f * u2);
}

}  // namespace kiln
