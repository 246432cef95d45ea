// nn.cpp — where the members of the layers written whole in their family's header (nn/norm.h,
// nn/pool.h) are compiled, once: such a header defines its layers' members under
// KILN_DEFINE_LAYERS, which only this file defines, so a file that builds a network compiles
// the classes' declarations only (src/ops/ops.cpp does the same for the ops, with KILN_DEFINE_OPS).
#define KILN_DEFINE_LAYERS
#include "nn/norm.h"
#include "nn/pool.h"
