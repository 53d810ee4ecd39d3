/*
 * internal.h — kernels-private declarations shared between ref.c, dispatch.c and the per-ISA
 * files (libuv's uv__ habit: kern__ names never leave this folder).
 */
#ifndef CLOCHER_KERNELS_INTERNAL_H
#define CLOCHER_KERNELS_INTERNAL_H

#include "kern.h"

typedef void kern__matmul_fn(enum dtype wt, const void *w, size_t cols, const float *x,
                             size_t n, float *y, size_t ldy, size_t r0, size_t r1);

#endif
