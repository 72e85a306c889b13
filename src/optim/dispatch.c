/* Gradient clipping and the optimizer updates: each calls the copy of the
 * instruction set that loom_cpu_isa() chose once per process (isa.h). */
#include "internal.h"

LOOM_OPTIM_ISA_FNS(LOOM_ISA_DISPATCH_R, LOOM_ISA_DISPATCH_V)
