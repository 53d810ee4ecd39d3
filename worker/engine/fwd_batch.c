/*
 * fwd_batch.c — the batched forward pass of the serving engine (engine_internal.h).
 *
 * The same equations as the reference (forward.c, docs/DESIGN.md "Forward pass"), for a batch
 * that mixes sequences: rows [t0, t0+n) of the stacked activations belong to one sequence
 * whose positions are pos0 .. pos0+n-1. What is per token (embedding, RMSNorm, RoPE at the
 * token's own position, SwiGLU) runs row by row; what reads weights (the seven projections
 * and the classifier) is ONE matmul over all rows of the step, so the weights are streamed
 * once per step whatever the number of sequences; attention is per sequence over its own
 * paged KV (kv_attn_prefill: causal within the chunk, a decode is a chunk of one).
 *
 * LoRA seam: projections that are ready together (q/k/v, o, gate/up, down) form a group;
 * in a step with adapters each group's base products and its grouped low-rank update (lora.h)
 * run as ONE pool job, lora_matmul_fused, whose adapter-reading tasks are interleaved with the
 * base GEMM's row tiles (plan built once per run; the engine orders the batch so that rows of
 * one adapter are adjacent: one segment each). Base-only steps keep pool_matmul per
 * projection unless CLOCHER_FWD_ONE_JOB=1 (a measurement knob, docs/LORA.md).
 *
 * NOTES: runs on the engine's owner thread; matmul rows, LoRA rank/output rows and
 * (sequence, KV head) attention tasks are sharded over the pool. Every buffer is allocated
 * once in engine__fwd_create; a run allocates only when the LoRA plan grows.
 */
#include "engine_internal.h"

#include "check.h"
#include "err.h"
#include "kern.h"
#include "log.h"
#include "pool.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define LORA_GROUP_MAX 3 /* projections updated together: q, k, v */

struct engine__fwd {
    const struct model *m;
    struct pool *pool;
    void (*progress)(void *); /* before each layer (engine_set_progress) */
    void *progress_ud;
    uint32_t max_tok, max_seqs;

    float *x;        /* [T][dim]      residual stream */
    float *xb;       /* [T][dim]      normalized input of a block */
    float *q;        /* [T][q_dim]    queries */
    float *k, *v;    /* [T][kv_dim]   new keys and values, before kv_seq_write */
    float *att;      /* [T][q_dim]    attention output */
    float *proj;     /* [T][dim]      attn_o / ffn_down output */
    float *gate;     /* [T][ffn_dim]  */
    float *up;       /* [T][ffn_dim]  */
    float *rope;     /* [T][head_dim/2][2] cos, sin per token */
    float *inv_freq; /* [head_dim/2] */
    float *logits;   /* [S][vocab]   */
    float *lnorm;    /* [S][dim]      normalized last rows for the classifier */

    /* LoRA: per-token adapters, the step's plan and its scratch */
    const struct lora_adapter **tok_ad; /* [T] */
    float *tok_scale;                   /* [T] */
    struct lora_plan plan;
    float *lora_tmp;
    size_t lora_tmp_cap;
    struct lora_ws lora_ws; /* lora_matmul_fused's scratch */
    bool base_one_job;      /* CLOCHER_FWD_ONE_JOB=1: base-only steps run their groups as
                             * lora_matmul_fused jobs too (a measurement knob: the LoRA cost
                             * against the same job structure; the default keeps pool_matmul) */
};

static int alloc_f32(uint64_t a, uint64_t b, float **out)
{
    uint64_t n, bytes;
    if (dtype_mul_u64(a, b, &n) || dtype_mul_u64(n, sizeof(float), &bytes) ||
        bytes > SIZE_MAX - 64) {
        LOG_ERR("engine: a step buffer of %llu x %llu floats overflows", (unsigned long long)a,
                (unsigned long long)b);
        return ERR_OVERFLOW;
    }
    size_t size = ((size_t)bytes + 63) / 64 * 64;
    *out = aligned_alloc(64, size ? size : 64);
    if (!*out) {
        LOG_ERR("engine: out of memory for a step buffer (%llu bytes)", (unsigned long long)bytes);
        return -ENOMEM;
    }
    return 0;
}

int engine__fwd_create(const struct model *m, struct pool *pool, uint32_t max_tok,
                       uint32_t max_seqs, struct engine__fwd **out)
{
    const struct iebin_hparams *hp = &m->hp;
    struct engine__fwd *f = calloc(1, sizeof *f);
    if (!f) {
        LOG_ERR("engine: out of memory");
        return -ENOMEM;
    }
    f->m = m;
    f->pool = pool;
    f->max_tok = max_tok;
    f->max_seqs = max_seqs;
    lora_plan_init(&f->plan);
    const char *one_job = getenv("CLOCHER_FWD_ONE_JOB");
    f->base_one_job = one_job && !strcmp(one_job, "1");
    const uint64_t T = max_tok, S = max_seqs;
    int rc;
    if ((rc = alloc_f32(T, hp->dim, &f->x)) || (rc = alloc_f32(T, hp->dim, &f->xb)) ||
        (rc = alloc_f32(T, m->q_dim, &f->q)) || (rc = alloc_f32(T, m->kv_dim, &f->k)) ||
        (rc = alloc_f32(T, m->kv_dim, &f->v)) || (rc = alloc_f32(T, m->q_dim, &f->att)) ||
        (rc = alloc_f32(T, hp->dim, &f->proj)) || (rc = alloc_f32(T, hp->ffn_dim, &f->gate)) ||
        (rc = alloc_f32(T, hp->ffn_dim, &f->up)) || (rc = alloc_f32(T, hp->head_dim, &f->rope)) ||
        (rc = alloc_f32(hp->head_dim / 2 + 1, 1, &f->inv_freq)) ||
        (rc = alloc_f32(S, hp->vocab_size, &f->logits)) || (rc = alloc_f32(S, hp->dim, &f->lnorm)) ||
        (rc = alloc_f32(T, 1, &f->tok_scale))) {
        engine__fwd_destroy(f);
        return rc;
    }
    f->tok_ad = calloc(T ? T : 1, sizeof *f->tok_ad);
    if (!f->tok_ad) {
        LOG_ERR("engine: out of memory for the step's adapter table");
        engine__fwd_destroy(f);
        return -ENOMEM;
    }
    /* as the reference: theta^(-2i/head_dim) in double */
    for (uint32_t i = 0; i < hp->head_dim / 2; i++)
        f->inv_freq[i] =
            (float)pow((double)hp->rope_theta, -(double)(2 * i) / (double)hp->head_dim);
    *out = f;
    return 0;
}

void engine__fwd_destroy(struct engine__fwd *f)
{
    if (!f)
        return;
    float *bufs[] = {f->x,    f->xb,   f->q,    f->k,        f->v,      f->att,
                     f->proj, f->gate, f->up,   f->rope,     f->inv_freq, f->logits,
                     f->lnorm, f->tok_scale, f->lora_tmp};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
    free(f->tok_ad);
    lora_plan_fini(&f->plan);
    lora_ws_fini(&f->lora_ws);
    free(f);
}

/* ---- building blocks (RMSNorm, RoPE, SwiGLU are the kernels forward.c calls too) ----------- */

/* y [n][ldy] = x [n][cols] W^T: one matmul for the whole step, rows sharded over the pool. */
static void matmul(const struct engine__fwd *f, const struct model_mat *w, const float *x,
                   size_t n, float *y, size_t ldy)
{
    if (w->panels && f->pool) /* q4_0 / q8_0 repacked at load (model.h) */
        pool_matmul_panels(f->pool, w->dtype, w->panels, w->cols, x, n, y, ldy, 0, w->rows);
    else if (w->panels)
        kern_matmul_panels(w->dtype, w->panels, w->cols, x, n, y, ldy, 0, w->rows);
    else if (f->pool)
        pool_matmul(f->pool, w->dtype, w->data, w->cols, x, n, y, ldy, 0, w->rows);
    else
        kern_matmul(w->dtype, w->data, w->cols, x, n, y, ldy, 0, w->rows);
}

/*
 * k products of the same activations x [n][w->cols] (q, k, v; gate, up): one pool job
 * (pool_matmul_group), or one by one without a pool. ys[i]: [n][ldys[i]].
 */
static void matmul_group(const struct engine__fwd *f, const struct model_mat *const *w,
                         float *const *ys, const size_t *ldys, size_t k, const float *x,
                         size_t n)
{
    if (!f->pool) {
        for (size_t i = 0; i < k; i++)
            matmul(f, w[i], x, n, ys[i], ldys[i]);
        return;
    }
    struct pool_mm mm[POOL_MM_GROUP_MAX];
    CHECK(k <= POOL_MM_GROUP_MAX);
    for (size_t i = 0; i < k; i++) {
        CHECK(w[i]->cols == w[0]->cols);
        mm[i] = (struct pool_mm){w[i]->dtype, w[i]->panels != NULL,
                                 w[i]->panels ? w[i]->panels : w[i]->data,
                                 w[i]->rows, ys[i], ldys[i]};
    }
    pool_matmul_group(f->pool, mm, k, x, w[0]->cols, n);
}

/*
 * The LoRA seam: after the base products of projections that share their readiness (q, k, v;
 * gate, up; o; down), the grouped low-rank update of the adapted rows, as two pool jobs for
 * the whole group (lora_apply_fused: shrink, then expand).
 */
static void lora_group(const struct engine__fwd *f, uint32_t layer, const struct lora_proj *pr,
                       size_t n_proj)
{
    if (f->plan.max_rank == 0)
        return;
    CHECK(n_proj <= LORA_GROUP_MAX);
    lora_apply_fused(&f->plan, f->pool, layer, pr, n_proj, f->lora_tmp);
}

/*
 * The base products of projections that are ready together (q, k, v; gate, up; o; down) and,
 * when the step has adapters, their LoRA update. With adapters both run as one pool job
 * (lora_matmul_fused: adapter reads interleaved with the base GEMM's tiles); without, or if
 * its scratch cannot grow, the base products are the plain matmuls and the update follows.
 * w[i] is pr[i]'s base weight.
 */
static void proj_group(struct engine__fwd *f, uint32_t layer, const struct model_mat *const *w,
                       const struct lora_proj *pr, size_t n_proj, size_t n_tok)
{
    CHECK(n_proj <= LORA_GROUP_MAX);
    if (f->plan.max_rank > 0 || f->base_one_job) {
        struct lora_base_mat bm[LORA_GROUP_MAX];
        for (size_t i = 0; i < n_proj; i++)
            bm[i] = (struct lora_base_mat){w[i]->dtype, w[i]->data, w[i]->panels, w[i]->cols,
                                           w[i]->rows};
        if (lora_matmul_fused(&f->plan, f->pool, layer, pr, bm, n_proj, f->lora_tmp,
                              &f->lora_ws) == 0)
            return;
    }
    if (n_proj == 1) {
        matmul(f, w[0], pr[0].x, n_tok, pr[0].y, pr[0].ldy);
    } else { /* q, k, v or gate, up: the same input, one pool job */
        float *ys[LORA_GROUP_MAX];
        size_t ldys[LORA_GROUP_MAX];
        for (size_t i = 0; i < n_proj; i++) {
            CHECK(pr[i].x == pr[0].x);
            ys[i] = pr[i].y, ldys[i] = pr[i].ldy;
        }
        matmul_group(f, w, ys, ldys, n_proj, pr[0].x, n_tok);
    }
    lora_group(f, layer, pr, n_proj);
}

/* One task per (sequence, KV head): paged attention of the sequence's chunk. */
struct attn_job {
    const struct engine__fwd *f;
    const struct engine__bseq *seqs;
    uint32_t layer;
};

static void attn_task(void *ctx, size_t task, int thread)
{
    (void)thread;
    const struct attn_job *j = ctx;
    const struct model *m = j->f->m;
    const uint32_t nkv = m->hp.n_kv_heads;
    const struct engine__bseq *s = &j->seqs[task / nkv];
    const uint32_t g = (uint32_t)(task % nkv);
    int rc = kv_attn_prefill(s->kv, j->layer, m->hp.n_heads, s->pos0, s->n,
                             j->f->q + s->t0 * m->q_dim, j->f->att + s->t0 * m->q_dim, g, g + 1);
    CHECK(rc == 0); /* the engine reserved and wrote these rows: a failure is a bug */
}

/* ---- the pass ------------------------------------------------------------------------------ */

static int build_lora_plan(struct engine__fwd *f, const struct engine__bseq *seqs, size_t n_seqs,
                           size_t n_tok)
{
    bool any = false;
    for (size_t i = 0; i < n_seqs; i++) {
        for (size_t t = seqs[i].t0; t < seqs[i].t0 + seqs[i].n; t++) {
            f->tok_ad[t] = seqs[i].ad;
            f->tok_scale[t] = seqs[i].ad ? seqs[i].scale : 0.0f;
        }
        any |= seqs[i].ad != NULL;
    }
    if (!any) {
        f->plan.max_rank = 0;
        f->plan.n_segs = 0;
        f->plan.n_tok = n_tok; /* lora_matmul_fused of a base-only step reads it */
        return 0;
    }
    int rc = lora_plan_build(&f->plan, f->tok_ad, f->tok_scale, n_tok);
    if (rc)
        return rc;
    /* one T per projection of the largest group (q, k, v) */
    size_t need = f->plan.tmp_floats * LORA_GROUP_MAX;
    if (need > f->lora_tmp_cap) {
        float *t = realloc(f->lora_tmp, need * sizeof *t);
        if (!t) {
            LOG_ERR("engine: out of memory for the LoRA scratch (%zu floats)", need);
            return -ENOMEM;
        }
        f->lora_tmp = t;
        f->lora_tmp_cap = need;
    }
    return 0;
}

void engine__fwd_set_progress(struct engine__fwd *f, void (*fn)(void *), void *ud)
{
    f->progress = fn;
    f->progress_ud = ud;
}

int engine__fwd_run(struct engine__fwd *f, const int32_t *tokens, size_t n_tok,
                    const struct engine__bseq *seqs, size_t n_seqs, const float **logits)
{
    const struct model *m = f->m;
    const struct iebin_hparams *hp = &m->hp;
    const size_t dim = hp->dim, hd = hp->head_dim, qd = m->q_dim, kvd = m->kv_dim;
    const size_t ffn = hp->ffn_dim, half = hd / 2;
    CHECK(n_tok <= f->max_tok && n_seqs <= f->max_seqs);

    int rc = build_lora_plan(f, seqs, n_seqs, n_tok);
    if (rc)
        return rc;

    /* embedding and each token's RoPE angles at its own position */
    for (size_t i = 0; i < n_seqs; i++)
        for (uint32_t k = 0; k < seqs[i].n; k++) {
            size_t t = seqs[i].t0 + k;
            model_embed_row(m, (uint32_t)tokens[t], f->x + t * dim);
            kern_rope_table(f->rope + t * half * 2, seqs[i].pos0 + k, f->inv_freq, half);
        }

    for (uint32_t l = 0; l < hp->n_layers; l++) {
        const struct model_layer *L = &m->layers[l];
        if (f->progress)
            f->progress(f->progress_ud);

        for (size_t t = 0; t < n_tok; t++)
            kern_rmsnorm(f->xb + t * dim, f->x + t * dim, L->attn_norm, dim, hp->rms_eps);
        proj_group(f, l, (const struct model_mat *[]){&L->wq, &L->wk, &L->wv},
                   (const struct lora_proj[]){{LORA_Q, f->xb, f->q, qd},
                                              {LORA_K, f->xb, f->k, kvd},
                                              {LORA_V, f->xb, f->v, kvd}},
                   3, n_tok);
        for (size_t t = 0; t < n_tok; t++) {
            kern_rope(f->q + t * qd, hp->n_heads, hd, f->rope + t * half * 2);
            kern_rope(f->k + t * kvd, hp->n_kv_heads, hd, f->rope + t * half * 2);
        }
        for (size_t i = 0; i < n_seqs; i++) {
            rc = kv_seq_write(seqs[i].kv, l, f->k + seqs[i].t0 * kvd, f->v + seqs[i].t0 * kvd,
                              seqs[i].n);
            CHECK(rc == 0); /* reserved by the engine */
        }
        struct attn_job aj = {f, seqs, l};
        size_t n_tasks = n_seqs * hp->n_kv_heads;
        if (f->pool)
            pool_run(f->pool, attn_task, &aj, n_tasks);
        else
            for (size_t i = 0; i < n_tasks; i++)
                attn_task(&aj, i, 0);
        proj_group(f, l, (const struct model_mat *[]){&L->wo},
                   (const struct lora_proj[]){{LORA_O, f->att, f->proj, dim}}, 1, n_tok);
        for (size_t i = 0; i < n_tok * dim; i++)
            f->x[i] += f->proj[i];

        for (size_t t = 0; t < n_tok; t++)
            kern_rmsnorm(f->xb + t * dim, f->x + t * dim, L->ffn_norm, dim, hp->rms_eps);
        proj_group(f, l, (const struct model_mat *[]){&L->w_gate, &L->w_up},
                   (const struct lora_proj[]){{LORA_GATE, f->xb, f->gate, ffn},
                                              {LORA_UP, f->xb, f->up, ffn}},
                   2, n_tok);
        kern_swiglu(f->gate, f->gate, f->up, n_tok * ffn); /* silu(gate) * up, in place */
        proj_group(f, l, (const struct model_mat *[]){&L->w_down},
                   (const struct lora_proj[]){{LORA_DOWN, f->gate, f->proj, dim}}, 1, n_tok);
        for (size_t i = 0; i < n_tok * dim; i++)
            f->x[i] += f->proj[i];
    }

    /* classifier: one matmul over the last rows of the sequences that sample */
    size_t n_out = 0;
    for (size_t i = 0; i < n_seqs; i++)
        if (seqs[i].logits) {
            size_t t = seqs[i].t0 + seqs[i].n - 1;
            kern_rmsnorm(f->lnorm + n_out * dim, f->x + t * dim, m->output_norm, dim, hp->rms_eps);
            n_out++;
        }
    if (n_out)
        matmul(f, &m->output, f->lnorm, n_out, f->logits, hp->vocab_size);
    *logits = f->logits;
    return 0;
}
