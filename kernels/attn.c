/*
 * attn.c — the attention tile kernel's scalar specification (kern_attn_<kvt>_f32_ref, kvt
 * also the 8-bit KV head rows of kv8.c), the
 * online-softmax state helpers (with gpt-oss's sinks), the entries kern_attn / kern_attn_span
 * (through kern__ops) and kern_attn_causal / kern_attn_causal_swa, the contiguous-cache
 * driver with an optional sliding window (kern.h states the contracts; docs/adr/0004
 * addendum, item 11).
 *
 * Why one tile kernel with explicit state: the paged cache (worker/engine/kv_attn.c) hands over one
 * block span at a time and the contiguous cache (worker/model/forward.c) 64-position tiles; with m,
 * l and o owned by the caller both walk their own layout and share the arithmetic, and no
 * [queries x positions] score matrix is ever built.
 *
 * NOTES: stateless and reentrant; the dispatch table is read per call. Stack use is bounded (the ref
 * widens one K and one V row at a time; kern_attn_causal keeps 64 rows of state).
 */
#include "fastmath.h"
#include "internal.h"

#include "check.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

void kern_attn_begin(float *const *o, float *m, float *l, size_t nq, size_t hd)
{
    kern_attn_begin_sinks(o, m, l, NULL, nq, hd);
}

/* A sink is one more softmax column whose score is sinks[r] and whose value row is zero:
 * starting the running state from it (m = sink, l = e^(sink - m) = 1, o = 0) is the same as
 * having seen it first, so the tiles that follow need not know about it. */
void kern_attn_begin_sinks(float *const *o, float *m, float *l, const float *sinks, size_t nq,
                           size_t hd)
{
    for (size_t r = 0; r < nq; r++) {
        m[r] = sinks ? sinks[r] : -INFINITY;
        l[r] = sinks ? 1.0f : 0.0f;
        memset(o[r], 0, hd * sizeof(float));
    }
}

void kern_attn_end(float *const *o, const float *l, size_t nq, size_t hd)
{
    for (size_t r = 0; r < nq; r++) {
        const float inv = 1.0f / l[r];
        float *x = o[r];
        size_t d = 0;
        /* blocks of 8: a fixed count GCC turns into vector multiplies (the plain loop stayed
         * scalar, 4-5% of a paged prefill's attention); the same products either way */
        for (; d + 8 <= hd; d += 8)
            for (size_t i = 0; i < 8; i++)
                x[d + i] *= inv;
        for (; d < hd; d++)
            x[d] *= inv;
    }
}

/* ---- scalar specification ---------------------------------------------------------------- */

/* One K or V row of hd elements to f32: a plain row, or an 8-bit KV head row (codes, scale). */
static void widen_row(enum dtype kvt, const void *src, float *out, size_t hd)
{
    if (dtype_is_kv8(kvt))
        kern_kv8_dequant(kvt, src, out, hd);
    else
        kern_row_to_f32(kvt, src, out, hd);
}

/*
 * The tile for one row at a time, positions in order: the specification the SIMD variants
 * reorder (they batch scores over the tile before the exp; the arithmetic per score, the
 * maximum over the tile and the correction factor are the same).
 */
static void attn_ref(enum dtype kvt, const float *const *q, float *const *o, float *m, float *l,
                     const uint32_t *lo, const uint32_t *vis, size_t nq, const void *k, const void *v, size_t ld,
                     size_t n, size_t hd, float scale)
{
    float kr[KERN_ATTN_HD_MAX], vr[KERN_ATTN_HD_MAX]; /* [hd] one widened row */
    float s[KERN_ATTN_TILE];                          /* [tile] scores, then weights */
    CHECK(hd <= KERN_ATTN_HD_MAX);
    for (size_t j0 = 0; j0 < n; j0 += KERN_ATTN_TILE) {
        const size_t nt = n - j0 < KERN_ATTN_TILE ? n - j0 : KERN_ATTN_TILE;
        for (size_t r = 0; r < nq; r++) {
            size_t nv = vis ? (vis[r] > j0 ? vis[r] - j0 : 0) : nt;
            if (nv > nt)
                nv = nt;
            const size_t a = lo && lo[r] > j0 ? lo[r] - j0 : 0; /* the window's start */
            if (a >= nv)
                continue;
            float mx = -INFINITY;
            for (size_t j = a; j < nv; j++) {
                widen_row(kvt, (const char *)k + (j0 + j) * ld, kr, hd);
                float dot = 0.0f;
                for (size_t d = 0; d < hd; d++)
                    dot += q[r][d] * kr[d];
                s[j] = dot * scale;
                if (s[j] > mx)
                    mx = s[j];
            }
            const float mn = m[r] > mx ? m[r] : mx;
            const float corr = fm_expf(m[r] - mn); /* 0 on the first tile (m = -inf) */
            float sum = 0.0f;
            for (size_t j = a; j < nv; j++) {
                s[j] = fm_expf(s[j] - mn);
                sum += s[j];
            }
            l[r] = l[r] * corr + sum;
            m[r] = mn;
            for (size_t d = 0; d < hd; d++)
                o[r][d] *= corr;
            for (size_t j = a; j < nv; j++) {
                widen_row(kvt, (const char *)v + (j0 + j) * ld, vr, hd);
                for (size_t d = 0; d < hd; d++)
                    o[r][d] += s[j] * vr[d];
            }
        }
    }
}

#define ATTN_REF_(kvt, DT)                                                                   \
    void kern_attn_##kvt##_f32_ref(const float *const *q, float *const *o, float *m, float *l, \
                                   const uint32_t *lo, const uint32_t *vis, size_t nq,       \
                                   const void *k, const void *v, size_t ld, size_t n,        \
                                   size_t hd, float scale)                                   \
    {                                                                                        \
        attn_ref(DT, q, o, m, l, lo, vis, nq, k, v, ld, n, hd, scale);                       \
    }
ATTN_REF_(f32, DT_F32)
ATTN_REF_(f16, DT_F16)
ATTN_REF_(bf16, DT_BF16)
ATTN_REF_(kvi8, DT_KV_I8)
ATTN_REF_(kvf8, DT_KV_E4M3)
#undef ATTN_REF_

/* ---- entries ------------------------------------------------------------------------------ */

/* The tile kernel of the active ISA for K/V caches of type kvt (its traits' attn). */
static kern_attn_fn *attn_fn(enum dtype kvt)
{
    kern_attn_fn *fn = dtype_is_kv8(kvt)           ? kern_attn_kv8_variant(kvt)
                       : (unsigned)kvt < DT_COUNT_ ? kern__ops.type[kvt].attn
                                                   : NULL;
    CHECK(fn != NULL && "kern_attn: K/V must be f32, f16, bf16, int8 or fp8 KV");
    return fn;
}

void kern_attn(enum dtype kvt, const float *const *q, float *const *o, float *m, float *l,
               const uint32_t *vis, size_t nq, const void *k, const void *v, size_t ld,
               size_t n, size_t hd, float scale)
{
    attn_fn(kvt)(q, o, m, l, NULL, vis, nq, k, v, ld, n, hd, scale);
}

void kern_attn_span(enum dtype kvt, const float *const *q, float *const *o, float *m, float *l,
                    const uint32_t *lo, const uint32_t *vis, size_t nq, const void *k,
                    const void *v, size_t ld, size_t n, size_t hd, float scale)
{
    attn_fn(kvt)(q, o, m, l, lo, vis, nq, k, v, ld, n, hd, scale);
}

/* The block loop kern_attn_blocks is specified as, over the tile kernel fn; the next block's
 * head rows (rowb bytes each; 0: none) prefetched while one is computed. */
static void blocks_loop(kern_attn_fn *fn, const float *const *q, float *const *o, float *m,
                        float *l, size_t nq, const void *const *kb, size_t voff, size_t ld,
                        size_t bt, size_t n, size_t hd, float scale, size_t rowb)
{
    for (size_t i = 0; i * bt < n; i++) {
        const size_t nt = n - i * bt < bt ? n - i * bt : bt;
        if ((i + 1) * bt < n) /* the next block's rows: blocks lie far apart in a paged arena */
            for (size_t j = 0; j < bt && (i + 1) * bt + j < n; j++)
                for (size_t off = 0; off < rowb; off += 64) {
                    __builtin_prefetch((const char *)kb[i + 1] + j * ld + off, 0, 3);
                    __builtin_prefetch((const char *)kb[i + 1] + voff + j * ld + off, 0, 3);
                }
        fn(q, o, m, l, NULL, NULL, nq, kb[i], (const char *)kb[i] + voff, ld, nt, hd, scale);
    }
}

void kern_attn_blocks_ref(enum dtype kvt, const float *const *q, float *const *o, float *m,
                          float *l, size_t nq, const void *const *kb, size_t voff, size_t ld,
                          size_t bt, size_t n, size_t hd, float scale)
{
    kern_attn_fn *fn = kvt == DT_F32    ? kern_attn_f32_f32_ref
                       : kvt == DT_F16  ? kern_attn_f16_f32_ref
                       : kvt == DT_BF16 ? kern_attn_bf16_f32_ref
                       : kvt == DT_KV_I8 ? kern_attn_kvi8_f32_ref
                                         : kern_attn_kvf8_f32_ref;
    CHECK(kvt == DT_F32 || kvt == DT_F16 || kvt == DT_BF16 || dtype_is_kv8(kvt));
    blocks_loop(fn, q, o, m, l, nq, kb, voff, ld, bt, n, hd, scale, 0);
}

/* The AVX-512 walk's shapes: its lanes hold 8 rows, so from 4 rows on (a GQA group; one or two
 * rows, a model without GQA, keep the tile kernel, which does not pay for empty lanes: walk1
 * against paged1 in bench/attn_bench was 0.89-1.07x, session 20). */
int kern_attn_blocks_fits(enum dtype kvt, size_t nq, size_t bt, size_t hd)
{
    return nq >= 4 && nq <= 8 && bt == 16 && hd % 16 == 0 && hd <= KERN_ATTN_HD_MAX &&
           (kvt == DT_F32 || kvt == DT_F16 || kvt == DT_BF16 || dtype_is_kv8(kvt));
}

void kern_attn_blocks(enum dtype kvt, const float *const *q, float *const *o, float *m,
                      float *l, size_t nq, const void *const *kb, size_t voff, size_t ld,
                      size_t bt, size_t n, size_t hd, float scale)
{
    if (kern__ops.isa == KERN_ISA_AVX512 && kern_attn_blocks_fits(kvt, nq, bt, hd))
        kern_attn_blocks_avx512(kvt, q, o, m, l, nq, kb, voff, ld, bt, n, hd, scale);
    else
        blocks_loop(attn_fn(kvt), q, o, m, l, nq, kb, voff, ld, bt, n, hd, scale,
                    dtype_is_kv8(kvt) ? kern_kv8_head_bytes(hd) : hd * dtype_info(kvt)->block_bytes);
}

#define CAUSAL_QROWS 64 /* query rows whose state lives on the stack at once */

void kern_attn_causal(enum dtype kvt, size_t nt, size_t group, size_t hd, const float *q,
                      size_t ldq, const void *k, const void *v, size_t ld, uint32_t pos0,
                      float *out, size_t ldo)
{
    kern_attn_causal_swa(kvt, nt, group, hd, q, ldq, k, v, ld, pos0, 0, NULL, out, ldo);
}

/*
 * Row r of a batch (token t, head j) sees absolute positions [first[r], lim[r]); the batch
 * walks [min first, max lim) in tiles of KERN_ATTN_TILE positions starting at its smallest
 * window start, so nothing below it is read, and hands each tile the rows' bounds relative to
 * the tile (lo/vis NULL when no row is clipped there: the unmasked fast path).
 */
void kern_attn_causal_swa(enum dtype kvt, size_t nt, size_t group, size_t hd, const float *q,
                          size_t ldq, const void *k, const void *v, size_t ld, uint32_t pos0,
                          uint32_t window, const float *sinks, float *out, size_t ldo)
{
    kern_attn_fn *fn = attn_fn(kvt);
    const float scale = 1.0f / sqrtf((float)hd);
    const float *qr[CAUSAL_QROWS];
    float *orow[CAUSAL_QROWS];
    float m[CAUSAL_QROWS], l[CAUSAL_QROWS], sk[CAUSAL_QROWS];
    uint32_t first[CAUSAL_QROWS], lim[CAUSAL_QROWS], lo[CAUSAL_QROWS], vis[CAUSAL_QROWS];
    const size_t rows = nt * group;
    /* rows ordered token-major, so one batch spans few distinct causal limits */
    for (size_t r0 = 0; r0 < rows; r0 += CAUSAL_QROWS) {
        const size_t nr = rows - r0 < CAUSAL_QROWS ? rows - r0 : CAUSAL_QROWS;
        uint32_t begin = UINT32_MAX, end = 0;
        for (size_t r = 0; r < nr; r++) {
            const size_t t = (r0 + r) / group, j = (r0 + r) % group;
            qr[r] = q + t * ldq + j * hd;
            orow[r] = out + t * ldo + j * hd;
            if (sinks)
                sk[r] = sinks[j];
            lim[r] = pos0 + (uint32_t)t + 1;
            first[r] = window && lim[r] > window ? lim[r] - window : 0;
            if (lim[r] > end)
                end = lim[r];
            if (first[r] < begin)
                begin = first[r];
        }
        kern_attn_begin_sinks(orow, m, l, sinks ? sk : NULL, nr, hd);
        for (uint32_t p = begin; p < end; p += KERN_ATTN_TILE) {
            const size_t n = end - p < KERN_ATTN_TILE ? end - p : KERN_ATTN_TILE;
            int all = 1, none = 1;
            for (size_t r = 0; r < nr; r++) {
                vis[r] = lim[r] > p ? lim[r] - p : 0;
                lo[r] = first[r] > p ? first[r] - p : 0;
                all &= vis[r] >= n;
                none &= lo[r] == 0;
            }
            fn(qr, orow, m, l, none ? NULL : lo, all ? NULL : vis, nr,
               (const char *)k + (size_t)p * ld, (const char *)v + (size_t)p * ld, ld, n, hd,
               scale);
        }
        kern_attn_end(orow, l, nr, hd);
    }
}
