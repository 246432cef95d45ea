// all.h — every op family's header (src/ops/<family>.h: a family's kernel contract and its ops)
// and the conversions (core/convert.h): what the tests, the benchmarks and the kernel lab include
// to call cpu:: and cuda:: kernels directly. The engine's own files include only the families
// they use.
#pragma once
#include "core/convert.h"
#include "ops/attention.h"
#include "ops/augment.h"
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
