/* kvq.c — see kvq.h. */
#include "kvq.h"

#include "engine_internal.h"
#include "err.h"
#include "kv.h"
#include "log.h"
#include "model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define KVQ_CHUNK 256u /* prefill tokens per step */

/* One step of n tokens at the sequence's end; the last token's logits into out [vocab]. */
static int step(struct engine__fwd *f, struct kv_seq *s, const int32_t *tok, uint32_t n,
                float *out, size_t vocab)
{
    int rc = kv_seq_reserve(s, n);
    if (rc)
        return rc;
    struct engine__bseq b = {.kv = s, .pos0 = kv_seq_len(s), .n = n, .t0 = 0, .logits = true};
    const float *lg = NULL;
    if ((rc = engine__fwd_run(f, tok, n, &b, 1, &lg)))
        return rc;
    memcpy(out, lg, vocab * sizeof(float));
    return kv_seq_commit(s, tok, n);
}

int kvq_logits(const struct model *m, struct pool *pool, enum dtype dt, bool no_rotate,
               const int32_t *tokens, uint32_t n_ctx, uint32_t n_eval, float *logits)
{
    const size_t vocab = m->hp.vocab_size;
    const uint64_t n_tok = (uint64_t)n_ctx + n_eval;
    struct kv_config kc = {
        .n_layers = m->hp.n_layers,
        .n_kv_heads = m->hp.n_kv_heads,
        .head_dim = m->hp.head_dim,
        .dtype = dt,
        /* every position in f32 bytes, rounded up to whole blocks: enough for any dtype */
        .budget_bytes = (n_tok + 2 * KV_BLOCK_TOKENS_DEFAULT) * m->hp.n_layers * 2 *
                        ((uint64_t)m->kv_dim * 4 + 4 * m->hp.n_kv_heads),
        .kv8_no_rotate = no_rotate,
    };
    struct kv_pool *kv = NULL;
    struct kv_seq *s = NULL;
    struct engine__fwd *f = NULL;
    int rc;
    if ((rc = kv_pool_create(&kc, &kv)) || (rc = kv_seq_create(kv, 1, 0, &s)) ||
        (rc = engine__fwd_create(m, pool, KVQ_CHUNK, 1, &f)))
        goto out;
    for (uint32_t p = 0; p < n_ctx && rc == 0; p += KVQ_CHUNK) {
        const uint32_t n = n_ctx - p < KVQ_CHUNK ? n_ctx - p : KVQ_CHUNK;
        rc = step(f, s, tokens + p, n, logits, vocab);
    }
    for (uint32_t i = 0; i < n_eval && rc == 0; i++)
        rc = step(f, s, tokens + n_ctx + i, 1, logits + (i + 1) * vocab, vocab);
out:
    if (rc)
        LOG_ERR("kvq: %s cache, %u + %u tokens: %s", dtype_kv_name(dt), n_ctx, n_eval,
                err_name(rc));
    engine__fwd_destroy(f);
    kv_seq_destroy(s);
    kv_pool_destroy(kv);
    return rc;
}

/* log-sum-exp of x [n] */
static double lse(const float *x, size_t n)
{
    double mx = -INFINITY, s = 0;
    for (size_t i = 0; i < n; i++)
        mx = x[i] > mx ? x[i] : mx;
    for (size_t i = 0; i < n; i++)
        s += exp(x[i] - mx);
    return mx + log(s);
}

void kvq_kld(const float *ref, const float *got, size_t n, size_t vocab, double *mean,
             double *max)
{
    double sum = 0, mx = 0;
    for (size_t r = 0; r < n; r++) {
        const float *a = ref + r * vocab, *b = got + r * vocab;
        const double la = lse(a, vocab), lb = lse(b, vocab);
        double kl = 0;
        for (size_t i = 0; i < vocab; i++) {
            const double lpa = a[i] - la;
            kl += exp(lpa) * (lpa - (b[i] - lb));
        }
        kl = kl < 0 ? 0 : kl; /* rounding can make an exact zero slightly negative */
        sum += kl;
        mx = kl > mx ? kl : mx;
    }
    *mean = n ? sum / (double)n : 0;
    *max = mx;
}
