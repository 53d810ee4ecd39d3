/*
 * test_kv_attn.c — attention over the paged cache against a naive reference on contiguous
 * arrays (double precision, two-pass softmax) on random data, for every KV dtype (f32, f16,
 * bf16, and the Hadamard-rotated 8-bit int8 and fp8, whose prefix reuse is exercised too), block sizes
 * that do and do not divide the context, GQA/MHA/MQA head mappings, head sharding, decode and
 * causal prefill chunks after a cached prefix, and argument errors.
 *
 * Tolerances (max |out - ref| / max |ref| over the whole output):
 *  - against the reference on the values the cache holds (rounded to the dtype): 1e-5 for
 *    every dtype: paging, head mapping and the online softmax add only f32 rounding;
 *  - against the reference on the unrounded f32 values: f16 1e-3 and bf16 8e-3, twice the
 *    dtype's relative rounding (2^-11, 2^-8): scores and outputs are sums of rounded products
 *    (the worst seen over these cases is 3.0e-4 for f16 and 2.5e-3 for bf16);
 *  - 8-bit: against the values the cache holds (decoded, rotated back) 2e-5; against the f32
 *    values int8 3e-2 and fp8 6e-2 (measured 1.1e-2 and 4.5e-2, printed by the last test:
 *    uniform K/V have no outliers, so this is the plain 8-bit rounding, 2^-8 and 2^-4 of each
 *    rotated value's scale, averaged by the softmax).
 */
#include "kvtest.h"

#include "err.h"
#include "half.h"
#include "rng.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* 8-bit caches against the unrounded f32 values (max error / max |ref|), uniform random K/V
 * in [-1, 1]: see the header comment for the measured values. */
#define TOL_I8 3e-2
#define TOL_E4M3 6e-2

struct rng {
    uint64_t s;
};

static float rnd(struct rng *r)
{
    return (float)(rng_unit_f64(rng_xorshift64(&r->s)) * 2.0 - 1.0);
}

static float round_dt(enum dtype dt, float x)
{
    if (dt == DT_F16)
        return half_f16_to_f32(half_f32_to_f16(x));
    if (dt == DT_BF16)
        return half_bf16_to_f32(half_f32_to_bf16(x));
    return x;
}

/* A sequence of len positions holding random K/V, and the same values in plain arrays. */
struct fixture {
    struct kv_config cfg;
    struct kv_pool *pool;
    struct kv_seq *seq;
    uint32_t len, kv_dim;
    float *k, *v;   /* [n_layers][len][kv_dim] as written (f32) */
    float *kr, *vr; /* the same rounded to the dtype: what the cache holds */
};

static struct kv_config attn_config(uint32_t n_kv, uint32_t hd, uint32_t B, enum dtype dt,
                                    bool prefix)
{
    struct kv_config c = {
        .n_layers = 2,
        .n_kv_heads = n_kv,
        .head_dim = hd,
        .block_tokens = B,
        .dtype = dt,
        .budget_bytes = UINT64_C(8) << 20,
        .prefix_cache = prefix,
    };
    return c;
}

static void fill_rows(struct fixture *f, struct rng *r, uint32_t from, uint32_t to)
{
    for (uint32_t l = 0; l < f->cfg.n_layers; l++)
        for (uint32_t t = from; t < to; t++)
            for (uint32_t i = 0; i < f->kv_dim; i++) {
                size_t at = ((size_t)l * f->len + t) * f->kv_dim + i;
                f->k[at] = rnd(r);
                f->v[at] = rnd(r);
                f->kr[at] = round_dt(f->cfg.dtype, f->k[at]);
                f->vr[at] = round_dt(f->cfg.dtype, f->v[at]);
            }
}

/* Writes positions [from, to) of every layer into seq (reserve, write, commit). */
static void write_rows(struct fixture *f, struct kv_seq *s, uint32_t from, uint32_t to)
{
    int32_t tok[1024];
    assert_true(to - from <= 1024);
    for (uint32_t t = from; t < to; t++)
        tok[t - from] = (int32_t)t;
    assert_int_equal(kv_seq_reserve(s, to - from), 0);
    for (uint32_t l = 0; l < f->cfg.n_layers; l++) {
        size_t at = ((size_t)l * f->len + from) * f->kv_dim;
        assert_int_equal(kv_seq_write(s, l, f->k + at, f->v + at, to - from), 0);
    }
    assert_int_equal(kv_seq_commit(s, tok, to - from), 0);
    if (dtype_is_kv8(f->cfg.dtype)) /* what the cache holds: decoded and rotated back */
        for (uint32_t l = 0; l < f->cfg.n_layers; l++)
            for (uint32_t t = from; t < to; t++) {
                size_t at = ((size_t)l * f->len + t) * f->kv_dim;
                assert_int_equal(kv_seq_read(s, l, t, f->kr + at, f->vr + at), 0);
            }
}

static void fixture_init(struct fixture *f, const struct kv_config *c, uint32_t len,
                         uint64_t seed)
{
    memset(f, 0, sizeof *f);
    f->cfg = *c;
    f->len = len;
    f->kv_dim = c->n_kv_heads * c->head_dim;
    size_t n = (size_t)c->n_layers * len * f->kv_dim;
    f->k = malloc(n * sizeof(float));
    f->v = malloc(n * sizeof(float));
    f->kr = malloc(n * sizeof(float));
    f->vr = malloc(n * sizeof(float));
    assert_true(f->k && f->v && f->kr && f->vr);
    struct rng r = {seed};
    fill_rows(f, &r, 0, len);
    f->pool = kt_pool(c);
    assert_int_equal(kv_seq_create(f->pool, 1, 0, &f->seq), 0);
}

static void fixture_fini(struct fixture *f)
{
    kv_seq_destroy(f->seq);
    kt_valid(f->pool);
    kv_pool_destroy(f->pool);
    free(f->k);
    free(f->v);
    free(f->kr);
    free(f->vr);
}

/* Naive attention of one query position over positions [0, n_ctx) of layer l. */
static void ref_attn(const struct fixture *f, const float *K, const float *V, uint32_t l,
                     uint32_t n_heads, uint32_t n_ctx, const float *q, double *out)
{
    uint32_t hd = f->cfg.head_dim, group = n_heads / f->cfg.n_kv_heads;
    double *sc = malloc(n_ctx * sizeof *sc);
    assert_non_null(sc);
    for (uint32_t h = 0; h < n_heads; h++) {
        uint32_t g = h / group;
        double mx = -INFINITY, sum = 0;
        for (uint32_t t = 0; t < n_ctx; t++) {
            const float *kt = K + ((size_t)l * f->len + t) * f->kv_dim + (size_t)g * hd;
            double d = 0;
            for (uint32_t i = 0; i < hd; i++)
                d += (double)q[h * hd + i] * kt[i];
            sc[t] = d / sqrt((double)hd);
            if (sc[t] > mx)
                mx = sc[t];
        }
        for (uint32_t t = 0; t < n_ctx; t++) {
            sc[t] = exp(sc[t] - mx);
            sum += sc[t];
        }
        for (uint32_t i = 0; i < hd; i++) {
            double acc = 0;
            for (uint32_t t = 0; t < n_ctx; t++)
                acc += sc[t] * V[((size_t)l * f->len + t) * f->kv_dim + (size_t)g * hd + i];
            out[h * hd + i] = acc / sum;
        }
    }
    free(sc);
}

static double rel_err(const float *got, const double *want, size_t n)
{
    double err = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs(got[i] - want[i]);
        if (!(d <= err)) /* NaN counts as infinitely wrong */
            err = isnan(d) ? INFINITY : d;
        if (fabs(want[i]) > scale)
            scale = fabs(want[i]);
    }
    return err / scale;
}

static double tol_unrounded(enum dtype dt)
{
    return dt == DT_F32 ? 1e-5 : dt == DT_F16 ? 1e-3 : dt == DT_BF16 ? 8e-3
                                     : dt == DT_KV_I8 ? TOL_I8 : TOL_E4M3;
}

/* Against the values the cache holds: 1e-5, and 2e-5 for the 8-bit types, whose "held
 * values" were rotated back in f32 while attention works on the rotated rows. */
static double tol_held(enum dtype dt) { return dtype_is_kv8(dt) ? 2e-5 : 1e-5; }

static double g_worst[2]; /* worst error vs f32 values seen for int8, fp8 (printed) */

static void check_decode(struct fixture *f, uint32_t n_heads, uint32_t n_ctx, float qscale,
                         struct rng *r)
{
    uint32_t hd = f->cfg.head_dim;
    size_t n = (size_t)n_heads * hd;
    float *q = malloc(n * sizeof *q), *out = malloc(n * sizeof *out);
    double *ref = malloc(n * sizeof *ref);
    assert_true(q && out && ref);
    for (size_t i = 0; i < n; i++)
        q[i] = rnd(r) * qscale;
    for (uint32_t l = 0; l < f->cfg.n_layers; l++) {
        assert_int_equal(kv_attn_decode(f->seq, l, n_heads, n_ctx, q, out, 0,
                                        f->cfg.n_kv_heads),
                         0);
        ref_attn(f, f->kr, f->vr, l, n_heads, n_ctx, q, ref);
        double e = rel_err(out, ref, n);
        if (e > tol_held(f->cfg.dtype))
            fail_msg("decode %s B=%u n_ctx=%u layer %u: error %g vs the cache's values",
                     dtype_kv_name(f->cfg.dtype), f->cfg.block_tokens, n_ctx, l, e);
        ref_attn(f, f->k, f->v, l, n_heads, n_ctx, q, ref);
        e = rel_err(out, ref, n);
        if (dtype_is_kv8(f->cfg.dtype) && e > g_worst[f->cfg.dtype == DT_KV_E4M3])
            g_worst[f->cfg.dtype == DT_KV_E4M3] = e;
        if (e > tol_unrounded(f->cfg.dtype))
            fail_msg("decode %s B=%u n_ctx=%u layer %u: error %g vs f32 values",
                     dtype_kv_name(f->cfg.dtype), f->cfg.block_tokens, n_ctx, l, e);
    }
    free(q);
    free(out);
    free(ref);
}

static void test_decode_vs_naive(void **state)
{
    (void)state;
    enum dtype dts[] = {DT_F32, DT_F16, DT_BF16, DT_KV_I8, DT_KV_E4M3};
    uint32_t bs[] = {1, 4, 16, 32};
    uint32_t ctxs[] = {1, 2, 5, 16, 17, 33, 37};
    for (size_t d = 0; d < 5; d++)
        for (size_t b = 0; b < 4; b++) {
            struct kv_config c = attn_config(2, 36, bs[b], dts[d], false);
            struct fixture f;
            struct rng r = {0x9e3779b97f4a7c15ull + d * 131 + b};
            fixture_init(&f, &c, 37, 1000 + d * 10 + b);
            write_rows(&f, f.seq, 0, 20);
            write_rows(&f, f.seq, 20, 37);
            for (size_t i = 0; i < sizeof ctxs / sizeof ctxs[0]; i++)
                check_decode(&f, 8, ctxs[i], 1.0f, &r);
            fixture_fini(&f);
        }
}

static void test_head_mappings(void **state)
{
    (void)state;
    /* MHA (group 1), MQA with more query heads than one batch of rows (72), and a realistic
     * GQA shape (head_dim 128, B 16, f16) */
    struct {
        uint32_t n_kv, n_heads, hd, B;
        enum dtype dt;
    } cases[] = {{4, 4, 16, 4, DT_F32},     {1, 72, 8, 8, DT_BF16},     {2, 8, 128, 16, DT_F16},
                 {2, 8, 128, 16, DT_KV_I8}, {1, 72, 64, 8, DT_KV_E4M3}, {4, 4, 96, 4, DT_KV_I8}};
    for (size_t i = 0; i < 6; i++) {
        struct kv_config c = attn_config(cases[i].n_kv, cases[i].hd, cases[i].B, cases[i].dt,
                                         false);
        struct fixture f;
        struct rng r = {77 + i};
        fixture_init(&f, &c, 50, 2000 + i);
        write_rows(&f, f.seq, 0, 50);
        check_decode(&f, cases[i].n_heads, 50, 1.0f, &r);
        check_decode(&f, cases[i].n_heads, 9, 1.0f, &r);
        fixture_fini(&f);
    }
}

static void test_large_scores(void **state)
{
    (void)state;
    /* scores in the hundreds: exp would overflow without max subtraction */
    struct kv_config c = attn_config(2, 32, 4, DT_F32, false);
    struct fixture f;
    struct rng r = {5};
    fixture_init(&f, &c, 30, 3000);
    write_rows(&f, f.seq, 0, 30);
    check_decode(&f, 4, 30, 200.0f, &r);
    fixture_fini(&f);
}

static void test_head_sharding(void **state)
{
    (void)state;
    struct kv_config c = attn_config(4, 16, 4, DT_F16, false);
    struct fixture f;
    struct rng r = {6};
    fixture_init(&f, &c, 21, 4000);
    write_rows(&f, f.seq, 0, 21);
    uint32_t n_heads = 8, hd = 16;
    float q[8 * 16], full[8 * 16], part[8 * 16];
    for (size_t i = 0; i < 8 * 16; i++)
        q[i] = rnd(&r);
    assert_int_equal(kv_attn_decode(f.seq, 1, n_heads, 21, q, full, 0, 4), 0);
    memset(part, 0, sizeof part);
    /* shards write only their own heads, and together give the same bits */
    assert_int_equal(kv_attn_decode(f.seq, 1, n_heads, 21, q, part, 1, 3), 0);
    for (uint32_t h = 0; h < n_heads; h++)
        for (uint32_t i = 0; i < hd; i++)
            if (h < 2 || h >= 6)
                assert_true(part[h * hd + i] == 0.0f);
    assert_int_equal(kv_attn_decode(f.seq, 1, n_heads, 21, q, part, 0, 1), 0);
    assert_int_equal(kv_attn_decode(f.seq, 1, n_heads, 21, q, part, 3, 4), 0);
    assert_memory_equal(full, part, sizeof full);
    float pq[4 * 8 * 16], pfull[4 * 8 * 16], ppart[4 * 8 * 16];
    for (size_t i = 0; i < 4 * 8 * 16; i++)
        pq[i] = rnd(&r);
    assert_int_equal(kv_attn_prefill(f.seq, 0, n_heads, 17, 4, pq, pfull, 0, 4), 0);
    assert_int_equal(kv_attn_prefill(f.seq, 0, n_heads, 17, 4, pq, ppart, 0, 2), 0);
    assert_int_equal(kv_attn_prefill(f.seq, 0, n_heads, 17, 4, pq, ppart, 2, 4), 0);
    assert_memory_equal(pfull, ppart, sizeof pfull);
    fixture_fini(&f);
}

static void test_prefill_after_cached_prefix(void **state)
{
    (void)state;
    enum dtype dts[] = {DT_F32, DT_F16, DT_BF16, DT_KV_I8, DT_KV_E4M3};
    for (size_t d = 0; d < 5; d++) {
        const uint32_t B = 8, pre = 24, len = 61, n_heads = 6, hd = 20;
        struct kv_config c = attn_config(3, hd, B, dts[d], true);
        struct fixture f;
        struct rng r = {100 + d};
        fixture_init(&f, &c, len, 5000 + d);
        /* f.seq computes the prefix and is kept; another request reuses it */
        write_rows(&f, f.seq, 0, pre + 3);
        int32_t tok[64];
        for (uint32_t t = 0; t < 64; t++)
            tok[t] = (int32_t)t;
        struct kv_seq *s;
        uint32_t got;
        assert_int_equal(kv_seq_create(f.pool, 1, 0, &s), 0);
        assert_int_equal(kv_seq_attach_prefix(s, tok, len - 1, &got), 0);
        assert_int_equal(got, pre);
        /* two prefill chunks on top of the cached prefix, attention after each layer write */
        uint32_t chunks[][2] = {{pre, pre + 13}, {pre + 13, len}};
        for (int ch = 0; ch < 2; ch++) {
            uint32_t p0 = chunks[ch][0], n_q = chunks[ch][1] - p0;
            size_t n = (size_t)n_q * n_heads * hd;
            float *q = malloc(n * sizeof *q), *out = malloc(n * sizeof *out);
            double *ref = malloc((size_t)n_heads * hd * sizeof *ref);
            assert_true(q && out && ref);
            for (size_t i = 0; i < n; i++)
                q[i] = rnd(&r);
            assert_int_equal(kv_seq_reserve(s, n_q), 0);
            for (uint32_t l = 0; l < c.n_layers; l++) {
                size_t at = ((size_t)l * len + p0) * f.kv_dim;
                assert_int_equal(kv_seq_write(s, l, f.k + at, f.v + at, n_q), 0);
                if (dtype_is_kv8(dts[d])) /* what s holds: decoded and rotated back */
                    for (uint32_t t = 0; t < n_q; t++)
                        assert_int_equal(kv_seq_read(s, l, p0 + t, f.kr + at + t * f.kv_dim,
                                                     f.vr + at + t * f.kv_dim),
                                         0);
                assert_int_equal(kv_attn_prefill(s, l, n_heads, p0, n_q, q, out, 0, 3), 0);
                for (uint32_t i = 0; i < n_q; i++) {
                    const float *qi = q + (size_t)i * n_heads * hd;
                    const float *oi = out + (size_t)i * n_heads * hd;
                    ref_attn(&f, f.kr, f.vr, l, n_heads, p0 + i + 1, qi, ref);
                    double e = rel_err(oi, ref, (size_t)n_heads * hd);
                    if (e > tol_held(dts[d]))
                        fail_msg("prefill %s layer %u query %u: error %g",
                                 dtype_kv_name(dts[d]), l, p0 + i, e);
                    ref_attn(&f, f.k, f.v, l, n_heads, p0 + i + 1, qi, ref);
                    assert_true(rel_err(oi, ref, (size_t)n_heads * hd) <=
                                tol_unrounded(dts[d]));
                }
                /* the last query of a chunk is a decode over everything written */
                float dec[6 * 20];
                assert_int_equal(kv_attn_decode(s, l, n_heads, p0 + n_q,
                                                q + (size_t)(n_q - 1) * n_heads * hd, dec, 0,
                                                3),
                                 0);
                assert_memory_equal(dec, out + (size_t)(n_q - 1) * n_heads * hd, sizeof dec);
            }
            assert_int_equal(kv_seq_commit(s, tok + p0, n_q), 0);
            free(q);
            free(out);
            free(ref);
        }
        kv_seq_destroy(s);
        fixture_fini(&f);
    }
}

static void test_bad_args(void **state)
{
    (void)state;
    struct kv_config c = attn_config(2, 8, 4, DT_F32, false);
    struct fixture f;
    fixture_init(&f, &c, 10, 6000);
    write_rows(&f, f.seq, 0, 10);
    float q[4 * 8 * 3] = {0}, out[4 * 8 * 3];
    tu_log_capture_begin();
    assert_int_equal(kv_attn_decode(f.seq, 0, 3, 10, q, out, 0, 2), ERR_RANGE);
    tu_assert_log_contains("3 query heads is not a multiple of 2 KV heads", NULL);
    assert_int_equal(kv_attn_decode(f.seq, 0, 4, 11, q, out, 0, 2), ERR_RANGE);
    tu_assert_log_contains("positions up to 11 requested, layer 0 has 10 rows", NULL);
    assert_int_equal(kv_attn_decode(f.seq, 0, 4, 0, q, out, 0, 2), ERR_RANGE);
    assert_int_equal(kv_attn_decode(f.seq, 2, 4, 5, q, out, 0, 2), ERR_RANGE);
    tu_assert_log_contains("layer 2 of a 2-layer cache", NULL);
    assert_int_equal(kv_attn_decode(f.seq, 0, 4, 5, q, out, 1, 1), ERR_RANGE);
    assert_int_equal(kv_attn_decode(f.seq, 0, 4, 5, q, out, 0, 3), ERR_RANGE);
    tu_assert_log_contains("KV head range [0, 3)", NULL);
    assert_int_equal(kv_attn_prefill(f.seq, 0, 4, 8, 3, q, out, 0, 2), ERR_RANGE);
    assert_int_equal(kv_attn_prefill(f.seq, 0, 4, 8, 0, q, out, 0, 2), ERR_RANGE);
    assert_int_equal(kv_attn_prefill(f.seq, 0, 4, UINT32_MAX, 2, q, out, 0, 2), ERR_RANGE);
    tu_log_capture_end();
    fixture_fini(&f);
}

/* Printed after the tests that fill g_worst: the measured errors beside the stated bounds. */
static void test_report_kv8(void **state)
{
    (void)state;
    print_message("8-bit KV vs f32 values: int8 %.3g (bound %g), fp8 %.3g (bound %g)\n",
                  g_worst[0], TOL_I8, g_worst[1], TOL_E4M3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_vs_naive),
        cmocka_unit_test(test_head_mappings),
        cmocka_unit_test(test_large_scores),
        cmocka_unit_test(test_head_sharding),
        cmocka_unit_test(test_prefill_after_cached_prefix),
        cmocka_unit_test(test_bad_args),
        cmocka_unit_test(test_report_kv8),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
