// ops.cpp — where the ops of every family header (src/ops/<family>.h) are compiled, once: each
// header defines its ops under KILN_DEFINE_OPS, which only this file defines (the stb-style
// "implementation macro"), so the files that call an op compile a declaration only.
#define KILN_DEFINE_OPS
#include "ops/attention.h"
#include "ops/conv.h"
#include "ops/elementwise.h"
#include "ops/gemm.h"
#include "ops/loss.h"
#include "ops/norm.h"
#include "ops/optim.h"
#include "ops/pool.h"
#include "ops/quant.h"
#include "ops/reduce.h"
#include "ops/sparse.h"
