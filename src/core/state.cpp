// state.cpp — StateDict's exact number formatting and its checked reads (see state.h).
#include "core/state.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "core/error.h"

namespace kiln {

namespace {

const std::string& find_value(const StateDict& s, const std::string& key) {
    auto it = s.values.find(key);
    KILN_CHECK(it != s.values.end(), "state: no value \"", key,
               "\" (the checkpoint was written by another program or another model?)");
    return it->second;
}

[[noreturn]] void malformed(const std::string& key, const std::string& text, const char* what) {
    KILN_FAIL("state: value \"", key, "\" should be ", what, " but is \"", text, "\" (the checkpoint is corrupt?)");
}

}  // namespace

void StateDict::set(const std::string& key, int64_t v) { values[key] = std::to_string(v); }
void StateDict::set_u64(const std::string& key, uint64_t v) { values[key] = std::to_string(v); }
void StateDict::set(const std::string& key, const std::string& v) { values[key] = v; }

void StateDict::set(const std::string& key, double v) {
    char text[64];
    std::snprintf(text, sizeof text, "%a", v);  // hex float: exact
    values[key] = text;
}

int64_t StateDict::get_int(const std::string& key) const {
    const std::string& text = find_value(*this, key);
    char* end = nullptr;
    errno = 0;
    long long v = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || errno != 0) malformed(key, text, "an integer");
    return v;
}

uint64_t StateDict::get_u64(const std::string& key) const {
    const std::string& text = find_value(*this, key);
    char* end = nullptr;
    errno = 0;
    unsigned long long v = std::strtoull(text.c_str(), &end, 10);
    if (text.empty() || text[0] == '-' || *end != '\0' || errno != 0) malformed(key, text, "an unsigned integer");
    return v;
}

double StateDict::get_double(const std::string& key) const {
    const std::string& text = find_value(*this, key);
    char* end = nullptr;
    double v = std::strtod(text.c_str(), &end);
    if (text.empty() || *end != '\0') malformed(key, text, "a number");
    return v;
}

namespace {

template <typename T>
[[noreturn]] void out_of_range(const std::string& key, T v, T lo, T hi) {
    KILN_FAIL("state: value \"", key, "\" is ", v, ", outside [", lo, ", ", hi,
              "] (the checkpoint is corrupt, or was edited by hand?)");
}

}  // namespace

int64_t StateDict::get_int(const std::string& key, int64_t lo, int64_t hi) const {
    const int64_t v = get_int(key);
    if (v < lo || v > hi) out_of_range(key, v, lo, hi);
    return v;
}

double StateDict::get_double(const std::string& key, double lo, double hi) const {
    const double v = get_double(key);
    if (!(v >= lo && v <= hi)) out_of_range(key, v, lo, hi);
    return v;
}

const std::string& StateDict::get_string(const std::string& key) const { return find_value(*this, key); }

void StateDict::put(const std::string& key, const Tensor& t) {
    KILN_CHECK(t.defined(), "state: tensor \"", key, "\" is undefined");
    tensors[key] = t.device() != Device::CPU ? t.to(Device::CPU) : share_cpu_tensors ? t : t.clone();
}

void StateDict::get_into(const std::string& key, Tensor& into) const {
    auto it = tensors.find(key);
    KILN_CHECK(it != tensors.end(), "state: no tensor \"", key,
               "\" (the checkpoint was written for another model or optimizer?)");
    const Tensor& t = it->second;
    KILN_CHECK(t.shape() == into.shape() && t.dtype() == into.dtype(), "state: tensor \"", key, "\" is ", t.desc(),
               " but the model expects ", into.desc(), " (a checkpoint of another model, or other widths?)");
    into.copy_from(t);
}

}  // namespace kiln
