// cpu_features.cpp — cpuid, xgetbv and the KILN_CPU cap (see cpu_features.h).
//
// cpuid(leaf, subleaf) fills four registers; the bits kiln reads (Intel SDM vol. 2, CPUID):
//   leaf 0            vendor string in EBX, EDX, ECX
//   leaf 1       ECX  bit 12 FMA, 27 OSXSAVE (xgetbv usable), 29 F16C
//   leaf 7.0     EBX  bit 5 AVX2, 16 AVX512F, 30 AVX512BW
//                ECX  bit 11 AVX512-VNNI
//                EDX  bit 22 AMX-BF16, 23 AVX512-FP16, 24 AMX-TILE, 25 AMX-INT8
//   leaf 7.1     EAX  bit 4 AVX-VNNI, 5 AVX512-BF16
//   leaves 0x80000002-4   the brand string, 48 characters
#include "core/cpu_features.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define KILN_X86 1
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace kiln {
namespace {

#if defined(KILN_X86)
struct Regs {
    uint32_t eax = 0, ebx = 0, ecx = 0, edx = 0;
};

Regs cpuid(uint32_t leaf, uint32_t subleaf) {
    Regs r;
    __cpuid_count(leaf, subleaf, r.eax, r.ebx, r.ecx, r.edx);
    return r;
}

bool bit(uint32_t reg, int n) { return (reg >> n) & 1u; }

// XCR0: which register states the OS saves. Only readable when cpuid says OSXSAVE.
uint64_t xcr0() {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (uint64_t(hi) << 32) | lo;
}

std::string text_of(const uint32_t* words, int count) {
    std::string s(reinterpret_cast<const char*>(words), 4 * static_cast<size_t>(count));
    s = s.substr(0, s.find('\0'));
    const size_t first = s.find_first_not_of(' '), last = s.find_last_not_of(' ');
    return first == std::string::npos ? "" : s.substr(first, last - first + 1);
}

CpuFeatures read_features() {
    CpuFeatures f;
    const Regs l0 = cpuid(0, 0);
    const uint32_t vendor[3] = {l0.ebx, l0.edx, l0.ecx};
    f.vendor = text_of(vendor, 3);
    if (cpuid(0x80000000u, 0).eax >= 0x80000004u) {
        uint32_t brand[12];
        for (uint32_t i = 0; i < 3; ++i) {
            const Regs r = cpuid(0x80000002u + i, 0);
            brand[4 * i] = r.eax, brand[4 * i + 1] = r.ebx, brand[4 * i + 2] = r.ecx, brand[4 * i + 3] = r.edx;
        }
        f.brand = text_of(brand, 12);
    }
    const uint32_t max_leaf = l0.eax;
    const Regs l1 = cpuid(1, 0);
    const uint64_t os = bit(l1.ecx, 27) ? xcr0() : 0;
    const bool os_avx = (os & 0x6) == 0x6;               // bits 1-2: SSE and AVX state
    const bool os_avx512 = os_avx && (os & 0xe0) == 0xe0;  // bits 5-7: opmask, zmm
    const bool os_amx = (os & 0x60000) == 0x60000;       // bits 17-18: tile config, tile data
    f.fma = os_avx && bit(l1.ecx, 12);
    f.f16c = os_avx && bit(l1.ecx, 29);
    if (max_leaf >= 7) {
        const Regs l7 = cpuid(7, 0);
        f.avx2 = os_avx && bit(l7.ebx, 5);
        f.avx512f = os_avx512 && bit(l7.ebx, 16);
        f.avx512bw = os_avx512 && bit(l7.ebx, 30);
        f.avx512_fp16 = os_avx512 && bit(l7.edx, 23);
        f.avx512_vnni = os_avx512 && bit(l7.ecx, 11);
        f.amx_bf16 = os_amx && bit(l7.edx, 22);
        f.amx_tile = os_amx && bit(l7.edx, 24);
        f.amx_int8 = os_amx && bit(l7.edx, 25);
        if (l7.eax >= 1) {  // leaf 7's EAX: its highest subleaf
            const Regs l71 = cpuid(7, 1);
            f.avx_vnni = os_avx && bit(l71.eax, 4);
            f.avx512_bf16 = os_avx512 && bit(l71.eax, 5);
        }
    }
    return f;
}
#else
CpuFeatures read_features() { return {}; }  // not x86: the portable kernels only
#endif

CpuLevel level_of(const CpuFeatures& f) {
    const bool avx2 = f.avx2 && f.fma && f.f16c;
    const bool avx512 = avx2 && f.avx512f && f.avx512bw;
    if (avx512 && f.amx_tile && f.amx_bf16) return CpuLevel::Amx;
    if (avx512) return CpuLevel::Avx512;
    return avx2 ? CpuLevel::Avx2 : CpuLevel::Portable;
}

// The cap: KILN_CPU when set, else none (the highest level).
std::atomic<CpuLevel>& cap() {
    static std::atomic<CpuLevel> value{[] {
        const char* env = std::getenv("KILN_CPU");
        return env && *env ? parse_cpu_level(env, "KILN_CPU") : CpuLevel::Amx;
    }()};
    return value;
}

}  // namespace

const CpuFeatures& cpu_features() {
    static const CpuFeatures features = read_features();
    return features;
}

std::string cpu_features_line() {
    const CpuFeatures& f = cpu_features();
    const std::pair<bool, const char*> flags[] = {
        {f.avx2, "avx2"},         {f.fma, "fma"},           {f.f16c, "f16c"},
        {f.avx512f, "avx512f"},   {f.avx512bw, "avx512bw"}, {f.avx512_bf16, "avx512_bf16"},
        {f.avx512_fp16, "avx512_fp16"}, {f.amx_tile, "amx_tile"}, {f.amx_bf16, "amx_bf16"},
        {f.amx_int8, "amx_int8"}, {f.avx512_vnni, "avx512_vnni"}, {f.avx_vnni, "avx_vnni"}};
    std::string present;
    for (const auto& [has, name] : flags)
        if (has) present += (present.empty() ? "" : " ") + std::string(name);
    const std::string brand = f.brand.empty() ? (f.vendor.empty() ? "unknown CPU" : f.vendor) : f.brand;
    return brand + " · " + (present.empty() ? "none that kiln uses" : present);
}

bool amx_permission(std::string* reason) {
    struct Answer {
        bool granted;
        std::string why;
    };
    static const Answer answer = []() -> Answer {
        if (!cpu_features().amx_tile)
            return {false, "this CPU (" + cpu_features_line() + ") has no AMX tiles, or the OS does "
                           "not save their state (XCR0 bits 17-18)"};
#if defined(__linux__) && defined(KILN_X86)
        constexpr int kArchReqXcompPerm = 0x1023;  // <asm/prctl.h>: ARCH_REQ_XCOMP_PERM
        constexpr int kXfeatureXtiledata = 18;     // the tile data state component
        if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0)
            return {false, std::string("the kernel refused AMX tile data (arch_prctl "
                                       "ARCH_REQ_XCOMP_PERM: ") + std::strerror(errno) +
                               "); Linux 5.16 or later grants it"};
        return {true, ""};
#else
        return {false, "asking for AMX tile data is written for Linux only (arch_prctl)"};
#endif
    }();
    if (reason) *reason = answer.why;
    return answer.granted;
}

const char* cpu_level_name(CpuLevel level) {
    switch (level) {
        case CpuLevel::Portable: return "portable";
        case CpuLevel::Avx2: return "avx2";
        case CpuLevel::Avx512: return "avx512";
        case CpuLevel::Amx: return "amx";
    }
    return "?";
}

CpuLevel parse_cpu_level(const std::string& name, const char* what) {
    for (CpuLevel l : {CpuLevel::Portable, CpuLevel::Avx2, CpuLevel::Avx512, CpuLevel::Amx})
        if (name == cpu_level_name(l)) return l;
    KILN_FAIL(what, "='", name, "' is not a CPU level: use portable, avx2, avx512 or amx (the "
              "highest SIMD level kiln's CPU kernels may use; this CPU supports up to ",
              cpu_level_name(detected_cpu_level()), ")");
}

CpuLevel detected_cpu_level() {
    static const CpuLevel level = level_of(cpu_features());
    return level;
}

CpuLevel cpu_level() { return std::min(detected_cpu_level(), cap().load(std::memory_order_relaxed)); }

CpuLevel set_cpu_level_cap(CpuLevel level) { return cap().exchange(level); }

}  // namespace kiln
