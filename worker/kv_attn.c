/*
 * kv_attn.c — attention over the paged KV cache: one decode query, or a causal chunk of
 * queries (prefill after a cached prefix), grouped-query head mapping, f32 online softmax.
 *
 * Shape of the computation, per KV head g (a shard unit for a thread pool):
 *   the query rows that read g — (query i, head h) for h in g's group — are taken up to
 *   ATT_QROWS at a time; the positions they see are walked block by block in tiles of up to
 *   ATT_ROWS rows; each tile's K and V rows of head g are converted to f32 once (f16/bf16) or
 *   read in place (f32) and serve every query row of the batch. Each row keeps a running max
 *   m, a running sum l and its output accumulator o (the caller's out row):
 *     m' = max(m, max_t s_t)
 *     l  = l e^(m-m') + sum_t e^(s_t-m')
 *     o  = o e^(m-m') + sum_t e^(s_t-m') v_t
 *   and o / l at the end: the softmax with max subtraction, without materializing scores.
 * Stack use is fixed (two tiles of ATT_ROWS x KV_HEAD_DIM_MAX floats, 32 KiB); no allocation.
 *
 * NOTES: read-only on the pool and sequence; safe to run from several threads at once for
 * disjoint outputs while the owner thread makes no mutating kv_* call.
 */
#include "kv_internal.h"

#include "err.h"
#include "kern.h"
#include "log.h"

#include <math.h>
#include <string.h>

#define ATT_ROWS 16u
#define ATT_QROWS 64u

struct tile {
    const float *k[ATT_ROWS]; /* each [head_dim] */
    const float *v[ATT_ROWS];
    float kbuf[ATT_ROWS * KV_HEAD_DIM_MAX]; /* [ATT_ROWS][head_dim] converted rows */
    float vbuf[ATT_ROWS * KV_HEAD_DIM_MAX];
};

/*
 * Four floats as one GNU C vector: plain C that compiles to the baseline ISA's registers (SSE
 * on x86-64) without per-file ISA flags in worker/; loops step 8 floats with two of them.
 * aligned(4) makes loads through it unaligned-safe.
 */
typedef float v4f __attribute__((vector_size(16), aligned(4)));

static inline v4f load4(const float *p)
{
    v4f v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline float hsum4(v4f a, v4f b)
{
    v4f v = a + b;
    return (v[0] + v[1]) + (v[2] + v[3]);
}

/* q . k[j] for four rows at once: q is loaded once per 8 elements, eight independent sums. */
static void dot4(const float *q, const float *const *k, uint32_t n, float *out)
{
    const float *k0 = k[0], *k1 = k[1], *k2 = k[2], *k3 = k[3];
    v4f a0 = {0}, b0 = {0}, a1 = {0}, b1 = {0}, a2 = {0}, b2 = {0}, a3 = {0}, b3 = {0};
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        v4f x = load4(q + i), y = load4(q + i + 4);
        a0 += x * load4(k0 + i);
        b0 += y * load4(k0 + i + 4);
        a1 += x * load4(k1 + i);
        b1 += y * load4(k1 + i + 4);
        a2 += x * load4(k2 + i);
        b2 += y * load4(k2 + i + 4);
        a3 += x * load4(k3 + i);
        b3 += y * load4(k3 + i + 4);
    }
    float s0 = hsum4(a0, b0), s1 = hsum4(a1, b1), s2 = hsum4(a2, b2), s3 = hsum4(a3, b3);
    for (; i < n; i++) {
        s0 += q[i] * k0[i];
        s1 += q[i] * k1[i];
        s2 += q[i] * k2[i];
        s3 += q[i] * k3[i];
    }
    out[0] = s0;
    out[1] = s1;
    out[2] = s2;
    out[3] = s3;
}

static float dot1(const float *q, const float *k, uint32_t n)
{
    v4f a = {0}, b = {0};
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        a += load4(q + i) * load4(k + i);
        b += load4(q + i + 4) * load4(k + i + 4);
    }
    float s = hsum4(a, b);
    for (; i < n; i++)
        s += q[i] * k[i];
    return s;
}

/* o = o * corr + sum_j e[j] v[j]: each slice of o stays in registers across the n rows. */
static void accumulate(float *o, float corr, const float *e, const float *const *v, uint32_t n,
                       uint32_t hd)
{
    uint32_t d = 0;
    for (; d + 8 <= hd; d += 8) {
        v4f a = load4(o + d) * corr, b = load4(o + d + 4) * corr;
        for (uint32_t j = 0; j < n; j++) {
            a += e[j] * load4(v[j] + d);
            b += e[j] * load4(v[j] + d + 4);
        }
        memcpy(o + d, &a, sizeof a);
        memcpy(o + d + 4, &b, sizeof b);
    }
    for (; d < hd; d++) {
        float acc = o[d] * corr;
        for (uint32_t j = 0; j < n; j++)
            acc += e[j] * v[j][d];
        o[d] = acc;
    }
}

/* Rows [r0, r0+n) of block `id`, layer `layer`, KV head g, as f32. */
static void tile_load(const struct kv_pool *p, uint32_t id, uint32_t layer, uint32_t g,
                      uint32_t r0, uint32_t n, struct tile *t)
{
    uint32_t hd = p->cfg.head_dim;
    const uint8_t *kb =
        kv__layer_k(p, id, layer) + (size_t)r0 * p->row_bytes + (size_t)g * hd * p->esize;
    const uint8_t *vb = kb + (size_t)p->B * p->row_bytes;
    for (uint32_t r = 0; r < n; r++) {
        const uint8_t *kr = kb + (size_t)r * p->row_bytes, *vr = vb + (size_t)r * p->row_bytes;
        if (p->cfg.dtype == DT_F32) {
            /* blocks are 64-byte aligned and rows are whole floats: read in place */
            t->k[r] = (const float *)(const void *)kr;
            t->v[r] = (const float *)(const void *)vr;
        } else {
            kern_row_to_f32(p->cfg.dtype, kr, t->kbuf + (size_t)r * hd, hd);
            kern_row_to_f32(p->cfg.dtype, vr, t->vbuf + (size_t)r * hd, hd);
            t->k[r] = t->kbuf + (size_t)r * hd;
            t->v[r] = t->vbuf + (size_t)r * hd;
        }
    }
}

/*
 * nr (<= ATT_QROWS) query rows reading KV head g of `layer`: row r is q[r] [head_dim], sees
 * positions [0, lim[r]) (lim >= 1) and writes o[r] [head_dim].
 */
static void attend(const struct kv_seq *s, uint32_t layer, uint32_t g, const float *const *q,
                   float *const *o, const uint32_t *lim, uint32_t nr, float scale)
{
    const struct kv_pool *p = s->pool;
    uint32_t hd = p->cfg.head_dim;
    float m[ATT_QROWS], l[ATT_QROWS], sc[ATT_ROWS];
    struct tile t;
    uint32_t end = 0;
    for (uint32_t r = 0; r < nr; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
        memset(o[r], 0, (size_t)hd * sizeof(float));
        if (lim[r] > end)
            end = lim[r];
    }
    for (uint32_t pos = 0; pos < end;) {
        uint32_t r0 = pos % p->B;
        uint32_t n = p->B - r0;
        if (n > ATT_ROWS)
            n = ATT_ROWS;
        if (n > end - pos)
            n = end - pos;
        tile_load(p, s->table[pos / p->B], layer, g, r0, n, &t);
        for (uint32_t r = 0; r < nr; r++) {
            if (lim[r] <= pos)
                continue;
            uint32_t vis = lim[r] - pos < n ? lim[r] - pos : n, j = 0;
            for (; j + 4 <= vis; j += 4)
                dot4(q[r], t.k + j, hd, sc + j);
            for (; j < vis; j++)
                sc[j] = dot1(q[r], t.k[j], hd);
            float mx = -INFINITY;
            for (j = 0; j < vis; j++) {
                sc[j] *= scale;
                if (sc[j] > mx)
                    mx = sc[j];
            }
            float mn = m[r] > mx ? m[r] : mx;
            float corr = expf(m[r] - mn); /* 0 on the first tile (m = -inf) */
            float sum = 0.0f;
            for (j = 0; j < vis; j++) {
                sc[j] = expf(sc[j] - mn);
                sum += sc[j];
            }
            l[r] = l[r] * corr + sum;
            accumulate(o[r], corr, sc, t.v, vis, hd);
            m[r] = mn;
        }
        pos += n;
    }
    for (uint32_t r = 0; r < nr; r++) {
        float inv = 1.0f / l[r];
        for (uint32_t d = 0; d < hd; d++)
            o[r][d] *= inv;
    }
}

static int check_args(const struct kv_seq *s, const char *what, uint32_t layer,
                      uint32_t n_heads, uint32_t end, uint32_t kv_h0, uint32_t kv_h1)
{
    const struct kv_pool *p = s->pool;
    uint32_t n_kv = p->cfg.n_kv_heads;
    if (layer >= p->cfg.n_layers) {
        LOG_ERR("kv %s: layer %u of a %u-layer cache", what, layer, p->cfg.n_layers);
        return ERR_RANGE;
    }
    if (n_heads == 0 || n_heads % n_kv != 0) {
        LOG_ERR("kv %s: %u query heads is not a multiple of %u KV heads", what, n_heads, n_kv);
        return ERR_RANGE;
    }
    if (kv_h0 >= kv_h1 || kv_h1 > n_kv) {
        LOG_ERR("kv %s: KV head range [%u, %u) is not within [0, %u)", what, kv_h0, kv_h1, n_kv);
        return ERR_RANGE;
    }
    if (end == 0 || end > s->written[layer]) {
        LOG_ERR("kv %s: positions up to %u requested, layer %u has %u rows written", what, end,
                layer, s->written[layer]);
        return ERR_RANGE;
    }
    return 0;
}

int kv_attn_decode(const struct kv_seq *s, uint32_t layer, uint32_t n_heads, uint32_t n_ctx,
                   const float *q, float *out, uint32_t kv_h0, uint32_t kv_h1)
{
    int rc = check_args(s, "decode attention", layer, n_heads, n_ctx, kv_h0, kv_h1);
    if (rc)
        return rc;
    uint32_t hd = s->pool->cfg.head_dim, group = n_heads / s->pool->cfg.n_kv_heads;
    float scale = 1.0f / sqrtf((float)hd);
    const float *qr[ATT_QROWS];
    float *orow[ATT_QROWS];
    uint32_t lim[ATT_QROWS];
    for (uint32_t g = kv_h0; g < kv_h1; g++) {
        for (uint32_t j0 = 0; j0 < group; j0 += ATT_QROWS) {
            uint32_t nr = group - j0 < ATT_QROWS ? group - j0 : ATT_QROWS;
            for (uint32_t r = 0; r < nr; r++) {
                size_t h = (size_t)g * group + j0 + r;
                qr[r] = q + h * hd;
                orow[r] = out + h * hd;
                lim[r] = n_ctx;
            }
            attend(s, layer, g, qr, orow, lim, nr, scale);
        }
    }
    return 0;
}

int kv_attn_prefill(const struct kv_seq *s, uint32_t layer, uint32_t n_heads, uint32_t pos0,
                    uint32_t n_q, const float *q, float *out, uint32_t kv_h0, uint32_t kv_h1)
{
    if (n_q == 0 || n_q > KV_SEQ_TOKENS_MAX || pos0 > KV_SEQ_TOKENS_MAX) {
        LOG_ERR("kv prefill attention: %u queries at position %u", n_q, pos0);
        return ERR_RANGE;
    }
    int rc = check_args(s, "prefill attention", layer, n_heads, pos0 + n_q, kv_h0, kv_h1);
    if (rc)
        return rc;
    uint32_t hd = s->pool->cfg.head_dim, group = n_heads / s->pool->cfg.n_kv_heads;
    float scale = 1.0f / sqrtf((float)hd);
    const float *qr[ATT_QROWS];
    float *orow[ATT_QROWS];
    uint32_t lim[ATT_QROWS];
    uint64_t rows = (uint64_t)n_q * group;
    for (uint32_t g = kv_h0; g < kv_h1; g++) {
        /* rows ordered query-major so one batch spans few distinct causal limits */
        for (uint64_t r0 = 0; r0 < rows; r0 += ATT_QROWS) {
            uint32_t nr = rows - r0 < ATT_QROWS ? (uint32_t)(rows - r0) : ATT_QROWS;
            for (uint32_t r = 0; r < nr; r++) {
                uint64_t i = (r0 + r) / group, j = (r0 + r) % group;
                size_t off = ((size_t)i * n_heads + (size_t)g * group + j) * hd;
                qr[r] = q + off;
                orow[r] = out + off;
                lim[r] = pos0 + (uint32_t)i + 1;
            }
            attend(s, layer, g, qr, orow, lim, nr, scale);
        }
    }
    return 0;
}
