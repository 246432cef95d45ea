// error.h — kiln's one way to report a problem: kiln::Error with file:line and a hint.
//
//   KILN_CHECK(cond, message...)   throws kiln::Error("file.cpp:42: <message>") when cond is false
//   KILN_FAIL(message...)          throws unconditionally
//   KILN_USAGE_CHECK(cond, message...)   throws kiln::UsageError("<message>"), without file:line:
//                                  for what the user typed (a flag, its value), whose fix is on
//                                  the command line, not in the code; the message names the flag
//
// The message parts are streamed, so shapes, dtypes and paths can be passed as they are:
//   KILN_CHECK(a.cols() == b.rows(), "gemm: inner sizes differ: A is ", a.shape_str(), ...);
// Say what was wrong, the values involved, and what to try.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace kiln {

struct Error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// A command line that cannot be run as typed: an unknown flag, a value out of range, flags that
// contradict each other. The message names the flag and says what to type instead.
struct UsageError : Error {
    using Error::Error;
};

// Raised when an allocator cannot satisfy a request (limit reached, arena full, system OOM).
struct OutOfMemory : Error {
    using Error::Error;
};

namespace detail {
template <typename... Parts>
std::string concat(const Parts&... parts) {
    std::ostringstream os;
    (os << ... << parts);
    return os.str();
}
template <typename... Parts>
[[noreturn]] void fail(const char* file, int line, const Parts&... parts) {
    throw Error(concat(file, ":", line, ": ", parts...));
}
}  // namespace detail

}  // namespace kiln

#define KILN_FAIL(...) ::kiln::detail::fail(__FILE__, __LINE__, __VA_ARGS__)
#define KILN_CHECK(cond, ...)                \
    do {                                     \
        if (!(cond)) KILN_FAIL(__VA_ARGS__); \
    } while (0)
#define KILN_USAGE_CHECK(cond, ...)                                                     \
    do {                                                                                \
        if (!(cond)) throw ::kiln::UsageError(::kiln::detail::concat(__VA_ARGS__));    \
    } while (0)
