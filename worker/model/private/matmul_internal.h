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

/*
 * An input's forms for its adapters' shrinks, made beside the base's preparation when the
 * group was begun with a LoRA plan (matmul_group_begin_lora; matmul_lora.c): the int8
 * adapters' codes (kern_lora_i8_quant_x) and the bf16 ones' rounding (kern_lora_bf16_x) of
 * the tokens of the segments that read them, by the thread that just wrote the token's floats.
 * Made in the fused job instead, once per segment and job, each call read x from the other
 * core's cache (the norm job writes half the tokens there): ~3x the same call on x in its own
 * (session 23, /work/scratch/s23/xcore.c; ~5 us a call, 352 calls an 8-stream step on 7
 * projections). Token t's codes at q + t * KERN_LORA_I8_LDX(cols), its scale and code sum at
 * xs[t], xsum[t]; its rounding at xb + t * KERN_LORA_BF16_LDX(cols). NULL: not made (the fused
 * job makes them itself).
 */
struct matmul__lora_x {
    int8_t *q;
    float *xs;
    int32_t *xsum;
    uint16_t *xb;
    size_t off_q, off_b; /* byte offsets in the scratch (SIZE_MAX: none) */
};

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
    struct matmul__lora_x lx[MATMUL_GROUP_MAX]; /* input -> its adapters' forms (laid out by
                                                 * matmul__acts_init) */
    const struct lora_plan *lx_plan;      /* the plan whose segments want them, or NULL */
    const struct matmul_prod *lx_g;       /* the group (matmul__lora_x_plan's g) */
    size_t lx_k;
    uint32_t lx_layer;
};

/* Fills A's table for products g[0..k) (k <= MATMUL_GROUP_MAX) with kern_act flags (KERN_ACT_*:
 * 0 keeps every quantized product's int8 bits, required under the invariant switch); nothing is
 * laid out yet. */
void matmul__acts_plan(struct matmul__acts *A, const struct matmul_prod *g, size_t k,
                       unsigned flags);
/* Lays the inputs out over buf (A->total bytes, 64-byte aligned); nothing is computed yet. */
void matmul__acts_init(struct matmul__acts *A, const struct matmul_prod *g, void *buf);

/* Adds to A (planned for g[0..k)) the forms plan p's segments want of each input in this layer
 * (struct matmul__lora_x; matmul_lora.c). */
void matmul__lora_x_plan(struct matmul__acts *A, const struct matmul_prod *g, size_t k,
                         const struct lora_plan *p, uint32_t layer);
/* Makes tokens [t0, t1)'s adapter forms of every input of A (laid out), from their floats. */
void matmul__lora_x_rows(const struct matmul__acts *A, size_t t0, size_t t1);

/* Ends the open matmul_group_begin of c and returns its prepared inputs (still in c's act_
 * scratch: nothing may grow it until they are used). */
const struct matmul__acts *matmul__prep_take(struct matmul_ctx *c);
/* matmul_group's products of g[0..k) on inputs A prepared for exactly that group. */
void matmul__group_prepared(struct matmul_ctx *c, const struct matmul_prod *g, size_t k,
                            const struct matmul__acts *A);

/* Grows a scratch array to `bytes` (64-byte aligned); false when out of memory. */
bool matmul__grow(void **buf, size_t *cap, size_t bytes);

#endif
