/*
 * moe.c — gpt-oss's mixture-of-experts block (moe.h): route, gather the rows of each chosen
 * expert, two grouped products, the clamped SwiGLU, scatter back with the routing weights.
 */
#include "moe.h"

#include "check.h"
#include "err.h"
#include "kern.h"
#include "log.h"
#include "pool.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct moe {
    const struct model *m;
    uint32_t max_tok, k, ne;
    float *logits;      /* [T][n_experts] router logits */
    uint32_t *sel;      /* [T][k] chosen experts, decreasing logit */
    float *w;           /* [T][k] their routing weights */
    uint32_t *slot;     /* [T][k] row of (t, i) in the gathered arrays */
    uint32_t *off;      /* [n_experts + 1] first gathered row of each expert */
    uint32_t *fill;     /* [n_experts] next free gathered row of each expert */
    float *xg;          /* [T*k][dim] rows gathered by expert */
    float *g, *u;       /* [T*k][ffn_dim] gate, up; then g holds the activation */
    float *y;           /* [T*k][dim] the experts' outputs */
    struct matmul_prod *prods; /* [2 * n_experts] */
    uint32_t last_experts, last_pairs;
};

int moe_create(const struct model *m, uint32_t max_tok, struct moe **out)
{
    const struct iebin_hparams *hp = &m->hp;
    struct moe *s = calloc(1, sizeof *s);
    if (!s) {
        LOG_ERR("moe: out of memory");
        return -ENOMEM;
    }
    s->m = m;
    s->max_tok = max_tok;
    s->k = hp->n_experts_used;
    s->ne = hp->n_experts;
    const uint64_t pairs = (uint64_t)max_tok * s->k;
    int rc;
    if ((rc = model_alloc_f32("moe", "router logits", max_tok, s->ne, 1, &s->logits)) ||
        (rc = model_alloc_f32("moe", "routing weights", pairs, 1, 1, &s->w)) ||
        (rc = model_alloc_f32("moe", "gathered rows", pairs, hp->dim, 1, &s->xg)) ||
        (rc = model_alloc_f32("moe", "gate activations", pairs, hp->ffn_dim, 1, &s->g)) ||
        (rc = model_alloc_f32("moe", "up activations", pairs, hp->ffn_dim, 1, &s->u)) ||
        (rc = model_alloc_f32("moe", "expert outputs", pairs, hp->dim, 1, &s->y))) {
        moe_destroy(s);
        return rc;
    }
    s->sel = calloc(pairs ? pairs : 1, sizeof *s->sel);
    s->slot = calloc(pairs ? pairs : 1, sizeof *s->slot);
    s->off = calloc(s->ne + 1, sizeof *s->off);
    s->fill = calloc(s->ne, sizeof *s->fill);
    s->prods = calloc(2 * (size_t)s->ne, sizeof *s->prods);
    if (!s->sel || !s->slot || !s->off || !s->fill || !s->prods) {
        LOG_ERR("moe: out of memory for the routing tables of %u rows", max_tok);
        moe_destroy(s);
        return -ENOMEM;
    }
    *out = s;
    return 0;
}

void moe_destroy(struct moe *s)
{
    if (!s)
        return;
    float *bufs[] = {s->logits, s->w, s->xg, s->g, s->u, s->y};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
    free(s->sel);
    free(s->slot);
    free(s->off);
    free(s->fill);
    free(s->prods);
    free(s);
}

void moe_last_counts(const struct moe *s, uint32_t *experts, uint32_t *pairs)
{
    *experts = s->last_experts;
    *pairs = s->last_pairs;
}

/*
 * Top-k of logits [ne] into sel [k] (decreasing; among equal logits the lowest index first,
 * as a strict > scan from index 0 gives) and their softmax into w [k].
 */
static void route(const float *logits, uint32_t ne, uint32_t k, uint32_t *sel, float *w)
{
    for (uint32_t i = 0; i < k; i++) {
        uint32_t best = UINT32_MAX;
        for (uint32_t e = 0; e < ne; e++) {
            bool taken = false;
            for (uint32_t j = 0; j < i; j++)
                taken |= sel[j] == e;
            if (!taken && (best == UINT32_MAX || logits[e] > logits[best]))
                best = e;
        }
        sel[i] = best;
    }
    const float mx = logits[sel[0]];
    float sum = 0;
    for (uint32_t i = 0; i < k; i++)
        sum += w[i] = expf(logits[sel[i]] - mx);
    for (uint32_t i = 0; i < k; i++)
        w[i] /= sum;
}

/*
 * The biases and the clamped SwiGLU of gathered rows [b, e) (row r belongs to the expert e
 * with off[e] <= r < off[e + 1]), into g. One element's steps are the same whichever thread
 * runs it, so sharing the rows over the pool keeps the bits.
 */
struct swiglu_job {
    const struct moe *s;
    const struct model_layer *L;
    size_t ffn;
    float limit, alpha;
};

static void swiglu_rows(void *arg, size_t b, size_t e, int thread)
{
    (void)thread;
    const struct swiglu_job *j = arg;
    const struct moe *s = j->s;
    const size_t ffn = j->ffn;
    size_t ex = 0;
    while (s->off[ex + 1] <= b) /* the expert of row b: off[] is non-decreasing */
        ex++;
    for (size_t r = b; r < e; r++) {
        while (s->off[ex + 1] <= r)
            ex++;
        const float *bg = j->L->gate_exps_bias + ex * ffn, *bu = j->L->up_exps_bias + ex * ffn;
        /* the vector kernel (fm_expf, not libm's scalar expf: 2.3% of the bf16 8-stream step
         * in session 20's profile); per element, so any row split keeps the bits */
        kern_swiglu_clamp(s->g + r * ffn, s->u + r * ffn, bg, bu, ffn, j->alpha, j->limit);
    }
}

/* Runs prods [n] as groups of at most MATMUL_GROUP_MAX products. */
static void run_groups(struct matmul_ctx *mm, const struct matmul_prod *p, size_t n)
{
    for (size_t i = 0; i < n; i += MATMUL_GROUP_MAX)
        matmul_group(mm, p + i, n - i < MATMUL_GROUP_MAX ? n - i : MATMUL_GROUP_MAX);
}

void moe_ffn(struct moe *s, struct matmul_ctx *mm, const struct model_layer *L, const float *xn,
             size_t n, float *out)
{
    const struct iebin_hparams *hp = &s->m->hp;
    const size_t dim = hp->dim, ffn = hp->ffn_dim, k = s->k, ne = s->ne;
    const float limit = hp->swiglu_limit, alpha = hp->swiglu_alpha;
    CHECK(n <= s->max_tok); /* the passes size their chunks to the scratch */

    /* router: logits [n][ne], then each row's top-k and weights */
    matmul_one(mm, &L->router, xn, n, s->logits, ne);
    for (size_t t = 0; t < n; t++) {
        float *lg = s->logits + t * ne;
        for (size_t e = 0; e < ne; e++)
            lg[e] += L->router_bias[e];
        route(lg, (uint32_t)ne, (uint32_t)k, s->sel + t * k, s->w + t * k);
    }

    /* gather: a counting sort of the (t, i) pairs by expert, rows in token order */
    memset(s->off, 0, (ne + 1) * sizeof *s->off);
    for (size_t p = 0; p < n * k; p++)
        s->off[s->sel[p] + 1]++;
    for (size_t e = 0; e < ne; e++)
        s->off[e + 1] += s->off[e];
    memcpy(s->fill, s->off, ne * sizeof *s->fill);
    for (size_t p = 0; p < n * k; p++) {
        const uint32_t r = s->fill[s->sel[p]]++;
        s->slot[p] = r;
        memcpy(s->xg + (size_t)r * dim, xn + (p / k) * dim, dim * sizeof *xn);
    }

    /* gate and up of every chosen expert: one input per expert, prepared once for both */
    size_t np = 0;
    uint32_t used = 0;
    for (size_t e = 0; e < ne; e++) {
        const size_t r0 = s->off[e], cnt = s->off[e + 1] - r0;
        if (!cnt)
            continue;
        used++;
        const float *x = s->xg + r0 * dim;
        s->prods[np++] = (struct matmul_prod){&L->gate_exps[e], x, cnt, s->g + r0 * ffn, ffn,
                                              LORA_GATE};
        s->prods[np++] = (struct matmul_prod){&L->up_exps[e], x, cnt, s->u + r0 * ffn, ffn,
                                              LORA_UP};
    }
    run_groups(mm, s->prods, np);

    /* biases and the clamped SwiGLU, a [T*k][ffn] into g: over the pool, whose workers are
     * still spinning from the products (one stream's 4 rows are ~11.5k exps, tens of µs that
     * the other thread otherwise spends waiting; docs/PERFORMANCE.md "gpt-oss decode, session
     * 14") */
    struct swiglu_job sj = {s, L, ffn, limit, alpha};
    if (mm->pool && pool_threads(mm->pool) > 1 && n * k > 1)
        pool_for(mm->pool, 0, n * k, 1, swiglu_rows, &sj);
    else
        swiglu_rows(&sj, 0, n * k, 0);

    /* down of every chosen expert */
    np = 0;
    for (size_t e = 0; e < ne; e++) {
        const size_t r0 = s->off[e], cnt = s->off[e + 1] - r0;
        if (cnt)
            s->prods[np++] = (struct matmul_prod){&L->down_exps[e], s->g + r0 * ffn, cnt,
                                                  s->y + r0 * dim, dim, LORA_DOWN};
    }
    run_groups(mm, s->prods, np);

    /* scatter: out_t = sum_i w_i (y + bd), in the row's top-k order */
    for (size_t t = 0; t < n; t++) {
        float *o = out + t * dim;
        memset(o, 0, dim * sizeof *o);
        for (size_t i = 0; i < k; i++) {
            const size_t p = t * k + i;
            const float *y = s->y + (size_t)s->slot[p] * dim;
            const float *bd = L->down_exps_bias + (size_t)s->sel[p] * dim;
            const float w = s->w[p];
            for (size_t j = 0; j < dim; j++)
                o[j] += w * (y[j] + bd[j]);
        }
    }
    s->last_experts = used;
    s->last_pairs = (uint32_t)(n * k);
}
