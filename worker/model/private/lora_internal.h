/*
 * lora_internal.h — what the LoRA files of worker/model share (lora.h is the public side):
 *   lora_config.c    adapter_config.json and the target table;
 *   lora_load.c      reading a PEFT adapter: tensor names, validation, f32 conversion,
 *                    references;
 *   lora_pack.c      the serving copy of the weights (packed A and B^T) and the digest;
 *   lora_registry.c  the name table;
 *   lora_apply.c     batch plans and the updates (plain, and the fused shrink/expand jobs);
 *   matmul_lora.c    the update fused with the base products (matmul_group_lora).
 * Private to worker/model.
 */
#ifndef CLOCHER_WORKER_LORA_INTERNAL_H
#define CLOCHER_WORKER_LORA_INTERNAL_H

#include "lora.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define LORA__MAGIC 0x4c6f5241u /* "LoRA": a live struct lora_adapter */

/* References held on ad (lora_refcount's value). The acquire pairs with the release of the
 * last unref, so a caller that sees 1 also sees every write the other holders made. */
static inline int lora__refs(const struct lora_adapter *ad)
{
    return atomic_load_explicit(&ad->refs_, memory_order_acquire);
}

/* Tasks of the fused update (lora_apply_fused, matmul_group_lora). */
#define LORA__SHRINK_KB 8u   /* a shrink task's rank rows */
/* ... on int8 weights: an int8 shrink call of lora_apply_fused quantizes its tokens' x first
 * (kern.h), which costs about what reading 8 rank rows of codes does, so a task takes up to 32
 * rows (measured, session 10: 8 made the int8 shrink no faster than bf16's at rank 16).
 * matmul_group_lora quantizes each token once per job instead (kern_lora_i8_quant_x, then
 * kern_lora_shrink_i8q; session 14). */
#define LORA__SHRINK_KB_I8 32u

/* A shrink task's rank rows for adapter ad (matmul_group_lora). */
static inline size_t lora__shrink_kb(const struct lora_adapter *ad)
{
    return ad->fast_dt == LORA_DT_I8 ? LORA__SHRINK_KB_I8 : LORA__SHRINK_KB;
}
#define LORA__EXPAND_JB 256u /* an expand task's output columns (lora_apply_fused) */

/* ---- lora_config.c ---- */

struct lora__target_info {
    const char *module; /* PEFT module name */
    const char *parent; /* its parent module in a Hugging Face llama decoder layer */
};
extern const struct lora__target_info lora__targets[LORA_TARGET_COUNT];

/* The target whose module name is s[0..n), or -1. */
int lora__target_from_module(const char *s, size_t n);

/* Whether the configuration adapts layer l (layers_to_transform, or every layer). */
static inline bool lora__layer_listed(const struct lora_config *c, uint32_t l)
{
    return !c->has_layers || (l < LORA_MAX_LAYERS && (c->layers[l / 64] >> (l % 64)) & 1u);
}

/* ---- lora_load.c ---- */

/* lora_open with a registry name (name and dir are copied). Codes as lora_open. */
int lora__open_named(const char *dir, const char *name, const struct iebin_hparams *hp,
                     struct lora_adapter **out);
/* Drops one reference; frees the adapter with the last one. NULL: no-op. */
void lora__adapter_unref(struct lora_adapter *ad);

/* ---- lora_pack.c ---- */

/*
 * Writes the serving copy (lora_weights.fa/.fbt) of ad's f32 weights in dt (DT_F32,
 * DT_BF16 or LORA_DT_I8) into a new ad->fast_store; `what` names the adapter in messages. 0 or -ENOMEM
 * (logged; ad->fast_store then NULL).
 */
int lora__pack(struct lora_adapter *ad, enum dtype dt, const char *what);
/* The content digest of a freshly converted adapter (lora_adapter.digest). */
uint64_t lora__digest(const struct lora_adapter *ad);

/* Bytes of the serving copy in ad->fast_dt: rank rows [0, k) of A for target t (int8: after
 * the scales' header, kern.h KERN_LORA_I8_HDR) ... */
static inline size_t lora__fa_offset(const struct lora_adapter *ad, uint32_t t, size_t k)
{
    if (ad->fast_dt == LORA_DT_I8)
        return KERN_LORA_I8_HDR(ad->cfg.rank) + k * ad->in[t];
    return k * ad->in[t] * (ad->fast_dt == DT_BF16 ? 2 : 4);
}

/* ... and the B^T panels holding columns [0, c) (c a multiple of 32, or out). */
static inline size_t lora__fbt_offset(const struct lora_adapter *ad, size_t c)
{
    size_t panels = (c + LORA_PANEL - 1) / LORA_PANEL, r = ad->cfg.rank;
    if (ad->fast_dt == LORA_DT_I8)
        return KERN_LORA_I8_HDR(r) + panels * ((r + 3) / 4) * 128;
    return panels * LORA_PANEL * r * (ad->fast_dt == DT_BF16 ? 2 : 4);
}

/* Bytes per weight of the serving copy, for balancing tasks by cost. */
static inline double lora__fast_elem_bytes(const struct lora_adapter *ad)
{
    return ad->fast_dt == LORA_DT_I8 ? 1.0 : ad->fast_dt == DT_BF16 ? 2.0 : 4.0;
}

/* The shrink and expand kernels of the adapter's serving copy (kern.h). */
static inline void lora__shrink(const struct lora_adapter *ad, const void *a, size_t in,
                                const float *x, size_t n, float *t, size_t k0, size_t k1)
{
    if (ad->fast_dt == LORA_DT_I8)
        kern_lora_shrink_i8(a, in, ad->cfg.rank, x, n, t, k0, k1);
    else
        kern_lora_shrink(ad->fast_dt, a, in, ad->cfg.rank, x, n, t, k0, k1);
}

static inline void lora__expand(const struct lora_adapter *ad, const void *bt, const float *t,
                                size_t n, const float *scale, float *y, size_t ldy, size_t j0,
                                size_t j1)
{
    if (ad->fast_dt == LORA_DT_I8)
        kern_lora_expand_i8(bt, ad->cfg.rank, t, n, scale, 0.0f, y, ldy, j0, j1);
    else
        kern_lora_expand(ad->fast_dt, bt, ad->cfg.rank, t, n, scale, 0.0f, y, ldy, j0, j1);
}

#endif
