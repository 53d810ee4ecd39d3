/*
 * kv_attn.c — attention over the paged KV cache: one decode query, or a causal chunk of
 * queries (prefill after a cached prefix), grouped-query head mapping, f32 online softmax.
 *
 * Shape of the computation, per KV head g (a shard unit for a thread pool): the query rows
 * that read g — (query i, head h) for h in g's group — are taken up to ATT_QROWS at a time,
 * and the positions they see are walked block by block; each block span goes to the
 * attention tile kernel (kern_attn, kernels/attn.c), which widens the span's K and V rows of
 * head g once and updates every row's online-softmax state (running max m, running sum l,
 * the unnormalised output o = the caller's out row); kern_attn_end divides by l. The causal
 * limit of each row becomes the tile's per-row visible count. No scores are materialized.
 * gpt-oss (kv_attn_prefill_swa): a sliding window makes each row's first visible position
 * its own (kern_attn_span's per-row start) and the walk begins at the block holding the
 * earliest one, so blocks wholly older than every row's window are never read; learned sinks
 * start each row's online softmax (kern_attn_begin_sinks).
 * A decode (rows sharing one limit and window start) hands its blocks from the first one the
 * window does not cut to kern_attn_blocks, the walk with its state and prefetch inside the
 * kernel: the same bits as one kern_attn per block (session 20, docs/PERFORMANCE.md: the
 * attention's share of a gpt-oss decode step after 4k tokens went from 20.4% to 12.6%).
 * 8-bit caches (docs/KV.md "8-bit KV") hold rotated rows: each query row is rotated into a
 * stack copy first and each output row rotated back last; the tile kernel decodes the codes.
 * Stack use is fixed (the state and rotated queries of ATT_QROWS rows here, 64 KiB, the
 * kernel's widened tile there).
 *
 * NOTES: read-only on the pool and sequence; safe to run from several threads at once for
 * disjoint outputs while the owner thread makes no mutating kv_* call.
 */
#include "kv_internal.h"

#include "err.h"
#include "kern.h"
#include "log.h"

#include <assert.h>
#include <math.h>
#include <string.h>

#define ATT_QROWS 64u
#define ATT_WALK_BLOCKS 64u /* block pointers handed to one kern_attn_blocks call */

static_assert(KV_HEAD_DIM_MAX <= KERN_ATTN_HD_MAX, "the attention kernel bounds head_dim");

/*
 * Requests the K and V rows of one head in a block (kb: its first K row; up to `n` rows) into
 * the cache. Why: the rows of a head are head_bytes pieces at row_bytes strides inside blocks
 * that lie far apart in the arena, a pattern the hardware prefetchers do not follow across
 * blocks; a decode step over a long context otherwise waits on memory at every block.
 */
static void prefetch_head(const struct kv_pool *p, const uint8_t *kb, uint32_t n)
{
    const uint32_t rows = n < p->B ? n : p->B;
    const uint8_t *vb = kb + (size_t)p->B * p->row_bytes;
    for (uint32_t j = 0; j < rows; j++) {
        const size_t at = (size_t)j * p->row_bytes;
        for (size_t off = 0; off < p->head_bytes; off += 64) {
            __builtin_prefetch(kb + at + off, 0, 3);
            __builtin_prefetch(vb + at + off, 0, 3);
        }
        /* a row not aligned to lines (8-bit rows: hd + 4 bytes) ends in one more line */
        __builtin_prefetch(kb + at + p->head_bytes - 1, 0, 3);
        __builtin_prefetch(vb + at + p->head_bytes - 1, 0, 3);
    }
}

/*
 * nr (<= ATT_QROWS) query rows reading KV head g of `layer`: row r is q[r] [head_dim], sees
 * positions [lim[r] - window, lim[r]) (from 0 when window is 0 or larger; lim >= 1) and writes
 * o[r] [head_dim]. sk: [nr] each row's sink logit, or NULL.
 */
static void attend(const struct kv_seq *s, uint32_t layer, uint32_t g, const float *const *q,
                   float *const *o, const uint32_t *lim, uint32_t nr, float scale,
                   uint32_t window, const float *sk)
{
    const struct kv_pool *p = s->pool;
    const uint32_t hd = p->cfg.head_dim;
    float m[ATT_QROWS], l[ATT_QROWS];
    /* 8-bit rows are stored rotated (kern_kv_rotate): q is rotated the same way, so q.k is
     * unchanged, and the output, a sum of rotated V rows, is rotated back at the end */
    float qrot[ATT_QROWS][KV_HEAD_DIM_MAX]; /* [nr][hd] rotated queries, when p->rotate */
    const float *qr[ATT_QROWS];
    for (uint32_t r = 0; r < nr; r++) {
        qr[r] = q[r];
        if (p->rotate) {
            memcpy(qrot[r], q[r], hd * sizeof(float));
            kern_kv_rotate(qrot[r], hd);
            qr[r] = qrot[r];
        }
    }
    uint32_t vis[ATT_QROWS], lo[ATT_QROWS], first[ATT_QROWS];
    uint32_t end = 0, start = UINT32_MAX;
    for (uint32_t r = 0; r < nr; r++) {
        if (lim[r] > end)
            end = lim[r];
        first[r] = window && lim[r] > window ? lim[r] - window : 0;
        if (first[r] < start)
            start = first[r];
    }
    if (sk)
        kern_attn_begin_sinks(o, m, l, sk, nr, hd);
    else
        kern_attn_begin(o, m, l, nr, hd);
    /* a decode's rows (one token) share their limit and window start: the blocks from the
     * first one not cut by the window go to kern_attn_blocks, the same bits as one
     * kern_attn per block (kern.h) with the walk, its state and its prefetch in the kernel */
    int uniform = 1;
    for (uint32_t r = 1; r < nr; r++)
        uniform &= lim[r] == lim[0] && first[r] == first[0];
    const uint32_t walk_from = uniform ? (start + p->B - 1) / p->B * p->B : UINT32_MAX;
    for (uint32_t pos = start / p->B * p->B; pos < end;) {
        if (pos >= walk_from) {
            const void *kbs[ATT_WALK_BLOCKS]; /* [nb] K rows of head g in each block */
            const uint32_t nb = (end - pos + p->B - 1) / p->B < ATT_WALK_BLOCKS
                                    ? (end - pos + p->B - 1) / p->B
                                    : ATT_WALK_BLOCKS;
            for (uint32_t b = 0; b < nb; b++)
                kbs[b] = kv__layer_k(p, s->table[pos / p->B + b], layer) + g * p->head_bytes;
            const uint32_t n = end - pos < nb * p->B ? end - pos : nb * p->B;
            kern_attn_blocks(p->cfg.dtype, qr, o, m, l, nr, kbs, (size_t)p->B * p->row_bytes,
                             p->row_bytes, p->B, n, hd, scale);
            pos += n;
            continue;
        }
        /* one block span: rows [0, n) of block pos / B (pos is a multiple of B here) */
        uint32_t n = p->B < end - pos ? p->B : end - pos;
        int all = 1, cut = 0;
        for (uint32_t r = 0; r < nr; r++) {
            vis[r] = lim[r] > pos ? lim[r] - pos : 0;
            lo[r] = first[r] > pos ? first[r] - pos : 0;
            all &= vis[r] >= n;
            cut |= lo[r] > 0;
        }
        const uint8_t *kb = kv__layer_k(p, s->table[pos / p->B], layer) + g * p->head_bytes;
        const uint8_t *vb = kb + (size_t)p->B * p->row_bytes; /* V rows follow the block's K */
        if (pos + n < end) /* the next block's rows of head g, while this one is computed */
            prefetch_head(p, kv__layer_k(p, s->table[pos / p->B + 1], layer) + g * p->head_bytes,
                          end - pos - n);
        if (cut) { /* some row's window starts inside this block */
            for (uint32_t r = 0; r < nr; r++)
                vis[r] = vis[r] < n ? vis[r] : n;
            kern_attn_span(p->cfg.dtype, qr, o, m, l, lo, vis, nr, kb, vb, p->row_bytes, n, hd,
                           scale);
        } else {
            kern_attn(p->cfg.dtype, qr, o, m, l, all ? NULL : vis, nr, kb, vb, p->row_bytes, n,
                      hd, scale);
        }
        pos += n;
    }
    kern_attn_end(o, l, nr, hd);
    if (p->rotate)
        for (uint32_t r = 0; r < nr; r++)
            kern_kv_unrotate(o[r], hd);
}

/* end: one past the last position read; first: the first one (a window's start, else 0). */
static int check_args(const struct kv_seq *s, const char *what, uint32_t layer,
                      uint32_t n_heads, uint32_t first, uint32_t end, uint32_t kv_h0,
                      uint32_t kv_h1)
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
    if (first / p->B < s->n_released) {
        LOG_ERR("kv %s: position %u is in a block the sliding window released (%u blocks)",
                what, first, s->n_released);
        return ERR_RANGE;
    }
    return 0;
}

int kv_attn_decode(const struct kv_seq *s, uint32_t layer, uint32_t n_heads, uint32_t n_ctx,
                   const float *q, float *out, uint32_t kv_h0, uint32_t kv_h1)
{
    int rc = check_args(s, "decode attention", layer, n_heads, 0, n_ctx, kv_h0, kv_h1);
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
            attend(s, layer, g, qr, orow, lim, nr, scale, 0, NULL);
        }
    }
    return 0;
}

int kv_attn_prefill(const struct kv_seq *s, uint32_t layer, uint32_t n_heads, uint32_t pos0,
                    uint32_t n_q, const float *q, float *out, uint32_t kv_h0, uint32_t kv_h1)
{
    return kv_attn_prefill_swa(s, layer, n_heads, pos0, n_q, q, out, kv_h0, kv_h1, 0, NULL);
}

int kv_attn_prefill_swa(const struct kv_seq *s, uint32_t layer, uint32_t n_heads, uint32_t pos0,
                        uint32_t n_q, const float *q, float *out, uint32_t kv_h0,
                        uint32_t kv_h1, uint32_t window, const float *sinks)
{
    if (n_q == 0 || n_q > KV_SEQ_TOKENS_MAX || pos0 > KV_SEQ_TOKENS_MAX) {
        LOG_ERR("kv prefill attention: %u queries at position %u", n_q, pos0);
        return ERR_RANGE;
    }
    const uint32_t first = window && pos0 + 1 > window ? pos0 + 1 - window : 0;
    int rc = check_args(s, "prefill attention", layer, n_heads, first, pos0 + n_q, kv_h0, kv_h1);
    if (rc)
        return rc;
    uint32_t hd = s->pool->cfg.head_dim, group = n_heads / s->pool->cfg.n_kv_heads;
    float scale = 1.0f / sqrtf((float)hd);
    const float *qr[ATT_QROWS];
    float *orow[ATT_QROWS];
    uint32_t lim[ATT_QROWS];
    float sk[ATT_QROWS];
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
                if (sinks)
                    sk[r] = sinks[(size_t)g * group + j];
            }
            attend(s, layer, g, qr, orow, lim, nr, scale, window, sinks ? sk : NULL);
        }
    }
    return 0;
}
