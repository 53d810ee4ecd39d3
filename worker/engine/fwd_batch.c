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
 * qwen2: q/k/v biases; Mistral: the window on every layer. gpt_oss (forward.c lists the
 * differences): the biases, YaRN's table (model_rope_row), the
 * layer's window and sinks in the paged attention (kv_attn_prefill_swa), and the mixture of
 * experts (moe.h) over ALL rows of the step: the rows are routed, then gathered by expert, so
 * each expert any sequence chose is read once per step, whatever the number of sequences.
 *
 * LoRA seam: projections that are ready together (q/k/v, o, gate/up, down) form a group, and
 * every group is one matmul_group_lora call (matmul.h) with the step's plan (built once per
 * run; the engine orders the batch so that rows of one adapter are adjacent: one segment
 * each). In a step with adapters the group's base products and its low-rank update run as ONE
 * pool job whose adapter-reading tasks are interleaved with the base GEMM's row tiles; a
 * base-only step runs the group as a plain matmul_group unless CLOCHER_FWD_ONE_JOB=1 (a
 * measurement knob, docs/LORA.md).
 *
 * Batch invariance (engine_request.batch_invariant, docs/DESIGN.md "Batch invariance"): a
 * step with an invariant sequence runs every product of the step invariant (matmul_ctx.
 * invariant) and its LoRA update as separate jobs; everything else here is per token or per
 * (sequence, query row) already, so a token's bits do not depend on the batch around it.
 *
 * NOTES: runs on the engine's owner thread; matmul rows, LoRA rank/output rows, (sequence, KV
 * head) attention tasks and, with enough rows, the per-token work between them (norms with the
 * deferred residual add, biases + RoPE + KV writes per sequence, SwiGLU) are sharded over the
 * pool. Every buffer is allocated
 * once in engine__fwd_create; a run allocates only when the LoRA plan or the products'
 * scratch grows.
 */
#include "engine_internal.h"

#include "check.h"
#include "err.h"
#include "kern.h"
#include "log.h"
#include "matmul.h"
#include "moe.h"
#include "pool.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
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
    struct moe *moe; /* gpt_oss: the expert block's scratch for T rows */
    atomic_uint *heads_left; /* [S] a sequence's attention tasks not yet done (attn_task) */

    /* LoRA: per-token adapters, the step's plan and its scratch */
    const struct lora_adapter **tok_ad; /* [T] */
    float *tok_scale;                   /* [T] */
    struct lora_plan plan;
    float *lora_tmp;                    /* [LORA_GROUP_MAX][plan.tmp_floats] T per projection */
    size_t lora_tmp_cap;
    struct matmul_ctx mm; /* the products; base_one_job from CLOCHER_FWD_ONE_JOB=1 (a
                           * measurement knob: the LoRA cost against the same job structure) */
};

static int alloc_f32(uint64_t a, uint64_t b, float **out)
{
    return model_alloc_f32("engine", "step buffer", a, b, 1, out);
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
    matmul_ctx_init(&f->mm, pool);
    const char *one_job = getenv("CLOCHER_FWD_ONE_JOB");
    f->mm.base_one_job = one_job && !strcmp(one_job, "1");
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
    f->heads_left = calloc(S ? S : 1, sizeof *f->heads_left);
    if (!f->heads_left) {
        LOG_ERR("engine: out of memory for the step's attention counters");
        engine__fwd_destroy(f);
        return -ENOMEM;
    }
    if (m->moe && (rc = moe_create(m, max_tok, &f->moe))) {
        engine__fwd_destroy(f);
        return rc;
    }
    model_rope_inv_freq(m, f->inv_freq); /* as the reference */
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
    free(f->heads_left);
    moe_destroy(f->moe);
    lora_plan_fini(&f->plan);
    matmul_ctx_fini(&f->mm);
    free(f);
}

/* ---- building blocks (RMSNorm, RoPE, SwiGLU are the kernels forward.c calls too) ----------- */

/*
 * Projections that are ready together (q, k, v; gate, up; o; down): their base products over
 * the whole step and, when the step has adapters, the plan's update, as one pool job
 * (matmul_group_lora). g[i].y: [n_tok][ldy].
 */
static void project(struct engine__fwd *f, uint32_t layer, const struct matmul_prod *g, size_t k)
{
    CHECK(k <= LORA_GROUP_MAX);
    if (f->mm.invariant) { /* the fused job's base tiles are not batch invariant */
        matmul_group(&f->mm, g, k);
        if (f->plan.n_segs) {
            struct lora_proj pr[LORA_GROUP_MAX];
            for (size_t i = 0; i < k; i++)
                pr[i] = (struct lora_proj){g[i].t, g[i].x, g[i].y, g[i].ldy};
            lora_apply_fused(&f->plan, f->pool, layer, pr, k, f->lora_tmp);
        }
        return;
    }
    /* -ENOMEM: it ran as separate jobs instead, with the same numbers (logged) */
    (void)matmul_group_lora(&f->mm, g, k, &f->plan, layer, f->lora_tmp);
}

/*
 * One task per (sequence, KV head): paged attention of the sequence's chunk. With prep (the
 * o product's inputs, matmul_group_begin), the task that finishes a sequence's last head
 * prepares that sequence's rows of att for the o product: no serial preparation on the
 * engine's thread between this job and the product (the other threads spun through it).
 * Only below ATT_PREP_MAX floats of att: from there on (matmul.c's ACT_PAR_MIN) the product
 * prepares its input over the pool by tokens, which a prefill chunk's single last task
 * would not.
 */
#define ATT_PREP_MAX ((size_t)1 << 16)
struct attn_job {
    const struct engine__fwd *f;
    const struct engine__bseq *seqs;
    uint32_t layer;
    const struct matmul_prep *prep; /* the o product's, or NULL */
};

static void attn_task(void *ctx, size_t task, int thread)
{
    (void)thread;
    const struct attn_job *j = ctx;
    const struct model *m = j->f->m;
    const uint32_t nkv = m->hp.n_kv_heads;
    const struct engine__bseq *s = &j->seqs[task / nkv];
    const uint32_t g = (uint32_t)(task % nkv);
    const struct model_layer *L = &m->layers[j->layer]; /* llama, qwen2: no sinks; a window
                                                         * on every layer or none */
    const struct kv_seq *kv = L->window && s->kvw ? s->kvw : s->kv;
    const uint32_t kl = s->kvw ? L->kind_index : j->layer;
    int rc = kv_attn_prefill_swa(kv, kl, m->hp.n_heads, s->pos0, s->n,
                                 j->f->q + s->t0 * m->q_dim, j->f->att + s->t0 * m->q_dim, g,
                                 g + 1, L->window, L->sinks);
    CHECK(rc == 0); /* the engine reserved and wrote these rows: a failure is a bug */
    /* acq_rel: the last of the sequence's tasks sees the rows the others wrote */
    if (j->prep && atomic_fetch_sub_explicit(&j->f->heads_left[task / nkv], 1,
                                             memory_order_acq_rel) == 1)
        matmul_prep_rows(j->prep, s->t0, s->t0 + s->n);
}

/* ---- the per-row work between products, over the pool ------------------------------------ */

/*
 * What is per token (norms, residual adds, biases, RoPE, KV writes, SwiGLU) runs in shards of
 * rows over the pool, each row by the same kernel call as on one thread, so its bits do not
 * depend on the split nor on the batch. With 8 decode streams this work on the engine's thread
 * alone was ~12% of a step while the other threads spun; the residual add is deferred into
 * the next normalization (one pass over x instead of two, one job instead of two).
 */
#define NORM_PAR_MIN 4        /* rows: below, a job's fork and join cost what the split saves */
#define ROPE_KV_PAR_MIN 2     /* sequences */
#define SWIGLU_PAR_MIN 16384  /* floats: one decode stream's 5632 stays on the calling thread */

/* fn over [0, n) in shards of whole grains over the pool from min_par units on, else here. */
static void rows_over_pool(struct engine__fwd *f, size_t n, size_t grain, size_t min_par,
                           pool_range_fn *fn, void *ctx)
{
    if (f->pool && n >= min_par && n > grain)
        pool_for(f->pool, 0, n, grain, fn, ctx);
    else if (n)
        fn(ctx, 0, n, 0);
}

/* x[t] += proj[t] (+ bias first, as model_add_bias then the add did) when add, then
 * out[t] = RMSNorm(x[t]) * w, for the rows t of [b, e), then those rows of the next products'
 * inputs prepared (matmul_group_begin) when prep is set. */
struct norm_job {
    const struct engine__fwd *f;
    float *add;         /* [T][dim] proj (the bias is added into it), or NULL: x as it is */
    const float *bias;  /* [dim] added to proj first, or NULL */
    const float *w;     /* [dim] the norm's weight */
    const struct matmul_prep *prep; /* the group reading xb, or NULL */
};

static void norm_rows(void *ctx, size_t b, size_t e, int thread)
{
    (void)thread;
    const struct norm_job *j = ctx;
    const struct engine__fwd *f = j->f;
    const size_t dim = f->m->hp.dim;
    for (size_t t = b; t < e; t++) {
        float *x = f->x + t * dim;
        if (j->add) {
            float *p = j->add + t * dim;
            if (j->bias)
                model_add_bias(p, 1, dim, j->bias, dim);
            for (size_t i = 0; i < dim; i++)
                x[i] += p[i];
        }
        kern_rmsnorm(f->xb + t * dim, x, j->w, dim, f->m->hp.rms_eps);
    }
    if (j->prep)
        matmul_prep_rows(j->prep, b, e);
}

static void add_norm(struct engine__fwd *f, size_t n_tok, float *add, const float *bias,
                     const float *w, const struct matmul_prep *prep)
{
    struct norm_job j = {f, add, bias, w, prep};
    rows_over_pool(f, n_tok, 1, NORM_PAR_MIN, norm_rows, &j);
}

/*
 * A group reading xb, its inputs prepared by the norm job that writes xb (matmul.h,
 * matmul_group_begin), with or without adapters in the step (a group they adapt runs the fused
 * LoRA job on those inputs: matmul_group_lora_end; under the one-job knob a base-only step's
 * groups too, so that the knob's base steps differ from adapted ones by the update alone:
 * until session 24 they prepared their inputs in the fused job's PREP tasks, whose waits
 * were ~1.5 % of the step). matmul_group_begin declines invariant products. NULL: project().
 */
static const struct matmul_prep *fused_begin(struct engine__fwd *f, uint32_t layer,
                                             const struct matmul_prod *g, size_t k)
{
    /* with adapters in the step, the adapters' forms of the inputs too (matmul.h) */
    if (f->plan.n_segs && matmul_lora_adapts(&f->plan, layer, g, k))
        return matmul_group_begin_lora(&f->mm, g, k, &f->plan, layer);
    return matmul_group_begin(&f->mm, g, k);
}

static void project_fused(struct engine__fwd *f, uint32_t layer, const struct matmul_prod *g,
                          size_t k, const struct matmul_prep *prep)
{
    if (!prep)
        project(f, layer, g, k);
    else if (f->plan.n_segs || f->mm.base_one_job) /* the knob: base-only steps too */
        /* -ENOMEM: it ran as separate jobs instead, with the same numbers (logged) */
        (void)matmul_group_lora_end(&f->mm, g, k, &f->plan, layer, f->lora_tmp);
    else
        matmul_group_end(&f->mm, g, k);
}

/* Sequence i's new rows: q/k/v biases (qwen2, gpt_oss), RoPE of q and k at each token's
 * position, and the K/V rows into its cache. Sequences own their kv_seq: tasks never share
 * one. */
struct rope_kv_job {
    const struct engine__fwd *f;
    const struct engine__bseq *seqs;
    uint32_t layer;
};

static void rope_kv_seqs(void *ctx, size_t b, size_t e, int thread)
{
    (void)thread;
    const struct rope_kv_job *j = ctx;
    const struct engine__fwd *f = j->f;
    const struct model *m = f->m;
    const struct model_layer *L = &m->layers[j->layer];
    const size_t hd = m->hp.head_dim, qd = m->q_dim, kvd = m->kv_dim, half = hd / 2;
    for (size_t i = b; i < e; i++) {
        const struct engine__bseq *s = &j->seqs[i];
        float *q = f->q + s->t0 * qd, *k = f->k + s->t0 * kvd, *v = f->v + s->t0 * kvd;
        if (L->bq) {
            model_add_bias(q, s->n, qd, L->bq, qd);
            model_add_bias(k, s->n, kvd, L->bk, kvd);
            model_add_bias(v, s->n, kvd, L->bv, kvd);
        }
        for (size_t t = 0; t < s->n; t++) {
            const float *cs = f->rope + (s->t0 + t) * half * 2;
            kern_rope(q + t * qd, m->hp.n_heads, hd, cs);
            kern_rope(k + t * kvd, m->hp.n_kv_heads, hd, cs);
        }
        struct kv_seq *kv = L->window && s->kvw ? s->kvw : s->kv;
        int rc = kv_seq_write(kv, s->kvw ? L->kind_index : j->layer, k, v, s->n);
        CHECK(rc == 0); /* reserved by the engine */
    }
}

/* gate[i] = silu(gate[i]) * up[i] over the flat [T][ffn] arrays, in shards of whole 16-float
 * vectors from the start, so every element takes the same lanes as one call over all. */
struct swiglu_job {
    float *gate;
    const float *up;
};

static void swiglu_range(void *ctx, size_t b, size_t e, int thread)
{
    (void)thread;
    const struct swiglu_job *j = ctx;
    kern_swiglu(j->gate + b, j->gate + b, j->up + b, e - b);
}

/* The same over whole rows [b, e) of ffn floats (ffn a multiple of 16: the same lanes as the
 * flat split), each row then prepared for the down product (matmul_group_begin). */
struct swiglu_rows_job {
    float *gate;
    const float *up;
    size_t ffn;
    const struct matmul_prep *prep;
};

static void swiglu_rows(void *ctx, size_t b, size_t e, int thread)
{
    (void)thread;
    const struct swiglu_rows_job *j = ctx;
    kern_swiglu(j->gate + b * j->ffn, j->gate + b * j->ffn, j->up + b * j->ffn,
                (e - b) * j->ffn);
    matmul_prep_rows(j->prep, b, e);
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
        f->plan.n_tok = n_tok;
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
    /* one batch-invariant sequence makes the whole step's products invariant: its rows share
     * every matmul with the others' (the simplest contract; the others only run slower) */
    f->mm.invariant = false;
    for (size_t i = 0; i < n_seqs; i++)
        f->mm.invariant |= seqs[i].invariant;

    /* embedding and each token's RoPE angles at its own position */
    for (size_t i = 0; i < n_seqs; i++)
        for (uint32_t k = 0; k < seqs[i].n; k++) {
            size_t t = seqs[i].t0 + k;
            model_embed_row(m, (uint32_t)tokens[t], f->x + t * dim);
            model_rope_row(m, f->rope + t * half * 2, seqs[i].pos0 + k, f->inv_freq);
        }

    /* x += proj of a layer's last block is deferred into the next norm's job (add_norm) */
    float *pending = NULL;
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        const struct model_layer *L = &m->layers[l];
        if (f->progress)
            f->progress(f->progress_ud);

        const struct matmul_prod qkv[] = {{&L->wq, f->xb, n_tok, f->q, qd, LORA_Q},
                                          {&L->wk, f->xb, n_tok, f->k, kvd, LORA_K},
                                          {&L->wv, f->xb, n_tok, f->v, kvd, LORA_V}};
        const struct matmul_prep *prep = fused_begin(f, l, qkv, 3);
        add_norm(f, n_tok, pending, NULL, L->attn_norm, prep);
        project_fused(f, l, qkv, 3, prep);
        struct rope_kv_job rj = {f, seqs, l};
        rows_over_pool(f, n_seqs, 1, ROPE_KV_PAR_MIN, rope_kv_seqs, &rj);
        const struct matmul_prod o = {&L->wo, f->att, n_tok, f->proj, dim, LORA_O};
        prep = n_tok * qd < ATT_PREP_MAX ? fused_begin(f, l, &o, 1) : NULL;
        for (size_t i = 0; prep && i < n_seqs; i++) /* published by pool_run */
            atomic_store_explicit(&f->heads_left[i], hp->n_kv_heads, memory_order_relaxed);
        struct attn_job aj = {f, seqs, l, prep};
        size_t n_tasks = n_seqs * hp->n_kv_heads;
        if (f->pool)
            pool_run(f->pool, attn_task, &aj, n_tasks);
        else
            for (size_t i = 0; i < n_tasks; i++)
                attn_task(&aj, i, 0);
        project_fused(f, l, &o, 1, prep);
        const struct matmul_prod gu[] = {{&L->w_gate, f->xb, n_tok, f->gate, ffn, LORA_GATE},
                                         {&L->w_up, f->xb, n_tok, f->up, ffn, LORA_UP}};
        prep = m->moe ? NULL : fused_begin(f, l, gu, 2);
        add_norm(f, n_tok, f->proj, L->bo, L->ffn_norm, prep);
        pending = f->proj;
        if (m->moe) {
            moe_ffn(f->moe, &f->mm, L, f->xb, n_tok, f->proj);
            continue;
        }
        project_fused(f, l, gu, 2, prep);
        /* silu(gate) * up, in place; by rows with the down product's input prepared in the
         * same job when it can be */
        const struct matmul_prod down = {&L->w_down, f->gate, n_tok, f->proj, dim, LORA_DOWN};
        prep = ffn % 16 == 0 ? fused_begin(f, l, &down, 1) : NULL;
        if (prep) {
            struct swiglu_rows_job sj = {f->gate, f->up, ffn, prep};
            rows_over_pool(f, n_tok, 1, n_tok * ffn >= SWIGLU_PAR_MIN ? 1 : SIZE_MAX,
                           swiglu_rows, &sj);
        } else {
            struct swiglu_job sj = {f->gate, f->up};
            rows_over_pool(f, n_tok * ffn, 16, SWIGLU_PAR_MIN, swiglu_range, &sj);
        }
        project_fused(f, l, &down, 1, prep);
    }

    /* classifier: one matmul over the last rows of the sequences that sample; only their
     * residual streams need the last layer's deferred add */
    size_t n_out = 0;
    for (size_t i = 0; i < n_seqs; i++)
        if (seqs[i].logits) {
            size_t t = seqs[i].t0 + seqs[i].n - 1;
            float *x = f->x + t * dim;
            for (size_t c = 0; pending && c < dim; c++)
                x[c] += pending[t * dim + c];
            kern_rmsnorm(f->lnorm + n_out * dim, x, m->output_norm, dim, hp->rms_eps);
            n_out++;
        }
    if (n_out)
        matmul_one(&f->mm, &m->output, f->lnorm, n_out, f->logits, hp->vocab_size);
    *logits = f->logits;
    return 0;
}
