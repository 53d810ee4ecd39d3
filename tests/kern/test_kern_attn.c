/*
 * test_kern_attn.c — the attention kernels (kern.h, kernels/attn.c, x86/avx*_attn.c) of every
 * ISA this CPU runs, against softmax(q K^T / sqrt(hd)) V computed in double on the stored
 * (f32, f16 or bf16) K/V values, asserting |err| <= KERN_ATTN_MAX_ERR * max|v|:
 *  - the tile kernel kern_attn_<kvt>_f32_<isa> as the paged cache calls it: a GQA group of
 *    1/2/4/8 query rows over a sequence fed in spans of ragged sizes (block spans), with
 *    begin/end around them; head dims 32/48/64/128, lengths 1..300, K/V rows strided as in a
 *    cache with two KV heads (the second head is read);
 *  - a causal mask inside a tile (vis per row), rows with vis = 0 left untouched;
 *  - kern_attn_causal (contiguous cache, prefill after a prefix and decode as a chunk of one)
 *    through the public entry under kern_force_isa;
 *  - gpt-oss's sinks and sliding windows: per-row windows [lo, vis) crossing tile boundaries
 *    (kern_attn_span and the variants), rows started from sinks that dominate, are negligible
 *    or are of the scores' order (kern_attn_begin_sinks), K/V rows outside every window NaN
 *    (never read), and kern_attn_causal_swa against a double softmax with the sink column and
 *    the window mask (the bound then scales with the weight the positions carry);
 *  - batch invariance bit for bit: each of 64 rows with its own window [lo, vis), fed 16- or
 *    64-position spans inside one call of 64 rows (the paged prefill's batch), ends with the
 *    same o, m and l as when it is the only row of its calls, and as inside calls of 23 or 20
 *    rows (the softmax packs 8 or 16 rows into the lanes of one vector, or takes a few rows
 *    one at a time: a row must not feel either);
 *  - kern_attn_blocks, the paged decode walk, bit for bit as the tile kernel once per block.
 * The measured maxima are printed.
 */
#include "testutil.h"
#include "rng.h"
#include "isa_case.h"

#include "half.h"
#include "kern_variants.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static float frand(float lo, float hi)
{
    rng_xorshift64(&rng_state);
    return lo + (hi - lo) * (float)((rng_state >> 40) & 0xffffff) / 16777216.0f;
}

static const enum dtype g_kvt[3] = {DT_F32, DT_F16, DT_BF16};
static const size_t g_esize[3] = {4, 2, 2};
static const size_t g_hd[] = {32, 48, 64, 128};
static const size_t g_group[] = {1, 2, 4, 8};
static const size_t g_len[] = {1, 2, 3, 5, 15, 16, 17, 31, 64, 65, 100, 129, 200, 255, 300};

static kern_attn_fn *const g_fn[3][3] = {
    {kern_attn_f32_f32_ref, kern_attn_f16_f32_ref, kern_attn_bf16_f32_ref},
    {kern_attn_f32_f32_avx2, kern_attn_f16_f32_avx2, kern_attn_bf16_f32_avx2},
    {kern_attn_f32_f32_avx512, kern_attn_f16_f32_avx512, kern_attn_bf16_f32_avx512},
};

#define NKV 2 /* KV heads per cache row: the kernels read head 1, at offset hd */

/* A cache of n positions x NKV heads of hd elements of g_kvt[t]. */
struct cache {
    size_t t, hd, n, ld; /* ld: bytes per position */
    unsigned char *k, *v;
    float *kf, *vf; /* [n][hd] the stored values of head 1, as f32 (exact) */
    float vmax;     /* max |v| */
};

static void store(struct cache *c, unsigned char *dst, float *f, size_t p, size_t d, float x)
{
    size_t i = (p * NKV + 1) * c->hd + d;
    if (g_kvt[c->t] == DT_F32) {
        memcpy(dst + i * 4, &x, 4);
    } else {
        uint16_t h = g_kvt[c->t] == DT_F16 ? half_f32_to_f16(x) : half_f32_to_bf16(x);
        memcpy(dst + i * 2, &h, 2);
        x = g_kvt[c->t] == DT_F16 ? half_f16_to_f32(h) : half_bf16_to_f32(h);
    }
    f[p * c->hd + d] = x;
}

static void cache_init(struct cache *c, size_t t, size_t hd, size_t n)
{
    c->t = t;
    c->hd = hd;
    c->n = n;
    c->ld = NKV * hd * g_esize[t];
    c->k = calloc(n, c->ld);
    c->v = calloc(n, c->ld);
    c->kf = malloc(n * hd * sizeof(float));
    c->vf = malloc(n * hd * sizeof(float));
    assert_non_null(c->k);
    assert_non_null(c->v);
    assert_non_null(c->kf);
    assert_non_null(c->vf);
    c->vmax = 0.0f;
    for (size_t p = 0; p < n; p++)
        for (size_t d = 0; d < hd; d++) {
            store(c, c->k, c->kf, p, d, frand(-1.0f, 1.0f));
            store(c, c->v, c->vf, p, d, frand(-1.0f, 1.0f));
            if (fabsf(c->vf[p * hd + d]) > c->vmax)
                c->vmax = fabsf(c->vf[p * hd + d]);
        }
}

static void cache_fini(struct cache *c)
{
    free(c->k);
    free(c->v);
    free(c->kf);
    free(c->vf);
}

/* Head 1's K (or V) rows from position p on. */
static const void *at(const struct cache *c, const unsigned char *base, size_t p)
{
    return base + p * c->ld + c->hd * g_esize[c->t];
}

/*
 * max |got - o| in double over hd outputs, o = the softmax over the scores
 * q K[u]^T / sqrt(hd) of positions u in [from, to) plus, when has_sink, one more column of
 * score `sink` (unscaled, no value row), times V[from, to). *mass (if not NULL) = the weight
 * the positions carry together (1 - the sink's share).
 */
static double ref_err_win(const struct cache *c, const float *q, size_t from, size_t to,
                          int has_sink, float sink, const float *got, double *mass)
{
    const size_t hd = c->hd;
    double *s = malloc((to + 1) * sizeof *s), mx = has_sink ? (double)sink : -INFINITY;
    double sum = 0.0, err = 0.0;
    assert_non_null(s);
    for (size_t p = from; p < to; p++) {
        double dot = 0.0;
        for (size_t d = 0; d < hd; d++)
            dot += (double)q[d] * c->kf[p * hd + d];
        s[p] = dot / sqrt((double)hd);
        if (s[p] > mx)
            mx = s[p];
    }
    for (size_t p = from; p < to; p++)
        sum += (s[p] = exp(s[p] - mx));
    const double pos_sum = sum;
    if (has_sink)
        sum += exp((double)sink - mx);
    if (mass)
        *mass = pos_sum / sum;
    for (size_t d = 0; d < hd; d++) {
        double o = 0.0;
        for (size_t p = from; p < to; p++)
            o += s[p] * c->vf[p * hd + d];
        double e = fabs(o / sum - got[d]);
        if (!(e <= err)) /* NaN propagates */
            err = e;
    }
    free(s);
    return err;
}

/* max |got - softmax(q K[0,n)^T / sqrt(hd)) V[0,n)| in double, over hd outputs. */
static double ref_err(const struct cache *c, const float *q, size_t n, const float *got)
{
    return ref_err_win(c, q, 0, n, 0, 0.0f, got, NULL);
}

static void check_err(double err, const struct cache *c, const char *what, size_t isa,
                      size_t hd, size_t group, size_t n, double *worst)
{
    double bound = KERN_ATTN_MAX_ERR * c->vmax;
    if (!(err <= bound)) {
        fprintf(stderr, "%s isa=%s kv=%s hd=%zu group=%zu n=%zu: err %.3g > %.3g\n", what,
                kern_isa_name((enum kern_isa)isa), dtype_info(g_kvt[c->t])->name, hd, group, n, err,
                bound);
        fail();
    }
    if (err / c->vmax > *worst)
        *worst = err / c->vmax;
}

/* The tile kernel fed in ragged spans (block spans of a paged cache). */
static void test_tile_spans(void **state)
{
    const size_t isa = isa_case_begin(state)->isa;
    static const size_t spans[] = {16, 7, 64, 100, 1, 33};
    {
        double worst[3] = {0, 0, 0};
        for (size_t t = 0; t < 3; t++)
            for (size_t ih = 0; ih < sizeof g_hd / sizeof g_hd[0]; ih++)
                for (size_t il = 0; il < sizeof g_len / sizeof g_len[0]; il++) {
                    const size_t hd = g_hd[ih], n = g_len[il];
                    struct cache c;
                    cache_init(&c, t, hd, n);
                    for (size_t ig = 0; ig < sizeof g_group / sizeof g_group[0]; ig++) {
                        const size_t group = g_group[ig];
                        float qb[8 * 128], ob[8 * 128], m[8], l[8];
                        const float *qr[8];
                        float *orow[8];
                        for (size_t r = 0; r < group; r++) {
                            qr[r] = qb + r * hd;
                            orow[r] = ob + r * hd;
                            for (size_t d = 0; d < hd; d++)
                                qb[r * hd + d] = frand(-3.0f, 3.0f);
                        }
                        kern_attn_begin(orow, m, l, group, hd);
                        const size_t span = spans[(il + ig) % (sizeof spans / sizeof spans[0])];
                        for (size_t p = 0; p < n; p += span) {
                            size_t len = n - p < span ? n - p : span;
                            g_fn[isa][t](qr, orow, m, l, NULL, NULL, group, at(&c, c.k, p),
                                         at(&c, c.v, p), c.ld, len, hd,
                                         1.0f / sqrtf((float)hd));
                        }
                        kern_attn_end(orow, l, group, hd);
                        for (size_t r = 0; r < group; r++)
                            check_err(ref_err(&c, qr[r], n, orow[r]), &c, "tile", isa, hd,
                                      group, n, &worst[t]);
                    }
                    cache_fini(&c);
                }
        printf("attention tile, %-6s: max |err| / max|v| = %.3g (f32) %.3g (f16) %.3g (bf16)\n",
               kern_isa_name((enum kern_isa)isa), worst[0], worst[1], worst[2]);
    }
}

/* vis per row inside one call: a causal chunk of 8 rows, one row masked out entirely. */
static void test_tile_vis(void **state)
{
    const size_t isa = isa_case_begin(state)->isa;
    {
        double worst = 0.0;
        for (size_t t = 0; t < 3; t++)
            for (size_t ih = 0; ih < sizeof g_hd / sizeof g_hd[0]; ih++) {
                const size_t hd = g_hd[ih], n = 150;
                struct cache c;
                cache_init(&c, t, hd, n);
                float qb[8 * 128], ob[8 * 128], m[8], l[8];
                const float *qr[8];
                float *orow[8];
                uint32_t vis[8] = {1, 5, 16, 17, 64, 65, 150, 0};
                for (size_t r = 0; r < 8; r++) {
                    qr[r] = qb + r * hd;
                    orow[r] = ob + r * hd;
                    for (size_t d = 0; d < hd; d++)
                        qb[r * hd + d] = frand(-3.0f, 3.0f);
                }
                kern_attn_begin(orow, m, l, 8, hd);
                for (size_t d = 0; d < hd; d++)
                    orow[7][d] = 42.0f; /* vis 0: must stay as it is */
                g_fn[isa][t](qr, orow, m, l, NULL, vis, 8, at(&c, c.k, 0), at(&c, c.v, 0), c.ld, n,
                             hd, 1.0f / sqrtf((float)hd));
                assert_true(m[7] == -INFINITY && l[7] == 0.0f);
                for (size_t d = 0; d < hd; d++)
                    assert_true(orow[7][d] == 42.0f);
                kern_attn_end(orow, l, 7, hd);
                for (size_t r = 0; r < 7; r++)
                    check_err(ref_err(&c, qr[r], vis[r], orow[r]), &c, "vis", isa, hd, 8,
                              vis[r], &worst);
                cache_fini(&c);
            }
        printf("attention tile with vis, %-6s: max |err| / max|v| = %.3g\n",
               kern_isa_name((enum kern_isa)isa), worst);
    }
}

/* kern_attn_causal through the public entry: prefill after a prefix, and a decode. */
static void test_causal(void **state)
{
    const size_t isa = isa_case_begin(state)->isa;
    static const size_t shapes[][2] = {{0, 1},  {0, 5},  {0, 70},  {37, 1}, {37, 30},
                                       {64, 64}, {100, 9}, {299, 1}, {150, 150}};
    {
        double worst = 0.0;
        for (size_t t = 0; t < 3; t++)
            for (size_t ih = 0; ih < sizeof g_hd / sizeof g_hd[0]; ih++)
                for (size_t is = 0; is < sizeof shapes / sizeof shapes[0]; is++) {
                    const size_t hd = g_hd[ih], pos0 = shapes[is][0], nt = shapes[is][1];
                    const size_t group = g_group[(ih + is) % 4], ldq = group * hd + 3;
                    struct cache c;
                    cache_init(&c, t, hd, pos0 + nt);
                    float *q = malloc(nt * ldq * sizeof *q), *o = malloc(nt * ldq * sizeof *o);
                    assert_non_null(q);
                    assert_non_null(o);
                    for (size_t i = 0; i < nt * ldq; i++)
                        q[i] = frand(-3.0f, 3.0f);
                    kern_attn_causal(g_kvt[t], nt, group, hd, q, ldq, at(&c, c.k, 0),
                                     at(&c, c.v, 0), c.ld, (uint32_t)pos0, o, ldq);
                    for (size_t tok = 0; tok < nt; tok++)
                        for (size_t j = 0; j < group; j++)
                            check_err(ref_err(&c, q + tok * ldq + j * hd, pos0 + tok + 1,
                                              o + tok * ldq + j * hd),
                                      &c, "causal", isa, hd, group, pos0 + tok + 1, &worst);
                    free(q);
                    free(o);
                    cache_fini(&c);
                }
        printf("kern_attn_causal, %-6s: max |err| / max|v| = %.3g\n",
               kern_isa_name((enum kern_isa)isa), worst);
    }
}

/*
 * check_err for an output carrying only `mass` of the softmax's weight (the rest is a sink's):
 * the bound scales with it, so a dominating sink still has its small output checked to the
 * same relative precision (a sink scaled by `scale`, or counted twice, fails here).
 */
static void check_err_mass(double err, double mass, const struct cache *c, const char *what,
                           size_t isa, size_t hd, size_t group, size_t n, double *worst)
{
    double bound = KERN_ATTN_MAX_ERR * c->vmax * mass;
    if (!(err <= bound)) {
        fprintf(stderr, "%s isa=%s kv=%s hd=%zu rows=%zu n=%zu mass=%.3g: err %.3g > %.3g\n",
                what, kern_isa_name((enum kern_isa)isa), dtype_info(g_kvt[c->t])->name, hd,
                group, n, mass, err, bound);
        fail();
    }
    if (err / (c->vmax * mass) > *worst)
        *worst = err / (c->vmax * mass);
}

/* Sinks of four kinds: none, dominating (+12: positions keep ~1e-3 of the weight),
 * negligible (-12), and of the order of the scores. */
#define SINK_KINDS 4
static int sink_of(size_t kind, float *sink)
{
    static const float fixed[SINK_KINDS] = {0.0f, 12.0f, -12.0f, 0.0f};
    *sink = kind == 3 ? frand(-2.0f, 2.0f) : fixed[kind];
    return kind != 0;
}

/*
 * The tile variants with per-row windows [lo, vis) over 150 positions (three tiles of 64: the
 * windows start and end on both sides of the tile boundaries 64 and 128), each row started
 * from a sink of every kind. Row 9 has lo == vis and row 10 lo > vis: both left untouched.
 * Half the calls go through the entry kern_attn_span (the active ISA's variant), half call
 * the variant directly; lo == NULL with vis == NULL is checked to be the plain kernel.
 */
static void test_tile_window(void **state)
{
    const size_t isa = isa_case_begin(state)->isa;
    enum { NR = 11 };
    static const uint32_t lo[NR] = {0, 3, 63, 64, 65, 100, 127, 128, 0, 70, 90};
    static const uint32_t vis[NR] = {150, 64, 65, 150, 129, 101, 150, 150, 1, 70, 20};
    double worst = 0.0;
    for (size_t t = 0; t < 3; t++)
        for (size_t ih = 0; ih < sizeof g_hd / sizeof g_hd[0]; ih++)
            for (size_t kind = 0; kind < SINK_KINDS; kind++) {
                const size_t hd = g_hd[ih], n = 150;
                struct cache c;
                cache_init(&c, t, hd, n);
                float qb[NR * 128], ob[NR * 128], m[NR], l[NR], sinks[NR];
                const float *qr[NR];
                float *orow[NR];
                int has_sink = 0;
                for (size_t r = 0; r < NR; r++) {
                    qr[r] = qb + r * hd;
                    orow[r] = ob + r * hd;
                    for (size_t d = 0; d < hd; d++)
                        qb[r * hd + d] = frand(-3.0f, 3.0f);
                    has_sink = sink_of(kind, &sinks[r]);
                }
                kern_attn_begin_sinks(orow, m, l, has_sink ? sinks : NULL, NR, hd);
                for (size_t r = 0; r < NR; r++)
                    assert_true(m[r] == (has_sink ? sinks[r] : -INFINITY) &&
                                l[r] == (has_sink ? 1.0f : 0.0f));
                for (size_t r = 9; r < NR; r++) {
                    m[r] = 7.0f; /* lo >= vis: the state must stay as it is */
                    l[r] = 3.0f;
                    for (size_t d = 0; d < hd; d++)
                        orow[r][d] = 42.0f;
                }
                if ((kind + ih) % 2)
                    kern_attn_span(g_kvt[t], qr, orow, m, l, lo, vis, NR, at(&c, c.k, 0),
                                   at(&c, c.v, 0), c.ld, n, hd, 1.0f / sqrtf((float)hd));
                else
                    g_fn[isa][t](qr, orow, m, l, lo, vis, NR, at(&c, c.k, 0), at(&c, c.v, 0),
                                 c.ld, n, hd, 1.0f / sqrtf((float)hd));
                for (size_t r = 9; r < NR; r++) {
                    assert_true(m[r] == 7.0f && l[r] == 3.0f);
                    for (size_t d = 0; d < hd; d++)
                        assert_true(orow[r][d] == 42.0f);
                }
                kern_attn_end(orow, l, 9, hd);
                for (size_t r = 0; r < 9; r++) {
                    double mass;
                    double err = ref_err_win(&c, qr[r], lo[r], vis[r], has_sink, sinks[r],
                                             orow[r], &mass);
                    check_err_mass(err, mass, &c, "window", isa, hd, NR, vis[r] - lo[r],
                                   &worst);
                }
                cache_fini(&c);
            }
    printf("attention tile with windows and sinks, %-6s: max |err| / (max|v| mass) = %.3g\n",
           kern_isa_name((enum kern_isa)isa), worst);
}

/* Every row reads only [lo, vis): K/V rows outside are NaN and must not reach any output
 * (for f16/bf16 caches this also covers the widening of sub-tiles). */
static void test_tile_window_unread(void **state)
{
    const size_t isa = isa_case_begin(state)->isa;
    for (size_t t = 0; t < 3; t++) {
        const size_t hd = 64, n = 200;
        struct cache c;
        cache_init(&c, t, hd, n);
        for (size_t p = 0; p < n; p++)
            if (p < 70 || p >= 140)
                for (size_t d = 0; d < hd; d++) {
                    store(&c, c.k, c.kf, p, d, NAN);
                    store(&c, c.v, c.vf, p, d, NAN);
                }
        float qb[4 * 64], ob[4 * 64], m[4], l[4];
        const float *qr[4];
        float *orow[4];
        static const uint32_t lo[4] = {70, 71, 100, 139}, vis[4] = {140, 72, 130, 140};
        for (size_t r = 0; r < 4; r++) {
            qr[r] = qb + r * hd;
            orow[r] = ob + r * hd;
            for (size_t d = 0; d < hd; d++)
                qb[r * hd + d] = frand(-3.0f, 3.0f);
        }
        kern_attn_begin(orow, m, l, 4, hd);
        g_fn[isa][t](qr, orow, m, l, lo, vis, 4, at(&c, c.k, 0), at(&c, c.v, 0), c.ld, n, hd,
                     0.125f);
        kern_attn_end(orow, l, 4, hd);
        for (size_t r = 0; r < 4; r++)
            for (size_t d = 0; d < hd; d++)
                assert_true(isfinite(orow[r][d]));
        cache_fini(&c);
    }
}

/*
 * kern_attn_causal_swa through the public entry: windows of 1, 7, 64, 65, 128 and 0 (none),
 * prefill chunks and decodes that cross tile boundaries, with and without sinks; the rows
 * below the first token's window start are NaN (never read). window 0 without sinks is
 * checked to equal kern_attn_causal bit for bit.
 */
static void test_causal_swa(void **state)
{
    const size_t isa = isa_case_begin(state)->isa;
    static const size_t shapes[][2] = {{0, 1},   {0, 70},  {37, 30}, {64, 64},
                                       {100, 9}, {299, 1}, {150, 150}, {200, 3}};
    static const uint32_t windows[] = {1, 7, 64, 65, 128, 0};
    double worst = 0.0;
    size_t cases = 0;
    for (size_t t = 0; t < 3; t++)
        for (size_t is = 0; is < sizeof shapes / sizeof shapes[0]; is++)
            for (size_t iw = 0; iw < sizeof windows / sizeof windows[0]; iw++) {
                const size_t hd = g_hd[(is + iw) % 4], pos0 = shapes[is][0], nt = shapes[is][1];
                const size_t group = g_group[(iw + is + t) % 4], ldq = group * hd + 3;
                const uint32_t w = windows[iw];
                const size_t kind = (is + iw + t) % SINK_KINDS;
                struct cache c;
                cache_init(&c, t, hd, pos0 + nt);
                const size_t first0 = w && pos0 + 1 > w ? pos0 + 1 - w : 0;
                for (size_t p = 0; p < first0; p++)
                    for (size_t d = 0; d < hd; d++) {
                        store(&c, c.k, c.kf, p, d, NAN);
                        store(&c, c.v, c.vf, p, d, NAN);
                    }
                float sinks[8];
                int has_sink = 0;
                for (size_t j = 0; j < group; j++)
                    has_sink = sink_of(kind, &sinks[j]);
                float *q = malloc(nt * ldq * sizeof *q), *o = malloc(nt * ldq * sizeof *o);
                assert_non_null(q);
                assert_non_null(o);
                for (size_t i = 0; i < nt * ldq; i++)
                    q[i] = frand(-3.0f, 3.0f);
                kern_attn_causal_swa(g_kvt[t], nt, group, hd, q, ldq, at(&c, c.k, 0),
                                     at(&c, c.v, 0), c.ld, (uint32_t)pos0, w,
                                     has_sink ? sinks : NULL, o, ldq);
                for (size_t tok = 0; tok < nt; tok++) {
                    const size_t lim = pos0 + tok + 1, first = w && lim > w ? lim - w : 0;
                    for (size_t j = 0; j < group; j++) {
                        double mass;
                        double err = ref_err_win(&c, q + tok * ldq + j * hd, first, lim,
                                                 has_sink, sinks[j], o + tok * ldq + j * hd,
                                                 &mass);
                        check_err_mass(err, mass, &c, "causal_swa", isa, hd, group,
                                       lim - first, &worst);
                    }
                }
                if (w == 0 && !has_sink) {
                    float *o2 = malloc(nt * ldq * sizeof *o2);
                    assert_non_null(o2);
                    kern_attn_causal(g_kvt[t], nt, group, hd, q, ldq, at(&c, c.k, 0),
                                     at(&c, c.v, 0), c.ld, (uint32_t)pos0, o2, ldq);
                    for (size_t tok = 0; tok < nt; tok++)
                        assert_memory_equal(o + tok * ldq, o2 + tok * ldq,
                                            group * hd * sizeof(float));
                    free(o2);
                }
                free(q);
                free(o);
                cache_fini(&c);
                cases++;
            }
    printf("kern_attn_causal_swa, %-6s: %zu cases, max |err| / (max|v| mass) = %.3g\n",
           kern_isa_name((enum kern_isa)isa), cases, worst);
}

/*
 * Batch invariance of the tile kernel, bit for bit: rows with their own windows [lo, vis)
 * computed 64 to a call (the paged prefill's batch), 23 or 20 to a call, and alone give the same
 * m, l and o, for 16-position spans (the paged cache's blocks) and 64-position ones.
 */
#define INV_ROWS 64
static void test_tile_rows_invariant(void **state)
{
    const size_t isa = isa_case_begin(state)->isa;
    static const size_t hds[] = {48, 64, 128};
    static const size_t spans[] = {16, 64};
    const size_t n = 150;
    for (size_t t = 0; t < 3; t++)
        for (size_t ih = 0; ih < sizeof hds / sizeof hds[0]; ih++)
            for (size_t is = 0; is < 2; is++) {
                const size_t hd = hds[ih], span = spans[is];
                struct cache c;
                cache_init(&c, t, hd, n);
                float *qb = malloc(INV_ROWS * hd * sizeof(float));
                float *ob = malloc(4 * INV_ROWS * hd * sizeof(float));
                assert_non_null(qb);
                assert_non_null(ob);
                float m[4][INV_ROWS], l[4][INV_ROWS];
                uint32_t from[INV_ROWS], lim[INV_ROWS];
                for (size_t r = 0; r < INV_ROWS; r++) {
                    for (size_t d = 0; d < hd; d++)
                        qb[r * hd + d] = frand(-3.0f, 3.0f);
                    /* a causal limit, some rows with a window start (lo) too */
                    lim[r] = 1 + (uint32_t)(r * 7 % n);
                    from[r] = r % 3 == 0 && lim[r] > 20 ? lim[r] - 20 : 0;
                }
                /* all 64 rows per call; 23 (16 + 7); 20 (16 + 4: the AVX-512 softmax takes
                 * groups of 4 a row at a time); one row per call */
                static const size_t per_call[4] = {INV_ROWS, 23, 20, 1};
                for (size_t w = 0; w < 4; w++)
                    for (size_t r0 = 0; r0 < INV_ROWS; r0 += per_call[w]) {
                        const size_t nr = INV_ROWS - r0 < per_call[w] ? INV_ROWS - r0 : per_call[w];
                        const float *qr[INV_ROWS];
                        float *orow[INV_ROWS];
                        uint32_t lo[INV_ROWS], vis[INV_ROWS];
                        for (size_t r = 0; r < nr; r++) {
                            qr[r] = qb + (r0 + r) * hd;
                            orow[r] = ob + (w * INV_ROWS + r0 + r) * hd;
                        }
                        kern_attn_begin(orow, &m[w][r0], &l[w][r0], nr, hd);
                        for (size_t p = 0; p < n; p += span) {
                            const size_t len = n - p < span ? n - p : span;
                            for (size_t r = 0; r < nr; r++) {
                                const uint32_t b = lim[r0 + r], a = from[r0 + r];
                                vis[r] = b > p ? (uint32_t)(b - p < len ? b - p : len) : 0;
                                lo[r] = a > p ? (uint32_t)(a - p) : 0;
                            }
                            g_fn[isa][t](qr, orow, &m[w][r0], &l[w][r0], lo, vis, nr,
                                         at(&c, c.k, p), at(&c, c.v, p), c.ld, len, hd,
                                         1.0f / sqrtf((float)hd));
                        }
                    }
                for (size_t w = 1; w < 4; w++) {
                    assert_memory_equal(m[w], m[0], sizeof m[0]);
                    assert_memory_equal(l[w], l[0], sizeof l[0]);
                    assert_memory_equal(ob + w * INV_ROWS * hd, ob, INV_ROWS * hd * sizeof(float));
                }
                free(qb);
                free(ob);
                cache_fini(&c);
            }
    printf("attention tile, %-6s: 64 rows with their own windows bit for bit as 23, 20 or 1 per call\n",
           kern_isa_name((enum kern_isa)isa));
}


/*
 * kern_attn_blocks (the paged decode walk) against its specification, bit for bit: the
 * ISA's tile kernel called once per block in turn. Blocks of 16 positions (the AVX-512 walk's
 * case) and 8 or 32 (the loop), in an arena where block i lies after block i+1 (so nothing
 * is contiguous across blocks), each block K rows then V rows of NKV heads (head 1 read);
 * 1..9 rows (9: beyond the walk's 8 lanes; the AVX-512 walk also called directly for 1..8),
 * head dims 16..128, lengths that end inside a block, started plain or from sinks; f32, f16,
 * bf16 and the 8-bit KV rows.
 */
static void test_blocks_walk(void **state)
{
    const size_t isa = isa_case_begin(state)->isa;
    static const enum dtype kvts[5] = {DT_F32, DT_F16, DT_BF16, DT_KV_I8, DT_KV_E4M3};
    static kern_attn_fn *const kv8_fn[3][2] = {
        {kern_attn_kvi8_f32_ref, kern_attn_kvf8_f32_ref},
        {kern_attn_kvi8_f32_avx2, kern_attn_kvf8_f32_avx2},
        {kern_attn_kvi8_f32_avx512, kern_attn_kvf8_f32_avx512}};
    static const size_t hds[] = {16, 48, 64, 128};
    static const size_t lens[] = {1, 7, 16, 17, 40, 100};
    static const size_t bts[] = {16, 8, 32};
    size_t checked = 0;
    for (size_t t = 0; t < 5; t++)
        for (size_t ih = 0; ih < sizeof hds / sizeof hds[0]; ih++)
            for (size_t ib = 0; ib < 3; ib++) {
                const enum dtype kvt = kvts[t];
                const size_t hd = hds[ih], bt = bts[ib], nmax = 100;
                const size_t hb = t < 3 ? hd * g_esize[t] : kern_kv8_head_bytes(hd);
                const size_t ld = NKV * hb, nblk = (nmax + bt - 1) / bt;
                const size_t blk_bytes = 2 * bt * ld; /* K rows, then V rows */
                unsigned char *arena = malloc(nblk * blk_bytes);
                float *row = malloc(hd * sizeof(float));
                assert_non_null(arena);
                assert_non_null(row);
                const void *kb[16];
                for (size_t b = 0; b < nblk; b++) {
                    unsigned char *blk = arena + (nblk - 1 - b) * blk_bytes;
                    kb[b] = blk + hb; /* head 1 */
                    for (size_t j = 0; j < 2 * bt * NKV; j++) {
                        unsigned char *dst = blk + j * hb;
                        for (size_t d = 0; d < hd; d++)
                            row[d] = frand(-1.0f, 1.0f);
                        if (t >= 3) {
                            kern_kv8_quant(kvt, row, dst, hd);
                            continue;
                        }
                        for (size_t d = 0; d < hd; d++) {
                            if (t == 0) {
                                memcpy(dst + d * 4, &row[d], 4);
                            } else {
                                uint16_t h = t == 1 ? half_f32_to_f16(row[d])
                                                    : half_f32_to_bf16(row[d]);
                                memcpy(dst + d * 2, &h, 2);
                            }
                        }
                    }
                }
                kern_attn_fn *fn = t < 3 ? g_fn[isa][t] : kv8_fn[isa][t - 3];
                for (size_t nq = 1; nq <= 9; nq++)
                    for (size_t il = 0; il < sizeof lens / sizeof lens[0]; il++)
                        for (int sk = 0; sk < 2; sk++) {
                            const size_t n = lens[il];
                            float q[9 * 128], o[2][9 * 128], m[2][9], l[2][9], sinks[9];
                            const float *qr[9];
                            float *orow[2][9];
                            for (size_t r = 0; r < nq; r++) {
                                for (size_t d = 0; d < hd; d++)
                                    q[r * hd + d] = frand(-3.0f, 3.0f);
                                sinks[r] = frand(-2.0f, 4.0f);
                                qr[r] = q + r * hd;
                                orow[0][r] = o[0] + r * hd;
                                orow[1][r] = o[1] + r * hd;
                            }
                            const float scale = 1.0f / sqrtf((float)hd);
                            for (int w = 0; w < 2; w++)
                                kern_attn_begin_sinks(orow[w], m[w], l[w], sk ? sinks : NULL,
                                                      nq, hd);
                            kern_attn_blocks(kvt, qr, orow[0], m[0], l[0], nq, kb, bt * ld, ld,
                                             bt, n, hd, scale);
                            for (size_t b = 0; b * bt < n; b++)
                                fn(qr, orow[1], m[1], l[1], NULL, NULL, nq, kb[b],
                                   (const char *)kb[b] + bt * ld, ld, n - b * bt < bt ? n - b * bt : bt,
                                   hd, scale);
                            assert_memory_equal(m[0], m[1], nq * sizeof(float));
                            assert_memory_equal(l[0], l[1], nq * sizeof(float));
                            assert_memory_equal(o[0], o[1], nq * hd * sizeof(float));
                            checked++;
                            if (isa != KERN_ISA_AVX512 || bt != 16 || hd % 16 || nq > 8)
                                continue;
                            /* the AVX-512 walk itself also below the 4 rows it is used from */
                            kern_attn_begin_sinks(orow[0], m[0], l[0], sk ? sinks : NULL, nq, hd);
                            kern_attn_blocks_avx512(kvt, qr, orow[0], m[0], l[0], nq, kb, bt * ld,
                                                    ld, bt, n, hd, scale);
                            assert_memory_equal(m[0], m[1], nq * sizeof(float));
                            assert_memory_equal(l[0], l[1], nq * sizeof(float));
                            assert_memory_equal(o[0], o[1], nq * hd * sizeof(float));
                        }
                free(row);
                free(arena);
            }
    printf("attention walk, %-6s: %zu block walks bit for bit as the tile once per block\n",
           kern_isa_name((enum kern_isa)isa), checked);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        ISA_CASE_TESTS(test_tile_spans),
        ISA_CASE_TESTS(test_tile_vis),
        ISA_CASE_TESTS(test_causal),
        ISA_CASE_TESTS(test_tile_window),
        ISA_CASE_TESTS(test_tile_window_unread),
        ISA_CASE_TESTS(test_causal_swa),
        ISA_CASE_TESTS(test_tile_rows_invariant),
        ISA_CASE_TESTS(test_blocks_walk),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
