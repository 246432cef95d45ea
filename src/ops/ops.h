// ops.h — the everyday ops in one include: the elementwise family (fill_, add, relu, gelu,
// dropout, ...: ops/elementwise.h), the reduce family (add_bias_, sum, argmax_rows, ...:
// ops/reduce.h) and the gemm family (matmul, linear: ops/gemm.h), which nearly every layer,
// optimizer and trainer calls. Each family's header holds its kernels' contract and its ops; a
// file that needs only one family may include that header alone.
#pragma once
#include "ops/elementwise.h"
#include "ops/gemm.h"
#include "ops/reduce.h"
