/*
 * lora_apply.c — applying adapters to a batch (lora.h "applying"): the plan of a step's
 * segments, the plain update (phases A and B as kern_matmul calls on the f32 weights) and the
 * serving path's fused update (lora_apply_fused: shrink and expand jobs on the packed
 * weights). The update fused with the base products is matmul_group_lora (matmul_lora.c).
 *
 * The plain phase B: kern_matmul overwrites its output, so it computes the low-rank product
 * in a stack tile of at most TILE_T tokens x TILE_R rows and adds it, scaled per token, into y.
 *
 * NOTES: a plan is written by one thread (lora_plan_build), then only read; the apply
 * functions write disjoint rows of y and of the scratch, so tasks of one job never race.
 */
#include "lora.h"

#include "check.h"
#include "log.h"
#include "lora_internal.h"
#include "pool.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define TILE_T 16u  /* phase B tile: tokens */
#define TILE_R 256u /* phase B tile: output rows */

/* ---- plans ---- */

void lora_plan_init(struct lora_plan *p) { memset(p, 0, sizeof *p); }

void lora_plan_fini(struct lora_plan *p)
{
    free(p->segs);
    free(p->scale);
    memset(p, 0, sizeof *p);
}

int lora_plan_build(struct lora_plan *p, const struct lora_adapter *const *ad,
                    const float *scale, size_t n_tok)
{
    if (n_tok > p->cap_tok) {
        float *s = realloc(p->scale, n_tok * sizeof *s);
        if (!s) {
            LOG_ERR("LoRA plan: out of memory for %zu tokens", n_tok);
            return -ENOMEM;
        }
        p->scale = s;
        p->cap_tok = n_tok;
    }
    p->n_tok = n_tok;
    p->n_segs = 0;
    p->tmp_floats = 0;
    p->max_rank = 0;
    for (size_t t = 0; t < n_tok; t++) {
        const struct lora_adapter *a = ad[t];
        if (!a) {
            p->scale[t] = 0.0f;
            continue;
        }
        CHECK(a->magic == LORA__MAGIC);
        p->scale[t] = a->cfg.scaling * scale[t];
        struct lora_seg *last = p->n_segs ? &p->segs[p->n_segs - 1] : NULL;
        if (last && last->ad == a && last->t0 + last->n == t) {
            last->n++;
        } else {
            if (p->n_segs == p->cap_segs) {
                size_t cap = p->cap_segs ? 2 * p->cap_segs : 8;
                struct lora_seg *s = realloc(p->segs, cap * sizeof *s);
                if (!s) {
                    LOG_ERR("LoRA plan: out of memory for %zu segments", cap);
                    return -ENOMEM;
                }
                p->segs = s;
                p->cap_segs = cap;
            }
            p->segs[p->n_segs++] = (struct lora_seg){.ad = a, .t0 = t, .n = 1};
        }
        if (a->cfg.rank > p->max_rank)
            p->max_rank = a->cfg.rank;
    }
    for (size_t i = 0; i < p->n_segs; i++) {
        p->segs[i].tmp0 = p->tmp_floats;
        p->tmp_floats += p->segs[i].n * p->segs[i].ad->cfg.rank;
    }
    return 0;
}

/* ---- the plain update ---- */

/* tmp [n][r] = x [n][in] . A^T, rank rows [k0, k1) clamped to r. */
static void seg_a(const struct lora_adapter *ad, uint32_t layer, enum lora_target t,
                  const float *x, size_t n, float *tmp, size_t k0, size_t k1)
{
    const struct lora_weights *w = lora_weights(ad, layer, t);
    size_t r = ad->cfg.rank;
    if (!w || k0 >= r || k0 >= k1)
        return;
    kern_matmul(DT_F32, w->a, ad->in[t], x, n, tmp, r, k0, k1 < r ? k1 : r);
}

/* y[i][r0..r1) += s_i * (tmp[i] . B^T) for i < n; s_i = scale[i], or s when scale is NULL. */
static void seg_b(const struct lora_adapter *ad, uint32_t layer, enum lora_target t,
                  const float *tmp, size_t n, const float *scale, float s, float *y,
                  size_t ldy, size_t r0, size_t r1)
{
    const struct lora_weights *w = lora_weights(ad, layer, t);
    if (!w)
        return;
    size_t r = ad->cfg.rank;
    CHECK(r0 <= r1 && r1 <= ad->out[t]);
    float d[TILE_T * TILE_R]; /* [nt][nr] */
    for (size_t i0 = 0; i0 < n; i0 += TILE_T) {
        size_t nt = n - i0 < TILE_T ? n - i0 : TILE_T;
        for (size_t rb = r0; rb < r1; rb += TILE_R) {
            size_t nr = r1 - rb < TILE_R ? r1 - rb : TILE_R;
            /* rows [rb, rb+nr) of B as a matrix of their own */
            kern_matmul(DT_F32, w->b + rb * r, r, tmp + i0 * r, nt, d, nr, 0, nr);
            for (size_t i = 0; i < nt; i++) {
                float si = scale ? scale[i0 + i] : s;
                float *yr = y + (i0 + i) * ldy + rb;
                const float *dr = d + i * nr;
                for (size_t j = 0; j < nr; j++)
                    yr[j] += si * dr[j];
            }
        }
    }
}

void lora_apply_a(const struct lora_plan *p, uint32_t layer, enum lora_target t, const float *x,
                  float *tmp, size_t k0, size_t k1)
{
    for (size_t i = 0; i < p->n_segs; i++) {
        const struct lora_seg *s = &p->segs[i];
        seg_a(s->ad, layer, t, x + s->t0 * s->ad->in[t], s->n, tmp + s->tmp0, k0, k1);
    }
}

void lora_apply_b(const struct lora_plan *p, uint32_t layer, enum lora_target t,
                  const float *tmp, float *y, size_t ldy, size_t r0, size_t r1)
{
    for (size_t i = 0; i < p->n_segs; i++) {
        const struct lora_seg *s = &p->segs[i];
        seg_b(s->ad, layer, t, tmp + s->tmp0, s->n, p->scale + s->t0, 0.0f, y + s->t0 * ldy,
              ldy, r0, r1);
    }
}

void lora_apply(const struct lora_plan *p, uint32_t layer, enum lora_target t, const float *x,
                float *tmp, float *y, size_t ldy)
{
    for (size_t i = 0; i < p->n_segs; i++) {
        const struct lora_seg *s = &p->segs[i];
        seg_a(s->ad, layer, t, x + s->t0 * s->ad->in[t], s->n, tmp + s->tmp0, 0,
              s->ad->cfg.rank);
        seg_b(s->ad, layer, t, tmp + s->tmp0, s->n, p->scale + s->t0, 0.0f, y + s->t0 * ldy,
              ldy, 0, s->ad->out[t]);
    }
}

void lora_apply_one(const struct lora_adapter *ad, float scale, uint32_t layer,
                    enum lora_target t, const float *x, size_t n, float *y, size_t ldy,
                    float *tmp)
{
    seg_a(ad, layer, t, x, n, tmp, 0, ad->cfg.rank);
    seg_b(ad, layer, t, tmp, n, NULL, ad->cfg.scaling * scale, y, ldy, 0, ad->out[t]);
}

/* ---- the serving path: packed weights, fused phases (lora_apply_fused) ----
 * The kernels are kern_lora_shrink / kern_lora_expand (kernels/include/kern.h): bf16 weights on
 * AVX512-BF16 with activations rounded to bf16; f32 weights, and bf16 elsewhere, widened
 * exactly on AVX2; int8 weights (kern_lora_*_i8) on VNNI / vpmaddubsw; CLOCHER_ISA=ref the
 * scalar ones. */

struct fused_job {
    const struct lora_plan *p;
    uint32_t layer;
    const struct lora_proj *pr;
    size_t n_proj;
    float *tmp;     /* [n_proj][p->tmp_floats] */
    size_t n_blk;   /* tasks per (projection, segment): rank blocks or column blocks */
};

/* What one task of either pass works on: task = (projection, segment, block). */
struct fused_task {
    const struct lora_seg *s;
    const struct lora_proj *pr;
    const struct lora_weights *w; /* NULL: the segment's adapter leaves this projection alone */
    float *t;                     /* [s->n][rank] the segment's shrink output */
    size_t blk;
};

static struct fused_task fused_task(const struct fused_job *j, size_t task)
{
    size_t blk = task % j->n_blk, rest = task / j->n_blk;
    size_t si = rest % j->p->n_segs, pi = rest / j->p->n_segs;
    const struct lora_seg *s = &j->p->segs[si];
    const struct lora_proj *pr = &j->pr[pi];
    return (struct fused_task){s, pr, lora_weights(s->ad, j->layer, pr->t),
                               j->tmp + pi * j->p->tmp_floats + s->tmp0, blk};
}

/* task = (projection, segment, block of LORA__SHRINK_KB rank rows) */
static void fused_a(void *ctx, size_t task, int thread)
{
    (void)thread;
    const struct fused_task f = fused_task(ctx, task);
    size_t r = f.s->ad->cfg.rank, k0 = f.blk * LORA__SHRINK_KB;
    if (!f.w || k0 >= r)
        return;
    size_t k1 = k0 + LORA__SHRINK_KB < r ? k0 + LORA__SHRINK_KB : r, in = f.s->ad->in[f.pr->t];
    lora__shrink(f.s->ad, f.w->fa, in, f.pr->x + f.s->t0 * in, f.s->n, f.t, k0, k1);
}

/* task = (projection, segment, block of LORA__EXPAND_JB output columns) */
static void fused_b(void *ctx, size_t task, int thread)
{
    (void)thread;
    const struct fused_job *j = ctx;
    const struct fused_task f = fused_task(j, task);
    size_t out = f.s->ad->out[f.pr->t], c0 = f.blk * LORA__EXPAND_JB;
    if (!f.w || c0 >= out)
        return;
    size_t c1 = c0 + LORA__EXPAND_JB < out ? c0 + LORA__EXPAND_JB : out;
    lora__expand(f.s->ad, f.w->fbt, f.t, f.s->n, j->p->scale + f.s->t0,
                 f.pr->y + f.s->t0 * f.pr->ldy, f.pr->ldy, c0, c1);
}

void lora_apply_fused(const struct lora_plan *p, struct pool *pool, uint32_t layer,
                      const struct lora_proj *pr, size_t n_proj, float *tmp)
{
    if (p->n_segs == 0 || n_proj == 0)
        return;
    struct fused_job j = {p, layer, pr, n_proj, tmp, 0};
    j.n_blk = (p->max_rank + LORA__SHRINK_KB - 1) / LORA__SHRINK_KB;
    size_t n_a = n_proj * p->n_segs * j.n_blk;
    if (pool)
        pool_run(pool, fused_a, &j, n_a);
    else
        for (size_t i = 0; i < n_a; i++)
            fused_a(&j, i, 0);
    /* pool_run returned: every T is complete and visible (its completion is acq/rel) */
    size_t max_out = 0;
    for (size_t i = 0; i < n_proj; i++)
        for (size_t si = 0; si < p->n_segs; si++) {
            size_t o = p->segs[si].ad->out[pr[i].t];
            max_out = o > max_out ? o : max_out;
        }
    j.n_blk = (max_out + LORA__EXPAND_JB - 1) / LORA__EXPAND_JB;
    size_t n_b = n_proj * p->n_segs * j.n_blk;
    if (pool)
        pool_run(pool, fused_b, &j, n_b);
    else
        for (size_t i = 0; i < n_b; i++)
            fused_b(&j, i, 0);
}
