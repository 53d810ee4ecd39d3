/*
 * matmul.c — single and grouped products over the thread pool (matmul.h).
 *
 * A call is two pool jobs at most: preparing the distinct inputs (tokens in parallel, only
 * when there are many of them), then one pool_for over the products' rows laid end to end.
 * Product i owns the rows [off[i], off[i] + rows) of that line, off[i] a multiple of 16, so
 * that shards (multiples of 16 rows from the start) begin on a panel of every product; a
 * shard that spans two products runs a part of each.
 *
 * NOTES: runs on the thread that owns the struct matmul_ctx; its scratch is written before
 * the jobs that read it are published (pool_run's release/acquire makes it visible).
 */
#include "matmul.h"

#include "check.h"
#include "log.h"
#include "matmul_internal.h"
#include "pool.h"

#include <stdlib.h>
#include <string.h>

#define ROW_GRAIN 16 /* one AVX-512 panel: shards never split a panel */

/*
 * Inputs are prepared over the pool from this many elements (tokens x cols, all inputs) on,
 * on the calling thread below: quantizing a decode step's 8 x 2048 activations takes a few
 * µs, less than the dispatch and barrier that would share it (4 of them per layer at 8
 * streams).
 */
#define ACT_PAR_MIN ((size_t)1 << 16)

void matmul_ctx_init(struct matmul_ctx *c, struct pool *pool)
{
    memset(c, 0, sizeof *c);
    c->pool = pool;
}

void matmul_ctx_fini(struct matmul_ctx *c)
{
    free(c->act_);
    free(c->tasks_);
    free(c->prep_);
    c->act_ = c->tasks_ = c->prep_ = NULL;
    c->prep_open_ = false;
    c->act_cap_ = c->tasks_cap_ = 0;
}

bool matmul__grow(void **buf, size_t *cap, size_t bytes)
{
    if (bytes <= *cap)
        return true;
    bytes = (bytes + 63) / 64 * 64;
    void *nb = aligned_alloc(64, bytes);
    if (!nb)
        return false;
    free(*buf);
    *buf = nb;
    *cap = bytes;
    return true;
}

void matmul__acts_plan(struct matmul__acts *A, const struct matmul_prod *g, size_t k,
                       unsigned flags)
{
    CHECK(k <= MATMUL_GROUP_MAX);
    A->n = 0;
    A->total = 0;
    A->flags = flags;
    A->lx_plan = NULL;
    A->lx_g = NULL;
    A->lx_k = 0;
    A->lx_layer = 0;
    for (size_t i = 0; i < k; i++) {
        if (g[i].n == 0)
            continue;
        size_t a = 0;
        for (; a < A->n; a++) {
            const struct matmul_prod *o = &g[A->first[a]];
            if (o->x == g[i].x && o->n == g[i].n && o->w->dtype == g[i].w->dtype &&
                o->w->cols == g[i].w->cols)
                break;
        }
        A->of[i] = a;
        if (a < A->n)
            continue;
        size_t bytes;
        CHECK(kern_act_bytes_ex(g[i].w->dtype, g[i].w->cols, g[i].n, flags, &bytes) == 0);
        A->first[a] = i;
        A->off[a] = A->total;
        A->bytes[a] = bytes;
        A->total += (bytes + 63) / 64 * 64;
        A->lx[a] = (struct matmul__lora_x){NULL, NULL, NULL, NULL, SIZE_MAX, SIZE_MAX};
        A->n++;
    }
}

void matmul__acts_init(struct matmul__acts *A, const struct matmul_prod *g, void *buf)
{
    for (size_t a = 0; a < A->n; a++) {
        const struct matmul_prod *p = &g[A->first[a]];
        kern_act_init_ex(&A->a[a], p->w->dtype, p->x, p->w->cols, p->n, A->flags,
                         (unsigned char *)buf + A->off[a]);
        struct matmul__lora_x *lx = &A->lx[a];
        if (lx->off_q != SIZE_MAX) { /* [n][ldx] codes, [n] scales, [n] sums (matmul_lora.c) */
            lx->q = (int8_t *)((unsigned char *)buf + lx->off_q);
            lx->xs = (float *)(lx->q + p->n * KERN_LORA_I8_LDX(p->w->cols));
            lx->xsum = (int32_t *)(lx->xs + p->n);
        }
        if (lx->off_b != SIZE_MAX)
            lx->xb = (uint16_t *)((unsigned char *)buf + lx->off_b);
    }
}

/* ---- one pool job over the rows of every product ------------------------------------------ */

struct rows_job {
    const struct matmul_prod *g;
    size_t k;
    bool invariant;                /* matmul_ctx.invariant */
    const size_t *off;             /* [k] first row of each product on the line */
    const struct matmul__acts *A;  /* prepared inputs, or NULL: each shard prepares its own */
};

/*
 * Whether a weight type's products may give a token other bits at another n on the kernels'
 * ISA: the float types' gemv and gemm sum in different orders on AVX2 and AVX-512 (the gemm
 * over transposed panels, bf16's on bf16-rounded activations with AVX512-BF16); the AVX-512
 * quantized gemv reproduces its gemm's order (kern.h, kern_variants.h), the AVX2 q8_0/q4_0
 * ones do not (tests/engine/batch_inv, int8 and int4 models; the other AVX2 types are taken
 * one token at a time too rather than trusted type by type); the scalar ISA runs one
 * product, kern_matmul_ref, for every n.
 */
static bool needs_invariant(enum dtype dt)
{
    switch (kern_isa()) {
    case KERN_ISA_REF:
        return false;
    case KERN_ISA_AVX2:
        return true;
    default:
        return dt == DT_F32 || dt == DT_F16 || dt == DT_BF16;
    }
}

/*
 * Rows [r0, r1) of p, batch invariant: every token through the one-token product (the gemv,
 * one row at a time), blocks of MATMUL_INV_ROWS rows outermost so that a block read from
 * memory for the first token is in cache for the others. a: p's prepared input (kern.h gives
 * each array's per-token stride), or NULL. Panels are not read: the types that have them are
 * invariant where their panel GEMM exists (AVX-512), and elsewhere it runs on their rows.
 */
static void rows_invariant(const struct matmul_prod *p, const struct kern_act *a, size_t r0,
                           size_t r1)
{
    const struct matmul_mat *w = p->w;
    for (size_t rb = r0; rb < r1; rb += MATMUL_INV_ROWS) {
        size_t re = r1 - rb < MATMUL_INV_ROWS ? r1 : rb + MATMUL_INV_ROWS;
        for (size_t t = 0; t < p->n; t++) {
            float *y = p->y + t * p->ldy;
            if (!a) {
                kern_matmul(w->dtype, w->data, w->cols, p->x + t * w->cols, 1, y, p->ldy, rb,
                            re);
                continue;
            }
            /* token t's slice of every array, at the strides kern.h gives them */
            struct kern_act one = *a;
            one.n = 1;
            one.x = a->x + t * a->cols;
            one.xt = NULL; /* tiles of many tokens (never laid out under the switch anyway) */
            if (a->xf)
                one.xf = a->xf + t * a->ld;
            if (a->xb)
                one.xb = a->xb + t * a->ld;
            if (a->q) {
                one.q = a->q + t * a->ld;
                one.d = a->d + t * (a->cp / 32);
                one.ns32 = a->ns32 + t * (a->cp / 32);
                one.ns4 = a->ns4 + t * (a->cp / 4);
                one.d4 = a->d4 + t * (a->cp / 4);
            }
            kern_matmul_act(w->data, &one, y, p->ldy, rb, re);
        }
    }
}

static void rows_shard(void *arg, size_t b, size_t e, int thread)
{
    (void)thread;
    const struct rows_job *j = arg;
    for (size_t i = 0; i < j->k; i++) {
        const struct matmul_prod *p = &j->g[i];
        size_t o = j->off[i], end = o + (p->n ? p->w->rows : 0);
        size_t lo = b > o ? b : o, hi = e < end ? e : end;
        if (lo >= hi)
            continue;
        const struct kern_act *a = j->A ? &j->A->a[j->A->of[i]] : NULL;
        if (j->invariant && p->n > 1 && needs_invariant(p->w->dtype))
            rows_invariant(p, a, lo - o, hi - o);
        else
            matmul__rows(p, a, lo - o, hi - o);
    }
}

/* Token t of the inputs laid end to end (the preparing job's line). */
struct prep_job {
    const struct matmul__acts *A;
    const size_t *tok0; /* [A->n + 1] first token of each input on the line */
};

static void prep_shard(void *arg, size_t b, size_t e, int thread)
{
    (void)thread;
    const struct prep_job *j = arg;
    for (size_t a = 0; a < j->A->n; a++) {
        size_t lo = b > j->tok0[a] ? b : j->tok0[a], hi = e < j->tok0[a + 1] ? e : j->tok0[a + 1];
        if (lo < hi && j->A->bytes[a])
            kern_act_prepare(&j->A->a[a], lo - j->tok0[a], hi - j->tok0[a]);
    }
}

/* Prepares every input of A: over the pool when there are many elements, else here. */
static void prepare(struct matmul_ctx *c, const struct matmul__acts *A)
{
    size_t tok0[MATMUL_GROUP_MAX + 1], elems = 0;
    tok0[0] = 0;
    for (size_t a = 0; a < A->n; a++) {
        tok0[a + 1] = tok0[a] + A->a[a].n;
        elems += A->bytes[a] ? A->a[a].n * A->a[a].cols : 0;
    }
    if (elems >= ACT_PAR_MIN && pool_threads(c->pool) > 1) {
        struct prep_job j = {A, tok0};
        pool_for(c->pool, 0, tok0[A->n], 1, prep_shard, &j);
        return;
    }
    for (size_t a = 0; a < A->n; a++)
        if (A->bytes[a])
            kern_act_prepare(&A->a[a], 0, A->a[a].n);
}

/* The activations' freedom (kern.h KERN_ACT_*): the bf16 tile product of q4_0/q8_0 on AMX is
 * not batch invariant, so it is only allowed when the invariant switch is off. */
static unsigned act_flags(const struct matmul_ctx *c)
{
    return c->invariant ? 0u : (unsigned)KERN_ACT_BF16_TILES;
}

/*
 * Rows [r0, r1) of the line of products g[0..k) (product i at off[i]): on the calling thread
 * without a pool; else inputs prepared once (or by the caller: prepared, from
 * matmul_group_begin) and one pool_for.
 */
static void run(struct matmul_ctx *c, const struct matmul_prod *g, size_t k, const size_t *off,
                size_t r0, size_t r1, const struct matmul__acts *prepared)
{
    struct rows_job j = {g, k, c->invariant, off, prepared};
    if (prepared) {
        pool_for(c->pool, r0, r1, ROW_GRAIN, rows_shard, &j);
        return;
    }
    if (!c->pool) { /* the kernels prepare their input themselves: one call per product */
        rows_shard(&j, r0, r1, 0);
        return;
    }
    struct matmul__acts A;
    matmul__acts_plan(&A, g, k, act_flags(c));
    if (matmul__grow(&c->act_, &c->act_cap_, A.total ? A.total : 64)) {
        matmul__acts_init(&A, g, c->act_);
        prepare(c, &A);
        j.A = &A;
    } else {
        static _Thread_local int warned;
        if (!warned++)
            LOG_WARN("matmul: no memory for %zu bytes of prepared activations, preparing them "
                     "per shard",
                     A.total);
    }
    pool_for(c->pool, r0, r1, ROW_GRAIN, rows_shard, &j);
}

void matmul_rows(struct matmul_ctx *c, const struct matmul_mat *w, const float *x, size_t n,
                 float *y, size_t ldy, size_t r0, size_t r1)
{
    CHECK(r1 <= w->rows);
    CHECK(!w->panels || r0 % ROW_GRAIN == 0); /* shards start on panels too */
    if (r0 >= r1 || n == 0)
        return;
    const struct matmul_prod p = {w, x, n, y, ldy, 0};
    const size_t off = 0;
    run(c, &p, 1, &off, r0, r1, NULL);
}

/* The products of g laid end to end, each from a panel boundary; returns the line's end. */
static size_t group_line(const struct matmul_prod *g, size_t k, size_t *off)
{
    CHECK(k <= MATMUL_GROUP_MAX);
    size_t end = 0;
    for (size_t i = 0; i < k; i++) {
        off[i] = end;
        if (g[i].n)
            end += (g[i].w->rows + ROW_GRAIN - 1) / ROW_GRAIN * ROW_GRAIN;
    }
    return end;
}

void matmul_group(struct matmul_ctx *c, const struct matmul_prod *g, size_t k)
{
    size_t off[MATMUL_GROUP_MAX], end = group_line(g, k, off);
    if (end)
        run(c, g, k, off, 0, end, NULL);
}

/* ---- inputs prepared by the caller (matmul.h, matmul_group_begin) ------------------------- */

struct matmul_prep {
    struct matmul__acts A; /* laid out over the ctx's act_ scratch */
};

const struct matmul_prep *matmul_group_begin(struct matmul_ctx *c, const struct matmul_prod *g,
                                             size_t k)
{
    return matmul_group_begin_lora(c, g, k, NULL, 0);
}

const struct matmul_prep *matmul_group_begin_lora(struct matmul_ctx *c,
                                                  const struct matmul_prod *g, size_t k,
                                                  const struct lora_plan *p, uint32_t layer)
{
    CHECK(!c->prep_open_);
    if (!c->pool || c->invariant)
        return NULL;
    if (!c->prep_ && !(c->prep_ = malloc(sizeof(struct matmul_prep))))
        return NULL; /* the caller runs matmul_group, which logs if it too finds no memory */
    struct matmul_prep *h = c->prep_;
    matmul__acts_plan(&h->A, g, k, act_flags(c));
    if (p && p->n_segs)
        matmul__lora_x_plan(&h->A, g, k, p, layer);
    if (!matmul__grow(&c->act_, &c->act_cap_, h->A.total ? h->A.total : 64))
        return NULL;
    matmul__acts_init(&h->A, g, c->act_);
    c->prep_open_ = true;
    return h;
}

void matmul_prep_rows(const struct matmul_prep *h, size_t t0, size_t t1)
{
    for (size_t a = 0; a < h->A.n; a++) {
        size_t e = t1 < h->A.a[a].n ? t1 : h->A.a[a].n;
        if (h->A.bytes[a] && t0 < e)
            kern_act_prepare(&h->A.a[a], t0, e);
    }
    if (h->A.lx_plan) /* while the rows are in this core's cache */
        matmul__lora_x_rows(&h->A, t0, t1);
}

const struct matmul__acts *matmul__prep_take(struct matmul_ctx *c)
{
    CHECK(c->prep_open_);
    c->prep_open_ = false;
    return &((const struct matmul_prep *)c->prep_)->A;
}

void matmul__group_prepared(struct matmul_ctx *c, const struct matmul_prod *g, size_t k,
                            const struct matmul__acts *A)
{
    size_t off[MATMUL_GROUP_MAX], end = group_line(g, k, off);
    if (end)
        run(c, g, k, off, 0, end, A);
}

void matmul_group_end(struct matmul_ctx *c, const struct matmul_prod *g, size_t k)
{
    matmul__group_prepared(c, g, k, matmul__prep_take(c));
}
