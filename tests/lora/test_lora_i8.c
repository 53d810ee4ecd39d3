/*
 * test_lora_i8.c — 8-bit LoRA adapter weights (--lora-weights int8; kern.h "LoRA shrink and
 * expand on int8 adapter weights", lora.h LORA_PACK_INT8):
 *   - the AVX2 and AVX-512 VNNI kernels give their scalar twin's bits (ragged shapes, column
 *     sub-ranges, zero-scale tokens untouched, a token alone = in a batch);
 *   - the stated error bound (docs/LORA.md "8-bit adapter weights"): per output, the int8
 *     update is within half a quantization step of each of its four quantized operands,
 *     propagated (bound_i8 below), of the f32 update; and on Gaussian-like data its relative
 *     RMS error is below 3 %;
 *   - lora_repack(LORA_PACK_INT8) through the serving path (lora_apply_fused) against the f32
 *     adapter: the same bound, a new digest; "int8" parses; a projection too wide for the
 *     int8 kernels is refused, naming it.
 */
#include "testutil.h"
#include "../kern/isa_case.h"

#include "peft.h"

#include "err.h"
#include "kern.h"
#include "kern_variants.h"
#include "log.h"
#include "lora.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float urand(void) /* uniform in [-1, 1) */
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 11) / (double)(1ull << 53) * 2.0 - 1.0);
}
static float grand(void) /* roughly Gaussian, unit variance: a sum of 4 uniforms */
{
    return (urand() + urand() + urand() + urand()) * 0.866f;
}

/* The int8 serving layout of kern.h, written from f32 A [r][in] and B [out][r]. */
struct packed {
    unsigned char *a, *bt;
};

static struct packed pack(const float *a, const float *b, size_t in, size_t out, size_t r)
{
    size_t hdr = KERN_LORA_I8_HDR(r), g = (r + 3) / 4, panels = (out + 31) / 32;
    struct packed p = {malloc(hdr + r * in), malloc(hdr + panels * g * 128)};
    assert_non_null(p.a);
    assert_non_null(p.bt);
    memset(p.a, 0, hdr);
    memset(p.bt, 0, hdr);
    memset(p.bt + hdr, 128, panels * g * 128);
    int8_t *q = malloc(in > out ? in : out);
    float *col = malloc(out * sizeof *col);
    for (size_t k = 0; k < r; k++) {
        ((float *)p.a)[k] = kern_lora_i8_quant(a + k * in, in, q);
        for (size_t c = 0; c < in; c++)
            p.a[hdr + k * in + c] = (unsigned char)(q[c] + 128);
        for (size_t j = 0; j < out; j++)
            col[j] = b[j * r + k];
        ((float *)p.bt)[k] = kern_lora_i8_quant(col, out, q);
        for (size_t j = 0; j < out; j++)
            p.bt[hdr + KERN_LORA_I8_BT_INDEX(r, k, j)] = (unsigned char)(q[j] + 128);
    }
    free(q);
    free(col);
    return p;
}

static void unpack_free(struct packed *p)
{
    free(p->a);
    free(p->bt);
}

/* The SIMD variants of the active ISA against the scalar twin: the same bits. */
static void test_i8_kernels(void **state)
{
    const struct isa_case *c = isa_case_begin(state);
    kern_lora_shrink_fn *shrink = c->isa == KERN_ISA_AVX2 ? kern_lora_shrink_i8_avx2
                                                          : kern_lora_shrink_i8_avx512;
    kern_lora_expand_fn *expand = c->isa == KERN_ISA_AVX2 ? kern_lora_expand_i8_avx2
                                                          : kern_lora_expand_i8_avx512;
    const size_t ins[] = {1, 31, 32, 33, 172, 2048, 5632, 64};
    const size_t outs[] = {1, 31, 32, 33, 100, 260, 2048, 96};
    const size_t ranks[] = {1, 2, 5, 16, 32, 70, 8, 3};
    const size_t ns[] = {1, 2, 3, 4, 5, 9, 2, 8};
    for (int cs = 0; cs < 8; cs++) {
        size_t in = ins[cs], out = outs[(cs + 2) % 8], r = ranks[(cs + 1) % 8],
               n = ns[(cs * 5) % 8], ldy = out + 3;
        float *a = malloc(r * in * 4), *b = malloc(out * r * 4), *x = malloc(n * in * 4);
        float *t = malloc(n * r * 4), *t2 = malloc(n * r * 4), *t1 = malloc(r * 4);
        float *y0 = malloc(n * ldy * 4), *y = malloc(n * ldy * 4), *y2 = malloc(n * ldy * 4);
        float *y1 = malloc(ldy * 4), *sc = malloc(n * 4);
        for (size_t i = 0; i < r * in; i++)
            a[i] = urand();
        for (size_t i = 0; i < out * r; i++)
            b[i] = urand() * 0.1f;
        for (size_t i = 0; i < n * in; i++)
            x[i] = grand();
        for (size_t i = 0; i < n; i++)
            sc[i] = i == 1 ? 0.0f : 0.5f + urand();
        for (size_t i = 0; i < n * ldy; i++)
            y0[i] = urand() * 4.0f;
        struct packed p = pack(a, b, in, out, r);
        const size_t j0 = out > 40 ? 3 : 0, j1 = out > 40 ? out - 2 : out;
        kern_lora_shrink_i8_ref(p.a, in, r, x, n, t, 0, r);
        memset(t2, 0xff, n * r * 4);
        shrink(p.a, in, r, x, n, t2, r / 2, r); /* two rank ranges */
        shrink(p.a, in, r, x, n, t2, 0, r / 2);
        if (memcmp(t, t2, n * r * 4) != 0)
            fail_msg("%s shrink in %zu r %zu n %zu: bits differ from the twin", c->name, in, r,
                     n);
        /* x quantized once (kern_lora_i8_quant_x, as matmul_group_lora does per job), then the
         * shrink on the codes: the same codes, sums and scales as the twin's, the same bits */
        {
            kern_lora_quant_x_fn *quant = c->isa == KERN_ISA_AVX2 ? kern_lora_i8_quant_x_avx2
                                                                  : kern_lora_i8_quant_x_avx512;
            kern_lora_shrink_i8q_fn *shrinkq = c->isa == KERN_ISA_AVX2
                                                   ? kern_lora_shrink_i8q_avx2
                                                   : kern_lora_shrink_i8q_avx512;
            const size_t ldx = KERN_LORA_I8_LDX(in);
            int8_t *qr = malloc(n * ldx), *qs = malloc(n * ldx);
            float xr[16], xq[16];
            int32_t sr[16], sq[16];
            assert_true(n <= 16);
            memset(qs, 0x55, n * ldx); /* the padding must be written */
            kern_lora_i8_quant_x_ref(x, in, n, qr, xr, sr);
            quant(x, in, n, qs, xq, sq);
            if (memcmp(qr, qs, n * ldx) != 0)
                fail_msg("%s quant_x in %zu n %zu: codes differ from the twin", c->name, in, n);
            assert_memory_equal(xr, xq, n * 4);
            assert_memory_equal(sr, sq, n * 4);
            /* a NaN in the last element (the end of a SIMD max chain) and one in the first:
             * skipped by the scale's max in both, as the twin's comparison skips it (the NaN's
             * own code is not compared: its float-to-int conversion is undefined in C) */
            {
                float *xn = malloc(n * in * 4);
                memcpy(xn, x, n * in * 4);
                xn[in - 1] = NAN;
                xn[(n - 1) * in] = NAN;
                float xrn[16], xqn[16];
                int32_t srn[16], sqn[16];
                int8_t *qrn = malloc(n * ldx), *qsn = malloc(n * ldx);
                kern_lora_i8_quant_x_ref(xn, in, n, qrn, xrn, srn);
                quant(xn, in, n, qsn, xqn, sqn);
                for (size_t i = 0; i < n; i++)
                    if (memcmp(&xrn[i], &xqn[i], 4) != 0)
                        fail_msg("%s quant_x in %zu n %zu token %zu with a NaN: scale %.9g, the "
                                 "twin's %.9g", c->name, in, n, i, (double)xqn[i], (double)xrn[i]);
                for (size_t i = 0; i < n; i++)
                    for (size_t e = 0; e < in; e++)
                        if (!isnan(xn[i * in + e]) && qrn[i * ldx + e] != qsn[i * ldx + e])
                            fail_msg("%s quant_x in %zu with a NaN: code [%zu][%zu] differs",
                                     c->name, in, i, e);
                free(qrn);
                free(qsn);
                free(xn);
            }
            memset(t2, 0xff, n * r * 4);
            kern_lora_shrink_i8q_ref(p.a, in, r, qr, xr, sr, n, t2, 0, r);
            assert_memory_equal(t, t2, n * r * 4);
            memset(t2, 0xff, n * r * 4);
            shrinkq(p.a, in, r, qs, xq, sq, n, t2, r / 2, r);
            shrinkq(p.a, in, r, qs, xq, sq, n, t2, 0, r / 2);
            if (memcmp(t, t2, n * r * 4) != 0)
                fail_msg("%s shrink_i8q in %zu r %zu n %zu: bits differ from the twin", c->name,
                         in, r, n);
            free(qr);
            free(qs);
        }
        memcpy(y, y0, n * ldy * 4);
        memcpy(y2, y0, n * ldy * 4);
        kern_lora_expand_i8_ref(p.bt, r, t, n, sc, 0.0f, y, ldy, j0, j1);
        expand(p.bt, r, t, n, sc, 0.0f, y2, ldy, j0, j1);
        for (size_t i = 0; i < n * ldy; i++) {
            size_t row = i / ldy, j = i % ldy;
            if (y[i] != y2[i])
                fail_msg("%s expand out %zu r %zu: y[%zu][%zu] %.9g, twin %.9g", c->name, out,
                         r, row, j, (double)y2[i], (double)y[i]);
            if ((j < j0 || j >= j1 || sc[row] == 0.0f) && y2[i] != y0[i])
                fail_msg("%s expand wrote y[%zu][%zu] outside its range", c->name, row, j);
        }
        /* u quantized once (kern_lora_i8_quant_u, as matmul_group_lora does per product), then
         * the expand on the codes, its columns in two calls (two tiles): the twin's bits */
        {
            kern_lora_quant_u_fn *quant = c->isa == KERN_ISA_AVX2 ? kern_lora_i8_quant_u_ref
                                                                  : kern_lora_i8_quant_u_avx512;
            kern_lora_expand_i8q_fn *expandq = c->isa == KERN_ISA_AVX2
                                                   ? kern_lora_expand_i8q_avx2
                                                   : kern_lora_expand_i8q_avx512;
            const size_t ldu = KERN_LORA_I8_LDU(r), jm = j0 + (j1 - j0) / 2 / 32 * 32;
            int8_t *qr = aligned_alloc(64, (n * ldu + 63) / 64 * 64);
            int8_t *qs = aligned_alloc(64, (n * ldu + 63) / 64 * 64);
            float ur[16], uq[16];
            int32_t sr[16], sq[16];
            assert_true(n <= 16 && qr && qs);
            memset(qs, 0x55, n * ldu); /* the padding must be written */
            kern_lora_i8_quant_u_ref(p.bt, r, t, n, qr, ur, sr);
            quant(p.bt, r, t, n, qs, uq, sq);
            if (memcmp(qr, qs, n * ldu) != 0)
                fail_msg("%s quant_u r %zu n %zu: codes differ from the twin", c->name, r, n);
            assert_memory_equal(ur, uq, n * 4);
            assert_memory_equal(sr, sq, n * 4);
            float *y3 = malloc(n * ldy * 4);
            memcpy(y3, y0, n * ldy * 4);
            kern_lora_expand_i8q_ref(p.bt, r, qr, ur, sr, n, sc, 0.0f, y3, ldy, j0, jm);
            kern_lora_expand_i8q_ref(p.bt, r, qr, ur, sr, n, sc, 0.0f, y3, ldy, jm, j1);
            assert_memory_equal(y, y3, n * ldy * 4);
            memcpy(y3, y0, n * ldy * 4);
            expandq(p.bt, r, qs, uq, sq, n, sc, 0.0f, y3, ldy, j0, jm);
            expandq(p.bt, r, qs, uq, sq, n, sc, 0.0f, y3, ldy, jm, j1);
            if (memcmp(y, y3, n * ldy * 4) != 0)
                fail_msg("%s expand_i8q out %zu r %zu n %zu: bits differ from the twin",
                         c->name, out, r, n);
            /* and through the dispatching entries (the active ISA's variant) */
            memcpy(y3, y0, n * ldy * 4);
            kern_lora_i8_quant_u(p.bt, r, t, n, qs, uq, sq);
            kern_lora_expand_i8q(p.bt, r, qs, uq, sq, n, sc, 0.0f, y3, ldy, j0, j1);
            assert_memory_equal(y, y3, n * ldy * 4);
            free(y3);
            free(qr);
            free(qs);
        }
        /* batched = alone: the last token by itself */
        size_t l = n - 1;
        shrink(p.a, in, r, x + l * in, 1, t1, 0, r);
        assert_memory_equal(t1, t + l * r, r * 4);
        memcpy(y1, y0 + l * ldy, ldy * 4);
        expand(p.bt, r, t + l * r, 1, sc + l, 0.0f, y1, ldy, j0, j1);
        assert_memory_equal(y1, y2 + l * ldy, ldy * 4);
        unpack_free(&p);
        free(a); free(b); free(x); free(t); free(t2); free(t1);
        free(y0); free(y); free(y2); free(y1); free(sc);
    }
}

/*
 * The stated bound (docs/LORA.md "8-bit adapter weights"). With sx, sa_k, su, sb_k the four
 * quantization steps (x per token, A per rank row, u = t * sb per token, B^T per rank row),
 * hats the quantized values and t the f32 shrink:
 *   |t^_k - t_k| <= E_k = sum_c (|x_c| sa_k + |a^_kc| sx) / 2
 *   |y^_j - y_j| <= |s| sum_k (|t_k| sb_k / 2 + |b^_kj| (E_k + su / (2 sb_k)))
 * plus f32 rounding (1e-5 of the terms' magnitude). bound_prep fills, for one token, E_k and
 * sb_k; bound_i8 gives output j's bound and *mag the terms' magnitude.
 */
static void bound_prep(const float *x, const float *a, const float *b, size_t in, size_t out,
                       size_t r, double *e, double *sbk)
{
    double sx = 0;
    for (size_t c = 0; c < in; c++)
        sx = fmax(sx, fabs(x[c]));
    sx /= 127.0;
    for (size_t k = 0; k < r; k++) {
        double sa = 0, sb = 0, ek = 0;
        for (size_t c = 0; c < in; c++)
            sa = fmax(sa, fabs(a[k * in + c]));
        sa /= 127.0;
        for (size_t o = 0; o < out; o++)
            sb = fmax(sb, fabs(b[o * r + k]));
        sbk[k] = sb / 127.0;
        for (size_t c = 0; c < in; c++) {
            double ah = sa > 0 ? sa * nearbyint(a[k * in + c] / sa) : 0;
            ek += (fabs(x[c]) * sa + fabs(ah) * sx) / 2;
        }
        e[k] = ek;
    }
}

static double bound_i8(const float *b, size_t r, size_t j, const double *tf, const double *e,
                       const double *sbk, double su, float s, double *mag)
{
    double acc = 0, m = 0;
    for (size_t k = 0; k < r; k++) {
        double sb = sbk[k];
        double bh = sb > 0 ? sb * nearbyint(b[j * r + k] / sb) : 0;
        acc += fabs(tf[k]) * sb / 2 + fabs(bh) * (e[k] + (sb > 0 ? su / (2 * sb) : 0));
        m += fabs(tf[k] * b[j * r + k]);
    }
    *mag = fabs(s) * m;
    return fabs(s) * acc + 1e-5 * *mag + 1e-30;
}

/* One product's int8 update against the f32 one: the elementwise bound always; the relative
 * RMS error (returned) on Gaussian-like data. */
static double check_bound(size_t in, size_t out, size_t r, int outlier)
{
    const size_t n = 2;
    float *a = malloc(r * in * 4), *b = malloc(out * r * 4), *x = malloc(n * in * 4);
    float *t = malloc(n * r * 4), *y = calloc(n * out, 4), sc[2] = {2.0f, -0.5f};
    double *tf = malloc(r * sizeof *tf), *ebd = malloc(r * sizeof *ebd);
    double *sbk = malloc(r * sizeof *sbk);
    for (size_t i = 0; i < r * in; i++)
        a[i] = grand() / sqrtf((float)in);
    for (size_t i = 0; i < out * r; i++)
        b[i] = grand() * 0.02f;
    for (size_t i = 0; i < n * in; i++)
        x[i] = grand();
    if (outlier) /* one activation channel far above the rest, as in real LLMs */
        for (size_t i = 0; i < n; i++)
            x[i * in + in / 3] = 40.0f;
    struct packed p = pack(a, b, in, out, r);
    kern_lora_shrink_i8(p.a, in, r, x, n, t, 0, r);
    kern_lora_expand_i8(p.bt, r, t, n, sc, 0.0f, y, out, 0, out);
    double se = 0, sd = 0, worst = 0;
    for (size_t i = 0; i < n; i++) {
        const float *xi = x + i * in;
        double umax = 0;
        for (size_t k = 0; k < r; k++) {
            double acc = 0, sb = 0;
            for (size_t c = 0; c < in; c++)
                acc += (double)xi[c] * a[k * in + c];
            tf[k] = acc;
            for (size_t o = 0; o < out; o++)
                sb = fmax(sb, fabs(b[o * r + k]));
            umax = fmax(umax, fabs((double)t[i * r + k] * (float)(sb / 127.0)));
        }
        double su = umax / 127.0;
        bound_prep(xi, a, b, in, out, r, ebd, sbk);
        for (size_t j = 0; j < out; j++) {
            double want = 0, mag;
            for (size_t k = 0; k < r; k++)
                want += tf[k] * b[j * r + k];
            want *= sc[i];
            double bd = bound_i8(b, r, j, tf, ebd, sbk, su, sc[i], &mag);
            double e = fabs(y[i * out + j] - want);
            if (e > bd)
                fail_msg("in %zu out %zu r %zu: y[%zu][%zu] %.9g, f32 %.9g: error %.3g over "
                         "the bound %.3g",
                         in, out, r, i, j, (double)y[i * out + j], want, e, bd);
            worst = fmax(worst, e / bd);
            se += e * e;
            sd += want * want;
        }
    }
    unpack_free(&p);
    free(a); free(b); free(x); free(t); free(y); free(tf); free(ebd); free(sbk);
    double rel = sqrt(se / sd);
    print_message("  int8 in %zu out %zu r %zu%s: relative RMS error %.2f%%, worst error / "
                  "bound %.2f\n",
                  in, out, r, outlier ? " (outlier channel)" : "", 100 * rel, worst);
    return rel;
}

/* The bound holds on every ISA (the SIMD variants give the twin's bits, test_i8_kernels). */
static void test_i8_bound(void **state)
{
    (void)isa_case_begin(state);
    const size_t shapes[][3] = {{2048, 2048, 16}, {2048, 256, 8}, {5632, 2048, 32},
                                {2048, 5632, 1}, {100, 33, 5}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        double rel = check_bound(shapes[s][0], shapes[s][1], shapes[s][2], 0);
        if (rel > 0.03)
            fail_msg("relative RMS error %.2f%% above the stated 3%%", 100 * rel);
    }
    /* an outlier channel coarsens x's step: only the elementwise bound is promised */
    (void)check_bound(2048, 2048, 16, 1);
}

static char *tmpdir_;

static char *subdir(const char *name)
{
    char *d = malloc(strlen(tmpdir_) + strlen(name) + 2);
    sprintf(d, "%s/%s", tmpdir_, name);
    mkdir(d, 0700);
    return d;
}

/* lora_repack(LORA_PACK_INT8) on the serving path: within the bound of the f32 update (the
 * small model's adapted projections, every target), new digest; "int8" parses; the
 * registry packs int8; too wide a projection is refused. */
static void test_i8_repack(void **state)
{
    (void)state;
    assert_int_equal(kern_init(), 0);
    struct iebin_hparams hp = peft_small_hparams();
    struct peft_adapter *pa = peft_adapter_random(&hp, 4, 8.0, (1u << LORA_TARGET_COUNT) - 1,
                                                  7, 0.3f, 0.3f);
    char *d = subdir("i8");
    peft_adapter_write(pa, d, SAFETENSORS_F32, "");
    peft_adapter_free(pa);
    struct lora_adapter *a32, *a8;
    assert_int_equal(lora_open(d, &hp, &a32), 0);
    assert_int_equal(lora_open(d, &hp, &a8), 0);
    uint64_t dg = a8->digest;
    assert_int_equal(lora_repack(a8, LORA_PACK_INT8), 0);
    assert_int_equal(a8->fast_dt, LORA_DT_I8);
    assert_true(a8->digest != dg && a8->digest != 0);
    assert_true(a8->fast_bytes > 0);

    enum { N = 3 };
    const struct lora_adapter *w32[N] = {a32, a32, a32}, *w8[N] = {a8, a8, a8};
    float scale[N] = {1.0f, 0.5f, 2.0f};
    struct lora_plan p32, p8;
    lora_plan_init(&p32);
    lora_plan_init(&p8);
    assert_int_equal(lora_plan_build(&p32, w32, scale, N), 0);
    assert_int_equal(lora_plan_build(&p8, w8, scale, N), 0);
    float *tmp = malloc((p32.tmp_floats + p8.tmp_floats) * 4);
    for (uint32_t layer = 0; layer < hp.n_layers; layer++)
        for (int tg = 0; tg < LORA_TARGET_COUNT; tg++) {
            uint32_t in, out;
            lora_target_dims(&hp, (enum lora_target)tg, &in, &out);
            float *x = malloc((size_t)N * in * 4), *y32 = calloc((size_t)N * out, 4);
            float *y8 = calloc((size_t)N * out, 4);
            for (size_t i = 0; i < (size_t)N * in; i++)
                x[i] = grand();
            struct lora_proj pr32 = {(enum lora_target)tg, x, y32, out};
            struct lora_proj pr8 = {(enum lora_target)tg, x, y8, out};
            lora_apply_fused(&p32, NULL, layer, &pr32, 1, tmp);
            lora_apply_fused(&p8, NULL, layer, &pr8, 1, tmp);
            const struct lora_weights *w = lora_weights(a32, layer, (enum lora_target)tg);
            size_t r = a32->cfg.rank;
            double *tf = malloc(r * sizeof *tf), *ebd = malloc(r * sizeof *ebd);
            double *sbk = malloc(r * sizeof *sbk);
            float *t8 = malloc(r * 4);
            for (int i = 0; i < N; i++) {
                const float *xi = x + (size_t)i * in;
                kern_lora_shrink_i8(lora_weights(a8, layer, (enum lora_target)tg)->fa, in, r,
                                    xi, 1, t8, 0, r);
                double umax = 0;
                for (size_t k = 0; k < r; k++) {
                    double acc = 0, sb = 0;
                    for (uint32_t c = 0; c < in; c++)
                        acc += (double)xi[c] * w->a[k * in + c];
                    tf[k] = acc;
                    for (uint32_t o = 0; o < out; o++)
                        sb = fmax(sb, fabs(w->b[o * r + k]));
                    umax = fmax(umax, fabs((double)t8[k] * (float)(sb / 127.0)));
                }
                bound_prep(xi, w->a, w->b, in, out, r, ebd, sbk);
                for (uint32_t j = 0; j < out; j++) {
                    double mag, s = scale[i] * a32->cfg.scaling;
                    double bd =
                        bound_i8(w->b, r, j, tf, ebd, sbk, umax / 127.0, (float)s, &mag);
                    /* the f32 path's own rounding too */
                    double e = fabs(y8[(size_t)i * out + j] - y32[(size_t)i * out + j]);
                    if (e > bd + 1e-5 * mag)
                        fail_msg("layer %u %s y[%d][%u]: int8 %g, f32 %g (bound %g)", layer,
                                 lora_target_name((enum lora_target)tg), i, j,
                                 (double)y8[(size_t)i * out + j],
                                 (double)y32[(size_t)i * out + j], bd);
                }
            }
            free(tf); free(ebd); free(sbk); free(t8); free(x); free(y32); free(y8);
        }
    lora_plan_fini(&p32);
    lora_plan_fini(&p8);
    free(tmp);
    lora_close(a32);
    lora_close(a8);

    enum lora_pack pk;
    assert_int_equal(lora_pack_parse("int8", &pk), 0);
    assert_int_equal(pk, LORA_PACK_INT8);
    log_clear_error();
    assert_int_equal(lora_pack_parse("int4", &pk), ERR_FORMAT);
    assert_non_null(strstr(log_last_error(), "'int4'"));
    assert_non_null(strstr(log_last_error(), "int8"));

    struct lora_registry *reg;
    assert_int_equal(lora_registry_create(&hp, 0, &reg), 0);
    lora_registry_set_pack(reg, LORA_PACK_INT8);
    assert_int_equal(lora_registry_load(reg, "r", d), 0);
    assert_int_equal(lora_registry_at(reg, 0)->fast_dt, LORA_DT_I8);
    lora_registry_destroy(reg);
    free(d);

    /* down_proj reading more than KERN_LORA_I8_IN_MAX inputs: refused, naming it; the
     * adapter keeps its exact copy */
    struct iebin_hparams wide = peft_small_hparams();
    wide.n_layers = 1;
    wide.ffn_dim = KERN_LORA_I8_IN_MAX + 8;
    pa = peft_adapter_random(&wide, 2, 1.0, 1u << LORA_DOWN, 9, 0.3f, 0.3f);
    d = subdir("i8wide");
    peft_adapter_write(pa, d, SAFETENSORS_F32, "");
    peft_adapter_free(pa);
    struct lora_adapter *aw;
    assert_int_equal(lora_open(d, &wide, &aw), 0);
    log_clear_error();
    assert_int_equal(lora_repack(aw, LORA_PACK_INT8), ERR_RANGE);
    assert_non_null(strstr(log_last_error(), "down_proj"));
    assert_int_equal(aw->fast_dt, DT_F32);
    lora_close(aw);
    free(d);

    /* rank 1 (below LORA_I8_MIN_RANK): int8 packing serves the bf16 copy, with bf16's digest;
     * rank 2 is int8 */
    for (size_t r = 1; r <= 2; r++) {
        pa = peft_adapter_random(&hp, r, 2.0, (1u << LORA_TARGET_COUNT) - 1, 11, 0.3f, 0.3f);
        d = subdir(r == 1 ? "i8r1" : "i8r2");
        peft_adapter_write(pa, d, SAFETENSORS_F32, "");
        peft_adapter_free(pa);
        struct lora_adapter *ai, *ab;
        assert_int_equal(lora_open(d, &hp, &ai), 0);
        assert_int_equal(lora_open(d, &hp, &ab), 0);
        assert_int_equal(lora_repack(ai, LORA_PACK_INT8), 0);
        assert_int_equal(lora_repack(ab, LORA_PACK_BF16), 0);
        assert_int_equal(ai->fast_dt, r == 1 ? DT_BF16 : LORA_DT_I8);
        if (r == 1) {
            assert_true(ai->digest == ab->digest);
            assert_int_equal(ai->fast_bytes, ab->fast_bytes);
        } else {
            assert_true(ai->digest != ab->digest);
        }
        lora_close(ai);
        lora_close(ab);
        free(d);
    }
}

static int setup(void **state)
{
    (void)state;
    char tmpl[] = "/tmp/test_lora_i8.XXXXXX";
    char *d = mkdtemp(tmpl);
    if (!d)
        return -1;
    tmpdir_ = strdup(d);
    return kern_init();
}

static int teardown(void **state)
{
    (void)state;
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir_);
    int rc = system(cmd);
    free(tmpdir_);
    return rc == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        ISA_CASE_SIMD(test_i8_kernels),
        ISA_CASE_TESTS(test_i8_bound),
        cmocka_unit_test(test_i8_repack),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
