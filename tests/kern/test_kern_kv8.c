/*
 * test_kern_kv8.c — the 8-bit KV cache rows (kern.h "8-bit KV cache rows", kernels/kv8.c,
 * x86/avx*_attn.c):
 *  - every finite FP8 E4M3 code decodes to its OCP value and encodes back to itself; random
 *    values round to the nearest code (error <= half the code spacing);
 *  - quantization error of a head row: int8 <= max|x| / 254, E4M3 <= max(|x| 2^-4,
 *    max|x| 2^-10) per value (kern.h's bounds), rows of zeros and non-finite rows;
 *  - the rotation is orthonormal: unrotate(rotate(x)) = x, norms and dot products kept
 *    (|err| <= 1e-6 |x|), a one-hot vector spreads evenly over a power-of-two head, and head
 *    dims that are not powers of two (36, 96) work;
 *  - the SIMD attention tiles for DT_KV_I8 / DT_KV_E4M3 (AVX2, AVX-512) against their _ref
 *    twins on the same rows: |err| <= 1e-5 max|v| (they differ by summation order only: the
 *    decode is bit-identical), and the public kern_attn under kern_force_isa is the variant;
 *    the ref against softmax(q K^T / sqrt(hd)) V in double on the decoded rows:
 *    |err| <= KERN_ATTN_MAX_ERR max|v|.
 */
#include "testutil.h"
#include "rng.h"
#include "isa_case.h"

#include "kern_variants.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t g_rng = 0x2545f4914f6cdd1dull;

static float frand(float lo, float hi)
{
    rng_xorshift64(&g_rng);
    return lo + (hi - lo) * (float)((g_rng >> 40) & 0xffffff) / 16777216.0f;
}

static float e4m3_value(unsigned c)
{
    const int e = (c >> 3) & 15, m = c & 7;
    const double a = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m, -9);
    return (float)(c & 0x80 ? -a : a);
}

static void test_e4m3_codes(void **state)
{
    (void)state;
    uint8_t row[2 + KERN_KV8_SCALE_BYTES];
    float x[2], y[2];
    for (unsigned c = 0; c < 256; c++) {
        if ((c & 0x7f) == 0x7f)
            continue; /* NaN: never written */
        x[0] = 448.0f; /* scale = 448 / 448 = 1: codes are the values themselves */
        x[1] = e4m3_value(c);
        kern_kv8_quant(DT_KV_E4M3, x, row, 2);
        assert_int_equal(row[0], 0x7e);
        if (row[1] != c && !(x[1] == 0.0f && (row[1] & 0x7f) == 0))
            fail_msg("E4M3 %g encoded as %#x, expected %#x", (double)x[1], row[1], c);
        kern_kv8_dequant(DT_KV_E4M3, row, y, 2);
        assert_true(y[1] == x[1]);
    }
    for (int i = 0; i < 20000; i++) {
        x[0] = 448.0f;
        x[1] = frand(-1.0f, 1.0f) * ldexpf(1.0f, (int)frand(-12.0f, 9.0f));
        if (fabsf(x[1]) > 448.0f)
            x[1] = copysignf(448.0f, x[1]);
        kern_kv8_quant(DT_KV_E4M3, x, row, 2);
        kern_kv8_dequant(DT_KV_E4M3, row, y, 2);
        const double bound = fmax(fabs(x[1]) / 16.0, ldexp(1.0, -10));
        if (fabs(y[1] - x[1]) > bound)
            fail_msg("E4M3 %g -> %g, more than half a step", (double)x[1], (double)y[1]);
    }
}

static void test_quant_bounds(void **state)
{
    (void)state;
    const enum dtype kvts[2] = {DT_KV_I8, DT_KV_E4M3};
    float x[256], y[256];
    uint8_t row[256 + KERN_KV8_SCALE_BYTES];
    double worst[2] = {0, 0};
    for (int t = 0; t < 2; t++)
        for (int it = 0; it < 500; it++) {
            const size_t hd = 1 + (size_t)frand(0.0f, 255.99f);
            float amax = 0.0f;
            for (size_t d = 0; d < hd; d++) {
                x[d] = frand(-2.0f, 2.0f) * (it % 7 == 0 && d == 3 ? 50.0f : 1.0f);
                amax = fmaxf(amax, fabsf(x[d]));
            }
            kern_kv8_quant(kvts[t], x, row, hd);
            kern_kv8_dequant(kvts[t], row, y, hd);
            for (size_t d = 0; d < hd; d++) {
                const double e = fabs((double)y[d] - x[d]);
                const double b = kvts[t] == DT_KV_I8
                                     ? amax / 254.0 * (1 + 1e-6)
                                     : fmax(fabs(x[d]) / 16.0, amax * ldexp(1.0, -10)) * (1 + 1e-6);
                if (e > b)
                    fail_msg("%s hd %zu value %g -> %g (max %g): error %g > %g",
                             dtype_kv_name(kvts[t]), hd, (double)x[d], (double)y[d],
                             (double)amax, e, b);
                worst[t] = fmax(worst[t], e / amax);
            }
        }
    print_message("worst error / max|x|: int8 %.3g, fp8 %.3g\n", worst[0], worst[1]);
    /* zeros stay zeros; a non-finite row reads back non-finite (as an f32 cache would) */
    for (int t = 0; t < 2; t++) {
        memset(x, 0, sizeof x);
        kern_kv8_quant(kvts[t], x, row, 16);
        kern_kv8_dequant(kvts[t], row, y, 16);
        for (int d = 0; d < 16; d++)
            assert_true(y[d] == 0.0f);
        x[5] = INFINITY;
        kern_kv8_quant(kvts[t], x, row, 16);
        kern_kv8_dequant(kvts[t], row, y, 16);
        assert_true(isnan(y[0]));
    }
}

static void test_rotation(void **state)
{
    (void)state;
    const size_t hds[] = {1, 8, 36, 64, 96, 128, 256};
    float x[256], y[256], z[256];
    for (size_t i = 0; i < sizeof hds / sizeof hds[0]; i++) {
        const size_t hd = hds[i];
        double nx = 0, ny = 0, dxz = 0, dyz = 0;
        for (size_t d = 0; d < hd; d++) {
            x[d] = frand(-1.0f, 1.0f);
            z[d] = frand(-1.0f, 1.0f);
        }
        memcpy(y, x, hd * sizeof(float));
        kern_kv_rotate(y, hd);
        for (size_t d = 0; d < hd; d++) {
            nx += (double)x[d] * x[d];
            ny += (double)y[d] * y[d];
            dxz += (double)x[d] * z[d];
        }
        float zr[256];
        memcpy(zr, z, hd * sizeof(float));
        kern_kv_rotate(zr, hd);
        for (size_t d = 0; d < hd; d++)
            dyz += (double)y[d] * zr[d];
        assert_true(fabs(ny - nx) <= 1e-5 * nx);
        assert_true(fabs(dyz - dxz) <= 1e-5 * sqrt(nx) * sqrt((double)hd));
        kern_kv_unrotate(y, hd);
        for (size_t d = 0; d < hd; d++)
            if (fabs((double)y[d] - x[d]) > 1e-6 * sqrt(nx))
                fail_msg("hd %zu: unrotate(rotate(x))[%zu] = %g, x = %g", hd, d, (double)y[d],
                         (double)x[d]);
    }
    /* an outlier channel is spread evenly: the point of the rotation */
    memset(x, 0, sizeof x);
    x[17] = 10.0f;
    kern_kv_rotate(x, 128);
    for (size_t d = 0; d < 128; d++)
        assert_true(fabsf(fabsf(x[d]) - 10.0f / sqrtf(128.0f)) < 1e-5f);
}

/* ---- attention tiles ---------------------------------------------------------------------- */

static kern_attn_fn *const g_fns[3][2] = {
    {kern_attn_kvi8_f32_ref, kern_attn_kvf8_f32_ref},
    {kern_attn_kvi8_f32_avx2, kern_attn_kvf8_f32_avx2},
    {kern_attn_kvi8_f32_avx512, kern_attn_kvf8_f32_avx512}};

/* n positions of two KV heads (the second is read), rows of 2 head rows: k, v bytes */
struct cache8 {
    size_t hd, n, ld;
    uint8_t *k, *v;
    float *kd, *vd; /* [n][hd] the second head decoded */
};

static void cache8_init(struct cache8 *c, enum dtype kvt, size_t hd, size_t n)
{
    float x[256];
    c->hd = hd;
    c->n = n;
    c->ld = 2 * kern_kv8_head_bytes(hd);
    c->k = malloc(n * c->ld);
    c->v = malloc(n * c->ld);
    c->kd = malloc(n * hd * sizeof(float));
    c->vd = malloc(n * hd * sizeof(float));
    assert_true(c->k && c->v && c->kd && c->vd);
    for (size_t p = 0; p < n; p++)
        for (int h = 0; h < 2; h++) {
            for (size_t d = 0; d < hd; d++)
                x[d] = frand(-1.0f, 1.0f);
            kern_kv8_quant(kvt, x, c->k + p * c->ld + h * kern_kv8_head_bytes(hd), hd);
            for (size_t d = 0; d < hd; d++)
                x[d] = frand(-1.0f, 1.0f);
            kern_kv8_quant(kvt, x, c->v + p * c->ld + h * kern_kv8_head_bytes(hd), hd);
        }
    const size_t off = kern_kv8_head_bytes(hd);
    for (size_t p = 0; p < n; p++) {
        kern_kv8_dequant(kvt, c->k + p * c->ld + off, c->kd + p * hd, hd);
        kern_kv8_dequant(kvt, c->v + p * c->ld + off, c->vd + p * hd, hd);
    }
}

static void cache8_fini(struct cache8 *c)
{
    free(c->k);
    free(c->v);
    free(c->kd);
    free(c->vd);
}

/* nq rows over all n positions in spans of `span`, with fn; out [nq][hd] */
static void run(kern_attn_fn *fn, const struct cache8 *c, float q[][256], size_t nq,
                size_t span, float out[][256])
{
    const float *qr[8];
    float *orow[8], m[8], l[8];
    for (size_t r = 0; r < nq; r++) {
        qr[r] = q[r];
        orow[r] = out[r];
    }
    const size_t off = kern_kv8_head_bytes(c->hd);
    kern_attn_begin(orow, m, l, nq, c->hd);
    for (size_t p = 0; p < c->n; p += span) {
        const size_t n = c->n - p < span ? c->n - p : span;
        fn(qr, orow, m, l, NULL, NULL, nq, c->k + p * c->ld + off, c->v + p * c->ld + off,
           c->ld, n, c->hd, 1.0f / sqrtf((float)c->hd));
    }
    kern_attn_end(orow, l, nq, c->hd);
}

static double naive_err(const struct cache8 *c, float q[][256], size_t nq, float out[][256])
{
    double err = 0, vmax = 0;
    double *s = malloc(c->n * sizeof *s);
    assert_non_null(s);
    for (size_t i = 0; i < c->n * c->hd; i++)
        vmax = fmax(vmax, fabs(c->vd[i]));
    for (size_t r = 0; r < nq; r++) {
        double mx = -INFINITY, sum = 0;
        for (size_t p = 0; p < c->n; p++) {
            double d = 0;
            for (size_t j = 0; j < c->hd; j++)
                d += (double)q[r][j] * c->kd[p * c->hd + j];
            s[p] = d / sqrt((double)c->hd);
            mx = fmax(mx, s[p]);
        }
        for (size_t p = 0; p < c->n; p++)
            sum += (s[p] = exp(s[p] - mx));
        for (size_t j = 0; j < c->hd; j++) {
            double acc = 0;
            for (size_t p = 0; p < c->n; p++)
                acc += s[p] * c->vd[p * c->hd + j];
            err = fmax(err, fabs(acc / sum - out[r][j]));
        }
    }
    free(s);
    return err / vmax;
}

static void test_attn_kv8(void **state)
{
    const struct isa_case *ic = isa_case_begin(state);
    const enum dtype kvts[2] = {DT_KV_I8, DT_KV_E4M3};
    const size_t hds[] = {32, 36, 64, 128}, ns[] = {1, 7, 64, 130}, nqs[] = {1, 4, 8};
    static float q[8][256], out[8][256], ref[8][256];
    double worst = 0, worst_naive = 0;
    for (int t = 0; t < 2; t++)
        for (size_t a = 0; a < 4; a++)
            for (size_t b = 0; b < 4; b++)
                for (size_t e = 0; e < 3; e++) {
                    struct cache8 c;
                    cache8_init(&c, kvts[t], hds[a], ns[b]);
                    for (size_t r = 0; r < nqs[e]; r++)
                        for (size_t d = 0; d < hds[a]; d++)
                            q[r][d] = frand(-2.0f, 2.0f);
                    run(g_fns[0][t], &c, q, nqs[e], 16, ref);
                    run(g_fns[ic->isa][t], &c, q, nqs[e], 1 + b * 11, out);
                    double vmax = 0, err = 0;
                    for (size_t i = 0; i < c.n * c.hd; i++)
                        vmax = fmax(vmax, fabs(c.vd[i]));
                    for (size_t r = 0; r < nqs[e]; r++)
                        for (size_t d = 0; d < hds[a]; d++)
                            err = fmax(err, fabs((double)out[r][d] - ref[r][d]));
                    err /= vmax;
                    worst = fmax(worst, err);
                    if (err > 1e-5)
                        fail_msg("%s %s hd %zu n %zu nq %zu: error %g vs _ref", ic->name,
                                 dtype_kv_name(kvts[t]), hds[a], ns[b], nqs[e], err);
                    const double en = naive_err(&c, q, nqs[e], ref);
                    worst_naive = fmax(worst_naive, en);
                    assert_true(en <= KERN_ATTN_MAX_ERR);
                    /* the public entry dispatches to this ISA's variant */
                    const float *qr[8];
                    float *orow[8], m[8], l[8];
                    for (size_t r = 0; r < nqs[e]; r++) {
                        qr[r] = q[r];
                        orow[r] = ref[r];
                    }
                    const size_t off = kern_kv8_head_bytes(c.hd);
                    kern_attn_begin(orow, m, l, nqs[e], c.hd);
                    kern_attn(kvts[t], qr, orow, m, l, NULL, nqs[e], c.k + off, c.v + off, c.ld,
                              c.n, c.hd, 1.0f / sqrtf((float)c.hd));
                    kern_attn_end(orow, l, nqs[e], c.hd);
                    run(g_fns[ic->isa][t], &c, q, nqs[e], c.n, out);
                    for (size_t r = 0; r < nqs[e]; r++)
                        assert_memory_equal(out[r], ref[r], c.hd * sizeof(float));
                    cache8_fini(&c);
                }
    print_message("%s: worst |simd - ref| / max|v| %.3g, ref vs double %.3g\n", ic->name, worst,
                  worst_naive);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_e4m3_codes),
        cmocka_unit_test(test_quant_bounds),
        cmocka_unit_test(test_rotation),
        ISA_CASE_TESTS(test_attn_kv8),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
