/*
 * test_kern_elt.c — the elementwise kernels (kern.h, kernels/elt.c, x86/avx*_elt.c):
 *  - exp and tanh of every ISA against libm in double over every 127th float bit pattern
 *    (~34M values; a coarser stride under sanitizers), asserting KERN_EXP_MAX_REL_ERR /
 *    KERN_TANH_MAX_REL_ERR, plus their edge values;
 *  - SiLU and GELU-tanh (with and without bias) against double over x in [-30, 30], asserting
 *    KERN_SILU_MAX_REL_ERR / KERN_GELU_MAX_REL_ERR (+ KERN_GELU_U_REL_ERR * |2u|);
 *  - every SIMD variant against its _ref twin on lengths 0..300 (ragged tails of 8 and 16),
 *    unaligned pointers and special values (NaN, ±inf, ±0, subnormals, huge, tiny), with a
 *    guard zone around each output that must stay untouched:
 *      exp, tanh, silu, gelu, swiglu: bit-identical (same algorithm, same FMAs);
 *      softmax: |Δ| <= 2e-6 y + 1e-9 and sum = 1 ± 1e-5;  rmsnorm: |Δ| <= 1e-5 |y|;
 *      rope: |Δ| <= 1e-6 (|v0| + |v1|) per pair;
 *  - the public entries run the variant of the forced ISA;
 *  - swiglu_clamp (gpt-oss's clamped SwiGLU with biases): every SIMD variant bit-identical to
 *    _ref (lengths 0..300, unaligned, specials, guard zones, in place on g), and _ref against
 *    the formula in double from the same f32 sums: relative <= KERN_SILU_MAX_REL_ERR + 3e-7
 *    + 1.2e-7 |alpha gv|, plus KERN_ACT_ABS_ERR.
 * The measured maxima are printed, so the bounds in kern.h can be checked against them.
 */
#include "testutil.h"
#include "rng.h"
#include "isa_case.h"

#include "kern_variants.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__)
#define ELT_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(undefined_behavior_sanitizer)
#define ELT_SANITIZED 1
#endif
#endif
#ifndef ELT_SANITIZED
#define ELT_SANITIZED 0
#endif

/* Every SWEEP_STRIDE-th float bit pattern: ~34M values, or ~4.8M under sanitizers. */
#define SWEEP_STRIDE (ELT_SANITIZED ? 127u * 7u : 127u)

/* ---- deterministic random data ----------------------------------------------------------- */

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static uint32_t rnd(void)
{
    rng_xorshift64(&rng_state);
    return (uint32_t)(rng_state >> 16);
}

static float rndf(void) { return (float)rnd() / 4294967296.0f * 2.0f - 1.0f; } /* [-1, 1) */

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t to_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static const float specials[] = {
    NAN, -NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1e-40f, -1e-40f, 1.4e-45f, FLT_MIN,
    -FLT_MIN, FLT_MAX, -FLT_MAX, 1e30f, -1e30f, 1e-30f, -1e-30f, 88.72f, 88.73f, 88.76f,
    -87.3f, -103.9f, -104.1f, -150.0f, 0.6249f, -0.625f, 9.1f, -9.1f, 20.0f, -20.0f};
#define N_SPECIALS (sizeof specials / sizeof specials[0])

/* Random values at magnitudes from 1e-3 to 1e2, with a special value at 1 in 8 positions. */
static void fill(float *x, size_t n, int with_specials)
{
    static const float scales[] = {1e-3f, 1.0f, 5.0f, 30.0f, 100.0f};
    for (size_t i = 0; i < n; i++) {
        if (with_specials && rnd() % 8 == 0)
            x[i] = specials[rnd() % N_SPECIALS];
        else
            x[i] = rndf() * scales[rnd() % 5];
    }
}

struct elt_set {
    kern_map_fn *exp, *tanh;
    kern_bias_act_fn *silu, *gelu;
    kern_softmax_fn *softmax;
    kern_rmsnorm_fn *rmsnorm;
    kern_swiglu_fn *swiglu;
    kern_rope_fn *rope;
};

#define ELT_SET_(isa)                                                                        \
    {kern_exp_f32_f32_##isa,     kern_tanh_f32_f32_##isa,    kern_silu_f32_f32_##isa,        \
     kern_gelu_f32_f32_##isa,    kern_softmax_f32_f32_##isa, kern_rmsnorm_f32_f32_##isa,     \
     kern_swiglu_f32_f32_##isa,  kern_rope_f32_f32_##isa}

static const struct elt_set g_sets[3] = {ELT_SET_(ref), ELT_SET_(avx2), ELT_SET_(avx512)};

/* ---- exp / tanh against libm ------------------------------------------------------------- */

struct err_stats {
    double max_rel;   /* over normal results */
    float worst_x;
};

static void note(struct err_stats *s, double rel, float x)
{
    if (rel > s->max_rel) {
        s->max_rel = rel;
        s->worst_x = x;
    }
}

/* Fails with the input and both values unless y is e^x within the bound of kern.h. */
static void check_exp(float x, float y, struct err_stats *s, const char *isa)
{
    if (isnan(x)) {
        if (!isnan(y))
            fail_msg("%s exp(NaN) = %a, expected NaN", isa, (double)y);
        return;
    }
    double d = exp((double)x);
    int ok;
    if (isinf(y))
        ok = y > 0 && d >= (double)FLT_MAX * (1.0 - KERN_EXP_MAX_REL_ERR);
    else
        ok = fabs((double)y - d) <= KERN_EXP_MAX_REL_ERR * d + 0x1p-149;
    if (!ok)
        fail_msg("%s exp(%a = %.9g) = %a, libm %a", isa, (double)x, (double)x, (double)y, d);
    if (x < -104.0f && y != 0.0f)
        fail_msg("%s exp(%a) = %a, expected 0 below -104", isa, (double)x, (double)y);
    if (isfinite(y) && d >= FLT_MIN)
        note(s, fabs((double)y - d) / d, x);
}

static void check_tanh(float x, float y, struct err_stats *s, const char *isa)
{
    if (isnan(x)) {
        if (!isnan(y))
            fail_msg("%s tanh(NaN) = %a, expected NaN", isa, (double)y);
        return;
    }
    double d = tanh((double)x);
    double rel = d == 0.0 ? (y == 0.0f ? 0.0 : 1.0) : fabs((double)y - d) / fabs(d);
    if (rel > KERN_TANH_MAX_REL_ERR || signbit(y) != signbit(x))
        fail_msg("%s tanh(%a = %.9g) = %a, libm %a", isa, (double)x, (double)x, (double)y, d);
    note(s, rel, x);
}

#define SWEEP_BATCH 8192

/* The ref test checks _ref against libm; the SIMD tests check their ISA's bits against _ref. */
static void test_exp_tanh_sweep(void **state)
{
    const struct isa_case *c = isa_case_begin(state);
    float *x = malloc(SWEEP_BATCH * sizeof *x), *y = malloc(SWEEP_BATCH * sizeof *y);
    float *yr = malloc(SWEEP_BATCH * sizeof *yr);
    assert_non_null(x);
    assert_non_null(y);
    assert_non_null(yr);
    struct err_stats se[3] = {{0, 0}, {0, 0}, {0, 0}}, st[3] = {{0, 0}, {0, 0}, {0, 0}};
    /* the sweep's first batch also holds the edges a stride would step over */
    static const uint32_t edges[] = {0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x007fffff,
                                     0x807fffff, 0x00800000, 0x80800000, 0x7f7fffff, 0xff7fffff,
                                     0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000, 0x7f800001,
                                     0x42b17218 /* 88.7228 */, 0x42b17217, 0xc2d00000 /* -104 */,
                                     0xc2cfffff, 0xc2d00001, 0x3f200000 /* 0.625 */, 0x3f1fffff,
                                     0xbf200000, 0xbf1fffff};
    const size_t n_edges = sizeof edges / sizeof edges[0];
    uint64_t u = 0, count = 0;
    while (u <= UINT32_MAX) {
        size_t n = 0;
        if (count == 0)
            for (; n < n_edges; n++)
                x[n] = from_bits(edges[n]);
        for (; n < SWEEP_BATCH && u <= UINT32_MAX; n++, u += SWEEP_STRIDE)
            x[n] = from_bits((uint32_t)u);
        count += n;
        for (int f = 0; f < 2; f++) {
            const char *name = f ? "tanh" : "exp";
            (f ? g_sets[0].tanh : g_sets[0].exp)(yr, x, n);
            if (c->isa == KERN_ISA_REF) {
                for (size_t i = 0; i < n; i++)
                    (f ? check_tanh : check_exp)(x[i], yr[i], f ? &st[0] : &se[0], "ref");
                continue;
            }
            /* the SIMD twins compute the same bits (kern.h), so comparing with _ref suffices */
            const struct elt_set *set = &g_sets[c->isa];
            (f ? set->tanh : set->exp)(y, x, n);
            for (size_t i = 0; i < n; i++)
                if (to_bits(y[i]) != to_bits(yr[i]) && !(isnan(y[i]) && isnan(yr[i])))
                    fail_msg("%s %s(%a) = %a, _ref %a", c->name, name, (double)x[i],
                             (double)y[i], (double)yr[i]);
        }
    }
    if (c->isa != KERN_ISA_REF) {
        printf("# exp/tanh sweep: %llu values (stride %u), %s bit-identical to _ref\n",
               (unsigned long long)count, SWEEP_STRIDE, c->name);
    } else {
        printf("# exp  max rel err %.3g at x = %.9g (bound %g)\n", se[0].max_rel,
               (double)se[0].worst_x, KERN_EXP_MAX_REL_ERR);
        printf("# tanh max rel err %.3g at x = %.9g (bound %g)\n", st[0].max_rel,
               (double)st[0].worst_x, KERN_TANH_MAX_REL_ERR);
    }
    free(x);
    free(y);
    free(yr);
}

/* Edge values of the contracts in kern.h, for every ISA, through the public entries. */
static void test_exp_tanh_edges(void **state)
{
    isa_case_begin(state);
    static const float xs[] = {-INFINITY, INFINITY, -104.5f, -104.0f, 88.8f, 88.72f, 0.0f, -0.0f,
                               NAN, 1e-45f, -1e-45f, 1.0f, -1.0f};
    const size_t n = sizeof xs / sizeof xs[0];
    float y[sizeof xs / sizeof xs[0]], t[sizeof xs / sizeof xs[0]];
    {
        kern_exp(y, xs, n);
        kern_tanh(t, xs, n);
        assert_true(y[0] == 0.0f && !signbit(y[0]));
        assert_true(isinf(y[1]) && y[1] > 0);
        assert_true(y[2] == 0.0f);
        assert_true(isinf(y[4]) && y[4] > 0);
        assert_true(isfinite(y[5])); /* e^88.72 = 3.39e38 < FLT_MAX */
        assert_true(y[6] == 1.0f && y[7] == 1.0f);
        assert_true(isnan(y[8]));
        assert_true(y[9] == 1.0f && y[10] == 1.0f);
        assert_true(fabs(y[11] - M_E) <= 2e-7 * M_E);
        assert_true(t[0] == -1.0f && t[1] == 1.0f);
        assert_true(t[6] == 0.0f && !signbit(t[6]) && t[7] == 0.0f && signbit(t[7]));
        assert_true(isnan(t[8]));
        assert_true(t[9] == 1e-45f && t[10] == -1e-45f);
        assert_true(t[11] == -t[12]);
    }
}

/* ---- SiLU / GELU against double ---------------------------------------------------------- */

static double silu_d(double v) { return v / (1.0 + exp(-v)); }

/* 0.5 v (1 + tanh u) written as v / (1 + e^{-2u}), which double evaluates without cancellation */
static double gelu_u(double v) { return sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v); }
static double gelu_d(double v) { return v / (1.0 + exp(-2.0 * gelu_u(v))); }

static void test_silu_gelu_accuracy(void **state)
{
    isa_case_begin(state);
    const size_t n = (size_t)1 << (ELT_SANITIZED ? 16 : 20);
    float *x = malloc(n * sizeof *x), *b = malloc(n * sizeof *b), *y = malloc(n * sizeof *y);
    assert_non_null(x);
    assert_non_null(b);
    assert_non_null(y);
    for (size_t i = 0; i < n; i++) {
        x[i] = -30.0f + 60.0f * (float)i / (float)(n - 1);
        b[i] = rndf() * 0.5f;
    }
    {
        for (int act = 0; act < 2; act++)
            for (int bias = 0; bias < 2; bias++) {
                (act ? kern_gelu : kern_silu)(y, x, bias ? b : NULL, n);
                double worst = 0.0;
                for (size_t j = 0; j < n; j++) {
                    float v = bias ? x[j] + b[j] : x[j]; /* the f32 sum the kernel sees */
                    if (bias && fabsf(v) > 30.0f)
                        continue;
                    double d = act ? gelu_d(v) : silu_d(v);
                    double bound = act ? KERN_GELU_MAX_REL_ERR +
                                             KERN_GELU_U_REL_ERR * fabs(2.0 * gelu_u(v))
                                       : KERN_SILU_MAX_REL_ERR;
                    double err = fabs((double)y[j] - d);
                    if (err > bound * fabs(d) + KERN_ACT_ABS_ERR)
                        fail_msg("%s %s(%.9g) = %.9g, double %.17g", kern_isa_name(kern_isa()),
                                 act ? "gelu" : "silu", (double)v, (double)y[j], d);
                    if (fabs(d) > 1e-30 && err / fabs(d) / bound > worst)
                        worst = err / fabs(d) / bound;
                }
                printf("# %s %s%s: max error %.2f of the bound\n", kern_isa_name(kern_isa()),
                       act ? "gelu" : "silu", bias ? "+bias" : "", worst);
            }
        /* limits: -inf -> -0, +inf -> +inf, NaN -> NaN */
        const float sp[3] = {-INFINITY, INFINITY, NAN};
        float ys[3];
        for (int act = 0; act < 2; act++) {
            (act ? kern_gelu : kern_silu)(ys, sp, NULL, 3);
            assert_true(ys[0] == 0.0f && signbit(ys[0]));
            assert_true(isinf(ys[1]) && ys[1] > 0);
            assert_true(isnan(ys[2]));
        }
    }
    free(x);
    free(b);
    free(y);
}

/* ---- SIMD variants against their _ref twins ---------------------------------------------- */

#define MAXN 300
#define GUARD 20 /* floats of guard zone on each side of an output */
#define SENTINEL 0x7fa5a5a5u /* a NaN no kernel produces */

/* A buffer with `off` floats of misalignment and guard zones; *p points at element 0. */
struct gbuf {
    float mem[GUARD + 4 + MAXN + GUARD];
    float *p;
    size_t n;
};

static void gbuf_init(struct gbuf *g, size_t off, size_t n)
{
    for (size_t i = 0; i < sizeof g->mem / sizeof g->mem[0]; i++)
        g->mem[i] = from_bits(SENTINEL);
    g->p = g->mem + GUARD + off;
    g->n = n;
}

static void gbuf_check_guards(const struct gbuf *g, const char *what)
{
    for (const float *q = g->mem; q < g->mem + sizeof g->mem / sizeof g->mem[0]; q++)
        if ((q < g->p || q >= g->p + g->n) && to_bits(*q) != SENTINEL)
            fail_msg("%s wrote outside its output (index %td of n = %zu)", what, q - g->p, g->n);
}

static int same_bits(float a, float b)
{
    return to_bits(a) == to_bits(b) || (isnan(a) && isnan(b));
}

/* NaN-ness and infinities agree and |a - b| <= tol. */
static int close_to(float a, float b, double tol)
{
    if (isnan(a) || isnan(b))
        return isnan(a) && isnan(b);
    if (isinf(a) || isinf(b))
        return a == b;
    return fabs((double)a - (double)b) <= tol;
}

static void test_vs_ref(void **state)
{
    const struct isa_case *c = isa_case_begin(state);
    const struct elt_set *ref = &g_sets[KERN_ISA_REF];
    static struct gbuf gx, gb, gy, gr;
    float x[MAXN], b[MAXN], cs[MAXN];
    double w_soft = 0, w_rms = 0, w_rope = 0; /* worst error / bound */
    {
        const struct elt_set *set = &g_sets[c->isa];
        const char *isa = c->name;
        for (size_t n = 0; n <= MAXN; n++) {
            size_t ox = rnd() % 4, oy = rnd() % 4, ob = rnd() % 4;
            char what[64];
            /* maps: bit-identical, in and out of place */
            for (int op = 0; op < 7; op++) {
                static const char *const names[] = {"exp", "tanh", "silu", "gelu", "silu+b",
                                                    "gelu+b", "swiglu"};
                snprintf(what, sizeof what, "%s %s n=%zu", isa, names[op], n);
                fill(x, n, 1);
                fill(b, n, 1);
                gbuf_init(&gx, ox, n);
                gbuf_init(&gb, ob, n);
                gbuf_init(&gy, oy, n);
                gbuf_init(&gr, oy, n);
                memcpy(gx.p, x, n * sizeof *x);
                memcpy(gb.p, b, n * sizeof *b);
                const float *bias = op >= 4 && op < 6 ? gb.p : NULL;
                for (int inplace = 0; inplace < 2; inplace++) {
                    float *out = inplace ? gx.p : gy.p;
                    if (inplace)
                        memcpy(gx.p, x, n * sizeof *x);
                    switch (op) {
                    case 0: ref->exp(gr.p, gx.p, n); set->exp(out, gx.p, n); break;
                    case 1: ref->tanh(gr.p, gx.p, n); set->tanh(out, gx.p, n); break;
                    case 2: case 4:
                        ref->silu(gr.p, gx.p, bias, n);
                        set->silu(out, gx.p, bias, n);
                        break;
                    case 3: case 5:
                        ref->gelu(gr.p, gx.p, bias, n);
                        set->gelu(out, gx.p, bias, n);
                        break;
                    default:
                        ref->swiglu(gr.p, gx.p, gb.p, n);
                        set->swiglu(out, gx.p, gb.p, n);
                        break;
                    }
                    for (size_t i = 0; i < n; i++)
                        if (!same_bits(out[i], gr.p[i]))
                            fail_msg("%s%s: [%zu] x=%a b=%a: %a, _ref %a", what,
                                     inplace ? " in place" : "", i, (double)x[i], (double)b[i],
                                     (double)out[i], (double)gr.p[i]);
                    gbuf_check_guards(inplace ? &gx : &gy, what);
                }
                gbuf_check_guards(&gr, what);
            }

            /* softmax: logits at several scales, some masked with -inf */
            snprintf(what, sizeof what, "%s softmax n=%zu", isa, n);
            float scale = (float[]){1.0f, 10.0f, 100.0f}[rnd() % 3];
            for (size_t i = 0; i < n; i++)
                x[i] = rnd() % 10 == 0 ? -INFINITY : rndf() * scale;
            if (n > 0 && rnd() % 4 == 0)
                x[rnd() % n] = (float[]){NAN, INFINITY, 1e-40f, -0.0f}[rnd() % 4];
            gbuf_init(&gx, ox, n);
            gbuf_init(&gr, oy, n);
            memcpy(gx.p, x, n * sizeof *x);
            memcpy(gr.p, x, n * sizeof *x);
            ref->softmax(gr.p, n);
            set->softmax(gx.p, n);
            gbuf_check_guards(&gx, what);
            double sum = 0;
            for (size_t i = 0; i < n; i++) {
                double tol = 2e-6 * fabs(gr.p[i]) + 1e-9;
                if (!close_to(gx.p[i], gr.p[i], tol))
                    fail_msg("%s: [%zu] %a, _ref %a", what, i, (double)gx.p[i], (double)gr.p[i]);
                if (isfinite(gr.p[i]))
                    w_soft = fmax(w_soft, fabs((double)gx.p[i] - gr.p[i]) / tol);
                if (x[i] == -INFINITY && isfinite(gx.p[i]) && gx.p[i] != 0.0f)
                    fail_msg("%s: masked [%zu] = %a", what, i, (double)gx.p[i]);
                sum += gx.p[i];
            }
            if (n > 0 && isfinite(sum) && fabs(sum - 1.0) > 1e-5)
                fail_msg("%s: sum %.9g", what, sum);

            /* rmsnorm: specials only where every ISA agrees on them (NaN, inf, 0, subnormal) */
            snprintf(what, sizeof what, "%s rmsnorm n=%zu", isa, n);
            fill(x, n, 0);
            fill(b, n, 0);
            if (n > 0 && rnd() % 4 == 0)
                x[rnd() % n] = (float[]){NAN, INFINITY, 1e-40f, -0.0f, 0.0f}[rnd() % 5];
            if (rnd() % 8 == 0)
                memset(x, 0, n * sizeof *x); /* all zero: r = 1/sqrt(eps) */
            gbuf_init(&gx, ox, n);
            gbuf_init(&gb, ob, n);
            gbuf_init(&gy, oy, n);
            gbuf_init(&gr, oy, n);
            memcpy(gx.p, x, n * sizeof *x);
            memcpy(gb.p, b, n * sizeof *b);
            ref->rmsnorm(gr.p, gx.p, gb.p, n, 1e-5f);
            set->rmsnorm(gy.p, gx.p, gb.p, n, 1e-5f);
            gbuf_check_guards(&gy, what);
            for (size_t i = 0; i < n; i++) {
                double tol = 1e-5 * fabs(gr.p[i]);
                if (!close_to(gy.p[i], gr.p[i], tol))
                    fail_msg("%s: [%zu] %a, _ref %a", what, i, (double)gy.p[i], (double)gr.p[i]);
                if (isfinite(gr.p[i]) && gr.p[i] != 0.0f)
                    w_rms = fmax(w_rms, fabs((double)gy.p[i] - gr.p[i]) / tol);
            }
            set->rmsnorm(gx.p, gx.p, gb.p, n, 1e-5f); /* in place */
            for (size_t i = 0; i < n; i++)
                if (!close_to(gx.p[i], gr.p[i], 1e-5 * fabs(gr.p[i])))
                    fail_msg("%s in place: [%zu] %a, _ref %a", what, i, (double)gx.p[i],
                             (double)gr.p[i]);

            /* rope: n_heads heads of an even hd <= MAXN / n_heads */
            size_t heads = 1 + rnd() % 4, hd = (n / heads) & ~(size_t)1;
            snprintf(what, sizeof what, "%s rope heads=%zu hd=%zu", isa, heads, hd);
            float inv[MAXN / 2];
            for (size_t i = 0; i < hd / 2; i++)
                inv[i] = (float)pow(10000.0, -(double)(2 * i) / (double)(hd ? hd : 1));
            kern_rope_table(cs, rnd() % 100000, inv, hd / 2);
            fill(x, heads * hd, 0);
            gbuf_init(&gx, ox, heads * hd);
            gbuf_init(&gr, oy, heads * hd);
            memcpy(gx.p, x, heads * hd * sizeof *x);
            memcpy(gr.p, x, heads * hd * sizeof *x);
            ref->rope(gr.p, heads, hd, cs);
            set->rope(gx.p, heads, hd, cs);
            gbuf_check_guards(&gx, what);
            for (size_t i = 0; i < heads * hd; i++) {
                size_t p0 = i & ~(size_t)1;
                double tol = 1e-6 * (fabs(x[p0]) + fabs(x[p0 + 1]));
                double err = fabs((double)gx.p[i] - gr.p[i]);
                if (err > tol)
                    fail_msg("%s: [%zu] %a, _ref %a", what, i, (double)gx.p[i], (double)gr.p[i]);
                if (tol > 0)
                    w_rope = fmax(w_rope, err / tol);
            }
        }
    }
    printf("# vs _ref, worst error / bound: softmax %.3f, rmsnorm %.3f, rope %.3f\n", w_soft,
           w_rms, w_rope);
}

/* Softmax contract details, every ISA: masks, degenerate rows, one element. */
static void test_softmax_contract(void **state)
{
    isa_case_begin(state);
    {
        float one[1] = {-5.0f};
        kern_softmax(one, 1);
        assert_true(one[0] == 1.0f);
        float m[19];
        for (size_t j = 0; j < 19; j++)
            m[j] = j % 3 ? -INFINITY : 1000.0f + (float)j; /* large logits: max subtracted */
        kern_softmax(m, 19);
        double s = 0;
        for (size_t j = 0; j < 19; j++) {
            if (j % 3)
                assert_true(m[j] == 0.0f);
            s += m[j];
        }
        assert_true(fabs(s - 1.0) <= 1e-5);
        float all[17];
        for (size_t j = 0; j < 17; j++)
            all[j] = -INFINITY;
        kern_softmax(all, 17);
        for (size_t j = 0; j < 17; j++)
            assert_true(isnan(all[j]));
        kern_softmax(NULL, 0); /* no-op */
    }
}

/* The public entries run the forced ISA's variant. */
static void test_dispatch(void **state)
{
    const struct isa_case *c = isa_case_begin(state);
    float x[77], b[77], y[77], r[77];
    fill(x, 77, 1);
    fill(b, 77, 0);
    {
        const struct elt_set *set = &g_sets[c->isa];
        kern_exp(y, x, 77);
        set->exp(r, x, 77);
        assert_memory_equal(y, r, sizeof y);
        kern_tanh(y, x, 77);
        set->tanh(r, x, 77);
        assert_memory_equal(y, r, sizeof y);
        kern_silu(y, x, b, 77);
        set->silu(r, x, b, 77);
        assert_memory_equal(y, r, sizeof y);
        kern_gelu(y, x, b, 77);
        set->gelu(r, x, b, 77);
        assert_memory_equal(y, r, sizeof y);
        kern_swiglu(y, x, b, 77);
        set->swiglu(r, x, b, 77);
        assert_memory_equal(y, r, sizeof y);
        kern_rmsnorm(y, b, x + 1, 70, 1e-6f);
        set->rmsnorm(r, b, x + 1, 70, 1e-6f);
        assert_memory_equal(y, r, 70 * sizeof *y);
        memcpy(y, b, sizeof y);
        memcpy(r, b, sizeof r);
        kern_softmax(y, 77);
        set->softmax(r, 77);
        assert_memory_equal(y, r, sizeof y);
        memcpy(y, b, sizeof y);
        memcpy(r, b, sizeof r);
        kern_rope(y, 2, 38, x);
        set->rope(r, 2, 38, x);
        assert_memory_equal(y, r, sizeof y);
    }
}

/* ---- swiglu_clamp ------------------------------------------------------------------------ */

static kern_swiglu_clamp_fn *const g_clamp[3] = {kern_swiglu_clamp_f32_f32_ref,
                                                 kern_swiglu_clamp_f32_f32_avx2,
                                                 kern_swiglu_clamp_f32_f32_avx512};

/* gpt-oss's constants, and others to show they are parameters */
static const float clamp_alpha[] = {1.702f, 1.0f, 0.5f};
static const float clamp_limit[] = {7.0f, 7.0f, 3.0f};

static void test_swiglu_clamp(void **state)
{
    const struct isa_case *c = isa_case_begin(state);
    kern_swiglu_clamp_fn *ref = g_clamp[KERN_ISA_REF], *set = g_clamp[c->isa];
    static struct gbuf gg, gr, gu, gbg, gbu;
    float g[MAXN], u[MAXN], bg[MAXN], bu[MAXN];
    double worst = 0;
    for (size_t n = 0; n <= MAXN; n++) {
        const size_t pc = n % 3;
        const float alpha = clamp_alpha[pc], lim = clamp_limit[pc];
        char what[64];
        snprintf(what, sizeof what, "%s swiglu_clamp n=%zu", c->name, n);
        fill(g, n, 1);
        fill(u, n, 1);
        fill(bg, n, 0);
        fill(bu, n, 0);
        gbuf_init(&gg, rnd() % 4, n);
        gbuf_init(&gr, rnd() % 4, n);
        gbuf_init(&gu, rnd() % 4, n);
        gbuf_init(&gbg, rnd() % 4, n);
        gbuf_init(&gbu, rnd() % 4, n);
        memcpy(gg.p, g, n * sizeof *g);
        memcpy(gr.p, g, n * sizeof *g);
        memcpy(gu.p, u, n * sizeof *u);
        memcpy(gbg.p, bg, n * sizeof *bg);
        memcpy(gbu.p, bu, n * sizeof *bu);
        ref(gr.p, gu.p, gbg.p, gbu.p, n, alpha, lim);
        set(gg.p, gu.p, gbg.p, gbu.p, n, alpha, lim);
        for (size_t i = 0; i < n; i++) {
            if (!same_bits(gg.p[i], gr.p[i]))
                fail_msg("%s: [%zu] g=%a u=%a: %a, _ref %a", what, i, (double)g[i], (double)u[i],
                         (double)gg.p[i], (double)gr.p[i]);
            /* _ref against the formula in double from the same f32 sums and clamps */
            float gv = g[i] + bg[i], uv = u[i] + bu[i];
            gv = gv < lim ? gv : lim;
            uv = uv > -lim ? uv : -lim;
            uv = uv < lim ? uv : lim;
            double d = (double)gv / (1.0 + exp(-(double)alpha * gv)) * ((double)uv + 1.0);
            if (isinf(gv)) /* gv = -inf: -inf / inf in double; the limit, as fm_siluf, is 0 */
                d = 0.0;
            /* SiLU's bound, two more roundings (uv + 1, the product), and alpha gv's f32
             * rounding times the condition number of e^(-alpha gv) */
            double tol = KERN_ACT_ABS_ERR;
            if (d != 0.0)
                tol += (KERN_SILU_MAX_REL_ERR + 3e-7 + 1.2e-7 * fabs((double)alpha * gv)) *
                       fabs(d);
            if (!(fabs((double)gr.p[i] - d) <= tol))
                fail_msg("%s: [%zu] gv=%a uv=%a: %a, double %a", what, i, (double)gv, (double)uv,
                         (double)gr.p[i], d);
            worst = fmax(worst, fabs((double)gr.p[i] - d) / tol);
            assert_false(isnan(gr.p[i])); /* NaN sums take the limit */
        }
        gbuf_check_guards(&gg, what);
        gbuf_check_guards(&gr, what);
        gbuf_check_guards(&gu, what);
    }
    /* the entry runs the forced ISA's variant */
    fill(g, 77, 1);
    fill(u, 77, 1);
    fill(bg, 77, 0);
    fill(bu, 77, 0);
    float y[77];
    memcpy(y, g, sizeof y);
    kern_swiglu_clamp(y, u, bg, bu, 77, 1.702f, 7.0f);
    set(g, u, bg, bu, 77, 1.702f, 7.0f);
    assert_memory_equal(y, g, sizeof y);
    printf("# %s swiglu_clamp vs double, worst error / bound %.3f\n", c->name, worst);
}

static int teardown(void **state)
{
    (void)state;
    return kern_init() == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        ISA_CASE_TESTS(test_exp_tanh_sweep),
        ISA_CASE_TESTS(test_exp_tanh_edges),
        ISA_CASE_TESTS(test_silu_gelu_accuracy),
        ISA_CASE_SIMD(test_vs_ref),
        ISA_CASE_TESTS(test_softmax_contract),
        ISA_CASE_TESTS(test_dispatch),
        ISA_CASE_TESTS(test_swiglu_clamp),
    };
    setvbuf(stdout, NULL, _IOLBF, 0);
    return cmocka_run_group_tests(tests, NULL, teardown);
}
