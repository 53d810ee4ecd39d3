/*
 * forward.c — the llama forward pass in f32 (forward.h), readable top to bottom.
 *
 * For a chunk of n tokens at positions pos0 .. pos0+n-1 (x is [n][dim]):
 *
 *   x = tok_embd[token]                                          embedding (any dtype -> f32)
 *   for each layer:
 *     xb = rmsnorm(x) * attn_norm
 *     q = xb Wq^T, k = xb Wk^T, v = xb Wv^T                      k, v land in the KV cache
 *     q, k = rope(q, k, position)                                interleaved pairs
 *     att = softmax(q k^T / sqrt(head_dim), causal) v            grouped-query heads
 *     x += att Wo^T
 *     xb = rmsnorm(x) * ffn_norm
 *     x += (silu(xb Wgate^T) * (xb Wup^T)) Wdown^T               SwiGLU
 *   logits = rmsnorm(x) * output_norm Wout^T                     rows the caller asked for
 *
 * qwen2 adds q, k and v biases; a llama or qwen2 with a window (Mistral) attends, on every
 * layer, only the last `window` positions (kern_attn_causal_swa); Llama 3's RoPE scaling is
 * in the frequencies (model_rope_inv_freq).
 * gpt_oss (model.h, ../shared/specs/gpt-oss.md §2) differs in five places: q, k, v and o add
 * their biases; RoPE's table is YaRN's (model_rope_inv_freq) with cos and sin multiplied by
 * the concentration (m->rope_mscale); attention starts each query head's softmax from its
 * learned sink and, on sliding layers, sees only the last `window` positions
 * (kern_attn_causal_swa); the FFN is the mixture of experts of moe.h.
 *
 * Matmuls batch the chunk (n = n_tokens: the prefill GEMM), so a prompt costs one pass over
 * the weights per chunk instead of one per token.
 *
 * The attention over the cache is the tile kernel of kernels/attn.c (kern_attn_causal here,
 * fed a row stride; the paged cache of the serving engine, worker/engine/kv_attn.c, feeds the same
 * kernel block spans): the cache layout is the only difference.
 *
 * The products are matmul.h's (q, k, v and gate, up as one group each); the hook (LoRA) runs
 * on a projection's result before it is used.
 *
 * NOTES: with a pool, matmul rows and (KV head, token block) attention tasks run on the
 * pool's threads (the kernels keep their scratch on the stack). Everything else runs on the
 * calling thread. All buffers are allocated in forward_create; the products' scratch (struct
 * matmul_ctx) grows on a first use of a larger chunk, then forward_eval no longer allocates.
 */
#include "forward.h"

#include "check.h"
#include "err.h"
#include "kern.h"
#include "log.h"
#include "matmul.h"
#include "moe.h"
#include "pool.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct forward {
    const struct model *m;
    struct pool *pool;
    struct matmul_ctx mm;    /* the products: on pool, with their scratch */
    uint32_t max_seq;        /* S: positions the cache holds */
    uint32_t max_chunk;      /* C: tokens per batch */
    uint32_t pos;            /* positions [0, pos) are in the cache */
    forward_hook_fn *hook;
    void *hook_ud;

    /* per-chunk scratch */
    float *x;                /* [C][dim]      the residual stream */
    float *xb;               /* [C][dim]      normalized input of a block */
    float *q;                /* [C][q_dim]    queries */
    float *att;              /* [C][q_dim]    attention output, heads side by side */
    float *proj;             /* [C][dim]      attn_o / ffn_down output before the residual */
    float *gate;             /* [C][ffn_dim]  gate projection, then silu(gate) * up */
    float *up;               /* [C][ffn_dim]  up projection */
    float *rope;             /* [C][head_dim/2][2] cos, sin of each pair's angle per token */
    float *inv_freq;         /* [head_dim/2]  theta^(-2i/head_dim), or YaRN's */
    struct moe *moe;         /* gpt_oss: the expert block's scratch for C rows */

    /* KV cache: rows of positions, heads side by side */
    float *key_cache;        /* [n_layers][S][kv_dim] */
    float *value_cache;      /* [n_layers][S][kv_dim] */
};

/* ---- creation ------------------------------------------------------------------------------ */

static int alloc_f32(const char *what, uint64_t a, uint64_t b, uint64_t c, float **out)
{
    return model_alloc_f32("forward", what, a, b, c, out);
}

int forward_create(const struct model *m, const struct forward_config *cfg,
                   struct forward **out)
{
    const struct iebin_hparams *hp = &m->hp;
    uint32_t S = cfg->max_seq ? cfg->max_seq : hp->max_seq_len;
    uint32_t C = cfg->max_chunk ? cfg->max_chunk : FORWARD_CHUNK_DEFAULT;
    if (S > hp->max_seq_len) {
        LOG_ERR("forward: max_seq %u exceeds the model's context length %u", S,
                hp->max_seq_len);
        return ERR_RANGE;
    }
    if (C > FORWARD_CHUNK_MAX) {
        LOG_ERR("forward: max_chunk %u exceeds %u", C, FORWARD_CHUNK_MAX);
        return ERR_RANGE;
    }
    struct forward *f = calloc(1, sizeof *f);
    if (!f) {
        LOG_ERR("forward: out of memory");
        return -ENOMEM;
    }
    f->m = m;
    f->pool = cfg->pool;
    matmul_ctx_init(&f->mm, cfg->pool);
    f->max_seq = S;
    f->max_chunk = C;

    const uint64_t dim = hp->dim, qd = m->q_dim, kvd = m->kv_dim, ffn = hp->ffn_dim;
    const uint64_t half = hp->head_dim / 2;
    int rc;
    if ((rc = alloc_f32("residual stream", C, dim, 1, &f->x)) ||
        (rc = alloc_f32("normalized activations", C, dim, 1, &f->xb)) ||
        (rc = alloc_f32("queries", C, qd, 1, &f->q)) ||
        (rc = alloc_f32("attention output", C, qd, 1, &f->att)) ||
        (rc = alloc_f32("projection output", C, dim, 1, &f->proj)) ||
        (rc = alloc_f32("gate activations", C, ffn, 1, &f->gate)) ||
        (rc = alloc_f32("up activations", C, ffn, 1, &f->up)) ||
        (rc = alloc_f32("RoPE table", C, half, 2, &f->rope)) ||
        (rc = alloc_f32("RoPE frequencies", half, 1, 1, &f->inv_freq)) ||
        (rc = alloc_f32("key cache", hp->n_layers, S, kvd, &f->key_cache)) ||
        (rc = alloc_f32("value cache", hp->n_layers, S, kvd, &f->value_cache))) {
        forward_destroy(f);
        return rc;
    }
    if (m->moe && (rc = moe_create(m, C, &f->moe))) {
        forward_destroy(f);
        return rc;
    }
    model_rope_inv_freq(m, f->inv_freq);
    *out = f;
    return 0;
}

void forward_destroy(struct forward *f)
{
    if (!f)
        return;
    float *bufs[] = {f->x,    f->xb,       f->q,     f->att,       f->proj,
                     f->gate, f->up,       f->rope,  f->inv_freq,
                     f->key_cache, f->value_cache};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
    moe_destroy(f->moe);
    matmul_ctx_fini(&f->mm);
    free(f);
}

void forward_set_hook(struct forward *f, forward_hook_fn *fn, void *ud)
{
    f->hook = fn;
    f->hook_ud = ud;
}

uint32_t forward_pos(const struct forward *f) { return f->pos; }
uint32_t forward_max_seq(const struct forward *f) { return f->max_seq; }

int forward_truncate(struct forward *f, uint32_t pos)
{
    if (pos > f->pos) {
        LOG_ERR("forward: cannot truncate to position %u: the cache holds %u", pos, f->pos);
        return ERR_RANGE;
    }
    f->pos = pos;
    return 0;
}

/* ---- building blocks ------------------------------------------------------------------------ */

/*
 * Projections of a layer: the base products as one job (k > 1: q, k, v or gate, up, which
 * share their input), then the hook (LoRA) on each result. g[i].y: [n][ldy] for (layer,
 * g[i].t).
 */
static void project(struct forward *f, uint32_t layer, const struct matmul_prod *g, size_t k)
{
    matmul_group(&f->mm, g, k);
    for (size_t i = 0; f->hook && i < k; i++)
        f->hook(f->hook_ud, layer, g[i].t, g[i].x, g[i].n, g[i].y, g[i].ldy);
}

/* cos and sin of every pair's angle for the chunk's positions: rope [n][head_dim/2][2]
 * (times YaRN's concentration when the model has one: model_rope_row). */
static void rope_table(struct forward *f, uint32_t pos0, size_t n)
{
    const size_t half = f->m->hp.head_dim / 2;
    for (size_t t = 0; t < n; t++)
        model_rope_row(f->m, f->rope + t * half * 2, pos0 + (uint32_t)t, f->inv_freq);
}

/*
 * Grouped-query causal attention of a chunk over the contiguous cache (kern_attn_causal: the
 * online-softmax tile kernel over 64-position tiles). One pool task per (KV head, block of
 * tokens): the group's query heads of up to ATTN_TASK_ROWS / group tokens share every K/V
 * tile the kernel reads.
 */
#define ATTN_TASK_ROWS 64

struct attn_job {
    const struct forward *f;
    const struct model_layer *L;
    const float *key, *value; /* this layer's cache: [S][kv_dim] */
    uint32_t pos0;
    size_t n, tok_per_task, tasks_per_head;
};

static void attn_task(void *ctx, size_t task, int thread)
{
    (void)thread;
    const struct attn_job *j = ctx;
    const struct forward *f = j->f;
    const struct iebin_hparams *hp = &f->m->hp;
    const size_t hd = hp->head_dim, qd = f->m->q_dim, kvd = f->m->kv_dim;
    const size_t group = hp->n_heads / hp->n_kv_heads; /* query heads per KV head */
    const size_t g = task / j->tasks_per_head, t0 = (task % j->tasks_per_head) * j->tok_per_task;
    const size_t nt = j->n - t0 < j->tok_per_task ? j->n - t0 : j->tok_per_task;
    const size_t off = t0 * qd + g * group * hd; /* token t0, first head of g's group */
    if (j->L->window || j->L->sinks) /* the layer's window (0: full), gpt_oss's sinks */
        kern_attn_causal_swa(DT_F32, nt, group, hd, f->q + off, qd, j->key + g * hd,
                             j->value + g * hd, kvd * sizeof(float), j->pos0 + (uint32_t)t0,
                             j->L->window, j->L->sinks ? j->L->sinks + g * group : NULL,
                             f->att + off, qd);
    else
        kern_attn_causal(DT_F32, nt, group, hd, f->q + off, qd, j->key + g * hd,
                         j->value + g * hd, kvd * sizeof(float), j->pos0 + (uint32_t)t0,
                         f->att + off, qd);
}

static void attention(const struct forward *f, uint32_t layer, uint32_t pos0, size_t n)
{
    const struct iebin_hparams *hp = &f->m->hp;
    const size_t layer_rows = (size_t)layer * f->max_seq * f->m->kv_dim;
    const size_t group = hp->n_heads / hp->n_kv_heads;
    const size_t tpt = ATTN_TASK_ROWS / group ? ATTN_TASK_ROWS / group : 1;
    struct attn_job j = {f, &f->m->layers[layer], f->key_cache + layer_rows,
                         f->value_cache + layer_rows, pos0, n, tpt, (n + tpt - 1) / tpt};
    const size_t n_tasks = hp->n_kv_heads * j.tasks_per_head;
    if (f->pool)
        pool_run(f->pool, attn_task, &j, n_tasks);
    else
        for (size_t i = 0; i < n_tasks; i++)
            attn_task(&j, i, 0);
}

/* ---- the pass ---------------------------------------------------------------------------- */

/* Tokens [0, n) (n <= max_chunk) at positions pos0..; logits rows per `which`. */
static void forward_chunk(struct forward *f, const int32_t *tokens, size_t n, uint32_t pos0,
                          enum forward_logits which, float *logits)
{
    const struct model *m = f->m;
    const struct iebin_hparams *hp = &m->hp;
    const size_t dim = hp->dim, hd = hp->head_dim, qd = m->q_dim, kvd = m->kv_dim;
    const size_t ffn = hp->ffn_dim, half = hd / 2;

    /* token embedding: x [n][dim] */
    for (size_t t = 0; t < n; t++)
        model_embed_row(m, (uint32_t)tokens[t], f->x + t * dim);
    rope_table(f, pos0, n);

    for (uint32_t l = 0; l < hp->n_layers; l++) {
        const struct model_layer *L = &m->layers[l];
        float *key = f->key_cache + ((size_t)l * f->max_seq + pos0) * kvd;   /* [n][kv_dim] */
        float *value = f->value_cache + ((size_t)l * f->max_seq + pos0) * kvd; /* [n][kv_dim] */

        /* attention block */
        for (size_t t = 0; t < n; t++)
            kern_rmsnorm(f->xb + t * dim, f->x + t * dim, L->attn_norm, dim, hp->rms_eps);
        project(f, l,
                (const struct matmul_prod[]){{&L->wq, f->xb, n, f->q, qd, LORA_Q},
                                             {&L->wk, f->xb, n, key, kvd, LORA_K},
                                             {&L->wv, f->xb, n, value, kvd, LORA_V}},
                3);
        if (L->bq) {
            model_add_bias(f->q, n, qd, L->bq, qd);
            model_add_bias(key, n, kvd, L->bk, kvd);
            model_add_bias(value, n, kvd, L->bv, kvd);
        }
        for (size_t t = 0; t < n; t++) {
            kern_rope(f->q + t * qd, hp->n_heads, hd, f->rope + t * half * 2);
            kern_rope(key + t * kvd, hp->n_kv_heads, hd, f->rope + t * half * 2);
        }
        attention(f, l, pos0, n);
        project(f, l, &(const struct matmul_prod){&L->wo, f->att, n, f->proj, dim, LORA_O}, 1);
        if (L->bo)
            model_add_bias(f->proj, n, dim, L->bo, dim);
        for (size_t i = 0; i < n * dim; i++)
            f->x[i] += f->proj[i];

        /* feed-forward block */
        for (size_t t = 0; t < n; t++)
            kern_rmsnorm(f->xb + t * dim, f->x + t * dim, L->ffn_norm, dim, hp->rms_eps);
        if (m->moe) {
            moe_ffn(f->moe, &f->mm, L, f->xb, n, f->proj);
            for (size_t i = 0; i < n * dim; i++)
                f->x[i] += f->proj[i];
            continue;
        }
        project(f, l,
                (const struct matmul_prod[]){{&L->w_gate, f->xb, n, f->gate, ffn, LORA_GATE},
                                             {&L->w_up, f->xb, n, f->up, ffn, LORA_UP}},
                2);
        kern_swiglu(f->gate, f->gate, f->up, n * ffn); /* silu(gate) * up, in place */
        project(f, l,
                &(const struct matmul_prod){&L->w_down, f->gate, n, f->proj, dim, LORA_DOWN}, 1);
        for (size_t i = 0; i < n * dim; i++)
            f->x[i] += f->proj[i];
    }

    /* final norm and classifier, only for the rows asked for */
    if (which == FORWARD_LOGITS_ALL) {
        for (size_t t = 0; t < n; t++)
            kern_rmsnorm(f->xb + t * dim, f->x + t * dim, m->output_norm, dim, hp->rms_eps);
        matmul_one(&f->mm, &m->output, f->xb, n, logits, hp->vocab_size);
    } else if (which == FORWARD_LOGITS_LAST) {
        kern_rmsnorm(f->xb, f->x + (n - 1) * dim, m->output_norm, dim, hp->rms_eps);
        matmul_one(&f->mm, &m->output, f->xb, 1, logits, hp->vocab_size);
    }
}

int forward_eval(struct forward *f, const int32_t *tokens, size_t n, enum forward_logits which,
                 float *logits)
{
    const uint32_t vocab = f->m->hp.vocab_size;
    if (n == 0) {
        LOG_ERR("forward: no tokens to evaluate");
        return ERR_RANGE;
    }
    if (n > (size_t)(f->max_seq - f->pos)) {
        LOG_ERR("forward: %zu tokens at position %u exceed the context of %u positions", n,
                f->pos, f->max_seq);
        return ERR_RANGE;
    }
    for (size_t i = 0; i < n; i++)
        if (tokens[i] < 0 || (uint32_t)tokens[i] >= vocab) {
            LOG_ERR("forward: token %zu: id %d is outside the vocabulary of %u", i,
                    (int)tokens[i], vocab);
            return ERR_RANGE;
        }

    for (size_t done = 0; done < n;) {
        size_t c = n - done < f->max_chunk ? n - done : f->max_chunk;
        bool last = done + c == n;
        enum forward_logits w = which == FORWARD_LOGITS_ALL ? FORWARD_LOGITS_ALL
                                : which == FORWARD_LOGITS_LAST && last ? FORWARD_LOGITS_LAST
                                                                     : FORWARD_LOGITS_NONE;
        float *out = which == FORWARD_LOGITS_ALL ? logits + done * vocab : logits;
        forward_chunk(f, tokens + done, c, f->pos, w, out);
        f->pos += (uint32_t)c;
        done += c;
    }
    return 0;
}
