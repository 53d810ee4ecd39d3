/*
 * matmul_internal.h — what matmul.c (single and grouped products) and matmul_lora.c (the
 * group fused with the LoRA update) share: the product dispatch of one row range, the table
 * of a group's distinct inputs, the scratch's growth. Private to worker/model.
 */
#ifndef CLOCHER_WORKER_MATMUL_INTERNAL_H
#define CLOCHER_WORKER_MATMUL_INTERNAL_H

#include "kern.h"
#include "matmul.h"

#include <stdbool.h>
#include <stddef.h>

/*
 * Rows [r0, r1) of product p: on its prepared input a (kern_act of p's x for p's dtype), or,
 * a == NULL, preparing the input itself (kern_matmul*). Panels when W has them (r0 on a panel).
 * The one place that chooses a kernel entry for a weight matrix.
 */
static inline void matmul__rows(const struct matmul_prod *p, const struct kern_act *a,
                                size_t r0, size_t r1)
{
    const struct matmul_mat *w = p->w;
    if (a && w->panels)
        kern_matmul_act_panels(w->dtype, w->panels, a, p->y, p->ldy, r0, r1);
    else if (a)
        kern_matmul_act(w->data, a, p->y, p->ldy, r0, r1);
    else if (w->panels)
        kern_matmul_panels(w->dtype, w->panels, w->cols, p->x, p->n, p->y, p->ldy, r0, r1);
    else
        kern_matmul(w->dtype, w->data, w->cols, p->x, p->n, p->y, p->ldy, r0, r1);
}

/* A group's distinct inputs: products with the same x, n, weight dtype and width share one. */
struct matmul__acts {
    size_t n;                             /* distinct inputs */
    size_t of[MATMUL_GROUP_MAX];          /* product -> its input (products with n > 0) */
    size_t first[MATMUL_GROUP_MAX];       /* input -> the first product that reads it */
    size_t off[MATMUL_GROUP_MAX];         /* input -> its byte offset in the scratch */
    size_t bytes[MATMUL_GROUP_MAX];       /* input -> kern_act_bytes (0: nothing to prepare) */
    size_t total;                         /* scratch bytes: the inputs, each 64-byte aligned */
    unsigned flags;                       /* kern_act_bytes_ex / init_ex flags (plan's) */
    struct kern_act a[MATMUL_GROUP_MAX];  /* input -> its layout, once matmul__acts_init ran */
};

/* Fills A's table for products g[0..k) (k <= MATMUL_GROUP_MAX) with kern_act flags (KERN_ACT_*:
 * 0 keeps every quantized product's int8 bits, required under the invariant switch); nothing is
 * laid out yet. */
void matmul__acts_plan(struct matmul__acts *A, const struct matmul_prod *g, size_t k,
                       unsigned flags);
/* Lays the inputs out over buf (A->total bytes, 64-byte aligned); nothing is computed yet. */
void matmul__acts_init(struct matmul__acts *A, const struct matmul_prod *g, void *buf);

/* Ends the open matmul_group_begin of c and returns its prepared inputs (still in c's act_
 * scratch: nothing may grow it until they are used). */
const struct matmul__acts *matmul__prep_take(struct matmul_ctx *c);
/* matmul_group's products of g[0..k) on inputs A prepared for exactly that group. */
void matmul__group_prepared(struct matmul_ctx *c, const struct matmul_prod *g, size_t k,
                            const struct matmul__acts *A);

/* Grows a scratch array to `bytes` (64-byte aligned); false when out of memory. */
bool matmul__grow(void **buf, size_t *cap, size_t bytes);

#endif
