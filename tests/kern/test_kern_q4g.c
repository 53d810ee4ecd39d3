/*
 * test_kern_q4g.c — the int4 group types (q4_g64, q4_g128, q4z_g32, q4z_g64, q4z_g128):
 * quantize -> dequantize error per group, and every GEMV/GEMM variant of every ISA against its
 * scalar `_ref` twin and against the f32 product, on random ragged shapes (row counts and row
 * ranges that are no multiple of the register tiles, 1..17 tokens, odd numbers of 32-column
 * blocks for q4z_g32).
 *
 * Stated bounds (d, m the group's f16 scale and offset as stored):
 *  - q4_gN quantizer: |x - x^| <= |d| * (1 + 2^-9) for every element (the positive extreme of
 *    a group whose largest magnitude is negative clips from code +8 to +7: one step), and
 *    <= |d| / 2 * (1 + 2^-9) for elements inside [-8.5 d, 7.5 d] (plain rounding).
 *  - q4z_gN quantizer: |x - x^| <= |d| / 2 + 2^-10 * (|min| + (max - min)) (rounding, plus the
 *    f16 rounding of d and m which can push the extremes one code off the grid's ends).
 *  - variant vs its twin (identical int8 activations and exact integer dot products; only the
 *    order of f32 additions differs): |y - y_twin| <= 1e-5 * S', S' = sum (|d q| + |m|) |x|
 *    over the terms the kernels actually add (for q4z the d q and m parts are summed apart).
 *  - twin and dispatched kern_matmul vs the f32 product of the dequantized weights: the int8
 *    activation bound of kernels/include/quant.h, sum_b d_b/2 * sum_{i in b} |w_i|, plus 2e-5 * S'.
 */
#include "testutil.h"
#include "rng.h"
#include "isa_case.h"

#include "dtype.h"
#include "err.h"
#include "half.h"
#include "kern_variants.h"
#include "quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SENTINEL -12345.0f

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static uint32_t rnd(void)
{
    rng_xorshift64(&rng_state);
    return (uint32_t)(rng_state >> 16);
}

static float rndf(void) { return (float)rnd() / 4294967296.0f * 2.0f - 1.0f; } /* [-1, 1) */

static size_t rndz(size_t lo, size_t hi) { return lo + rnd() % (hi - lo + 1); }

static const enum dtype types[] = {DT_Q4_G64, DT_Q4_G128, DT_Q4Z_G32, DT_Q4Z_G64, DT_Q4Z_G128};

/* Random values with a per-group magnitude over two decades and, now and then, a group
 * shifted off zero (what a zero point is for) or constant (d = 0). */
static float *make_src(size_t count, size_t group)
{
    float *v = malloc(count * sizeof(float));
    assert_non_null(v);
    for (size_t g = 0; g < count; g += group) {
        float mag = powf(10.0f, rndf()), shift = rnd() % 4 == 0 ? rndf() * mag : 0.0f;
        int constant = rnd() % 50 == 0;
        for (size_t i = g; i < g + group; i++)
            v[i] = constant ? shift : rndf() * mag + shift;
    }
    return v;
}

static uint16_t u16_at(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* The quantize -> dequantize bounds above, per group, on many rows. */
static void test_quantize_bounds(void **state)
{
    (void)state;
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        enum dtype dt = types[k];
        const struct dtype_info *di = dtype_info(dt);
        const size_t g = di->block, n = g * 37;
        const int zp = dtype_q4g_has_min(dt);
        double worst = 0.0; /* largest error / |d|, reported */
        for (int rep = 0; rep < 40; rep++) {
            float *x = make_src(n, g), *back = malloc(n * sizeof(float));
            uint8_t *q = malloc(n / g * di->block_bytes);
            assert_non_null(back);
            assert_non_null(q);
            assert_int_equal(kern_quantize_row_q4g(dt, x, q, n), 0);
            kern_row_to_f32(dt, q, back, n);
            for (size_t b = 0; b < n / g; b++) {
                const uint8_t *blk = q + b * di->block_bytes;
                float d = half_f16_to_f32(u16_at(blk));
                float lo = INFINITY, hi = -INFINITY;
                for (size_t i = b * g; i < b * g + g; i++) {
                    lo = fminf(lo, x[i]);
                    hi = fmaxf(hi, x[i]);
                }
                for (size_t i = b * g; i < b * g + g; i++) {
                    float e = fabsf(x[i] - back[i]), bound;
                    if (zp) {
                        bound = fabsf(d) / 2 + 0x1p-10f * (fabsf(lo) + (hi - lo)) + 1e-30f;
                    } else {
                        float t = d != 0.0f ? x[i] / d : 0.0f;
                        bound = (t >= -8.5f && t <= 7.5f ? fabsf(d) / 2 : fabsf(d)) *
                                    (1 + 0x1p-9f) + 1e-30f;
                    }
                    if (!(e <= bound))
                        fail_msg("%s: group %zu element %zu: x %.9g back %.9g error %.3g > %.3g "
                                 "(d %.6g)", di->name, b, i - b * g, x[i], back[i], e, bound, d);
                    if (d != 0.0f && e / fabsf(d) > worst)
                        worst = e / fabsf(d);
                }
            }
            free(q);
            free(back);
            free(x);
        }
        printf("%-9s quantize: worst |x - x^| = %.3f d\n", di->name, worst);
    }
    /* ragged and non-finite inputs are refused */
    float bad[64] = {0};
    uint8_t out[68 * 2];
    assert_int_equal(kern_quantize_row_q4g(DT_Q4_G64, bad, out, 32), ERR_FORMAT);
    bad[5] = NAN;
    assert_int_equal(kern_quantize_row_q4g(DT_Q4Z_G32, bad, out, 64), ERR_RANGE);
}

/* --rounding search: per group, never a larger squared error than round to nearest (it is
 * one of the candidates); reports the total error ratio. q4_0 included. */
static void test_search_rounding(void **state)
{
    (void)state;
    static const enum dtype all[] = {DT_Q4_0,    DT_Q4_G64,  DT_Q4_G128,
                                     DT_Q4Z_G32, DT_Q4Z_G64, DT_Q4Z_G128};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) {
        enum dtype dt = all[k];
        const struct dtype_info *di = dtype_info(dt);
        const size_t g = di->block, n = g * 64;
        float *x = make_src(n, g), *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
        uint8_t *qa = malloc(n / g * di->block_bytes), *qb = malloc(n / g * di->block_bytes);
        assert_true(a && b && qa && qb);
        /* q4_0 through the group path: kern_quantize_row_q4g covers only the new types, and
         * q4_0's round to nearest is the converter's (client/offline/convert.c), reproduced here */
        if (dt == DT_Q4_0) {
            for (size_t i = 0; i < n; i += 32) {
                float big = 0.0f;
                for (size_t j = i; j < i + 32; j++)
                    big = fabsf(x[j]) > fabsf(big) ? x[j] : big;
                uint16_t d16 = half_f32_to_f16(big / -8.0f);
                float d = half_f16_to_f32(d16), id = d != 0.0f ? 1.0f / d : 0.0f;
                uint8_t *blk = qa + i / 32 * 18;
                memcpy(blk, &d16, 2);
                for (int j = 0; j < 16; j++) {
                    float r0 = roundf(x[i + (size_t)j] * id) + 8.0f;
                    float r1 = roundf(x[i + (size_t)j + 16] * id) + 8.0f;
                    int c0 = r0 < 0 ? 0 : r0 > 15 ? 15 : (int)r0;
                    int c1 = r1 < 0 ? 0 : r1 > 15 ? 15 : (int)r1;
                    blk[2 + j] = (uint8_t)(c0 | (c1 << 4));
                }
            }
        } else {
            assert_int_equal(kern_quantize_row_q4g(dt, x, qa, n), 0);
        }
        assert_int_equal(kern_quantize_row_q4_search(dt, x, qb, n), 0);
        kern_row_to_f32(dt, qa, a, n);
        kern_row_to_f32(dt, qb, b, n);
        double ea_all = 0, eb_all = 0;
        for (size_t i = 0; i < n; i += g) {
            double ea = 0, eb = 0;
            for (size_t j = i; j < i + g; j++) {
                ea += (double)(x[j] - a[j]) * (x[j] - a[j]);
                eb += (double)(x[j] - b[j]) * (x[j] - b[j]);
            }
            if (!(eb <= ea * (1 + 1e-6) + 1e-30))
                fail_msg("%s group %zu: search error %.6g > nearest %.6g", di->name, i / g, eb,
                         ea);
            ea_all += ea;
            eb_all += eb;
        }
        printf("%-9s search: squared error %.3f x round-to-nearest\n", di->name,
               ea_all > 0 ? eb_all / ea_all : 1.0);
        free(qb);
        free(qa);
        free(b);
        free(a);
        free(x);
    }
}

struct variant {
    const char *name;
    enum dtype wt;
    enum kern_isa isa;
    kern_mm_fn *fn, *twin;
};

#define V_(op, wty, DT, isa, ISA)                                                            \
    {"kern_" #op "_" #wty "_q8_0_" #isa, DT, ISA, kern_##op##_##wty##_q8_0_##isa,             \
     kern_##op##_##wty##_q8_0_ref},
#define VS_(isa, ISA)                                                                        \
    V_(gemv, q4_g64, DT_Q4_G64, isa, ISA) V_(gemm, q4_g64, DT_Q4_G64, isa, ISA)              \
    V_(gemv, q4_g128, DT_Q4_G128, isa, ISA) V_(gemm, q4_g128, DT_Q4_G128, isa, ISA)          \
    V_(gemv, q4z_g32, DT_Q4Z_G32, isa, ISA) V_(gemm, q4z_g32, DT_Q4Z_G32, isa, ISA)          \
    V_(gemv, q4z_g64, DT_Q4Z_G64, isa, ISA) V_(gemm, q4z_g64, DT_Q4Z_G64, isa, ISA)          \
    V_(gemv, q4z_g128, DT_Q4Z_G128, isa, ISA) V_(gemm, q4z_g128, DT_Q4Z_G128, isa, ISA)

static const struct variant variants[] = {VS_(ref, KERN_ISA_REF) VS_(avx2, KERN_ISA_AVX2)
                                              VS_(avx512, KERN_ISA_AVX512)};

static void check_close(const char *what, const float *y, const float *want, const float *tol,
                        size_t n, size_t ldy, size_t r0, size_t r1, size_t cols)
{
    for (size_t t = 0; t < n; t++)
        for (size_t r = 0; r < ldy; r++) {
            size_t i = t * ldy + r;
            if (r < r0 || r >= r1) {
                if (y[i] != SENTINEL)
                    fail_msg("%s: cols %zu n %zu rows [%zu,%zu): y[%zu][%zu] outside the range "
                             "was written", what, cols, n, r0, r1, t, r);
                continue;
            }
            if (!(fabsf(y[i] - want[i]) <= tol[i]))
                fail_msg("%s: cols %zu n %zu rows [%zu,%zu): y[%zu][%zu] = %.9g, want %.9g "
                         "(tolerance %.3g)", what, cols, n, r0, r1, t, r, y[i], want[i], tol[i]);
        }
}

static void fill(float *p, size_t count, float v)
{
    for (size_t i = 0; i < count; i++)
        p[i] = v;
}

static unsigned ran[3]; /* variant checks per ISA, printed */
static enum kern_isa g_isa; /* the ISA the running test checks (isa_case.h) */

static void run_case(enum dtype wt, size_t cols, size_t n)
{
    const struct dtype_info *di = dtype_info(wt);
    const int zp = dtype_q4g_has_min(wt);
    size_t rows = rndz(1, 23);
    size_t r0 = rnd() % 3 == 0 ? 0 : rndz(0, rows - 1), r1 = rndz(r0 + 1, rows);
    size_t ldy = rows + rndz(0, 3);
    uint64_t rb;
    assert_int_equal(dtype_row_bytes(wt, cols, &rb), 0);
    float *src = make_src(rows * cols, di->block), *wf = malloc(rows * cols * sizeof(float));
    uint8_t *w = malloc(rows * rb);
    float *x = malloc(n * cols * sizeof(float));
    assert_non_null(wf);
    assert_non_null(w);
    assert_non_null(x);
    for (size_t r = 0; r < rows; r++) {
        assert_int_equal(kern_quantize_row_q4g(wt, src + r * cols, w + r * rb, cols), 0);
        kern_row_to_f32(wt, w + r * rb, wf + r * cols, cols);
    }
    for (size_t i = 0; i < n * cols; i++)
        x[i] = rndf() * (rnd() % 8 == 0 ? 10.0f : 1.0f);

    size_t act_bytes;
    assert_int_equal(kern_act_bytes(wt, cols, n, &act_bytes), 0);
    void *buf = aligned_alloc(64, act_bytes);
    assert_non_null(buf);
    struct kern_act a;
    kern_act_init(&a, wt, x, cols, n, buf);
    kern_act_prepare(&a, 0, n);

    /* S' and the activation-quantization bound of each output */
    size_t cnt = n * ldy;
    float *s = malloc(cnt * sizeof(float)), *qb = malloc(cnt * sizeof(float));
    float *want = malloc(cnt * sizeof(float)), *twin = malloc(cnt * sizeof(float));
    float *y = malloc(cnt * sizeof(float)), *tol = malloc(cnt * sizeof(float));
    assert_true(s && qb && want && twin && y && tol);
    for (size_t t = 0; t < n; t++)
        for (size_t r = 0; r < rows; r++) {
            double sum = 0, qerr = 0;
            for (size_t c = 0; c < cols; c++) {
                const uint8_t *blk = w + r * rb + c / di->block * di->block_bytes;
                float m = zp ? fabsf(half_f16_to_f32(u16_at(blk + 2))) : 0.0f;
                sum += (fabs((double)wf[r * cols + c]) + 2.0 * m) * fabs((double)x[t * cols + c]);
            }
            for (size_t b = 0; b < cols / 32; b++) {
                double wabs = 0;
                for (size_t c = b * 32; c < b * 32 + 32; c++)
                    wabs += fabs(wf[r * cols + c]);
                qerr += a.d[t * a.cp / 32 + b] / 2 * wabs;
            }
            s[t * ldy + r] = (float)sum;
            qb[t * ldy + r] = (float)qerr;
        }
    fill(want, cnt, SENTINEL);
    kern_matmul_ref(wt, w, cols, x, n, want, ldy, r0, r1);

    char what[160];
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        const struct variant *vr = &variants[v];
        if (vr->wt != wt || vr->isa != g_isa)
            continue;
        fill(twin, cnt, SENTINEL);
        fill(y, cnt, SENTINEL);
        for (size_t i = 0; i < cnt; i++)
            tol[i] = 1e-5f * s[i] + 1e-30f;
        vr->twin(w, &a, twin, ldy, r0, r1);
        vr->fn(w, &a, y, ldy, r0, r1);
        ran[vr->isa]++;
        snprintf(what, sizeof what, "%s vs its twin", vr->name);
        check_close(what, y, twin, tol, n, ldy, r0, r1, cols);
        for (size_t i = 0; i < cnt; i++)
            tol[i] = qb[i] + 2e-5f * s[i] + 1e-30f;
        snprintf(what, sizeof what, "%s's twin vs kern_matmul_ref", vr->name);
        check_close(what, twin, want, tol, n, ldy, r0, r1, cols);
    }
    {
        const enum kern_isa isa = g_isa;
        fill(y, cnt, SENTINEL);
        fill(twin, cnt, SENTINEL);
        for (size_t i = 0; i < cnt; i++)
            tol[i] = (isa != KERN_ISA_REF ? qb[i] : 0.0f) + 2e-5f * s[i] + 1e-30f;
        kern_matmul(wt, w, cols, x, n, y, ldy, r0, r1);
        snprintf(what, sizeof what, "kern_matmul(%s, %s)", di->name,
                 kern_isa_name((enum kern_isa)isa));
        check_close(what, y, want, tol, n, ldy, r0, r1, cols);
        kern_act_prepare(&a, 0, n); /* the prepared form is the same for every ISA */
        kern_matmul_act(w, &a, twin, ldy, r0, r1);
        snprintf(what, sizeof what, "kern_matmul_act(%s, %s)", di->name,
                 kern_isa_name((enum kern_isa)isa));
        check_close(what, twin, want, tol, n, ldy, r0, r1, cols);
    }
    free(tol);
    free(y);
    free(twin);
    free(want);
    free(qb);
    free(s);
    free(buf);
    free(x);
    free(w);
    free(wf);
    free(src);
}

static void test_matmul(void **state)
{
    g_isa = isa_case_begin(state)->isa;
    static const size_t ns[] = {1, 2, 3, 4, 5, 8, 17};
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        enum dtype wt = types[k];
        size_t g = dtype_info(wt)->block;
        for (size_t in = 0; in < sizeof ns / sizeof ns[0]; in++)
            for (int c = 0; c < 6; c++) {
                /* 1..40 groups: odd block counts (q4z_g32), one group, >= 16 blocks */
                size_t groups = c == 0 ? 1 : rndz(1, 40);
                run_case(wt, groups * g, ns[in]);
            }
    }
    printf("variant checks: %s %u\n", kern_isa_name(g_isa), ran[g_isa]);
}

/* kern_row_to_f32 follows the documented layout (docs/IEBIN.md), checked on a hand-built
 * block: codes of sub-block s element j = (s + j) % 16. */
static void test_layout(void **state)
{
    (void)state;
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        enum dtype dt = types[k];
        const struct dtype_info *di = dtype_info(dt);
        const int zp = dtype_q4g_has_min(dt);
        uint8_t blk[68] = {0};
        uint16_t d = half_f32_to_f16(0.5f), m = half_f32_to_f16(-3.0f);
        memcpy(blk, &d, 2);
        if (zp)
            memcpy(blk + 2, &m, 2);
        size_t hb = zp ? 4 : 2;
        for (size_t s = 0; s < di->block / 32; s++)
            for (int j = 0; j < 16; j++)
                blk[hb + 16 * s + (size_t)j] =
                    (uint8_t)(((s + (size_t)j) % 16) | (((s + (size_t)j + 16) % 16) << 4));
        assert_int_equal(di->block_bytes, hb + di->block / 2);
        float out[128];
        kern_row_to_f32(dt, blk, out, di->block);
        for (size_t i = 0; i < di->block; i++) {
            int code = (int)((i / 32 + i % 32) % 16);
            float want = zp ? 0.5f * (float)code - 3.0f : 0.5f * (float)(code - 8);
            if (out[i] != want)
                fail_msg("%s element %zu: %g, want %g", di->name, i, out[i], want);
        }
        enum dtype back;
        assert_int_equal(dtype_from_name(di->name, &back), 0);
        assert_int_equal(back, dt);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout),
        cmocka_unit_test(test_quantize_bounds),
        cmocka_unit_test(test_search_rounding),
        ISA_CASE_TESTS(test_matmul),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
