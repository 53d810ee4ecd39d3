/*
 * test_kern.c — every kernel variant against its scalar twin, and the whole kern_matmul path of
 * every ISA against the f32 reference, on random shapes with ragged tails.
 *
 * Tolerances are relative to S = sum |w*x| of each output (the scale float rounding errors
 * grow with), except where quantization adds a known error:
 *  - variant vs its _ref twin (same quantized/bf16 activations, same integer products; only
 *    the order of f32 additions differs): |y - y_twin| <= 1e-5 * S.
 *  - f32/f16 weights, bf16 weights in the gemv (exact widening): |y - y_f32| <= 1e-5 * S.
 *  - bf16 weights with bf16 activations (vdpbf16ps): each activation is rounded to bf16, a
 *    relative error <= 2^-8 (8-bit significand), so |y - y_f32| <= 2^-8 * S + 1e-5 * S.
 *  - q8_0/q4_0 weights with int8 activations: per block b the activation error is <= d_b/2
 *    (d_b = max|x_b|/127, kernels/include/quant.h), so
 *    |y - y_f32| <= sum_b d_b/2 * sum_b |w| + 1e-5*S.
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

/* ---- deterministic random data ----------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rnd(void)
{
    rng_xorshift64(&rng_state);
    return (uint32_t)(rng_state >> 16);
}

static float rndf(void) { return (float)rnd() / 4294967296.0f * 2.0f - 1.0f; } /* [-1, 1) */

static size_t rndz(size_t lo, size_t hi) { return lo + rnd() % (hi - lo + 1); }

/* A random [rows][cols] weight matrix of type wt. Quants cover their whole range (q8_0 -128
 * included); scales vary over two decades. */
static void *make_weights(enum dtype wt, size_t rows, size_t cols)
{
    uint64_t rb;
    assert_int_equal(dtype_row_bytes(wt, cols, &rb), 0);
    uint8_t *w = malloc(rows * rb + 1);
    assert_non_null(w);
    for (size_t r = 0; r < rows; r++) {
        uint8_t *row = w + r * rb;
        for (size_t c = 0; c < cols; c++) {
            float v = rndf();
            switch (wt) {
            case DT_F32:
                memcpy(row + c * 4, &v, 4);
                break;
            case DT_F16: {
                uint16_t h = half_f32_to_f16(v);
                memcpy(row + c * 2, &h, 2);
                break;
            }
            case DT_BF16: {
                uint16_t h = half_f32_to_bf16(v);
                memcpy(row + c * 2, &h, 2);
                break;
            }
            default:
                break;
            }
        }
        if (wt == DT_Q8_0 || wt == DT_Q4_0) {
            size_t bb = dtype_info(wt)->block_bytes;
            for (size_t b = 0; b < cols / 32; b++) {
                uint8_t *blk = row + b * bb;
                uint16_t d = half_f32_to_f16(0.001f + 0.1f * (float)(rnd() % 1000) / 1000.0f);
                memcpy(blk, &d, 2);
                for (size_t i = 2; i < bb; i++)
                    blk[i] = (uint8_t)rnd();
            }
        }
    }
    return w;
}

static float *make_x(size_t n, size_t cols)
{
    float *x = malloc(n * cols * sizeof(float) + 4);
    assert_non_null(x);
    for (size_t i = 0; i < n * cols; i++)
        x[i] = rndf() * (rnd() % 4 == 0 ? 8.0f : 1.0f);
    /* one all-zero block per token where there is room: a zero activation scale */
    if (cols >= 64)
        for (size_t t = 0; t < n; t++)
            memset(x + t * cols + 32, 0, 32 * sizeof(float));
    return x;
}

/* Dequantized weights [rows][cols] (exact conversions). */
static float *deq(enum dtype wt, const void *w, size_t rows, size_t cols)
{
    uint64_t rb;
    assert_int_equal(dtype_row_bytes(wt, cols, &rb), 0);
    float *f = malloc(rows * cols * sizeof(float));
    assert_non_null(f);
    for (size_t r = 0; r < rows; r++)
        kern_row_to_f32(wt, (const uint8_t *)w + r * rb, f + r * cols, cols);
    return f;
}

/* ---- the variants ------------------------------------------------------------------------ */

struct variant {
    const char *name;
    enum dtype wt;
    enum kern_isa isa;
    kern_mm_fn *fn, *twin;
    int bf16_act; /* needs AVX512-BF16 and is checked with the bf16 activation bound */
};

#define V_(op, wty, aty, isa, DT, ISA, BF)                                                   \
    {"kern_" #op "_" #wty "_" #aty "_" #isa, DT, ISA, kern_##op##_##wty##_##aty##_##isa,     \
     kern_##op##_##wty##_##aty##_ref, BF},
#define VS_(isa, ISA)                                                                        \
    V_(gemv, f32, f32, isa, DT_F32, ISA, 0) V_(gemm, f32, f32, isa, DT_F32, ISA, 0)          \
    V_(gemv, f16, f32, isa, DT_F16, ISA, 0) V_(gemm, f16, f32, isa, DT_F16, ISA, 0)          \
    V_(gemv, bf16, f32, isa, DT_BF16, ISA, 0) V_(gemm, bf16, f32, isa, DT_BF16, ISA, 0)      \
    V_(gemv, q8_0, q8_0, isa, DT_Q8_0, ISA, 0) V_(gemm, q8_0, q8_0, isa, DT_Q8_0, ISA, 0)    \
    V_(gemv, q4_0, q8_0, isa, DT_Q4_0, ISA, 0) V_(gemm, q4_0, q8_0, isa, DT_Q4_0, ISA, 0)

static const struct variant variants[] = {
    VS_(avx2, KERN_ISA_AVX2) VS_(avx512, KERN_ISA_AVX512)
    V_(gemv, bf16, bf16, avx512, DT_BF16, KERN_ISA_AVX512, 1)
    V_(gemm, bf16, bf16, avx512, DT_BF16, KERN_ISA_AVX512, 1)
};

/* The ISA the running test checks (isa_case.h): its variants and its entries. */
static const struct isa_case *g_case;

/*
 * The AMX-INT8 panel tiles (panel_kind entries with amx set: x86/amx_q*.c) have their own test
 * entries (test_q8p_every_n/amxint8, test_q4p_every_n/amxint8): on a CPU or OS without AMX
 * those skip, counted and printed by the runner, instead of the avx512 entries passing without
 * having checked them. The AVX-512 ISA with the AMX requirement of isa_case_amxbf16 (the tiles
 * are enabled together, kern_has_amx_bf16); bf16 = 0, so run_case checks the int8 panels.
 */
static const struct isa_case isa_case_amxint8 = {"amxint8", KERN_ISA_AVX512, 0, 1};

/* The running test's variants: its ISA's, the bf16-activation ones in the avx512bf16 test. */
static int in_case(const struct variant *v)
{
    return v->isa == g_case->isa && v->bf16_act == g_case->bf16;
}

static const size_t ns[] = {1, 2, 3, 5, 8, 17};

/* Column counts: ragged for plain types; for block types odd block counts and > one KC. */
static size_t pick_cols(enum dtype wt, int i)
{
    static const size_t plain[] = {1, 7, 15, 16, 17, 31, 33, 47, 64, 65, 100, 257, 1000, 1030};
    static const size_t blocks[] = {1, 2, 3, 5, 7, 8, 31, 33, 34, 65};
    if (wt == DT_Q8_0 || wt == DT_Q4_0)
        return 32 * blocks[(size_t)i % (sizeof blocks / sizeof blocks[0])];
    return plain[(size_t)i % (sizeof plain / sizeof plain[0])];
}

#define SENTINEL 12345.0f

/*
 * Runs fn for rows [r0, r1) of a rows x cols product with n tokens into y [n][ldy] (ldy > rows)
 * and checks against want within tol[t*ldy + r]; entries outside [r0, r1) must be untouched.
 */
static void check_close(const char *what, const float *y, const float *want, const float *tol,
                        size_t n, size_t ldy, size_t r0, size_t r1, size_t cols)
{
    for (size_t t = 0; t < n; t++)
        for (size_t r = 0; r < ldy; r++) {
            size_t i = t * ldy + r;
            if (r < r0 || r >= r1) {
                if (y[i] != SENTINEL)
                    fail_msg("%s: cols %zu n %zu rows [%zu,%zu): y[%zu][%zu] outside the range "
                             "was written",
                             what, cols, n, r0, r1, t, r);
                continue;
            }
            if (!(fabsf(y[i] - want[i]) <= tol[i]))
                fail_msg("%s: cols %zu n %zu rows [%zu,%zu): y[%zu][%zu] = %.9g, want %.9g "
                         "(tolerance %.3g)",
                         what, cols, n, r0, r1, t, r, y[i], want[i], tol[i]);
        }
}

static float *filled(size_t count)
{
    float *p = malloc(count * sizeof(float));
    assert_non_null(p);
    for (size_t i = 0; i < count; i++)
        p[i] = SENTINEL;
    return p;
}

/*
 * q4_0 and q8_0 panels (kern_panels_*): the repacked matrix gives back the stored rows byte
 * for byte; every ISA packs the same bytes, rows past the matrix are zero; each panel variant
 * equals its ISA's stored-row GEMM bit for bit (kern.h: same arithmetic); the entries
 * (kern_matmul_panels, kern_matmul_act_panels), every ISA, are within the stored-row bounds of
 * the f32 specification. Row ranges start on a panel. s, qb: [n][ldy] as
 * in run_case.
 */
struct panel_kind {
    enum dtype wt;
    size_t blk, qbytes_per_row; /* stored block bytes; quant bytes of one row in a panel block */
    size_t (*qoff)(size_t b, size_t nb), (*soff)(size_t b, size_t nb);
    struct {
        const char *name;
        enum kern_isa isa;
        kern_mm_fn *fn, *rows_fn;
        int amx; /* runs only where kern_has_amx_bf16() (the AMX-INT8 tiles, x86/amx_q*.c) */
        int gfni; /* runs only where kern_has_gfni() (the forced GFNI path, x86/avx512_q.c) */
    } pv[6];
};

static const struct panel_kind q4p_kind = {
    DT_Q4_0, 18, 16, quant_q4p_qoff, quant_q4p_soff,
    {{"kern_gemm_q4_0p_q8_0_ref", KERN_ISA_REF, kern_gemm_q4_0p_q8_0_ref,
      kern_gemm_q4_0_q8_0_ref, 0, 0},
     {"kern_gemm_q4_0p_q8_0_avx2", KERN_ISA_AVX2, kern_gemm_q4_0p_q8_0_avx2,
      kern_gemm_q4_0_q8_0_avx2, 0, 0},
     {"kern_gemm_q4_0p_q8_0_avx512", KERN_ISA_AVX512, kern_gemm_q4_0p_q8_0_avx512,
      kern_gemm_q4_0_q8_0_avx512, 0, 0},
     {"kern_gemm_q4_0p_q8_0_avx512gfni", KERN_ISA_AVX512, kern_gemm_q4_0p_q8_0_avx512gfni,
      kern_gemm_q4_0_q8_0_avx512, 0, 1},
     {"kern_gemm_q4_0p_q8_0_amx", KERN_ISA_AVX512, kern_gemm_q4_0p_q8_0_amx,
      kern_gemm_q4_0_q8_0_avx512, 1, 0},
     {"kern_gemm_q4_0p_q8_0_amxs", KERN_ISA_AVX512, kern_gemm_q4_0p_q8_0_amxs,
      kern_gemm_q4_0_q8_0_avx512, 1, 0}}};

static const struct panel_kind q8p_kind = {
    DT_Q8_0, 34, 32, quant_q8p_qoff, quant_q8p_soff,
    {{"kern_gemm_q8_0p_q8_0_ref", KERN_ISA_REF, kern_gemm_q8_0p_q8_0_ref,
      kern_gemm_q8_0_q8_0_ref, 0, 0},
     {"kern_gemm_q8_0p_q8_0_avx2", KERN_ISA_AVX2, kern_gemm_q8_0p_q8_0_avx2,
      kern_gemm_q8_0_q8_0_avx2, 0, 0},
     {"kern_gemm_q8_0p_q8_0_avx512", KERN_ISA_AVX512, kern_gemm_q8_0p_q8_0_avx512,
      kern_gemm_q8_0_q8_0_avx512, 0, 0},
     {"kern_gemm_q8_0p_q8_0_amx", KERN_ISA_AVX512, kern_gemm_q8_0p_q8_0_amx,
      kern_gemm_q8_0_q8_0_avx512, 1, 0}}};

static void check_panels(const struct panel_kind *k, const void *w, size_t rows, size_t cols,
                         const float *x, size_t n, const struct kern_act *a, size_t ldy,
                         size_t r1, const float *s, const float *qb)
{
    size_t r0 = (rows > 16 && rnd() % 2) ? 16 : 0;
    if (r0 >= r1)
        r0 = 0;
    size_t bytes = kern_panels_bytes(k->wt, rows, cols), rb = cols / 32 * k->blk;
    assert_int_equal(bytes, (rows + 15) / 16 * 16 * rb);
    uint8_t *wp = aligned_alloc(64, (bytes + 63) / 64 * 64), *back = malloc(rows * rb);
    assert_non_null(wp);
    assert_non_null(back);
    memset(wp, 0xa5, bytes); /* rows past the matrix must be written (as zeros) */
    size_t np = (rows + 15) / 16;
    kern_panels_pack(k->wt, w, cols, wp, rows, 0, np / 2); /* in two ranges, as threads may */
    kern_panels_pack(k->wt, w, cols, wp, rows, np / 2, np);
    kern_panels_rows(k->wt, wp, cols, 0, rows, back);
    assert_memory_equal(back, w, rows * rb);
    if (rows > 1) { /* a range that starts inside a panel */
        kern_panels_rows(k->wt, wp, cols, 1, rows, back);
        assert_memory_equal(back, (const uint8_t *)w + rb, (rows - 1) * rb);
    }
    /* every ISA packs the same bytes as the scalar code (AVX-512 has its own packing) */
    {
        uint8_t *w2 = malloc(bytes);
        assert_non_null(w2);
        memset(w2, 0x5a, bytes);
        assert_int_equal(kern_force_isa(KERN_ISA_REF), 0);
        kern_panels_pack(k->wt, w, cols, w2, rows, 0, np);
        assert_int_equal(kern_force_isa(g_case->isa), 0);
        assert_memory_equal(w2, wp, bytes);
        free(w2);
    }
    if (rows % 16)
        for (size_t b = 0; b < cols / 32; b++)
            for (size_t i = rows % 16; i < 16; i++) {
                const uint8_t *pp = wp + (np - 1) * 16 * rb;
                for (size_t g = 0; g < k->qbytes_per_row / 4; g++)
                    for (size_t j = 0; j < 4; j++)
                        assert_int_equal(pp[k->qoff(b, cols / 32) + g * 64 + i * 4 + j], 0);
                assert_int_equal(pp[k->soff(b, cols / 32) + i * 2], 0);
                assert_int_equal(pp[k->soff(b, cols / 32) + i * 2 + 1], 0);
            }

    float *want = filled(n * ldy), *y = filled(n * ldy), *z = filled(n * ldy);
    float *tol = filled(n * ldy);
    kern_matmul_ref(k->wt, w, cols, x, n, want, ldy, r0, r1);
    char what[160];
    /* one and two DRAM streams per thread (kern_set_panel_streams: n = 1, more than one
     * panel); two again with a side prefetch list (kern_side_prefetch, a hint: the same bits,
     * whatever it points at, here the stored rows and a range that starts mid-line) */
    for (int st = 1; st <= 3; st++) {
        kern_set_panel_streams(st == 1 ? 1 : 2);
        if (st == 3) {
            const void *at[2] = {w, (const char *)wp + 3};
            const size_t len[2] = {rb, 16 * rb - 3}; /* within w and one panel of wp */
            kern_side_prefetch(at, len, 2);
        }
        for (size_t v = 0; v < sizeof k->pv / sizeof k->pv[0]; v++) {
            /* AMX variants in the amxint8 entries only (isa_case_amxint8), the others in theirs */
            if (!k->pv[v].fn || k->pv[v].isa != g_case->isa || k->pv[v].amx != g_case->amx ||
                (k->pv[v].gfni && !kern_has_gfni()))
                continue;
            for (size_t i = 0; i < n * ldy; i++)
                y[i] = z[i] = SENTINEL;
            k->pv[v].fn(wp, a, y, ldy, r0, r1);
            k->pv[v].rows_fn(w, a, z, ldy, r0, r1);
            for (size_t i = 0; i < n * ldy; i++)
                if (memcmp(&y[i], &z[i], sizeof y[i]) != 0)
                    fail_msg("%s (%d streams): cols %zu n %zu rows [%zu,%zu): y[%zu] = %.9g, "
                             "the stored-row GEMM gives %.9g",
                             k->pv[v].name, st, cols, n, r0, r1, i, y[i], z[i]);
        }
        kern_side_prefetch(NULL, NULL, 0);
    }
    {
        const enum kern_isa isa = g_case->isa;
        for (size_t i = 0; i < n * ldy; i++) {
            y[i] = z[i] = SENTINEL;
            tol[i] = (isa != KERN_ISA_REF ? qb[i] : 0.0f) + 2e-5f * s[i] + 1e-30f;
        }
        kern_matmul_panels(k->wt, wp, cols, x, n, y, ldy, r0, r1);
        snprintf(what, sizeof what, "kern_matmul_panels(%s, %s)", dtype_info(k->wt)->name,
                 kern_isa_name((enum kern_isa)isa));
        check_close(what, y, want, tol, n, ldy, r0, r1, cols);
        kern_matmul_act_panels(k->wt, wp, a, z, ldy, r0, r1);
        snprintf(what, sizeof what, "kern_matmul_act_panels(%s, %s)", dtype_info(k->wt)->name,
                 kern_isa_name((enum kern_isa)isa));
        check_close(what, z, want, tol, n, ldy, r0, r1, cols);
    }
    free(tol);
    free(z);
    free(y);
    free(want);
    free(back);
    free(wp);
}

/* One random case of weight type wt: the variants of the test's ISA and its kern_matmul (the
 * avx512bf16 test: the bf16-activation variants only). */
static void run_case(enum dtype wt, size_t cols, size_t n)
{
    size_t rows = rndz(1, 40);
    size_t r0 = rnd() % 4 == 0 ? 0 : rndz(0, rows - 1), r1 = rndz(r0 + 1, rows);
    size_t ldy = rows + rndz(0, 5);
    void *w = make_weights(wt, rows, cols);
    float *x = make_x(n, cols);
    float *wf = deq(wt, w, rows, cols);

    size_t act_bytes;
    assert_int_equal(kern_act_bytes(wt, cols, n, &act_bytes), 0);
    void *buf = act_bytes ? aligned_alloc(64, act_bytes) : NULL;
    struct kern_act a;
    kern_act_init(&a, wt, x, cols, n, buf);
    kern_act_prepare(&a, 0, n);

    /* S = sum |w*x| and the quantization bound of each output */
    float *s = filled(n * ldy), *qb = filled(n * ldy);
    for (size_t t = 0; t < n; t++)
        for (size_t r = 0; r < rows; r++) {
            double sum = 0, qerr = 0;
            for (size_t c = 0; c < cols; c++)
                sum += fabs((double)wf[r * cols + c] * x[t * cols + c]);
            if (a.q)
                for (size_t b = 0; b < cols / 32; b++) {
                    double wabs = 0;
                    for (size_t c = b * 32; c < b * 32 + 32; c++)
                        wabs += fabs(wf[r * cols + c]);
                    qerr += a.d[t * a.cp / 32 + b] / 2 * wabs;
                }
            s[t * ldy + r] = (float)sum;
            qb[t * ldy + r] = (float)qerr;
        }

    float *want = filled(n * ldy), *twin = filled(n * ldy), *y = filled(n * ldy);
    float *tol = filled(n * ldy);
    kern_matmul_ref(wt, w, cols, x, n, want, ldy, r0, r1);

    char what[160];
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        const struct variant *vr = &variants[v];
        if (vr->wt != wt || !in_case(vr) || g_case->amx) /* amxint8: the panel tiles only */
            continue;
        for (size_t i = 0; i < n * ldy; i++) {
            twin[i] = y[i] = SENTINEL;
            tol[i] = 1e-5f * s[i] + 1e-30f;
        }
        vr->twin(w, &a, twin, ldy, r0, r1);
        vr->fn(w, &a, y, ldy, r0, r1);
        snprintf(what, sizeof what, "%s vs its twin", vr->name);
        check_close(what, y, twin, tol, n, ldy, r0, r1, cols);
        /* and the twin against the f32 specification, within the stated bound */
        for (size_t i = 0; i < n * ldy; i++)
            tol[i] = (vr->bf16_act ? 0x1p-8f * s[i] : 0.0f) + (a.q ? qb[i] : 0.0f) +
                     2e-5f * s[i] + 1e-30f;
        snprintf(what, sizeof what, "%s's twin vs kern_matmul_ref", vr->name);
        check_close(what, twin, want, tol, n, ldy, r0, r1, cols);
    }

    /* kern_matmul through the dispatcher on the test's ISA; kern_matmul_act on the prepared act */
    if (!g_case->bf16 && !g_case->amx) {
        const enum kern_isa isa = g_case->isa;
        int bf16_gemm = wt == DT_BF16 && isa == KERN_ISA_AVX512 && kern_has_avx512bf16();
        for (size_t i = 0; i < n * ldy; i++) {
            y[i] = twin[i] = SENTINEL;
            tol[i] = (bf16_gemm ? 0x1p-8f * s[i] : 0.0f) +
                     (a.q && isa != KERN_ISA_REF ? qb[i] : 0.0f) + 2e-5f * s[i] + 1e-30f;
        }
        kern_matmul(wt, w, cols, x, n, y, ldy, r0, r1);
        snprintf(what, sizeof what, "kern_matmul(%s, %s)", dtype_info(wt)->name,
                 kern_isa_name((enum kern_isa)isa));
        check_close(what, y, want, tol, n, ldy, r0, r1, cols);
        kern_matmul_act(w, &a, twin, ldy, r0, r1);
        snprintf(what, sizeof what, "kern_matmul_act(%s, %s)", dtype_info(wt)->name,
                 kern_isa_name((enum kern_isa)isa));
        check_close(what, twin, want, tol, n, ldy, r0, r1, cols);
    }
    if (wt == DT_Q4_0 && !g_case->bf16)
        check_panels(&q4p_kind, w, rows, cols, x, n, &a, ldy, r1, s, qb);
    if (wt == DT_Q8_0 && !g_case->bf16)
        check_panels(&q8p_kind, w, rows, cols, x, n, &a, ldy, r1, s, qb);

    free(tol);
    free(y);
    free(twin);
    free(want);
    free(qb);
    free(s);
    free(buf);
    free(wf);
    free(x);
    free(w);
}

static void run_type(enum dtype wt, int cases_per_n)
{
    for (size_t in = 0; in < sizeof ns / sizeof ns[0]; in++)
        for (int c = 0; c < cases_per_n; c++)
            run_case(wt, pick_cols(wt, c + (int)in * 3), ns[in]);
}

static void test_matmul_f32(void **state)
{
    g_case = isa_case_begin(state);
    run_type(DT_F32, 14);
}

static void test_matmul_f16(void **state)
{
    g_case = isa_case_begin(state);
    run_type(DT_F16, 14);
}

static void test_matmul_bf16(void **state)
{
    g_case = isa_case_begin(state);
    run_type(DT_BF16, 14);
}

static void test_matmul_q8_0(void **state)
{
    g_case = isa_case_begin(state);
    run_type(DT_Q8_0, 10);
}

static void test_matmul_q4_0(void **state)
{
    g_case = isa_case_begin(state);
    run_type(DT_Q4_0, 10);
}

/*
 * q8_0 panels at every token count 1..17 (the panel GEMM's tiles of 1..8 tokens, the split
 * accumulators at 1..2, and a second tile): ragged rows (run_case: 1..40), odd block counts
 * and more than one KC chunk; run_case checks the panels for every q8_0 case (check_panels).
 * Up to 35 for the AMX panel GEMM (x86/amx_q.c: two 16-token tiles and a ragged third, one
 * tile configuration per token count), which the amxint8 entry checks (a counted skip without
 * AMX).
 */
static void test_q8p_every_n(void **state)
{
    g_case = isa_case_begin(state);
    static const size_t cols[] = {32, 96, 1056, 2080};
    for (size_t n = 1; n <= 35; n++)
        run_case(DT_Q8_0, cols[n % 4], n);
}

/*
 * q4_0 panels at every token count 1..19 (the one-panel tiles of 1..8 tokens, the two-panel
 * wide tiles of 1..8 tokens with an odd last panel, and two and three token tiles): ragged rows,
 * odd block counts and more than one KC chunk; run_case checks that the panel GEMM's bits equal
 * the stored-row GEMM's for every case (check_panels); up to 35 for the AMX tiles as above
 * (the amxint8 entry).
 */
static void test_q4p_every_n(void **state)
{
    g_case = isa_case_begin(state);
    static const size_t cols[] = {32, 96, 1056, 2080};
    for (size_t n = 1; n <= 35; n++)
        run_case(DT_Q4_0, cols[n % 4], n);
}

/*
 * The q4_0 panel product's GFNI path (x86/avx512_q.c hi_nibbles_gfni, 1..8 tokens on two
 * streams) forced, beside the plain one, against the stored-row GEMM bit for bit (check_panels'
 * avx512gfni entry), on the decode shapes' column counts. Where the CPU has no GFNI this skips,
 * counted; the test_q4p_every_n entries check the path kern__gfni picks (GFNI where present;
 * plain in test_kern_nogfni, CLOCHER_GFNI=0).
 */
static void test_q4p_gfni(void **state)
{
    g_case = isa_case_begin(state);
    if (!kern_has_gfni())
        skip();
    static const size_t cols[] = {64, 1056, 2048};
    for (size_t n = 1; n <= 9; n++)
        run_case(DT_Q4_0, cols[n % 3], n);
}

/* Larger shapes: full 16-row panels, several KC chunks, many tokens. */
static void test_matmul_large(void **state)
{
    g_case = isa_case_begin(state);
    run_case(DT_Q4_0, 2048 + 96, 33);
    run_case(DT_Q8_0, 3072, 24);
    run_case(DT_BF16, 2050, 19);
    run_case(DT_F16, 1500, 9);
}

/* bf16 decode (n = 1) has its own AVX-512 loop for cols % 64 == 0 up to 8192 (the model's
 * 2048 and 5632 among them); the larger ones and 8256 take the general tile path. */
static void test_matmul_bf16_decode(void **state)
{
    g_case = isa_case_begin(state);
    static const size_t colss[] = {64, 128, 2048, 5632, 8192, 8256};
    for (size_t i = 0; i < sizeof colss / sizeof colss[0]; i++)
        for (int rep = 0; rep < 3; rep++)
            run_case(DT_BF16, colss[i], 1);
}

/* ---- conversions and activation preparation ---------------------------------------------- */

static void test_row_to_f32(void **state)
{
    (void)state;
    uint16_t *h = malloc(65536 * 2);
    float *f = malloc(65536 * sizeof(float));
    for (uint32_t i = 0; i < 65536; i++)
        h[i] = (uint16_t)i;
    kern_row_to_f32(DT_F16, h, f, 65536);
    for (uint32_t i = 0; i < 65536; i++) {
        float want = half_f16_to_f32((uint16_t)i);
        assert_memory_equal(&f[i], &want, 4);
    }
    kern_row_to_f32(DT_BF16, h, f, 65536);
    for (uint32_t i = 0; i < 65536; i++) {
        float want = half_bf16_to_f32((uint16_t)i);
        assert_memory_equal(&f[i], &want, 4);
    }
    /* q8_0 / q4_0 against the layout written out by hand (quant.h) */
    struct quant_q8_0 b8[2];
    struct quant_q4_0 b4[2];
    for (int b = 0; b < 2; b++) {
        b8[b].d = half_f32_to_f16(b ? -0.25f : 0.0078125f);
        b4[b].d = half_f32_to_f16(b ? 3.0f : 0.5f);
        for (int i = 0; i < 32; i++)
            b8[b].qs[i] = (int8_t)(i * 8 - 128 + b);
        for (int i = 0; i < 16; i++)
            b4[b].qs[i] = (uint8_t)(i | ((15 - i) << 4));
    }
    kern_row_to_f32(DT_Q8_0, b8, f, 64);
    for (int b = 0; b < 2; b++)
        for (int i = 0; i < 32; i++)
            assert_true(f[b * 32 + i] == half_f16_to_f32(b8[b].d) * (float)(i * 8 - 128 + b));
    kern_row_to_f32(DT_Q4_0, b4, f, 64);
    for (int b = 0; b < 2; b++)
        for (int i = 0; i < 16; i++) {
            float d = half_f16_to_f32(b4[b].d);
            assert_true(f[b * 32 + i] == d * (float)(i - 8));
            assert_true(f[b * 32 + 16 + i] == d * (float)(15 - i - 8));
        }
    free(f);
    free(h);
}

/* kern_act.sc as kern.h lays it out: ceil(n / 8) near-equal token tiles, the tile of tokens
 * [t, t + nt) at sc + t * (cols/32), its token j's block b at + b * nt + j. */
static void check_act_sc(const struct kern_act *a)
{
    const size_t nb = a->cols / 32, ntiles = (a->n + 7) / 8;
    assert_non_null(a->sc);
    for (size_t t = 0, ti = 0, nt; t < a->n; t += nt, ti++) {
        nt = a->n / ntiles + (ti < a->n % ntiles); /* near-equal: the first ones larger */
        for (size_t b = 0; b < nb; b++)
            for (size_t j = 0; j < nt; j++) {
                const struct kern_act_sc *e = &a->sc[t * nb + b * nt + j];
                assert_true(e->d == a->d[(t + j) * a->cp / 32 + b]);
                assert_int_equal(e->ns32, a->ns32[(t + j) * a->cp / 32 + b]);
            }
    }
}

static void test_act_prepare(void **state)
{
    (void)state;
    size_t cols = 96, n = 3, bytes;
    assert_int_equal(kern_act_bytes(DT_Q4_0, 100, 1, &bytes), ERR_FORMAT);
    assert_int_equal(kern_act_bytes(DT_Q4_0, cols, n, &bytes), 0);
    assert_int_equal(kern_act_bytes(DT_Q8_0, (size_t)1 << 62, 1 << 10, &bytes), ERR_OVERFLOW);
    size_t fbytes; /* f32 weights: a copy of x with rows padded to 128 elements */
    assert_int_equal(kern_act_bytes(DT_F32, 7, 3, &fbytes), 0);
    assert_int_equal(fbytes, 3 * 128 * sizeof(float));
    float *x = make_x(n, cols);
    x[5] = 1e30f; /* a block dominated by one huge value still quantizes in range */
    void *buf = aligned_alloc(64, bytes);
    struct kern_act a;
    kern_act_init(&a, DT_Q4_0, x, cols, n, buf);
    kern_act_prepare(&a, 1, n); /* token ranges prepare independently */
    kern_act_prepare(&a, 0, 1);
    assert_int_equal(a.cp, 128);
    for (size_t t = 0; t < n; t++)
        for (size_t c = 0; c < a.cp; c++) {
            size_t b = c / 32;
            float d = a.d[t * a.cp / 32 + b];
            int q = a.q[t * a.ld + c];
            assert_true(q >= -127 && q <= 127);
            assert_true(a.d4[(t * a.cp + c) / 4] == d);
            if (c >= cols) {
                assert_int_equal(q, 0);
                continue;
            }
            float xv = x[t * cols + c];
            assert_true(fabsf(xv - d * (float)q) <= d / 2 * (1 + 1e-6f) + 1e-37f);
            if (c % 4 == 0) {
                const int8_t *g = a.q + t * a.ld + c;
                assert_int_equal(a.ns4[(t * a.cp + c) / 4], -8 * (g[0] + g[1] + g[2] + g[3]));
            }
            if (c % 32 == 0) {
                int sum = 0;
                for (int i = 0; i < 32; i++)
                    sum += a.q[t * a.ld + c + (size_t)i];
                assert_int_equal(a.ns32[(t * a.cp + c) / 32], -8 * sum);
            }
        }
    /* the zeroed block [32, 64) of each token has scale 0 and zero quants */
    assert_true(a.d[1] == 0.0f && a.q[40] == 0);
    check_act_sc(&a); /* laid out by the call that prepared the last tokens */
    free(buf);
    free(x);
    /* 12 tokens (tiles 6 + 6) prepared in three calls out of order, then all again at once */
    n = 12;
    x = make_x(n, cols);
    assert_int_equal(kern_act_bytes(DT_Q8_0, cols, n, &bytes), 0);
    buf = aligned_alloc(64, bytes);
    kern_act_init(&a, DT_Q8_0, x, cols, n, buf);
    kern_act_prepare(&a, 5, 9);
    kern_act_prepare(&a, 9, 12);
    kern_act_prepare(&a, 0, 5);
    check_act_sc(&a);
    memset(a.sc, 0, n * (cols / 32) * sizeof *a.sc);
    kern_act_prepare(&a, 0, n);
    check_act_sc(&a);
    free(buf);
    free(x);
}

/* Every ISA prepares bit-identical activations (the scalar code is the specification), also
 * for NaN, infinities, subnormals, zeros and ragged tails. */
static void test_act_prepare_isas_identical(void **state)
{
    const struct isa_case *c = isa_case_begin(state);
    static const size_t colss[] = {32, 96, 160, 544, 1000, 1030, 2048};
    static const enum dtype types[] = {DT_Q8_0, DT_Q4_0, DT_BF16};
    for (size_t ci = 0; ci < sizeof colss / sizeof colss[0]; ci++)
        for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
            enum dtype wt = types[ti];
            size_t cols = colss[ci], n = 3, bytes;
            if (kern_act_bytes(wt, cols, n, &bytes) != 0)
                continue; /* ragged cols are for bf16 only */
            float *x = make_x(n, cols);
            x[3] = NAN;
            x[cols + 1] = INFINITY;
            x[2 * cols + 2] = -INFINITY;
            x[cols - 1] = 1e-40f; /* subnormal */
            if (cols > 40)
                x[40] = -0.0f;
            uint8_t *want = aligned_alloc(64, bytes), *got = aligned_alloc(64, bytes);
            memset(want, 0xa5, bytes);
            struct kern_act a;
            assert_int_equal(kern_force_isa(KERN_ISA_REF), 0);
            kern_act_init(&a, wt, x, cols, n, want);
            kern_act_prepare(&a, 0, n);
            {
                const enum kern_isa isa = c->isa;
                assert_int_equal(kern_force_isa(isa), 0);
                memset(got, 0xa5, bytes); /* alignment gaps stay equal */
                kern_act_init(&a, wt, x, cols, n, got);
                kern_act_prepare(&a, 0, n);
                for (size_t i = 0; i < bytes; i++)
                    if (got[i] != want[i])
                        fail_msg("%s activations, cols %zu, ISA %s: byte %zu of %zu is %02x, the "
                                 "scalar specification has %02x",
                                 dtype_info(wt)->name, cols, kern_isa_name((enum kern_isa)isa), i,
                                 bytes, got[i], want[i]);
            }
            free(got);
            free(want);
            free(x);
        }
}

/*
 * The bf16 x bf16 GEMM's register tiles (x86/avx512_float.c): up to 4 panels (64 rows) share a
 * tile, their column pairs interleaved (calls of <= 8 tokens keep 1-panel tiles). Each
 * output's lane sums its pairs in the 1-panel tile's order, so the outputs of a call over
 * many rows must equal, bit for bit, those of one call per 16-row panel (which tiles 1
 * panel at a time), for ragged row ranges (r0 anywhere, a partial last panel), every token
 * remainder of the 6-, 8- and 12-token tiles and column counts spanning several 512-column
 * chunks with a ragged tail; and be within the twin's tolerance of kern_gemm_bf16_bf16_ref.
 * Up to 8 tokens with columns a multiple of 32 (512, 1024) take the few-token row loop (two
 * rows from the range's halves per loop): a row's bits must not depend on which row shares
 * its loop either, hence the same per-panel equality.
 */
static void test_bf16_gemm_tiles(void **state)
{
    g_case = isa_case_begin(state);
    static const size_t rowss[] = {16, 40, 64, 65, 100, 130};
    static const size_t colss[] = {33, 512, 1024, 1030};
    static const size_t nss[] = {1, 2, 3, 5, 7, 8, 9, 11, 12, 13, 17, 25, 31};
    for (size_t ri = 0; ri < sizeof rowss / sizeof rowss[0]; ri++)
        for (size_t ci = 0; ci < sizeof colss / sizeof colss[0]; ci++)
            for (size_t ni = 0; ni < sizeof nss / sizeof nss[0]; ni++) {
                const size_t rows = rowss[ri], cols = colss[ci], n = nss[ni];
                const size_t r0 = (ri + ni) % 3 == 0 ? 0 : rndz(0, rows - 1), r1 = rows;
                const size_t ldy = rows + 3;
                void *w = make_weights(DT_BF16, rows, cols);
                float *x = make_x(n, cols);
                size_t bytes;
                assert_int_equal(kern_act_bytes(DT_BF16, cols, n, &bytes), 0);
                void *buf = aligned_alloc(64, bytes);
                assert_non_null(buf);
                struct kern_act a;
                kern_act_init(&a, DT_BF16, x, cols, n, buf);
                kern_act_prepare(&a, 0, n);
                float *y = filled(n * ldy), *per = filled(n * ldy), *twin = filled(n * ldy);
                float *tol = filled(n * ldy);
                kern_gemm_bf16_bf16_avx512(w, &a, y, ldy, r0, r1);
                for (size_t r = r0; r < r1; r += 16)
                    kern_gemm_bf16_bf16_avx512(w, &a, per, ldy, r, r + 16 < r1 ? r + 16 : r1);
                char what[160];
                snprintf(what, sizeof what, "kern_gemm_bf16_bf16_avx512, %zu rows, per panel",
                         rows);
                for (size_t i = 0; i < n * ldy; i++)
                    tol[i] = 0.0f;
                check_close(what, y, per, tol, n, ldy, r0, r1, cols);
                kern_gemm_bf16_bf16_ref(w, &a, twin, ldy, r0, r1);
                for (size_t t = 0; t < n; t++)
                    for (size_t r = r0; r < r1; r++) {
                        double s = 0;
                        for (size_t c = 0; c < cols; c++)
                            s += fabs((double)half_bf16_to_f32(((const uint16_t *)w)[r * cols + c]) *
                                      half_bf16_to_f32(a.xb[t * a.ld + c]));
                        tol[t * ldy + r] = 1e-5f * (float)s + 1e-30f;
                    }
                snprintf(what, sizeof what, "kern_gemm_bf16_bf16_avx512, %zu rows, vs its twin",
                         rows);
                check_close(what, y, twin, tol, n, ldy, r0, r1, cols);
                free(tol);
                free(twin);
                free(per);
                free(y);
                free(buf);
                free(x);
                free(w);
            }
}

/*
 * The AMX-BF16 GEMM (x86/amx_bf16.c) against its twin kern_gemm_bf16_bf16_ref within the bf16
 * GEMM's tolerance (1e-5 of the sum of |products|, as for the AVX-512 GEMM above): row counts
 * with a partial last tile, r0 anywhere (not a multiple of 16), ldy > rows, token counts from
 * 1 to 70 (ragged 16- and 32-token blocks), columns a multiple of 32 spanning many K steps and
 * ragged ones (which the kernel hands to the AVX-512 GEMM). Rows outside [r0, r1) untouched.
 * Skips where the CPU or the OS gives no AMX.
 */
static void test_amx_bf16_gemm(void **state)
{
    g_case = isa_case_begin(state);
    static const size_t rowss[] = {5, 16, 33, 64, 100};
    static const size_t colss[] = {32, 96, 1024, 33, 1030};
    static const size_t nss[] = {1, 3, 15, 16, 17, 31, 32, 33, 48, 50, 64, 70};
    for (size_t ri = 0; ri < sizeof rowss / sizeof rowss[0]; ri++)
        for (size_t ci = 0; ci < sizeof colss / sizeof colss[0]; ci++)
            for (size_t ni = 0; ni < sizeof nss / sizeof nss[0]; ni++) {
                const size_t rows = rowss[ri], cols = colss[ci], n = nss[ni];
                const size_t r0 = (ri + ni) % 3 == 0 ? 0 : rndz(0, rows - 1);
                const size_t r1 = (ri + ci + ni) % 2 ? rows : rndz(r0 + 1, rows);
                const size_t ldy = rows + 7;
                void *w = make_weights(DT_BF16, rows, cols);
                float *x = make_x(n, cols);
                size_t bytes;
                assert_int_equal(kern_act_bytes(DT_BF16, cols, n, &bytes), 0);
                void *buf = aligned_alloc(64, bytes);
                assert_non_null(buf);
                struct kern_act a;
                kern_act_init(&a, DT_BF16, x, cols, n, buf);
                kern_act_prepare(&a, 0, n);
                float *y = filled(n * ldy), *twin = filled(n * ldy), *tol = filled(n * ldy);
                kern_gemm_bf16_bf16_amx(w, &a, y, ldy, r0, r1);
                kern_gemm_bf16_bf16_ref(w, &a, twin, ldy, r0, r1);
                for (size_t t = 0; t < n; t++)
                    for (size_t r = r0; r < r1; r++) {
                        double s = 0;
                        for (size_t c = 0; c < cols; c++)
                            s += fabs((double)half_bf16_to_f32(((const uint16_t *)w)[r * cols + c]) *
                                      half_bf16_to_f32(a.xb[t * a.ld + c]));
                        tol[t * ldy + r] = 1e-5f * (float)s + 1e-30f;
                    }
                char what[160];
                snprintf(what, sizeof what, "kern_gemm_bf16_bf16_amx, %zu rows, vs its twin", rows);
                check_close(what, y, twin, tol, n, ldy, r0, r1, cols);
                free(tol);
                free(twin);
                free(y);
                free(buf);
                free(x);
                free(w);
            }
}

/*
 * Design (b) of the q4_0 / q8_0 AMX prefill (x86/amx_qbf16.c, called directly): weights
 * dequantized to bf16, activations rounded to bf16, tdpbf16ps; against its twins
 * kern_gemm_q{4,8}_0p_bf16_ref (the same rounded operands, column-order f32 sums) within
 * 1e-5 of a bound on the sum of |products| (sum |bf16(x)| times the largest |q * d| of the
 * matrix). Row counts with a partial last panel and more than one 256-row chunk, row ranges
 * starting on panels, columns over one and several 512-column K chunks (ragged last chunk),
 * ragged 16/32-token tiles, ldy > rows; rows outside [r0, r1) untouched. Skips without AMX.
 */
static void test_amx_qbf16_gemm(void **state)
{
    g_case = isa_case_begin(state);
    static const size_t rowss[] = {5, 16, 33, 100, 290};
    static const size_t colss[] = {32, 96, 1024, 1056};
    static const size_t nss[] = {1, 15, 16, 17, 33, 50};
    for (int q8 = 0; q8 < 2; q8++)
        for (size_t ri = 0; ri < sizeof rowss / sizeof rowss[0]; ri++)
            for (size_t ci = 0; ci < sizeof colss / sizeof colss[0]; ci++)
                for (size_t ni = 0; ni < sizeof nss / sizeof nss[0]; ni++) {
                    const enum dtype wt = q8 ? DT_Q8_0 : DT_Q4_0;
                    const size_t rows = rowss[ri], cols = colss[ci], n = nss[ni];
                    const size_t np = (rows + 15) / 16;
                    const size_t r0 = (ri + ni) % 2 ? 0 : 16 * rndz(0, np - 1);
                    const size_t rp = 16 * rndz(r0 / 16 + 1, np); /* a panel end */
                    const size_t r1 = (ri + ci + ni) % 2 || rp > rows ? rows : rp;
                    const size_t ldy = rows + 7;
                    void *w = make_weights(wt, rows, cols);
                    void *wp = aligned_alloc(64, (kern_panels_bytes(wt, rows, cols) + 127) / 64 * 64);
                    assert_non_null(wp);
                    kern_panels_pack(wt, w, cols, wp, rows, 0, np);
                    /* the largest |q * d|: q4_0 |q| <= 8, q8_0 |q| <= 128 */
                    const size_t bb = q8 ? 34 : 18;
                    float wmax = 0;
                    for (size_t b = 0; b < rows * cols / 32; b++) {
                        const uint8_t *blk = (const uint8_t *)w + b * bb;
                        float d = fabsf(half_f16_to_f32((uint16_t)(blk[0] | blk[1] << 8)));
                        wmax = fmaxf(wmax, d * (q8 ? 128.0f : 8.0f));
                    }
                    float *x = make_x(n, cols);
                    size_t bytes;
                    assert_int_equal(kern_act_bytes(wt, cols, n, &bytes), 0);
                    void *buf = aligned_alloc(64, (bytes + 63) / 64 * 64);
                    assert_non_null(buf);
                    struct kern_act a;
                    kern_act_init(&a, wt, x, cols, n, buf);
                    kern_act_prepare(&a, 0, n);
                    float *y = filled(n * ldy), *twin = filled(n * ldy), *tol = filled(n * ldy);
                    (q8 ? kern_gemm_q8_0p_bf16_amx : kern_gemm_q4_0p_bf16_amx)(wp, &a, y, ldy, r0,
                                                                             r1);
                    (q8 ? kern_gemm_q8_0p_bf16_ref : kern_gemm_q4_0p_bf16_ref)(wp, &a, twin, ldy,
                                                                             r0, r1);
                    for (size_t t = 0; t < n; t++) {
                        double s = 0;
                        for (size_t c = 0; c < cols; c++)
                            s += fabs((double)half_bf16_to_f32(half_f32_to_bf16(x[t * cols + c])));
                        for (size_t r = r0; r < r1; r++)
                            tol[t * ldy + r] = 1e-5f * (float)(s * wmax) + 1e-30f;
                    }
                    char what[160];
                    snprintf(what, sizeof what, "kern_gemm_%s_bf16_amx, %zu rows, vs its twin",
                             q8 ? "q8_0p" : "q4_0p", rows);
                    check_close(what, y, twin, tol, n, ldy, r0, r1, cols);
                    free(tol);
                    free(twin);
                    free(y);
                    free(buf);
                    free(x);
                    free(wp);
                    free(w);
                }
}

/*
 * Design (b) dispatched (kern.h KERN_ACT_BF16_TILES, traits.c AMX_QBF16_MIN_N = 128): with the
 * flag, activations of n >= 128 tokens get the bf16 tiles (xt) and the q4_0/q8_0 panel product
 * reads them: the same bits as kern_gemm_q*_0p_bf16_amx rounding them itself (same operands,
 * same order), within the summation bound of the ref twin. xt prepared in two token ranges
 * (two threads' shards) over a buffer of garbage, so the padding tokens must be zeroed by the
 * range that ends at n. Below 128 tokens, or without the flag (the invariant switch), no xt
 * and the int8 product's bits (the AVX-512 VNNI panel kernel's). CLOCHER_AMX=0: no xt either;
 * CLOCHER_AMX_QBF16=0 neither, CLOCHER_AMX_QBF16=N moves the threshold to N. With xt the act has no int8 blocks (q == NULL: the quantization is skipped), and the
 * rows-stored product on it (kern_matmul_act) still gives the int8 rows product's bits. And
 * (b) gives a token the same bits whatever else shares its call (only the threshold switches).
 */
static void test_amx_qbf16_dispatch(void **state)
{
    g_case = isa_case_begin(state);
    assert_true(kern_amx_active());
    static const size_t nss[] = {127, 128, 130, 160};
    static const size_t colss[] = {96, 1056};
    for (int q8 = 0; q8 < 2; q8++)
        for (size_t ci = 0; ci < 2; ci++)
            for (size_t ni = 0; ni < sizeof nss / sizeof nss[0]; ni++) {
                const enum dtype wt = q8 ? DT_Q8_0 : DT_Q4_0;
                const size_t rows = 48, cols = colss[ci], n = nss[ni], ldy = rows + 3;
                void *w = make_weights(wt, rows, cols);
                void *wp = aligned_alloc(64, (kern_panels_bytes(wt, rows, cols) + 127) / 64 * 64);
                assert_non_null(wp);
                kern_panels_pack(wt, w, cols, wp, rows, 0, rows / 16);
                float *x = make_x(n, cols);
                size_t bytes, tbytes;
                assert_int_equal(kern_act_bytes(wt, cols, n, &bytes), 0);
                assert_int_equal(kern_act_bytes_ex(wt, cols, n, KERN_ACT_BF16_TILES, &tbytes), 0);
                void *buf = aligned_alloc(64, (bytes + 63) / 64 * 64);
                void *tbuf = aligned_alloc(64, (tbytes + 63) / 64 * 64);
                assert_non_null(buf);
                assert_non_null(tbuf);
                memset(tbuf, 0xa5, tbytes);
                struct kern_act a, at;
                kern_act_init(&a, wt, x, cols, n, buf);
                kern_act_init_ex(&at, wt, x, cols, n, KERN_ACT_BF16_TILES, tbuf);
                kern_act_prepare(&a, 0, n);
                kern_act_prepare(&at, 0, n / 2);
                kern_act_prepare(&at, n / 2, n);
                assert_null(a.xt);
                assert_true((at.xt != NULL) == (n >= 128));
                /* with xt, no int8 blocks: nothing may read them (act.c act_layout) */
                assert_true((at.q == NULL) == (n >= 128));
                assert_true(at.q || (!at.d && !at.ns4 && !at.ns32 && !at.d4));
                float *y = filled(n * ldy), *want = filled(n * ldy);
                kern_matmul_act_panels(wt, wp, &at, y, ldy, 0, rows);
                if (n >= 128)
                    (q8 ? kern_gemm_q8_0p_bf16_amx : kern_gemm_q4_0p_bf16_amx)(wp, &a, want, ldy,
                                                                             0, rows);
                else
                    (q8 ? kern_gemm_q8_0p_q8_0_avx512 : kern_gemm_q4_0p_q8_0_avx512)(
                        wp, &a, want, ldy, 0, rows);
                assert_memory_equal(y, want, n * ldy * sizeof(float));
                /* without the flag: the int8 bits whatever n */
                kern_matmul_act_panels(wt, wp, &a, y, ldy, 0, rows);
                (q8 ? kern_gemm_q8_0p_q8_0_avx512 : kern_gemm_q4_0p_q8_0_avx512)(wp, &a, want,
                                                                                 ldy, 0, rows);
                assert_memory_equal(y, want, n * ldy * sizeof(float));
                /* rows-stored weights (CLOCHER_Q4_PANELS=0) on the flagged act: kern_matmul_act
                 * quantizes x itself when xt left no int8 blocks; the int8 rows product's bits */
                kern_matmul_act(w, &at, y, ldy, 0, rows);
                kern_matmul_act(w, &a, want, ldy, 0, rows);
                assert_memory_equal(y, want, n * ldy * sizeof(float));
                if (n >= 128) { /* and (b) close to its twin (test_amx_qbf16_gemm's bound) */
                    float *twin = filled(n * ldy), *tol = filled(n * ldy);
                    kern_matmul_act_panels(wt, wp, &at, y, ldy, 0, rows);
                    (q8 ? kern_gemm_q8_0p_bf16_ref : kern_gemm_q4_0p_bf16_ref)(wp, &a, twin, ldy,
                                                                             0, rows);
                    float wmax = 0;
                    const size_t bb = q8 ? 34 : 18;
                    for (size_t b = 0; b < rows * cols / 32; b++) {
                        const uint8_t *blk = (const uint8_t *)w + b * bb;
                        float d = fabsf(half_f16_to_f32((uint16_t)(blk[0] | blk[1] << 8)));
                        wmax = fmaxf(wmax, d * (q8 ? 128.0f : 8.0f));
                    }
                    for (size_t t = 0; t < n; t++) {
                        double sx = 0;
                        for (size_t c = 0; c < cols; c++)
                            sx += fabs(
                                (double)half_bf16_to_f32(half_f32_to_bf16(x[t * cols + c])));
                        for (size_t r = 0; r < rows; r++)
                            tol[t * ldy + r] = 1e-5f * (float)(sx * wmax) + 1e-30f;
                    }
                    check_close("dispatched bf16 tiles vs the twin", y, twin, tol, n, ldy, 0,
                                rows, cols);
                    /* (b) itself gives a token the same bits whatever shares its call (each C
                     * row sums the same K steps in the same order; padding rows are zero):
                     * the last k tokens alone, rounded per call, give the rows of the n-token
                     * product (docs/PERFORMANCE.md session 19, s19-amxb2) */
                    static const size_t ks[] = {1, 17};
                    for (size_t ki = 0; ki < 2; ki++) {
                        const size_t k = ks[ki], t0 = n - k;
                        size_t sb;
                        assert_int_equal(kern_act_bytes(wt, cols, k, &sb), 0);
                        void *sbuf = aligned_alloc(64, (sb + 63) / 64 * 64);
                        assert_non_null(sbuf);
                        struct kern_act as;
                        kern_act_init(&as, wt, x + t0 * cols, cols, k, sbuf);
                        kern_act_prepare(&as, 0, k);
                        float *ys = filled(k * ldy);
                        (q8 ? kern_gemm_q8_0p_bf16_amx : kern_gemm_q4_0p_bf16_amx)(wp, &as, ys,
                                                                                 ldy, 0, rows);
                        for (size_t t = 0; t < k; t++)
                            assert_memory_equal(ys + t * ldy, y + (t0 + t) * ldy,
                                                rows * sizeof(float));
                        free(ys);
                        free(sbuf);
                    }
                    free(tol);
                    free(twin);
                }
                if (n == 160 && ci == 0) { /* CLOCHER_AMX=0: no tile threshold, no xt */
                    assert_int_equal(setenv("CLOCHER_AMX", "0", 1), 0);
                    assert_int_equal(kern_force_isa(KERN_ISA_AVX512), 0);
                    size_t b0;
                    assert_int_equal(kern_act_bytes_ex(wt, cols, n, KERN_ACT_BF16_TILES, &b0), 0);
                    assert_int_equal(b0, bytes);
                    assert_int_equal(unsetenv("CLOCHER_AMX"), 0);
                    /* CLOCHER_AMX_QBF16=0: AMX on, (b) off; =N: (b) from N tokens */
                    assert_int_equal(setenv("CLOCHER_AMX_QBF16", "0", 1), 0);
                    assert_int_equal(kern_force_isa(KERN_ISA_AVX512), 0);
                    assert_true(kern_amx_active());
                    assert_int_equal(kern_act_bytes_ex(wt, cols, n, KERN_ACT_BF16_TILES, &b0), 0);
                    assert_int_equal(b0, bytes);
                    assert_int_equal(setenv("CLOCHER_AMX_QBF16", "161", 1), 0);
                    assert_int_equal(kern_force_isa(KERN_ISA_AVX512), 0);
                    assert_int_equal(kern_act_bytes_ex(wt, cols, n, KERN_ACT_BF16_TILES, &b0), 0);
                    assert_int_equal(b0, bytes); /* 160 < 161 */
                    assert_int_equal(setenv("CLOCHER_AMX_QBF16", "160", 1), 0);
                    assert_int_equal(kern_force_isa(KERN_ISA_AVX512), 0);
                    assert_int_equal(kern_act_bytes_ex(wt, cols, n, KERN_ACT_BF16_TILES, &b0), 0);
                    assert_int_equal(b0, tbytes);
                    assert_int_equal(unsetenv("CLOCHER_AMX_QBF16"), 0);
                    assert_int_equal(kern_force_isa(KERN_ISA_AVX512), 0);
                    assert_true(kern_amx_active());
                }
                free(want);
                free(y);
                free(tbuf);
                free(buf);
                free(x);
                free(wp);
                free(w);
            }
}

/*
 * Dispatch: with AMX (and AVX-512) the bf16 gemm entry is the AMX variant: kern_matmul_act
 * from 16 tokens gives its bits exactly; CLOCHER_AMX=0 (read when the table is filled) and the
 * AVX2 ISA leave AMX off, the AVX-512 path then giving kern_gemm_bf16_bf16_avx512's bits.
 */
static void test_amx_dispatch(void **state)
{
    g_case = isa_case_begin(state);
    assert_true(kern_amx_active());
    const size_t rows = 48, cols = 256, n = 20, ldy = rows;
    void *w = make_weights(DT_BF16, rows, cols);
    float *x = make_x(n, cols);
    size_t bytes;
    assert_int_equal(kern_act_bytes(DT_BF16, cols, n, &bytes), 0);
    void *buf = aligned_alloc(64, bytes);
    assert_non_null(buf);
    struct kern_act a;
    kern_act_init(&a, DT_BF16, x, cols, n, buf);
    kern_act_prepare(&a, 0, n);
    float *y = filled(n * ldy), *want = filled(n * ldy);
    kern_matmul_act(w, &a, y, ldy, 0, rows);
    kern_gemm_bf16_bf16_amx(w, &a, want, ldy, 0, rows);
    assert_memory_equal(y, want, n * ldy * sizeof(float));

    assert_int_equal(setenv("CLOCHER_AMX", "0", 1), 0);
    assert_int_equal(kern_force_isa(KERN_ISA_AVX512), 0);
    assert_false(kern_amx_active());
    kern_matmul_act(w, &a, y, ldy, 0, rows);
    kern_gemm_bf16_bf16_avx512(w, &a, want, ldy, 0, rows);
    assert_memory_equal(y, want, n * ldy * sizeof(float));
    assert_int_equal(unsetenv("CLOCHER_AMX"), 0);
    assert_int_equal(kern_force_isa(KERN_ISA_AVX2), 0);
    assert_false(kern_amx_active());
    assert_int_equal(kern_force_isa(KERN_ISA_AVX512), 0);
    assert_true(kern_amx_active());
    free(want);
    free(y);
    free(buf);
    free(x);
    free(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_row_to_f32),
        cmocka_unit_test(test_act_prepare),
        ISA_CASE_SIMD(test_act_prepare_isas_identical),
        ISA_CASE_TESTS(test_matmul_f32),
        ISA_CASE_TESTS(test_matmul_f16),
        ISA_CASE_TESTS(test_matmul_bf16),
        ISA_CASE_TEST(test_matmul_bf16, isa_case_avx512bf16),
        ISA_CASE_TESTS(test_matmul_q8_0),
        ISA_CASE_TESTS(test_matmul_q4_0),
        ISA_CASE_TESTS(test_q8p_every_n),
        ISA_CASE_TEST(test_q8p_every_n, isa_case_amxint8),
        ISA_CASE_TESTS(test_q4p_every_n),
        ISA_CASE_TEST(test_q4p_every_n, isa_case_amxint8),
        ISA_CASE_TEST(test_q4p_gfni, isa_case_avx512),
        ISA_CASE_TESTS(test_matmul_large),
        ISA_CASE_TEST(test_matmul_large, isa_case_avx512bf16),
        ISA_CASE_TESTS(test_matmul_bf16_decode),
        ISA_CASE_TEST(test_matmul_bf16_decode, isa_case_avx512bf16),
        ISA_CASE_TEST(test_bf16_gemm_tiles, isa_case_avx512bf16),
        ISA_CASE_TEST(test_amx_bf16_gemm, isa_case_amxbf16),
        ISA_CASE_TEST(test_amx_dispatch, isa_case_amxbf16),
        ISA_CASE_TEST(test_amx_qbf16_gemm, isa_case_amxbf16),
        ISA_CASE_TEST(test_amx_qbf16_dispatch, isa_case_amxbf16),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
