// params.cpp — the two helpers of params.h that both backends' kernels share.
#include "ops/params.h"

#include "core/error.h"

namespace kiln {

const char* conv_algo_name(ConvAlgo a) {
    switch (a) {
        case ConvAlgo::Im2col: return "im2col";
        case ConvAlgo::Pointwise: return "pointwise";
        case ConvAlgo::Depthwise: return "depthwise";
        case ConvAlgo::ImplicitGemm: return "implicit-gemm";
        case ConvAlgo::Winograd: return "winograd";
    }
    return "?";
}

void check_conv2d_params(const Conv2dParams& p, const char* op) {
    KILN_CHECK(p.N >= 0 && p.C > 0 && p.H > 0 && p.W > 0 && p.O > 0 && p.KH > 0 && p.KW > 0 && p.stride > 0 &&
                   p.padding >= 0 && p.dilation > 0 && p.groups > 0,
               op, ": bad sizes N=", p.N, " C=", p.C, " H=", p.H, " W=", p.W, " O=", p.O, " K=", p.KH, "x", p.KW,
               " stride=", p.stride, " padding=", p.padding, " dilation=", p.dilation, " groups=", p.groups);
    KILN_CHECK(p.C % p.groups == 0 && p.O % p.groups == 0, op, ": groups=", p.groups, " must divide C=", p.C,
               " and O=", p.O);
    KILN_CHECK(p.P() > 0 && p.Q() > 0, op, ": a ", p.KH, "x", p.KW, " kernel (dilation ", p.dilation,
               ") does not fit a ", p.H, "x", p.W, " input with padding ", p.padding);
}

}  // namespace kiln
