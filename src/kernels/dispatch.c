/* The public kernel functions: each calls the copy of the instruction set
 * that loom_cpu_isa() chose once per process (isa.h lists them). A call
 * costs one load and one branch more than a direct one. */
#include "isa.h"

LOOM_KERNELS_ISA_FNS(LOOM_ISA_DISPATCH_R, LOOM_ISA_DISPATCH_V)
