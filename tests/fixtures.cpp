// fixtures.cpp — see fixtures.h.
#include "fixtures.h"

#include "core/rng.h"
#include "ops/cpu/gemm_tile.h"

#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <stdexcept>

#include <catch2/catch.hpp>

#include "nn/layers.h"  // CrossEntropyLoss, for forward_backward

#ifndef KILN_CUDA
#include "kiln_cuda.h"  // the emulator's schedule switch (g++ build only)
#endif

namespace kiln::test {

float forward_backward(Module& m, const Tensor& x, const Tensor& labels) {
    m.input_needs_grad = false;
    m.zero_grad();
    CrossEntropyLoss criterion;
    const float loss = criterion.forward(m.call(x), labels);
    m.call_backward(criterion.backward());
    return loss;
}

namespace fs = std::filesystem;

TempDir::TempDir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/kiln-test-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (!mkdtemp(buf.data())) throw std::runtime_error("mkdtemp failed for " + tmpl);
    path = buf.data();
}

TempDir::~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
}

std::string TempDir::file(const std::string& name) const { return path + "/" + name; }

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
    const fs::path p(path);
    if (p.has_parent_path()) fs::create_directories(p.parent_path());
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) throw std::runtime_error("cannot write " + path);
    const size_t n = bytes.empty() ? 0 : std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
    if (n != bytes.size()) throw std::runtime_error("short write to " + path);
}

std::vector<uint8_t> gzip_bytes(const std::vector<uint8_t>& raw) {
    z_stream zs{};
    if (deflateInit2(&zs, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) != Z_OK)
        throw std::runtime_error("deflateInit2 failed");
    std::vector<uint8_t> out(deflateBound(&zs, uLong(raw.size())) + 32);
    zs.next_in = const_cast<Bytef*>(raw.data());
    zs.avail_in = uInt(raw.size());
    zs.next_out = out.data();
    zs.avail_out = uInt(out.size());
    const int rc = deflate(&zs, Z_FINISH);
    out.resize(zs.total_out);
    deflateEnd(&zs);
    if (rc != Z_STREAM_END) throw std::runtime_error("deflate failed");
    return out;
}

namespace {

void put_str(uint8_t* h, size_t off, size_t len, const std::string& s) {
    std::memcpy(h + off, s.data(), std::min(len, s.size()));
}

void put_octal(uint8_t* h, size_t off, size_t len, uint64_t v) {
    // len-1 octal digits, zero padded, then NUL
    char buf[32];
    std::snprintf(buf, sizeof buf, "%0*llo", int(len - 1), static_cast<unsigned long long>(v));
    std::memcpy(h + off, buf, len - 1);
    h[off + len - 1] = 0;
}

void append_entry(std::vector<uint8_t>& out, const std::string& name, char type, const std::vector<uint8_t>& data) {
    uint8_t h[512] = {};
    put_str(h, 0, 100, name);
    put_octal(h, 100, 8, type == '5' ? 0755 : 0644);
    put_octal(h, 108, 8, 0);
    put_octal(h, 116, 8, 0);
    put_octal(h, 124, 12, data.size());
    put_octal(h, 136, 12, 1700000000);
    h[156] = uint8_t(type);
    std::memcpy(h + 257, "ustar\0" "00", 8);
    put_str(h, 265, 32, "kiln");
    put_str(h, 297, 32, "kiln");
    std::memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (uint8_t b : h) sum += b;
    char buf[8];
    std::snprintf(buf, sizeof buf, "%06o", sum);  // 6 digits, NUL, space
    std::memcpy(h + 148, buf, 6);
    h[154] = 0;
    h[155] = ' ';
    out.insert(out.end(), h, h + 512);
    out.insert(out.end(), data.begin(), data.end());
    out.resize((out.size() + 511) / 512 * 512, 0);
}

}  // namespace

std::vector<uint8_t> make_tar(const std::vector<TarFile>& files) {
    std::vector<uint8_t> out;
    for (const TarFile& f : files) {
        if (f.path.size() > 99) {
            std::vector<uint8_t> name(f.path.begin(), f.path.end());
            name.push_back(0);
            append_entry(out, "././@LongLink", 'L', name);
        }
        append_entry(out, f.path.substr(0, 99), f.type, f.data);
    }
    out.resize(out.size() + 1024, 0);
    return out;
}

static void put_be32(std::vector<uint8_t>& out, uint32_t v) {
    for (int s = 24; s >= 0; s -= 8) out.push_back(uint8_t(v >> s));
}

std::vector<uint8_t> idx_images(uint32_t n, uint32_t h, uint32_t w, const std::vector<uint8_t>& px, uint32_t magic) {
    std::vector<uint8_t> out;
    put_be32(out, magic);
    put_be32(out, n);
    put_be32(out, h);
    put_be32(out, w);
    out.insert(out.end(), px.begin(), px.end());
    return out;
}

std::vector<uint8_t> idx_labels(const std::vector<uint8_t>& labels, uint32_t magic) {
    std::vector<uint8_t> out;
    put_be32(out, magic);
    put_be32(out, uint32_t(labels.size()));
    out.insert(out.end(), labels.begin(), labels.end());
    return out;
}

std::vector<uint8_t> bytes_of(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

float tf32_reference(float x) {
    int e;
    const double f = std::frexp(double(x), &e);
    return float(std::ldexp(std::round(std::ldexp(f, 11)), e - 11));
}

Tensor cuda_copy(const Tensor& t) { return t.to(Device::CUDA); }

void under_schedules(const std::function<void()>& f) {
#ifndef KILN_CUDA
    for (emu::Schedule s : {emu::Schedule::InOrder, emu::Schedule::Reverse, emu::Schedule::Shuffle}) {
        emu::ScopedSchedule scope(s);
        INFO("emulator schedule: " << emu::schedule_name(s));
        f();
    }
#else
    f();
#endif
}

void require_close(const Tensor& got_any, const Tensor& want_any, double tol, double abs) {
    const Tensor got = got_any.to(Device::CPU), want = want_any.to(Device::CPU);
    REQUIRE(got.shape() == want.shape());
    const float* g = got.data<float>();
    const float* w = want.data<float>();
    double largest = 0.0;
    for (int64_t i = 0; i < want.numel(); i++)
        if (std::isfinite(w[i])) largest = std::max(largest, std::fabs(double(w[i])));
    const double allowed = tol * largest + abs;
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < want.numel(); i++) {
        const bool ok = g[i] == w[i] /* equal infinities too */ || (std::isnan(g[i]) && std::isnan(w[i])) ||
                        std::fabs(double(g[i]) - double(w[i])) <= allowed;
        if (!ok && bad++ == 0) first = i;
    }
    std::ostringstream msg;
    if (bad)
        msg << bad << " of " << want.numel() << " values differ by more than " << allowed << "; the first at " << first
            << ": got " << g[first] << ", want " << w[first];
    INFO(msg.str());
    REQUIRE(bad == 0);
}

void require_near(const Tensor& got_any, const Tensor& want_any, double rel, double abs) {
    const Tensor got = got_any.to(Device::CPU), want = want_any.to(Device::CPU);
    REQUIRE(got.shape() == want.shape());
    const float* g = got.data<float>();
    const float* w = want.data<float>();
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < want.numel(); i++) {
        const bool ok = (std::isnan(w[i]) && std::isnan(g[i])) ||
                        std::fabs(double(g[i]) - double(w[i])) <= abs + rel * std::fabs(double(w[i]));
        if (!ok && bad++ == 0) first = i;
    }
    std::ostringstream msg;
    if (bad) msg << bad << " mismatches; the first at " << first << ": got " << g[first] << ", want " << w[first];
    INFO(msg.str());
    REQUIRE(bad == 0);
}

bool same_bits(const Tensor& a, const Tensor& b) {
    return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

Tensor random_ids(int64_t B, int64_t T, int64_t V, uint64_t seed) {
    Rng rng(seed);
    Tensor ids = Tensor::empty({B, T}, DType::I32);
    for (int64_t i = 0; i < B * T; i++) ids.data<int32_t>()[i] = int32_t(rng.next_below(uint64_t(V)));
    return ids;
}

ImageSet random_images(int64_t n, uint32_t seed) {
    ImageSet set;
    set.n = n, set.c = 1, set.h = 28, set.w = 28;
    std::mt19937 gen(seed);
    set.pixels.resize(size_t(n * 28 * 28));
    for (auto& p : set.pixels) p = uint8_t(gen() & 0xFF);
    for (int64_t i = 0; i < n; i++) set.labels.push_back(int32_t(gen() % 10));
    for (int c = 0; c < 10; c++) set.classes.push_back(std::to_string(c));
    return set;
}

Tensor tensor_of(const Shape& shape, const std::vector<float>& values, Device device) {
    REQUIRE(int64_t(values.size()) == shape.numel());
    Tensor t = Tensor::empty(shape);
    std::copy(values.begin(), values.end(), t.data<float>());
    return t.to(device);
}

void require_identical(const Tensor& got_any, const Tensor& want_any) {
    const Tensor got = got_any.to(Device::CPU), want = want_any.to(Device::CPU);
    REQUIRE(got.shape() == want.shape());
    REQUIRE(got.dtype() == want.dtype());
    const size_t width = dtype_size(got.dtype());
    const auto* g = static_cast<const uint8_t*>(got.raw());
    const auto* w = static_cast<const uint8_t*>(want.raw());
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < want.numel(); i++)
        if (std::memcmp(g + size_t(i) * width, w + size_t(i) * width, width) != 0 && bad++ == 0) first = i;
    std::ostringstream msg;
    if (bad)
        msg << bad << " of " << want.numel() << " " << dtype_name(got.dtype()) << " values differ; the first at "
            << first << ": got " << got.to(DType::F32).data<float>()[first] << ", want "
            << want.to(DType::F32).data<float>()[first];
    INFO(msg.str());
    REQUIRE(bad == 0);
}

namespace {
// Element i of a CPU tensor of f32, f16 or bf16 as float (a NaN stays a NaN), and its bits.
float float_at(const Tensor& t, int64_t i) {
    switch (t.dtype()) {
    case DType::F16: return float(t.data<f16>()[i]);
    case DType::BF16: return float(t.data<bf16>()[i]);
    default: return t.data<float>()[i];
    }
}
uint32_t bits_at(const Tensor& t, int64_t i) {
    uint32_t bits = 0;
    std::memcpy(&bits, static_cast<const uint8_t*>(t.raw()) + size_t(i) * dtype_size(t.dtype()), dtype_size(t.dtype()));
    return bits;
}
}  // namespace

std::string identical_values_mismatch(const Tensor& got_any, const Tensor& want_any) {
    const Tensor got = got_any.to(Device::CPU), want = want_any.to(Device::CPU);
    if (got.shape() != want.shape() || got.dtype() != want.dtype())
        return "got " + got.desc() + ", want " + want.desc();
    if (want.dtype() != DType::F32 && want.dtype() != DType::F16 && want.dtype() != DType::BF16)
        return "require_identical_values compares f32, f16 or bf16, not " + want.desc();
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < want.numel(); i++) {
        const bool ok = std::isnan(float_at(want, i)) ? std::isnan(float_at(got, i)) : bits_at(got, i) == bits_at(want, i);
        if (!ok && bad++ == 0) first = i;
    }
    if (bad == 0) return "";
    std::ostringstream msg;
    msg << bad << " of " << want.numel() << " " << dtype_name(want.dtype()) << " values differ (NaN matches any NaN); the "
        << "first at " << first << ": got " << float_at(got, first) << " (bits 0x" << std::hex << bits_at(got, first)
        << "), want " << float_at(want, first) << " (bits 0x" << bits_at(want, first) << ")";
    return msg.str();
}

void require_identical_values(const Tensor& got, const Tensor& want) {
    const std::string mismatch = identical_values_mismatch(got, want);
    INFO(mismatch);
    REQUIRE(mismatch.empty());
}

Tensor gpu_nans(const Tensor& t_any) {
    Tensor t = t_any.to(Device::CPU).clone();
    const size_t width = dtype_size(t.dtype());
    const uint32_t nan = t.dtype() == DType::F32 ? 0x7fffffffu : 0x7fffu;
    for (int64_t i = 0; i < t.numel(); i++)
        if (std::isnan(float_at(t, i))) std::memcpy(static_cast<uint8_t*>(t.raw()) + size_t(i) * width, &nan, width);
    return t;
}

LowFormat low_format(DType t) {
    const FloatFormat f = float_format(t);
    return {t, f.epsilon / 2, f.min_subnormal / 2};
}

static std::atomic<int> g_skipped{0};

void check_autocast_class(CastPolicy op_class, const std::function<AmpRun(DType in)>& run) {
    AutocastScope amp(DType::F16);
    for (DType in : {DType::F32, DType::F16}) {
        INFO("input " << dtype_name(in));
        const DType want = autocast_target(op_class, in, in);
        const AmpRun got = run(in);
        CHECK(got.y == want);
        CHECK(got.dx == want);
    }
    {
        CastPolicyOverride f32(op_class, CastPolicy::F32);
        const AmpRun got = run(DType::F16);
        CHECK(got.y == DType::F32);
        CHECK(got.dx == DType::F32);
    }
    {
        CastPolicyOverride low(op_class, CastPolicy::LowPrecision);
        const AmpRun got = run(DType::F32);
        CHECK(got.y == DType::F16);
        CHECK(got.dx == DType::F16);
    }
}

void skip(const std::string& why) {
    g_skipped.fetch_add(1);
    WARN("SKIPPED: " << why);
}

int skipped_checks() { return g_skipped.load(); }

std::vector<CpuLevel> runnable_levels() {
    std::vector<CpuLevel> levels{CpuLevel::Portable};
    for (CpuLevel level : {CpuLevel::Avx2, CpuLevel::Avx512})
        if (detected_cpu_level() >= level) levels.push_back(level);
    if (levels.size() == 1) skip("this CPU has no AVX2 + FMA + F16C: only the portable kernels are checked");
    return levels;
}

std::vector<CpuLevel> fused_gemm_levels() {
    std::vector<CpuLevel> levels;
    for (CpuLevel level : runnable_levels())
        if (cpu::micro_kernel(level).fused) levels.push_back(level);
    return levels;
}

AmxEmulation::AmxEmulation() : before_(cpu::set_amx_emulation(true)) {}
AmxEmulation::~AmxEmulation() { cpu::set_amx_emulation(before_); }

}  // namespace kiln::test
