// check.cpp — check_args and check_f32_args (check.h).
#include "ops/check.h"

namespace kiln {

// a is on first's device, or the error names both and says how to move one.
static void check_device(const char* op, const Arg& a, const Arg& first) {
    KILN_CHECK(a.t.device() == first.t.device(), op, ": '", a.name, "' is on ", device_name(a.t.device()), " but '",
               first.name, "' is on ", device_name(first.t.device()),
               ": an op reads all its tensors on one device; move one with .to(Device::",
               first.t.device() == Device::CUDA ? "CUDA" : "CPU", ")");
}

Device check_args(const char* op, std::initializer_list<Arg> args) {
    const Arg& first = *args.begin();
    for (const Arg& a : args) {
        check_defined(a.t, op, a.name);
        const DType dt = a.t.dtype();
        KILN_CHECK(dt == DType::F32 || dt == DType::F16 || dt == DType::BF16, op, ": '", a.name, "' is ", a.t.desc(),
                   "; f32, f16 and bf16 are supported");
        KILN_CHECK(dt == first.t.dtype(), op, ": '", a.name, "' is ", a.t.desc(), " but '", first.name, "' is ",
                   first.t.desc(), "; convert one with .to(DType::...)");
        check_device(op, a, first);
    }
    return first.t.device();
}

void check_f32_args(const char* op, const Arg& like, std::initializer_list<Arg> args) {
    for (const Arg& a : args) {
        check_defined(a.t, op, a.name);
        KILN_CHECK(a.t.dtype() == DType::F32, op, ": '", a.name, "' is ", a.t.desc(),
                   " but should be f32: a norm keeps its parameters and statistics in f32 whatever the type of '",
                   like.name, "' (here ", dtype_name(like.t.dtype()), "); convert it with .to(DType::F32)");
        check_device(op, a, like);
    }
}

}  // namespace kiln
