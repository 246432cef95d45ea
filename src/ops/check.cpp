// check.cpp — check_args (check.h).
#include "ops/check.h"

namespace kiln {

static bool instantiated(DType dt, KernelTypes types) {
    if (dt == DType::F32) return true;
    return types == KernelTypes::Floats && (dt == DType::F16 || dt == DType::BF16);
}

Device check_args(const char* op, std::initializer_list<Arg> args, KernelTypes types) {
    const Arg& first = *args.begin();
    for (const Arg& a : args) {
        check_defined(a.t, op, a.name);
        const DType dt = a.t.dtype();
        if (types == KernelTypes::F32Only) {
            KILN_CHECK(dt != DType::F16 && dt != DType::BF16, op, ": '", a.name, "' is ", a.t.desc(), ", and ", op,
                       " does not support ", dtype_name(dt), " yet (chapter 09 adds f16 and bf16): convert it to f32");
            check_dtype(a.t, DType::F32, op, a.name);
        } else {
            KILN_CHECK(instantiated(dt, types), op, ": '", a.name, "' is ", a.t.desc(),
                       "; f32, f16 and bf16 are supported");
        }
        KILN_CHECK(dt == first.t.dtype(), op, ": '", a.name, "' is ", a.t.desc(), " but '", first.name, "' is ",
                   first.t.desc(), "; convert one with .to(DType::...)");
        KILN_CHECK(a.t.device() == first.t.device(), op, ": '", a.name, "' is on ", device_name(a.t.device()),
                   " but '", first.name, "' is on ", device_name(first.t.device()),
                   ": an op reads all its tensors on one device; move one with .to(Device::",
                   first.t.device() == Device::CUDA ? "CUDA" : "CPU", ")");
    }
    return first.t.device();
}

}  // namespace kiln
