/*
 * test_sampler.c — the sampler: parameter validation, greedy and its ties, the drawn
 * distribution on a fixed logit vector with a fixed seed, the exact candidate sets of top-k,
 * top-p (also against a brute-force nucleus on a large vocabulary, which exercises the
 * pre-filter) and min-p, the repetition penalty, reproducibility, and stop strings across
 * token boundaries.
 */
#include "testutil.h"

#include "err.h"
#include "rng.h"
#include "sampler.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct sampler_params params(float t)
{
    struct sampler_params p;
    sampler_params_default(&p);
    p.temperature = t;
    return p;
}

static struct sampler *make(const struct sampler_params *p, uint32_t vocab)
{
    struct sampler *s;
    assert_int_equal(sampler_create(p, vocab, &s), 0);
    return s;
}

/* ---- validation --------------------------------------------------------------------------- */

static void bad_param(struct sampler_params p, const char *needle)
{
    struct sampler *s = NULL;
    tu_log_capture_begin();
    assert_int_equal(sampler_params_check(&p), ERR_RANGE);
    assert_int_equal(sampler_create(&p, 10, &s), ERR_RANGE);
    assert_null(s);
    tu_assert_log_contains(needle, NULL);
    tu_log_capture_end();
}

static void test_params(void **state)
{
    (void)state;
    struct sampler_params p = params(1.0f);
    assert_int_equal(sampler_params_check(&p), 0);
    p.temperature = -0.5f;
    bad_param(p, "temperature -0.5 must be >= 0");
    p.temperature = NAN;
    bad_param(p, "temperature nan");
    p = params(1.0f);
    p.temperature = INFINITY;
    bad_param(p, "temperature inf");
    p = params(1.0f);
    p.top_p = 0.0f;
    bad_param(p, "top_p 0 must be in (0, 1]");
    p.top_p = 1.5f;
    bad_param(p, "top_p 1.5");
    p = params(1.0f);
    p.min_p = -0.1f;
    bad_param(p, "min_p -0.1 must be in [0, 1]");
    p.min_p = 2.0f;
    bad_param(p, "min_p 2");
    p = params(1.0f);
    p.repeat_penalty = 0.0f;
    bad_param(p, "repeat_penalty 0 must be > 0");
    p.repeat_penalty = NAN;
    bad_param(p, "repeat_penalty nan");
    p = params(1.0f);
    p.repeat_penalty = 1e7f;
    bad_param(p, "at most 1e6"); /* names the bound (issue 15: was "finite") */
    p = params(1e38f);
    bad_param(p, "temperature 1e+38 must be >= 0 and at most 1e6");

    p = params(1.0f);
    struct sampler *s;
    tu_log_capture_begin();
    assert_int_equal(sampler_create(&p, 0, &s), ERR_RANGE);
    tu_assert_log_contains("vocabulary is empty", NULL);
    tu_log_capture_end();
    /* the limits themselves are valid */
    p.temperature = 0.0f;
    p.top_p = 1.0f;
    p.min_p = 1.0f;
    p.repeat_penalty = 1e-3f;
    assert_int_equal(sampler_params_check(&p), 0);
}

/* ---- greedy ------------------------------------------------------------------------------- */

/* Non-finite logits (a NaN weight) are refused with ERR_STATE, never sampled as token 0. */
static void test_non_finite_logits(void **state)
{
    (void)state;
    const float nan1[] = {NAN, -1.0f, 2.0f, 0.5f};
    const float ninf[] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    const float pinf[] = {INFINITY, INFINITY, INFINITY, INFINITY};
    const float some_inf[] = {-INFINITY, 1.0f, -INFINITY, 0.5f};
    const float temps[] = {0.0f, 1.0f};
    for (int t = 0; t < 2; t++) {
        struct sampler_params p = params(temps[t]);
        struct sampler *s = make(&p, 4);
        const float *bad[] = {nan1, ninf, pinf};
        for (int i = 0; i < 3; i++) {
            tu_log_capture_begin();
            assert_int_equal(sampler_sample(s, bad[i], NULL, 0), ERR_STATE);
            tu_assert_log_contains("non-finite logits", NULL);
            tu_log_capture_end();
        }
        int32_t id = sampler_sample(s, some_inf, NULL, 0); /* masked ids are fine */
        assert_true(id == 1 || (t == 1 && id == 3));
        sampler_destroy(s);
    }
}

static void test_argmax(void **state)
{
    (void)state;
    const float a[] = {1.0f, 3.0f, -2.0f, 3.0f, 2.0f};
    assert_int_equal(sampler_argmax(a, 5), 1); /* tie: lowest id */
    const float b[] = {NAN, -1.0f, NAN, 0.5f};
    assert_int_equal(sampler_argmax(b, 4), 3);
    const float c[] = {-INFINITY, -INFINITY};
    assert_int_equal(sampler_argmax(c, 2), 0);

    struct sampler_params p = params(0.0f);
    for (uint64_t seed = 0; seed < 5; seed++) {
        p.seed = seed;
        struct sampler *s = make(&p, 5);
        for (int i = 0; i < 10; i++)
            assert_int_equal(sampler_sample(s, a, NULL, 0), 1);
        sampler_destroy(s);
    }
    /* a vanishing temperature keeps only the maxima (1/T would overflow: no NaN may appear) */
    p = params(1e-40f);
    struct sampler *t = make(&p, 5);
    int seen[5] = {0};
    for (int i = 0; i < 200; i++)
        seen[sampler_sample(t, a, NULL, 0)]++;
    assert_true(seen[1] > 0 && seen[3] > 0 && seen[1] + seen[3] == 200);
    sampler_destroy(t);
    p = params(0.0f);
    /* greedy ignores the filters but not the penalty */
    p.top_k = 1;
    p.min_p = 0.9f;
    p.repeat_penalty = 2.0f;
    struct sampler *s = make(&p, 5);
    const int32_t hist[] = {1};
    assert_int_equal(sampler_sample(s, a, hist, 1), 3); /* 3/2 < 3: the other 3.0 wins */
    sampler_destroy(s);
}

/* ---- distribution -------------------------------------------------------------------------- */

#define DRAWS 200000

/* Frequencies of DRAWS draws from logits[0..n) vs expected probabilities: every |f - p| is
 * within 4.5 standard deviations, and Pearson's chi-square is plausible. */
static void check_distribution(struct sampler *s, const float *logits, const double *want,
                               size_t n)
{
    size_t count[16] = {0};
    assert_true(n <= 16);
    for (int i = 0; i < DRAWS; i++) {
        int32_t id = sampler_sample(s, logits, NULL, 0);
        assert_true(id >= 0 && (size_t)id < n);
        count[id]++;
    }
    double chi2 = 0.0;
    size_t dof = 0;
    for (size_t i = 0; i < n; i++) {
        double f = (double)count[i] / DRAWS, sd = sqrt(want[i] * (1 - want[i]) / DRAWS);
        if (want[i] == 0.0) {
            assert_int_equal(count[i], 0);
            continue;
        }
        if (fabs(f - want[i]) > 4.5 * sd + 1e-12)
            fail_msg("token %zu: frequency %.5f, probability %.5f", i, f, want[i]);
        chi2 += (f - want[i]) * (f - want[i]) / want[i] * DRAWS;
        dof++;
    }
    /* far beyond the 99.99th percentile for <= 8 degrees of freedom (about 33) */
    assert_true(chi2 < 40.0);
    (void)dof;
}

static void test_distribution(void **state)
{
    (void)state;
    const double p[] = {0.5, 0.25, 0.125, 0.0625, 0.0625};
    float logits[5];
    for (int i = 0; i < 5; i++)
        logits[i] = (float)log(p[i]) + 3.0f; /* softmax is shift invariant */

    struct sampler_params sp = params(1.0f);
    sp.seed = 42;
    struct sampler *s = make(&sp, 5);
    check_distribution(s, logits, p, 5);
    sampler_destroy(s);

    /* temperature 0.5 squares the probabilities */
    sp.temperature = 0.5f;
    s = make(&sp, 5);
    double q[5], z = 0;
    for (int i = 0; i < 5; i++)
        z += q[i] = p[i] * p[i];
    for (int i = 0; i < 5; i++)
        q[i] /= z;
    check_distribution(s, logits, q, 5);
    sampler_destroy(s);

    /* top-k 2: the two most probable, renormalized */
    sp = params(1.0f);
    sp.top_k = 2;
    s = make(&sp, 5);
    const double k2[] = {2.0 / 3, 1.0 / 3, 0, 0, 0};
    check_distribution(s, logits, k2, 5);
    sampler_destroy(s);
}

static void test_seed(void **state)
{
    (void)state;
    float logits[64];
    for (int i = 0; i < 64; i++)
        logits[i] = (float)((i * 37) % 11) * 0.3f;
    struct sampler_params sp = params(1.0f);
    sp.seed = 1234;
    struct sampler *a = make(&sp, 64), *b = make(&sp, 64);
    sp.seed = 1235;
    struct sampler *c = make(&sp, 64);
    int32_t first[100];
    size_t differ = 0;
    for (int i = 0; i < 100; i++) {
        first[i] = sampler_sample(a, logits, NULL, 0);
        assert_int_equal(sampler_sample(b, logits, NULL, 0), first[i]);
        differ += sampler_sample(c, logits, NULL, 0) != first[i];
    }
    assert_true(differ > 50);
    sampler_reset(a);
    for (int i = 0; i < 100; i++)
        assert_int_equal(sampler_sample(a, logits, NULL, 0), first[i]);
    sampler_destroy(a);
    sampler_destroy(b);
    sampler_destroy(c);
}

/* ---- exact candidate sets ------------------------------------------------------------------- */

/* The candidates for logits under p must be exactly ids[0..n) in this order. */
static void expect_set(const struct sampler_params *p, const float *logits, uint32_t vocab,
                       const int32_t *hist, size_t n_hist, const int32_t *ids, size_t n)
{
    struct sampler *s = make(p, vocab);
    int32_t *got = malloc(vocab * sizeof *got);
    float *prob = malloc(vocab * sizeof *prob);
    size_t m;
    sampler_candidates(s, logits, hist, n_hist, got, prob, &m);
    if (m != n)
        fail_msg("%zu candidates, expected %zu (top_k %u top_p %g min_p %g)", m, n, p->top_k,
                 (double)p->top_p, (double)p->min_p);
    double sum = 0;
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(got[i], ids[i]);
        sum += prob[i];
    }
    assert_true(fabs(sum - 1.0) < 1e-5);
    free(got);
    free(prob);
    sampler_destroy(s);
}

static void test_top_k(void **state)
{
    (void)state;
    const float logits[] = {1, 3, 3, 2, 3, 0};
    struct sampler_params p = params(1.0f);
    p.top_k = 2;
    expect_set(&p, logits, 6, NULL, 0, (const int32_t[]){1, 2}, 2); /* ties: lower ids */
    p.top_k = 4;
    expect_set(&p, logits, 6, NULL, 0, (const int32_t[]){1, 2, 4, 3}, 4);
    p.top_k = 1;
    expect_set(&p, logits, 6, NULL, 0, (const int32_t[]){1}, 1);
    p.top_k = 6; /* == vocab: off, all in id order */
    expect_set(&p, logits, 6, NULL, 0, (const int32_t[]){0, 1, 2, 3, 4, 5}, 6);
    p.top_k = 100;
    expect_set(&p, logits, 6, NULL, 0, (const int32_t[]){0, 1, 2, 3, 4, 5}, 6);

    /* probabilities renormalized over the kept tokens */
    struct sampler *s = make(&(struct sampler_params){.temperature = 1, .top_k = 2, .top_p = 1,
                                                      .repeat_penalty = 1},
                             6);
    int32_t ids[6];
    float pr[6];
    size_t n;
    sampler_candidates(s, logits, NULL, 0, ids, pr, &n);
    assert_int_equal(n, 2);
    assert_float_equal(pr[0], 0.5, 1e-6);
    assert_float_equal(pr[1], 0.5, 1e-6);
    sampler_destroy(s);
}

static void test_top_p_min_p(void **state)
{
    (void)state;
    float logits[4];
    const double pr[] = {0.4, 0.3, 0.2, 0.1};
    for (int i = 0; i < 4; i++)
        logits[3 - i] = (float)log(pr[i]); /* reversed ids: id 3 is the most probable */
    struct sampler_params p = params(1.0f);
    p.top_p = 0.39f;
    expect_set(&p, logits, 4, NULL, 0, (const int32_t[]){3}, 1);
    p.top_p = 0.65f;
    expect_set(&p, logits, 4, NULL, 0, (const int32_t[]){3, 2}, 2);
    p.top_p = 0.75f;
    expect_set(&p, logits, 4, NULL, 0, (const int32_t[]){3, 2, 1}, 3);
    p.top_p = 0.95f;
    expect_set(&p, logits, 4, NULL, 0, (const int32_t[]){3, 2, 1, 0}, 4);
    /* after top-k 3 the mass is renormalized: 0.4/0.9, 0.7/0.9 = 0.78 >= 0.75 */
    p.top_k = 3;
    p.top_p = 0.75f;
    expect_set(&p, logits, 4, NULL, 0, (const int32_t[]){3, 2}, 2);

    /* min-p: p >= min_p * 0.4 */
    p = params(1.0f);
    p.min_p = 0.5f; /* >= 0.2 */
    expect_set(&p, logits, 4, NULL, 0, (const int32_t[]){3, 2, 1}, 3);
    p.min_p = 0.55f; /* >= 0.22 */
    expect_set(&p, logits, 4, NULL, 0, (const int32_t[]){3, 2}, 2);
    p.min_p = 1.0f;
    expect_set(&p, logits, 4, NULL, 0, (const int32_t[]){3}, 1);
    /* all three: the shortest prefix */
    p = params(1.0f);
    p.top_k = 3;
    p.top_p = 0.95f;
    p.min_p = 0.2f;
    expect_set(&p, logits, 4, NULL, 0, (const int32_t[]){3, 2, 1}, 3);
    p.min_p = 0.6f;
    expect_set(&p, logits, 4, NULL, 0, (const int32_t[]){3, 2}, 2);
}

struct ranked {
    double p;
    int32_t id;
};

static int cmp_ranked(const void *a, const void *b)
{
    const struct ranked *x = a, *y = b;
    if (x->p != y->p)
        return x->p > y->p ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* Nucleus sampling on 5000 tokens against the definition computed by brute force (this
 * exercises the pre-filter that skips sorting the tail). */
static void test_top_p_brute_force(void **state)
{
    (void)state;
    enum { V = 5000 };
    float *logits = malloc(V * sizeof *logits);
    struct ranked *r = malloc(V * sizeof *r);
    int32_t *want = malloc(V * sizeof *want);
    uint64_t x = 88172645463325252u;
    const float tps[] = {0.1f, 0.5f, 0.9f, 0.99f, 0.999f};
    const float temps[] = {0.7f, 1.0f, 1.6f};
    for (int trial = 0; trial < 3; trial++)
        for (size_t ti = 0; ti < 3; ti++)
            for (size_t pi = 0; pi < 5; pi++) {
                for (int i = 0; i < V; i++) {
                    rng_xorshift64(&x);
                    /* a heavy head and a long tail; coarse values make ties */
                    logits[i] = (float)((x >> 40) % 64) * 0.25f - (float)(i % 97) * 0.05f;
                }
                float T = temps[ti];
                float mx = logits[sampler_argmax(logits, V)];
                double z = 0;
                for (int i = 0; i < V; i++) {
                    r[i] = (struct ranked){expf((logits[i] - mx) / T), i};
                    z += r[i].p;
                }
                qsort(r, V, sizeof *r, cmp_ranked);
                size_t n = 0;
                double acc = 0;
                while (n < V && acc < (double)tps[pi] * z) {
                    acc += r[n].p;
                    want[n] = r[n].id;
                    n++;
                }
                struct sampler_params p = params(T);
                p.top_p = tps[pi];
                expect_set(&p, logits, V, NULL, 0, want, n);
            }
    free(logits);
    free(r);
    free(want);
}

/* ---- repetition penalty ------------------------------------------------------------------- */

static void test_repeat_penalty(void **state)
{
    (void)state;
    const float logits[] = {2.0f, -2.0f, 1.0f, 0.5f};
    const int32_t hist[] = {0, 1, 1, 3, 99 /* outside the vocabulary: ignored */, -1};
    struct sampler_params p = params(1.0f);
    p.repeat_penalty = 2.0f;
    p.repeat_window = 0; /* all */
    struct sampler *s = make(&p, 4);
    int32_t ids[4];
    float pr[4];
    size_t n;
    sampler_candidates(s, logits, hist, 6, ids, pr, &n);
    /* penalized once per distinct token: {1, -4, 1, 0.25} */
    const float want[] = {1.0f, -4.0f, 1.0f, 0.25f};
    double z = 0;
    for (int i = 0; i < 4; i++)
        z += exp(want[i]);
    assert_int_equal(n, 4);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(ids[i], i);
        assert_float_equal(pr[i], exp(want[i]) / z, 1e-6);
    }
    sampler_destroy(s);

    /* a window of the last 3 tokens (3, 99, -1): only token 3 */
    p.repeat_window = 3;
    s = make(&p, 4);
    sampler_candidates(s, logits, hist, 6, ids, pr, &n);
    const float want_w[] = {2.0f, -2.0f, 1.0f, 0.25f};
    z = 0;
    for (int i = 0; i < 4; i++)
        z += exp(want_w[i]);
    for (int i = 0; i < 4; i++)
        assert_float_equal(pr[i], exp(want_w[i]) / z, 1e-6);
    /* many calls: the per-call dedup marks never leak between calls */
    for (int k = 0; k < 1000; k++)
        sampler_candidates(s, logits, hist, 6, ids, pr, &n);
    for (int i = 0; i < 4; i++)
        assert_float_equal(pr[i], exp(want_w[i]) / z, 1e-6);
    sampler_destroy(s);

    /* penalty < 1 rewards repetition, by the same rule */
    p = params(0.0f);
    p.repeat_penalty = 0.25f;
    s = make(&p, 4);
    const int32_t h2[] = {2};
    assert_int_equal(sampler_sample(s, logits, h2, 1), 2); /* 1 / 0.25 = 4 beats 2 */
    sampler_destroy(s);
}

/* ---- stop strings ------------------------------------------------------------------------- */

struct stop_run {
    char text[256];
    size_t len;
    bool stopped;
};

static void feed(struct sampler_stop *st, struct stop_run *r, const char *piece)
{
    const char *e;
    size_t n;
    assert_int_equal(sampler_stop_push(st, piece, strlen(piece), &e, &n, &r->stopped), 0);
    assert_true(r->len + n < sizeof r->text);
    memcpy(r->text + r->len, e, n);
    r->len += n;
    r->text[r->len] = '\0';
}

static void finish(struct sampler_stop *st, struct stop_run *r)
{
    const char *e;
    size_t n;
    sampler_stop_flush(st, &e, &n);
    memcpy(r->text + r->len, e, n);
    r->len += n;
    r->text[r->len] = '\0';
}

static void test_stop_strings(void **state)
{
    (void)state;
    const char *stops[] = {"</s>", "\n\nUser:", "abc"};
    struct sampler_stop st;
    assert_int_equal(sampler_stop_init(&st, stops, 3), 0);

    /* across three tokens; nothing after the stop is emitted */
    struct stop_run r = {0};
    feed(&st, &r, "Hello <");
    assert_string_equal(r.text, "Hello "); /* "<" held back */
    feed(&st, &r, "/");
    assert_string_equal(r.text, "Hello ");
    feed(&st, &r, "s> world");
    assert_true(r.stopped);
    assert_string_equal(r.text, "Hello ");
    feed(&st, &r, "more");
    assert_true(r.stopped);
    assert_string_equal(r.text, "Hello ");

    /* a held-back prefix that turns out not to be a stop string is emitted */
    sampler_stop_reset(&st);
    r = (struct stop_run){0};
    feed(&st, &r, "a <");
    feed(&st, &r, "b");
    assert_false(r.stopped);
    assert_string_equal(r.text, "a <b");
    feed(&st, &r, "\n");
    assert_string_equal(r.text, "a <b"); /* could begin "\n\nUser:" */
    feed(&st, &r, "\nUse");
    assert_string_equal(r.text, "a <b");
    feed(&st, &r, "d");
    assert_string_equal(r.text, "a <b\n\nUsed");
    feed(&st, &r, "x\n\nUs");
    finish(&st, &r); /* end of sequence: held text comes out */
    assert_false(r.stopped);
    assert_string_equal(r.text, "a <b\n\nUsedx\n\nUs");

    /* overlapping beginnings: "aab" + "c" contains "abc" at 1 */
    sampler_stop_reset(&st);
    r = (struct stop_run){0};
    feed(&st, &r, "aab");
    assert_string_equal(r.text, "a");
    feed(&st, &r, "c");
    assert_true(r.stopped);
    assert_string_equal(r.text, "a");

    /* inside one token; the earliest of several stop strings wins */
    sampler_stop_reset(&st);
    r = (struct stop_run){0};
    feed(&st, &r, "xy abc </s> z");
    assert_true(r.stopped);
    assert_string_equal(r.text, "xy ");
    sampler_stop_fini(&st);

    /* no stop strings: everything passes straight through */
    assert_int_equal(sampler_stop_init(&st, NULL, 0), 0);
    r = (struct stop_run){0};
    feed(&st, &r, "abc");
    feed(&st, &r, "</s>");
    assert_string_equal(r.text, "abc</s>");
    sampler_stop_fini(&st);

    const char *empty[] = {"ok", ""};
    tu_log_capture_begin();
    assert_int_equal(sampler_stop_init(&st, empty, 2), ERR_RANGE);
    tu_assert_log_contains("stop string 1 is empty", NULL);
    tu_log_capture_end();
}


/* ---- log-probabilities ------------------------------------------------------------------- */

/* log-softmax of x / t in long double, the plain way: the reference */
static void ref_log_softmax(const float *x, uint32_t n, double t, long double *out)
{
    long double m = -INFINITY, sum = 0.0L;
    for (uint32_t i = 0; i < n; i++)
        m = (long double)x[i] / t > m ? (long double)x[i] / t : m;
    for (uint32_t i = 0; i < n; i++)
        sum += expl((long double)x[i] / t - m);
    for (uint32_t i = 0; i < n; i++)
        out[i] = (long double)x[i] / t - m - logl(sum);
}

static void test_logprobs(void **state)
{
    (void)state;
    enum { V = 5000 };
    float *x = malloc(V * sizeof *x);
    long double *ref = malloc(V * sizeof *ref);
    assert_non_null(x);
    assert_non_null(ref);
    uint64_t r = 7;
    for (uint32_t i = 0; i < V; i++)
        x[i] = (float)(rng_unit_f64(rng_splitmix64(&r)) * 40.0 - 20.0);
    x[123] = x[4000] = 25.0f; /* a tie for first: the lower id ranks first */
    const float temps[] = {0.0f, 0.7f, 1.0f, 1.5f};
    for (size_t k = 0; k < sizeof temps / sizeof temps[0]; k++) {
        struct sampler_params p = params(temps[k]);
        p.top_k = 3, p.top_p = 0.5f; /* cuts do not change the reported distribution */
        struct sampler *s = make(&p, V);
        int32_t id = sampler_sample(s, x, NULL, 0);
        assert_true(id >= 0);
        struct sampler_logprob top[SAMPLER_MAX_TOP_LOGPROBS];
        uint32_t n = 0;
        float lp = 1.0f;
        sampler_logprobs(s, id, 25, &lp, top, &n); /* 25: capped at 20 */
        assert_int_equal(n, SAMPLER_MAX_TOP_LOGPROBS);
        /* greedy reports the model's own (temperature 1) distribution */
        ref_log_softmax(x, V, temps[k] > 0.0f ? temps[k] : 1.0, ref);
        assert_true(fabsl((long double)lp - ref[id]) < 1e-5L);
        assert_int_equal(top[0].id, 123);
        assert_int_equal(top[1].id, 4000);
        for (uint32_t j = 0; j < n; j++) {
            assert_true(fabsl((long double)top[j].logprob - ref[top[j].id]) < 1e-5L);
            if (j)
                assert_true(top[j].logprob <= top[j - 1].logprob);
            /* no token outside the list is more likely than its last */
        }
        for (uint32_t i = 0; i < V; i++) {
            bool listed = false;
            for (uint32_t j = 0; j < n; j++)
                listed |= top[j].id == (int32_t)i;
            if (!listed)
                assert_true(ref[i] <= (long double)top[n - 1].logprob + 1e-6L);
        }
        sampler_logprobs(s, id, 0, &lp, top, &n); /* the chosen token's only */
        assert_int_equal(n, 0);
        sampler_destroy(s);
    }
    /* the repetition penalty is part of the distribution drawn from; an impossible token's
     * logprob is the floor, never -inf */
    float y[4] = {2.0f, 1.0f, -INFINITY, 0.5f};
    struct sampler_params p = params(1.0f);
    p.repeat_penalty = 2.0f;
    struct sampler *s = make(&p, 4);
    int32_t hist[1] = {0};
    int32_t id = sampler_sample(s, y, hist, 1);
    float lp;
    struct sampler_logprob top[4];
    uint32_t n;
    sampler_logprobs(s, 2, 4, &lp, top, &n);
    assert_true(lp == SAMPLER_LOGPROB_FLOOR);
    assert_int_equal(n, 4);
    float pen[4] = {1.0f, 1.0f, -INFINITY, 0.5f};
    ref_log_softmax(pen, 4, 1.0, ref);
    assert_int_equal(top[0].id, 0); /* 2 / 2 = 1, tied with id 1: the lower id first */
    assert_int_equal(top[1].id, 1);
    assert_true(fabsl((long double)top[0].logprob - ref[0]) < 1e-6L);
    assert_true(top[3].logprob == SAMPLER_LOGPROB_FLOOR && top[3].id == 2);
    (void)id;
    sampler_destroy(s);
    free(x);
    free(ref);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_params),
        cmocka_unit_test(test_argmax),
        cmocka_unit_test(test_non_finite_logits),
        cmocka_unit_test(test_distribution),
        cmocka_unit_test(test_seed),
        cmocka_unit_test(test_top_k),
        cmocka_unit_test(test_top_p_min_p),
        cmocka_unit_test(test_top_p_brute_force),
        cmocka_unit_test(test_repeat_penalty),
        cmocka_unit_test(test_stop_strings),
        cmocka_unit_test(test_logprobs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
