/* ref_llama.c — the test reference forward pass (see ref_llama.h). */
#include "testutil.h"

#include "ref_llama.h"

#include "kern.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ref_llama {
    const struct iebin_model *m;
    struct iebin_hparams hp;
    size_t max_tok;
    float *x, *xb, *q, *k, *v, *att, *o, *g, *u, *score; /* per-chunk scratch */
    float *kc, *vc; /* [n_layers][max_seq][kv_dim] */
};

static const struct iebin_tensor *T(const struct ref_llama *r, const char *fmt, uint32_t l)
{
    char name[64];
    snprintf(name, sizeof name, fmt, l);
    const struct iebin_tensor *t = iebin_find(r->m, name);
    if (!t)
        fail_msg("ref_llama: tensor %s missing", name);
    return t;
}

static float *alloc(size_t n)
{
    float *p = calloc(n ? n : 1, sizeof(float));
    assert_non_null(p);
    return p;
}

struct ref_llama *ref_llama_create(const struct iebin_model *m, size_t max_tok)
{
    struct ref_llama *r = calloc(1, sizeof *r);
    assert_non_null(r);
    r->m = m;
    r->hp = m->hp;
    r->max_tok = max_tok;
    const struct iebin_hparams *hp = &m->hp;
    size_t qd = (size_t)hp->n_heads * hp->head_dim, kvd = (size_t)hp->n_kv_heads * hp->head_dim;
    r->x = alloc(max_tok * hp->dim);
    r->xb = alloc(max_tok * hp->dim);
    r->q = alloc(max_tok * qd);
    r->k = alloc(max_tok * kvd);
    r->v = alloc(max_tok * kvd);
    r->att = alloc(max_tok * qd);
    r->o = alloc(max_tok * hp->dim);
    r->g = alloc(max_tok * hp->ffn_dim);
    r->u = alloc(max_tok * hp->ffn_dim);
    r->score = alloc(hp->max_seq_len);
    r->kc = alloc((size_t)hp->n_layers * hp->max_seq_len * kvd);
    r->vc = alloc((size_t)hp->n_layers * hp->max_seq_len * kvd);
    return r;
}

void ref_llama_destroy(struct ref_llama *r)
{
    if (!r)
        return;
    float *bufs[] = {r->x, r->xb, r->q, r->k, r->v, r->att, r->o, r->g, r->u, r->score, r->kc,
                     r->vc};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
    free(r);
}

static void rmsnorm(float *o, const float *x, const float *w, size_t n, float eps)
{
    float ss = 0.0f;
    for (size_t i = 0; i < n; i++)
        ss += x[i] * x[i];
    ss = 1.0f / sqrtf(ss / (float)n + eps);
    for (size_t i = 0; i < n; i++)
        o[i] = w[i] * (ss * x[i]);
}

/* y [n][out] = x [n][in] W^T, then the hook */
static void proj(const struct iebin_tensor *w, uint32_t layer,
                 enum lora_target t, const float *x, size_t n, float *y,
                 ref_llama_hook_fn *hook, void *ud)
{
    size_t out = w->shape[0], in = w->shape[1];
    kern_matmul(w->dtype, w->data, in, x, n, y, out, 0, out);
    if (hook)
        hook(ud, layer, t, x, n, y, out);
}

/* llama2.c's RoPE: pairs (2i, 2i+1) of each head rotated by pos * theta^(-2i/head_dim) */
static void rope(float *v, size_t heads, size_t hd, size_t pos, float theta)
{
    for (size_t h = 0; h < heads; h++)
        for (size_t i = 0; i < hd; i += 2) {
            float freq = 1.0f / powf(theta, (float)i / (float)hd);
            float val = (float)pos * freq, c = cosf(val), s = sinf(val);
            float *p = v + h * hd + i;
            float v0 = p[0], v1 = p[1];
            p[0] = v0 * c - v1 * s;
            p[1] = v0 * s + v1 * c;
        }
}

void ref_llama_forward(struct ref_llama *r, const int32_t *tok, size_t n, size_t pos0,
                       float *logits, ref_llama_hook_fn *hook, void *ud)
{
    const struct iebin_hparams *hp = &r->hp;
    const size_t dim = hp->dim, hd = hp->head_dim, nh = hp->n_heads, nkv = hp->n_kv_heads;
    const size_t qd = nh * hd, kvd = nkv * hd, ffn = hp->ffn_dim, S = hp->max_seq_len;
    assert_true(n <= r->max_tok && pos0 + n <= S);

    const struct iebin_tensor *emb = iebin_find(r->m, IEBIN_T_TOK_EMBD);
    uint64_t rb;
    assert_int_equal(dtype_row_bytes(emb->dtype, dim, &rb), 0);
    for (size_t t = 0; t < n; t++)
        kern_row_to_f32(emb->dtype, (const char *)emb->data + (size_t)tok[t] * rb,
                        r->x + t * dim, dim);

    for (uint32_t l = 0; l < hp->n_layers; l++) {
        const float *an = T(r, "blk.%u.attn_norm", l)->data;
        for (size_t t = 0; t < n; t++)
            rmsnorm(r->xb + t * dim, r->x + t * dim, an, dim, hp->rms_eps);
        proj(T(r, "blk.%u.attn_q", l), l, LORA_Q, r->xb, n, r->q, hook, ud);
        proj(T(r, "blk.%u.attn_k", l), l, LORA_K, r->xb, n, r->k, hook, ud);
        proj(T(r, "blk.%u.attn_v", l), l, LORA_V, r->xb, n, r->v, hook, ud);
        float *kc = r->kc + (size_t)l * S * kvd, *vc = r->vc + (size_t)l * S * kvd;
        for (size_t t = 0; t < n; t++) {
            rope(r->q + t * qd, nh, hd, pos0 + t, hp->rope_theta);
            rope(r->k + t * kvd, nkv, hd, pos0 + t, hp->rope_theta);
            memcpy(kc + (pos0 + t) * kvd, r->k + t * kvd, kvd * sizeof(float));
            memcpy(vc + (pos0 + t) * kvd, r->v + t * kvd, kvd * sizeof(float));
        }
        for (size_t t = 0; t < n; t++) {
            size_t pos = pos0 + t;
            for (size_t h = 0; h < nh; h++) {
                const float *q = r->q + t * qd + h * hd;
                size_t kvh = h / (nh / nkv);
                float mx = -INFINITY;
                for (size_t p = 0; p <= pos; p++) {
                    const float *k = kc + p * kvd + kvh * hd;
                    float s = 0.0f;
                    for (size_t i = 0; i < hd; i++)
                        s += q[i] * k[i];
                    s /= sqrtf((float)hd);
                    r->score[p] = s;
                    mx = s > mx ? s : mx;
                }
                float sum = 0.0f;
                for (size_t p = 0; p <= pos; p++) {
                    r->score[p] = expf(r->score[p] - mx);
                    sum += r->score[p];
                }
                float *a = r->att + t * qd + h * hd;
                memset(a, 0, hd * sizeof(float));
                for (size_t p = 0; p <= pos; p++) {
                    const float *v = vc + p * kvd + kvh * hd;
                    float w = r->score[p] / sum;
                    for (size_t i = 0; i < hd; i++)
                        a[i] += w * v[i];
                }
            }
        }
        proj(T(r, "blk.%u.attn_o", l), l, LORA_O, r->att, n, r->o, hook, ud);
        for (size_t i = 0; i < n * dim; i++)
            r->x[i] += r->o[i];

        const float *fn = T(r, "blk.%u.ffn_norm", l)->data;
        for (size_t t = 0; t < n; t++)
            rmsnorm(r->xb + t * dim, r->x + t * dim, fn, dim, hp->rms_eps);
        proj(T(r, "blk.%u.ffn_gate", l), l, LORA_GATE, r->xb, n, r->g, hook, ud);
        proj(T(r, "blk.%u.ffn_up", l), l, LORA_UP, r->xb, n, r->u, hook, ud);
        for (size_t i = 0; i < n * ffn; i++) {
            float g = r->g[i];
            r->g[i] = g / (1.0f + expf(-g)) * r->u[i];
        }
        proj(T(r, "blk.%u.ffn_down", l), l, LORA_DOWN, r->g, n, r->o, hook, ud);
        for (size_t i = 0; i < n * dim; i++)
            r->x[i] += r->o[i];
    }
    const float *on = iebin_find(r->m, IEBIN_T_OUTPUT_NORM)->data;
    for (size_t t = 0; t < n; t++)
        rmsnorm(r->xb + t * dim, r->x + t * dim, on, dim, hp->rms_eps);
    const struct iebin_tensor *cls =
        hp->tied_embeddings ? emb : iebin_find(r->m, IEBIN_T_OUTPUT);
    kern_matmul(cls->dtype, cls->data, dim, r->xb, n, logits, hp->vocab_size, 0, hp->vocab_size);
}
