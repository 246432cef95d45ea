// cpu_features.h — what this CPU can do, read once with cpuid, and the SIMD level kiln's CPU
// kernels may use (chapter 09).
//
// One binary runs on many CPUs: a laptop with AVX2 only, an AMD Zen 5 with AVX-512 and
// AVX512-BF16, an Intel Emerald Rapids with AVX512-FP16 and AMX tiles. The kernels that use an
// instruction set the compiler was not told about (-march) are compiled for it one function at
// a time (__attribute__((target(...)))), and are called only when the CPU reports it here.
//
// A feature counts only when both the CPU has it (cpuid) and the operating system saves its
// registers on a context switch (xgetbv reads XCR0): AVX needs XCR0 bits 1-2 (SSE, AVX
// state), AVX-512 also bits 5-7 (opmask, upper halves of zmm0-15, zmm16-31), AMX bits 17-18
// (tile configuration, tile data). Linux's /proc/cpuinfo follows the same rule, so its
// "flags" line names the same features (tests/test_cpu_features.cpp compares them).
//
// The level: the kernels are grouped by what they need,
//   portable   plain C++ (the compiler's own vectorization for the -march it was given)
//   avx2       AVX2 + FMA + F16C          (x86 since 2013-2015: Haswell, Zen)
//   avx512     AVX-512 F + BW             (Skylake-SP, Zen 4 and 5)
//   amx        AMX tiles with BF16        (Sapphire Rapids and later)
// cpu_level() is the best level the CPU supports, capped by the KILN_CPU environment variable
// (KILN_CPU=portable forces the portable code, to compare paths; a cap above what the CPU has
// changes nothing). A kernel takes the best version it has at or below cpu_level().
#pragma once
#include <cstdint>
#include <string>

namespace kiln {

struct CpuFeatures {
    std::string vendor;  // "AuthenticAMD", "GenuineIntel"; empty off x86
    std::string brand;   // "AMD EPYC 7B13", as cpuid's brand string says it
    bool avx2 = false, fma = false, f16c = false;
    bool avx512f = false, avx512bw = false, avx512_bf16 = false, avx512_fp16 = false;
    bool amx_tile = false, amx_bf16 = false, amx_int8 = false;
    // int8 dot products (chapter 11): vpdpbusd sums 4 u8×s8 products into each int32 lane, on
    // zmm (AVX512-VNNI: Ice Lake, Zen 4) or on ymm with a VEX encoding (AVX-VNNI: Alder Lake,
    // Sapphire Rapids, Zen 5).
    bool avx512_vnni = false, avx_vnni = false;
};

// This CPU's features, read on the first call.
const CpuFeatures& cpu_features();

// For logs: the brand and the features present, with /proc/cpuinfo's names:
// "AMD EPYC 7B13 · avx2 fma f16c" ("AMD EPYC 7B13 · none that kiln uses" without any).
std::string cpu_features_line();

// AMX tile data is off for every Linux process until it asks the kernel for it, once:
// arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA). Asks on the first call and remembers the
// answer; true when AMX instructions may run, false with `reason` set (no AMX on this CPU, not
// Linux, or the kernel refused) otherwise. An AMX kernel calls this before its first tile op.
bool amx_permission(std::string* reason = nullptr);

enum class CpuLevel : uint8_t { Portable, Avx2, Avx512, Amx };  // ordered: each needs the ones before

const char* cpu_level_name(CpuLevel level);  // "portable", "avx2", "avx512", "amx"
// The level named `name` (a cpu_level_name); a kiln::Error naming the choices otherwise.
// `what` says where the name came from, for the message ("KILN_CPU").
CpuLevel parse_cpu_level(const std::string& name, const char* what);

CpuLevel detected_cpu_level();  // the best level this CPU and OS support
CpuLevel cpu_level();           // min(detected_cpu_level(), the cap): what kernels use

// The cap starts as KILN_CPU (no cap when unset). Setting it lets a test or a benchmark run
// both paths in one process; returns the previous cap. Kernels read cpu_level() once per call.
CpuLevel set_cpu_level_cap(CpuLevel cap);

}  // namespace kiln
