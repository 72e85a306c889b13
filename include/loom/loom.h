/* loom: the whole public API. */
#ifndef LOOM_LOOM_H
#define LOOM_LOOM_H

#include "loom/ckpt.h"
#include "loom/comm.h"
#include "loom/config.h"
#include "loom/core.h"
#include "loom/data.h"
#include "loom/kernels.h"
#include "loom/nn.h"
#include "loom/obs.h"
#include "loom/optim.h"
#include "loom/parallel.h"
#include "loom/train.h"

#endif
